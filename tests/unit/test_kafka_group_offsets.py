"""Kafka group offsets on raytxn subscriptions, pure parts: offset <-> (entry position, index)
over a partition's entries (``protocol.offsets``), and the subscription state's reader commits
(plain: forward, back, the same; in a transaction: a cumulative ack that commits or aborts with
it) and their metadata strings (kept with the cursor, persisted, set when a txn commits), with bad
input changing nothing."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import InvalidArgument, MetadataTooLarge, NotAllowed, TransactionConflict
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import MAX_COMMIT_METADATA_BYTES, Cursor
from raytxn.protocol.dispatch import ConsumerType
from raytxn.protocol.entry_format import EntryHeader
from raytxn.protocol.offsets import OffsetIndex, entry_holding, entry_span, offset_at
from raytxn.protocol.pending_ack import MetadataRecord
from raytxn.protocol.subscription_state import SubscriptionState, decode_persisted, encode_persisted
from raytxn.protocol.txnlog import EndAction

T1, T2 = TxnID(0, 1), TxnID(0, 2)


def P(ledger: int, entry: int) -> Position:
    return Position(ledger, entry)


def data(count: int) -> EntryHeader:
    return EntryHeader("data", None, "p", 0, count - 1, count, 1000)


def marker() -> EntryHeader:
    return EntryHeader("commit", T1, "", -1, -1, 0, 1000)


# --- offsets <-> positions -------------------------------------------------------------------

entry_layouts = st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(1, 5))), min_size=1,
                         max_size=30)  # (ledgers to skip before the entry, messages; None: a marker)


def laid_out(layout: list[tuple[int, int | None]]) -> list[tuple[Position, EntryHeader]]:
    entries, ledger, entry_id = [], 3, 0
    for skip, count in layout:
        if skip:
            ledger, entry_id = ledger + skip, 0
        entries.append((P(ledger, entry_id), marker() if count is None else data(count)))
        entry_id += 1
    return entries


@settings(max_examples=200, deadline=None)
@given(entry_layouts, st.integers(0, 7))
def test_every_offset_maps_to_its_message_and_back(layout: list, base: int) -> None:
    entries = laid_out(layout)
    end = base + sum(entry_span(h) for _, h in entries)
    for offset in range(base, end):
        position, index, size = entry_holding(entries, base, offset)
        header = dict(entries)[position]
        assert size == header.count and 0 <= index < entry_span(header)
        assert offset_at(entries, base, position, index) == offset
    assert entry_holding(entries, base, end) is None
    last = entries[-1][0]
    assert offset_at(entries, base, P(last.ledger_id, last.entry_id + 1), 0) is None  # past the end
    # A position between entries (the end of a ledger) is the next entry's first offset.
    for (before, _), (after, _) in itertools.pairwise(entries):
        if after.ledger_id != before.ledger_id:
            gap = P(before.ledger_id, before.entry_id + 1)
            assert offset_at(entries, base, gap, 0) == offset_at(entries, base, after, 0)


def test_the_index_finds_the_point_at_or_before_a_position() -> None:
    index = OffsetIndex(interval=2)
    for position, header in laid_out([(0, 1), (0, 1), (0, 1), (1, 2), (0, None)]):
        index.apply(position, entry_span(header))
    points = [(p.offset, p.position) for p in index.snapshot().points]
    assert points == [(0, P(3, 0)), (2, P(3, 2)), (3, P(4, 0)), (5, P(4, 1))]
    assert index.point_at_or_before(P(2, 9)) is None
    assert index.point_at_or_before(P(3, 1)).offset == 0
    assert index.point_at_or_before(P(3, 7)).offset == 2
    assert index.point_at_or_before(P(9, 0)).offset == 5


# --- reader commits --------------------------------------------------------------------------

def view(state: SubscriptionState) -> tuple:
    return state.cursor.snapshot(), state.pending.stats(), state.first_unacked()


def end(state: SubscriptionState, txn: TxnID, action: EndAction) -> None:
    for n, record in enumerate(state.prepare_end(txn, action, None)):
        state.apply(record, P(100, n + 50))


def test_plain_commits_move_the_cursor_forward_and_back() -> None:
    state = SubscriptionState(0, Cursor())
    assert state.reader_commit(P(5, 2), 3, 4)                       # offsets before index 3 of (5, 2)
    assert state.first_unacked() == (P(5, 2), 3)
    assert state.cursor.is_acked(P(5, 1)) and state.cursor.is_acked(P(5, 2), 2)
    assert not state.cursor.is_acked(P(5, 2), 3)
    assert not state.reader_commit(P(5, 2), 3, 4)                   # the same: nothing changes
    assert state.reader_commit(P(6, 0), 0, None)                    # forward over a ledger end
    assert state.first_unacked() == (P(6, 0), 0) and state.cursor.is_acked(P(5, 9))
    assert state.reader_commit(P(5, 1), 1, 2)                       # back: a seek, then index 0 acked
    assert state.first_unacked() == (P(5, 1), 1)
    assert not state.cursor.is_acked(P(5, 2)) and not state.cursor.is_acked(P(5, 1), 1)
    state.cursor.check_invariants()


def test_a_transactional_commit_moves_the_cursor_only_when_the_txn_commits() -> None:
    state = SubscriptionState(0, Cursor())
    state.reader_commit(P(5, 0), 0, None)
    before = state.cursor.snapshot()
    record = state.prepare_reader_commit(T1, P(5, 3), 1, 3, "r1")
    state.apply(record, P(100, 0))
    assert state.cursor.snapshot() == before and state.pending.pending_txn_count == 1
    assert state.prepare_reader_commit(T1, P(5, 3), 1, 3, "r2") is None   # the same again: a retry
    with pytest.raises(TransactionConflict):                              # another txn meanwhile
        state.prepare_reader_commit(T2, P(5, 4), 0, None, "r3")
    with pytest.raises(TransactionConflict):                              # a plain one meanwhile
        state.reader_commit(P(5, 4), 0, None)
    with pytest.raises(InvalidArgument):                                  # back, inside its own txn
        state.prepare_reader_commit(T1, P(5, 2), 0, None, "r4")
    end(state, T1, EndAction.COMMIT)
    assert state.first_unacked() == (P(5, 3), 1) and state.pending.pending_txn_count == 0

    record = state.prepare_reader_commit(T2, P(6, 0), 0, None, "r5")
    state.apply(record, P(100, 5))
    end(state, T2, EndAction.ABORT)
    assert state.first_unacked() == (P(5, 3), 1)                          # the aborted commit is gone
    with pytest.raises(InvalidArgument):                                  # a txn never moves it back
        state.prepare_reader_commit(TxnID(0, 3), P(5, 0), 0, None, "r6")
    assert state.prepare_reader_commit(TxnID(0, 3), P(5, 3), 1, 3, "r7") is None  # already there
    state.cursor.check_invariants()


def test_bad_commits_change_nothing() -> None:
    state = SubscriptionState(0, Cursor())
    state.reader_commit(P(5, 2), 1, 3)
    before = view(state)
    for args in [(P(5, 2), -1, 3), (P(5, 2), 3, 3), (P(5, 2), 1, None), ("5:2", 0, None), (P(5, 2), 1.0, 3)]:
        with pytest.raises(InvalidArgument):
            state.reader_commit(*args)
        with pytest.raises(InvalidArgument):
            state.prepare_reader_commit(T1, *args)
    assert view(state) == before
    state.add_consumer("c", "c", ConsumerType.Exclusive, 0.0)
    with pytest.raises(NotAllowed, match="do not mix"):
        state.reader_commit(P(6, 0), 0, None)
    with pytest.raises(NotAllowed, match="do not mix"):
        state.prepare_reader_commit(T1, P(6, 0), 0, None)
    state.remove_consumer("c")
    assert view(state) == before


# --- commit metadata -------------------------------------------------------------------------

def persist_and_restore(state: SubscriptionState) -> Cursor:
    """The cursor a restarted subscription gets from ``state``'s persisted form."""
    return Cursor.from_snapshot(decode_persisted(encode_persisted(state.persisted_form())).cursor)


