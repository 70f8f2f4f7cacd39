"""Where ``send_batch`` cuts a call's records into producer batches, in C-speed steps.

A call of 1,000 records was cut one record at a time in Python, twice (once for keyless
round-robin, once per partition behind its open batch): two ``len`` calls and a comparison a
record, a third of the sending thread's time for 100 B messages. Here the cut points come from a
running sum and a binary search per batch (``bisect``), and records are picked by slices or
``operator.itemgetter``. The old loop is the property test's oracle
(tests/unit/test_batch_cuts.py)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter
from typing import TypeVar

T = TypeVar("T")


def cut_points(sizes: Sequence[int], max_messages: int, max_bytes: int,
               held: tuple[int, int] = (0, 0)) -> list[int]:
    """The end (exclusive) of each run ``sizes`` is cut into, in order: a run holds at most
    ``max_messages`` records and ``max_bytes`` bytes, but a record alone always makes a run.
    ``held``: the messages and bytes of an open batch that the first run tops up; that run is
    empty (its end is 0) when not even the first record fits beside them."""
    assert max_messages >= 1 and max_bytes >= 1
    ends = list(accumulate(sizes))
    count = len(ends)
    cuts: list[int] = []
    start, before = 0, 0  # the first record of the run, and the bytes of all records before it
    held_messages, held_bytes = held
    while start < count:  # each pass ends a run; every pass but a topped-up first one grows it by >= 1
        limit = min(count, start + max(0, max_messages - held_messages))
        end = bisect_right(ends, before + max_bytes - held_bytes, start, limit)
        if end == start and not held_messages:
            end = start + 1  # too large for a batch: it goes alone
        cuts.append(end)
        if end > start:
            before = ends[end - 1]
        start = end
        held_messages, held_bytes = 0, 0
    return cuts


def pick(items: list[T], indexes: Sequence[int]) -> list[T]:
    """``[items[i] for i in indexes]`` for ascending ``indexes``: a slice when they are
    contiguous (a keyless call's are), else one ``itemgetter`` call."""
    if not indexes:
        return []
    first, last = indexes[0], indexes[-1]
    if last - first + 1 == len(indexes):
        return items[first:last + 1]
    return list(itemgetter(*indexes)(items))
