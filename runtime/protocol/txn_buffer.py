"""The pure transaction buffer of one partition (Pulsar's TopicTransactionBuffer).

Every entry of the partition ledger is a DATA entry (a producer batch, plain or in a transaction)
or a COMMIT/ABORT marker of one transaction (``entry_format``). This state machine decides what
the partition actor writes and, from the positions the writes landed at, what readers may see.

Style of Kafka's ``TransactionMetadata``: ``prepare_*`` validates a request and returns a decision
without touching durable state; the actor writes the entry (or entries) to the ledger; once durable
it calls ``apply`` with each entry's header and position, in ledger order. ``apply`` is the only
mutator of durable state and is also what replays the ledger after a restart, so a buffer rebuilt
from ``snapshot + the entries after it`` equals the live one.

Durable state (in every snapshot, and rebuilt by replay):

* ``ongoing``: txn -> its first position here, the entry just before that one, when it started;
  in insertion order (= order of first positions, since entries apply in ledger order).
* ``aborted``: txn -> (first position, ABORT marker position); data of the txn in that range is
  hidden forever. Pruned once retention deleted the ledger holding the marker.
* ``max_read_position``: the entry just before the first ongoing txn's first entry, or the last
  entry when nothing is ongoing. Markers and aborted data count as entries: readers skip them, so
  they never hold readers back. Never moves backwards.
* the dedup table (producer -> highest sequence id and the entry that carried it; LRU-bounded),
  and per coordinator the highest low watermark that came with a marker.

No per-message data: committed transactions leave no trace, so memory does not grow with traffic.

Volatile state (lost on restart, which is safe because after a restart everything in it is either
durable or retried by its sender): entries prepared but not yet applied (so a retried send racing
its original is still a duplicate, and an end racing a txn's first append still writes a marker),
ends prepared but not yet applied (no appends to a txn whose marker is on its way), and low
watermarks heard without a marker (they only make late appends fail earlier).

Contract for the caller (the partition actor):

* Apply every entry of the ledger, in ledger order, each exactly once. Positions are checked: an
  entry id must follow the previous one in its ledger, or be 0 in a later ledger.
* Issue the ledger append right after a successful prepare, with no await in between, so ledger
  order is prepare order. If an append fails or times out, the buffer no longer matches the ledger:
  stop serving and recover from the ledger (a new incarnation). ``cancel_append`` is only for an
  entry that certainly was not handed to the ledger (rejected before queuing).
* ``publish_time_ms`` of headers is stamped by the actor's clock; a txn's age is measured from the
  publish time of its first entry here, so replay restores it.

Sequence rule (a producer may have several appends in flight per partition, Kafka's
``max.in.flight`` with idempotence). A producer numbers its batches for this partition
contiguously and says, with each append, ``previous_sequence``: the last sequence id of the batch
it sent here just before this one and has not yet seen acknowledged (-1 when every earlier batch
is acknowledged, or given up after a final error). Let ``highest`` be the producer's highest
sequence id stored or prepared here (-1 when unknown). Then, in this order:

1. ``last_sequence <= highest``: a DUPLICATE (a retry); acknowledged with the original position
   when it is the producer's latest entry. Also after the txn of the original ended.
2. ``first_sequence <= highest``: overlaps what was written: ``InvalidArgument``.
3. ``previous_sequence > highest``: the batch it follows has not arrived (it is in flight behind
   this one, or failed and is being resent): ``OutOfOrderSequence`` (retriable), nothing changes.
   The producer resends in order, with the same sequence ids, so a stored batch is never followed
   by one sent before it, and no sequence id is stored twice.
4. otherwise OK. A gap (``first_sequence > highest + 1`` with ``previous_sequence <= highest``) is
   allowed: the range of a batch that failed for good is never reused, and a producer whose entry
   the LRU-bounded dedup table evicted continues where it was.

Epoch rule (Kafka's producer epochs, per partition). Sequence ids count within an epoch of the
producer's name. A producer incarnation asks ``init_producer`` for its epoch: one above every
epoch known here for the name, stored, being stored or handed out. Its sequences start at 0 there.
An append of an older epoch than the newest known is ``Fenced``: a dead or stalled incarnation's
append still on its way (in the network, or waiting for its predecessor under rule 3) can neither
land after its successor began nor make the successor's batch of the same sequence ids a false
DUPLICATE (acknowledged, never stored). The sequence rule above applies within the append's
epoch; a newer epoch's first append starts from nothing (``highest`` = -1). An epoch handed out
but not yet in a stored entry is volatile: after a restart, a late append of the older epoch can
land before the successor's first one. It is then simply stored (its sequences are its epoch's),
and the successor's batches, of the newer epoch, neither collide with it nor are fenced by it.
Producers that never ask (epoch 0 throughout) keep the sequence rule alone.

Epochs are never handed out twice. The partition passes its ledger's writer incarnation (durable,
and higher for every new incarnation); epochs start above it shifted left by ``EPOCH_FLOOR_SHIFT``
bits, and
epochs rise across all names within an incarnation. Without the floor, a partition that restarted
after handing out epoch 2 (volatile) knew only epoch 1: the dead incarnation's client stored
sequences 0..1 in epoch 2, and its successor, handed epoch 2 again, had 0..2 refused as an overlap
(``raytxn sim --seed 2002810 --seeds 1 --faults zombie-appends``), and would have had a batch of
0..1 acknowledged as a duplicate without being stored. Without the rise across names, an epoch
evicted from the bounded table of handed-out ones could be handed out again.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from raytxn import testing_bugs
from raytxn.errors import (
    CorruptLedger,
    Fenced,
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    OutOfOrderSequence,
    TransactionAlreadyAborted,
)
from raytxn.ids import EARLIEST, Position, TxnID
from raytxn.protocol.entry_format import EntryHeader, marker_header
from raytxn.protocol.offsets import DEFAULT_INDEX_INTERVAL, OffsetIndex, OffsetSnapshot
from raytxn.protocol.txnlog import EndAction, end_action

DEFAULT_MAX_PRODUCERS = 10_000
# A partition incarnation's epochs start above its writer incarnation << this: room for 2**32
# epochs per incarnation, and each incarnation's above every epoch an earlier one handed out.
EPOCH_FLOOR_SHIFT = 32


class AppendStatus(enum.StrEnum):
    OK = "ok"  # write the entry, then apply it
    DUPLICATE = "duplicate"  # a retried send: do not write; acknowledge with ``position``


class AppendDecision(msgspec.Struct, frozen=True):
    """Answer of ``prepare_append``. For a DUPLICATE, ``position`` is the entry that carried the
    original when it is the producer's latest entry, else None; ``in_flight`` says the original
    is prepared but not applied yet (its position comes when its own append completes)."""

    status: AppendStatus
    position: Position | None = None
    in_flight: bool = False

    @property
    def duplicate(self) -> bool:
        return self.status is AppendStatus.DUPLICATE


class EndDecision(msgspec.Struct, frozen=True):
    """Answer of ``prepare_end`` / ``prepare_dangling``: the markers to write, one entry each.

    ``write_marker``: ``txn`` needs an ``action`` marker here (False: this partition never saw a
    txn being committed, or already ended it - the end is acknowledged at once, idempotently).
    ``dangling``: ongoing txns of the same coordinator at or below ``low_watermark``; their end
    message was lost, the coordinator has forgotten them, so they get an ABORT marker."""

    tc_id: int
    low_watermark: int
    txn: TxnID | None
    action: EndAction | None
    write_marker: bool
    dangling: tuple[TxnID, ...]

    def markers(self, publish_time_ms: int) -> list[EntryHeader]:
        """Marker headers to append, in this order (dangling aborts first, oldest first)."""
        headers = [marker_header(EndAction.ABORT, txn, publish_time_ms, self.low_watermark)
                   for txn in self.dangling]
        if self.write_marker:
            assert self.txn is not None and self.action is not None
            headers.append(marker_header(self.action, self.txn, publish_time_ms, self.low_watermark))
        return headers


class OngoingTxn(msgspec.Struct, frozen=True, array_like=True):
    """An open transaction on this partition. ``before_position`` is the entry applied just before
    ``first_position`` (EARLIEST if none); ``entries_before`` counts the entries applied before it
    (for the exact lag); ``first_offset`` is its first entry's Kafka offset (the last stable
    offset while it is the oldest; None in snapshots from before offsets)."""

    txn: TxnID
    first_position: Position
    before_position: Position
    entries_before: int
    start_ms: int
    first_offset: int | None = None


class AbortedTxn(msgspec.Struct, frozen=True, array_like=True):
    """An aborted transaction: its data in ``first_position..marker_position`` is hidden. For an
    abort of a txn never seen here (a fence against late appends), both are the marker.
    ``first_offset``/``marker_offset``: the same span in Kafka offsets (Kafka's aborted-transactions
    list of a fetch; None in snapshots from before offsets)."""

    txn: TxnID
    first_position: Position
    marker_position: Position
    first_offset: int | None = None
    marker_offset: int | None = None


class HiddenSpans:
    """Aborted spans indexed by txn: the per-entry test a reader below ``max_read_position`` needs
    (``TransactionBuffer.is_visible``'s rule there, where every txn has ended) without scanning
    every span per entry. Used by the bulk range reader and by compaction."""

    def __init__(self, aborted: Sequence[AbortedTxn]) -> None:
        self._spans: dict[TxnID, list[tuple[Position, Position]]] = {}
        for entry in aborted:
            if not isinstance(entry, AbortedTxn) or entry.first_position > entry.marker_position:
                raise InvalidArgument(f"not an aborted txn span: {entry!r}")
            self._spans.setdefault(entry.txn, []).append((entry.first_position, entry.marker_position))

    def hides(self, txn: TxnID | None, position: Position) -> bool:
        spans = self._spans.get(txn) if txn is not None else None
        return bool(spans) and any(first <= position <= marker for first, marker in spans)


class DedupEntry(msgspec.Struct, frozen=True, array_like=True):
    producer: str
    last_sequence: int
    position: Position  # the entry that carried ``last_sequence``
    epoch: int = 0  # the producer epoch of that entry (0 in snapshots from before epochs)


class TxnBufferSnapshot(msgspec.Struct, frozen=True):
    """The durable state. ``last_position`` is the last entry it covers: recovery replays from the
    entry after it. Lists are in the buffer's own order (ongoing by first position, dedup least
    recently used first), so a restored buffer behaves exactly like the one snapshotted."""

    last_position: Position
    max_read_position: Position
    applied_entries: int
    ongoing: list[OngoingTxn]
    aborted: list[AbortedTxn]
    dedup: list[DedupEntry]
    low_watermarks: dict[int, int]
    offsets: OffsetSnapshot | None = None  # None: written before Kafka offsets existed


class TxnBufferStats(msgspec.Struct, frozen=True):
    """``lag_entries`` is exact: the entries after ``max_read_position`` up to ``last_position``
    (held back by the oldest ongoing txn, or 0)."""

    ongoing_txns: int
    aborted_txns: int
    ending_txns: int
    dedup_producers: int
    max_read_position: Position
    last_position: Position
    applied_entries: int
    lag_entries: int
    oldest_ongoing: TxnID | None
    oldest_ongoing_age_ms: int | None


def _check_data_header(header: EntryHeader) -> None:
    if header.kind != "data":
        raise InvalidArgument(f"expected a data entry header, got {header.kind!r}")
    if header.count < 1 or not 0 <= header.first_sequence <= header.last_sequence or not header.producer:
        raise InvalidArgument(f"malformed data header {header!r}: need a producer, count >= 1 and "
                              "0 <= first_sequence <= last_sequence")


class TransactionBuffer:
    """Ongoing and aborted txns, max read position and dedup table of one partition."""

    def __init__(self, *, max_producers: int = DEFAULT_MAX_PRODUCERS,
                 offset_index_interval: int = DEFAULT_INDEX_INTERVAL) -> None:
        if max_producers < 1:
            raise InvalidArgument("max_producers must be >= 1")
        self.max_producers = max_producers
        # --- durable ---
        self._last_position = EARLIEST
        self._max_read_position = EARLIEST
        self._applied_entries = 0
        self._ongoing: OrderedDict[TxnID, OngoingTxn] = OrderedDict()
        self._aborted: dict[TxnID, AbortedTxn] = {}
        self._dedup: OrderedDict[str, DedupEntry] = OrderedDict()  # least recently used first
        self._low_watermarks: dict[int, int] = {}  # from markers only, so replay relearns them
        self.offsets = OffsetIndex(interval=offset_index_interval)  # Kafka offsets, stamped via ``stamp``
        # --- volatile ---
        # producer -> (epoch, last sequence) of prepared appends, ascending
        self._pending_sequences: dict[str, list[tuple[int, int]]] = {}
        # producer -> an epoch ``init_producer`` handed out, until an entry of it is applied
        # (least recently handed out first; bounded like the dedup table)
        self._handed_epochs: OrderedDict[str, int] = OrderedDict()
        self._last_handed_epoch = 0  # of any name: epochs rise across names (never handed out twice)
        self._pending_appends: dict[TxnID, int] = {}  # txn -> prepared, unapplied data entries
        self._ending: dict[TxnID, EndAction] = {}  # marker prepared, not applied yet
        self._heard_low_watermarks: dict[int, int] = {}

    # --- queries ---------------------------------------------------------------------------

    @property
    def last_position(self) -> Position:
        """The last entry applied (EARLIEST when none)."""
        return self._last_position

    @property
    def max_read_position(self) -> Position:
        """Readers may read up to and including this position, never past it."""
        return self._max_read_position

    @property
    def lag_entries(self) -> int:
        """Entries applied after ``max_read_position``: held back from readers by the oldest
        ongoing txn (0 when none is ongoing)."""
        head = next(iter(self._ongoing.values()), None)
        return self._applied_entries - head.entries_before if head else 0

    @property
    def last_stable_offset(self) -> int:
        """Kafka's last stable offset: the first offset of the oldest ongoing txn, or the next
        offset when none is ongoing (every offset below it is at or below max_read_position). An
        ongoing txn from a snapshot before offsets has no first offset: then the next offset at
        the snapshot's end, the lowest it can be, is not known either, and 0 is answered."""
        head = next(iter(self._ongoing.values()), None)
        if head is None:
            return self.offsets.next_offset
        return head.first_offset if head.first_offset is not None else 0

    def stamp(self, header: EntryHeader) -> EntryHeader:
        """``header`` with its Kafka base offset, for the entry handed to the ledger right now
        (``protocol.offsets``); ``unstamp`` it if the ledger refuses it before queuing."""
        return self.offsets.stamp(header)

    def unstamp(self, header: EntryHeader) -> None:
        self.offsets.unstamp(header)

    def ongoing_txns(self) -> list[TxnID]:
        return list(self._ongoing)

    def ongoing(self, limit: int) -> list[OngoingTxn]:
        """The oldest ``limit`` ongoing txns, oldest first (Kafka's DescribeProducers)."""
        return list(itertools.islice(self._ongoing.values(), limit))

    def recent_producers(self, limit: int) -> list[DedupEntry]:
        """The dedup entries of the ``limit`` producers that appended last, the latest first."""
        return list(itertools.islice(reversed(self._dedup.values()), limit))

    def ongoing_coordinators(self) -> list[int]:
        """Coordinators with txns open here: ask each for its low watermark now and then (and
        right after recovery) and pass it to ``prepare_dangling``."""
        return sorted({txn.tc_id for txn in self._ongoing})

    def ongoing_first_position(self, txn: TxnID) -> Position | None:
        entry = self._ongoing.get(txn)
        return entry.first_position if entry else None

    def aborted_marker(self, txn: TxnID) -> Position | None:
        entry = self._aborted.get(txn)
        return entry.marker_position if entry else None

    def low_watermark(self, tc_id: int) -> int:
        """Highest low watermark known for coordinator ``tc_id`` (durable or heard); -1 if none."""
        return max(self._low_watermarks.get(tc_id, -1), self._heard_low_watermarks.get(tc_id, -1))

    def dedup_position(self, producer: str) -> tuple[int, Position] | None:
        entry = self._dedup.get(producer)
        return (entry.last_sequence, entry.position) if entry else None

    def highest_sequence(self, producer: str) -> int:
        """The producer's highest sequence id stored *or being stored* here in its newest epoch
        (-1 if none is known). An append prepared but not durable yet counts: continuing at its
        sequence would collide with it (an overlap refused, or, for the same range, a duplicate
        acknowledged for messages never stored)."""
        return self._highest_in_epoch(producer, self.producer_epoch(producer))

    def _highest_in_epoch(self, producer: str, epoch: int) -> int:
        _known, persisted, highest_pending = self._in_epoch(producer, epoch)
        return max(persisted, highest_pending)

    def _in_epoch(self, producer: str, epoch: int) -> tuple[DedupEntry | None, int, int]:
        """The producer's dedup entry, its last sequence if of ``epoch`` (else -1), and its
        highest prepared sequence of ``epoch`` (else -1), for ``epoch`` at least the newest known:
        prepared appends are ascending in (epoch, sequence), so that epoch's are at the tail."""
        known = self._dedup.get(producer)
        persisted = known.last_sequence if known is not None and known.epoch == epoch else -1
        pending = self._pending_sequences.get(producer)
        highest_pending = pending[-1][1] if pending and pending[-1][0] == epoch else -1
        return known, persisted, highest_pending

    def producer_epoch(self, producer: str) -> int:
        """The newest epoch known here for ``producer``: stored, being stored, or handed out
        (0 if none)."""
        known = self._dedup.get(producer)
        pending = self._pending_sequences.get(producer)
        return max(known.epoch if known is not None else 0, pending[-1][0] if pending else 0,
                   self._handed_epochs.get(producer, 0))

    def init_producer(self, producer: str, incarnation: int = 0) -> int:
        """A new incarnation of ``producer``: its epoch here, above every one known and above the
        floor of the partition's writer ``incarnation``, which fences the older ones at once
        (volatile until an entry of it is stored; see the epoch rule)."""
        if not producer or type(producer) is not str:
            raise InvalidArgument(f"a producer is a non-empty name, got {producer!r}")
        if type(incarnation) is not int or incarnation < 0:
            raise InvalidArgument(f"the incarnation of an epoch floor is an int >= 0, got {incarnation!r}")
        floor = incarnation << EPOCH_FLOOR_SHIFT
        epoch = max(self.producer_epoch(producer), self._last_handed_epoch, floor) + 1
        self._last_handed_epoch = epoch
        self._handed_epochs.pop(producer, None)
        self._handed_epochs[producer] = epoch
        while len(self._handed_epochs) > self.max_producers:
            self._handed_epochs.popitem(last=False)
        return epoch

    def aborted_between(self, start: Position, end: Position) -> list[AbortedTxn]:
        """The aborted txns whose hidden span ``first_position..marker_position`` meets
        ``start..end``: all a range reader needs (``raytxn.ledger.ranges``) to hide their data."""
        return sorted((entry for entry in self._aborted.values()
                       if entry.first_position <= end and start <= entry.marker_position),
                      key=lambda entry: entry.first_position)

    def is_visible(self, header: EntryHeader, position: Position) -> bool:
        """May a reader see the messages of the entry ``header`` at ``position``?"""
        if header.kind != "data" or position > self._max_read_position:
            return False
        if header.txn is None:
            return True
        aborted = self._aborted.get(header.txn)
        return aborted is None or not aborted.first_position <= position <= aborted.marker_position

    def txn_state(self, header: EntryHeader, position: Position) -> str:
        """What became of the data entry ``header`` at ``position`` (applied here): ``committed``
        (plain, or its txn committed), ``aborted`` (hidden by its txn's abort) or ``pending`` (its
        txn is still open here). A committed entry past ``max_read_position`` is still held back
        from readers by an older open txn (``is_visible`` says that)."""
        if header.kind != "data":
            raise InvalidArgument(f"txn_state is the state of a data entry, not of a {header.kind!r} marker")
        if header.txn is None:
            return "committed"
        aborted = self._aborted.get(header.txn)
        if aborted is not None and aborted.first_position <= position <= aborted.marker_position:
            return "aborted"
        ongoing = self._ongoing.get(header.txn)
        if ongoing is not None and position >= ongoing.first_position:
            return "pending"
        # Ended without an abort covering it: its COMMIT marker is applied (txn ids are never reused).
        return "committed"

    # --- appends ---------------------------------------------------------------------------

    def prepare_append(self, header: EntryHeader, previous_sequence: int = -1) -> AppendDecision:
        """Decide on a DATA entry: OK (then write it and ``apply`` it), DUPLICATE, or raise
        ``NotAllowed`` (txn ended, ending, or at/below its coordinator's low watermark),
        ``InvalidArgument`` (malformed, or sequences overlapping what was written) or
        ``OutOfOrderSequence`` (``previous_sequence``, the batch it follows, is not here yet; see
        the sequence rule above)."""
        _check_data_header(header)
        if type(previous_sequence) is not int or not -1 <= previous_sequence < header.first_sequence:
            raise InvalidArgument(f"previous_sequence must be an int in -1..{header.first_sequence - 1}, "
                                  f"got {previous_sequence!r}")
        epoch, newest = header.producer_epoch, self.producer_epoch(header.producer)
        if type(epoch) is not int or epoch < 0:
            raise InvalidArgument(f"producer epoch must be an int >= 0, got {epoch!r}")
        if epoch < newest:
            raise Fenced(f"producer {header.producer!r}: epoch {epoch} is fenced by its epoch {newest} here")
        known, persisted, highest_pending = self._in_epoch(header.producer, epoch)
        # Dedup first: a retried send whose original landed succeeds even if its txn ended since.
        if header.last_sequence <= persisted:
            assert known is not None
            position = known.position if header.last_sequence == persisted else None
            return AppendDecision(AppendStatus.DUPLICATE, position)
        if header.last_sequence <= highest_pending:
            return AppendDecision(AppendStatus.DUPLICATE, None, in_flight=True)
        highest = max(persisted, highest_pending)
        if header.first_sequence <= highest:
            raise InvalidArgument(f"producer {header.producer!r}: sequences {header.first_sequence}.."
                                  f"{header.last_sequence} overlap sequence {highest} already written")
        if previous_sequence > highest:
            raise OutOfOrderSequence(f"producer {header.producer!r}: sequences {header.first_sequence}.."
                                     f"{header.last_sequence} follow {previous_sequence}, but the highest "
                                     f"here is {highest}")
        txn = header.txn
        if txn is not None:
            if txn in self._ending:
                raise NotAllowed(f"{txn} is ending on this partition; no more appends")
            if txn in self._aborted:
                raise NotAllowed(f"{txn} was aborted on this partition")
            if txn.sequence <= self.low_watermark(txn.tc_id):
                raise NotAllowed(f"{txn} is at or below the low watermark {self.low_watermark(txn.tc_id)} "
                                 f"of coordinator {txn.tc_id}: it has ended")
            self._pending_appends[txn] = self._pending_appends.get(txn, 0) + 1
        self._pending_sequences.setdefault(header.producer, []).append((epoch, header.last_sequence))
        return AppendDecision(AppendStatus.OK)

    def cancel_append(self, header: EntryHeader) -> None:
        """Forget an OK'd append that was certainly not handed to the ledger."""
        pending = self._pending_sequences.get(header.producer)
        prepared = (header.producer_epoch, header.last_sequence)
        if pending and prepared in pending:
            pending.remove(prepared)
            if not pending:
                del self._pending_sequences[header.producer]
        if header.txn is not None:
            self._release_txn_append(header.txn)

    def _release_txn_append(self, txn: TxnID) -> None:
        count = self._pending_appends.get(txn, 0)
        if count > 1:
            self._pending_appends[txn] = count - 1
        else:
            self._pending_appends.pop(txn, None)

    def apply(self, header: EntryHeader, position: Position) -> None:
        """Apply one durable entry (live, or replaying the ledger)."""
        action = header.end_action
        if action is None:
            self.apply_append(header, position)
        else:
            assert header.txn is not None
            self.apply_end(header.txn, action, position, header.low_watermark, base_offset=header.base_offset)

    def apply_append(self, header: EntryHeader, position: Position) -> None:
        """A DATA entry became durable at ``position``."""
        _check_data_header(header)
        applied = (header.producer_epoch, header.last_sequence)
        pending = self._pending_sequences.get(header.producer)
        if pending:
            while pending and pending[0] <= applied:
                pending.pop(0)
            if not pending:
                del self._pending_sequences[header.producer]
        if self._handed_epochs.get(header.producer, -1) <= header.producer_epoch:
            self._handed_epochs.pop(header.producer, None)  # the stored entry carries it now
        before, entries_before, offset = self._advance(position, header.count, header.base_offset)
        known = self._dedup.pop(header.producer, None)
        if known is None or applied > (known.epoch, known.last_sequence):
            known = DedupEntry(header.producer, header.last_sequence, position, header.producer_epoch)
        self._dedup[header.producer] = known  # most recently used now
        while len(self._dedup) > self.max_producers:
            self._dedup.popitem(last=False)
        txn = header.txn
        if txn is not None:
            self._release_txn_append(txn)
            if txn not in self._ongoing:
                # Also for a txn ended before (a late append that slipped past the checks): it is
                # open again from here on, so the dangling sweep can abort just this part of it.
                self._ongoing[txn] = OngoingTxn(txn, position, before, entries_before, header.publish_time_ms,
                                                offset)
        self._update_max_read_position()

    # --- ends ------------------------------------------------------------------------------

    def prepare_end(self, txn: TxnID, action: EndAction | str, low_watermark: int) -> EndDecision:
        """Decide on an end message of ``txn`` that came with its coordinator's ``low_watermark``.

        Raises ``TransactionAlreadyAborted`` (commit of a txn aborted here) or
        ``InvalidTxnState`` (the other end of a txn whose marker is on its way)."""
        action = end_action(action)
        if type(low_watermark) is not int or low_watermark < -1:
            raise InvalidArgument(f"low watermark must be an integer >= -1, got {low_watermark!r}")
        pending = self._ending.get(txn)
        if pending is not None and pending is not action:
            raise InvalidTxnState(f"{txn} is being {'committed' if pending is EndAction.COMMIT else 'aborted'} "
                                  f"here; {action} refused")
        if action is EndAction.COMMIT and txn in self._aborted:
            raise TransactionAlreadyAborted(f"{txn} was aborted on this partition")
        self._hear_low_watermark(txn.tc_id, low_watermark)
        watermark = self.low_watermark(txn.tc_id)
        seen = txn in self._ongoing or txn in self._pending_appends
        if action is EndAction.COMMIT:
            # Never seen: nothing to make visible. (Committed txns are not remembered.)
            write = seen or pending is not None
        else:
            # An abort of a txn never seen still gets a marker (as Kafka writes markers to every
            # registered partition): it fences a send still on its way. The low watermark cannot
            # do that yet - the coordinator's watermark is below every txn it is still ending.
            write = seen or pending is not None or (txn not in self._aborted and txn.sequence > watermark)
        # A repeated end while its marker is in flight writes the marker again (harmless): the
        # caller must not acknowledge before a marker is durable.
        if write:
            self._ending[txn] = action
        dangling = self._take_dangling(txn.tc_id, watermark, exclude=txn)
        return EndDecision(txn.tc_id, watermark, txn, action, write, dangling)

    def prepare_dangling(self, tc_id: int, low_watermark: int) -> EndDecision:
        """Abort markers for txns of ``tc_id`` at or below ``low_watermark`` that are still open
        here (for a periodic check when no end message comes: an end lost for good)."""
        if type(low_watermark) is not int or low_watermark < -1:
            raise InvalidArgument(f"low watermark must be an integer >= -1, got {low_watermark!r}")
        self._hear_low_watermark(tc_id, low_watermark)
        watermark = self.low_watermark(tc_id)
        return EndDecision(tc_id, watermark, None, None, False, self._take_dangling(tc_id, watermark, None))

    def _hear_low_watermark(self, tc_id: int, low_watermark: int) -> None:
        if low_watermark > self._heard_low_watermarks.get(tc_id, -1):
            self._heard_low_watermarks[tc_id] = low_watermark

    def _take_dangling(self, tc_id: int, watermark: int, exclude: TxnID | None) -> tuple[TxnID, ...]:
        candidates = dict.fromkeys([*self._ongoing, *self._pending_appends])
        dangling = tuple(t for t in candidates if t.tc_id == tc_id and t.sequence <= watermark
                         and t != exclude and t not in self._ending)
        for t in dangling:
            self._ending[t] = EndAction.ABORT
        return dangling

    def apply_end(self, txn: TxnID, action: EndAction | str, marker_position: Position,
                  low_watermark: int | None = None, *, base_offset: int | None = None) -> None:
        """A COMMIT or ABORT marker of ``txn`` became durable at ``marker_position``, carrying Kafka
        offset ``base_offset`` (None: a marker from before offsets)."""
        action = end_action(action)
        if action is EndAction.COMMIT and txn in self._aborted:
            raise InvalidTxnState(f"COMMIT marker at {marker_position} for {txn}, aborted at "
                                  f"{self._aborted[txn].marker_position}")
        _, _, marker_offset = self._advance(marker_position, 1, base_offset)
        if self._ending.get(txn) is action:
            del self._ending[txn]
        if low_watermark is not None and low_watermark > self._low_watermarks.get(txn.tc_id, -1):
            self._low_watermarks[txn.tc_id] = low_watermark
        ongoing = self._ongoing.pop(txn, None)
        if action is EndAction.ABORT:
            previous = self._aborted.get(txn)
            if ongoing is not None:
                first, first_offset = ongoing.first_position, ongoing.first_offset
                if previous is not None:
                    first = min(first, previous.first_position)
                    first_offset = previous.first_offset
                self._aborted[txn] = AbortedTxn(txn, first, marker_position, first_offset, marker_offset)
            elif previous is None:  # a fence: nothing of it here, later appends refused
                self._aborted[txn] = AbortedTxn(txn, marker_position, marker_position, marker_offset, marker_offset)
            # else: a repeated abort; the first marker stays
        self._update_max_read_position()

    # --- shared bookkeeping ----------------------------------------------------------------

    def _advance(self, position: Position, span: int, base_offset: int | None) -> tuple[Position, int, int]:
        """Record ``position`` as the last entry, of ``span`` Kafka offsets, carrying
        ``base_offset``; return the previous last entry, the count of entries applied before this
        one and its base offset."""
        last = self._last_position
        if last != EARLIEST:
            follows = (position.entry_id == last.entry_id + 1 if position.ledger_id == last.ledger_id
                       else position.ledger_id > last.ledger_id and position.entry_id == 0)
            if not follows:
                raise InvalidArgument(f"entry {position} applied after {last}: entries must be applied "
                                      "in ledger order, each once, none skipped")
        elif position.ledger_id < 0 or position.entry_id < 0:
            raise InvalidArgument(f"invalid entry position {position}")
        offset = self.offsets.apply(position, span, base_offset)
        entries_before = self._applied_entries
        self._last_position = position
        self._applied_entries += 1
        return last, entries_before, offset

    def _update_max_read_position(self) -> None:
        if self._ongoing:
            new = next(iter(self._ongoing.values())).before_position
        else:
            new = self._last_position
        assert new >= self._max_read_position, f"max read position moving back: {self._max_read_position} -> {new}"
        self._max_read_position = new

    # --- retention -------------------------------------------------------------------------

    def prune_aborted(self, trimmed_below: Position) -> int:
        """Forget aborted txns whose marker lies below ``trimmed_below`` (their ledger was deleted,
        so none of their data can be read). Returns how many were dropped."""
        gone = [txn for txn, entry in self._aborted.items() if entry.marker_position < trimmed_below]
        for txn in gone:
            del self._aborted[txn]
        self.offsets.prune(trimmed_below)
        return len(gone)

    # --- stats -----------------------------------------------------------------------------

    def stats(self, now_ms: int) -> TxnBufferStats:
        oldest = min(self._ongoing.values(), key=lambda entry: entry.start_ms, default=None)
        return TxnBufferStats(
            ongoing_txns=len(self._ongoing),
            aborted_txns=len(self._aborted),
            ending_txns=len(self._ending),
            dedup_producers=len(self._dedup),
            max_read_position=self._max_read_position,
            last_position=self._last_position,
            applied_entries=self._applied_entries,
            lag_entries=self.lag_entries,
            oldest_ongoing=oldest.txn if oldest else None,
            oldest_ongoing_age_ms=max(0, now_ms - oldest.start_ms) if oldest else None,
        )

    # --- snapshots -------------------------------------------------------------------------

    def snapshot(self) -> TxnBufferSnapshot:
        """The durable state, covering every entry up to ``last_position``."""
        return TxnBufferSnapshot(
            last_position=self._last_position,
            max_read_position=self._max_read_position,
            applied_entries=self._applied_entries,
            ongoing=list(self._ongoing.values()),
            aborted=list(self._aborted.values()),
            dedup=[] if testing_bugs.REINTRODUCED["snapshot_without_dedup"] else list(self._dedup.values()),
            low_watermarks=dict(sorted(self._low_watermarks.items())),
            offsets=self.offsets.snapshot(),
        )

    @classmethod
    def from_snapshot(cls, snapshot: TxnBufferSnapshot, *,
                      max_producers: int = DEFAULT_MAX_PRODUCERS,
                      offset_index_interval: int = DEFAULT_INDEX_INTERVAL) -> TransactionBuffer:
        """A buffer in the state ``snapshot`` recorded; then replay the entries after
        ``snapshot.last_position`` with ``apply``. Raises ``CorruptLedger`` on an inconsistent
        snapshot."""
        buffer = cls(max_producers=max_producers, offset_index_interval=offset_index_interval)
        previous_first = EARLIEST
        for entry in snapshot.ongoing:
            if not (previous_first < entry.first_position <= snapshot.last_position
                    and entry.before_position < entry.first_position
                    and 0 <= entry.entries_before < snapshot.applied_entries):
                raise CorruptLedger(f"inconsistent ongoing txn {entry!r} in snapshot at {snapshot.last_position}")
            previous_first = entry.first_position
            buffer._ongoing[entry.txn] = entry
        buffer._aborted = {entry.txn: entry for entry in snapshot.aborted}
        for entry in snapshot.dedup[-max_producers:]:
            buffer._dedup[entry.producer] = entry
        buffer._low_watermarks = dict(snapshot.low_watermarks)
        buffer.offsets = OffsetIndex.from_snapshot(snapshot.offsets, interval=offset_index_interval)
        buffer._last_position = snapshot.last_position
        buffer._applied_entries = snapshot.applied_entries
        head = next(iter(buffer._ongoing.values()), None)
        expected = head.before_position if head else snapshot.last_position
        if expected != snapshot.max_read_position:
            raise CorruptLedger(f"snapshot at {snapshot.last_position} says max read position "
                                f"{snapshot.max_read_position}, its ongoing txns say {expected}")
        buffer._max_read_position = expected
        return buffer

