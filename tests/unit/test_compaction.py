"""The pure compaction fold (``raytxn.protocol.compaction``): equivalence with the whole log's fold,
no open or aborted data in a compacted ledger, tombstones and the reset, the publish rule."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import CompactionReset, CorruptLedger, InvalidArgument
from raytxn.ids import EARLIEST, Position, TxnID
from raytxn.protocol.compaction import (
    CompactionHorizon,
    CompactionResult,
    Compactor,
    KeptRecord,
    ReadPlan,
    check_publish,
    collectable,
    compacted_entries,
    compacted_entry_records,
    kafka_runs,
    read_plan,
)
from raytxn.protocol.entry_format import EndAction, EntryHeader, MessageRecord, marker_header
from raytxn.protocol.txn_buffer import AbortedTxn

KEYS = ["a", "b", "c", "d", "e"]
Message = tuple[str | None, bytes]  # key (None: keyless), value (b"": a tombstone)


@dataclass
class Log:
    """A partition's entries as the partition actor writes them, with what its txn buffer knows:
    the open txns (their first entry's index), the aborted spans, and the committed txns."""

    entries: list[tuple[EntryHeader, Position, list[MessageRecord]]] = field(default_factory=list)
    ledger: int = 0
    entry_id: int = 0
    next_offset: int = 0
    now_ms: int = 0
    txns: int = 0
    open: dict[int, tuple[TxnID, int]] = field(default_factory=dict)  # slot -> txn, first entry index
    aborted: list[AbortedTxn] = field(default_factory=list)
    committed: set[TxnID] = field(default_factory=set)

    def _append(self, header: EntryHeader, messages: list[MessageRecord]) -> Position:
        position = Position(self.ledger, self.entry_id)
        self.entry_id += 1
        header = msgspec.structs.replace(header, base_offset=self.next_offset, publish_time_ms=self.now_ms)
        self.next_offset += max(1, len(messages))
        self.entries.append((header, position, messages))
        return position

    def write(self, messages: list[Message], slot: int | None = None) -> None:
        txn = None
        if slot is not None:
            if slot not in self.open:
                self.open[slot] = (TxnID(0, self.txns), len(self.entries))
                self.txns += 1
            txn = self.open[slot][0]
        records = [MessageRecord(value, key) for key, value in messages]
        self._append(EntryHeader("data", txn, "p", 0, 0, len(records), 0), records)

    def end(self, slot: int, commit: bool) -> None:
        if slot not in self.open:
            return
        txn, first = self.open.pop(slot)
        marker = self._append(marker_header(EndAction.COMMIT if commit else EndAction.ABORT, txn, 0), [])
        if commit:
            self.committed.add(txn)
        else:
            self.aborted.append(AbortedTxn(txn, self.entries[first][1], marker))

    def roll(self) -> None:
        self.ledger, self.entry_id = self.ledger + 1, 0

    def max_read_index(self) -> int:
        """The txn buffer's max_read_position, as an index: the entry before the first open txn's."""
        return min((first for _, first in self.open.values()), default=len(self.entries)) - 1

    def max_read_position(self) -> Position:
        index = self.max_read_index()
        return EARLIEST if index < 0 else self.entries[index][1]

    def visible(self, index: int) -> bool:
        header = self.entries[index][0]
        return (header.kind == "data" and index <= self.max_read_index()
                and (header.txn is None or header.txn in self.committed))

    def visible_records(self, from_offset: int = 0) -> list[tuple[int, str, bytes]]:
        """What a reader of the live ledger sees from ``from_offset``: (offset, key, value)."""
        return [(header.base_offset + i, m.key, m.value)
                for index, (header, _, messages) in enumerate(self.entries) if self.visible(index)
                for i, m in enumerate(messages) if m.key is not None and header.base_offset + i >= from_offset]


def fold(state: dict[str, bytes], records: list[tuple[int, str, bytes | None]]) -> dict[str, bytes]:
    """Apply records in order: the latest value per key, an empty value or None deleting it."""
    for _, key, value in records:
        if value:
            state[key] = value
        else:
            state.pop(key, None)
    return state


@dataclass
class Compactions:
    """The published horizon and its records, after each compaction of ``log``."""

    published: CompactionHorizon | None = None
    records: list[KeptRecord] = field(default_factory=list)
    horizon_index: int = -1
    results: list[tuple[CompactionResult, int, int]] = field(default_factory=list)  # result, now, retention

    def compact(self, log: Log, retention_ms: int) -> CompactionResult:
        compactor = Compactor(self.published, self.records, max_read_position=log.max_read_position(),
                              aborted=list(log.aborted))
        top = log.max_read_index()
        for index in range(self.horizon_index + 1, top + 1):
            compactor.add(*log.entries[index])
        result = compactor.finish(log.now_ms, retention_ms)
        if not result.publishes:  # nothing changed: the published generation stands, as it is
            assert self.published is not None and result.horizon == self.published
            assert result.records == self.records and result.dropped_tombstones == 0
            self.results.append((result, log.now_ms, retention_ms))
            return result
        check_publish(self.published, result.horizon)
        self.published, self.records = result.horizon, result.records
        self.horizon_index = max(self.horizon_index, top)
        self.results.append((result, log.now_ms, retention_ms))
        return result


messages = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(KEYS)), st.sampled_from([b"", b"1", b"22", b"333"])),
                    min_size=1, max_size=3)
