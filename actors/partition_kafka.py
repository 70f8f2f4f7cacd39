"""The Kafka side of a partition actor (a mixin of ``actors/partition.py``'s ``PartitionBuffer``):
the dense Kafka offsets of its entries, the fetch a Kafka gateway serves from them
(``kafka_read``, a compacted topic's records below its live ledger included), and the lookups of
an offset by time and of an entry by offset. Every method reads the partition's own state (its
ledger, txn buffer and compaction) and changes none of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raytxn.actors.compaction import PartitionCompaction
from raytxn.auth import Access, guarded
from raytxn.config import PartitionConfig
from raytxn.errors import ActorUnavailable, InvalidArgument, PositionTrimmed
from raytxn.ids import Position
from raytxn.ledger import Entry, ManagedLedger
from raytxn.protocol.cursor import next_position
from raytxn.protocol.entry_format import (
    EntryHeader,
    decode_entry,
    decode_header,
)
from raytxn.protocol.offsets import (
    entries_from_offset,
    entry_holding,
    entry_span,
    message_timestamp,
    offset_at,
    offset_for_time,
    offset_of_max_time,
)
from raytxn.protocol.packed_records import PackedRecords
from raytxn.protocol.txn_buffer import TransactionBuffer
from raytxn.waiting import Signal

SCAN_ATTEMPTS = 3  # Kafka offset lookups read again this often when retention trims under them
FIRST_READ_ENTRIES = 4  # a read bounded in bytes asks storage for this many entries first


class ReadBudget:
    """How many entries a Kafka read bounded by ``max_bytes`` asks storage for at a time: a few
    first, then as many as the bytes still wanted take at the entries' mean size so far (one
    more, at most ``max_read_entries``), so that a fetch of 1 MiB from entries of 1 MiB reads a
    few, not ``max_read_entries`` of them. Unbounded (None): ``max_read_entries`` each time."""

    def __init__(self, max_bytes: int | None, max_read_entries: int) -> None:
        self.max_bytes, self.max_read_entries = max_bytes, max_read_entries
        self.taken = self.read_bytes = self.read_entries = 0
        self.spent = False

    def next_read(self) -> int:
        if self.max_bytes is None:
            return self.max_read_entries
        if not self.read_entries:
            return min(FIRST_READ_ENTRIES, self.max_read_entries)
        mean = max(1, self.read_bytes // self.read_entries)
        return max(1, min(self.max_read_entries, -(-(self.max_bytes - self.taken) // mean) + 1))

    def read(self, entries: list[Entry]) -> None:
        """Count the entries storage gave (also those before the offset asked for: they say the size)."""
        if self.max_bytes is not None:
            self.read_entries += len(entries)
            self.read_bytes += sum(sum(map(len, entry.records)) for entry in entries)

    def take(self, size: int) -> bool:
        """Count an entry of ``size`` bytes taken; whether the budget is spent."""
        self.taken += size
        self.spent = self.max_bytes is not None and self.taken >= self.max_bytes
        return self.spent


class PartitionKafka:
    """Kafka offsets and reads of a partition; ``PartitionBuffer`` provides the state."""

    buffer: TransactionBuffer
    _ledger: ManagedLedger | None
    compaction: PartitionCompaction
    config: PartitionConfig
    stream: str
    info: dict[str, Any]
    _advanced: Signal
    _draining: ActorUnavailable | None  # (ActorShell's: set by a drain)

    def _kafka_offsets(self) -> dict[str, int]:
        assert self._ledger is not None
        # A compacted topic's log starts at 0, as Kafka's does: below its live ledger is its compacted one.
        live_start = self.buffer.offsets.start_offset(self._ledger.trimmed_below)
        return {"log_start": 0 if self.compaction.compacted else live_start,
                "last_stable": self.buffer.last_stable_offset, "high_watermark": self.buffer.offsets.next_offset}

    @guarded(Access.CONSUME)
    async def kafka_offsets(self) -> dict[str, int]:
        """Kafka's log start offset, last stable offset and high watermark of this partition."""
        await self._started()
        return self._kafka_offsets()

    @guarded(Access.CONSUME)
    async def kafka_read(self, offset: int, max_entries: int = 100, committed: bool = True,
                         max_wait_s: float = 0.0, max_bytes: int | None = None) -> dict[str, Any]:
        """Entries for a Kafka fetch from ``offset``: ``entries`` as ``(base_offset, records)``
        (records[0] the header; markers included, as Kafka sends control batches), up to the last
        stable offset (``committed``, read_committed) or the high watermark, at most
        ``max_entries`` and, with ``max_bytes``, no more entries once their stored bytes reach it
        (at least one: Kafka's rule for a batch larger than the fetch's partition limit); with
        ``committed``, ``aborted`` as ``(txn, first_offset)`` for the aborted txns among them.
        Waits up to ``max_wait_s`` for data; ``out_of_range`` when ``offset`` is not stored here.
        A compacted topic's fetch under its live ledger's start has ``compacted`` runs of records
        (``protocol.compaction.CompactedRun``) instead of entries."""
        await self._started()
        assert self._ledger is not None
        self.info["kafka_reads"] += 1  # a gateway's reads (its fetches and watches), in stats
        if type(offset) is not int or type(max_entries) is not int or max_entries < 1 or not (
                max_bytes is None or (type(max_bytes) is int and max_bytes >= 1)):
            raise InvalidArgument(f"kafka_read takes an int offset, max_entries >= 1 and max_bytes None or >= 1, got "
                                  f"{offset!r}, {max_entries!r}, {max_bytes!r}")
        offsets = self.buffer.offsets

        def limit() -> int:
            return self.buffer.last_stable_offset if committed else offsets.next_offset

        deadline = self.clock.monotonic() + max_wait_s
        while limit() <= offset and self.clock.monotonic() < deadline and self._draining is None:
            if not await self._advanced.wait(deadline - self.clock.monotonic()):
                break
        marks = self._kafka_offsets()
        out: dict[str, Any] = {**marks, "entries": [], "compacted": [], "aborted": [], "out_of_range": False}
        if not marks["log_start"] <= offset <= marks["high_watermark"]:
            return {**out, "out_of_range": True}
        live_start = offsets.start_offset(self._ledger.trimmed_below)
        if offset < live_start:  # a compacted topic's (log_start is 0): below the live ledger, its compacted records
            out["compacted"] = await self.compaction.kafka_runs(offset, live_start)
            if out["compacted"]:
                return out
            offset = live_start  # only gaps up to the live ledger: read on from there
        end_offset = limit()
        point = offsets.locate(offset, self._ledger.trimmed_below)
        if offset >= end_offset or point is None:
            return out
        end = self.buffer.max_read_position if committed else self.buffer.last_position
        position, base = point.position, point.offset
        first = last = None
        budget = ReadBudget(max_bytes, self.config.max_read_entries)
        while base < end_offset and len(out["entries"]) < max_entries and position <= end and not budget.spent:
            read_from, entries = await self._read_retained(position, budget.next_read(), end)
            if not entries or read_from != position:  # trimmed under the read: the client asks again
                break
            budget.read(entries)
            headed = [(decode_header(entry.records[0], f"{self.stream}@{entry.position}"), entry)
                      for entry in entries]
            picked, base = entries_from_offset(headed, base, offset, end_offset,
                                               max_entries - len(out["entries"]))
            for entry_base, entry in picked:  # packed: two buffers to pickle an entry, not one per message
                packed = PackedRecords.pack(entry.records)
                out["entries"].append((entry_base, packed))
                self.info["kafka_messages_out"] += len(entry.records) - 1  # (a marker: 0)
                first = entry.position if first is None else first
                last = entry.position
                if budget.take(len(packed.data)):
                    break  # the bytes asked for are in (the loop ends on ``budget.spent``)
            position = next_position(entries[-1].position)
        self.info["kafka_read_entries"] += len(out["entries"])  # what the gateways' reads carried, in stats
        if committed and first is not None and last is not None:
            out["aborted"] = [(a.txn, a.first_offset) for a in self.buffer.aborted_between(first, last)
                              if a.first_offset is not None]
        return out

    @guarded(Access.CONSUME)
    async def kafka_offset_for_time(self, timestamp_ms: int, committed: bool = True) -> tuple[int, int] | None:
        """Kafka's ListOffsets by time: ``(offset, timestamp)`` of the first message whose
        timestamp (``offsets.message_timestamp``) is at or after ``timestamp_ms``, below the last
        stable offset (``committed``, read_committed) or the high watermark; None when there is
        none. raytxn keeps no time index, so this reads the partition from its log start (as
        ``Subscription.seek`` by publish time does); entries trimmed under the read start it again."""
        await self._started()
        assert self._ledger is not None
        if type(timestamp_ms) is not int or timestamp_ms < 0:
            raise InvalidArgument(f"a timestamp is an int >= 0 (ms), got {timestamp_ms!r}")
        return await self._by_time(timestamp_ms, committed)

    @guarded(Access.CONSUME)
    async def kafka_offset_of_max_time(self, committed: bool = True) -> tuple[int, int] | None:
        """Kafka's ListOffsets for MAX_TIMESTAMP (KIP-734): ``(offset, timestamp)`` of the message
        with the largest timestamp (the first on a tie), of those below the last stable offset
        (``committed``) or the high watermark; None when there is none. Reads the partition from
        its log start, as ``kafka_offset_for_time`` does."""
        await self._started()
        return await self._by_time(None, committed)

    async def _by_time(self, timestamp_ms: int | None, committed: bool) -> tuple[int, int] | None:
        for _ in range(SCAN_ATTEMPTS):  # again only when retention trims under the read
            found, complete = await self._lookup_by_time(timestamp_ms, committed)
            if complete:
                return found
        raise PositionTrimmed(f"{self.stream}: retention trimmed {SCAN_ATTEMPTS} times under the lookup by time")

    async def _lookup_by_time(self, timestamp_ms: int | None,
                              committed: bool) -> tuple[tuple[int, int] | None, bool]:
        """One read of ``kafka_offset_for_time`` (``timestamp_ms`` None: of
        ``kafka_offset_of_max_time``): (its answer, whether no trim met the read)."""
        assert self._ledger is not None
        marks = self._kafka_offsets()
        end_offset = marks["last_stable" if committed else "high_watermark"]
        point = self.buffer.offsets.locate(marks["log_start"], self._ledger.trimmed_below)
        if point is None or marks["log_start"] >= end_offset:
            return None, True
        base = point.offset
        latest: tuple[int, int] | None = None  # the max-time lookup's answer so far

        def visit(entries: list[Entry]) -> tuple[int, int] | None:
            nonlocal base, latest
            stamped = []
            for entry in entries:
                header, messages = decode_entry(entry.records, f"{self.stream}@{entry.position}")
                stamped.append((header, [message_timestamp(header, m) for m in messages]))
            if timestamp_ms is None:  # every entry counts: the scan goes on to the end
                latest, base = offset_of_max_time(stamped, base, end_offset, latest)
                return None
            found, base = offset_for_time(stamped, base, timestamp_ms, end_offset)
            return found

        end = self.buffer.max_read_position if committed else self.buffer.last_position
        found, complete = await self._scan(point.position, end, visit)
        return (latest if timestamp_ms is None else found), complete

    @guarded(Access.CONSUME)
    async def locate_offset(self, offset: int) -> Position | None:
        """The position of the index point to read from to find Kafka ``offset`` (the entry at
        it has a base offset at or below ``offset``); None if ``offset`` is not stored here."""
        await self._started()
        assert self._ledger is not None
        point = self.buffer.offsets.locate(offset, self._ledger.trimmed_below)
        return None if point is None else point.position


    @guarded(Access.CONSUME)
    async def kafka_locate(self, offset: int) -> dict[str, Any] | None:
        """Where Kafka ``offset`` is, for a consumer group committing it: ``position`` of the
        entry holding it, ``index`` of the message in that entry and ``size`` (its messages); for
        the high watermark, the position after the last entry, index 0, size None. None when
        ``offset`` lies outside [log start offset, high watermark]."""
        await self._started()
        assert self._ledger is not None
        if type(offset) is not int:
            raise InvalidArgument(f"a Kafka offset is an int, got {offset!r}")
        marks = self._kafka_offsets()
        if not marks["log_start"] <= offset <= marks["high_watermark"]:
            return None
        if offset == marks["high_watermark"]:
            return {"position": next_position(self.buffer.last_position), "index": 0, "size": None}
        point = self.buffer.offsets.locate(offset, self._ledger.trimmed_below)
        if point is None:
            return None
        found = await self._scan_offsets(point.position, point.offset,
                                         lambda headed, base: entry_holding(headed, base, offset))
        if found is None:
            return None  # trimmed under the scan
        position, index, size = found
        return {"position": position, "index": index, "size": size}

    @guarded(Access.CONSUME)
    async def kafka_offset_of(self, position: Position, index: int) -> int:
        """The Kafka offset of the first message at or after message ``index`` of the entry at
        ``position`` (a consumer group's committed position, as a Kafka offset): the log start
        offset for a position before every entry kept, the high watermark past the last."""
        await self._started()
        assert self._ledger is not None
        if not isinstance(position, Position) or type(index) is not int or index < 0:
            raise InvalidArgument(f"kafka_offset_of takes a Position and an index >= 0, got {position!r}, {index!r}")
        for _ in range(SCAN_ATTEMPTS):  # again only when retention trimmed under the scan
            marks = self._kafka_offsets()
            if position > self.buffer.last_position:
                return marks["high_watermark"]
            point = self.buffer.offsets.point_at_or_before(position)
            if point is None or point.position < self._ledger.trimmed_below:
                return marks["log_start"]
            found = await self._scan_offsets(point.position, point.offset,
                                             lambda headed, base: offset_at(headed, base, position, index))
            if found is not None:  # (an entry at or after ``position`` exists: only a trim hides it)
                return found
        raise PositionTrimmed(f"{self.stream}: retention trimmed {SCAN_ATTEMPTS} times under the offset lookup "
                              f"of {position}")

    async def _scan_offsets(self, start: Position, base: int,
                            find: Callable[[list[tuple[Position, EntryHeader]], int], Any]) -> Any:
        """Read entries from the index point at ``start`` (base offset ``base``) up to the last
        entry, a batch at a time, until ``find(headers, base)`` (over ``(position, header)`` of
        the batch, and the batch's first base offset) answers. None: nothing answered, or the
        entries were trimmed under the read. At most one index interval of offsets is read
        before the entry wanted (the index has a point at least every interval)."""

        def visit(entries: list[Entry]) -> Any:
            nonlocal base
            headed = [(entry.position, decode_header(entry.records[0], f"{self.stream}@{entry.position}"))
                      for entry in entries]
            found = find(headed, base)
            base += sum(entry_span(header) for _, header in headed)
            return found

        found, _complete = await self._scan(start, self.buffer.last_position, visit)
        return found

    async def _scan(self, start: Position, end: Position, visit: Callable[[list[Entry]], Any]) -> tuple[Any, bool]:
        """Read the entries from ``start`` up to ``end``, a batch at a time, until
        ``visit(batch)`` answers (anything but None). Returns that answer (None: none did) and
        whether the read met no trim (a trim under it ends it, with None)."""
        position = start
        while position <= end:
            read_from, entries = await self._read_retained(position, self.config.max_read_entries, end)
            if not entries or read_from != position:
                return None, False
            found = visit(entries)
            if found is not None:
                return found, True
            position = next_position(entries[-1].position)
        return None, True
