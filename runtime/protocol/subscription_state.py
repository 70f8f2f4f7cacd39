"""One subscription on one partition, pure: the cursor, the pending acks, the pending-ack log index
and the dispatcher, and the rules that tie them together. The actor (``actors/subscription.py``)
does the I/O, the locking and the timers around this.

Delivery. A message may be delivered when it is not acked in the cursor, not held by a
transaction, and not queued or outstanding already. ``read_position`` bounds what was read from
the partition: every deliverable message below it is queued or outstanding. When a message
becomes deliverable again (given back by a consumer, its transaction aborted, a seek) the read
position moves back to it (``rewind``) and the next reads queue it again, so payloads are never
kept for redelivery. Reading acks what it passes over without delivering (markers, aborted
entries, ledger ends: ``gaps_between``), so the mark-delete position never sticks there.

Acks. Plain acks go straight to the cursor, except on messages held by a transaction: those are
ignored, as Pulsar does, and a plain cumulative ack over one is a ``TransactionConflict``.
Transactional acks are prepared here (the ``PendingAck`` rules), one record per ack call, logged
by the actor, and applied by ``apply`` in log order, live and on replay. ``prepare_end`` also aborts the coordinator's
dangling transactions at or below the low watermark it sends.

Durability. ``persisted_form`` is the cursor snapshot with the last pending-ack log entry it
includes; recovery restores it and replays the log, passing ``in_cursor_snapshot`` for entries up
to that one. ``trim_point`` says how much of the log may go once such a form is persisted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from raytxn import testing_bugs
from raytxn.errors import CorruptLedger, InvalidArgument, NotAllowed, TransactionConflict
from raytxn.ids import EARLIEST, Position, TxnID
from raytxn.protocol.cursor import (
    Cursor,
    CursorSnapshot,
    check_metadata,
    gaps_between,
    next_position,
    position_before,
)
from raytxn.protocol.dispatch import ConsumerType, Dispatcher, MessageKey
from raytxn.protocol.entry_format import decode_entry_header, decode_message
from raytxn.protocol.lease import UNCOUNTED, Lease, LeaseTable, RangeCount, RangePlan, ledger_spans, plan_range
from raytxn.protocol.packed_records import PackedRecords
from raytxn.protocol.pending_ack import (
    AbortRecord,
    Ack,
    AckKind,
    AckRecord,
    CommitRecord,
    MetadataRecord,
    PendingAck,
    PendingAckLogIndex,
    Record,
    cumulative_point,
)
from raytxn.protocol.txnlog import EndAction, end_action

# An ack as consumers send it: (entry position, batch index, batch size). A batch index None acks
# the whole entry (a single message, or every message of a batch); a single message may also
# say (0, 1).
AckTuple = tuple[Position, int | None, int | None]

# One message as ``take`` returns it:
# (ledger_id, entry_id, batch_index, batch_size, publish_time_ms, redelivery_count, record bytes)
WireMessage = tuple[int, int, int, int, int, int, bytes]

# What a fetch returns: the messages handed out, one tuple per run of messages of one entry, the
# records opaque (encoded ``MessageRecord``s as the partition stored them; the consumer decodes
# them lazily): (ledger_id, entry_id, batch_size, publish_time_ms, batch indexes, redelivery
# counts (None: all 0), records, packed: one buffer, ``raytxn.protocol.packed_records``). Far
# fewer objects to pickle than a tuple per message.
WireEntry = tuple[int, int, int, int, list[int], list[int] | None, PackedRecords]

# A plain or transactional range ack: every entry ``first_entry_id..last_entry_id`` (inclusive)
# of one ledger, whole. Consumers coalesce their individual acks of contiguous entries into these.
AckRange = tuple[int, int, int]
MAX_RANGE_ENTRIES = 1 << 20  # one range never names more entries than this

# Individual acks of batch indexes ``first_index..last_index`` (inclusive) of one entry:
# (ledger_id, entry_id, batch_size, first_index, last_index). A consumer acking a batch entry in
# order sends a run or two per entry instead of a tuple per message: one cursor update and one
# object to unpickle, not a thousand.
IndexRun = tuple[int, int, int, int, int]


class PersistedCursor(msgspec.Struct, frozen=True):
    """The cursor as stored in the pending-ack ledger's properties: its snapshot, and the last
    log entry whose record it includes (replay passes ``in_cursor_snapshot`` up to there)."""

    cursor: CursorSnapshot
    log_position: Position = EARLIEST
    given_back: tuple[Position, Position] | None = None  # SubscriptionState.given_back, when taken


_encoder = msgspec.msgpack.Encoder()
_persisted_decoder = msgspec.msgpack.Decoder(PersistedCursor)


def encode_persisted(persisted: PersistedCursor) -> bytes:
    return _encoder.encode(persisted)


def decode_persisted(data: bytes, where: str = "") -> PersistedCursor:
    try:
        return _persisted_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise CorruptLedger(f"undecodable persisted cursor at {where or '?'}: {error}", where) from error


_WHOLE_ENTRY = 2**31  # a batch index above any real one: an ack of a whole entry covers all of it


def normalize_ack(ack: AckTuple | Sequence[Any]) -> Ack:
    """An ``Ack``: a whole entry, or one batch index of a batch entry."""
    if not isinstance(ack, tuple | list) or len(ack) != 3 or not isinstance(ack[0], Position):
        raise InvalidArgument(f"an ack is (position, batch_index, batch_size), got {ack!r}")
    position, batch_index, batch_size = ack
    if batch_index is None or (batch_size == 1 and batch_index == 0):
        return Ack(position)
    if batch_size is None:
        raise InvalidArgument(f"ack of batch index {batch_index} of {position} needs the batch size")
    return Ack(position, batch_index, batch_size)


CheckedRun = tuple[Position, int, int, int]  # (entry, batch size, first index, last index)


def check_index_runs(runs: Sequence[IndexRun]) -> list[CheckedRun]:
    """The runs with their entries as ``Position``s; ``InvalidArgument`` for a malformed one, or
    for two runs of one entry that disagree on its batch size."""
    checked: list[CheckedRun] = []
    sizes: dict[Position, int] = {}
    for run in runs:
        if not isinstance(run, tuple | list) or len(run) != 5 or any(type(part) is not int for part in run):
            raise InvalidArgument("an index run is (ledger_id, entry_id, batch_size, first_index, last_index), "
                                  f"got {run!r}")
        ledger_id, entry_id, batch_size, first, last = run
        if entry_id < 0 or batch_size < 1 or not 0 <= first <= last < batch_size:
            raise InvalidArgument(f"bad index run {run!r}: need entry_id >= 0 and 0 <= first <= last < batch_size")
        position = Position(ledger_id, entry_id)
        if sizes.setdefault(position, batch_size) != batch_size:
            raise InvalidArgument(f"index runs of {position} name batch sizes {sizes[position]} and {batch_size}")
        checked.append((position, batch_size, first, last))
    return checked


def run_acks(runs: Sequence[CheckedRun]) -> list[Ack]:
    """The ``Ack`` of each message of the runs (what the runs stand for, one message at a time)."""
    return [Ack(position) if batch_size == 1 else Ack(position, index, batch_size)
            for position, batch_size, first, last in runs for index in range(first, last + 1)]


def routing_key_of(record: bytes) -> str | None:
    return decode_message(record).key


def count_entries(ledger_ends: Sequence[tuple[int, int]], start: Position, end: Position) -> int:
    """How many entries lie in ``[start, end]``, given ``(ledger_id, last_entry_id)`` per ledger."""
    total = 0
    for ledger_id, last_entry_id in ledger_ends:
        if ledger_id < start.ledger_id or ledger_id > end.ledger_id:
            continue
        first = start.entry_id if ledger_id == start.ledger_id else 0
        last = min(last_entry_id, end.entry_id) if ledger_id == end.ledger_id else last_entry_id
        total += max(0, last - max(first, 0) + 1)
    return total


def _counted(plan: RangePlan, last: Position) -> RangeCount:
    """What the lease ``..last`` holds: the plan's count, unless ``max_entries`` cut the range
    short of the plan's end (then unknown)."""
    return plan.counted if last == plan.max_read else UNCOUNTED


