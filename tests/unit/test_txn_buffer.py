"""The partition transaction buffer: visibility, max read position, dedup, low watermarks, ends,
snapshots and replay - driven like the partition actor drives it, against a fake ledger that
hands out positions as the real one does."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raytxn import errors
from raytxn.errors import CorruptLedger, InvalidArgument, InvalidTxnState, NotAllowed, TransactionAlreadyAborted
from raytxn.ids import EARLIEST, Position, TxnID
from raytxn.ledger.snapshots import join_segments, split_snapshot
from raytxn.protocol.entry_format import (
    EntryHeader,
    MessageRecord,
    decode_entry,
    decode_entry_header,
    decode_header,
    encode_entry,
    encode_header,
    marker_header,
)
from raytxn.protocol.txn_buffer import AppendStatus, EndDecision, TransactionBuffer, TxnBufferSnapshot
from raytxn.protocol.txnlog import EndAction

COMMIT, ABORT = EndAction.COMMIT, EndAction.ABORT
T1, T2, T3 = TxnID(1, 1), TxnID(1, 2), TxnID(1, 3)


class TestLedger:
    """Positions like ``ManagedLedger``: contiguous entry ids per ledger, a roll-over (or a new
    incarnation) continues at entry 0 of a higher ledger id."""

    __test__ = False

    def __init__(self, ledger_id: int = 0) -> None:
        self.ledger_id = ledger_id
        self.next_entry_id = 0
        self.entries: list[tuple[Position, list[bytes]]] = []

    def roll(self, skip: int = 1) -> None:
        self.ledger_id += skip
        self.next_entry_id = 0

    def append(self, records: list[bytes]) -> Position:
        position = Position(self.ledger_id, self.next_entry_id)
        self.next_entry_id += 1
        self.entries.append((position, records))
        return position

    def headers(self, after: Position = EARLIEST) -> list[tuple[Position, EntryHeader]]:
        return [(p, decode_entry_header(r, str(p))) for p, r in self.entries if p > after]


class Partition:
    """What the partition actor does: prepare, write, apply. ``pipelined``: entries written but
    applied only on ``flush`` (appends in flight, as with group commit)."""

    def __init__(self, buffer: TransactionBuffer | None = None, ledger: TestLedger | None = None,
                 pipelined: bool = False) -> None:
        self.buffer = buffer or TransactionBuffer()
        self.ledger = ledger or TestLedger()
        self.now_ms = 1_000
        self.in_flight: list[tuple[EntryHeader, Position]] | None = [] if pipelined else None

    def land(self, header: EntryHeader, records: list[bytes]) -> Position:
        position = self.ledger.append(records)
        if self.in_flight is None:
            self.buffer.apply(header, position)
        else:
            self.in_flight.append((header, position))
        return position

    def flush(self) -> None:
        for header, position in self.in_flight or ():
            self.buffer.apply(header, position)
        if self.in_flight:
            self.in_flight.clear()

    def header(self, producer: str, first: int, txn: TxnID | None = None, count: int = 1) -> EntryHeader:
        return EntryHeader("data", txn, producer, first, first + count - 1, count, self.now_ms)

    def send(self, producer: str, first: int, txn: TxnID | None = None, count: int = 1) -> Position | None:
        """Returns the entry's position (the original one for a duplicate, if known)."""
        header = self.header(producer, first, txn, count)
        decision = self.buffer.prepare_append(header)
        if decision.duplicate:
            return decision.position
        messages = [MessageRecord(f"{producer}:{first + i}".encode()) for i in range(count)]
        return self.land(header, encode_entry(header, messages))

    def write_markers(self, decision: EndDecision) -> list[Position]:
        positions = []
        for header in decision.markers(self.now_ms):
            positions.append(self.land(header, encode_entry(header)))
        return positions

    def end(self, txn: TxnID, action: EndAction, low_watermark: int = -1) -> EndDecision:
        decision = self.buffer.prepare_end(txn, action, low_watermark)
        self.write_markers(decision)
        return decision

    def read(self) -> list[str]:
        """Values of every message a reader may see, in order."""
        values = []
        for position, records in self.ledger.entries:
            header, messages = decode_entry(records, str(position))
            if self.buffer.is_visible(header, position):
                values += [m.value.decode() for m in messages]
        return values


def restore(snapshot: TxnBufferSnapshot | None, ledger: TestLedger, **kwargs: int) -> TransactionBuffer:
    """The recovery procedure: newest snapshot (or empty), then every entry after it."""
    buffer = TransactionBuffer.from_snapshot(snapshot, **kwargs) if snapshot else TransactionBuffer(**kwargs)
    for position, header in ledger.headers(snapshot.last_position if snapshot else EARLIEST):
        buffer.apply(header, position)
    return buffer