operations = st.lists(st.one_of(
    st.tuples(st.just("write"), messages, st.one_of(st.none(), st.integers(0, 2))),
    st.tuples(st.just("end"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("compact"), st.sampled_from([0, 50, 1_000_000])),
    st.tuples(st.just("tick"), st.integers(1, 100)),
    st.tuples(st.just("roll")),
), max_size=60)


def run(ops: list[tuple]) -> tuple[Log, Compactions]:
    log, compactions = Log(), Compactions()
    for op in ops:
        if op[0] == "write":
            log.write(op[1], op[2])
        elif op[0] == "end":
            log.end(op[1], op[2])
        elif op[0] == "compact":
            compactions.compact(log, op[1])
        elif op[0] == "tick":
            log.now_ms += op[1]
        else:
            log.roll()
    return log, compactions


def tail_records(log: Log, compactions: Compactions, from_offset: int) -> list[tuple[int, str, bytes]]:
    return [r for r in log.visible_records(from_offset) if compactions.published is None
            or r[0] >= compactions.published.next_offset]


@settings(max_examples=400, deadline=None)
@given(operations)
def test_compacted_state_plus_the_tail_equals_the_fold_of_the_whole_log(ops: list[tuple]) -> None:
    log, compactions = run(ops)
    kept = [(r.offset, r.key, r.value) for r in compactions.records]
    assert fold(fold({}, kept), tail_records(log, compactions, 0)) == fold({}, log.visible_records())


@settings(max_examples=400, deadline=None)
@given(operations)
def test_a_compacted_ledger_holds_one_committed_record_per_key_at_its_original_offset(ops: list[tuple]) -> None:
    log, compactions = run(ops)
    by_offset = {header.base_offset + i: (index, m) for index, (header, _, messages) in enumerate(log.entries)
                 for i, m in enumerate(messages)}
    for result, _, _ in compactions.results:
        offsets = [r.offset for r in result.records]
        assert offsets == sorted(offsets) and len({r.key for r in result.records}) == len(offsets)
        assert result.horizon.records == len(result.records)
        for record in result.records:
            index, message = by_offset[record.offset]
            # never open or aborted data: the entry is visible at the end (committed, or plain),
            # and was below max_read_position when compacted (its position is at most the horizon)
            assert log.visible(index) and record.position <= result.horizon.horizon
            assert (record.key, record.value or b"") == (message.key, message.value)
            assert record.is_tombstone == (message.value == b"")


@settings(max_examples=400, deadline=None)
@given(operations, st.integers(0, 200))
def test_a_reader_resuming_at_any_offset_reaches_the_whole_logs_state_or_is_reset(ops: list[tuple],
                                                                                  from_offset: int) -> None:
    """A reader holding the state of every offset below ``from_offset`` reads the compacted records
    from there, then the live tail; a dropped tombstone it had not seen resets it instead."""
    log, compactions = run(ops)
    from_offset = min(from_offset, log.next_offset)
    prior = fold({}, [r for r in log.visible_records() if r[0] < from_offset])
    published = compactions.published
    if published is not None and 0 < from_offset <= published.dropped_tombstones_through:
        with pytest.raises(CompactionReset):
            read_plan(published, compactions.records, from_offset)
        return
    plan = read_plan(published, compactions.records, from_offset)
    compacted = [(r.offset, r.key, r.value) for r in compactions.records[plan.compacted_from:]]
    assert all(offset >= from_offset for offset, _, _ in compacted)
    live = log.visible_records(plan.live_from_offset)
    assert fold(fold(prior, compacted), live) == fold({}, log.visible_records())


@settings(max_examples=200, deadline=None)
@given(operations)
def test_tombstones_are_kept_for_their_delete_retention_then_dropped(ops: list[tuple]) -> None:
    """A tombstone is stamped by the first compaction that keeps it, kept while its retention
    runs, and dropped by the first compaction after it (unless a newer value of its key came)."""
    _, compactions = run(ops)
    before: dict[str, KeptRecord] = {}
    for result, now_ms, retention_ms in compactions.results:
        kept = {r.key: r for r in result.records}
        for record in kept.values():
            if record.is_tombstone:
                assert record.tombstone_since_ms is not None and now_ms - record.tombstone_since_ms < retention_ms
                old = before.get(record.key)
                if old is not None and old.offset == record.offset:
                    assert record.tombstone_since_ms == old.tombstone_since_ms  # stamped once
            else:
                assert record.tombstone_since_ms is None
        for key, old in before.items():
            if old.is_tombstone and key not in kept:  # dropped: its retention had run out
                assert now_ms - old.tombstone_since_ms >= retention_ms
                assert result.horizon.dropped_tombstones_through >= old.offset
        before = kept
    if compactions.published is not None:  # one generation per compaction that changed something
        assert compactions.published.generation == sum(result.publishes for result, _, _ in compactions.results)


def _plain(log: Log, *pairs: Message) -> None:
    log.write(list(pairs))


def test_an_example_with_an_aborted_txn_a_tombstone_and_a_reset() -> None:
    log, compactions = Log(), Compactions()
    _plain(log, ("a", b"1"), ("b", b"1"))          # offsets 0, 1
    log.write([("a", b"aborted"), ("c", b"x")], 0)  # offsets 2, 3: aborted below
    _plain(log, ("b", b""))                         # offset 4: b's tombstone
    log.end(0, commit=False)                        # offset 5: the abort marker
    log.write([("c", b"open")], 1)                  # offset 6: open at the compaction
    _plain(log, ("d", b"after"))                    # offset 7: above max_read_position
    first = compactions.compact(log, retention_ms=100)
    assert first.horizon.horizon == Position(0, 3) and first.horizon.next_offset == 6
    assert [(r.offset, r.key, r.value) for r in first.records] == [(0, "a", b"1"), (4, "b", None)]
    assert first.skipped_aborted == 2 and first.horizon.tombstones == 1
    log.end(1, commit=True)
    log.now_ms += 100                               # b's tombstone is past its retention
    second = compactions.compact(log, retention_ms=100)
    assert [(r.offset, r.key, r.value) for r in second.records] == [(0, "a", b"1"), (6, "c", b"open"),
                                                                     (7, "d", b"after")]
    assert second.horizon.dropped_tombstones_through == 4 and second.horizon.generation == 2
    with pytest.raises(CompactionReset):
        read_plan(compactions.published, compactions.records, 3)  # had b's old value, missed its delete
    assert read_plan(compactions.published, compactions.records, 0).compacted_from == 0
    assert read_plan(compactions.published, compactions.records, 5) == ReadPlan(1, 9)
    assert read_plan(compactions.published, compactions.records, 12) == ReadPlan(3, 12)


def test_a_compaction_that_changes_nothing_publishes_nothing() -> None:
    """Nothing past the horizon (or only an open transaction's data) and no tombstone to expire:
    no new generation. A tombstone past its retention alone is a change, and publishes."""
    log, compactions = Log(), Compactions()
    _plain(log, ("a", b"1"), ("b", b""))
    first = compactions.compact(log, retention_ms=100)
    assert first.publishes and first.horizon.generation == 1
    again = compactions.compact(log, retention_ms=100)
    assert not again.publishes and again.horizon == first.horizon
    log.write([("a", b"open")], 0)  # an open txn: past the horizon, not below max_read_position
    assert not compactions.compact(log, retention_ms=100).publishes
    log.now_ms += 100  # b's tombstone is past its retention: dropping it is a change
    expired = compactions.compact(log, retention_ms=100)
    assert expired.publishes and expired.horizon.generation == 2 and expired.dropped_tombstones == 1
    log.end(0, commit=True)
    committed = compactions.compact(log, retention_ms=100)
    assert committed.publishes and [(r.key, r.value) for r in committed.records] == [("a", b"open")]


def test_bad_input_is_refused_and_changes_nothing() -> None:
    log = Log()
    _plain(log, ("a", b"1"))
    log.write([("b", b"open")], 0)
    compactor = Compactor(None, [], max_read_position=log.max_read_position(), aborted=[])
    compactor.add(*log.entries[0])
    with pytest.raises(InvalidArgument, match="max_read_position"):
        compactor.add(*log.entries[1])  # an open txn's entry
    with pytest.raises(CorruptLedger, match="ledger order"):
        compactor.add(*log.entries[0])
    assert [r.key for r in compactor.finish(0).records] == ["a"]  # the refused adds changed nothing
    duplicate = KeptRecord(0, Position(0, 0), "a", b"1", 0)
    with pytest.raises(CorruptLedger, match="twice"):
        Compactor(None, [duplicate, duplicate], max_read_position=Position(0, 0), aborted=[])
    bounded = Compactor(None, [], max_read_position=log.max_read_position(), aborted=[], max_keys=0)
    with pytest.raises(InvalidArgument, match="max_keys"):
        bounded.add(*log.entries[0])
    with pytest.raises(InvalidArgument, match="delete_retention_ms"):
        compactor.finish(0, -1)
    with pytest.raises(InvalidArgument, match=">= 0"):
        read_plan(None, [], -1)


def test_the_publish_rule_and_the_ledgers_a_crash_leaves() -> None:
    first = CompactionHorizon(1, Position(0, 5), 6, 2, 0)
    check_publish(None, first)
    with pytest.raises(InvalidArgument, match="another compaction"):
        check_publish(first, first)  # a racing compactor of the same generation loses
    with pytest.raises(InvalidArgument, match="move back"):
        check_publish(first, CompactionHorizon(2, Position(0, 4), 5, 2, 0))
    check_publish(first, CompactionHorizon(2, Position(0, 5), 6, 1, 0, dropped_tombstones_through=3))
    second = CompactionHorizon(2, Position(0, 5), 6, 1, 0)
    data = {1: ["d1"], 2: ["d2-won", "d2-crashed"], 3: ["d3-in-flight"]}
    # after publishing generation 2: generation 1's and the loser's, never the one in flight
    assert collectable(second, "d2-won", data) == ["d1", "d2-crashed"]
    assert collectable(None, "", {1: ["d1"]}) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 300), unique=True, max_size=60).map(sorted), st.integers(0, 320),
       st.integers(0, 320), st.integers(1, 7), st.integers(1, 30))
