"""Dense Kafka offsets of a partition (``protocol.offsets`` inside the transaction buffer):
stamped in ledger order, one per message and one per marker, checked on apply, rebuilt the same
by replay from any snapshot, pruned by trimming; and what happens to entries and snapshots from
before offsets."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ids import EARLIEST, Position, TxnID
from raytxn.protocol.entry_format import EntryHeader, decode_entry_header
from raytxn.protocol.offsets import OffsetIndex, OffsetPoint, OffsetSnapshot
from raytxn.protocol.txn_buffer import TransactionBuffer, TxnBufferSnapshot
from raytxn.protocol.txnlog import EndAction
from tests.unit.test_txn_buffer import Partition, TestLedger, restore, through_storage

COMMIT, ABORT = EndAction.COMMIT, EndAction.ABORT
T1, T2 = TxnID(1, 1), TxnID(1, 2)


class StampingPartition(Partition):
    """Stamps each header when it is handed to the ledger, as the partition actor does."""

    def land(self, header: EntryHeader, records: list[bytes]) -> Position:
        stamped = self.buffer.stamp(header)
        return super().land(stamped, [msgspec.msgpack.encode(stamped), *records[1:]])


def base_offsets(ledger: TestLedger) -> list[int | None]:
    return [header.base_offset for _, header in ledger.headers()]


def state(buffer: TransactionBuffer) -> tuple:
    snap = buffer.snapshot()
    return snap.offsets, buffer.last_stable_offset, snap.aborted, snap.ongoing


def test_messages_take_one_offset_each_and_markers_one() -> None:
    part = StampingPartition()
    part.send("p", 0, count=3)            # offsets 0..2
    part.send("p", 3, txn=T1, count=2)    # 3..4
    part.end(T1, COMMIT)                  # marker: 5
    part.send("p", 5, txn=T2)             # 6
    part.end(T2, ABORT)                   # marker: 7
    part.send("p", 6)                     # 8
    assert base_offsets(part.ledger) == [0, 3, 5, 6, 7, 8]
    assert part.buffer.offsets.next_offset == part.buffer.last_stable_offset == 9
    (aborted,) = part.buffer.snapshot().aborted
    assert (aborted.first_offset, aborted.marker_offset) == (6, 7)


def test_last_stable_offset_is_the_oldest_open_txns_first_offset() -> None:
    part = StampingPartition()
    part.send("p", 0)
    part.send("q", 0, txn=T1, count=2)   # 1..2, open
    part.send("p", 1)                    # 3
    assert part.buffer.last_stable_offset == 1 and part.buffer.offsets.next_offset == 4
    part.end(T1, COMMIT)
    assert part.buffer.last_stable_offset == part.buffer.offsets.next_offset == 5


def test_pipelined_stamps_follow_ledger_order_and_markers_prepared_earlier() -> None:
    """Several entries stamped before any is applied (group commit) get consecutive offsets, and
    apply checks each against the count."""
    part = StampingPartition(pipelined=True)
    part.send("p", 0, count=2)
    part.send("p", 2, txn=T1)
    part.end(T1, ABORT)
    part.send("p", 3)
    assert base_offsets(part.ledger) == [0, 2, 3, 4]
    assert part.buffer.offsets.next_offset == 0  # nothing applied yet
    part.flush()
    assert part.buffer.offsets.next_offset == 5


def test_a_carried_offset_that_disagrees_with_the_count_is_corruption() -> None:
    buffer = TransactionBuffer()
    header = EntryHeader("data", None, "p", 0, 0, 1, 1, base_offset=1)
    with pytest.raises(CorruptLedger, match="carries base offset 1, the count gives 0"):
        buffer.apply(header, Position(0, 0))


def test_unstamp_takes_back_only_the_newest_stamp() -> None:
    buffer = TransactionBuffer()
    first = buffer.stamp(EntryHeader("data", None, "p", 0, 1, 2, 1))
    second = buffer.stamp(EntryHeader("data", None, "p", 2, 2, 1, 1))
    with pytest.raises(InvalidArgument, match="not the newest stamp"):
        buffer.unstamp(first)
    buffer.unstamp(second)  # refused by the ledger: the next entry takes its offset
    assert buffer.stamp(EntryHeader("data", None, "p", 3, 3, 1, 1)).base_offset == 2


def test_replay_from_scratch_and_from_any_snapshot_gives_the_same_offsets() -> None:
    part = StampingPartition(TransactionBuffer(offset_index_interval=3), TestLedger())
    snapshots = []
    for i in range(10):
        part.send("p", 2 * i, txn=TxnID(1, i + 1), count=2)
        if i % 4 == 3:
            part.ledger.roll()
        part.end(TxnID(1, i + 1), ABORT if i % 3 == 0 else COMMIT)
        snapshots.append(through_storage(part.buffer.snapshot()))
    part.send("p", 100, txn=TxnID(2, 1))  # left open
    expected = state(part.buffer)
    assert expected[1] == 30 and part.buffer.offsets.next_offset == 31
    again = restore(None, part.ledger, offset_index_interval=3)
    assert state(again) == expected
    for snapshot in snapshots:
        restored = TransactionBuffer.from_snapshot(snapshot, offset_index_interval=3)
        for position, header in part.ledger.headers(snapshot.last_position):
            restored.apply(header, position)
        assert state(restored) == expected


def test_index_points_and_locate() -> None:
    part = StampingPartition(TransactionBuffer(offset_index_interval=4))
    for i in range(6):
        part.send("p", 3 * i, count=3)   # entries at offsets 0, 3, 6, 9, 12, 15
    part.ledger.roll()
    part.send("p", 18)                   # 18: first entry of ledger 1, always a point
    points = part.buffer.offsets.snapshot().points
    assert points == [OffsetPoint(0, Position(0, 0)), OffsetPoint(6, Position(0, 2)),
                      OffsetPoint(12, Position(0, 4)), OffsetPoint(18, Position(1, 0))]
    offsets = part.buffer.offsets
    assert offsets.locate(7, EARLIEST) == OffsetPoint(6, Position(0, 2))
    assert offsets.locate(18, EARLIEST) == OffsetPoint(18, Position(1, 0))
    assert offsets.locate(19, EARLIEST) is None and offsets.locate(-1, EARLIEST) is None
    with pytest.raises(InvalidArgument):
        offsets.locate("7", EARLIEST)  # type: ignore[arg-type]


def test_trimming_prunes_points_and_moves_the_log_start_offset() -> None:
    part = StampingPartition()
    part.send("p", 0, txn=T1, count=2)
    part.end(T1, ABORT)                  # 0..1, marker 2
    part.ledger.roll()
    part.send("p", 2, count=2)           # 3..4 at (1, 0)
    before = part.buffer.offsets.next_offset
    assert part.buffer.offsets.start_offset(EARLIEST) == 0
    part.buffer.prune_aborted(Position(1, 0))
    assert part.buffer.offsets.start_offset(Position(1, 0)) == 3
    assert part.buffer.offsets.locate(1, Position(1, 0)) is None
    assert part.buffer.offsets.locate(4, Position(1, 0)) == OffsetPoint(3, Position(1, 0))
    # a restart after the trim: the snapshot still has the old point, pruned again on recovery
    restored = TransactionBuffer.from_snapshot(through_storage(part.buffer.snapshot()))
    restored.prune_aborted(Position(1, 0))
    assert restored.offsets.next_offset == before and restored.offsets.start_offset(Position(1, 0)) == 3


def test_entries_from_before_offsets_are_counted_the_same_in_every_replay() -> None:
    """Old entries carry no base offset: apply gives them the count, then stamped ones follow."""
    legacy = Partition()              # the old writer: no stamps
    legacy.send("p", 0, count=2)
    legacy.send("p", 2, txn=T1)
    legacy.end(T1, COMMIT)
    assert base_offsets(legacy.ledger) == [None, None, None]
    part = StampingPartition(restore(None, legacy.ledger), legacy.ledger)
    part.send("p", 3)
    assert base_offsets(part.ledger) == [None, None, None, 4]
    assert state(restore(None, part.ledger)) == state(part.buffer)


def test_a_snapshot_from_before_offsets_starts_the_count_after_it() -> None:
    legacy = Partition()
    legacy.send("p", 0, count=2)
    old = msgspec.structs.asdict(legacy.buffer.snapshot())
    del old["offsets"]  # as an old writer stored it
    snapshot = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=TxnBufferSnapshot)
    assert snapshot.offsets is None
    part = StampingPartition(TransactionBuffer.from_snapshot(snapshot), legacy.ledger)
    part.send("p", 2)
    assert base_offsets(part.ledger) == [None, 0]
    assert part.buffer.offsets.start_offset(EARLIEST) == 0 and part.buffer.offsets.next_offset == 1


def test_an_inconsistent_offset_snapshot_is_refused() -> None:
    bad = OffsetSnapshot(3, [OffsetPoint(2, Position(0, 1)), OffsetPoint(1, Position(0, 2))])
    with pytest.raises(CorruptLedger):
        OffsetIndex.from_snapshot(bad)
    with pytest.raises(CorruptLedger):
        OffsetIndex.from_snapshot(OffsetSnapshot(2, [OffsetPoint(2, Position(0, 0))]))


def _trim_and_pin(part: StampingPartition, buffer: TransactionBuffer, cut: Position) -> None:
    """What the partition does after a trim at ``cut``: prune, then pin the first entry kept."""
    buffer.prune_aborted(cut)
    kept = [(position, header) for position, header in part.ledger.headers() if position >= cut]
    if kept:
        buffer.offsets.pin(kept[0][0], kept[0][1].base_offset)


def test_a_trim_inside_a_ledger_pins_the_first_kept_entry() -> None:
    """Retention trims at any entry (the slowest subscription's mark): the offsets from the first
    entry kept up to the next index point stay reachable, and the log start offset is that
    entry's. Without the pin the log start jumped to the next point (here the high watermark) and
    a Kafka group committed at offset 3 resumed at 7."""
    part = StampingPartition()
    for i in range(7):
        part.send("p", i)                                    # offsets 0..6 at (0, 0..6): one point, (0, 0)
    cut = Position(0, 3)
    part.buffer.prune_aborted(cut)
    assert part.buffer.offsets.start_offset(cut) == 7        # the gap the pin closes
    _trim_and_pin(part, part.buffer, cut)
    offsets = part.buffer.offsets
    assert offsets.start_offset(cut) == 3
    assert [offsets.locate(o, cut) for o in range(3, 7)] == [OffsetPoint(3, cut)] * 4
    assert offsets.locate(2, cut) is None
    assert offsets.pin(cut, 3) is False                      # pinned already: nothing changes
    with pytest.raises(CorruptLedger):
        offsets.pin(cut, 4)                                  # contradicts the point there
    with pytest.raises(InvalidArgument):
        offsets.pin(Position(0, 8), 7)                       # not applied yet
    # the pin is in the next snapshot; one taken before it is pinned again on recovery
    restored = TransactionBuffer.from_snapshot(through_storage(part.buffer.snapshot()))
    assert restored.offsets.start_offset(cut) == 3


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=30), st.integers(0, 40), st.integers(0, 30),
       st.booleans())
def test_every_offset_from_the_first_kept_entry_is_reachable_after_any_trim(
        counts: list[int], roll_at: int, cut_at: int, from_snapshot: bool) -> None:
    """For any entries, ledgers and trim point, after the trim (and after a recovery from a
    snapshot taken before it): the log start offset is the first kept entry's base offset, and
    every offset from there to the high watermark locates to a kept point at or below it."""
    part = StampingPartition(TransactionBuffer(offset_index_interval=4))
    before_trim = None
    for i, count in enumerate(counts):
        if i == roll_at:
            part.ledger.roll()
        part.send("p", sum(counts[:i]), count=count)
    positions = [position for position, _ in part.ledger.headers()]
    cut = positions[min(cut_at, len(positions) - 1)]
    before_trim = through_storage(part.buffer.snapshot())
    buffer = TransactionBuffer.from_snapshot(before_trim) if from_snapshot else part.buffer
    _trim_and_pin(part, buffer, cut)
    first_kept = next(header.base_offset for position, header in part.ledger.headers() if position >= cut)
    offsets = buffer.offsets
    assert offsets.start_offset(cut) == first_kept
    for offset in range(first_kept, offsets.next_offset):
        point = offsets.locate(offset, cut)
        assert point is not None and point.position >= cut and point.offset <= offset


ops = st.lists(st.tuples(st.sampled_from(["plain", "txn", "commit", "abort", "roll", "snapshot"]),
                         st.integers(1, 4)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_offsets_are_dense_and_survive_replay(script: list[tuple[str, int]]) -> None:
    part = StampingPartition(TransactionBuffer(offset_index_interval=3))
    seq, txn_no, open_txn, snapshot = 0, 0, None, None
    for op, n in script:
        if op == "plain" or (op == "txn" and open_txn is not None):
            part.send("p", seq, txn=open_txn if op == "txn" else None, count=n)
            seq += n
        elif op == "txn":
            txn_no += 1
            open_txn = TxnID(1, txn_no)
            part.send("p", seq, txn=open_txn, count=n)
            seq += n
        elif op in ("commit", "abort") and open_txn is not None:
            part.end(open_txn, COMMIT if op == "commit" else ABORT)
            open_txn = None
        elif op == "roll":
            part.ledger.roll()
        elif op == "snapshot":
            snapshot = through_storage(part.buffer.snapshot())
    expected_base, dense = 0, []
    for _, records in part.ledger.entries:
        header = decode_entry_header(records)
        dense.append(header.base_offset == expected_base)
        expected_base += 1 if header.is_marker else header.count
    assert all(dense) and part.buffer.offsets.next_offset == expected_base
    assert state(restore(snapshot, part.ledger, offset_index_interval=3)) == state(part.buffer)


def _data(count: int, publish_time_ms: int = 0) -> EntryHeader:
    return EntryHeader("data", None, "p", 0, count - 1, count, publish_time_ms)


def test_offset_for_time_is_the_first_message_in_offset_order_at_or_after_the_time() -> None:
    """Markers take an offset and have no time; with event times, a later offset may carry an
    earlier time, and the first offset at or after the time counts (Kafka's rule)."""
    from raytxn.protocol.entry_format import MessageRecord, marker_header
    from raytxn.protocol.offsets import message_timestamp, offset_for_time

    marker = marker_header(COMMIT, T1, 40)
    entries = [(_data(2), [10, 30]), (marker, []), (_data(3), [50, 20, 60])]  # offsets 0-1, 2, 3-5
    assert offset_for_time(entries, 0, 5, 100) == ((0, 10), 0)
    assert offset_for_time(entries, 0, 30, 100) == ((1, 30), 0)
    assert offset_for_time(entries, 0, 31, 100) == ((3, 50), 3)  # the marker is no answer
    assert offset_for_time(entries, 0, 55, 100) == ((5, 60), 3)
    assert offset_for_time(entries, 0, 61, 100) == (None, 6)
    assert offset_for_time(entries, 0, 55, 5) == (None, 6)       # offset 5 is at the end offset
    assert offset_for_time(entries, 0, 31, 3) == (None, 6)       # nothing below 3 is that late
    assert offset_for_time(entries, 7, 60, 100) == ((12, 60), 10)  # counted from the base given
    header = _data(1, publish_time_ms=70)
    assert message_timestamp(header, MessageRecord(b"v", event_time_ms=5)) == 5
    assert message_timestamp(header, MessageRecord(b"v")) == 70


@given(st.lists(st.one_of(st.none(), st.lists(st.integers(0, 20), min_size=1, max_size=4)), max_size=8),
       st.integers(0, 40), st.integers(0, 5), st.integers(1, 7), st.integers(0, 21))
def test_lookups_by_time_in_reads_of_any_size_answer_as_one_pass_over_the_messages(
        shape: list[list[int] | None], end_offset: int, base: int, read_size: int, timestamp: int) -> None:
    """offset_of_max_time and offset_for_time over a partition read in batches of ``read_size``
    entries (markers: None) give what one pass over all its messages below ``end_offset`` gives:
    the first largest time, the first at or after ``timestamp``."""
    from raytxn.protocol.entry_format import marker_header
    from raytxn.protocol.offsets import offset_for_time, offset_of_max_time

    entries = [(marker_header(COMMIT, T1, 40), []) if stamps is None else (_data(len(stamps)), stamps)
               for stamps in shape]
    messages, offset = [], base
    for header, stamps in entries:
        messages += [(offset + i, stamp) for i, stamp in enumerate(stamps)]
        offset += 1 if header.is_marker else header.count
    below = [(o, t) for o, t in messages if o < end_offset]
    expected = min(below, key=lambda m: (-m[1], m[0])) if below else None
    best, at = None, base
    for start in range(0, len(entries), read_size):
        best, at = offset_of_max_time(entries[start:start + read_size], at, end_offset, best)
    assert best == expected and at == offset
    found, at = None, base
    for start in range(0, len(entries), read_size):
        found, at = offset_for_time(entries[start:start + read_size], at, timestamp, end_offset)
        if found is not None:
            break
    assert found == next(((o, t) for o, t in below if t >= timestamp), None)