def through_storage(snapshot: TxnBufferSnapshot, snapshot_id: int = 1) -> TxnBufferSnapshot:
    """Encode, segment, join and decode a snapshot as the actor would."""
    segments = split_snapshot(msgspec.msgpack.encode(snapshot), snapshot_id, 64, version=1)
    return msgspec.msgpack.decode(join_segments([b for _, b in segments], snapshot_id), type=TxnBufferSnapshot)


# --- entry format ----------------------------------------------------------------------------


def test_entry_format_round_trip_and_damage() -> None:
    header = EntryHeader("data", T1, "p", 3, 4, 2, 99)
    messages = [MessageRecord(b"a", "k", {"x": "y"}, 5), MessageRecord(b"b")]
    records = encode_entry(header, messages)
    assert decode_entry(records, "e") == (header, messages)
    marker = marker_header(COMMIT, T1, 7, low_watermark=0)
    assert decode_entry([encode_header(marker)]) == (marker, [])
    bad = [
        [],  # no header
        records[:1],  # header says 2 messages
        [records[1], records[0]],  # a message where the header belongs
        [records[0], b"\xc1", records[2]],  # undecodable message
        [encode_header(EntryHeader("data", None, "p", 5, 4, 1, 0))],  # sequences backwards
        [encode_header(EntryHeader("commit", None, "", -1, -1, 0, 0))],  # marker of no txn
    ]
    for entry in bad:
        with pytest.raises(CorruptLedger):
            decode_entry(entry, "e")


def test_marker_headers_keep_their_on_disk_tags() -> None:
    """Markers are written from an EndAction, but their header bytes are what ledgers already
    hold (lowercase tags), so those ledgers still replay."""
    commit = marker_header(COMMIT, TxnID(0, 1), 7, low_watermark=0)
    abort = marker_header(ABORT, TxnID(2, 5), 9, low_watermark=4)
    # As ledgers hold them (9 fields, before Kafka offsets): they decode to the same headers ...
    old_commit = b"\x99\xa2h1\xa6commit\x92\x00\x01\xa0\xff\xff\x00\x07\x00"
    old_abort = b"\x99\xa2h1\xa5abort\x92\x02\x05\xa0\xff\xff\x00\t\x04"
    assert (decode_header(old_commit), decode_header(old_abort)) == (commit, abort)
    # ... and are written the same with a tenth field, the base offset (nil until stamped), and an
    # eleventh, the producer epoch (0: markers have no producer).
    assert encode_header(commit) == b"\x9b" + old_commit[1:] + b"\xc0\x00"
    assert encode_header(abort) == b"\x9b" + old_abort[1:] + b"\xc0\x00"
    assert (commit.end_action, abort.end_action) == (COMMIT, ABORT)
    assert EntryHeader("data", T1, "p", 3, 4, 2, 99).end_action is None


# --- visibility ------------------------------------------------------------------------------


def test_open_txn_invisible_until_commit() -> None:
    part = Partition()
    part.send("p", 0, T1)
    part.send("p", 1, T1)
    assert part.read() == []
    assert part.buffer.max_read_position == EARLIEST
    part.end(T1, COMMIT)
    assert part.read() == ["p:0", "p:1"]
    assert part.buffer.max_read_position == part.buffer.last_position == Position(0, 2)


def test_abort_hides_forever() -> None:
    part = Partition()
    part.send("p", 0, T1, count=2)
    part.send("q", 0)
    decision = part.end(T1, ABORT)
    assert decision.write_marker and part.buffer.aborted_marker(T1) == Position(0, 2)
    part.send("q", 1)
    part.ledger.roll()
    part.send("q", 2)
    assert part.read() == ["q:0", "q:1", "q:2"]
    # Readers are not held back by aborted data or markers: everything up to the last entry.
    assert part.buffer.max_read_position == part.buffer.last_position == Position(1, 0)
    assert restore(None, part.ledger).snapshot() == part.buffer.snapshot()


def test_open_txn_holds_back_later_plain_messages() -> None:
    part = Partition()
    part.send("q", 0)
    first = part.send("p", 0, T1)
    for seq in range(1, 4):
        part.send("q", seq)
    assert part.buffer.max_read_position == Position(0, 0)  # just before T1's first message
    assert part.read() == ["q:0"]
    assert part.buffer.stats(now_ms=1_500).lag_entries == 4
    part.end(T1, COMMIT)
    assert first == Position(0, 1)
    assert part.read() == ["q:0", "p:0", "q:1", "q:2", "q:3"]
    assert part.buffer.stats(now_ms=1_500).lag_entries == 0