def test_kafka_runs_are_the_kept_records_in_range_in_bounded_runs(kept_offsets, offset, below, run_records,
                                                                  max_records) -> None:
    kept = [KeptRecord(o, Position(1, o), f"k{o}", None if o % 5 == 0 else b"v%d" % o, 1000 + o)
            for o in kept_offsets]
    runs = kafka_runs(kept, kept_offsets, offset, below, run_records, max_records)
    assert all(1 <= len(run.offsets) <= run_records for run in runs)
    wanted = [r for r in kept if offset <= r.offset < below][:max_records]
    assert [o for run in runs for o in run.offsets] == [r.offset for r in wanted]
    assert [v for run in runs for v in run.values] == [r.value or b"" for r in wanted]  # a tombstone: empty
    assert [k for run in runs for k in run.keys] == [r.key.encode() for r in wanted]


# --- a read_compacted subscription (SubscriptionState fed compacted_entries) --------------------

def _compacted_subscription_read(records: list[KeptRecord], horizon: Position, sizes: list[int],
                                 ack_every: int) -> tuple[list[tuple[Position, int, str, bytes]], Position]:
    """Read the compacted view as the partition serves it (``compacted_entries`` in reads of
    ``sizes`` entries), deliver everything to one Exclusive consumer and ack every
    ``ack_every``-th message, then the rest: what it received and where the cursor ends."""
    from raytxn.protocol.cursor import Cursor, next_position
    from raytxn.protocol.entry_format import decode_message
    from raytxn.protocol.packed_records import PackedRecords
    from raytxn.protocol.subscription_state import SubscriptionState

    state = SubscriptionState(0, Cursor())
    state.add_consumer("c", "c", "Exclusive", 0.0, read_compacted=True)
    received: list[tuple[Position, int, str, bytes]] = []
    acks: list[tuple[Position, int, int]] = []
    for size in sizes * 1000:  # bounded: each read moves on by at least one entry
        start = state.read_position
        if start > horizon:
            break
        found = compacted_entries(records, start, size)
        nxt = next_position(horizon) if not found or found[-1].position >= records[-1].position \
            else next_position(found[-1].position)
        state.on_read(start, [(e.position, PackedRecords.pack(compacted_entry_records(e))) for e in found],
                      nxt, horizon, [(e.count, e.indexes) for e in found])
        state.dispatcher.want("c", 1000)
        state.dispatch()
        for ledger_id, entry_id, batch_size, _ms, indexes, _counts, packed in state.take_entries("c"):
            for k, index in enumerate(indexes):
                message = decode_message(packed.record(k))
                received.append((Position(ledger_id, entry_id), index, message.key, message.value))
                acks.append((Position(ledger_id, entry_id), index, batch_size))
    state.ack(acks[::ack_every])
    state.ack(acks)
    return received, state.cursor.acked_below


