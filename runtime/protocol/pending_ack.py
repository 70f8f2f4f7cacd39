"""Transactional acks of one subscription: Pulsar's PendingAckHandle + MLPendingAckStore, pure.

Acks made inside a transaction are kept here, apart from the cursor, until the transaction ends:
commit applies them to the ``Cursor``, abort drops them and says what to redeliver. Every change
is **prepare -> log -> apply** (as in ``coordinator_state``): ``prepare_*`` validates against the
current state and returns the record to append to the pending-ack ledger (or None: nothing to log,
answer success); ``apply`` is the only mutator, used live right after the append and for replay.

Conflict rules (``TransactionConflict``, naming the holder):

* an individual ack of an entry or batch index already acked in the cursor (by a committed
  transaction or a plain ack), or pending in another transaction - individually, or under that
  transaction's pending cumulative ack;
* a cumulative ack of a message already acked in the cursor (at or below the mark-delete
  position, or acked individually), while another transaction holds a pending cumulative ack
  (Pulsar: one per subscription), at or below the same transaction's pending cumulative ack
  (Pulsar's rule, batch index included: up to index 2 of an entry, then up to index 1 of it, is a
  conflict), or over an entry pending individually in another transaction.
  The last and "individual under another's cumulative" are stricter than Pulsar, which lets both
  pass: two transactions that both commit would then each have consumed the same message.
* Within one transaction, individual acks are idempotent: the same index again, or an entry under
  its own cumulative ack, is a no-op (Pulsar rejects an individual ack pending in the same txn).

A cumulative ack names one message: a whole entry (everything up to it) or batch index i of an
entry (everything before the entry, and indexes 0..i of it; the last index means the whole entry).
One ack call is one record, so a call is logged entirely or not at all.

Retries. The caller gives each ack call a request id, logged in its record. A call whose request
id is logged already for a pending transaction is a retry (Ray or the client re-sent a call whose
reply was lost) and succeeds without logging anything; a new call repeating the same cumulative
ack is a conflict, as in Pulsar. Replay rebuilds the ids with the records, so this holds across a
restart; the log keeps every record of a pending transaction (see below), so none is forgotten.

Acking a message that was never delivered on the subscription is ``NotAllowed``.

Commit metadata (a Kafka group's offset metadata, kept by the cursor with its mark-delete bound):
a cumulative ack may carry the metadata its transaction's commit sets (``AckRecord.metadata``), and
a ``MetadataRecord`` sets it without acking more (a Kafka transaction committing the committed
offset again, with other metadata). Commit applies it after the acks; abort drops it. While one
transaction holds metadata, another's cumulative ack or metadata is a ``TransactionConflict``.

Invariant: no pending ack is below the cursor's mark-delete bound (prepare rejects acked
messages; the actor keeps plain acks and seeks off pending ones with ``held_by``,
``check_plain_cumulative`` and ``check_seek``). So ``PendingAckLogIndex.trim_point`` never lets the
log lose a record of a pending transaction.

Contract for the caller (the subscription actor): serialize prepare -> append -> apply (one lock
for the subscription; ``apply`` raises ``InvalidTxnState`` when a race broke the rules, and such a
record must not reach the log). Replay: see ``PendingAck.apply``.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Sequence

import msgspec
from sortedcontainers import SortedDict

from raytxn.errors import (
    CorruptLedger,
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionConflict,
)
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor, check_batch, check_metadata, position_before

DEFAULT_MAX_REMEMBERED_ENDED = 10_000
MAX_REQUEST_ID_LENGTH = 128
_WHOLE = 1 << 62  # above every batch index: a cumulative ack of a whole entry sorts after its indexes


class AckKind(enum.StrEnum):
    INDIVIDUAL = "individual"
    CUMULATIVE = "cumulative"


class Ack(msgspec.Struct, frozen=True, array_like=True):
    """One acked message: an entry (``batch_index`` None) or one index of a batch entry."""

    position: Position
    batch_index: int | None = None
    batch_size: int | None = None


class AckRecord(msgspec.Struct, tag="ack", frozen=True):
    """Acks made in ``txn`` by one ack call. A cumulative record holds exactly one ack (a whole
    entry, or a batch index: see the module docstring). ``request``: the call's id, by which a
    retry of it is recognised (None in records logged before request ids existed)."""

    txn: TxnID
    kind: AckKind
    acks: tuple[Ack, ...]
    request: str | None = None
    # The consumer that made the call (None: not a consumer's, or logged before this existed).
    # Live bookkeeping only: a message another consumer holds stays with it until the txn commits.
    consumer: str | None = None
    # The commit metadata the txn's commit sets on the cursor (cumulative records only; None:
    # leaves it, as every record logged before this existed does).
    metadata: str | None = None

    def __post_init__(self) -> None:  # a ValueError here is a ValidationError when decoding
        if not self.acks:
            raise ValueError("an ack record needs at least one ack")
        if self.kind is AckKind.CUMULATIVE and len(self.acks) != 1:
            raise ValueError("a cumulative ack record holds exactly one ack")
        if self.metadata is not None and self.kind is not AckKind.CUMULATIVE:
            raise ValueError("only a cumulative ack record carries commit metadata")
        for ack in self.acks:
            index, size = ack.batch_index, ack.batch_size
            if (index is None) != (size is None) or (index is not None and size is not None and not 0 <= index < size):
                raise ValueError(f"bad batch index in {ack}")


class MetadataRecord(msgspec.Struct, tag="metadata", frozen=True):
    """``txn``'s commit sets the cursor's commit metadata to ``metadata`` (it acks nothing more).
    ``request`` as for ``AckRecord``."""

    txn: TxnID
    metadata: str
    request: str | None = None


class CommitRecord(msgspec.Struct, tag="commit", frozen=True):
    txn: TxnID


class AbortRecord(msgspec.Struct, tag="abort", frozen=True):
    txn: TxnID


Record = AckRecord | MetadataRecord | CommitRecord | AbortRecord
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    if not isinstance(record, AckRecord | MetadataRecord | CommitRecord | AbortRecord):
        raise InvalidArgument(f"not a pending-ack record: {record!r}")
    return _ENCODER.encode(record)


def decode_record(data: bytes, path: str = "") -> Record:
    """The record in ``data``; ``CorruptLedger`` (naming ``path``) when it is not one."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError as error:
        raise CorruptLedger(f"undecodable pending-ack record at {path or '?'}: {error}", path) from error


