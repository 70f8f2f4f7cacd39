"""Kafka group offsets on raytxn subscriptions, pure parts: offset <-> (entry position, index)
over a partition's entries (``protocol.offsets``), and the subscription state's reader commits
(plain: forward, back, the same; in a transaction: a cumulative ack that commits or aborts with
it), with bad input changing nothing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import InvalidArgument, NotAllowed, TransactionConflict
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor
from raytxn.protocol.dispatch import ConsumerType
from raytxn.protocol.entry_format import EntryHeader
from raytxn.protocol.offsets import OffsetIndex, entry_holding, entry_span, offset_at
from raytxn.protocol.subscription_state import SubscriptionState
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