@pytest.mark.parametrize("txn2_action", [COMMIT, ABORT])
def test_seed_example_commit_one_of_two_interleaved(txn2_action: EndAction) -> None:
    part = Partition()
    m1 = part.send("a", 0, T1)
    m2 = part.send("b", 0, T2)
    part.send("a", 1, T1)
    part.end(T1, COMMIT)
    # Only m1: m3 is committed but behind the still-open txn2's first message.
    assert part.buffer.max_read_position == m1 == Position(m2.ledger_id, m2.entry_id - 1)
    assert part.read() == ["a:0"]
    part.end(T2, txn2_action)
    expected = ["a:0", "b:0", "a:1"] if txn2_action is COMMIT else ["a:0", "a:1"]
    assert part.read() == expected
    assert part.buffer.ongoing_txns() == []


def test_markers_never_visible() -> None:
    part = Partition()
    part.send("p", 0, T1)
    part.end(T1, COMMIT)
    position, records = part.ledger.entries[-1]
    assert not part.buffer.is_visible(decode_entry_header(records), position)


# --- ends and low watermarks -----------------------------------------------------------------


def test_end_is_idempotent() -> None:
    part = Partition()
    part.send("p", 0, T1)
    assert part.end(T1, COMMIT).write_marker
    assert not part.end(T1, COMMIT).write_marker  # retried end: acknowledged, nothing written
    part.send("p", 1, T2)
    assert part.end(T2, ABORT).write_marker
    assert not part.end(T2, ABORT).write_marker
    with pytest.raises(TransactionAlreadyAborted):
        part.buffer.prepare_end(T2, COMMIT, -1)
    assert len(part.ledger.entries) == 4


def test_commit_of_unseen_txn_writes_nothing_abort_of_unseen_txn_fences() -> None:
    part = Partition()
    assert not part.end(T1, COMMIT).write_marker
    decision = part.end(T2, ABORT, low_watermark=0)
    assert decision.write_marker  # the coordinator's watermark (0) cannot cover T2 yet
    with pytest.raises(NotAllowed):
        part.send("p", 0, T2)  # a send still on its way when the abort came
    assert part.read() == [] and part.buffer.max_read_position == Position(0, 0)
    # At or below the watermark no fence is needed.
    assert not part.end(TxnID(1, 0), ABORT, low_watermark=0).write_marker


def test_dangling_txn_aborted_by_next_end_and_late_append_rejected() -> None:
    part = Partition()
    part.send("p", 0, T1)  # its end message will be lost
    part.send("p", 1, T3)
    part.send("x", 0, TxnID(2, 1))  # another coordinator's txn is not touched
    part.send("q", 0)
    decision = part.end(T3, COMMIT, low_watermark=2)  # T1 and T2 ended at coordinator 1
    assert decision.dangling == (T1,) and decision.write_marker
    assert part.buffer.aborted_marker(T1) is not None
    assert part.buffer.ongoing_txns() == [TxnID(2, 1)]
    assert part.read() == ["p:1"]  # T1 aborted, T3 committed; txn (2,1) holds back the rest
    for late in (T1, T2, TxnID(1, 0)):
        with pytest.raises(NotAllowed):
            part.send("r", 0, late)
    part.send("r", 0, TxnID(1, 5))  # above the watermark: fine
    # The watermark came with markers, so a restart relearns it.
    restored = restore(None, part.ledger)
    assert restored.low_watermark(1) == 2 and restored.snapshot() == part.buffer.snapshot()


def test_periodic_dangling_check() -> None:
    part = Partition()
    part.send("p", 0, T1)
    part.send("q", 0)
    decision = part.buffer.prepare_dangling(1, 0)
    assert decision.dangling == () and decision.markers(0) == []
    part.write_markers(part.buffer.prepare_dangling(1, 1))
    assert part.buffer.ongoing_txns() == [] and part.read() == ["q:0"]


def test_crash_between_dangling_markers() -> None:
    """Only the first of two dangling aborts landed: the watermark it carries covers the second
    txn, and the sweep after recovery aborts it without asking the coordinator."""
    part = Partition()
    part.send("p", 0, T1)
    part.send("p", 1, T2)
    decision = part.buffer.prepare_end(T3, COMMIT, low_watermark=2)
    assert decision.dangling == (T1, T2)
    first_marker = decision.markers(0)[0]
    part.buffer.apply(first_marker, part.ledger.append(encode_entry(first_marker)))  # then a crash
    restored = Partition(restore(None, part.ledger), part.ledger)
    assert restored.buffer.ongoing_txns() == [T2] and restored.buffer.ongoing_coordinators() == [1]
    sweep = restored.buffer.prepare_dangling(1, restored.buffer.low_watermark(1))
    assert sweep.dangling == (T2,)
    restored.write_markers(sweep)
    assert restored.buffer.ongoing_txns() == [] and restored.read() == []