class Redelivery(msgspec.Struct, frozen=True):
    """What an abort hands back to the consumers.

    ``messages``: ``(position, batch indexes or None for the whole entry)``, ascending, not acked
    in the cursor now. ``cumulative_through``: the aborted transaction's cumulative ack; redeliver
    every dispatched message up to it that is not acked (``Cursor.is_acked``) and not held by
    another transaction (``PendingAck.held_by``)."""

    messages: tuple[tuple[Position, tuple[int, ...] | None], ...] = ()
    cumulative_through: Position | None = None


class TxnPendingStats(msgspec.Struct, frozen=True):
    txn: TxnID
    entries: int  # entries acked whole
    batch_indexes: int  # single batch indexes acked
    cumulative: Position | None


class PendingAckStats(msgspec.Struct, frozen=True):
    pending_txns: int
    pending_positions: int
    pending_batch_indexes: int
    cumulative: tuple[TxnID, Position] | None
    per_txn: tuple[TxnPendingStats, ...]


class _Hold:
    """Who holds one position: the whole entry, or single batch indexes (never both at once
    for different transactions)."""

    __slots__ = ("batch_size", "indexes", "whole")

    def __init__(self) -> None:
        self.whole: TxnID | None = None
        self.indexes: dict[int, TxnID] = {}
        self.batch_size: int | None = None


class _TxnAcks:
    """The pending acks of one transaction: position -> acked-index mask (None: whole entry), the
    entries its cumulative acks cover, the highest of them, and the ids of its logged calls."""

    __slots__ = ("cumulative", "individual", "metadata", "point", "requests")

    def __init__(self) -> None:
        self.individual: dict[Position, int | None] = {}  # a cumulative ack's batch indexes too
        self.cumulative: Position | None = None  # every entry up to here (None: none above the bound)
        self.point: tuple[Position, int] | None = None  # its highest cumulative ack (see _point)
        self.requests: set[str] = set()
        self.metadata: str | None = None  # the commit metadata its commit sets (None: none)


Delivered = Callable[[Position], bool] | Position