class SubscriptionState:
    """Everything one subscription partition knows (see the module docstring)."""

    def __init__(self, partition: int, cursor: Cursor, max_index_lag: int = 100,
                 given_back: tuple[Position, Position] | None = None) -> None:
        self.cursor = cursor
        self.pending = PendingAck(cursor)
        self.log_index = PendingAckLogIndex(max_index_lag)
        self.dispatcher = Dispatcher(partition, routing_key_of)
        self.read_position = cursor.acked_below
        self.applied_log_position = EARLIEST  # last pending-ack log entry applied
        # Acks in a txn must name delivered messages; the actor raises this at recovery to what
        # an earlier incarnation may have delivered (the partition's readable end).
        self.delivered_through = EARLIEST
        # ``(first, last)``: messages in this range were given back (an abort, a closed consumer)
        # and may not all be handed out again yet (None: nothing is). Until they are, a cumulative
        # ack in a txn may not cover them: an abort that gave messages back after a successor
        # consumer got later ones let the successor's cumulative ack cover messages nobody
        # received (found by the simulator's consumer-swap workload). Persisted with the cursor,
        # so a restart right after the abort does not forget it.
        self.given_back = given_back
        self.max_read = EARLIEST  # the partition's readable end, as last seen
        self.generation = 0  # seeks so far: consumers drop what they prefetched before a seek
        self._txn_keys: dict[TxnID, list[MessageKey]] = {}  # outstanding messages a txn's acks took
        # messages a txn acked while another consumer held them: settled when it commits
        self._txn_foreign: dict[TxnID, list[MessageKey]] = {}
        self._messages_per_entry = 1.0  # a moving average of the partition's batch sizes
        self.leases = LeaseTable()  # volatile: a restart refuses old leases and grants the range again
        # Where each pending txn's first ``MetadataRecord`` is in the log: such a record acks
        # nothing, so the log index cannot tell when it may go; ``trim_point`` stops before it.
        self._metadata_logged: dict[TxnID, Position] = {}
        # Whether reads go to the compacted view below the horizon: as its consumers asked
        # (``add_consumer``); volatile, since every consumer subscribes again after a restart.
        self.read_compacted = False

    # --- delivery ----------------------------------------------------------------------------

    def deliverable(self, position: Position, batch_index: int, batch_size: int) -> bool:
        index = None if batch_size == 1 else batch_index
        if self.cursor.is_acked(position, index):
            return False
        return not self.pending.holds_any or self.pending.held_by(position, index) is None

    def deliverable_indexes(self, position: Position, batch_size: int, indexes: list[int]) -> list[int]:
        """Those ``indexes`` of the entry that may be delivered (the same list when all may):
        one check per entry unless the cursor or a txn holds part of it."""
        cursor = self.cursor
        if cursor.is_acked(position):
            return []
        if cursor.partial_batch(position) is None and not (self.pending.holds_any and self.pending.holds_at(position)):
            return indexes
        return [index for index in indexes if self.deliverable(position, index, batch_size)]

    def read_ahead(self, base: int, cap: int) -> int:
        """How many messages to keep queued ahead of dispatch: ``base``, or as many as the
        consumers' last fetches could take when that is more (about their receive queues), up to
        ``cap``. With ``base`` alone, a consumer with a 10,000-message receive queue got about
        ``base`` messages per round trip of the two reads (partition, then fetch): columnar
        receive ran at a third of its rate with the queue kept a receive queue ahead."""
        return min(cap, max(base, self.dispatcher.asked))

    def wants_read(self, read_ahead: int) -> bool:
        """Read more when somebody may consume it and the queue has room."""
        return bool(self.dispatcher.consumer_ids()) and self.dispatcher.queued < read_ahead

    def read_size(self, read_ahead: int, max_entries: int) -> int:
        """How many entries the next read asks for: about enough to fill the queue's room, so that
        batch entries (a thousand messages each, say) do not flood it."""
        room = read_ahead - self.dispatcher.queued
        return max(1, min(max_entries, int(room / self._messages_per_entry)))

    def on_read(self, start: Position, entries: Sequence[tuple[Position, Sequence[bytes]]],
                next_read: Position, max_read: Position,
                kept: Sequence[tuple[int, Sequence[int]]] | None = None) -> int:
        """A partition read from ``start``: ack the gaps, queue the deliverable messages, move on
        to ``next_read`` (unless a rewind went below ``start`` meanwhile). Returns how many
        messages were queued. ``kept`` (a compacted read's): per entry, its message count and the
        indexes its records had; its other indexes were folded away by compaction, so they are
        acked too."""
        self.max_read = max(self.max_read, max_read)
        # (The switch is test-only, off in production: it brings back bug 1149ba3 for the simulator.)
        if self.read_position < start and not testing_bugs.REINTRODUCED["consumer_swap_loss"]:
            return 0  # rewound below this read meanwhile: its entries are read again, in order
        positions = [position for position, _ in entries]
        gaps = gaps_between(start, positions)
        after_last = next_position(positions[-1]) if positions else start
        if after_last < next_read:
            gaps.append((after_last, next_read))
        for gap_start, gap_end in gaps:
            self.cursor.ack_range(gap_start, gap_end)
        queued = 0
        for n, (position, records) in enumerate(entries):
            header = decode_entry_header(records, str(position))
            self._messages_per_entry = 0.9 * self._messages_per_entry + 0.1 * header.count
            if not header.count:
                continue
            if kept is not None:
                count, indexes = kept[n]
                queued += self._offer_compacted(position, count, header.publish_time_ms, records, indexes)
                continue
            indexes = self.deliverable_indexes(position, header.count, list(range(header.count)))
            if not indexes:
                continue
            if len(indexes) == header.count:  # (a partition sends them packed: kept as they came)
                held = records if isinstance(records, PackedRecords) else list(records)
            else:  # keep only what is queued: a re-read batch may be mostly acked
                held = [None] * (header.count + 1)
                for index in indexes:
                    held[index + 1] = records[index + 1]
            queued += self.dispatcher.offer_entry(position, header.count, header.publish_time_ms, held, indexes)
        if self.read_position == start:
            self.read_position = max(start, next_read)
        return queued

    def _offer_compacted(self, position: Position, count: int, publish_time_ms: int, records: Sequence[bytes],
                         kept_indexes: Sequence[int]) -> int:
        """Queue a compacted entry's kept records (``records[k + 1]`` had index
        ``kept_indexes[k]``) and ack its indexes compaction folded away."""
        ordered = list(kept_indexes) == sorted(set(kept_indexes))
        if len(records) != len(kept_indexes) + 1 or not kept_indexes or not ordered \
                or kept_indexes[0] < 0 or kept_indexes[-1] >= count:
            raise CorruptLedger(f"compacted entry {position}: indexes {list(kept_indexes)[:8]} for {count} messages "
                                f"and {len(records) - 1} records", str(position))
        if self.cursor.is_acked(position):
            return 0
        held: list[bytes | None] = [None] * (count + 1)
        # A folded index a txn holds stays with the txn: its commit acks it, and after its abort
        # the re-read (the abort rewinds) acks it here.
        for index in sorted(set(range(count)).difference(kept_indexes)):
            if not self.pending.holds_any or self.pending.held_by(position, index) is None:
                self.cursor.ack(position, index, count)
        for k, index in enumerate(kept_indexes):
            held[index + 1] = records[k + 1]
        indexes = self.deliverable_indexes(position, count, list(kept_indexes))
        if not indexes:
            return 0
        return self.dispatcher.offer_entry(position, count, publish_time_ms, held, indexes)

    def rewind(self, position: Position, note_given_back: bool = True) -> None:
        """Messages from ``position`` on may be deliverable again: read from there next.

        Queued messages from there on are dropped and read again too: were they handed out
        first, an Exclusive or Failover consumer would see a later message before the ones
        given back, and its cumulative ack would cover messages it never received."""
        target = max(position, self.cursor.acked_below)
        if note_given_back:
            self._note_given_back(target)
        if target < self.read_position:  # (everything queued was read, so lies below read_position)
            self.read_position = target
            # (The switch is test-only, off in production: it brings back bug 1149ba3 for the simulator.)
            if not testing_bugs.REINTRODUCED["consumer_swap_loss"]:
                self.dispatcher.unqueue_from(target)

    def _note_given_back(self, first: Position) -> None:
        """Messages from ``first`` up to what was delivered are given back. (On replay,
        ``delivered_through`` is not known yet: the actor widens the range after it.)"""
        last = max(self.delivered_through, first)
        if self.given_back is not None:
            first, last = min(first, self.given_back[0]), max(last, self.given_back[1])
        self.given_back = (first, last)

    def _waiting_at_or_below(self, through: MessageKey) -> Position | None:
        """Where messages at or below ``through`` still wait to be handed out again (None: none
        do): not read again yet (``read_position`` is at or below its entry), or read and queued.
        Re-read messages a consumer still holds are not queued again: they count as handed out."""
        first_queued = self.dispatcher.first_queued()
        if first_queued is not None and first_queued <= through:
            return min(self.read_position, first_queued[0])
        return self.read_position if self.read_position <= through[0] else None

    def _forget_given_back_once_handed_out(self) -> None:
        """Everything given back is acked, or was read again and left the queue (handed out, or
        skipped as held by a consumer or a txn): cumulative acks are free again."""
        if self.given_back is None:
            return
        last = self.given_back[1]
        if self.cursor.acked_below > last or self._waiting_at_or_below((last, _WHOLE_ENTRY)) is None:
            self.given_back = None

    def dispatch(self) -> list[str]:
        """Hand queued messages to consumers with demand; returns the consumers served."""
        served = self.dispatcher.dispatch(self.deliverable_indexes)
        self._forget_given_back_once_handed_out()
        if self.dispatcher.max_dispatched is not None and self.dispatcher.max_dispatched > self.delivered_through:
            self.delivered_through = self.dispatcher.max_dispatched
        return served

    def take(self, consumer_id: str) -> list[WireMessage]:
        return [(m.position.ledger_id, m.position.entry_id, m.batch_index, m.batch_size, m.publish_time_ms,
                 redeliveries, m.record) for m, redeliveries in self.dispatcher.take(consumer_id)]

    def take_entries(self, consumer_id: str) -> list[WireEntry]:
        """``take``, grouped: one ``WireEntry`` per run of handed-out messages of one entry (in
        the order they were handed out)."""
        entries: list[WireEntry] = []
        dispatcher = self.dispatcher
        for entry, indexes in dispatcher.take_chunks(consumer_id):
            position, records = entry.position, entry.records
            if len(indexes) == entry.batch_size:  # the whole entry: its records as they are
                messages = records[1:] if isinstance(records, PackedRecords) else PackedRecords.pack(records[1:])
            else:
                messages = PackedRecords.pack([records[index + 1] for index in indexes])
            entries.append((position.ledger_id, position.entry_id, entry.batch_size, entry.publish_time_ms,
                            indexes, dispatcher.redelivery_counts(position, indexes), messages))
        return entries

    # --- consumers ---------------------------------------------------------------------------

    def add_consumer(self, consumer_id: str, name: str, consumer_type: ConsumerType | str, now: float,
                     read_compacted: bool = False) -> None:
        """Attach a consumer. ``read_compacted`` (Pulsar's ``readCompacted``): below a compacted
        topic's horizon it reads the compacted view, the latest value of each key. As in Pulsar,
        only for an Exclusive or Failover subscription (one reader at a time), and every consumer
        attached at once agrees on it."""
        if self.leases.current is not None:
            raise NotAllowed(f"lease {self.leases.current.lease_id} is outstanding: consumers and leases do "
                             "not mix on one subscription")
        if read_compacted and str(consumer_type) not in (ConsumerType.Exclusive, ConsumerType.Failover):
            raise InvalidArgument(f"read_compacted needs an Exclusive or Failover consumer, not {consumer_type}")
        others = [c for c in self.dispatcher.consumer_ids() if c != consumer_id]
        if others and read_compacted != self.read_compacted:
            raise NotAllowed(f"the consumers attached read {'the compacted view' if self.read_compacted else 'all'}"
                             f" of the topic; this one asks for read_compacted={read_compacted}")
        self._rewind_to(self.dispatcher.add_consumer(consumer_id, name, consumer_type, now))
        if read_compacted != self.read_compacted:
            self.read_compacted = read_compacted
            # What is queued was read the other way: read again (nothing delivered yet, no consumer).
            self.rewind(self.cursor.acked_below, note_given_back=False)

    def remove_consumer(self, consumer_id: str) -> None:
        self._rewind_to(self.dispatcher.remove_consumer(consumer_id))

    def release(self, consumer_id: str, keys: Sequence[MessageKey] | None = None) -> int:
        """Give back outstanding messages of a consumer (negative ack, ack timeout); returns how
        many were its."""
        released = self.dispatcher.release(consumer_id, keys)
        self._rewind_to(released)
        return len(released)

    def _rewind_to(self, keys: Sequence[MessageKey]) -> None:
        if keys:
            self.rewind(min(position for position, _ in keys))

    # --- plain acks --------------------------------------------------------------------------

    def ack(self, acks: Sequence[AckTuple], cumulative: bool = False, ranges: Sequence[AckRange] = (),
            runs: Sequence[IndexRun] = ()) -> None:
        """Plain acks: straight to the cursor (messages held by a txn are skipped). ``ranges``:
        whole entries, a range at a time (individual acks only; ``NotAllowed`` for a range
        reaching past what was delivered). ``runs``: batch indexes, a run of one entry at a time
        (individual acks only; each the same as acking its messages one by one)."""
        normalized = [normalize_ack(ack) for ack in acks]
        if (ranges or runs) and cumulative:
            raise InvalidArgument("range and index-run acks are individual acks, not cumulative")
        checked_runs = self._check_runs_plain(runs)
        if ranges:
            checked = self._check_ranges(ranges)
            for start, last in checked:  # every range is valid: now apply them all
                self._ack_range_plain(start, last)
        if checked_runs:
            normalized += self._ack_runs_plain(checked_runs)
        if cumulative:
            self._check_cumulative_allowed()
            for ack in normalized:
                self._ack_cumulative(ack)
            return
        settled = []
        holds_any = self.pending.holds_any
        for ack in normalized:
            if holds_any and self.pending.held_by(ack.position, ack.batch_index) is not None:
                continue  # Pulsar ignores a plain ack of a message pending in a txn
            self.cursor.ack(ack.position, ack.batch_index, ack.batch_size)
            settled.append(ack)
        self.dispatcher.forget_redeliveries(self._settle(settled))

    def _check_runs_plain(self, runs: Sequence[IndexRun]) -> list[CheckedRun]:
        """``check_index_runs``, and ``InvalidArgument`` for a run whose batch size is not the
        one the cursor knows its entry by (checked before any ack is applied)."""
        checked = check_index_runs(runs)
        for position, batch_size, _, _ in checked:
            partial = self.cursor.partial_batch(position)
            if partial is not None and partial[0] != batch_size:
                raise InvalidArgument(f"{position} holds {partial[0]} messages, not {batch_size}")
        return checked

    def _ack_runs_plain(self, runs: Sequence[CheckedRun]) -> list[Ack]:
        """Apply the index runs no transaction holds any of, a run at a time (cursor and
        dispatcher); returns the single acks of the rest, for the one-at-a-time path (which
        skips the messages a txn holds)."""
        holds_any = self.pending.holds_any
        loose: list[CheckedRun] = []
        for run in runs:
            position, batch_size, first, last = run
            if batch_size == 1 or (holds_any and self.pending.holds_at(position)):
                loose.append(run)
                continue
            self.cursor.ack_indexes(position, batch_size, first, last)
            self.dispatcher.settle_indexes(position, first, last)
        return run_acks(loose)

    def _check_ranges(self, ranges: Sequence[AckRange]) -> list[tuple[Position, Position]]:
        """``(first, last)`` entry of each range; ``InvalidArgument`` for a malformed one,
        ``NotAllowed`` for one reaching past what was delivered on this subscription."""
        checked = []
        for ack_range in ranges:
            if (not isinstance(ack_range, tuple | list) or len(ack_range) != 3
                    or any(type(part) is not int for part in ack_range)):
                raise InvalidArgument(f"a range ack is (ledger_id, first_entry_id, last_entry_id), got {ack_range!r}")
            ledger_id, first, last = ack_range
            if not 0 <= first <= last or last - first >= MAX_RANGE_ENTRIES:
                raise InvalidArgument(f"bad range ack {ack_range!r}: need 0 <= first <= last, at most "
                                      f"{MAX_RANGE_ENTRIES} entries")
            start, end = Position(ledger_id, first), Position(ledger_id, last)
            if end > self.delivered_through:
                raise NotAllowed(f"range ack {start}..{end} names entries never delivered on this subscription "
                                 f"(delivered through {self.delivered_through})")
            checked.append((start, end))
        return checked

    def _ack_range_plain(self, start: Position, last: Position) -> None:
        """A plain ack of entries ``start..last``: the cursor takes the stretches no txn holds
        (as for a single plain ack, entries pending in a txn are skipped), in one ``ack_range``
        each; what was outstanding of them is settled."""
        pending = self.pending
        cover = pending.cumulative_through
        if cover is not None and cover >= start:
            start = next_position(cover)  # held by the pending cumulative ack up to ``cover``
        if last < start:
            return
        stretches = []
        for held in pending.held_positions(start, last):
            if start < held:
                stretches.append((start, held))
            start = next_position(held)
        if start <= last:
            stretches.append((start, next_position(last)))
        for stretch_start, stretch_end in stretches:
            self.cursor.ack_range(stretch_start, stretch_end)
            self.dispatcher.ack_entries(Position(stretch_start.ledger_id, entry_id)
                                        for entry_id in range(stretch_start.entry_id, stretch_end.entry_id))

    def _settle(self, acks: Sequence[Ack]) -> list[MessageKey]:
        """The acked messages are no longer outstanding or queued; returns those that were
        outstanding."""
        settled = self.dispatcher.settle([(a.position, a.batch_index) for a in acks if a.batch_index is not None])
        for ack in acks:
            if ack.batch_index is None:
                settled += self.dispatcher.settle_entry(ack.position)
        return settled

    def _settle_txn_acks(self, record: AckRecord) -> list[MessageKey]:
        """``_settle`` for individual acks in a txn, except that a message outstanding with
        another consumer than the caller stays with it until the txn commits.

        Why: a consumer that still holds a message from before the subscription restarted (or a
        zombie incarnation's delivery) may ack it in a txn while this incarnation has handed it
        to another consumer. Settling it at once made its Key_Shared key look free: had the txn
        aborted, the message went out again to the key's next consumer while the other one still
        held it (simulator seed 66 of key-shared). Kept outstanding, the key drains
        until that consumer acks or gives it back; the commit settles it for good, and an abort
        hands it to that consumer once more (``Dispatcher.resend``: its own txn ack may have
        been refused meanwhile, and it would never see the message again: chaos seed 11)."""
        if record.consumer is None:
            return self._settle(record.acks)
        settled, kept = self.dispatcher.settle_for(
            record.consumer, [(a.position, a.batch_index) for a in record.acks if a.batch_index is not None],
            [a.position for a in record.acks if a.batch_index is None])
        if kept:
            self._txn_foreign.setdefault(record.txn, []).extend(kept)
        return settled

    def _settle_cumulative(self, ack: Ack) -> list[MessageKey]:
        """``_settle`` for a cumulative ack (of a whole entry, or up to a batch index of it)."""
        if ack.batch_index is None:
            return self.dispatcher.settle_through(ack.position)
        before, indexes = self._split_cumulative(ack)
        return self.dispatcher.settle_through(before) + self.dispatcher.settle((ack.position, i) for i in indexes)

    def _ack_cumulative(self, ack: Ack) -> None:
        position = ack.position
        if ack.batch_index is None or ack.batch_index == ack.batch_size - 1:  # type: ignore[operator]
            self.pending.check_plain_cumulative(position)
            self.cursor.ack_cumulative(position)
            self.dispatcher.forget_redeliveries(self.dispatcher.settle_through(position))
            return
        # Inside a batch: everything before the entry, and the entry's indexes up to this one.
        before, indexes = self._split_cumulative(ack)
        self.pending.check_plain_cumulative(before)
        for index in indexes:
            holder = self.pending.held_by(position, index)
            if holder is not None:
                raise TransactionConflict(f"cumulative ack up to {position} batch index {ack.batch_index} "
                                          f"covers batch index {index}, pending in {holder}")
        self.cursor.ack_cumulative(before)
        for index in indexes:
            self.cursor.ack(position, index, ack.batch_size)
        self.dispatcher.forget_redeliveries(self._settle_cumulative(ack))

    @staticmethod
    def _split_cumulative(ack: Ack) -> tuple[Position, range]:
        """A cumulative ack of batch index i: (the position just before the entry, indexes 0..i)."""
        assert ack.batch_index is not None
        return position_before(ack.position), range(ack.batch_index + 1)

    def _check_cumulative_allowed(self) -> None:
        if self.dispatcher.type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise NotAllowed(f"cumulative acks are not allowed on a {self.dispatcher.type} subscription")

    # --- transactional acks and ends ---------------------------------------------------------

    def prepare_ack(self, txn: TxnID, acks: Sequence[AckTuple], cumulative: bool = False,
                    request: str | None = None, ranges: Sequence[AckRange] = (),
                    consumer: str | None = None, runs: Sequence[IndexRun] = ()) -> AckRecord | None:
        """The record to log for one ack call made in ``txn`` (None: nothing to log, success:
        it holds them all already, or ``request``, the call's id, is a retry of a logged call).
        ``ranges`` (whole entries a range at a time) and ``runs`` (batch indexes a run at a
        time) are individual acks; the record names each entry or message, so that the
        pending-ack rules, the log and its replay stay as they are.
        ``consumer``: who calls (see ``apply``: what another consumer holds stays with it)."""
        if runs and cumulative:
            raise InvalidArgument("index-run acks are individual acks, not cumulative")
        record = self._prepare_ack(txn, acks, cumulative, request, ranges, run_acks(check_index_runs(runs)))
        if record is not None and consumer is not None:
            record = msgspec.structs.replace(record, consumer=consumer)
        return record

    def _prepare_ack(self, txn: TxnID, acks: Sequence[AckTuple], cumulative: bool,
                     request: str | None, ranges: Sequence[AckRange], from_runs: Sequence[Ack]) -> AckRecord | None:
        normalized = [normalize_ack(ack) for ack in acks] + list(from_runs)
        if ranges:
            if cumulative:
                raise InvalidArgument("range acks are individual acks, not cumulative")
            normalized += [Ack(Position(start.ledger_id, entry_id))
                           for start, last in self._check_ranges(ranges)
                           for entry_id in range(start.entry_id, last.entry_id + 1)]
        delivered = self.delivered_through
        if not cumulative:
            for ack in normalized:
                if ack.batch_index is None and self.cursor.partial_batch(ack.position) is not None:
                    raise TransactionConflict(f"{txn} acks every message of {ack.position}, some of which are "
                                              "already acked")
            return self.pending.prepare_ack(txn, AckKind.INDIVIDUAL, normalized, delivered, request)
        self._check_cumulative_allowed()
        if len(normalized) != 1:
            raise InvalidArgument("a cumulative ack names exactly one message")
        record = self.pending.prepare_ack(txn, AckKind.CUMULATIVE, normalized, delivered, request)
        if record is not None:  # (None: a retry of a logged call, or held already: nothing new)
            self._check_nothing_given_back_below(txn, normalized[0])
        return record

    def _check_nothing_given_back_below(self, txn: TxnID, ack: Ack) -> None:
        """``NotAllowed`` for a cumulative ack through ``ack`` while messages at or below it that
        were given back wait to be handed out again (an abort's own consumer may still ack what
        it holds: those are not queued again)."""
        if self.given_back is None or ack.position < self.given_back[0]:
            return
        # (Test-only switches, off in production: they bring back the bugs for the simulator.)
        if testing_bugs.REINTRODUCED["given_back_cumulative_ack"] or testing_bugs.REINTRODUCED["consumer_swap_loss"]:
            return
        waiting = self._waiting_at_or_below(
            (ack.position, ack.batch_index if ack.batch_index is not None else _WHOLE_ENTRY))
        if waiting is not None:
            raise NotAllowed(f"{txn}: a cumulative ack through {ack.position} covers messages given back from "
                             f"{waiting} on, not received again yet")

    def prepare_end(self, txn: TxnID, action: EndAction | str, low_watermark: int | None) -> list[Record]:
        """The records that end ``txn`` here (none: nothing pending, success), preceded by aborts
        of its coordinator's pending txns at or below ``low_watermark`` (they ended there)."""
        action = end_action(action)
        records: list[Record | None] = []
        if low_watermark is not None:
            records += [self.pending.prepare_abort(dangling)
                        for dangling in self.pending.pending_at_or_below(txn.tc_id, low_watermark) if dangling != txn]
        records.append(self.pending.prepare_commit(txn) if action is EndAction.COMMIT
                       else self.pending.prepare_abort(txn))
        return [record for record in records if record is not None]

    def apply(self, record: Record, log_position: Position, *, in_cursor_snapshot: bool = False) -> None:
        """Apply a logged record (live, right after it is durable, and on replay)."""
        redelivery = self.pending.apply(record, in_cursor_snapshot=in_cursor_snapshot)
        self.log_index.on_logged(record, log_position)
        self.applied_log_position = log_position
        if isinstance(record, CommitRecord | AbortRecord):
            self._metadata_logged.pop(record.txn, None)
        if isinstance(record, MetadataRecord):
            self._metadata_logged.setdefault(record.txn, log_position)
        elif isinstance(record, AckRecord):
            if record.kind is AckKind.CUMULATIVE:
                self.leases.on_cumulative_ack(record.txn, record.acks[0].position)
                taken = self._settle_cumulative(record.acks[0])
            else:
                taken = self._settle_txn_acks(record)
            if taken:
                self._txn_keys.setdefault(record.txn, []).extend(taken)
        elif isinstance(record, CommitRecord):
            self.leases.on_txn_end(record.txn, committed=True)
            self.dispatcher.forget_redeliveries(self._txn_keys.pop(record.txn, ()))
            self.dispatcher.forget_redeliveries(self.dispatcher.settle(self._txn_foreign.pop(record.txn, ())))
        elif isinstance(record, AbortRecord):
            self.leases.on_txn_end(record.txn, committed=False)
            self.dispatcher.count_redelivery(self._txn_keys.pop(record.txn, ()))
            # Messages another consumer holds stay with it, and go to it once more when the
            # rewind below reads them again (it may have given up on them: ``resend``).
            self.dispatcher.resend(self._txn_foreign.pop(record.txn, ()))
            assert redelivery is not None
            # (An abort the persisted cursor includes: its give-back is in that form already.)
            if redelivery.messages:
                self.rewind(redelivery.messages[0][0], note_given_back=not in_cursor_snapshot)
                self.leases.on_given_back(redelivery.messages[0][0])
            if redelivery.cumulative_through is not None:
                self.rewind(self.cursor.acked_below, note_given_back=not in_cursor_snapshot)
                self.leases.on_given_back(self.cursor.acked_below)

    # --- readers of the partition: Kafka consumer groups ------------------------------------------

    # A Kafka consumer group reads the partition through the Kafka gateway, not through this
    # subscription's dispatcher, and commits an offset: "everything before this message is
    # consumed". The subscription named after the group keeps that as its cursor. As nothing is
    # delivered here, the delivery guards of consumer acks (``delivered_through``, ``given_back``)
    # do not apply: the reader says what it read. Consumers or a lease on the same subscription
    # would be a second reader of it, so they do not mix. A commit also sets the cursor's commit
    # metadata (Kafka's offset metadata): at once when plain, at the txn's commit when in one.

    def first_unacked(self) -> tuple[Position, int]:
        """The first message not acked, as (entry position, batch index): the mark-delete bound,
        and the first unacked index of a batch partly acked there (acks above are not counted)."""
        bound = self.cursor.acked_below
        partial = self.cursor.partial_batch(bound)
        if partial is None:
            return bound, 0
        size, unacked = partial
        return bound, next(index for index in range(size) if unacked >> index & 1)

    def acked_nothing(self) -> bool:
        """Nothing was ever acked: the cursor is where an ``earliest`` subscription starts (a
        Kafka group that never committed, though a transaction of it may have created this)."""
        return self.cursor.snapshot() == Cursor().snapshot()

    def reader_commit(self, first: Position, index: int, size: int | None, metadata: str = "") -> bool:
        """A plain commit: message ``index`` of the entry at ``first`` (of ``size`` messages) is
        the first one not consumed; everything before it is acked and nothing after it, so the
        committed position also moves back (a seek). ``metadata`` becomes the commit metadata.
        Returns whether the cursor changed."""
        ack = self._check_reader_commit(first, index, size, metadata)
        if (first, index) == self.first_unacked() and metadata == self.cursor.metadata:
            return False
        if self.pending.pending_txn_count:
            raise TransactionConflict(f"acks of {self.pending.pending_txns()[0]} are pending: a plain commit waits "
                                      "for it to end")
        if (first, index) < self.first_unacked():
            self.seek(first)
            for earlier in range(index):
                self.cursor.ack(first, earlier, size)
        elif (first, index) > self.first_unacked():
            self._ack_cumulative(normalize_ack(ack))
        self.cursor.set_metadata(metadata)
        return True

    def reader_delete(self) -> bool:
        """A Kafka group's committed offset deleted (OffsetDelete): the cursor goes back to where
        an ``earliest`` subscription starts, with no metadata, so the group has no committed
        offset here (``acked_nothing``). Returns whether anything changed. ``NotAllowed`` while
        consumers or a lease read the subscription, ``TransactionConflict`` while a txn holds
        acks here (deleting offsets a txn may still commit waits for its end)."""
        if self.dispatcher.consumer_ids():
            raise NotAllowed("consumers are attached: the subscription's position is theirs")
        if self.leases.current is not None:
            raise NotAllowed("a lease is held: the subscription's position is its holder's")
        if self.acked_nothing():
            return False
        if self.pending.pending_txn_count:
            raise TransactionConflict(f"acks of {self.pending.pending_txns()[0]} are pending: deleting the "
                                      "committed offset waits for it to end")
        self.seek(EARLIEST)
        self.cursor.set_metadata("")
        return True

    def prepare_reader_commit(self, txn: TxnID, first: Position, index: int, size: int | None,
                              request: str | None = None, metadata: str = "") -> AckRecord | MetadataRecord | None:
        """A commit inside ``txn``: the record of a cumulative ack of everything before message
        ``index`` of the entry at ``first``, carrying ``metadata`` for the commit to set; a
        ``MetadataRecord`` when only the metadata changes (the cursor is there already, or
        ``txn`` holds that ack); None when nothing does. It may only move forward:
        ``InvalidArgument`` for a position before the cursor's, or before an ack ``txn`` holds
        already."""
        ack = normalize_ack(self._check_reader_commit(first, index, size, metadata))
        target = (first, index)
        if target < self.first_unacked():
            raise InvalidArgument(f"{txn} commits {first} index {index}, before the committed "
                                  f"{self.first_unacked()}: a transaction does not move a committed position back")
        own = self.pending.cumulative_point_of(txn)
        if target == self.first_unacked() or (own is not None and cumulative_point(ack) == own):
            # There already (a retry with a new request id, or a commit of the committed offset):
            # only the metadata may change.
            return self.pending.prepare_metadata(txn, metadata, request)
        if own is not None and cumulative_point(ack) < own:
            raise InvalidArgument(f"{txn} commits {first} index {index}, before its own pending commit")
        return self.pending.prepare_ack(txn, AckKind.CUMULATIVE, [ack], lambda _: True, request, metadata)

    def _check_reader_commit(self, first: Position, index: int, size: int | None, metadata: str) -> AckTuple:
        """The cumulative ack that acks everything before message ``index`` of ``first``;
        ``InvalidArgument`` for a malformed one or bad ``metadata`` (``MetadataTooLarge`` past
        the limit), ``NotAllowed`` while consumers or a lease read this subscription."""
        if not isinstance(first, Position) or type(index) is not int or index < 0:
            raise InvalidArgument(f"a reader commit names an entry position and an index >= 0, got {first!r}, "
                                  f"{index!r}")
        if index > 0 and (type(size) is not int or not index < size):
            raise InvalidArgument(f"index {index} of an entry of {size!r} messages")
        check_metadata(metadata)
        if self.dispatcher.consumer_ids():
            raise NotAllowed("consumers are attached: a Kafka group and consumers do not mix on one subscription")
        if self.leases.current is not None:
            raise NotAllowed("a lease is held: a Kafka group and leases do not mix on one subscription")
        if index == 0:
            return (position_before(first), None, None)
        return (first, index - 1, size)

    # --- leases (the bulk path, see ``lease.py``) -----------------------------------------------

    def lease_start(self) -> Position:
        """Where the next lease begins: the cursor, or past a pending cumulative ack (after a
        restart forgot the lease it ended, its range must not go out again while the txn may
        still commit it; an abort rewinds the cursor's view and it goes out then)."""
        pending = self.pending.cumulative_through
        start = self.cursor.acked_below
        return start if pending is None else max(start, Position(pending.ledger_id, pending.entry_id + 1))

    def grant_lease(self, holder: str, epoch: int, now_ms: int, plan: RangePlan, max_entries: int,
                    timeout_ms: int) -> Lease | None:
        """The holder's lease of the next range from the cursor (its standing one on a retry), or
        None: another holder's lease stands, or nothing is readable past the cursor."""
        if self.dispatcher.consumer_ids():
            raise NotAllowed("consumers are attached: consumers and leases do not mix on one subscription")
        decision = self.leases.prepare_grant(holder, epoch, now_ms)
        if decision is not None:
            return decision or None
        planned = plan_range(plan, max(self.lease_start(), plan.first_readable), max_entries)
        if planned is None:
            return None
        lease = self.leases.grant(holder, epoch, *planned, plan.aborted, now_ms, timeout_ms,
                                  spans=ledger_spans(plan, *planned), counted=_counted(plan, planned[1]))
        self._handed_out(lease)
        return lease

    def grow_lease(self, lease_id: int, holder: str, epoch: int, plan: RangePlan, max_entries: int) -> Lease:
        """The holder's unacked lease grown to the end of ``plan`` (planned from the lease's
        start), at most ``max_entries`` entries; unchanged when the plan ends no further."""
        lease = self.leases.held(lease_id, holder, epoch)
        planned = plan_range(plan, lease.start, max_entries)
        if planned is None or planned[1] <= lease.end:
            return lease
        assert planned[0] == lease.start, (planned, lease)  # the entries a lease holds are never trimmed
        grown = self.leases.grow(lease_id, holder, epoch, planned[1], plan.aborted, ledger_spans(plan, *planned),
                                 _counted(plan, planned[1]))
        self._handed_out(grown)
        return grown

    def _handed_out(self, lease: Lease) -> None:
        self.delivered_through = max(self.delivered_through, lease.end)  # its end may now be acked in a txn
        if self.given_back is not None:
            # A lease starts at the first message neither acked nor held (``lease_start``) and is
            # handed out whole: every given-back message up to its end is handed out again.
            last = self.given_back[1]
            self.given_back = None if lease.end >= last else (next_position(lease.end), last)

    def prepare_lease_ack(self, lease_id: int, holder: str, epoch: int, txn: TxnID,
                          request: str | None = None) -> AckRecord | None:
        """The record acknowledging a held lease's whole range in ``txn``: one cumulative ack of
        its end (``NotAllowed`` when the lease is not held any more; ``TransactionConflict`` for a
        successor whose acked predecessor's txn has not ended: wait for ``leases.waiting_on``)."""
        lease = self.leases.held(lease_id, holder, epoch)
        self._check_not_chained(lease)
        return self.prepare_ack(txn, [(lease.end, None, None)], cumulative=True, request=request)

    def ack_lease_plain(self, lease_id: int, holder: str, epoch: int) -> None:
        """Acknowledge a held lease's range outside any txn: the lease ends and the cursor moves
        past its end at once (``NotAllowed`` once it is not held, or acked in a txn;
        ``TransactionConflict`` as for ``prepare_lease_ack``)."""
        self._check_not_chained(self.leases.held(lease_id, holder, epoch))
        lease = self.leases.release(lease_id, holder, epoch)
        self.ack([(lease.end, None, None)], cumulative=True)

    def _check_not_chained(self, lease: Lease) -> None:
        if lease is self.leases.successor:
            assert self.leases.current is not None
            raise TransactionConflict(f"lease {lease.lease_id} follows a range acked in {self.leases.current.txn}, "
                                      "which has not ended: its end can be acked once that txn committed")

    # --- seek --------------------------------------------------------------------------------

    def seek(self, position: Position) -> None:
        """Deliver again from ``position`` (inclusive), forgetting acks above it; a forward seek
        over a message pending in a txn is a ``TransactionConflict``."""
        self.pending.check_seek(position)
        self.cursor.seek(position)
        self.dispatcher.reset()
        self.read_position = self.cursor.acked_below
        self.generation += 1

    # --- durability --------------------------------------------------------------------------

    def recovered(self, readable_end: Position) -> None:
        """After replay: read again from the cursor. An earlier incarnation may have delivered
        anything readable now, so acks of it are allowed; and what was given back and maybe not
        handed out again (as persisted, and by the replayed aborts) reaches that far too."""
        self.read_position = self.cursor.acked_below
        self.delivered_through = readable_end
        if self.given_back is not None:
            self.given_back = (self.given_back[0], max(self.given_back[1], readable_end))
        self.max_read = readable_end

    def persisted_form(self) -> PersistedCursor:
        return PersistedCursor(self.cursor.snapshot(), self.applied_log_position, self.given_back)

    def trim_point(self, persisted: PersistedCursor) -> Position | None:
        """The pending-ack log entry up to which (inclusive) the log may be deleted, given the
        cursor form last persisted; None when nothing may go."""
        point = self.log_index.trim_point(position_before(persisted.cursor.acked_below))
        if point is None or point > persisted.log_position:
            return None  # only entries the persisted form includes (always so under the actor's lock)
        if self._metadata_logged and point >= min(self._metadata_logged.values()):
            return None  # a pending txn's metadata record would go: wait for its end
        return point

    # --- introspection -----------------------------------------------------------------------

    def backlog_entries(self, ledger_ends: Sequence[tuple[int, int]]) -> int:
        """Partition entries up to its readable end that are not acked (partially acked batches
        count), given ``(ledger_id, last_entry_id)`` of the partition's ledgers."""
        start = self.cursor.acked_below
        if self.max_read < start:
            return 0
        total = count_entries(ledger_ends, start, self.max_read)
        for range_start, range_end in self.cursor.acked_ranges():
            if range_start <= self.max_read:
                total -= count_entries(ledger_ends, range_start, min(position_before(range_end), self.max_read))
        return max(total, 0)

    def stats(self) -> dict[str, Any]:
        cursor = self.cursor.stats()
        pending = self.pending.stats()
        return {
            "type": str(self.dispatcher.type) if self.dispatcher.type else None,
            "consumers": self.dispatcher.consumer_stats(),
            "mark_delete_position": str(cursor.mark_delete_position),
            "acked_ranges": cursor.acked_ranges,
            "partially_acked_batches": cursor.partially_acked_batches,
            "unacked": self.dispatcher.outstanding,
            "queued": self.dispatcher.queued,
            "draining_keys": self.dispatcher.draining_keys(),
            "read_position": str(self.read_position),
            "delivered_through": str(self.delivered_through),
            "generation": self.generation,
            "pending_ack": {
                "txns": [str(t) for t in self.pending.pending_txns()],
                "positions": pending.pending_positions,
                "batch_indexes": pending.pending_batch_indexes,
                "cumulative": None if pending.cumulative is None else
                [str(pending.cumulative[0]), str(pending.cumulative[1])],
                "per_txn": [{"txn": str(t.txn), "entries": t.entries, "batch_indexes": t.batch_indexes,
                             "cumulative": None if t.cumulative is None else str(t.cumulative)}
                            for t in pending.per_txn],
            },
            "log_index_entries": len(self.log_index),
            "applied_log_position": str(self.applied_log_position),
        }