def test_a_plain_commit_keeps_its_metadata_with_the_cursor_durably() -> None:
    state = SubscriptionState(0, Cursor())
    assert state.reader_commit(P(5, 2), 1, 3, "first")
    assert state.cursor.metadata == "first" and persist_and_restore(state).metadata == "first"
    assert state.reader_commit(P(5, 2), 1, 3, "second")          # the same offset, new metadata
    assert state.first_unacked() == (P(5, 2), 1) and state.cursor.metadata == "second"
    assert not state.reader_commit(P(5, 2), 1, 3, "second")      # both the same: nothing changes
    assert state.reader_commit(P(5, 0), 0, None)                 # back, with the default metadata
    assert state.cursor.metadata == "" and persist_and_restore(state).snapshot() == state.cursor.snapshot()
    state.reader_commit(P(6, 0), 0, None, "é" * 10)
    assert persist_and_restore(state).metadata == "é" * 10


def test_a_cursor_persisted_before_metadata_existed_reads_as_no_metadata() -> None:
    state = SubscriptionState(0, Cursor())
    state.reader_commit(P(5, 2), 1, 3)
    raw = msgspec.msgpack.decode(encode_persisted(state.persisted_form()))
    del raw["cursor"]["metadata"]                                # as an older version wrote it
    old = decode_persisted(msgspec.msgpack.encode(raw))
    assert Cursor.from_snapshot(old.cursor).metadata == "" and old.cursor.acked_below == state.cursor.acked_below