class PendingAck:
    """Pending transactional acks of one subscription, over the subscription's ``cursor``."""

    def __init__(self, cursor: Cursor, *, max_remembered_ended: int = DEFAULT_MAX_REMEMBERED_ENDED) -> None:
        self.cursor = cursor
        self._txns: dict[TxnID, _TxnAcks] = {}
        self._holds: SortedDict = SortedDict()  # Position -> _Hold, for every individually pending entry
        self._cumulative_txn: TxnID | None = None  # the one with a pending cumulative ack (Pulsar)
        self._cumulative: tuple[TxnID, Position] | None = None  # it, and the entries that ack covers
        self._metadata_txn: TxnID | None = None  # the one holding commit metadata
        # Volatile memory of ended txns (rebuilt by replay as far as the log goes): rejects a
        # retried ack of an ended txn. Not needed for correctness of the durable state.
        self._ended: OrderedDict[TxnID, bool] = OrderedDict()  # txn -> committed
        self._max_remembered_ended = max_remembered_ended

    # --- queries -----------------------------------------------------------------------------

    def held_by(self, position: Position, batch_index: int | None = None) -> TxnID | None:
        """The transaction holding a pending ack of that entry (any index of it when
        ``batch_index`` is None) or batch index, else None. Pulsar ignores a plain ack of a
        message held by a transaction; the actor should do the same (or refuse it). None for
        what the cursor acked already."""
        if self.cursor.is_acked(position, batch_index):
            return None
        return self._holder(position, batch_index, except_txn=None)

    @property
    def holds_any(self) -> bool:
        """Whether any transaction holds a pending ack (when not, ``held_by`` is None for all)."""
        return bool(self._holds) or self._cumulative is not None

    def holds_at(self, position: Position) -> bool:
        """Whether a transaction holds an ack of the entry or of some batch index of it."""
        return position in self._holds or self._cumulative_holder(position) is not None

    def held_positions(self, first: Position, last: Position) -> list[Position]:
        """The entries in ``first..last`` (inclusive) with an individual ack (whole, or of some
        batch index) pending in a txn, ascending."""
        return list(self._holds.irange(first, last))

    @property
    def cumulative_through(self) -> Position | None:
        """The highest entry a pending cumulative ack covers (None: no cumulative ack pending)."""
        return None if self._cumulative is None else self._cumulative[1]

    def pending_txns(self) -> list[TxnID]:
        return sorted(self._txns)

    def is_pending(self, txn: TxnID) -> bool:
        return txn in self._txns

    @property
    def pending_txn_count(self) -> int:
        return len(self._txns)

    @property
    def pending_position_count(self) -> int:
        """Entries with an individual ack (whole, or some batch indexes) pending in a txn."""
        return len(self._holds)

    def pending_of(self, txn: TxnID) -> tuple[list[Ack], Position | None]:
        """The individual acks (as ``Ack``; batch indexes one by one) and the cumulative ack
        pending in ``txn``."""
        acks = self._txns.get(txn)
        if acks is None:
            return [], None
        result: list[Ack] = []
        for position, mask in sorted(acks.individual.items()):
            if mask is None:
                result.append(Ack(position))
            else:
                size = self._holds[position].batch_size
                result.extend(Ack(position, index, size) for index in range(size) if mask >> index & 1)
        return result, acks.cumulative

    def metadata_of(self, txn: TxnID) -> str | None:
        """The commit metadata ``txn``'s commit would set (None: it holds none)."""
        acks = self._txns.get(txn)
        return None if acks is None else acks.metadata

    def cumulative_point_of(self, txn: TxnID) -> tuple[Position, int] | None:
        """How far ``txn``'s pending cumulative ack reaches, comparable with ``cumulative_point``
        (None: it has none)."""
        acks = self._txns.get(txn)
        return None if acks is None else acks.point

    def pending_at_or_below(self, tc_id: int, low_watermark: int) -> list[TxnID]:
        """Pending transactions of coordinator ``tc_id`` with sequence <= ``low_watermark``:
        they ended at the coordinator, so abort them here (dangling, e.g. the end was lost)."""
        return sorted(txn for txn in self._txns if txn.tc_id == tc_id and txn.sequence <= low_watermark)

    def pending_ack_set(self, position: Position, batch_size: int) -> int:
        """Pulsar's ack set of an entry with pending acks folded in: bit i set = index i neither
        acked in the cursor nor pending in any transaction."""
        hold = self._holds.get(position)
        if self.cursor.is_acked(position) or self._cumulative_holder(position) is not None or (
                hold is not None and hold.whole is not None):
            return 0
        bits = (1 << batch_size) - 1
        partial = self.cursor.partial_batch(position)
        if partial is not None:
            bits &= partial[1]
        for index in hold.indexes if hold is not None else ():
            bits &= ~(1 << index)
        return bits

    def stats(self) -> PendingAckStats:
        per_txn = tuple(
            TxnPendingStats(txn, sum(mask is None for mask in acks.individual.values()),
                            sum(mask.bit_count() for mask in acks.individual.values() if mask is not None),
                            acks.cumulative)
            for txn, acks in sorted(self._txns.items()))
        return PendingAckStats(len(self._txns), len(self._holds),
                               sum(len(hold.indexes) for hold in self._holds.values()), self._cumulative, per_txn)

    def _cumulative_holder(self, position: Position) -> TxnID | None:
        if self._cumulative is not None and position <= self._cumulative[1]:
            return self._cumulative[0]
        return None

    def _holder(self, position: Position, batch_index: int | None, except_txn: TxnID | None) -> TxnID | None:
        """A transaction other than ``except_txn`` holding the entry / index, else None."""
        holder = self._cumulative_holder(position)
        if holder is not None and holder != except_txn:
            return holder
        hold = self._holds.get(position)
        if hold is None:
            return None
        if hold.whole is not None and hold.whole != except_txn:
            return hold.whole
        if batch_index is not None:
            holder = hold.indexes.get(batch_index)
            return holder if holder != except_txn else None
        return next((txn for txn in hold.indexes.values() if txn != except_txn), None)

    def _covers(self, txn: TxnID, position: Position, batch_index: int | None) -> bool:
        """Whether ``txn`` already holds that ack (so acking it again changes nothing)."""
        acks = self._txns.get(txn)
        if acks is None:
            return False
        if acks.cumulative is not None and position <= acks.cumulative:
            return True
        if position not in acks.individual:
            return False
        mask = acks.individual[position]
        if mask is None:
            return True
        if batch_index is None:  # the whole entry: covered when every index is held
            return mask == (1 << (self._holds[position].batch_size or 0)) - 1
        return bool(mask >> batch_index & 1)

    def _batch_size_of(self, position: Position) -> int | None:
        hold = self._holds.get(position)
        if hold is not None and hold.batch_size is not None:
            return hold.batch_size
        partial = self.cursor.partial_batch(position)
        return partial[0] if partial is not None else None

    # --- checks for plain (non-transactional) cursor moves ------------------------------------

    def check_plain_cumulative(self, position: Position) -> None:
        """``TransactionConflict`` when a plain cumulative ack up to ``position`` would ack a
        message pending in a transaction."""
        holder = self._first_holder_at_or_below(position, except_txn=None)
        if holder is not None:
            raise TransactionConflict(f"cumulative ack up to {position} covers messages pending in {holder}")

    def check_seek(self, position: Position) -> None:
        """``TransactionConflict`` when seeking to ``position`` would ack (skip) a message pending
        in a transaction. Seeking backwards is always allowed."""
        holder = self._first_holder_at_or_below(position, except_txn=None, inclusive=False)
        if holder is not None:
            raise TransactionConflict(f"seek to {position} skips messages pending in {holder}")

    def _first_holder_at_or_below(self, position: Position, except_txn: TxnID | None,
                                  inclusive: bool = True) -> TxnID | None:
        if self._cumulative is not None and self._cumulative[0] != except_txn:
            first_covered = self.cursor.acked_below  # a cumulative ack covers from the bound up
            if first_covered < position or (inclusive and first_covered == position):
                return self._cumulative[0]
        for held in self._holds.irange(maximum=position, inclusive=(True, inclusive)):
            holder = self._holder(held, None, except_txn)
            if holder is not None:
                return holder
        return None

    # --- prepare -----------------------------------------------------------------------------

    def prepare_ack(self, txn: TxnID, kind: AckKind, acks: Sequence[Ack | tuple], delivered: Delivered,
                    request: str | None = None, metadata: str | None = None) -> AckRecord | None:
        """Validate the acks of one call made in ``txn``; the record to log, or None when there is
        nothing to log: ``txn`` holds them all already, or ``request`` (the call's id) is logged
        for it already (a retry). ``delivered`` says whether a position was dispatched on this
        subscription (a predicate, or the highest dispatched position). ``metadata``: the commit
        metadata a cumulative ack's commit sets (None: none)."""
        if self._check_call(txn, request):
            return None  # a retry of a call that was logged (its reply was lost): done
        try:
            kind = AckKind(kind)
        except ValueError:
            raise InvalidArgument(f"ack kind must be individual or cumulative, got {kind!r}") from None
        if metadata is not None:
            if kind is not AckKind.CUMULATIVE:
                raise InvalidArgument("only a cumulative ack carries commit metadata")
            check_metadata(metadata)
        normalized = [_normalize(ack) for ack in acks]
        if not normalized:
            raise InvalidArgument("no acks given")
        for ack in normalized:
            if not (delivered(ack.position) if callable(delivered) else ack.position <= delivered):
                raise NotAllowed(f"{txn} acks {ack.position}, which was never delivered on this subscription")
        if kind is AckKind.CUMULATIVE:
            return self._prepare_cumulative(txn, normalized, request, metadata)
        new: dict[tuple[Position, int | None], Ack] = {}
        sizes: dict[Position, int] = {}
        for ack in normalized:
            position, index = ack.position, ack.batch_index
            if index is not None:
                self._check_batch_size(ack, sizes)
            if self.cursor.is_acked(position, index):
                raise TransactionConflict(f"{txn} acks {_name(position, index)}, which is already acked")
            holder = self._holder(position, index, except_txn=txn)
            if holder is not None:
                raise TransactionConflict(f"{txn} acks {_name(position, index)}, which is pending in {holder}")
            if self._covers(txn, position, index) or (position, None) in new:
                continue
            new[(position, index)] = ack
        return AckRecord(txn, AckKind.INDIVIDUAL, tuple(new.values()), request) if new else None

    def _check_batch_size(self, ack: Ack, sizes: dict[Position, int]) -> None:
        """``InvalidArgument`` when ``ack``'s batch size disagrees with the one known (pending, in
        the cursor, or earlier in the same call: ``sizes``)."""
        known = sizes.setdefault(ack.position, self._batch_size_of(ack.position) or ack.batch_size)  # type: ignore[arg-type]
        if known != ack.batch_size:
            raise InvalidArgument(f"{ack.position} holds {known} messages, not {ack.batch_size}")

    def _check_call(self, txn: TxnID, request: str | None) -> bool:
        """Check a call's transaction and request id; True when it is a retry of a logged call."""
        if not isinstance(txn, TxnID):
            raise InvalidArgument(f"txn must be a TxnID, got {txn!r}")
        if request is not None and (type(request) is not str or not 0 < len(request) <= MAX_REQUEST_ID_LENGTH):
            raise InvalidArgument(f"request id must be a str of 1 to {MAX_REQUEST_ID_LENGTH} characters, "
                                  f"got {request!r}")
        ended = self._ended.get(txn)
        if ended is not None:
            raise (TransactionAlreadyCommitted if ended else TransactionAlreadyAborted)(
                f"{txn} already {'committed' if ended else 'aborted'} on this subscription")
        pending = self._txns.get(txn)
        return request is not None and pending is not None and request in pending.requests

    def prepare_metadata(self, txn: TxnID, metadata: str, request: str | None = None) -> MetadataRecord | None:
        """The record by which ``txn``'s commit sets the commit metadata without acking more, or
        None when there is nothing to log: its commit sets that already (or, holding nothing, the
        cursor has it), or ``request`` is a retry. ``TransactionConflict`` while another txn holds
        a cumulative ack or metadata."""
        if self._check_call(txn, request):
            return None
        check_metadata(metadata)
        pending = self._txns.get(txn)
        if metadata == (self.cursor.metadata if pending is None or pending.metadata is None else pending.metadata):
            return None
        holder = self._metadata_conflict(txn)
        if holder is not None:
            raise TransactionConflict(f"{txn} sets commit metadata while {holder} holds a cumulative ack or metadata")
        return MetadataRecord(txn, metadata, request)

    def _metadata_conflict(self, txn: TxnID) -> TxnID | None:
        """Another transaction holding a cumulative ack or commit metadata."""
        return next((holder for holder in (self._cumulative_txn, self._metadata_txn)
                     if holder is not None and holder != txn), None)

    def _prepare_cumulative(self, txn: TxnID, acks: list[Ack], request: str | None,
                            metadata: str | None = None) -> AckRecord:
        if len(acks) != 1:
            raise InvalidArgument("a cumulative ack takes exactly one position")
        ack = _whole_if_last(acks[0])
        position, index = ack.position, ack.batch_index
        named = _name(position, index)
        if position < self.cursor.acked_below:
            raise TransactionConflict(f"{txn} acks cumulatively up to {named}, at or below the "
                                      f"mark-delete position {self.cursor.mark_delete_position}")
        if index is not None:
            self._check_batch_size(ack, {})
        if self.cursor.is_acked(position, index):
            raise TransactionConflict(f"{txn} acks cumulatively up to {named}, which is already acked")
        holder = self._cumulative_txn
        if holder is not None and holder != txn:
            raise TransactionConflict(f"{txn} acks cumulatively while {holder} holds a pending "
                                      f"cumulative ack up to {_point_name(self._txns[holder].point)}")
        holder = self._metadata_conflict(txn)
        if holder is not None:
            raise TransactionConflict(f"{txn} acks cumulatively while {holder} holds commit metadata")
        own = self._txns[txn].point if txn in self._txns else None
        if own is not None and _point(ack) <= own:
            raise TransactionConflict(f"{txn} acks cumulatively up to {named}, at or below its own "
                                      f"pending cumulative ack up to {_point_name(own)}")
        holder = self._cumulative_conflict(txn, ack)
        if holder is not None:
            raise TransactionConflict(f"{txn} acks cumulatively up to {named} over messages pending in {holder}")
        return AckRecord(txn, AckKind.CUMULATIVE, (ack,), request, metadata=metadata)

    def _cumulative_conflict(self, txn: TxnID, ack: Ack) -> TxnID | None:
        """Another transaction holding a message that ``txn``'s cumulative ``ack`` covers."""
        holder = self._first_holder_at_or_below(_cover(ack), except_txn=txn)
        if holder is not None or ack.batch_index is None:
            return holder
        return next((holder for index in self._unacked_indexes_through(ack)
                     if (holder := self._holder(ack.position, index, except_txn=txn)) is not None), None)

    def _unacked_indexes_through(self, ack: Ack) -> list[int]:
        """The indexes 0..i of a cumulative ack of batch index i that the cursor has not acked."""
        assert ack.batch_index is not None
        return [index for index in range(ack.batch_index + 1) if not self.cursor.is_acked(ack.position, index)]

    def prepare_commit(self, txn: TxnID) -> CommitRecord | None:
        """The record that commits ``txn``'s acks, or None when it has none pending (success; the
        outcome is remembered, volatile only, so that a late ack of ``txn`` is refused)."""
        if self._ended.get(txn) is False:
            raise TransactionAlreadyAborted(f"{txn} was aborted on this subscription")
        if txn in self._txns:
            return CommitRecord(txn)
        self._remember_ended(txn, committed=True)
        return None

    def prepare_abort(self, txn: TxnID) -> AbortRecord | None:
        """The record that aborts ``txn``'s acks, or None when it has none pending (success, as
        for ``prepare_commit``)."""
        if self._ended.get(txn) is True:
            raise TransactionAlreadyCommitted(f"{txn} was committed on this subscription")
        if txn in self._txns:
            return AbortRecord(txn)
        self._remember_ended(txn, committed=False)
        return None

    # --- apply -------------------------------------------------------------------------------

    def apply(self, record: Record, *, in_cursor_snapshot: bool = False) -> Redelivery | None:
        """Apply a logged record (the only mutator). Returns the redelivery of an abort.

        Replay after a restart: restore the cursor from its newest snapshot, build a fresh
        ``PendingAck`` over it, then apply every record of the pending-ack log in order, passing
        ``in_cursor_snapshot=True`` for records at or before the log position the snapshot was
        taken at (their commits are in the cursor already: not applied again, which matters after
        a backward seek). Without that position, re-applying commits is still idempotent unless
        the cursor was seeked backwards."""
        if isinstance(record, AckRecord):
            self._apply_ack(record)
            return None
        if isinstance(record, MetadataRecord):
            self._apply_metadata(record.txn, record.metadata, record.request)
            return None
        if isinstance(record, CommitRecord):
            self._end(record.txn, committed=True, touch_cursor=not in_cursor_snapshot)
            return None
        if isinstance(record, AbortRecord):
            return self._end(record.txn, committed=False, touch_cursor=False)
        raise InvalidArgument(f"not a pending-ack record: {record!r}")

    def _apply_ack(self, record: AckRecord) -> None:
        txn = record.txn
        if record.kind is AckKind.CUMULATIVE:
            holds = self._apply_cumulative_checks(txn, record.acks[0])
        else:
            holds = list(record.acks)
            # Check every ack first, so that a refused record leaves no trace.
            for ack in holds:
                holder = self._holder(ack.position, ack.batch_index, except_txn=txn)
                if holder is not None:
                    raise InvalidTxnState(f"{txn} acks {_name(ack.position, ack.batch_index)} pending in {holder} "
                                          "(prepare -> log -> apply not serialized?)")
        acks = self._txns.setdefault(txn, _TxnAcks())
        if record.request is not None:
            acks.requests.add(record.request)
        if record.kind is AckKind.CUMULATIVE:
            self._raise_cumulative(txn, acks, record.acks[0])
        for ack in holds:
            self._hold(txn, acks, ack)
        if record.metadata is not None:
            self._apply_metadata(txn, record.metadata, None)

    def _apply_metadata(self, txn: TxnID, metadata: str, request: str | None) -> None:
        """``txn``'s commit sets ``metadata`` (the rule of ``prepare_metadata`` still met, checked
        for a metadata record before it changes anything; ``_apply_cumulative_checks`` did it
        for an ack record's)."""
        holder = self._metadata_conflict(txn)
        if holder is not None:
            raise InvalidTxnState(f"{txn} sets commit metadata while {holder} holds a cumulative ack or metadata "
                                  "(prepare -> log -> apply not serialized?)")
        acks = self._txns.setdefault(txn, _TxnAcks())
        if request is not None:
            acks.requests.add(request)
        acks.metadata = metadata
        self._metadata_txn = txn

    def _apply_cumulative_checks(self, txn: TxnID, ack: Ack) -> list[Ack]:
        """The rules a cumulative record must still meet (``InvalidTxnState`` otherwise); returns
        the batch indexes it holds one by one."""
        if self._cumulative_txn is not None and self._cumulative_txn != txn:
            raise InvalidTxnState(f"{txn} cumulative ack while {self._cumulative_txn} holds one "
                                  "(prepare -> log -> apply not serialized?)")
        if self._metadata_txn is not None and self._metadata_txn != txn:
            raise InvalidTxnState(f"{txn} cumulative ack while {self._metadata_txn} holds commit metadata "
                                  "(prepare -> log -> apply not serialized?)")
        holder = self._cumulative_conflict(txn, ack)
        if holder is not None:
            raise InvalidTxnState(f"{txn} cumulative ack up to {_name(ack.position, ack.batch_index)} over acks "
                                  f"pending in {holder}")
        if ack.batch_index is None:
            return []
        return [Ack(ack.position, index, ack.batch_size) for index in self._unacked_indexes_through(ack)]

    def _raise_cumulative(self, txn: TxnID, acks: _TxnAcks, ack: Ack) -> None:
        """``txn``'s cumulative ack is now (at least) ``ack``; the entries it covers whole are
        tracked only from the cursor's bound up (nothing below it is pending)."""
        point = _point(ack)
        acks.point = max(point, acks.point or point)
        self._cumulative_txn = txn
        cover = _cover(ack)
        if cover >= self.cursor.acked_below:
            acks.cumulative = max(cover, acks.cumulative or cover)
        if acks.cumulative is not None:
            self._cumulative = (txn, acks.cumulative)

    def _hold(self, txn: TxnID, acks: _TxnAcks, ack: Ack) -> None:
        """``txn`` holds the entry or batch index of ``ack`` individually (checked before)."""
        position, index = ack.position, ack.batch_index
        if self._covers(txn, position, index):
            return
        hold = self._holds.get(position)
        if hold is None:
            hold = self._holds[position] = _Hold()
        if index is None:
            hold.whole = txn
            hold.indexes = {}  # only txn's own indexes can be there (checked before)
            acks.individual[position] = None
        else:
            hold.batch_size = ack.batch_size
            hold.indexes[index] = txn
            acks.individual[position] = (acks.individual.get(position) or 0) | 1 << index

    def _remember_ended(self, txn: TxnID, committed: bool) -> None:
        self._ended[txn] = committed
        self._ended.move_to_end(txn)
        while len(self._ended) > self._max_remembered_ended:
            self._ended.popitem(last=False)

    def _end(self, txn: TxnID, committed: bool, touch_cursor: bool) -> Redelivery:
        self._remember_ended(txn, committed)
        acks = self._txns.pop(txn, None)
        if acks is None:
            return Redelivery()  # nothing pending (ended before, or never acked here): a no-op
        sizes = {}
        for position in acks.individual:
            hold = self._holds[position]
            sizes[position] = hold.batch_size
            if hold.whole == txn:
                del self._holds[position]
            else:
                hold.indexes = {index: holder for index, holder in hold.indexes.items() if holder != txn}
                if not hold.indexes:
                    del self._holds[position]
        if self._cumulative_txn == txn:
            self._cumulative_txn = self._cumulative = None
        if self._metadata_txn == txn:
            self._metadata_txn = None
        if committed:
            if touch_cursor:
                if acks.cumulative is not None:
                    self.cursor.ack_cumulative(acks.cumulative)
                for position, mask in acks.individual.items():
                    if mask is None:
                        self.cursor.ack(position)
                    else:
                        for index in _indexes(mask):
                            self.cursor.ack(position, index, sizes[position])
                if acks.metadata is not None:
                    self.cursor.set_metadata(acks.metadata)
            return Redelivery()
        messages: list[tuple[Position, tuple[int, ...] | None]] = []
        for position, mask in sorted(acks.individual.items()):
            if self.cursor.is_acked(position):
                continue
            partial = self.cursor.partial_batch(position)
            if mask is None:
                messages.append((position, None if partial is None else tuple(_indexes(partial[1]))))
            else:
                unacked = tuple(index for index in _indexes(mask) if not self.cursor.is_acked(position, index))
                if unacked:
                    messages.append((position, unacked))
        cumulative = acks.cumulative if acks.cumulative is not None and acks.cumulative >= self.cursor.acked_below \
            else None
        return Redelivery(tuple(messages), cumulative)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` when the indexes disagree or a pending ack sits below the
        cursor's mark-delete bound (holds live and after a complete replay)."""
        owned: dict[tuple[Position, int | None], TxnID] = {}
        for txn, acks in self._txns.items():
            _require(bool(acks.individual) or acks.point is not None or acks.metadata is not None,
                     f"{txn} has nothing pending")
            _require((acks.metadata is not None) == (self._metadata_txn == txn), f"metadata of {txn} not indexed")
            for position, mask in acks.individual.items():
                _require(position >= self.cursor.acked_below, f"{txn} pending at {position} below the bound")
                for index in [None] if mask is None else _indexes(mask):
                    owned[(position, index)] = txn
            _require((acks.point is not None) == (self._cumulative_txn == txn), f"cumulative of {txn} not indexed")
            if acks.cumulative is not None:
                _require(acks.point is not None and acks.cumulative <= acks.point[0], f"cover of {txn} above its ack")
                _require(self._cumulative == (txn, acks.cumulative), f"cumulative of {txn} not indexed")
                _require(acks.cumulative >= self.cursor.acked_below, f"cumulative of {txn} below the bound")
        held: dict[tuple[Position, int | None], TxnID] = {}
        for position, hold in self._holds.items():
            _require(hold.whole is None or not hold.indexes, f"{position} held whole and by index")
            if hold.whole is not None:
                held[(position, None)] = hold.whole
            held.update(((position, index), txn) for index, txn in hold.indexes.items())
        _require(owned == held, f"holds {held} disagree with txns {owned}")
        if self._cumulative_txn is not None:
            _require(self._cumulative_txn in self._txns, "cumulative holder not pending")
        if self._cumulative is not None:
            _require(self._cumulative[0] == self._cumulative_txn, "cumulative cover without its txn")
        if self._metadata_txn is not None:
            _require(self._metadata_txn in self._txns, "metadata holder not pending")


class PendingAckLogIndex:
    """Pulsar's pendingAckLogIndex: which prefix of the pending-ack log the cursor made useless.

    Feed it every record in log order (live after each append, and during replay). After every
    ``max_index_lag`` ack records it remembers ``(highest position acked by any ack record so far
    -> log position of the last of them)``. Every record up to such a log position acks only
    positions <= its key, so once the mark-delete position reaches the key, those records can only
    belong to ended transactions (pending acks are never below mark-delete) and may be deleted.
    Log positions are opaque ordered Positions of the pending-ack ledger."""

    def __init__(self, max_index_lag: int = 500) -> None:
        if type(max_index_lag) is not int or max_index_lag < 1:
            raise InvalidArgument(f"max_index_lag must be a positive integer, got {max_index_lag!r}")
        self.max_index_lag = max_index_lag
        self._index: SortedDict = SortedDict()  # max acked position -> log position
        self._max_acked: Position | None = None
        self._lag = 0

    def on_logged(self, record: Record, log_position: Position) -> None:
        if not isinstance(record, AckRecord):
            return
        highest = max(ack.position for ack in record.acks)
        self._max_acked = highest if self._max_acked is None else max(self._max_acked, highest)
        self._lag += 1
        if self._lag >= self.max_index_lag:
            self._index[self._max_acked] = log_position  # keys and log positions rise together
            self._lag = 0

    def trim_point(self, mark_delete: Position) -> Position | None:
        """The log position up to which (inclusive) the log may be deleted when everything
        ``<= mark_delete`` is acked (pass the mark-delete of the cursor as persisted), or None."""
        index = self._index.bisect_right(mark_delete)
        return self._index.peekitem(index - 1)[1] if index else None

    def on_trimmed(self, log_position: Position) -> None:
        """Forget the index entries of a deleted log prefix (up to ``log_position``, inclusive)."""
        while self._index and self._index.peekitem(0)[1] <= log_position:
            self._index.popitem(0)

    def __len__(self) -> int:
        return len(self._index)


def _normalize(ack: Ack | tuple) -> Ack:
    if not isinstance(ack, Ack):
        if not isinstance(ack, tuple | list) or not 1 <= len(ack) <= 3:
            raise InvalidArgument(f"an ack is (position, batch_index, batch_size), got {ack!r}")
        ack = Ack(*ack)
    if not isinstance(ack.position, Position):
        raise InvalidArgument(f"ack position must be a Position, got {ack.position!r}")
    check_batch(ack.batch_index, ack.batch_size)
    return ack


def _whole_if_last(ack: Ack) -> Ack:
    """A cumulative ack of a batch's last index is one of the whole entry (the same messages)."""
    if ack.batch_index is not None and ack.batch_index == ack.batch_size - 1:  # type: ignore[operator]
        return Ack(ack.position)
    return ack


def cumulative_point(ack: Ack) -> tuple[Position, int]:
    """How far a cumulative ack of ``ack`` reaches (a batch's last index counting as the whole
    entry), comparable with ``PendingAck.cumulative_point_of``."""
    return _point(_whole_if_last(ack))


def _point(ack: Ack) -> tuple[Position, int]:
    """How far a cumulative ack reaches, comparable: (entry, batch index, or above all for the entry)."""
    return (ack.position, _WHOLE if ack.batch_index is None else ack.batch_index)


def _point_name(point: tuple[Position, int] | None) -> str:
    return "?" if point is None else _name(point[0], None if point[1] == _WHOLE else point[1])


def _cover(ack: Ack) -> Position:
    """The last entry a cumulative ack covers whole: its own, or (a batch index) the one before."""
    return ack.position if ack.batch_index is None else position_before(ack.position)


def _indexes(mask: int) -> list[int]:
    return [index for index in range(mask.bit_length()) if mask >> index & 1]


def _name(position: Position, batch_index: int | None) -> str:
    return str(position) if batch_index is None else f"{position} batch index {batch_index}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
