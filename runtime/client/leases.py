"""The client's side of the bulk path: lease a subscription's next ranges, cut them into chunks
that any task reads straight from storage, acknowledge them in a transaction (docs/design.md §6).

This is Spark's Kafka-source model on object storage. The driver plans: ``Client.lease_ranges``
asks each partition's subscription for its next committed range (no payload moves), and
``LeaseSet.chunks`` cuts the ranges into ``RangeChunk``s. Tasks read: ``RangeChunk.read`` returns an
Arrow table of the chunk's committed, non-aborted messages, decoded in bulk from the ledger
objects, in any process that reaches the storage (a Spark task, a Ray task, the driver). The
driver ends: ``LeaseSet.acknowledge(txn)`` acks every range's end cumulatively in the
transaction, so its commit moves the cursors past exactly what was read, and an abort, a
``release`` or the lease's timeout hands the ranges out again, in order.

A lease holder is a name and an epoch. A pipeline passes its transactional id and that id's
epoch, so a restarted pipeline takes over its zombie's leases at once and the zombie's calls are
``Fenced``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from raytxn.client.rpc import ActorRef
from raytxn.errors import InvalidArgument
from raytxn.ids import Position, subscription_actor_name
from raytxn.protocol.lease import Lease
from raytxn.protocol.txn_buffer import AbortedTxn

if TYPE_CHECKING:
    import pyarrow as pa

    from raytxn.client.client import Client
    from raytxn.client.transaction import Transaction

DEFAULT_CHUNK_ENTRIES = 2_000


class RangeChunk(msgspec.Struct, frozen=True):
    """Entries ``start..end`` (inclusive, real entries, at or below the partition's
    ``max_read_position``) of one partition, and the aborted spans meeting them: everything a
    task needs to read them. Picklable; holds the storage URL and options it reads from."""

    topic: str
    partition: int
    start: Position
    end: Position
    entries: int
    aborted: tuple[AbortedTxn, ...]
    storage_url: str
    storage_options: dict[str, Any] = {}

    def read(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The chunk's visible messages as one Arrow table (``raytxn.ledger.ranges`` columns,
        projected to ``columns``), in append order. Not from inside a running event loop."""
        import pyarrow as pa

        from raytxn.ledger.ranges import range_schema, read_range

        batches = read_range(self.storage_url, self.storage_options, self.topic, self.partition, self.start,
                             self.end, self.aborted, columns=columns)
        return pa.Table.from_batches(batches, schema=range_schema(columns))


def cut_spans(spans: Sequence[tuple[int, int, int]], max_entries: int) -> list[tuple[Position, Position, int]]:
    """``(ledger_id, first, last)`` spans cut into ``(start, end, entries)`` pieces of at most
    ``max_entries`` entries, each within one ledger."""
    if max_entries < 1:
        raise InvalidArgument("a chunk holds at least one entry")
    pieces = []
    for ledger_id, first, last in spans:
        for lo in range(first, last + 1, max_entries):
            hi = min(last, lo + max_entries - 1)
            pieces.append((Position(ledger_id, lo), Position(ledger_id, hi), hi - lo + 1))
    return pieces


def _subscription_ref(client: Client, topic: str, partition: int, subscription: str) -> ActorRef:
    return ActorRef(subscription_actor_name(topic, partition, subscription), client.token)


