"""A table over a topic: ``Client.table_view`` (Pulsar's TableView, the store of a Kafka Streams
KTable).

A view loads each partition's compacted view (``read_compacted`` from offset 0: the latest value
of each key below the horizon, then the committed messages after it), then tails the committed
data in the background every ``poll_interval_s``. It reads storage straight, as the bulk path
does; each partition actor is asked only for its ``max_read_position`` and aborted spans, so open
and aborted data never reach the table.

``refresh()`` returns once everything committed before the call is applied: it asks each
partition for its ``max_read_position`` after the call began, which covers every transaction
committed before it. Listeners are called in log order per partition, tombstones (an empty value)
as ``None``, on the client's loop thread; a listener that raises is logged and counted, and the
table goes on.

A view that fell behind past what retention trimmed (``PositionTrimmed``) loads again from the
compacted view; its listeners then hear the keys whose values changed meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from raytxn.client.compaction import partition_plan, storage_of
from raytxn.errors import InvalidArgument, PositionTrimmed, RaytxnError
from raytxn.ids import Position, partition_stream
from raytxn.ledger.compacted import read_compacted, read_live
from raytxn.ledger.storage import Storage
from raytxn.protocol.lease import RangePlan

if TYPE_CHECKING:
    from raytxn.client.client import Client

log = logging.getLogger(__name__)
DEFAULT_POLL_INTERVAL_S = 0.2
Listener = Callable[[str, bytes | None], None]
PlanOf = Callable[[int, Position], Awaitable[RangePlan]]  # (partition, start) -> its RangePlan from start


class TableState:
    """The table's values and, per partition, where its view goes on; loads and tails over
    ``storage``, asking ``plan(partition, start)`` for the partition's ``RangePlan`` from
    ``start`` (its ``max_read_position`` and aborted spans). No thread, no listener, no timer:
    ``TableView`` is its shell on the client's loop, and the simulator (``raytxn.sim``) drives
    one over its own network and storage."""

    def __init__(self, topic: str, partitions: int, storage: Storage, plan: PlanOf) -> None:
        self.topic, self.partitions = topic, partitions
        self._storage, self._plan = storage, plan
        self._values: dict[str, bytes] = {}
        self._keys_of: list[set[str]] = [set() for _ in range(partitions)]  # held keys, per partition
        self._next_position = [Position(0, 0)] * partitions
        self._next_offset = [0] * partitions
        self._refreshing: asyncio.Lock | None = None

    def get(self, key: str) -> bytes | None:
        return self._values.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def items(self) -> dict[str, bytes]:
        """A copy of the table now."""
        return dict(self._values)

    def partition_view(self, partition: int) -> tuple[Position, dict[str, bytes]]:
        """The first position of ``partition`` not applied yet, and the table's keys of that
        partition with their values: the fold of every committed message before that position."""
        return self._next_position[partition], {key: self._values[key] for key in self._keys_of[partition]}

    @property
    def position(self) -> dict[int, int]:
        """Per partition, the offset of the first entry not yet applied: the table reflects every
        committed message below it."""
        return dict(enumerate(self._next_offset))

    def _apply(self, partition: int, records: list[dict[str, Any]]) -> None:
        keys = self._keys_of[partition]
        for record in records:
            key, value = record["key"], record["value"]
            if value is None:
                self._values.pop(key, None)
                keys.discard(key)
            else:
                self._values[key] = value
                keys.add(key)
            self._applied(key, value)

    def _applied(self, key: str, value: bytes | None) -> None:
        """Called for each update, in log order (the view's listeners hear it here)."""

    async def load_async(self) -> None:
        """Load every partition's compacted view (a view's first step)."""
        for partition in range(self.partitions):
            await self._load(partition)

    async def _load(self, partition: int) -> None:
        plan = await self._plan(partition, Position(0, 0))
        read = await read_compacted(self._storage, self.topic, partition, plan.max_read, plan.aborted, 0,
                                    plan.first_readable)
        latest: dict[str, bytes | None] = {}
        for record in read.records:
            latest[record["key"]] = record["value"]
        # a first load applies all; a reload (after a trim) only what differs from the table
        gone = [{"key": k, "value": None} for k in self._keys_of[partition] if latest.get(k) is None]
        changed = [{"key": k, "value": v} for k, v in latest.items()
                   if v is not None and self._values.get(k) != v]
        self._apply(partition, gone + changed)
        self._next_position[partition], self._next_offset[partition] = read.next_position, read.next_offset

    async def _refresh_partition(self, partition: int) -> None:
        # the aborted spans from where this view goes on, not from the start: a tail polls often
        plan = await self._plan(partition, self._next_position[partition])
        try:
            read = await read_live(self._storage, partition_stream(self.topic, partition),
                                   self._next_position[partition], plan.max_read, plan.aborted,
                                   start_offset=self._next_offset[partition])
        except PositionTrimmed:
            await self._load(partition)
            return
        self._apply(partition, read.records)
        self._next_position[partition], self._next_offset[partition] = read.next_position, read.next_offset

    async def refresh_async(self) -> dict[int, int]:
        """Apply everything committed before this call; returns ``position`` then."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            for partition in range(self.partitions):
                await self._refresh_partition(partition)
        return self.position


class TableView(TableState):
    """The latest committed value of each key of ``topic`` (see the module docstring)."""

    def __init__(self, client: Client, topic: str, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        if not isinstance(poll_interval_s, int | float) or not 0 < poll_interval_s <= 60:
            raise InvalidArgument(f"poll_interval_s must be in (0, 60], got {poll_interval_s!r}")

        async def plan(partition: int, start: Position) -> RangePlan:
            return await partition_plan(client, topic, partition, start)

        super().__init__(topic, client.get_topic(topic)["partitions"], storage_of(client), plan)
        self._client, self.poll_interval_s = client, poll_interval_s
        self._listeners: list[Listener] = []
        self._mutex = threading.Lock()  # values and listeners, between the loop and callers
        self.listener_errors = 0
        self.tail_errors = 0
        self._closed = False
        client.loop.run(self.load_async())
        self._tail = client.loop.submit(self._tail_forever())

    # --- reading --------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[str]:
        return iter(self.items())

    def items(self) -> dict[str, bytes]:
        with self._mutex:
            return super().items()

    def listen(self, listener: Listener, existing: bool = False) -> None:
        """Call ``listener(key, value)`` for each update from now on (``value`` None: deleted);
        with ``existing``, first for every key the table holds (Pulsar's forEachAndListen)."""
        with self._mutex:
            if existing:
                for key, value in self._values.items():
                    self._call(listener, key, value)
            self._listeners.append(listener)

    def refresh(self, timeout_s: float | None = 60.0) -> dict[int, int]:
        """Apply everything committed before this call; returns ``position`` then."""
        self._check_open()
        return self._client.loop.run(self.refresh_async(), timeout_s)

    def refresh_future(self) -> concurrent.futures.Future[dict[int, int]]:
        """``refresh`` without waiting: a future of ``position`` once everything committed before
        this call is applied (what ``raytxn.aio``'s table view awaits)."""
        self._check_open()
        return self._client.loop.submit(self.refresh_async())

    def close(self) -> None:
        self._closed = True
        self._tail.cancel()

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- applying -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"the table view of {self.topic!r} is closed")

    def _call(self, listener: Listener, key: str, value: bytes | None) -> None:
        try:
            listener(key, value)
        except Exception:  # a user's listener must not stop the table
            self.listener_errors += 1
            log.exception("a table view listener of %s raised", self.topic)

    def _apply(self, partition: int, records: list[dict[str, Any]]) -> None:
        with self._mutex:
            super()._apply(partition, records)

    def _applied(self, key: str, value: bytes | None) -> None:
        for listener in self._listeners:
            self._call(listener, key, value)

    async def _tail_forever(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.refresh_async()
            except RaytxnError as e:  # the next round tries again; a refresh() meanwhile raises its own
                self.tail_errors += 1
                log.warning("table view of %s: %s", self.topic, e)
