"""Range acks in the pure subscription state: ``(ledger_id, first_entry_id, last_entry_id)`` of
whole entries, plain or in a txn, keep every rule the single acks have (skips and conflicts
with pending txn acks, never-delivered acks refused, bad input changing nothing), and a txn's
range record replays to the same state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import InvalidArgument, NotAllowed, TransactionConflict
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor
from raytxn.protocol.dispatch import ConsumerType
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_entry
from raytxn.protocol.subscription_state import SubscriptionState
from raytxn.protocol.txnlog import EndAction

T1, T2 = TxnID(0, 1), TxnID(0, 2)


def P(ledger: int, entry: int) -> Position:
    return Position(ledger, entry)


def entry(ledger: int, entry_id: int, size: int) -> tuple[Position, list[bytes]]:
    header = EntryHeader("data", None, "p", entry_id * 10, entry_id * 10 + size - 1, size, 1000)
    return P(ledger, entry_id), encode_entry(header, [MessageRecord(b"v%d" % i) for i in range(size)])


def delivered_state(sizes: list[int], ledger: int = 0) -> SubscriptionState:
    """Entries 0..n-1 of ``ledger`` (batch sizes ``sizes``), all delivered to consumer "a"."""
    state = SubscriptionState(0, Cursor())
    state.add_consumer("a", "a", ConsumerType.Shared, 0.0)
    entries = [entry(ledger, i, size) for i, size in enumerate(sizes)]
    state.on_read(state.read_position, entries, P(ledger, len(sizes)), P(ledger, len(sizes) - 1))
    state.dispatcher.want("a", sum(sizes))
    state.dispatch()
    assert len(state.take("a")) == sum(sizes)
    return state


def view(state: SubscriptionState) -> tuple:
    """Everything an ack may change."""
    return (state.cursor.snapshot(), state.pending.stats(), state.dispatcher.outstanding, state.dispatcher.queued)


def test_a_plain_range_acks_its_entries_in_one_cursor_range() -> None:
    state = delivered_state([1, 3, 1, 2, 1])
    state.ack([], ranges=[(0, 1, 3)])
    assert state.cursor.acked_ranges() == [(P(0, 1), P(0, 4))]
    assert state.dispatcher.outstanding == 2  # entries 0 and 4
    state.ack([], ranges=[(0, 0, 0), (0, 4, 4)])
    assert state.cursor.mark_delete_position == P(0, 4) and state.dispatcher.outstanding == 0
    state.cursor.check_invariants()


def test_a_plain_range_skips_entries_pending_in_a_txn_as_single_plain_acks_do() -> None:
    state = delivered_state([1, 2, 1, 1, 1])
    record = state.prepare_ack(T1, [(P(0, 1), 0, 2), (P(0, 3), None, None)])
    assert record is not None
    state.apply(record, P(9, 0))
    state.ack([], ranges=[(0, 0, 4)])
    assert [state.cursor.is_acked(P(0, e)) for e in range(5)] == [True, False, True, False, True]
    state.apply(state.prepare_end(T1, EndAction.COMMIT, None)[0], P(9, 1))
    assert state.cursor.is_acked(P(0, 3)) and not state.cursor.is_acked(P(0, 1))  # index 1 never acked
    state.pending.check_invariants()


def test_a_plain_range_under_a_pending_cumulative_ack_skips_what_it_covers() -> None:
    state = delivered_state([1, 1, 1, 1])
    state.dispatcher.type = ConsumerType.Exclusive  # cumulative acks need a non-shared subscription
    record = state.prepare_ack(T1, [(P(0, 1), None, None)], cumulative=True)
    assert record is not None
    state.apply(record, P(9, 0))
    state.ack([], ranges=[(0, 0, 3)])
    assert [state.cursor.is_acked(P(0, e)) for e in range(4)] == [False, False, True, True]


def test_a_txn_range_is_logged_entry_by_entry_and_replays_to_the_same_state() -> None:
    state = delivered_state([1, 1, 4, 1])
    record = state.prepare_ack(T1, [], ranges=[(0, 0, 2)], request="r1")
    assert record is not None and [a.position for a in record.acks] == [P(0, 0), P(0, 1), P(0, 2)]
    state.apply(record, P(9, 0))
    assert state.prepare_ack(T1, [], ranges=[(0, 0, 2)], request="r1") is None  # a retry of the call
    assert state.dispatcher.outstanding == 1  # the range's messages are the txn's now
    replayed = SubscriptionState(0, Cursor())
    replayed.apply(record, P(9, 0))
    assert replayed.pending.stats() == state.pending.stats()
    replayed.pending.check_invariants()
    state.apply(state.prepare_end(T1, EndAction.COMMIT, None)[0], P(9, 1))
    assert state.cursor.mark_delete_position == P(0, 2)


def test_a_conflicting_txn_range_raises_and_changes_nothing() -> None:
    state = delivered_state([1, 2, 1])
    record = state.prepare_ack(T1, [(P(0, 1), 1, 2)])
    assert record is not None
    state.apply(record, P(9, 0))
    before = view(state)
    with pytest.raises(TransactionConflict):
        state.prepare_ack(T2, [], ranges=[(0, 0, 2)])
    state.ack([], ranges=[(0, 2, 2)])  # plain, elsewhere
    with pytest.raises(TransactionConflict):  # already acked
        state.prepare_ack(T2, [], ranges=[(0, 2, 2)])
    assert view(state)[1:] == (before[1], before[2] - 1, before[3])


def test_ranges_reaching_past_what_was_delivered_are_refused_in_a_txn() -> None:
    state = delivered_state([1, 1])
    with pytest.raises(NotAllowed):
        state.prepare_ack(T1, [], ranges=[(0, 0, 2)])
    with pytest.raises(NotAllowed):
        state.prepare_ack(T1, [], ranges=[(1, 0, 0)])
    assert state.pending.pending_txn_count == 0


@pytest.mark.parametrize("bad", [(0, 2, 1), (0, -1, 0), (0, 0), ("0", 0, 0), (0, 0, 1 << 21), [0, 0, None]])
def test_a_malformed_range_is_invalid_and_no_range_of_the_call_is_applied(bad: object) -> None:
    state = delivered_state([1, 1, 1])
    before = view(state)
    with pytest.raises(InvalidArgument):
        state.ack([], ranges=[(0, 0, 1), bad])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        state.prepare_ack(T1, [], ranges=[(0, 0, 1), bad])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        state.ack([], cumulative=True, ranges=[(0, 0, 1)])
    assert view(state) == before


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=12),
       held=st.sets(st.integers(0, 11)), ranges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 4)),
                                                         max_size=4))
def test_plain_ranges_do_what_the_same_single_acks_do(sizes: list[int], held: set[int],
                                                      ranges: list[tuple[int, int]]) -> None:
    """Property: a plain range ack leaves cursor, pending acks and dispatcher exactly as plain
    whole-entry acks of its entries would, with any entries held by a pending txn."""
    n = len(sizes)
    by_range, by_entry = delivered_state(sizes), delivered_state(sizes)
    held_acks = [(P(0, e), None, None) for e in sorted(held) if e < n]
    if held_acks:
        for state in (by_range, by_entry):
            record = state.prepare_ack(T1, held_acks)
            assert record is not None
            state.apply(record, P(9, 0))
    picked = [(0, first, min(n - 1, first + length)) for first, length in ranges if first < n]
    by_range.ack([], ranges=picked)
    by_entry.ack([(P(0, e), None, None) for _, first, last in picked for e in range(first, last + 1)])
    assert view(by_range) == view(by_entry)
    by_range.cursor.check_invariants()
    by_range.pending.check_invariants()