def test_end_racing_the_first_append() -> None:
    """The actor issues the append right after prepare; an end prepared before it is applied
    still sees the txn and writes its marker after the data."""
    buffer = TransactionBuffer()
    header = EntryHeader("data", T1, "p", 0, 0, 1, 0)
    assert buffer.prepare_append(header).status is AppendStatus.OK
    decision = buffer.prepare_end(T1, COMMIT, -1)
    assert decision.write_marker
    buffer.apply(header, Position(0, 0))
    (marker,) = decision.markers(0)
    buffer.apply(marker, Position(0, 1))
    assert buffer.is_visible(header, Position(0, 0)) and buffer.ongoing_txns() == []


def test_dangling_txn_whose_first_append_is_in_flight() -> None:
    buffer = TransactionBuffer()
    header = EntryHeader("data", T1, "p", 0, 0, 1, 0)
    assert buffer.prepare_append(header).status is AppendStatus.OK
    decision = buffer.prepare_end(T3, ABORT, low_watermark=2)
    assert decision.dangling == (T1,)
    buffer.apply(header, Position(0, 0))
    for i, marker in enumerate(decision.markers(0)):
        buffer.apply(marker, Position(0, 1 + i))
    assert buffer.ongoing_txns() == [] and buffer.aborted_marker(T1) == Position(0, 1)
    assert buffer.max_read_position == Position(0, 2) and not buffer.is_visible(header, Position(0, 0))


def test_append_racing_an_end() -> None:
    buffer = TransactionBuffer()
    buffer.apply(EntryHeader("data", T1, "p", 0, 0, 1, 0), Position(0, 0))
    decision = buffer.prepare_end(T1, COMMIT, -1)
    with pytest.raises(NotAllowed):
        buffer.prepare_append(EntryHeader("data", T1, "p", 1, 1, 1, 0))
    with pytest.raises(InvalidTxnState):
        buffer.prepare_end(T1, ABORT, -1)
    before = buffer.snapshot()
    for bad_action in ("ROLLBACK", "commit", None):
        with pytest.raises(InvalidArgument):
            buffer.prepare_end(T1, bad_action, -1)  # type: ignore[arg-type]
    assert buffer.snapshot() == before
    assert buffer.prepare_end(T1, COMMIT, -1).write_marker  # a retry before the first is durable
    for i, marker in enumerate(decision.markers(0) * 2):
        buffer.apply(marker, Position(0, 1 + i))
    assert buffer.max_read_position == Position(0, 2)
    assert buffer.prepare_append(EntryHeader("data", None, "p", 1, 1, 1, 0)).status is AppendStatus.OK


# --- dedup -----------------------------------------------------------------------------------


def test_duplicates_detected_with_original_position() -> None:
    part = Partition()
    first = part.send("p", 0, count=3)
    second = part.send("p", 3, T1, count=2)
    assert part.send("p", 3, T1, count=2) == second  # latest entry: its position
    assert part.send("p", 0, count=3) is None  # older: a duplicate, position unknown
    assert part.send("p", 2) is None
    with pytest.raises(InvalidArgument):
        part.send("p", 4, count=3)  # overlaps what was written
    part.end(T1, ABORT)
    assert part.send("p", 3, T1, count=2) == second  # retried after its txn ended: still a duplicate
    assert len(part.ledger.entries) == 3 and first == Position(0, 0)
    assert part.buffer.dedup_position("p") == (4, second)


def test_duplicate_of_an_append_in_flight() -> None:
    buffer = TransactionBuffer()
    header = EntryHeader("data", None, "p", 0, 0, 1, 0)
    assert buffer.prepare_append(header).status is AppendStatus.OK
    decision = buffer.prepare_append(header)
    assert decision.duplicate and decision.in_flight and decision.position is None
    buffer.cancel_append(header)  # never reached the ledger
    assert buffer.prepare_append(header).status is AppendStatus.OK


def epoch_header(producer: str, first: int, epoch: int, count: int = 1) -> EntryHeader:
    return EntryHeader("data", None, producer, first, first + count - 1, count, 0, producer_epoch=epoch)


def entry(header: EntryHeader) -> list[bytes]:
    return encode_entry(header, [MessageRecord(b"%d" % (header.first_sequence + i)) for i in range(header.count)])