class LeaseSet:
    """The leases one ``Client.lease_ranges`` call got, one per partition that had a range."""

    def __init__(self, client: Client, topic: str, subscription: str, holder: str, epoch: int,
                 leases: dict[int, Lease]) -> None:
        self._client = client
        self.topic = topic
        self.subscription = subscription
        self.holder = holder
        self.epoch = epoch
        self.leases = leases  # partition -> its lease

    def __repr__(self) -> str:
        ranges = ", ".join(f"{p}: {lease.start}..{lease.end}" for p, lease in sorted(self.leases.items()))
        return f"LeaseSet({self.topic}/{self.subscription}, {{{ranges}}})"

    @property
    def entries(self) -> int:
        """Entries leased over all partitions (markers and aborted entries included)."""
        return sum(end - first + 1 for lease in self.leases.values() for _, first, end in lease.spans)

    def __bool__(self) -> bool:
        return bool(self.leases)

    def chunks(self, max_entries: int = DEFAULT_CHUNK_ENTRIES, min_chunks: int = 1) -> list[RangeChunk]:
        """The leased ranges cut into chunks of at most ``max_entries`` entries, smaller when
        needed to make ``min_chunks`` of them (a task each: Spark's or Ray's parallelism)."""
        if min_chunks < 1:
            raise InvalidArgument("min_chunks must be >= 1")
        config = self._client.config
        if config.storage_url.startswith("memory://"):
            raise InvalidArgument(f"range reads need a store every process reaches (file://, s3://, ...); "
                                  f"{config.storage_url} lives in one process's memory")
        per_chunk = max(1, min(max_entries, math.ceil(self.entries / min_chunks))) if self.entries else max_entries
        chunks = []
        for partition, lease in sorted(self.leases.items()):
            for start, end, entries in cut_spans(lease.spans, per_chunk):
                aborted = tuple(a for a in lease.aborted if a.first_position <= end and start <= a.marker_position)
                chunks.append(RangeChunk(self.topic, partition, start, end, entries, aborted, config.storage_url,
                                         dict(config.storage_options)))
        return chunks

    def _ref(self, partition: int) -> ActorRef:
        return _subscription_ref(self._client, self.topic, partition, self.subscription)

    def acknowledge(self, txn: Transaction) -> None:
        """Acknowledge every leased range in ``txn``, each as one cumulative ack of its end: the
        commit moves the cursors past them, an abort hands them out again. A failure (e.g. a
        lease that expired meanwhile: ``NotAllowed``) makes ``txn`` abort-only."""
        with txn.operation():
            self._client.loop.run(self._acknowledge(txn))

    def acknowledge_async(self, txn: Transaction) -> concurrent.futures.Future[None]:
        """``acknowledge`` without waiting, so the acks travel while the caller does other work of
        ``txn`` (a pipeline writes its output meanwhile: both are in the txn, so their order does
        not matter, and ``commit`` needs both). Errors come through the future and make ``txn``
        abort-only, as ``acknowledge``'s do. The caller waits for the future before it commits or
        aborts."""
        txn.check_open()

        async def acknowledge() -> None:
            with txn.operation():
                await self._acknowledge(txn)

        return self._client.loop.submit(acknowledge())

    async def _acknowledge(self, txn: Transaction) -> None:
        participants = [(self.topic, p, self.subscription) for p in sorted(self.leases)]
        await txn.register_many("subscription", participants)
        request = f"{txn.id}-{self.holder}-{self.epoch}"
        await asyncio.gather(*(
            self._ref(p).call_async("ack_lease", lease.lease_id, self.holder, self.epoch, txn.id,
                                    f"{request}-{lease.lease_id}", deadline_s=self._client.deadline_s)
            for p, lease in self.leases.items()))

    def acknowledge_plain(self) -> None:
        """Acknowledge every leased range at once, outside any transaction (at-least-once: a
        crash after this and before the output is durable loses nothing but may repeat it)."""
        self._client.loop.run(self._each("ack_lease", None))

    def acknowledge_plain_async(self) -> concurrent.futures.Future[None]:
        """``acknowledge_plain`` without waiting."""
        return self._client.loop.submit(self._each("ack_lease", None))

    def release(self) -> None:
        """Give every range back unacknowledged (the next lease starts at it again)."""
        self._client.loop.run(self._each("release_lease"))

    def release_async(self) -> concurrent.futures.Future[None]:
        """``release`` without waiting."""
        return self._client.loop.submit(self._each("release_lease"))

    def renew(self, timeout_s: float = 60.0) -> None:
        """Keep every lease ``timeout_s`` longer from now."""
        self._client.loop.run(self._each("renew_lease", timeout_s))

    def renew_async(self, timeout_s: float = 60.0) -> concurrent.futures.Future[None]:
        """``renew`` without waiting."""
        return self._client.loop.submit(self._each("renew_lease", timeout_s))

    async def _each(self, method: str, *args: Any) -> None:
        await asyncio.gather(*(
            self._ref(p).call_async(method, lease.lease_id, self.holder, self.epoch, *args,
                                    deadline_s=self._client.deadline_s)
            for p, lease in self.leases.items()))


