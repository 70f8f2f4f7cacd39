"""The client side of compaction: ``Client.compact``, ``Client.read_compacted`` and the
``CompactedState`` a Spark or Ray task reads a compacted topic's latest values with.

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

import msgspec

from raytxn.client.rpc import ActorRef
from raytxn.errors import InvalidArgument, NotAuthorized, StorageUnavailable
from raytxn.faults import FaultPoints
from raytxn.ids import PRODUCE, Position, partition_actor_name
from raytxn.ledger.compacted import compact_partition, read_compacted
from raytxn.ledger.storage import Storage
from raytxn.protocol.compaction import DEFAULT_DELETE_RETENTION_MS
from raytxn.protocol.lease import RangePlan
from raytxn.protocol.txn_buffer import AbortedTxn

FIRST = Position(0, 0)

READ_ATTEMPTS = 4  # a task's read of the state through a storage outage, as ranges.read_range retries
READ_RETRY_FIRST_WAIT_S = 0.2

if TYPE_CHECKING:
    import pyarrow as pa

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
    per partition: the published horizon and what the fold left out. Needs the topic's produce
    permission (a compaction rewrites what every reader of the compacted view reads) as well as
    consume (it reads the partitions' plans)."""
    storage = storage_of(client)
    partitions = _partitions(client, topic, partition)
    actions = await client.supervisor.call_async("topic_actions", [topic], deadline_s=client.deadline_s)
    if PRODUCE not in actions.get(topic, [PRODUCE]):  # (gone since: the plans' calls say so)
        raise NotAuthorized(f"compacting {topic!r} needs its produce permission; this client's principal has "
                            f"{', '.join(actions.get(topic, [])) or 'no permission'} there")

    async def one(p: int) -> dict[str, Any]:
        plan = await partition_plan(client, topic, p)
        result = await compact_partition(storage, topic, p, plan.max_read, plan.aborted, int(time.time() * 1000),
                                         delete_retention_ms=delete_retention_ms, faults=faults)
        h = result.horizon
        return {"partition": p, "generation": h.generation, "horizon": str(h.horizon), "next_offset": h.next_offset,
                "records": h.records, "tombstones": h.tombstones, "skipped_aborted": result.skipped_aborted,
                "skipped_keyless": result.skipped_keyless, "dropped_tombstones": result.dropped_tombstones}

    return list(await asyncio.gather(*(one(p) for p in partitions)))


async def read_compacted_partition(client: Client, topic: str, partition: int,
                                   from_offset: int = 0) -> list[dict[str, Any]]:
    """A ``read_compacted`` read of one partition from ``from_offset`` to its committed head."""
    _partitions(client, topic, partition)
    plan = await partition_plan(client, topic, partition)
    read = await read_compacted(storage_of(client), topic, partition, plan.max_read, plan.aborted, from_offset,
                                plan.first_readable)
    return read.records


class CompactedState(msgspec.Struct, frozen=True):
    """One partition of a compacted topic as of ``max_read`` (a committed position: nothing open
    or aborted at or below it is visible): everything a task needs to read the latest value of
    each key, the published compacted generation then the live ledger after its horizon, straight
    from storage. Picklable; holds the storage URL and options it reads from."""

    topic: str
    partition: int
    max_read: Position
    aborted: tuple[AbortedTxn, ...]
    first_readable: Position
    storage_url: str
    storage_options: dict[str, Any] = {}

    def read(self) -> pa.Table:
        """The partition's live keys and their latest values (deleted keys left out) as an Arrow
        table (key string, value binary), in no particular order. Not from inside a running
        event loop."""
        import pyarrow as pa

        storage = Storage.from_url(self.storage_url, **self.storage_options)

        async def read_retrying() -> list[dict[str, Any]]:
            for retry in range(READ_ATTEMPTS):
                try:
                    read = await read_compacted(storage, self.topic, self.partition, self.max_read, self.aborted,
                                                0, self.first_readable)
                    return read.records
                except StorageUnavailable:
                    if retry + 1 == READ_ATTEMPTS:
                        raise  # the last attempt: its outage is the caller's
                    await asyncio.sleep(READ_RETRY_FIRST_WAIT_S * 2**retry)
            raise AssertionError("unreachable: the last attempt returns or raises")

        latest: dict[str, bytes | None] = {}
        for record in asyncio.run(read_retrying()):  # in offset order: the last value of a key wins
            latest[record["key"]] = record["value"]
        live = [(key, value) for key, value in latest.items() if value]  # None or b"": a tombstone
        return pa.table({"key": pa.array([k for k, _ in live], pa.string()),
                         "value": pa.array([v for _, v in live], pa.binary())})


async def compacted_state(client: Client, topic: str) -> list[CompactedState]:
    """A ``CompactedState`` of every partition of ``topic`` at its committed head now: everything
    committed before this call is in it (a commit returns once its markers are written)."""
    partitions = _partitions(client, topic, None)
    plans = await asyncio.gather(*(partition_plan(client, topic, p) for p in partitions))
    return [CompactedState(topic, p, plan.max_read, tuple(plan.aborted), plan.first_readable,
                           client.config.storage_url, dict(client.config.storage_options))
            for p, plan in zip(partitions, plans, strict=True)]