def test_a_transactional_commit_sets_its_metadata_only_when_the_txn_commits() -> None:
    state = SubscriptionState(0, Cursor())
    state.reader_commit(P(5, 0), 0, None, "plain")
    persisted = state.persisted_form()
    log: list[tuple[Any, Position]] = []

    def logged(record: Any) -> None:
        position = P(100, len(log))
        log.append((record, position))
        state.apply(record, position)

    def finish(txn: TxnID, action: EndAction) -> None:
        for record in state.prepare_end(txn, action, None):
            logged(record)

    logged(state.prepare_reader_commit(T1, P(5, 3), 1, 3, "r1", "in-t1"))
    assert state.cursor.metadata == "plain"                      # pending, not committed
    assert state.prepare_reader_commit(T1, P(5, 3), 1, 3, "r2", "in-t1") is None   # the same again
    finish(T1, EndAction.COMMIT)
    assert (state.first_unacked(), state.cursor.metadata) == ((P(5, 3), 1), "in-t1")

    logged(state.prepare_reader_commit(T2, P(6, 0), 0, None, "r3", "in-t2"))
    finish(T2, EndAction.ABORT)
    assert (state.first_unacked(), state.cursor.metadata) == ((P(5, 3), 1), "in-t1")   # dropped with it

    # The committed offset again with other metadata: a metadata record, which also holds off
    # other transactions' and plain commits until it ends.
    t3, t4 = TxnID(0, 3), TxnID(0, 4)
    record = state.prepare_reader_commit(t3, P(5, 3), 1, 3, "r4", "in-t3")
    assert isinstance(record, MetadataRecord)
    logged(record)
    assert state.pending.pending_txn_count == 1 and state.cursor.metadata == "in-t1"
    with pytest.raises(TransactionConflict):
        state.prepare_reader_commit(t4, P(6, 0), 0, None, "r5", "in-t4")
    with pytest.raises(TransactionConflict):
        state.reader_commit(P(6, 0), 0, None, "plain")
    state.pending.check_invariants()
    logged(state.prepare_reader_commit(t3, P(6, 0), 0, None, "r6", "in-t3 later"))   # then a move, new metadata
    finish(t3, EndAction.COMMIT)
    assert (state.first_unacked(), state.cursor.metadata) == ((P(6, 0), 0), "in-t3 later")
    assert state.prepare_reader_commit(t4, P(6, 0), 0, None, "r7", "in-t3 later") is None   # nothing new
    state.pending.check_invariants()

    # A restart restores the persisted cursor of before and replays the log: the same cursor.
    replayed = SubscriptionState(0, Cursor.from_snapshot(persisted.cursor))
    for record, position in log:
        replayed.apply(record, position, in_cursor_snapshot=position <= persisted.log_position)
    assert replayed.cursor.snapshot() == state.cursor.snapshot()