def test_a_dead_incarnations_append_still_on_its_way_is_fenced_by_its_successor() -> None:
    """The collision producer epochs close: incarnation 1 of "p" has sequences 0..4 stored and an
    append of 5..9 in flight when its client dies. Its successor starts at 0 in epoch 2, so the
    late append can neither land after it began nor turn its batch into a false duplicate."""
    part = Partition(pipelined=True)
    first = part.buffer.init_producer("p")
    part.land(epoch_header("p", 0, first, 5), entry(epoch_header("p", 0, first, 5)))
    part.flush()
    late = epoch_header("p", 5, first, 5)
    assert part.buffer.prepare_append(late, previous_sequence=4).status is AppendStatus.OK
    second = part.buffer.init_producer("p")  # the successor, while 5..9 are being stored
    assert second == first + 1 == part.buffer.producer_epoch("p")
    successor = epoch_header("p", 0, second, 3)
    assert part.buffer.prepare_append(successor).status is AppendStatus.OK  # not a duplicate of 0..4
    part.land(late, entry(late))
    part.land(successor, entry(successor))
    part.flush()
    assert part.buffer.dedup_position("p") == (2, Position(0, 2))
    assert part.buffer.highest_sequence("p") == 2
    # An append of the dead incarnation that comes now (say, one waiting for its predecessor, or
    # a retry) is refused, also when its sequences are the successor's next ones.
    for stale in (epoch_header("p", 10, first, 2), epoch_header("p", 3, first), epoch_header("p", 0, first)):
        with pytest.raises(errors.Fenced, match="epoch 1 is fenced by its epoch 2"):
            part.buffer.prepare_append(stale)
    assert part.buffer.init_producer("p") == 3  # a third incarnation: nothing of it stored yet
    with pytest.raises(errors.Fenced, match="epoch 2 is fenced by its epoch 3"):  # a handed-out epoch fences at once
        part.buffer.prepare_append(epoch_header("p", 3, second), previous_sequence=2)
    assert restore(None, part.ledger).snapshot() == part.buffer.snapshot()


def test_a_restarted_partition_never_hands_out_an_epoch_its_dead_incarnation_handed_out() -> None:
    """Seed 2002810 of zombie-appends: incarnation 1 of the partition hands epoch 2 to client B of
    "p" (volatile) and dies. B dies too, its first append still on its way; its successor C asks
    incarnation 2, which knew only epoch 1 and handed out 2 again. B's append of 0..1 then landed
    in C's epoch, and C's 0..2 was refused as an overlap; a C batch of 0..1 would have been
    acknowledged as a duplicate and never stored. With the incarnation floor, C's epoch is above
    anything incarnation 1 handed out, and it fences B's late append at once."""
    part = Partition()
    a = part.buffer.init_producer("p", incarnation=1)
    part.land(epoch_header("p", 0, a, 3), entry(epoch_header("p", 0, a, 3)))
    b = part.buffer.init_producer("p", incarnation=1)  # volatile: incarnation 1 dies now
    successor = restore(through_storage(part.buffer.snapshot()), part.ledger)
    assert successor.producer_epoch("p") == a
    c = successor.init_producer("p", incarnation=2)
    assert c > b > a
    with pytest.raises(errors.Fenced):  # B's late first append
        successor.prepare_append(epoch_header("p", 0, b, 2))
    assert successor.prepare_append(epoch_header("p", 0, c, 2)).status is AppendStatus.OK  # new data
    with pytest.raises(InvalidArgument, match="floor"):
        successor.init_producer("p", incarnation=-1)


def test_epochs_keep_the_sequence_rule_within_each_and_survive_replay() -> None:
    part = Partition()
    epoch = part.buffer.init_producer("q")
    assert epoch == 1 and part.buffer.init_producer("r") == 2  # rising across names: never handed out twice
    position = part.land(epoch_header("q", 0, epoch, 2), entry(epoch_header("q", 0, epoch, 2)))
    duplicate = part.buffer.prepare_append(epoch_header("q", 0, epoch, 2))
    assert duplicate.duplicate and duplicate.position == position
    with pytest.raises(InvalidArgument, match="overlap"):
        part.buffer.prepare_append(epoch_header("q", 1, epoch, 2))
    with pytest.raises(errors.OutOfOrderSequence):
        part.buffer.prepare_append(epoch_header("q", 5, epoch), previous_sequence=3)
    # A newer epoch starts from nothing: its 0..1 is new data, and it cannot follow what its own
    # epoch never stored.
    newer = epoch + 1
    with pytest.raises(errors.OutOfOrderSequence):
        part.buffer.prepare_append(epoch_header("q", 2, newer), previous_sequence=1)
    assert part.buffer.prepare_append(epoch_header("q", 0, newer, 2)).status is AppendStatus.OK
    with pytest.raises(InvalidArgument, match="epoch"):
        part.buffer.prepare_append(epoch_header("q", 0, -1))
    # Replayed (or from a snapshot), the stored epoch still fences; a handed-out one is volatile.
    restored = restore(through_storage(part.buffer.snapshot()), part.ledger)
    assert restored.producer_epoch("q") == epoch
    assert restored.init_producer("q") == epoch + 1


