"""``send_batch``'s cuts (``raytxn.client.batch_cuts``): the running-sum cut is the one-record-at-
a-time cut it replaced, for any sizes, limits and open batch; ``pick`` is the list comprehension."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from raytxn.client.batch_cuts import cut_points, pick


def cut_points_reference(sizes: Sequence[int], max_messages: int, max_bytes: int,
                         held: tuple[int, int] = (0, 0)) -> list[int]:
    """``cut_points`` one record at a time: the loop ``send_batch`` cut with before."""
    cuts: list[int] = []
    start = 0
    held_messages, held_bytes = held
    while start < len(sizes):
        end, size = start, held_bytes
        while end < len(sizes) and end - start + held_messages < max_messages:
            if (end > start or held_messages) and size + sizes[end] > max_bytes:
                break
            size += sizes[end]
            end += 1
        cuts.append(end)
        start = end
        held_messages, held_bytes = 0, 0
    return cuts


@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 12), st.integers(1, 900),
       st.tuples(st.integers(0, 14), st.integers(0, 1000)))
def test_cut_points_match_the_record_by_record_cut(sizes: list[int], max_messages: int, max_bytes: int,
                                                   held: tuple[int, int]) -> None:
    held = held if held[0] else (0, 0)  # an open batch with no message holds no bytes
    cuts = cut_points(sizes, max_messages, max_bytes, held)
    assert cuts == cut_points_reference(sizes, max_messages, max_bytes, held)
    # Every run within the limits, or a record alone; only a topped-up first run may be empty.
    start = 0
    for number, end in enumerate(cuts):
        messages = end - start + (held[0] if number == 0 else 0)
        size = sum(sizes[start:end]) + (held[1] if number == 0 else 0)
        assert end > start or (number == 0 and held[0])
        topped = number == 0 and held[0]
        if end > start:  # within the limits, or a record alone (never beside an open batch's records)
            assert (messages <= max_messages and size <= max_bytes) or (end - start == 1 and not topped)
        start = end
    assert start == len(sizes)


def test_a_record_larger_than_a_batch_goes_alone_and_a_full_open_batch_takes_nothing() -> None:
    assert cut_points([50, 500, 50, 50], 10, 120) == [1, 2, 4]
    assert cut_points([50, 50], 10, 120, held=(3, 100)) == [0, 2]  # not even the first fits beside 100 B
    assert cut_points([10, 10, 10], 3, 1000, held=(3, 30)) == [0, 3]  # the open batch is full


@given(st.lists(st.integers(), max_size=40), st.data())
def test_pick_is_the_list_comprehension(items: list[int], data: st.DataObject) -> None:
    indexes = sorted(data.draw(st.sets(st.integers(0, max(0, len(items) - 1)), max_size=len(items)))) if items else []
    picked = pick(items, indexes)
    assert picked == [items[i] for i in indexes]
    before = list(items)
    picked.append(0)  # a list of its own: the producer extends the batches it makes
    assert items == before