def test_metadata_past_the_limit_changes_nothing() -> None:
    state = SubscriptionState(0, Cursor())
    state.reader_commit(P(5, 2), 1, 3, "kept")
    before = view(state)
    for metadata in ["x" * (MAX_COMMIT_METADATA_BYTES + 1), "é" * (MAX_COMMIT_METADATA_BYTES // 2 + 1)]:
        with pytest.raises(MetadataTooLarge):
            state.reader_commit(P(6, 0), 0, None, metadata)
        with pytest.raises(MetadataTooLarge):
            state.prepare_reader_commit(T1, P(6, 0), 0, None, "r1", metadata)
        with pytest.raises(MetadataTooLarge):
            state.prepare_reader_commit(T1, P(5, 2), 1, 3, "r2", metadata)   # the same offset
    with pytest.raises(InvalidArgument):
        state.reader_commit(P(6, 0), 0, None, None)  # type: ignore[arg-type]
    assert view(state) == before
    assert state.reader_commit(P(6, 0), 0, None, "x" * MAX_COMMIT_METADATA_BYTES)   # the limit itself


def test_the_log_keeps_a_pending_metadata_record_past_trims() -> None:
    """A metadata record acks nothing, so the log index cannot say when it may go: trims stop
    before it until its txn ends (else a restart would forget the metadata of a txn that
    then commits)."""
    state = SubscriptionState(0, Cursor(), max_index_lag=1)
    state.reader_commit(P(5, 0), 0, None, "plain")
    state.delivered_through = P(9, 9)
    state.apply(state.prepare_reader_commit(T1, P(5, 0), 0, None, "r1", "in-t1"), P(100, 0))
    t3 = TxnID(0, 3)
    state.apply(state.prepare_ack(t3, [(P(5, 0), None, None)]), P(100, 1))   # another txn's ack ...
    for n, record in enumerate(state.prepare_end(t3, EndAction.COMMIT, None)):
        state.apply(record, P(100, 2 + n))
    assert state.cursor.acked_below == P(5, 1)                   # ... committed: the bound passed it
    assert state.trim_point(state.persisted_form()) is None
    end(state, T1, EndAction.COMMIT)
    assert state.cursor.metadata == "in-t1" and state.trim_point(state.persisted_form()) == P(100, 1)


# --- deleting a group's offset (OffsetDelete) ---------------------------------------------------

def test_deleting_the_offset_leaves_the_group_with_none_committed() -> None:
    state = SubscriptionState(0, Cursor())
    assert not state.reader_delete()                             # never committed: nothing to delete
    state.reader_commit(P(5, 2), 1, 3, "meta")
    assert not state.acked_nothing()
    assert state.reader_delete()
    assert state.acked_nothing() and state.cursor.metadata == "" and state.cursor.snapshot() == Cursor().snapshot()
    assert not state.reader_delete()
    state.reader_commit(P(6, 0), 0, None)                        # commits again afterwards
    assert state.first_unacked() == (P(6, 0), 0)


def test_deleting_the_offset_waits_for_pending_txns_and_refuses_readers() -> None:
    state = SubscriptionState(0, Cursor())
    state.reader_commit(P(5, 0), 0, None, "meta")
    state.apply(state.prepare_reader_commit(T1, P(5, 3), 0, None, "r1", "in-t1"), P(100, 0))
    before = view(state)
    with pytest.raises(TransactionConflict):
        state.reader_delete()
    assert view(state) == before
    end(state, T1, EndAction.ABORT)
    state.add_consumer("c", "c", ConsumerType.Exclusive, 0.0)
    before = view(state)
    with pytest.raises(NotAllowed):
        state.reader_delete()
    assert view(state) == before
    state.remove_consumer("c")
    assert state.reader_delete() and state.acked_nothing()
