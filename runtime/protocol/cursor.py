"""The acknowledgement state of one subscription: Pulsar's ManagedCursor, as a pure data structure.

Positions are totally ordered pairs ``(ledger_id, entry_id)``, but the cursor never knows which
positions exist: a ledger ends somewhere, the next one may start at a higher ledger id, and
markers or aborted messages are never delivered. So acked-ness is kept as a set of **half-open
ranges of the total order** ``[start, end)``, which are exact sets of integer pairs whatever exists:

* ``acked_below`` (exclusive): every position ``< acked_below`` is acked. This is the mark-delete
  bound; ``mark_delete_position`` (Pulsar's inclusive form) is derived from it for display.
* ``ranges``: disjoint, non-touching ranges ``[start, end)`` with ``acked_below < start``, acked
  individually above the mark-delete bound. Acking one entry adds ``[p, (p.ledger, p.entry + 1))``
  - no pair lies strictly between those two, so that range is exactly ``{p}``.
* ``batches``: entries of which only some batch indexes are acked, as Pulsar's ack set: a bit SET
  means that batch index is still UNACKED. Such an entry is in no range and not below the bound.

Compaction is one rule: a range whose start is ``<= acked_below`` (nothing unacked in between)
is merged into the bound, which moves to the range's end. It needs no successor of a position, so
it is airtight across ledger boundaries - **provided the subscription acks the regions it reads
over without delivering them** (``ack_range``): markers, aborted messages, and the gaps between a
ledger's last entry and the next ledger's first, e.g. ``[(3, 10), (4, 0))`` (``gaps_between`` makes
those ranges). Without that, the bound stops at the end of a ledger; memory still stays flat
(in-order acks extend one range per unbridged ledger boundary), but ledgers are not freed.

Commit metadata: a string kept with the mark-delete bound (Pulsar's mark-delete properties), a
Kafka group's offset metadata. Only ``set_metadata`` changes it: acks and seeks leave it as it is.

Pure: no Ray, no I/O, no clock. Durable through ``snapshot()`` / ``from_snapshot()``.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from sortedcontainers import SortedDict

from raytxn.errors import CorruptLedger, InvalidArgument, MetadataTooLarge
from raytxn.ids import EARLIEST, Position


def next_position(position: Position) -> Position:
    """The pair right after ``position`` in the total order (it may not exist in any ledger):
    ``[position, next_position(position))`` is exactly ``{position}``."""
    return Position(position.ledger_id, position.entry_id + 1)


def position_before(bound: Position) -> Position:
    """The inclusive mark-delete position of an exclusive bound: ``(L, E - 1)``. For a bound at a
    ledger start that is ``(L, -1)``, Pulsar's "before the first entry of ledger L", which sorts
    after every entry of earlier ledgers. So ``p <= position_before(b)`` exactly when ``p < b``."""
    return Position(bound.ledger_id, bound.entry_id - 1)


# Kafka's broker default offset.metadata.max.bytes; counted here in UTF-8 bytes.
MAX_COMMIT_METADATA_BYTES = 4096

# The lowest bound the cursor uses: everything up to EARLIEST is acked from the start.
_FLOOR = next_position(EARLIEST)


def gaps_between(read_start: Position, positions: Iterable[Position]) -> list[tuple[Position, Position]]:
    """The ranges a read from ``read_start`` passed over without returning an entry: between
    ``read_start`` and the first position, and between consecutive positions (ascending).
    Acking these with ``ack_range`` lets the mark-delete bound cross markers and ledger ends."""
    gaps: list[tuple[Position, Position]] = []
    expected = read_start
    for position in positions:
        if position < expected:
            raise InvalidArgument(f"positions must ascend from {read_start}, got {position} after {expected}")
        if expected < position:
            gaps.append((expected, position))
        expected = next_position(position)
    return gaps


def acked_indexes(ack_set: int, batch_size: int) -> list[int]:
    """The batch indexes a Pulsar ack set acknowledges (its CLEARED bits below ``batch_size``)."""
    return [index for index in range(batch_size) if not ack_set >> index & 1]


def check_metadata(metadata: object) -> str:
    """``metadata`` when it is a commit metadata string; ``InvalidArgument`` when it is not a str,
    ``MetadataTooLarge`` past ``MAX_COMMIT_METADATA_BYTES`` UTF-8 bytes."""
    if type(metadata) is not str:
        raise InvalidArgument(f"commit metadata must be a str, got {metadata!r}")
    size = len(metadata.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMIT_METADATA_BYTES:
        raise MetadataTooLarge(f"commit metadata of {size} bytes (limit {MAX_COMMIT_METADATA_BYTES})")
    return metadata


def _full(batch_size: int) -> int:
    return (1 << batch_size) - 1


def _check_position(position: object, what: str = "position") -> Position:
    if not isinstance(position, Position):
        raise InvalidArgument(f"{what} must be a Position, got {position!r}")
    return position


def check_batch(batch_index: object, batch_size: object) -> None:
    """Raise ``InvalidArgument`` unless both are None, or ``0 <= batch_index < batch_size``."""
    if batch_index is None and batch_size is None:
        return
    if (type(batch_index) is not int or type(batch_size) is not int
            or batch_size < 1 or not 0 <= batch_index < batch_size):
        raise InvalidArgument(f"batch index {batch_index!r} with batch size {batch_size!r}: give both, "
                              "with 0 <= batch_index < batch_size, or neither")


class BatchAckState(msgspec.Struct, frozen=True, array_like=True):
    """A partially acked batch entry: ``unacked`` is the ack set, little-endian, bit i set =
    index i still unacked (Pulsar's convention)."""

    position: Position
    batch_size: int
    unacked: bytes


class CursorSnapshot(msgspec.Struct, frozen=True):
    """Everything a cursor holds. ``mark_delete_position`` is ``position_before(acked_below)``.
    (Encoded as a map: a snapshot from before a field existed decodes with its default.)"""

    acked_below: Position
    acked_ranges: tuple[tuple[Position, Position], ...] = ()
    partial_batches: tuple[BatchAckState, ...] = ()
    metadata: str = ""  # the commit metadata (``Cursor.set_metadata``)


class CursorStats(msgspec.Struct, frozen=True):
    mark_delete_position: Position
    acked_below: Position
    acked_ranges: int  # individually acked ranges above the mark-delete bound
    partially_acked_batches: int


_SNAPSHOT_ENCODER = msgspec.msgpack.Encoder()
_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(CursorSnapshot)


def encode_snapshot(snapshot: CursorSnapshot) -> bytes:
    return _SNAPSHOT_ENCODER.encode(snapshot)


def decode_snapshot(data: bytes, path: str = "") -> CursorSnapshot:
    """The snapshot in ``data``; ``CorruptLedger`` when it is not one (checked by ``from_snapshot``
    too, so pass it there before use)."""
    try:
        return _SNAPSHOT_DECODER.decode(data)
    except msgspec.DecodeError as error:
        raise CorruptLedger(f"undecodable cursor snapshot at {path or '?'}: {error}", path) from error


class Cursor:
    """Acked positions and batch indexes of one subscription (see the module docstring)."""

    def __init__(self, mark_delete_position: Position = EARLIEST) -> None:
        """A cursor with everything ``<= mark_delete_position`` acked. Earliest: the position
        before the first entry, Pulsar-style ``Position(first_ledger_id, -1)`` (or EARLIEST, and
        ack the gap up to the first entry); latest: the partition's last position."""
        self._acked_below = max(next_position(_check_position(mark_delete_position)), _FLOOR)
        self._ranges: SortedDict = SortedDict()  # start -> end (exclusive)
        self._batches: SortedDict = SortedDict()  # position -> (batch_size, unacked bits)
        self._metadata = ""

    @classmethod
    def starting_at(cls, first_unacked: Position) -> Cursor:
        """A cursor with everything ``< first_unacked`` acked (same as ``seek``)."""
        cursor = cls()
        cursor.seek(first_unacked)
        return cursor

    # --- queries -----------------------------------------------------------------------------

    @property
    def acked_below(self) -> Position:
        """Exclusive mark-delete bound: every position below it is acked. Read and trim from it."""
        return self._acked_below

    @property
    def mark_delete_position(self) -> Position:
        """Pulsar's inclusive mark-delete position, ``position_before(acked_below)``: everything at
        or below it is acked. Entry id -1 when the bound sits at the start of a ledger."""
        return position_before(self._acked_below)

    @property
    def metadata(self) -> str:
        """The commit metadata kept with the mark-delete bound ("" until set)."""
        return self._metadata

    def set_metadata(self, metadata: str) -> bool:
        """Keep ``metadata`` as the commit metadata (checked by ``check_metadata`` first, so a bad
        one changes nothing); returns whether it changed."""
        check_metadata(metadata)
        changed = metadata != self._metadata
        self._metadata = metadata
        return changed

    def is_acked(self, position: Position, batch_index: int | None = None) -> bool:
        """Whether the entry (``batch_index`` None) or that batch index of it is acked."""
        if position < self._acked_below or (self._ranges and self._in_range(position)):
            return True
        if batch_index is None or not self._batches:
            return False
        partial = self._batches.get(position)
        return partial is not None and not partial[1] >> batch_index & 1

    def unacked_in(self, positions: Iterable[Position]) -> list[Position]:
        """The positions, in the order given, not fully acked (partially acked batches included)."""
        return [position for position in positions if not self.is_acked(position)]

    def partial_batch(self, position: Position) -> tuple[int, int] | None:
        """``(batch_size, unacked ack set)`` of a partially acked entry, else None."""
        return self._batches.get(position)

    def unacked_indexes(self, position: Position, batch_size: int) -> list[int]:
        """The batch indexes of an entry of ``batch_size`` messages that still need delivery."""
        if self.is_acked(position):
            return []
        partial = self._batches.get(position)
        bits = _full(batch_size) if partial is None else partial[1]
        return [index for index in range(batch_size) if bits >> index & 1]

    def acked_ranges(self) -> list[tuple[Position, Position]]:
        """The individually acked ranges ``[start, end)`` above the mark-delete bound, ascending."""
        return list(self._ranges.items())

    def partially_acked(self) -> list[tuple[Position, int]]:
        """``(position, how many batch indexes are still unacked)`` of each partially acked entry."""
        return [(position, bits.bit_count()) for position, (_size, bits) in self._batches.items()]

    def stats(self) -> CursorStats:
        return CursorStats(self.mark_delete_position, self._acked_below, len(self._ranges), len(self._batches))

    def _in_range(self, position: Position) -> bool:
        index = self._ranges.bisect_right(position)
        if index == 0:
            return False
        return position < self._ranges[self._ranges.keys()[index - 1]]

    # --- acks --------------------------------------------------------------------------------

    def ack(self, position: Position, batch_index: int | None = None, batch_size: int | None = None) -> bool:
        """Ack one entry, or one batch index of it (``batch_size`` = messages in the entry).
        Idempotent; returns whether anything changed. A batch whose last index is acked becomes
        a fully acked entry."""
        _check_position(position)
        check_batch(batch_index, batch_size)
        if batch_index is None:
            if position == self._acked_below:  # the in-order fast path
                self._acked_below = next_position(position)
                self._compact()
                return True
            return self._add_range(position, next_position(position))
        assert batch_size is not None
        return self.ack_indexes(position, batch_size, batch_index, batch_index)

    def ack_indexes(self, position: Position, batch_size: int, first: int, last: int) -> bool:
        """``ack`` of batch indexes ``first..last`` (inclusive) of one entry, in one bit operation:
        a consumer acking in order acks runs of a batch, and a call per index cost the subscription
        more than the rest of the ack. Idempotent; returns whether anything changed."""
        _check_position(position)
        check_batch(first, batch_size)
        check_batch(last, batch_size)
        if last < first:
            raise InvalidArgument(f"index run {first}..{last} of {position} is empty")
        if self.is_acked(position):
            return False
        batch_size_known, bits = self._batches.get(position, (batch_size, _full(batch_size)))
        if batch_size_known != batch_size:
            raise InvalidArgument(f"{position} holds {batch_size_known} messages, not {batch_size}")
        run = _full(last + 1) ^ _full(first)
        if not bits & run:
            return False
        bits &= ~run
        if bits:
            self._batches[position] = (batch_size, bits)
            return True
        return self._add_range(position, next_position(position))  # also drops the batch state

    def ack_range(self, start: Position, end_exclusive: Position) -> bool:
        """Ack every position in ``[start, end_exclusive)`` (skipped markers, aborted messages,
        ledger tails). Idempotent; returns whether anything changed."""
        _check_position(start, "start")
        _check_position(end_exclusive, "end")
        if end_exclusive < start:
            raise InvalidArgument(f"range end {end_exclusive} is before its start {start}")
        return self._add_range(start, end_exclusive)

    def ack_cumulative(self, position: Position) -> bool:
        """Ack everything ``<= position``. Idempotent; returns whether anything changed."""
        bound = next_position(_check_position(position))
        if bound <= self._acked_below:
            return False
        self._acked_below = bound
        self._compact()
        return True

    def seek(self, position: Position) -> None:
        """Reset: ``position`` is the first unacked one (inclusive - it is delivered again),
        everything before it acked, every individual and batch ack above it forgotten. Works
        backwards (redeliver) and forwards (skip)."""
        self._acked_below = max(_check_position(position), _FLOOR)
        self._ranges.clear()
        self._batches.clear()

    def _add_range(self, start: Position, end: Position) -> bool:
        if end <= start or end <= self._acked_below:
            return False
        if start <= self._acked_below:
            self._acked_below = end
            self._compact()
            return True
        keys = self._ranges.keys()
        index = self._ranges.bisect_right(start)  # ranges before ``index`` start at or before ``start``
        if index > 0:
            previous_start = keys[index - 1]
            previous_end = self._ranges[previous_start]
            if end <= previous_end:
                return False  # already covered
            if start <= previous_end:  # overlaps or touches: grow the previous range
                start = previous_start
        while index < len(keys) and keys[index] <= end:  # swallow ranges that overlap or touch
            end = max(end, self._ranges.pop(keys[index]))
        self._ranges[start] = end
        for position in list(self._batches.irange(start, end, inclusive=(True, False))):
            del self._batches[position]
        return True

    def _compact(self) -> None:
        """Merge every range that starts at or below the bound into it; drop batch states below."""
        while self._ranges:
            start, end = self._ranges.peekitem(0)
            if start > self._acked_below:
                break
            del self._ranges[start]
            if end > self._acked_below:
                self._acked_below = end
        while self._batches and self._batches.peekitem(0)[0] < self._acked_below:
            self._batches.popitem(0)

    # --- persistence -------------------------------------------------------------------------

    def snapshot(self) -> CursorSnapshot:
        return CursorSnapshot(
            self._acked_below,
            tuple(self._ranges.items()),
            tuple(BatchAckState(position, size, bits.to_bytes((size + 7) // 8, "little"))
                  for position, (size, bits) in self._batches.items()),
            self._metadata,
        )

    @classmethod
    def from_snapshot(cls, snapshot: CursorSnapshot) -> Cursor:
        """The cursor a snapshot describes; ``CorruptLedger`` when the snapshot breaks an invariant."""
        cursor = cls()
        cursor._acked_below = snapshot.acked_below
        for start, end in snapshot.acked_ranges:
            cursor._ranges[start] = end
        for batch in snapshot.partial_batches:
            cursor._batches[batch.position] = (batch.batch_size, int.from_bytes(batch.unacked, "little"))
        cursor._metadata = snapshot.metadata
        try:
            cursor.check_invariants()
        except AssertionError as error:
            raise CorruptLedger(f"inconsistent cursor snapshot: {error}") from error
        return cursor

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` when the representation is not canonical (also under -O)."""
        _require(self._acked_below >= _FLOOR, f"bound {self._acked_below} below the floor")
        previous_end = self._acked_below
        for start, end in self._ranges.items():
            # ``>`` not ``>=``: a range touching the bound or its predecessor should have merged.
            _require(start > previous_end, f"range [{start}, {end}) not merged (previous end {previous_end})")
            _require(end > start, f"empty range [{start}, {end})")
            previous_end = end
        for position, (size, bits) in self._batches.items():
            _require(size >= 1 and 0 < bits < _full(size), f"batch state {bits:b}/{size} of {position}")
            _require(position >= self._acked_below and not self._in_range(position), f"{position} acked yet partial")
        try:
            check_metadata(self._metadata)
        except InvalidArgument as error:
            raise AssertionError(f"commit metadata: {error}") from error


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
