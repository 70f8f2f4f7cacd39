"""The asyncio API: ``await raytxn.aio.connect()``, then the client's calls awaited (see
``raytxn.client.aio``, where it lives beside the client whose machinery it shares)."""

from raytxn.client.aio import (
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncTransaction,
    connect,
)

__all__ = ["AsyncClient", "AsyncConsumer", "AsyncProducer", "AsyncTransaction", "connect"]
