"""Dense Kafka offsets of one partition, and the sparse index from offsets to ledger positions.

Kafka clients address a partition's messages by dense offsets 0, 1, 2, ...; raytxn addresses
entries by ledger position. Every entry takes ``span`` offsets: a DATA entry one per message, a
COMMIT/ABORT marker exactly one (as Kafka's control records do), so a Kafka consumer sees the
gaps it expects at transaction markers and none elsewhere.

Why the entry *carries* its base offset (``EntryHeader.base_offset``) rather than having it only
derived: a reader of any entry (the Kafka gateway, a range reader reading ledger objects straight
from storage) learns its offsets without counting from the start; and ``apply`` checks the carried
value against the count, so a writer bug shows up as ``CorruptLedger`` instead of silently
renumbering messages a client has already seen.

The offset is stamped when the entry is handed to the ledger (``stamp``, then the ledger append
with no await in between), not when it is prepared: the partition actor prepares markers before an
await, so preparation order is not always ledger order, but hand-over order is. ``apply`` runs in
ledger order, live and in replay, and is the only mutator of durable state, as in
``txn_buffer``; the state is in the partition's snapshots (``OffsetSnapshot``).

The index keeps a point (offset, position) at the first entry applied in each ledger and then
one at least every ``interval`` offsets: finding an offset reads at most ``interval`` offsets'
worth of entries from the point at or below it. Retention deletes entries from the front, at any
entry (it follows the slowest subscription's mark, which is rarely a ledger's start); points below
the trim point go with them (``prune``), and the partition then pins a point at the first entry
kept (``pin``: its base offset, which the entry carries). The log start offset is the first point
at or after the trim point, so without the pin every entry between the trim point and the next
point would be unreachable by offset: a Kafka group whose committed offset lay there resumed at
that next point (or at the high watermark), skipping messages it never consumed.

Old entries without a base offset (written before offsets existed) get the offset the count gives
them on apply, the same in every replay. A snapshot written before offsets existed has none: the
count then starts at 0 with the first entry after it, and the entries it covers have no offset
(they lie below the log start offset, as if trimmed).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Sequence
from typing import TypeVar

import msgspec

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ids import Position
from raytxn.protocol.entry_format import EntryHeader, MessageRecord

T = TypeVar("T")

DEFAULT_INDEX_INTERVAL = 256


class OffsetPoint(msgspec.Struct, frozen=True, array_like=True):
    """The entry at ``position`` has base offset ``offset``."""

    offset: int
    position: Position


class OffsetSnapshot(msgspec.Struct, frozen=True, array_like=True):
    """The durable state: the next offset to give and the index, ascending."""

    next_offset: int
    points: list[OffsetPoint]


def entry_span(header: EntryHeader) -> int:
    """Offsets an entry takes: its messages, or one for a marker."""
    return 1 if header.is_marker else header.count


def entries_from_offset(entries: Sequence[tuple[EntryHeader, T]], base: int, offset: int, end_offset: int,
                        room: int) -> tuple[list[tuple[int, T]], int]:
    """Of consecutive entries, the first at base offset ``base``: those holding an offset at or
    after ``offset`` that start before ``end_offset``, at most ``room``, as ``(base offset, item)``;
    and the base offset after the last entry given (a Kafka fetch's window on a read)."""
    picked: list[tuple[int, T]] = []
    for header, item in entries:
        span = entry_span(header)
        if base + span > offset and base < end_offset and len(picked) < room:
            picked.append((base, item))
        base += span
    return picked, base


def message_timestamp(header: EntryHeader, message: MessageRecord) -> int:
    """A message's Kafka timestamp: its producer's event time (Kafka's CreateTime), else the
    time its entry was appended. Fetch shows it, and ListOffsets by time looks it up."""
    return message.event_time_ms if message.event_time_ms is not None else header.publish_time_ms


def offset_for_time(entries: Sequence[tuple[EntryHeader, Sequence[int]]], base: int, timestamp_ms: int,
                    end_offset: int) -> tuple[tuple[int, int] | None, int]:
    """Of consecutive entries, the first at base offset ``base``, each with its messages'
    timestamps (none for a marker): ``(offset, timestamp)`` of the first message, in offset
    order, below ``end_offset`` whose timestamp is at or after ``timestamp_ms`` (Kafka's
    ListOffsets by time; with event times, later offsets may carry earlier times, and the
    first offset counts, as in Kafka), or None; and the base offset after the entries read."""
    for header, stamps in entries:
        for index, stamp in enumerate(stamps[:max(0, end_offset - base)]):
            if stamp >= timestamp_ms:
                return (base + index, stamp), base
        base += entry_span(header)
    return None, base


def offset_of_max_time(entries: Sequence[tuple[EntryHeader, Sequence[int]]], base: int, end_offset: int,
                       best: tuple[int, int] | None) -> tuple[tuple[int, int] | None, int]:
    """Of consecutive entries (as ``offset_for_time`` takes them), continuing from ``best``, the
    answer over the entries before them (None: no message yet): ``(offset, timestamp)`` of the
    message below ``end_offset`` with the largest timestamp, the first in offset order on a tie
    (Kafka's ListOffsets for MAX_TIMESTAMP, KIP-734); and the base offset after the entries read."""
    for header, stamps in entries:
        for index, stamp in enumerate(stamps[:max(0, end_offset - base)]):
            if best is None or stamp > best[1]:
                best = (base + index, stamp)
        base += entry_span(header)
    return best, base


def entry_holding(entries: Sequence[tuple[Position, EntryHeader]], base: int,
                  offset: int) -> tuple[Position, int, int] | None:
    """Of consecutive entries, the first at base offset ``base``: the one holding ``offset``, as
    ``(position, index of the message in it, messages in it)`` (a marker: index 0, 0 messages);
    None if they end before it."""
    for position, header in entries:
        span = entry_span(header)
        if base + span > offset:
            return position, offset - base, header.count
        base += span
    return None


def offset_at(entries: Sequence[tuple[Position, EntryHeader]], base: int, position: Position,
              index: int) -> int | None:
    """Of consecutive entries, the first at base offset ``base``: the offset of the first message
    at or after message ``index`` of the entry at ``position`` (the next entry's base offset when
    ``index`` is past its messages, or when no entry is at ``position``); None if every entry
    lies before ``position``."""
    for entry_position, header in entries:
        span = entry_span(header)
        if entry_position == position:
            return base + min(index, span)
        if entry_position > position:
            return base
        base += span
    return None


class OffsetIndex:
    """Next offset, sparse offset -> position index, and the stamps handed to the ledger."""

    def __init__(self, *, interval: int = DEFAULT_INDEX_INTERVAL) -> None:
        if type(interval) is not int or interval < 1:
            raise InvalidArgument(f"index interval must be an int >= 1, got {interval!r}")
        self.interval = interval
        # --- durable ---
        self._next_offset = 0
        self._points: list[OffsetPoint] = []
        self._offsets: list[int] = []  # the points' offsets, for bisect
        # --- volatile: (base, span) stamped and handed to the ledger, not applied yet, in order ---
        self._stamped: deque[tuple[int, int]] = deque()
        self._last_ledger: int | None = None

    # --- queries ---------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next entry applied will start at (Kafka's log end offset)."""
        return self._next_offset

    def start_offset(self, trimmed_below: Position) -> int:
        """The lowest offset reachable by ``locate`` (Kafka's log start offset)."""
        for point in self._points:
            if point.position >= trimmed_below:
                return point.offset
        return self._next_offset

    def locate(self, offset: int, trimmed_below: Position) -> OffsetPoint | None:
        """The index point to read from to find ``offset``: the last point at or below it. None
        if ``offset`` is below the log start offset or at or past the next offset."""
        if type(offset) is not int:
            raise InvalidArgument(f"an offset is an int, got {offset!r}")
        if not self.start_offset(trimmed_below) <= offset < self._next_offset:
            return None
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._points[i] if i >= 0 else None

    def point_at_or_before(self, position: Position) -> OffsetPoint | None:
        """The last index point at or before ``position`` (None: it lies before every point)."""
        i = bisect.bisect_right(self._points, position, key=lambda point: point.position) - 1
        return self._points[i] if i >= 0 else None

    # --- writing ---------------------------------------------------------------------------

    def stamp(self, header: EntryHeader) -> EntryHeader:
        """``header`` with the base offset it gets when handed to the ledger now (next after
        everything applied or stamped before). Hand it over at once, or ``unstamp`` it."""
        base = self._stamped[-1][0] + self._stamped[-1][1] if self._stamped else self._next_offset
        self._stamped.append((base, entry_span(header)))
        return msgspec.structs.replace(header, base_offset=base)

    def unstamp(self, header: EntryHeader) -> None:
        """Take back the newest stamp: its entry was refused before the ledger queued it."""
        if not self._stamped or self._stamped[-1][0] != header.base_offset:
            raise InvalidArgument(f"unstamp of {header!r}: not the newest stamp")
        self._stamped.pop()

    def apply(self, position: Position, span: int, carried: int | None = None) -> int:
        """An entry of ``span`` offsets became durable at ``position`` (in ledger order), carrying
        base offset ``carried`` (None: an entry from before offsets). Returns its base offset;
        ``CorruptLedger`` if it carries another than the count gives."""
        base = self._next_offset
        if carried is not None and carried != base:
            raise CorruptLedger(f"entry at {position} carries base offset {carried}, the count gives {base}",
                                str(position))
        if self._stamped and self._stamped[0][0] == base:
            self._stamped.popleft()
        if (position.ledger_id != self._last_ledger or not self._points
                or base - self._points[-1].offset >= self.interval):
            self._points.append(OffsetPoint(base, position))
            self._offsets.append(base)
        self._last_ledger = position.ledger_id
        self._next_offset = base + span
        return base

    # --- retention -------------------------------------------------------------------------

    def prune(self, trimmed_below: Position) -> int:
        """Forget the points of entries below ``trimmed_below`` (deleted). Returns how many."""
        keep = bisect.bisect_left([p.position for p in self._points], trimmed_below)
        del self._points[:keep]
        del self._offsets[:keep]
        return keep

    def pin(self, position: Position, offset: int) -> bool:
        """The entry at ``position``, the first one kept after a trim, has base offset ``offset``
        (as it carries): make it a point, so the log start offset is its offset and every offset
        from there is reachable. Only for an entry already applied (below ``next_offset``) and
        below every point kept; a point already there changes nothing. Returns whether it added
        one. ``CorruptLedger`` if the offset contradicts the points around it."""
        if type(offset) is not int or not 0 <= offset < self._next_offset:
            raise InvalidArgument(f"pin of {position} at offset {offset!r}: not an applied entry's offset "
                                  f"(next offset {self._next_offset})")
        i = bisect.bisect_left(self._points, position, key=lambda point: point.position)
        if i < len(self._points) and self._points[i].position == position:
            if self._points[i].offset != offset:
                raise CorruptLedger(f"entry at {position} carries base offset {offset}, its index point says "
                                    f"{self._points[i].offset}", str(position))
            return False
        if i > 0:
            raise InvalidArgument(f"pin of {position}: points below it are still kept (prune first)")
        if self._points and self._points[0].offset <= offset:
            raise CorruptLedger(f"entry at {position} carries base offset {offset}, not below the next point's "
                                f"{self._points[0].offset} at {self._points[0].position}", str(position))
        self._points.insert(0, OffsetPoint(offset, position))
        self._offsets.insert(0, offset)
        return True

    # --- snapshots -------------------------------------------------------------------------

    def snapshot(self) -> OffsetSnapshot:
        return OffsetSnapshot(self._next_offset, list(self._points))

    @classmethod
    def from_snapshot(cls, snapshot: OffsetSnapshot | None, *,
                      interval: int = DEFAULT_INDEX_INTERVAL) -> OffsetIndex:
        """The index a snapshot recorded (None: a snapshot from before offsets, counting starts
        at 0). ``CorruptLedger`` if the points are not ascending or pass the next offset."""
        index = cls(interval=interval)
        if snapshot is None:
            return index
        points = snapshot.points
        ascending = all(a.offset < b.offset and a.position < b.position for a, b in itertools.pairwise(points))
        if not ascending or (points and points[-1].offset >= snapshot.next_offset) or snapshot.next_offset < 0:
            raise CorruptLedger(f"inconsistent offset index in snapshot (next {snapshot.next_offset}, "
                                f"{len(points)} points)")
        index._next_offset = snapshot.next_offset
        index._points = list(points)
        index._offsets = [p.offset for p in points]
        index._last_ledger = points[-1].position.ledger_id if points else None
        return index
