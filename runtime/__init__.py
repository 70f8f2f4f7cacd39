"""raytxn: exactly-once transactional messaging on Ray.

    import raytxn as rt
    client = rt.connect()

The package is layered; the folder list is the architecture:

- ``raytxn.protocol``: the pure state machines and formats (no Ray, no I/O, no clock);
- ``raytxn.ledger``: storage URLs, durable managed ledgers, snapshots;
- ``raytxn.client``: Client, Producer, Consumer, Transaction and the rpc under them;
- ``raytxn.actors``: the Ray actors, thin shells around the protocol;
- ``raytxn.tools``: CLI, benchmarks, chaos, checker, history, SeaweedFS;
- ``raytxn.connectors``: Spark (RayDP) and Ray Data;
- at the top: errors, ids, hashing, config, auth, metrics, faults, cluster.

This module is lazy (PEP 562): ``import raytxn.errors`` or any protocol module does not import
Ray. The client names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS = {
    "Client": "raytxn.client.client",
    "connect": "raytxn.client.client",
    "shutdown": "raytxn.client.client",
    "CompactedReader": "raytxn.client.reader",
    "ConsumerType": "raytxn.client.consumer",
    "InitialPosition": "raytxn.client.consumer",
    "Message": "raytxn.client.message",
    "MessageBatch": "raytxn.client.batch",
    "MessageId": "raytxn.client.message",
    "Transaction": "raytxn.client.transaction",
    "LeaseSet": "raytxn.client.leases",
    "RangeChunk": "raytxn.client.leases",
    "TableView": "raytxn.client.table_view",
}
_SUBMODULES = frozenset({"aio", "errors", "ids", "hashing", "config", "auth", "metrics", "faults", "cluster",
                         "protocol", "ledger", "client", "tools", "actors", "connectors"})

__all__ = ["Client", "CompactedReader", "ConsumerType", "InitialPosition", "LeaseSet", "Message", "MessageBatch",
           "MessageId", "RangeChunk", "TableView", "Transaction", "connect", "shutdown"]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from raytxn.client.batch import MessageBatch
    from raytxn.client.client import Client, connect, shutdown
    from raytxn.client.consumer import ConsumerType, InitialPosition
    from raytxn.client.leases import LeaseSet, RangeChunk
    from raytxn.client.message import Message, MessageId
    from raytxn.client.reader import CompactedReader
    from raytxn.client.table_view import TableView
    from raytxn.client.transaction import Transaction


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"raytxn.{name}")
    raise AttributeError(f"module 'raytxn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})