def test_producers_that_never_ask_for_an_epoch_keep_epoch_zero_and_old_entries_decode_as_it() -> None:
    part = Partition()
    part.send("old", 0, count=2)
    assert part.buffer.producer_epoch("old") == 0 and part.buffer.highest_sequence("old") == 1
    # An entry header and a dedup entry written before epochs (one field shorter) decode as epoch 0.
    legacy_header = msgspec.msgpack.encode(["h1", "data", None, "p", 0, 0, 1, 5, None, 7])
    assert decode_header(legacy_header, "legacy").producer_epoch == 0
    snapshot = msgspec.to_builtins(part.buffer.snapshot())
    snapshot["dedup"] = [entry[:3] for entry in snapshot["dedup"]]
    legacy = msgspec.convert(snapshot, TxnBufferSnapshot)
    assert legacy.dedup[0].epoch == 0
    assert TransactionBuffer.from_snapshot(legacy).prepare_append(part.header("old", 1)).duplicate


def test_dedup_table_is_lru_bounded() -> None:
    part = Partition(TransactionBuffer(max_producers=3))
    for name in "abc":
        part.send(name, 0)
    part.send("a", 1)  # a is now the most recently used
    part.send("d", 0)  # evicts b
    assert part.buffer.dedup_position("b") is None
    assert part.buffer.stats(0).dedup_producers == 3
    assert part.send("a", 1) == Position(0, 3)
    assert part.send("c", 0) == Position(0, 2)
    # Duplicates do not count as use (prepare changes no durable state): least recently used first.
    assert [e.producer for e in part.buffer.snapshot().dedup] == ["c", "a", "d"]
    assert restore(None, part.ledger, max_producers=3).snapshot() == part.buffer.snapshot()


def test_memory_does_not_grow_with_committed_traffic() -> None:
    part = Partition()
    for seq in range(500):
        txn = TxnID(1, seq)
        part.send("p", 2 * seq, txn)
        part.send("q", seq)
        part.end(txn, COMMIT, low_watermark=seq - 1)
    snapshot = part.buffer.snapshot()
    assert snapshot.ongoing == [] and snapshot.aborted == [] and len(snapshot.dedup) == 2
    assert len(msgspec.msgpack.encode(snapshot)) < 200
    assert len(part.read()) == 1000


# --- positions, roll-over, recovery ----------------------------------------------------------


def test_max_read_position_across_roll_over() -> None:
    part = Partition()
    part.send("q", 0)
    part.send("q", 1)
    part.ledger.roll()
    assert part.send("p", 0, T1) == Position(1, 0)
    part.send("q", 2)
    assert part.buffer.max_read_position == Position(0, 1)  # last entry of the previous ledger
    part.ledger.roll(skip=2)  # empty ledgers are not listed: ids may jump
    part.end(T1, COMMIT)
    assert part.buffer.max_read_position == Position(3, 0)
    assert part.read() == ["q:0", "q:1", "p:0", "q:2"]


def test_max_read_position_right_after_restoring_a_snapshot() -> None:
    part = Partition()
    part.send("q", 0)
    part.ledger.roll()
    part.send("p", 0, T1)
    part.send("q", 1)
    snapshot = through_storage(part.buffer.snapshot())
    part.send("q", 2)
    part.end(T2, ABORT)  # a fence marker after the snapshot
    restored = restore(snapshot, part.ledger)
    assert restored.max_read_position == Position(0, 0)
    assert restored.snapshot() == part.buffer.snapshot()
    # A new incarnation writes to a new ledger; the commit frees everything.
    part = Partition(restored, part.ledger)
    part.ledger.roll()
    part.end(T1, COMMIT)
    assert part.buffer.max_read_position == Position(2, 0)
    assert part.read() == ["q:0", "p:0", "q:1", "q:2"]
    # And with nothing ongoing, a restored buffer reads up to the last entry, markers included.
    assert TransactionBuffer.from_snapshot(through_storage(part.buffer.snapshot())).max_read_position == Position(2, 0)


