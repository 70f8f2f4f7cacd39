"""A reader of a partition's compacted view that goes on tailing it: ``Client.compacted_reader``
(Pulsar's ``Reader`` with ``readCompacted(true)``, a Kafka consumer of a compacted topic in
``read_committed`` assigned to one partition).

It starts at ``from_offset`` in the compacted view (each key's latest committed record below the
horizon at or after that offset, then every committed keyed message after it, as
``Client.read_compacted`` returns them) and then reads what commits later. Records are
``{"offset", "key", "value"}`` in offset order (``value`` None: a tombstone; offsets are the
original ones, so gaps are legal). Like Pulsar's reader it has no subscription: nothing is acked
and nothing holds retention back; ``position`` is where it would go on, and a new reader from
that offset goes on there.

It reads storage straight, as the table view does; the partition actor is asked only for its
``max_read_position`` and aborted spans (which its consume permission guards), so open and
aborted data never reach it. A reader that falls behind past what retention trimmed goes on from
the compacted view at its position: it then gets the latest value of each key written at or after
it, Kafka's guarantee for a consumer behind the cleaner. ``CompactionReset`` when a tombstone it
had not reached was dropped meanwhile (read from offset 0 again, as a table view does).
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

from raytxn.client.compaction import _partitions, partition_plan, storage_of
from raytxn.errors import InvalidArgument, PositionTrimmed, Timeout
from raytxn.ids import Position, partition_stream
from raytxn.ledger.compacted import CompactedRead, read_compacted, read_live

if TYPE_CHECKING:
    from raytxn.client.client import Client

DEFAULT_POLL_INTERVAL_S = 0.2
# Records one poll reads past the compacted part (which holds one record per key at most): a
# reader far behind the head holds this many in memory, not the whole backlog.
MAX_RECORDS_PER_POLL = 10_000


class CompactedReader:
    """Reads one partition's compacted view, then its committed tail (see the module docstring)."""

    def __init__(self, client: Client, topic: str, partition: int = 0, from_offset: int = 0,
                 poll_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        if type(from_offset) is not int or from_offset < 0:
            raise InvalidArgument(f"from_offset must be an int >= 0, got {from_offset!r}")
        if not isinstance(poll_interval_s, int | float) or not 0 < poll_interval_s <= 60:
            raise InvalidArgument(f"poll_interval_s must be in (0, 60], got {poll_interval_s!r}")
        _partitions(client, topic, partition)  # TopicNotFound, or InvalidArgument for the partition
        self._client, self.topic, self.partition = client, topic, partition
        self.poll_interval_s = poll_interval_s
        self._storage = storage_of(client)
        self._read: collections.deque[dict[str, Any]] = collections.deque()  # read, not yet returned
        self._position = from_offset  # the offset after the last record returned
        self._live: tuple[Position, int] | None = None  # where the live tail goes on; None: from the view
        self._closed = False
        self._poll()  # the first look now: a missing consume permission is refused here, as Pulsar's is

    @property
    def position(self) -> int:
        """The offset this reader goes on from: every record it returned is below it."""
        return self._position

    def has_message_available(self) -> bool:
        """Whether a record is ready now (reads what committed since the last look when none is)."""
        self._check_open()
        if not self._read:
            self._poll()
        return bool(self._read)

    def read_next(self, timeout: float | None = None) -> dict[str, Any]:
        """The next record; waits up to ``timeout`` seconds (None: forever), then ``Timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.has_message_available():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise Timeout(f"no record on {self.topic}/{self.partition} at offset {self._position} "
                              f"within {timeout}s")
            time.sleep(self.poll_interval_s if remaining is None else min(self.poll_interval_s, remaining))
        return self._take()

    def read_available(self, max_records: int = 10_000) -> list[dict[str, Any]]:
        """Up to ``max_records`` records committed by now, without waiting (maybe none)."""
        if type(max_records) is not int or max_records < 1:
            raise InvalidArgument(f"max_records must be an int >= 1, got {max_records!r}")
        taken: list[dict[str, Any]] = []
        while len(taken) < max_records and self.has_message_available():
            taken.append(self._take())
        return taken

    def seek(self, offset: int) -> None:
        """Go on from ``offset`` in the compacted view (forward or back)."""
        self._check_open()
        if type(offset) is not int or offset < 0:
            raise InvalidArgument(f"offset must be an int >= 0, got {offset!r}")
        self._read.clear()
        self._position, self._live = offset, None

    def close(self) -> None:
        self._closed = True
        self._read.clear()

    def __enter__(self) -> CompactedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> CompactedReader:
        return self

    def __next__(self) -> dict[str, Any]:
        """The records committed by now, then ``StopIteration`` (``read_next`` waits instead)."""
        if not self.has_message_available():
            raise StopIteration
        return self._take()

    # --- reading --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"the compacted reader of {self.topic}/{self.partition} is closed")

    def _take(self) -> dict[str, Any]:
        record = self._read.popleft()
        assert record["offset"] >= self._position, (record, self._position)  # offsets only go up
        self._position = record["offset"] + 1
        return record

    def _poll(self) -> None:
        self._took(self._client.loop.run(self._next_read(), self._client.deadline_s))

    def _poll_async(self) -> concurrent.futures.Future[CompactedRead]:
        """``_poll``'s read without waiting (raytxn.aio); ``_took`` applies what it read."""
        return self._client.loop.submit(self._next_read())

    def _took(self, read: CompactedRead) -> None:
        self._read.extend(read.records)
        self._live = (read.next_position, read.next_offset)

    async def _next_read(self) -> CompactedRead:
        if self._live is not None:
            start, start_offset = self._live
            # the aborted spans from where it goes on, not from the start: a reader polls often
            plan = await partition_plan(self._client, self.topic, self.partition, start)
            try:
                return await read_live(self._storage, partition_stream(self.topic, self.partition), start,
                                       plan.max_read, plan.aborted, start_offset=start_offset,
                                       max_records=MAX_RECORDS_PER_POLL)
            except PositionTrimmed:
                pass  # behind retention: on from the compacted view at this reader's position
        plan = await partition_plan(self._client, self.topic, self.partition)
        return await read_compacted(self._storage, self.topic, self.partition, plan.max_read, plan.aborted,
                                    self._position, plan.first_readable, MAX_RECORDS_PER_POLL)
