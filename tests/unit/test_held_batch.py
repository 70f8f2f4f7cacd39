"""``HeldBatch``: a txn's async acks of one batch entry, held as a run of indexes while they come
in order and as a set from the first that does not. Whatever the order and repeats, it reports the
entry complete exactly when every index was acked, and its spans name exactly the indexes acked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raytxn.client.ack_spans import HeldBatch, coalesce_spans


def _held(batch_size: int) -> HeldBatch:
    return HeldBatch(txn=None, partition=0, ledger_id=3, entry_id=9, batch_size=batch_size)  # type: ignore[arg-type]


def _indexes_of(held: HeldBatch) -> list[int]:
    return [index for _, _, _, first, last in held.spans() for index in range(first, last + 1)]


@given(st.integers(2, 12).flatmap(lambda size: st.tuples(st.just(size), st.lists(st.integers(0, size - 1),
                                                                                     max_size=40))))
def test_complete_exactly_when_every_index_is_acked_whatever_the_order_and_repeats(case: tuple[int, list[int]]) -> None:
    batch_size, acks = case
    held, seen = _held(batch_size), set()
    for index in acks:
        seen.add(index)
        complete = held.add(index)
        assert complete == (len(seen) == batch_size)
        assert held.acked() == len(seen) and _indexes_of(held) == sorted(seen)
        if complete:
            break  # the consumer sends the entry whole and holds it no more


def test_in_order_acks_stay_one_run_and_go_as_one_span() -> None:
    held = _held(10_000)
    assert [held.add(index) for index in range(4_000, 6_000)] == [False] * 2_000
    assert held.indexes is None and held.spans() == [[3, 9, 10_000, 4_000, 5_999]]
    assert coalesce_spans(held.spans()) == ([], [(3, 9, 10_000, 4_000, 5_999)])
    assert held.add(5_000) is False and held.indexes is None  # a repeat inside the run changes nothing


def test_an_ack_out_of_order_turns_the_run_into_a_set_that_completes_the_entry() -> None:
    held = _held(4)
    assert (held.add(1), held.add(2)) == (False, False)
    assert held.add(0) is False and held.indexes == {0, 1, 2}
    assert held.spans() == [[3, 9, 4, 0, 2]]
    assert held.add(3) is True
    assert coalesce_spans(held.spans()) == ([(3, 9, 9)], [])


@given(st.integers(2, 12).flatmap(lambda size: st.tuples(st.just(size), st.lists(st.integers(0, size - 1),
                                                                                     max_size=40))))
def test_the_fast_path_then_add_holds_what_add_alone_holds(case: tuple[int, list[int]]) -> None:
    """As the consumer uses it: ``extend_run`` first, ``add`` when it declines. It never completes
    the entry itself, and leaves the held indexes as ``add`` alone would."""
    batch_size, acks = case
    held, seen = _held(batch_size), set()
    for index in acks:
        seen.add(index)
        complete = False if held.extend_run(index) else held.add(index)
        assert complete == (len(seen) == batch_size)
        assert held.acked() == len(seen) and _indexes_of(held) == sorted(seen)
        if complete:
            break