def fill_plan(leases: dict[int, Lease], max_messages: int | None,
              max_bytes: int | None) -> dict[int, tuple[int | None, int | None]]:
    """Which leases of a set to grow by the entry their share left out, and the bounds
    (messages, bytes from each lease's start) that take in exactly that entry, so that the set
    fills toward ``max_messages``/``max_bytes`` without passing them.

    Why: a set-wide bound is split evenly over the partitions, and each range ends at the last
    whole entry within its share, so a set fell short of its bound by up to an entry per
    partition (an entry is a producer batch: up to 1,000 messages by default). Greedy, smallest
    left-out entry first (more of them fit); ties go in a turn that moves with each batch's lease
    ids, so no partition is always first. Leases not counted (no bound, or cut by
    ``max_entries``) and ranges that reached the readable end stay as they are."""
    counts = {p: lease.counted for p, lease in leases.items()}
    if (max_messages is None and max_bytes is None) or any(c.messages < 0 for c in counts.values()):
        return {}
    room_messages = None if max_messages is None else max_messages - sum(c.messages for c in counts.values())
    room_bytes = None if max_bytes is None else max_bytes - sum(c.size for c in counts.values())
    turn = leases[min(leases)].lease_id % len(leases) if leases else 0  # a partition's next lease has the next id
    order = sorted((p for p, c in counts.items() if c.next_messages >= 0),
                   key=lambda p: (counts[p].next_messages, (p - turn) % len(leases)))
    grow = {}
    for p in order:
        c = counts[p]
        if (room_messages is not None and c.next_messages > room_messages) or (
                room_bytes is not None and c.next_size > room_bytes):
            continue
        if room_messages is not None:
            room_messages -= c.next_messages
        if room_bytes is not None:
            room_bytes -= c.next_size
        grow[p] = (None if max_messages is None else c.messages + c.next_messages,
                   None if max_bytes is None else c.size + c.next_size)
    return grow


def trim_plan(leases: dict[int, Lease], max_messages: int | None, max_bytes: int | None) -> list[int]:
    """Which leases of a set to give back so the set stays within ``max_messages``/``max_bytes``.

    Why: a range holds at least one entry, so where entries are larger than a partition's even
    share (a producer batch holds up to 10,000 messages by default), the shares' first entries
    alone passed the set's bound: ``batch_max_messages=10_000`` over 4 partitions of 7,500-message
    entries leased 15,000 and more. Leases are kept in a turn that moves with each batch's lease
    ids (``fill_plan``'s), each while the set stays within the bounds; the first one is always
    kept, so a set progresses even when a single entry passes the bounds (the one case a set
    still does). Given-back ranges go out first in the next set. Leases not counted are kept."""
    counts = {p: lease.counted for p, lease in leases.items()}
    if (max_messages is None and max_bytes is None) or any(c.messages < 0 for c in counts.values()):
        return []
    turn = leases[min(leases)].lease_id % len(leases) if leases else 0
    messages = size = 0
    kept: list[int] = []
    dropped = []
    for p in sorted(leases, key=lambda p: (p - turn) % len(leases)):
        c = counts[p]
        over = (max_messages is not None and messages + c.messages > max_messages) or (
            max_bytes is not None and size + c.size > max_bytes)
        if over and kept:
            dropped.append(p)
            continue
        kept.append(p)
        messages, size = messages + c.messages, size + c.size
    return dropped


async def lease_partitions(client: Client, topic: str, subscription: str, partitions: int, holder: str, epoch: int,
                           max_entries: int, max_messages: int | None, max_bytes: int | None,
                           timeout_s: float) -> dict[int, Lease]:
    """Each partition's lease (``None`` ones left out), asked for concurrently, each bounded by
    an even share of ``max_messages``/``max_bytes``; then the set is filled toward those bounds
    (``fill_plan``) with one more concurrent round where it has room, and leases whose first
    entries alone passed them are given back (``trim_plan``)."""

    def share(bound: int | None) -> int | None:
        return None if bound is None else -(-bound // partitions)

    async def one(p: int) -> Lease | None:
        ref = _subscription_ref(client, topic, p, subscription)
        return await ref.call_async("lease", holder, epoch, max_entries, share(max_messages), share(max_bytes),
                                    timeout_s, deadline_s=client.deadline_s)

    granted = await asyncio.gather(*(one(p) for p in range(partitions)))
    leases = {p: lease for p, lease in enumerate(granted) if lease is not None}
    growing = fill_plan(leases, max_messages, max_bytes)

    async def grow(p: int, bounds: tuple[int | None, int | None]) -> Lease:
        ref = _subscription_ref(client, topic, p, subscription)
        return await ref.call_async("grow_lease", leases[p].lease_id, holder, epoch, max_entries, *bounds,
                                    deadline_s=client.deadline_s)

    grown = await asyncio.gather(*(grow(p, bounds) for p, bounds in growing.items()))
    leases.update(zip(growing, grown, strict=True))
    dropped = trim_plan(leases, max_messages, max_bytes)

    async def release(p: int) -> None:
        ref = _subscription_ref(client, topic, p, subscription)
        await ref.call_async("release_lease", leases[p].lease_id, holder, epoch, deadline_s=client.deadline_s)

    await asyncio.gather(*(release(p) for p in dropped))
    return {p: lease for p, lease in leases.items() if p not in dropped}