@settings(max_examples=300, deadline=None)
@given(operations, st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(1, 3))
def test_a_read_compacted_subscription_receives_the_view_at_its_ids_and_its_acks_pass_the_horizon(
        ops: list[tuple], sizes: list[int], ack_every: int) -> None:
    log, compactions = run([*ops, ("compact", 1_000_000)])
    published = compactions.published
    if published is None or not compactions.records:
        return
    received, acked_below = _compacted_subscription_read(compactions.records, published.horizon, sizes, ack_every)
    by_offset = {(h.base_offset + i): (p, i, m) for h, p, ms in log.entries for i, m in enumerate(ms)}
    expected = []
    for record in compactions.records:
        position, index, message = by_offset[record.offset]  # the original message, at its original id
        expected.append((position, index, message.key, message.value))
    assert received == expected
    assert acked_below > published.horizon  # the folded messages count as consumed, and nothing is left


def test_compacted_entries_group_an_entrys_kept_records_and_number_old_ones_themselves() -> None:
    kept = [KeptRecord(0, Position(0, 0), "a", b"1", 0, batch_index=0, batch_size=3),
            KeptRecord(2, Position(0, 0), "b", b"2", 0, batch_index=2, batch_size=3),
            KeptRecord(5, Position(0, 3), "c", None, 0, batch_index=1, batch_size=2),
            KeptRecord(7, Position(0, 5), "d", b"4", 0), KeptRecord(8, Position(0, 5), "e", b"5", 0)]
    entries = compacted_entries(kept, Position(0, 0), 10)
    assert [(e.position, e.count, e.indexes) for e in entries] == [
        (Position(0, 0), 3, [0, 2]), (Position(0, 3), 2, [1]), (Position(0, 5), 2, [0, 1])]
    assert [e.position for e in compacted_entries(kept, Position(0, 1), 1)] == [Position(0, 3)]
    assert compacted_entries(kept, Position(0, 6), 5) == []


