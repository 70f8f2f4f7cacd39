"""Records of a transaction coordinator's log, and their encoding.

The log is the coordinator's only durable state: replaying its records in order through
``CoordinatorState.apply`` rebuilds the transaction table exactly. Records are frozen msgspec
structs in one tagged union, encoded as msgpack maps (field names on the wire, so fields can be
added with defaults later without breaking old logs).

Times are integer milliseconds chosen by the caller, carried in the records so that a replay
makes the same decisions the live coordinator made.
"""

from __future__ import annotations

import enum

import msgspec

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ids import TxnID


class TxnState(enum.StrEnum):
    """State of a transaction at its coordinator."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"


# Kafka's validPreviousStates, beside the enum so that one table says which UpdateState may follow
# which (``CoordinatorState.apply`` refuses any other). OPEN has none: only NewTxn creates it.
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    TxnState.OPEN: frozenset(),
    TxnState.COMMITTING: frozenset({TxnState.OPEN}),
    TxnState.ABORTING: frozenset({TxnState.OPEN}),
    TxnState.COMMITTED: frozenset({TxnState.COMMITTING}),
    TxnState.ABORTED: frozenset({TxnState.ABORTING}),
}
LIVE_STATES = (TxnState.OPEN, TxnState.COMMITTING, TxnState.ABORTING)
FINAL_STATES = (TxnState.COMMITTED, TxnState.ABORTED)


class AbortReason(enum.StrEnum):
    """Why a transaction is aborted."""

    CLIENT = "CLIENT"  # its owner asked
    TIMEOUT = "TIMEOUT"  # its deadline passed
    FENCED = "FENCED"  # its transactional id was registered again by a newer incarnation


class Outcome(enum.StrEnum):
    """How a finished transaction ended: what a retried request about it is answered with."""

    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"  # aborted by its owner
    TIMED_OUT = "TIMED_OUT"
    FENCED = "FENCED"


class EndAction(enum.StrEnum):
    """What the owner of a transaction asks for when ending it."""

    COMMIT = "COMMIT"
    ABORT = "ABORT"


def end_action(value: object) -> EndAction:
    """``value`` as an EndAction: the enum itself, or its value as a plain str (what a caller
    outside the package may send over Ray); ``InvalidArgument`` for anything else."""
    try:
        return EndAction(value)
    except ValueError:
        raise InvalidArgument(f"action must be COMMIT or ABORT, got {value!r}") from None


# Participants: a produced partition is (topic, partition); an acked subscription is
# (topic, partition, subscription). Tuples, so the records stay immutable and hashable.
Partition = tuple[str, int]
Subscription = tuple[str, int, str]


class NewTxn(msgspec.Struct, tag="new_txn", frozen=True, omit_defaults=True):
    """A transaction was opened. Its deadline is ``start_ms + timeout_ms``."""

    txn: TxnID
    owner: str
    timeout_ms: int
    start_ms: int
    transactional_id: str | None = None
    epoch: int | None = None


class AddPartitions(msgspec.Struct, tag="add_partitions", frozen=True):
    """Partitions the transaction produced to (only ones not registered before)."""

    txn: TxnID
    partitions: tuple[Partition, ...]
    now_ms: int


class AddSubscriptions(msgspec.Struct, tag="add_subscriptions", frozen=True):
    """Subscriptions the transaction acknowledged on (only ones not registered before)."""

    txn: TxnID
    subscriptions: tuple[Subscription, ...]
    now_ms: int


class UpdateState(msgspec.Struct, tag="update_state", frozen=True, omit_defaults=True):
    """The transaction moved to ``new_state``. ``reason`` is set exactly for ABORTING and
    ABORTED."""

    txn: TxnID
    new_state: TxnState
    now_ms: int
    reason: AbortReason | None = None


class RegisterTransactionalId(msgspec.Struct, tag="register_tid", frozen=True):
    """A transactional id was (re-)registered: its epoch is now ``epoch`` and every call made
    under an older epoch is fenced."""

    transactional_id: str
    epoch: int
    now_ms: int
    principal: str | None = None  # with auth on: who registered it (the first one owns the id)


class Checkpoint(msgspec.Struct, tag="checkpoint", frozen=True):
    """What the log held about finished transactions and transactional ids when it was written.

    Records of transactions that ended before a checkpoint may be dropped from the log (those of
    live transactions must stay): the checkpoint keeps the sequence counter from going back, the
    epochs of transactional ids, and the outcomes retried requests are answered with."""

    next_sequence: int
    transactional_ids: dict[str, int]
    recent_outcomes: list[tuple[int, Outcome]]  # (sequence, outcome), oldest first
    transactional_id_principals: dict[str, str] = msgspec.field(default_factory=dict)
    # transactional id -> sequence of its last transaction (how a Kafka EndTxn that finds no open
    # txn tells "already ended so" from "ended otherwise", and what ListTransactions shows)
    last_txns: dict[str, int] = msgspec.field(default_factory=dict)


Record = NewTxn | AddPartitions | AddSubscriptions | UpdateState | RegisterTransactionalId | Checkpoint
RECORD_TYPES: tuple[type, ...] = (
    NewTxn, AddPartitions, AddSubscriptions, UpdateState, RegisterTransactionalId, Checkpoint,
)

_ENCODER = msgspec.msgpack.Encoder()
_RECORD_DECODER = msgspec.msgpack.Decoder(Record)
_BATCH_DECODER = msgspec.msgpack.Decoder(list[Record])


def encode_record(record: Record) -> bytes:
    """The msgpack bytes of one record."""
    if not isinstance(record, RECORD_TYPES):
        raise InvalidArgument(f"not a transaction log record: {record!r}")
    return _ENCODER.encode(record)


def decode_record(data: bytes, path: str = "") -> Record:
    """The record encoded in ``data``; ``CorruptLedger`` (naming ``path``) when it is not one."""
    try:
        return _RECORD_DECODER.decode(data)
    except msgspec.DecodeError as error:  # ValidationError is a DecodeError too
        raise CorruptLedger(f"undecodable transaction log record at {path or '?'}: {error}", path) from error


def encode_batch(records: list[Record]) -> bytes:
    """Several records as one ledger entry. Records that must become durable together (the
    fencing abort and the new epoch of a registration) go in one batch."""
    for record in records:
        if not isinstance(record, RECORD_TYPES):
            raise InvalidArgument(f"not a transaction log record: {record!r}")
    return _ENCODER.encode(records)


def decode_batch(data: bytes, path: str = "") -> list[Record]:
    """The records of an entry written by ``encode_batch``; ``CorruptLedger`` when corrupt."""
    try:
        return _BATCH_DECODER.decode(data)
    except msgspec.DecodeError as error:
        raise CorruptLedger(f"undecodable transaction log batch at {path or '?'}: {error}", path) from error