def test_entries_must_be_applied_in_order_without_gaps() -> None:
    buffer = TransactionBuffer()
    buffer.apply(EntryHeader("data", None, "p", 0, 0, 1, 0), Position(4, 7))
    for bad in (Position(4, 7), Position(4, 9), Position(5, 1), Position(3, 0)):
        with pytest.raises(InvalidArgument):
            buffer.apply(EntryHeader("data", None, "p", 1, 1, 1, 0), bad)
    buffer.apply(EntryHeader("data", None, "p", 1, 1, 1, 0), Position(6, 0))


def test_inconsistent_snapshot_is_corrupt() -> None:
    part = Partition()
    part.send("p", 0, T1)
    part.send("q", 0)
    snapshot = part.buffer.snapshot()
    with pytest.raises(CorruptLedger):
        TransactionBuffer.from_snapshot(msgspec.structs.replace(snapshot, max_read_position=Position(0, 1)))


def test_prune_aborted_when_ledger_trimmed() -> None:
    part = Partition()
    part.send("p", 0, T1)
    part.end(T1, ABORT)  # marker (0, 1)
    part.ledger.roll()
    part.send("p", 1, T2)
    part.end(T2, ABORT)  # marker (1, 1)
    assert part.buffer.prune_aborted(Position(1, 0)) == 1
    assert part.buffer.aborted_marker(T1) is None and part.buffer.aborted_marker(T2) == Position(1, 1)


def test_stats() -> None:
    part = Partition()
    part.send("q", 0)
    part.now_ms = 5_000
    part.send("p", 0, T1)
    part.now_ms = 6_000
    part.send("p", 1, T2)
    part.send("q", 1)
    stats = part.buffer.stats(now_ms=9_000)
    assert (stats.ongoing_txns, stats.oldest_ongoing, stats.oldest_ongoing_age_ms) == (2, T1, 4_000)
    assert (stats.max_read_position, stats.last_position, stats.lag_entries) == (
        Position(0, 0), Position(0, 3), 3)
    assert restore(None, part.ledger).stats(now_ms=9_000) == stats  # ages survive a restart


# --- property: random interleavings against a naive model -----------------------------------

PRODUCERS = ["a", "b", "c"]
TXNS = [TxnID(1, s) for s in range(3)] + [TxnID(2, s) for s in range(2)]

TXN_APPEND = st.tuples(st.just("txn"), st.sampled_from(PRODUCERS), st.integers(1, 3), st.sampled_from(TXNS))
OPS = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from(PRODUCERS), st.integers(1, 3)),
    TXN_APPEND,
    TXN_APPEND,
    st.tuples(st.just("retry"), st.sampled_from(PRODUCERS), st.integers(0, 3)),
    # "lost": the coordinator ended it, but the end never reaches this partition (it was never
    # registered there): a dangling txn, to be aborted through the low watermark.
    st.tuples(st.just("end"), st.sampled_from(TXNS), st.sampled_from([COMMIT, ABORT]),
              st.sampled_from(["once", "repeat", "lost"])),
    st.tuples(st.just("sweep"), st.sampled_from([1, 2])),
    st.tuples(st.just("roll"), st.integers(1, 2)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("flush")),
)


