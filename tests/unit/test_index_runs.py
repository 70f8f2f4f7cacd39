"""Index-run acks ``(ledger_id, entry_id, batch_size, first_index, last_index)``: batch indexes of
one entry acked a run at a time. Each run must do exactly what acking its messages one by one
does (cursor, pending acks, outstanding and queued messages, redelivery counts), plain or in a
txn, with some indexes held by a pending txn; bad runs change nothing; and the consumer's
grouping turns any set of acks into runs that stand for exactly those acks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.client.ack_spans import coalesce_spans
from raytxn.errors import InvalidArgument
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor
from raytxn.protocol.subscription_state import SubscriptionState
from tests.unit.test_ack_spans import spans_of
from tests.unit.test_range_acks import P, delivered_state, view

T1, T2 = TxnID(0, 1), TxnID(0, 2)


def full_view(state: SubscriptionState) -> tuple:
    """``view`` and the redelivery counts."""
    return (*view(state), dict(state.dispatcher._redeliveries))


def test_a_run_acks_its_indexes_and_the_last_run_completes_the_entry() -> None:
    state = delivered_state([1, 10])
    state.ack([], runs=[(0, 1, 10, 0, 4)])
    assert state.cursor.partial_batch(P(0, 1)) == (10, 0b1111100000)
    assert state.dispatcher.outstanding == 1 + 5
    state.ack([], runs=[(0, 1, 10, 3, 9), (0, 0, 1, 0, 0)])  # overlaps what is acked; a single message
    assert state.cursor.mark_delete_position == P(0, 1) and state.dispatcher.outstanding == 0
    state.cursor.check_invariants()


def test_a_run_in_a_txn_is_logged_as_its_single_acks() -> None:
    by_run, by_single = delivered_state([3, 4]), delivered_state([3, 4])
    record = by_run.prepare_ack(T1, [], runs=[(0, 1, 4, 1, 2), (0, 0, 3, 0, 2)], request="r")
    singles = by_single.prepare_ack(T1, [(P(0, 1), 1, 4), (P(0, 1), 2, 4), (P(0, 0), 0, 3), (P(0, 0), 1, 3),
                                         (P(0, 0), 2, 3)], request="r")
    assert record == singles
    with pytest.raises(InvalidArgument):
        by_run.prepare_ack(T2, [], cumulative=True, runs=[(0, 1, 4, 0, 0)])


@pytest.mark.parametrize("bad", [
    (0, 1, 4, 2, 1),         # last before first
    (0, 1, 4, 0, 4),         # past the batch
    (0, -1, 4, 0, 0),        # no such entry id
    (0, 1, 0, 0, 0),         # no messages
    (0, 1, 4, 0),            # too short
    (0, 1, 4, "0", 1),       # not ints
    (0, 1, 5, 0, 0),         # the cursor knows entry 1 as a batch of 4
    [0, 1, 4, 0, None],
])
def test_a_malformed_run_is_invalid_and_no_ack_of_the_call_is_applied(bad: object) -> None:
    state = delivered_state([1, 4, 3])
    state.ack([], runs=[(0, 1, 4, 3, 3)])  # entry 1 is partly acked: its batch size is known
    before = full_view(state)
    calls = [
        lambda: state.ack([(P(0, 0), None, None)], ranges=[(0, 0, 0)], runs=[(0, 2, 3, 0, 1), bad]),
        lambda: state.ack([], cumulative=True, runs=[(0, 2, 3, 0, 1)]),
        lambda: state.ack([], runs=[(0, 2, 3, 0, 1), (0, 2, 4, 2, 2)]),  # one entry, two batch sizes
    ]
    if bad != (0, 1, 5, 0, 0):  # that one is well-formed: only the cursor can tell
        calls.append(lambda: state.prepare_ack(T1, [], runs=[(0, 2, 3, 0, 1), bad]))
    for call in calls:
        with pytest.raises(InvalidArgument):
            call()
        assert full_view(state) == before


def test_cursor_ack_indexes_refuses_a_wrong_batch_size_and_an_empty_run() -> None:
    cursor = Cursor()
    assert cursor.ack_indexes(P(0, 5), 8, 2, 3)
    with pytest.raises(InvalidArgument):
        cursor.ack_indexes(P(0, 5), 9, 0, 0)
    with pytest.raises(InvalidArgument):
        cursor.ack_indexes(P(0, 5), 8, 3, 2)
    assert not cursor.ack_indexes(P(0, 5), 8, 2, 3)  # idempotent
    assert cursor.partial_batch(P(0, 5)) == (8, 0b11110011)


runs_strategy = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7), st.integers(0, 7)), max_size=6)


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), held=st.sets(st.tuples(st.integers(0, 5),
                                                                                       st.integers(0, 7))),
       picks=runs_strategy, redelivered=st.booleans())
def test_plain_runs_do_what_the_same_single_acks_do(sizes: list[int], held: set[tuple[int, int]],
                                                    picks: list[tuple[int, int, int]], redelivered: bool) -> None:
    """Property: with any batch indexes held by a pending txn and some messages delivered twice
    (redelivery counts), plain index runs leave every part of the state as the single acks of
    their messages do."""
    by_run, by_single = delivered_state(sizes), delivered_state(sizes)
    held_acks = [(P(0, e), i, sizes[e]) for e, i in sorted(held) if e < len(sizes) and i < sizes[e]]
    for state in (by_run, by_single):
        if held_acks:
            record = state.prepare_ack(T1, held_acks)
            assert record is not None
            state.apply(record, P(9, 0))
        if redelivered:  # give everything back and deliver it again: counts of 1
            state.release("a")
            state.dispatcher.want("a", sum(sizes))
            state.dispatch()
            state.take("a")
    runs = []
    for e, a, b in picks:
        if e < len(sizes):
            first, last = sorted((min(a, sizes[e] - 1), min(b, sizes[e] - 1)))
            runs.append((0, e, sizes[e], first, last))
    by_run.ack([], runs=runs)
    by_single.ack([(P(0, e), i, size) for _, e, size, first, last in runs for i in range(first, last + 1)])
    assert full_view(by_run) == full_view(by_single)
    by_run.cursor.check_invariants()
    by_run.pending.check_invariants()


@settings(max_examples=100, deadline=None)
@given(acks=st.sets(st.tuples(st.integers(0, 4), st.integers(0, 9))), sizes=st.lists(st.integers(1, 10),
                                                                                   min_size=5, max_size=5))
def test_the_consumers_runs_stand_for_exactly_its_acks(acks: set[tuple[int, int]], sizes: list[int]) -> None:
    """Property: the spans a group's single acks make (in any order) coalesce into ranges of
    whole entries and runs whose messages are exactly the acked ones."""
    given_acks = [(Position(0, e), i, sizes[e]) for e, i in acks if i < sizes[e]]
    ranges, runs = coalesce_spans(spans_of(given_acks))
    covered = {(e, i) for _, first, last in ranges for e in range(first, last + 1) for i in range(sizes[e])}
    covered_by_runs = {(e, i) for _, e, _, first, last in runs for i in range(first, last + 1)}
    assert not covered & covered_by_runs
    assert covered | covered_by_runs == {(p.entry_id, i) for p, i, _ in given_acks}
    assert all(size == sizes[e] and first <= last for _, e, size, first, last in runs)
    # No two runs of one entry touch: each is as long as it can be.
    ends = sorted((e, first, last) for _, e, _, first, last in runs)
    assert all(not (a[0] == b[0] and a[2] + 1 >= b[1]) for a, b in itertools.pairwise(ends))