def test_a_compaction_read_turns_the_event_loop_every_few_thousand_records() -> None:
    """A partition compacts itself in its own process: its appends wait for the loop to turn.
    Entries of 50 messages, 200 of them, come back from storage in one read; the loop must
    still turn every ``YIELD_EVERY_RECORDS`` or so, not once per read."""
    import asyncio
    import uuid

    from raytxn.ids import partition_stream
    from raytxn.ledger.compacted import YIELD_EVERY_RECORDS, iter_entries
    from raytxn.ledger.managed import ManagedLedger
    from raytxn.ledger.storage import Storage
    from raytxn.protocol.entry_format import encode_entry

    async def run() -> list[int]:
        storage = Storage.from_url(f"memory://compaction-turns-{uuid.uuid4().hex}")
        stream = partition_stream("t", 0)
        ledger = await ManagedLedger.open(storage, stream)
        queued = [ledger.enqueue(encode_entry(EntryHeader("data", None, "p", 50 * n, 50 * n + 49, 50, 0,
                                                          base_offset=50 * n),
                                              [MessageRecord(b"v", f"k{i}") for i in range(50)]))
                  for n in range(200)]
        for entry in queued:
            await ledger.durable(entry)
        assert len(await ledger.stored_objects()) <= 2  # (so one storage read returns them all)
        read, gaps, last = 0, [], 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal last
            while not stop.is_set():
                gaps.append(read - last)
                last = read
                await asyncio.sleep(0)

        task = asyncio.ensure_future(ticker())
        async for _header, _position, messages in iter_entries(storage, stream, Position(0, 0), Position(0, 199)):
            read += len(messages) + 1
        stop.set()
        await task
        gaps.append(read - last)  # what was read since the last turn
        assert read == 200 * 51
        return gaps

    gaps = asyncio.run(run())
    assert max(gaps) <= YIELD_EVERY_RECORDS + 51