def naive_model(entries: list[tuple[Position, EntryHeader]]) -> tuple[Position, list[bool]]:
    """Expected max read position and visibility of each entry, straight from the entry list: a
    txn message is open while no marker of its txn follows it; readers stop before the first open
    one; a txn message is visible iff the first marker of its txn after it is a COMMIT."""
    def next_marker(i: int) -> str | None:
        txn = entries[i][1].txn
        return next((h.kind for _, h in entries[i + 1:] if h.is_marker and h.txn == txn), None)

    open_indexes = [i for i, (_, h) in enumerate(entries) if h.kind == "data" and h.txn and next_marker(i) is None]
    if open_indexes:
        max_read = entries[open_indexes[0] - 1][0] if open_indexes[0] > 0 else EARLIEST
    else:
        max_read = entries[-1][0] if entries else EARLIEST
    visible = [h.kind == "data" and p <= max_read and (h.txn is None or next_marker(i) == "commit")
               for i, (p, h) in enumerate(entries)]
    return max_read, visible


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=20, max_size=60), st.booleans())
def test_random_interleavings_match_naive_model_and_replay(ops: list[tuple], pipelined: bool) -> None:
    """``pipelined``: entries are applied only on ``flush`` ops, so prepares race entries in flight
    (and a restart loses the in-flight entries' application, not the entries)."""
    part = Partition(pipelined=pipelined)
    next_sequence = dict.fromkeys(PRODUCERS, 0)
    written: dict[str, list[tuple[int, int, TxnID | None, Position]]] = {p: [] for p in PRODUCERS}
    coordinator_ended: set[TxnID] = set()
    snapshots: list[TxnBufferSnapshot] = []

    def low_watermark(tc_id: int) -> int:
        live = [t.sequence for t in TXNS if t.tc_id == tc_id and t not in coordinator_ended]
        return (min(live) if live else max(t.sequence for t in TXNS if t.tc_id == tc_id)) - 1

    # Txns this partition was told are over (their end, or a low watermark covering them): once
    # nothing is in flight none of them may be open, unless a late append reopened it since.
    told_over: set[TxnID] = set()

    def told(tc_id: int, low_watermark: int, *txns: TxnID) -> None:
        told_over.update(t for t in TXNS if t.tc_id == tc_id and t.sequence <= low_watermark)
        told_over.update(txns)

    for op in ops:
        kind = op[0]
        if kind in ("plain", "txn"):
            producer, count = op[1], op[2]
            txn = op[3] if kind == "txn" else None
            first = next_sequence[producer]
            next_sequence[producer] += count
            known_watermark = part.buffer.low_watermark(txn.tc_id) if txn else -1
            try:
                position = part.send(producer, first, txn, count)
            except NotAllowed:
                assert txn in coordinator_ended  # only a txn the coordinator ended may be refused
                continue
            if txn is not None:  # accepted: not ended, or a late append the buffer could not know about
                assert txn not in coordinator_ended or (txn.sequence > known_watermark
                                                        and part.buffer.aborted_marker(txn) is None)
                told_over.discard(txn)
            assert position == part.ledger.entries[-1][0]
            written[producer].append((first, count, txn, position))
        elif kind == "retry":
            history = written[op[1]]
            if history:
                first, count, txn, position = history[-1 - min(op[2], len(history) - 1)]
                in_flight = {p for _, p in part.in_flight or ()}
                applied = [h[3] for h in history if h[3] not in in_flight]
                expected = position if applied and position == applied[-1] else None  # latest applied: known
                entries_before = len(part.ledger.entries)
                assert part.send(op[1], first, txn, count) == expected
                assert len(part.ledger.entries) == entries_before
        elif kind == "end":
            txn, action, mode = op[1:]
            if txn in coordinator_ended:
                continue  # the coordinator ends each txn once (its retries are covered by "repeat")
            if mode == "lost":
                coordinator_ended.add(txn)
                continue
            sent = low_watermark(txn.tc_id)
            decision = part.end(txn, action, sent)
            assert all(t.tc_id == txn.tc_id and t.sequence <= sent and t != txn for t in decision.dangling)
            if mode == "repeat":  # a retried end: nothing new, unless its marker is still in flight (then again)
                again = part.end(txn, action, sent)
                assert again.dangling == () and again.write_marker == (pipelined and decision.write_marker)
            coordinator_ended.add(txn)
            told(txn.tc_id, sent, txn)
        elif kind == "sweep":
            sent = low_watermark(op[1])
            part.write_markers(part.buffer.prepare_dangling(op[1], sent))
            told(op[1], sent)
        elif kind == "flush":
            part.flush()
        elif kind == "roll":
            part.ledger.roll(op[1])
        elif kind == "snapshot":
            snapshots.append(through_storage(part.buffer.snapshot(), len(snapshots)))
            assert TransactionBuffer.from_snapshot(snapshots[-1]).snapshot() == part.buffer.snapshot()
        elif kind == "restart":  # a new incarnation: newest snapshot + replay, then a new ledger
            part = Partition(restore(snapshots[-1] if snapshots else None, part.ledger), part.ledger, pipelined)
            part.ledger.roll()

        applied = [(p, h) for p, h in part.ledger.headers() if p <= part.buffer.last_position]
        assert len(applied) == len(part.ledger.entries) - len(part.in_flight or ())
        max_read, visible = naive_model(applied)
        if not part.in_flight:
            assert not told_over.intersection(part.buffer.ongoing_txns())
        assert part.buffer.max_read_position == max_read
        assert [part.buffer.is_visible(h, p) for p, h in applied] == visible

    part.flush()
    entries = part.ledger.headers()
    final = part.buffer.snapshot()
    assert final.last_position == (entries[-1][0] if entries else EARLIEST)
    assert restore(None, part.ledger).snapshot() == final
    visible = naive_model(entries)[1]
    assert [part.buffer.is_visible(h, p) for p, h in entries] == visible
    for snapshot in snapshots:
        replayed = restore(snapshot, part.ledger)
        assert replayed.snapshot() == final
        assert [replayed.is_visible(h, p) for p, h in entries] == visible
