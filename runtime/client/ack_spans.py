"""A consumer's individual acks, held as spans of batch indexes until their group is sent.

A span ``[ledger_id, entry_id, batch_size, first_index, last_index]`` stands for the acks of
indexes ``first..last`` of one entry. A consumer acking in order extends the newest span (the next
index of the same entry) instead of keeping a tuple per message, so a group of 5,000 acks of
entries of 800 messages is a handful of spans. When the group is sent, ``coalesce_spans`` turns
its spans into what the subscription takes: ranges of whole entries and runs of the indexes left.

Before, every ack was a ``(Position, index, size)`` tuple, and the send went over every one of
them twice in Python (into sets per entry, then back into runs): about a microsecond a message on
the client's loop thread, which shares the GIL with the thread calling ``receive``.

``HeldBatch`` holds a txn's async acks of one batch entry until the entry is whole or the txn
commits, as a run of indexes while they come in order.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raytxn.ids import Position
from raytxn.protocol.subscription_state import AckRange, IndexRun

if TYPE_CHECKING:
    from raytxn.client.transaction import Transaction

AckSpan = list[int]  # [ledger_id, entry_id, batch_size, first_index, last_index], mutable: extended in place


def extend_spans(spans: list[AckSpan], ledger_id: int, entry_id: int, batch_size: int, index: int) -> None:
    """Add the ack of ``index`` of an entry: extends the newest span when it is the next index of
    the same entry, else starts a span."""
    if spans:
        newest = spans[-1]
        if newest[4] + 1 == index and newest[1] == entry_id and newest[0] == ledger_id:
            newest[4] = index
            return
    spans.append([ledger_id, entry_id, batch_size, index, index])


def whole_entry_span(position: Position, batch_size: int) -> AckSpan:
    """The span of every message of an entry."""
    return [position.ledger_id, position.entry_id, batch_size, 0, batch_size - 1]


def coalesce_spans(spans: list[AckSpan]) -> tuple[list[AckRange], list[IndexRun]]:
    """Spans as (ranges of whole entries, runs of single batch indexes).

    An entry is whole when its spans cover every index, or when it holds one message (an ack of
    it is the whole entry, whatever index it names). Contiguous whole entries of a ledger make one
    range ``(ledger_id, first_entry_id, last_entry_id)``, ascending. The other entries give runs
    ``(ledger_id, entry_id, batch_size, first_index, last_index)`` of consecutive indexes, by entry
    in the order the entries were first acked, indexes ascending; overlapping and repeated acks
    merge. An entry's batch size is the one of its last span."""
    whole: set[tuple[int, int]] = set()
    partial: dict[tuple[int, int], tuple[int, list[tuple[int, int]]]] = {}
    for ledger_id, entry_id, batch_size, first, last in spans:
        key = (ledger_id, entry_id)
        if batch_size == 1 or (first == 0 and last + 1 >= batch_size):
            whole.add(key)
            continue
        known = partial.get(key)
        if known is None:
            partial[key] = (batch_size, [(first, last)])
        else:
            partial[key] = (batch_size, known[1])
            known[1].append((first, last))
    runs: list[IndexRun] = []
    for key, (batch_size, pieces) in partial.items():
        if key in whole:
            continue
        merged = _merged(pieces)
        if merged == [(0, batch_size - 1)]:
            whole.add(key)
        else:
            runs += [(key[0], key[1], batch_size, first, last) for first, last in merged]
    ranges: list[AckRange] = []
    for ledger_id, entry_id in sorted(whole):
        if ranges and ranges[-1][0] == ledger_id and ranges[-1][2] + 1 == entry_id:
            ranges[-1] = (ledger_id, ranges[-1][1], entry_id)
        else:
            ranges.append((ledger_id, entry_id, entry_id))
    return ranges, runs


def _merged(pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Index intervals, sorted, with overlapping and adjacent ones joined."""
    pieces.sort()
    merged = [pieces[0]]
    for first, last in pieces[1:]:
        low, high = merged[-1]
        if first <= high + 1:
            if last > high:
                merged[-1] = (low, last)
        else:
            merged.append((first, last))
    return merged


@dataclass
class HeldBatch:
    """A consumer's async acks in a txn of some messages of one batch entry, held until the txn
    acked them all (they then go as one whole-entry ack) or commits (see ``Consumer._queue_ack``).

    Acks come in index order almost always, so the indexes acked are held as one run
    ``[first, next)`` while they do, and as a set from the first ack out of that order: an ack in
    a txn then costs a comparison and an increment, where adding to a set cost about as much as
    the rest of the ack, and the commit sends the run as one span (it sorted the set)."""

    txn: Transaction
    partition: int
    ledger_id: int
    entry_id: int
    batch_size: int
    first: int = 0
    next: int = 0                  # the run is empty while next == first
    indexes: set[int] | None = None  # every index acked, once one came out of the run's order
    taken: bool = False            # sent: by the ack that completed it, or by the commit
    # One future for all of them: they go in one call (a whole-entry ack, or the indexes together
    # at commit), so they succeed or fail together, and a future per message cost as much as
    # the rest of the ack.
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def add(self, index: int) -> bool:
        """Hold the ack of ``index`` (again is nothing new); whether every index is now acked."""
        indexes = self.indexes
        if indexes is None:
            if index == self.next and self.next > self.first:
                self.next += 1
                return self.next - self.first == self.batch_size
            if self.next == self.first:
                self.first, self.next = index, index + 1
                return self.batch_size == 1
            if self.first <= index < self.next:
                return False
            indexes = self.indexes = set(range(self.first, self.next))
        indexes.add(index)
        return len(indexes) == self.batch_size

    def extend_run(self, index: int) -> bool:
        """Hold ``index`` when it is the run's next and does not complete the entry: the
        consumer's per-ack fast path, which takes ``add`` for everything else (this changes
        nothing then)."""
        if (index == self.next and self.indexes is None and not self.taken
                and index + 1 - self.first < self.batch_size):
            self.next = index + 1
            return True
        return False

    def acked(self) -> int:
        """How many indexes are held."""
        return self.next - self.first if self.indexes is None else len(self.indexes)

    def spans(self) -> list[AckSpan]:
        """The indexes held, as spans of consecutive ones, ascending."""
        spans: list[AckSpan] = []
        if self.indexes is None:
            if self.next > self.first:
                spans.append([self.ledger_id, self.entry_id, self.batch_size, self.first, self.next - 1])
            return spans
        for index in sorted(self.indexes):
            extend_spans(spans, self.ledger_id, self.entry_id, self.batch_size, index)
        return spans
