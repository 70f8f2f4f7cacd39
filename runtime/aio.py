"""The asyncio API: ``await raytxn.aio.connect()``, then the client's calls awaited (see
``raytxn.client.aio`` and ``raytxn.client.aio_bulk``, where they live beside the client whose
machinery they share)."""

from raytxn.client.aio import (
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncTransaction,
    SendFuture,
    connect,
)
from raytxn.client.aio_bulk import AsyncCompactedReader, AsyncLeaseSet, AsyncTableView

__all__ = ["AsyncClient", "AsyncCompactedReader", "AsyncConsumer", "AsyncLeaseSet", "AsyncProducer",
           "AsyncTableView", "AsyncTransaction", "SendFuture", "connect"]
