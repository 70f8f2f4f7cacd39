"""A consumer's acks held as spans give the subscription exactly what one tuple per ack gave.

The oracle is the coalescing the consumer did before spans (one ``(Position, index, size)`` per
ack, gathered into sets per entry, then back into runs), kept here as it was."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.client.ack_spans import coalesce_spans, extend_spans, whole_entry_span
from raytxn.ids import Position


def coalesce_acks_reference(acks: list[tuple[Position, int | None, int]]) -> tuple[list, list]:
    whole: set[Position] = set()
    indexes: dict[Position, set[int]] = {}
    sizes: dict[Position, int] = {}
    for position, batch_index, batch_size in acks:
        if batch_index is None or batch_size == 1:
            whole.add(position)
        else:
            indexes.setdefault(position, set()).add(batch_index)
            sizes[position] = batch_size
    partial: list[tuple[Position, int, int]] = []
    for position, seen in indexes.items():
        if position in whole:
            continue
        if len(seen) == sizes[position]:
            whole.add(position)
        else:
            partial += [(position, index, sizes[position]) for index in sorted(seen)]
    ranges: list[tuple[int, int, int]] = []
    for position in sorted(whole):
        if ranges and ranges[-1][0] == position.ledger_id and ranges[-1][2] + 1 == position.entry_id:
            ranges[-1] = (position.ledger_id, ranges[-1][1], position.entry_id)
        else:
            ranges.append((position.ledger_id, position.entry_id, position.entry_id))
    runs: list[tuple[int, int, int, int, int]] = []
    for position, batch_index, batch_size in partial:
        if runs:
            ledger_id, entry_id, size, first, last = runs[-1]
            if (ledger_id, entry_id) == (position.ledger_id, position.entry_id) and last + 1 == batch_index:
                runs[-1] = (ledger_id, entry_id, size, first, batch_index)
                continue
        runs.append((position.ledger_id, position.entry_id, batch_size, batch_index, batch_index))
    return ranges, runs


def spans_of(acks: list[tuple[Position, int | None, int]]) -> list[list[int]]:
    """The spans the consumer keeps for these acks, queued in this order."""
    spans: list[list[int]] = []
    for position, batch_index, batch_size in acks:
        if batch_index is None:
            spans.append(whole_entry_span(position, batch_size))
        else:
            extend_spans(spans, position.ledger_id, position.entry_id, batch_size, batch_index)
    return spans


# Entries of two ledgers, each with its own batch size; an ack names an entry and one of its
# indexes, or the whole entry (None), and may repeat.
SIZES = {(ledger, entry): 1 + (ledger * 7 + entry * 3) % 6 for ledger in (0, 1) for entry in range(8)}
ack = st.sampled_from(sorted(SIZES)).flatmap(
    lambda key: st.tuples(st.just(Position(*key)),
                          st.one_of(st.none(), st.integers(0, SIZES[key] - 1)),
                          st.just(SIZES[key])))


@settings(max_examples=600, deadline=None)
@given(st.lists(ack, max_size=60), st.booleans())
def test_spans_coalesce_as_the_acks_one_by_one_did(acks: list, in_order: bool) -> None:
    if in_order:  # a consumer acking what it received, in order: the common case spans are for
        acks = sorted(acks, key=lambda a: (a[0], -1 if a[1] is None else a[1]))
    assert coalesce_spans(spans_of(acks)) == coalesce_acks_reference(acks)


def test_acks_in_order_of_whole_entries_are_one_span_each_and_one_range() -> None:
    acks = [(Position(3, entry), index, 800) for entry in (10, 11, 12) for index in range(800)]
    spans = spans_of(acks)
    assert spans == [[3, entry, 800, 0, 799] for entry in (10, 11, 12)]
    assert coalesce_spans(spans) == ([(3, 10, 12)], [])


def test_a_gap_leaves_runs_around_it_and_a_repeat_merges() -> None:
    acks = [(Position(0, 5), index, 10) for index in (0, 1, 2, 2, 1, 5, 6, 9)]
    spans = spans_of(acks)
    assert len(spans) == 5  # 0-2, 2, 1, 5-6, 9: a repeat starts a span; coalescing merges them
    assert coalesce_spans(spans) == ([], [(0, 5, 10, 0, 2), (0, 5, 10, 5, 6), (0, 5, 10, 9, 9)])


def test_an_entry_acked_out_of_order_until_complete_is_whole() -> None:
    acks = [(Position(0, 1), index, 4) for index in (3, 1, 0, 2)] + [(Position(0, 2), 0, 1)]
    assert coalesce_spans(spans_of(acks)) == ([(0, 1, 2)], [])
