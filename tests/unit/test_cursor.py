"""Cursor: mark-delete bound, individually acked ranges, batch ack sets, compaction, snapshots."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ids import EARLIEST, Position
from raytxn.protocol.cursor import (
    BatchAckState,
    Cursor,
    CursorSnapshot,
    acked_indexes,
    decode_snapshot,
    encode_snapshot,
    gaps_between,
    next_position,
    position_before,
)


def P(ledger: int, entry: int) -> Position:
    return Position(ledger, entry)


def fresh() -> Cursor:
    return Cursor(P(0, -1))  # Pulsar's "earliest" of a stream whose first ledger is 0


# --- basics ------------------------------------------------------------------------------------


def test_initial_positions() -> None:
    cursor = fresh()
    assert cursor.acked_below == P(0, 0) and cursor.mark_delete_position == P(0, -1)
    assert not cursor.is_acked(P(0, 0)) and cursor.is_acked(P(-1, 5))
    latest = Cursor(P(3, 7))  # "latest": the caller passes the partition's last position
    assert latest.is_acked(P(3, 7)) and not latest.is_acked(P(3, 8))
    default = Cursor()
    assert default.mark_delete_position == EARLIEST and default.acked_below == P(-1, 0)
    assert Cursor.starting_at(P(2, 0)).mark_delete_position == P(2, -1)


def test_individual_acks_and_mark_delete() -> None:
    cursor = fresh()
    assert cursor.ack(P(0, 1)) and cursor.ack(P(0, 2))
    assert cursor.acked_ranges() == [(P(0, 1), P(0, 3))]
    assert cursor.mark_delete_position == P(0, -1)
    assert not cursor.ack(P(0, 2))  # idempotent
    assert cursor.ack(P(0, 0))  # fills the hole: everything merges into the bound
    assert cursor.mark_delete_position == P(0, 2) and cursor.acked_ranges() == []
    assert cursor.is_acked(P(0, 1)) and not cursor.is_acked(P(0, 3))
    assert cursor.unacked_in([P(0, 3), P(0, 0), P(0, 5)]) == [P(0, 3), P(0, 5)]
    cursor.check_invariants()


def test_ack_range_across_a_ledger_boundary() -> None:
    cursor = fresh()
    for entry in range(10):
        cursor.ack(P(0, entry))
    assert cursor.acked_below == P(0, 10)
    cursor.ack(P(1, 0))  # the next ledger's first entry: not "right after" (0, 9) as far as we know
    assert cursor.acked_below == P(0, 10) and cursor.acked_ranges() == [(P(1, 0), P(1, 1))]
    cursor.ack_range(P(0, 10), P(1, 0))  # the tail of ledger 0, which the subscription read over
    assert cursor.acked_below == P(1, 1) and cursor.mark_delete_position == P(1, 0)
    assert cursor.acked_ranges() == []


def test_bound_at_a_ledger_start() -> None:
    cursor = Cursor(P(3, 9))
    cursor.ack_range(P(3, 10), P(4, 0))
    assert cursor.acked_below == P(4, 0)
    assert cursor.mark_delete_position == P(4, -1)  # Pulsar's "before the first entry of ledger 4"
    assert cursor.is_acked(P(3, 123456)) and not cursor.is_acked(P(4, 0))
    cursor.ack(P(4, 0))
    assert cursor.mark_delete_position == P(4, 0)


def test_ledger_ids_may_jump() -> None:
    cursor = Cursor(P(3, 4))
    cursor.ack(P(7, 1))
    cursor.ack(P(7, 0))
    cursor.ack_range(P(3, 5), P(7, 0))
    assert cursor.mark_delete_position == P(7, 1) and cursor.acked_ranges() == []


def test_ranges_merge_when_touching_or_overlapping() -> None:
    cursor = fresh()
    cursor.ack_range(P(0, 10), P(0, 20))
    cursor.ack_range(P(0, 30), P(0, 40))
    cursor.ack_range(P(0, 20), P(0, 25))  # touches the first
    assert cursor.acked_ranges() == [(P(0, 10), P(0, 25)), (P(0, 30), P(0, 40))]
    assert not cursor.ack_range(P(0, 12), P(0, 18))  # covered already
    cursor.ack_range(P(0, 24), P(0, 31))  # bridges both
    assert cursor.acked_ranges() == [(P(0, 10), P(0, 40))]
    cursor.ack_range(P(0, 5), P(2, 0))  # swallows it
    assert cursor.acked_ranges() == [(P(0, 5), P(2, 0))]
    assert not cursor.ack_range(P(0, 7), P(0, 7))  # empty
    cursor.check_invariants()


def test_ack_cumulative() -> None:
    cursor = fresh()
    cursor.ack_range(P(0, 3), P(0, 6))
    cursor.ack_range(P(0, 8), P(0, 9))
    cursor.ack(P(0, 12), 1, 3)
    assert cursor.ack_cumulative(P(0, 4))  # lands inside [3, 6): merges it
    assert cursor.acked_below == P(0, 6) and cursor.acked_ranges() == [(P(0, 8), P(0, 9))]
    assert not cursor.ack_cumulative(P(0, 2))
    assert cursor.ack_cumulative(P(0, 20))
    assert cursor.acked_ranges() == [] and cursor.stats().partially_acked_batches == 0
    cursor.check_invariants()


def test_seek_is_inclusive_and_clears_individual_acks() -> None:
    cursor = fresh()
    for entry in range(5):
        cursor.ack(P(0, entry))
    cursor.ack(P(0, 7))
    cursor.ack(P(0, 9), 0, 2)
    cursor.seek(P(0, 3))  # backwards: (0, 3) is delivered again
    assert cursor.acked_below == P(0, 3) and not cursor.is_acked(P(0, 3)) and cursor.is_acked(P(0, 2))
    assert cursor.acked_ranges() == [] and cursor.partial_batch(P(0, 9)) is None
    cursor.seek(P(0, 50))  # forwards: skips
    assert cursor.is_acked(P(0, 49)) and not cursor.is_acked(P(0, 50))
    cursor.seek(EARLIEST)
    assert cursor.mark_delete_position == EARLIEST


# --- batches -----------------------------------------------------------------------------------


def test_batch_index_acks() -> None:
    cursor = fresh()
    position = P(0, 2)
    assert cursor.ack(position, 3, 4)
    assert cursor.partial_batch(position) == (4, 0b0111)  # Pulsar ack set: TTTF
    assert cursor.is_acked(position, 3) and not cursor.is_acked(position, 2) and not cursor.is_acked(position)
    assert not cursor.ack(position, 3, 4)
    assert cursor.unacked_indexes(position, 4) == [0, 1, 2]
    assert cursor.unacked_indexes(P(0, 3), 2) == [0, 1]
    with pytest.raises(InvalidArgument):
        cursor.ack(position, 1, 5)  # batch size disagrees
    for index in (0, 1, 2):
        cursor.ack(position, index, 4)
    assert cursor.is_acked(position) and cursor.partial_batch(position) is None
    assert cursor.acked_ranges() == [(P(0, 2), P(0, 3))]
    assert cursor.unacked_indexes(position, 4) == []


def test_whole_entry_ack_and_ranges_drop_batch_state() -> None:
    cursor = fresh()
    cursor.ack(P(0, 1), 0, 2)
    cursor.ack(P(0, 5), 0, 2)
    cursor.ack(P(0, 1))
    assert cursor.partial_batch(P(0, 1)) is None
    cursor.ack_range(P(0, 4), P(0, 6))
    assert cursor.stats().partially_acked_batches == 0
    cursor.ack(P(0, 0), 0, 2)
    cursor.ack(P(0, 0), 1, 2)  # completes the batch at the bound: compaction
    assert cursor.mark_delete_position == P(0, 1)
    cursor.check_invariants()


def test_acked_indexes_of_a_pulsar_ack_set() -> None:
    assert acked_indexes(0b0111, 4) == [3]  # TTTF
    assert acked_indexes(0b1011, 4) == [2]  # TTFT
    assert acked_indexes(0, 3) == [0, 1, 2]


# --- helpers -----------------------------------------------------------------------------------


def test_position_helpers() -> None:
    assert next_position(P(3, 9)) == P(3, 10)
    assert position_before(P(3, 10)) == P(3, 9)
    assert position_before(P(4, 0)) == P(4, -1)
    assert position_before(next_position(EARLIEST)) == EARLIEST
    gaps = gaps_between(P(3, 8), [P(3, 8), P(3, 10), P(5, 0), P(5, 1)])
    assert gaps == [(P(3, 9), P(3, 10)), (P(3, 11), P(5, 0))]
    with pytest.raises(InvalidArgument):
        gaps_between(P(3, 8), [P(3, 9), P(3, 9)])


def test_reading_from_earliest_acks_the_leading_gap() -> None:
    cursor = Cursor()  # EARLIEST: the first entry's position is not known in advance
    read = [P(2, 0), P(2, 1), P(2, 3)]  # (2, 2) is a marker the read skipped
    for start, end in gaps_between(cursor.acked_below, read):
        cursor.ack_range(start, end)
    for position in read:
        cursor.ack(position)
    assert cursor.mark_delete_position == P(2, 3) and cursor.acked_ranges() == []


def test_invalid_arguments() -> None:
    cursor = fresh()
    with pytest.raises(InvalidArgument):
        cursor.ack((0, 1))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        cursor.ack(P(0, 1), 2, 2)
    with pytest.raises(InvalidArgument):
        cursor.ack(P(0, 1), 0, None)
    with pytest.raises(InvalidArgument):
        cursor.ack_range(P(0, 5), P(0, 4))


# --- memory ------------------------------------------------------------------------------------


def test_in_order_acks_keep_memory_flat() -> None:
    cursor = fresh()
    for entry in range(1_000_000):
        cursor.ack(P(0, entry))
    assert cursor.stats().acked_ranges == 0 and cursor.mark_delete_position == P(0, 999_999)


def test_acks_slightly_out_of_order_stay_compact() -> None:
    cursor = fresh()
    rng = random.Random(7)
    entries = list(range(100_000))
    for block in range(0, len(entries), 50):  # shuffled within windows of 50 (prefetch-like)
        window = entries[block:block + 50]
        rng.shuffle(window)
        for entry in window:
            cursor.ack(P(0, entry))
        assert cursor.stats().acked_ranges <= 25
    assert cursor.stats().acked_ranges == 0 and cursor.acked_below == P(0, 100_000)


def test_in_order_acks_over_ledgers_without_gap_acks_keep_one_range_per_ledger() -> None:
    cursor = fresh()
    for ledger in range(3):
        for entry in range(1000):
            cursor.ack(P(ledger, entry))
    assert cursor.stats().acked_ranges == 2  # ledger tails not acked: bound stuck, memory flat


# --- persistence -------------------------------------------------------------------------------


def test_snapshot_round_trip() -> None:
    cursor = fresh()
    cursor.ack(P(0, 0))
    cursor.ack_range(P(0, 5), P(1, 0))
    cursor.ack(P(1, 3), 70, 100)  # wider than 64 bits
    snapshot = cursor.snapshot()
    restored = Cursor.from_snapshot(decode_snapshot(encode_snapshot(snapshot)))
    assert restored.snapshot() == snapshot
    assert restored.partial_batch(P(1, 3)) == cursor.partial_batch(P(1, 3))
    assert restored.is_acked(P(0, 7)) and not restored.is_acked(P(0, 2))


def test_corrupt_snapshots_are_refused() -> None:
    with pytest.raises(CorruptLedger):
        decode_snapshot(b"\x93garbage", "subs/x/cursor")
    overlapping = CursorSnapshot(P(0, 0), ((P(0, 3), P(0, 6)), (P(0, 5), P(0, 9))))
    with pytest.raises(CorruptLedger):
        Cursor.from_snapshot(overlapping)
    touching_bound = CursorSnapshot(P(0, 3), ((P(0, 3), P(0, 6)),))
    with pytest.raises(CorruptLedger):
        Cursor.from_snapshot(touching_bound)
    full_batch = CursorSnapshot(P(0, 0), (), (BatchAckState(P(0, 4), 2, b"\x03"),))
    with pytest.raises(CorruptLedger):
        Cursor.from_snapshot(full_batch)
    wrong_type = msgspec.msgpack.encode({"acked_below": "x"})
    with pytest.raises(CorruptLedger):
        decode_snapshot(wrong_type)


# --- properties --------------------------------------------------------------------------------

LEDGERS = (0, 1, 3)
ENTRIES = 6
GRID = [P(ledger, entry) for ledger in LEDGERS for entry in range(ENTRIES)]
BOUNDARIES = [*GRID, P(0, 6), P(1, 6), P(2, 0), P(3, 6), P(4, 0), P(1, 20)]


def batch_size(position: Position) -> int:
    return 1 + (position.ledger_id + position.entry_id) % 3


def indexes_of(position: Position) -> set[tuple[Position, int]]:
    return {(position, index) for index in range(batch_size(position))}


positions = st.sampled_from(GRID)
operations = st.one_of(
    st.tuples(st.just("ack"), positions),
    st.tuples(st.just("index"), positions, st.integers(0, 2)),
    st.tuples(st.just("range"), st.sampled_from(BOUNDARIES), st.sampled_from(BOUNDARIES)),
    st.tuples(st.just("cumulative"), positions),
)


def run(cursor: Cursor, model: set[tuple[Position, int]], operation: tuple) -> None:
    kind = operation[0]
    if kind == "ack":
        cursor.ack(operation[1])
        model |= indexes_of(operation[1])
    elif kind == "index":
        position, index = operation[1], operation[2] % batch_size(operation[1])
        cursor.ack(position, index, batch_size(position))
        model.add((position, index))
    elif kind == "range":
        start, end = sorted(operation[1:])
        cursor.ack_range(start, end)
        for position in GRID:
            if start <= position < end:
                model |= indexes_of(position)
    elif kind == "cumulative":
        cursor.ack_cumulative(operation[1])
        for position in GRID:
            if position <= operation[1]:
                model |= indexes_of(position)
    elif kind == "seek":
        cursor.seek(operation[1])
        model.clear()
        for position in GRID:
            if position < operation[1]:
                model |= indexes_of(position)


def assert_matches(cursor: Cursor, model: set[tuple[Position, int]]) -> None:
    cursor.check_invariants()
    for position in GRID:
        assert cursor.is_acked(position) == (indexes_of(position) <= model), position
        for position_index in indexes_of(position):
            assert cursor.is_acked(*position_index) == (position_index in model), position_index


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(operations, st.tuples(st.just("seek"), st.sampled_from(BOUNDARIES))),
                min_size=5, max_size=40))
def test_cursor_matches_a_set_model(ops: list[tuple]) -> None:
    cursor = fresh()
    model: set[tuple[Position, int]] = set()
    for operation in ops:
        run(cursor, model, operation)
        assert_matches(cursor, model)
    restored = Cursor.from_snapshot(decode_snapshot(encode_snapshot(cursor.snapshot())))
    assert_matches(restored, model)


@settings(max_examples=200, deadline=None)
@given(st.lists(operations, min_size=5, max_size=40), st.randoms(use_true_random=False))
def test_representation_is_canonical(ops: list[tuple], rng: random.Random) -> None:
    """Acks commute, so any order gives the same acked set - and, the representation being
    canonical (ranges merged as far as possible), the same snapshot."""
    forward, shuffled = fresh(), fresh()
    model: set[tuple[Position, int]] = set()
    for operation in ops:
        run(forward, model, operation)
    reordered = list(ops)
    rng.shuffle(reordered)
    for operation in reordered:
        run(shuffled, set(), operation)
    assert forward.snapshot() == shuffled.snapshot()


def test_acking_everything_in_any_order_with_gap_ranges_compacts_fully() -> None:
    rng = random.Random(3)
    for _ in range(50):
        cursor = fresh()
        work: list[tuple] = [("ack", position) for position in GRID]
        work += [("range", P(0, 6), P(1, 0)), ("range", P(1, 6), P(3, 0))]
        rng.shuffle(work)
        for operation in work:
            run(cursor, set(), operation)
        assert cursor.acked_ranges() == [] and cursor.mark_delete_position == P(3, 5)
