"""The client side of compaction: ``Client.compact`` and ``Client.read_compacted``.

A compaction runs where it is asked (the driver, or any task with the storage's credentials),
like a range read of the bulk path: it asks each partition actor only for its ``max_read_position``
and aborted spans (``range_plan``), then reads and writes storage itself
(``raytxn.ledger.compacted``). Two compactions of one partition at once are safe: the publish is
a conditional create, so one wins and the other raises ``Fenced`` and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from raytxn.client.rpc import ActorRef
from raytxn.errors import InvalidArgument
from raytxn.faults import FaultPoints
from raytxn.ids import Position, partition_actor_name
from raytxn.ledger.compacted import compact_partition, read_compacted
from raytxn.ledger.storage import Storage
from raytxn.protocol.compaction import DEFAULT_DELETE_RETENTION_MS
from raytxn.protocol.lease import RangePlan

FIRST = Position(0, 0)

if TYPE_CHECKING:
    from raytxn.client.client import Client


def storage_of(client: Client) -> Storage:
    """The storage the client's engine runs on, for reading and writing it straight."""
    return Storage.from_url(client.config.storage_url, **client.config.storage_options)


def _partitions(client: Client, topic: str, partition: int | None) -> list[int]:
    count = client.get_topic(topic)["partitions"]
    if partition is None:
        return list(range(count))
    if type(partition) is not int or not 0 <= partition < count:
        raise InvalidArgument(f"partition must be an int in 0..{count - 1} for {topic!r}, got {partition!r}")
    return [partition]


async def partition_plan(client: Client, topic: str, partition: int, start: Position = FIRST) -> RangePlan:
    """The partition's ``max_read_position``, trim point and aborted spans from ``start`` on."""
    ref = ActorRef(partition_actor_name(topic, partition), client.token)
    return await ref.call_async("range_plan", start, deadline_s=client.deadline_s)


async def compact_topic(client: Client, topic: str, partition: int | None = None, *,
                        delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS,
                        faults: FaultPoints | None = None) -> list[dict[str, Any]]:
    """Compact every partition of ``topic`` (or one) up to its ``max_read_position`` now; a row
    per partition: the published horizon and what the fold left out."""
    storage = storage_of(client)

    async def one(p: int) -> dict[str, Any]:
        plan = await partition_plan(client, topic, p)
        result = await compact_partition(storage, topic, p, plan.max_read, plan.aborted, int(time.time() * 1000),
                                         delete_retention_ms=delete_retention_ms, faults=faults)
        h = result.horizon
        return {"partition": p, "generation": h.generation, "horizon": str(h.horizon), "next_offset": h.next_offset,
                "records": h.records, "tombstones": h.tombstones, "skipped_aborted": result.skipped_aborted,
                "skipped_keyless": result.skipped_keyless, "dropped_tombstones": result.dropped_tombstones}

    partitions = _partitions(client, topic, partition)
    return list(await asyncio.gather(*(one(p) for p in partitions)))


async def read_compacted_partition(client: Client, topic: str, partition: int,
                                   from_offset: int = 0) -> list[dict[str, Any]]:
    """A ``read_compacted`` read of one partition from ``from_offset`` to its committed head."""
    _partitions(client, topic, partition)
    plan = await partition_plan(client, topic, partition)
    read = await read_compacted(storage_of(client), topic, partition, plan.max_read, plan.aborted, from_offset,
                                plan.first_readable)
    return read.records
