"""The one error hierarchy of raytxn.

Every error a caller can see is a ``RaytxnError``. Errors whose ``retriable`` class attribute is
true describe a passing condition (storage briefly unreachable, an actor restarting); the client
retries those transparently and idempotently. All others are final for the request that raised
them, and the request changed nothing.

Errors cross Ray actor boundaries by pickling, so every subclass keeps its constructor arguments
in ``args`` (the default ``Exception`` behaviour) and adds no required keyword-only state.
"""

from __future__ import annotations


class RaytxnError(Exception):
    """Base of every raytxn error."""

    retriable: bool = False


# --- generic -----------------------------------------------------------------------------------


class Timeout(RaytxnError):
    """A wait ran out (receive with a timeout, a call past its deadline)."""

    retriable = True


class NotAllowed(RaytxnError):
    """The request is well formed but not allowed in the current state (wrong owner, an append
    for a transaction already below its coordinator's low watermark, ...)."""


class ConcurrentTransactions(NotAllowed):
    """A transactional id's new transaction while its previous one is still open (its end not
    yet decided or not yet reached): Kafka's CONCURRENT_TRANSACTIONS. Try again once it ended."""


class NotAuthorized(RaytxnError):
    """The caller's principal lacks the permission the request needs."""


class AuthenticationFailed(NotAuthorized):
    """No token, or a token that is malformed, forged (wrong secret) or expired."""


class InvalidArgument(RaytxnError):
    """A malformed argument: a bad name, a negative timeout, an empty batch, ..."""


class MetadataTooLarge(InvalidArgument):
    """A commit metadata string past the limit (Kafka's OFFSET_METADATA_TOO_LARGE)."""


# --- topics and messages ---------------------------------------------------------------------


class TopicNotFound(RaytxnError):
    """No topic of that name exists."""


class TopicAlreadyExists(RaytxnError):
    """A topic of that name exists already (with other settings)."""


class InvalidTopicName(InvalidArgument):
    """A topic, subscription or stream name that does not follow the naming rules."""


class MessageTooLarge(RaytxnError):
    """A message (or record) above the configured size limit; nothing was written."""


class KeylessMessage(InvalidArgument):
    """A message without a key sent to a compacted topic (Kafka refuses it as INVALID_RECORD):
    compaction keeps the latest value per key, and a keyless one has no place there."""


class OutOfOrderSequence(RaytxnError):
    """A producer batch reached its partition before the batch it follows (``previous_sequence``
    is neither stored nor being stored there): nothing was written. The producer sends again, in
    order, with the same sequence ids (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER with idempotence).
    Retriable: the batch it waited for is in flight or is being resent."""

    retriable = True


class ProducerQueueFull(RaytxnError):
    """A producer's unsent messages stayed above its ``max_pending_bytes`` for the whole send
    timeout (the partitions are not keeping up); this message was not queued."""

    retriable = True


# --- transactions ----------------------------------------------------------------------------


class TransactionNotFound(RaytxnError):
    """The coordinator does not know that transaction id."""


class TransactionTimedOut(RaytxnError):
    """The transaction passed its timeout: its coordinator aborts it. The client knows without
    asking (its clock starts before the coordinator's): sends and acks with it raise this at
    once, and its commit raises this once it is aborted."""


class InvalidTxnState(RaytxnError):
    """A transition that the transaction's current state does not allow, e.g. a send or ack
    with a transaction that is abort-only (an earlier one failed: chained as the cause),
    committing or ended."""


class TransactionAlreadyCommitted(InvalidTxnState):
    """Abort (or another change) requested for a transaction that committed."""


class TransactionAlreadyAborted(InvalidTxnState):
    """Commit (or another change) requested for a transaction that aborted."""


class TransactionConflict(RaytxnError):
    """An ack that collides with an ack pending in another transaction, or with one already
    made."""


class ParticipantEndFailed(RaytxnError):
    """A participant refused a transaction's end with a non-retriable error. The outcome is
    decided and logged: the transaction stays COMMITTING or ABORTING (never reversed), and its
    coordinator ends it on the participants when it drives it again, at its next restart or on
    the next ``end_txn`` of the same action. Not retriable: retrying at once would meet the same
    refusal."""


class Fenced(RaytxnError):
    """A newer incarnation (of a ledger writer, an actor, a transactional id, a lease holder, or
    a named producer) has taken over; the caller is a zombie and must stop."""


class GroupStateError(RaytxnError):
    """A consumer group's state machine was asked for a transition its state does not allow
    (Kafka's IllegalStateException): a bug, as the Kafka gateway's handlers check first."""


# --- storage ---------------------------------------------------------------------------------


class CorruptLedger(RaytxnError):
    """A stored object is missing, truncated, or fails its checksum. Never skipped silently.

    ``path`` names the object."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message, path)
        self.path = path

    def __str__(self) -> str:
        return self.args[0]


class UnsupportedFormat(CorruptLedger):
    """A stored object in a format newer than this release reads (written by a newer raytxn, see
    docs/concepts/formats.md), or whose version byte is damaged. Refused, never guessed at: as
    with any object that cannot be read, recovery stops and names it.

    ``path`` names the object, ``version`` is the format it says it is in."""

    def __init__(self, message: str, path: str = "", version: int = 0) -> None:
        RaytxnError.__init__(self, message, path, version)
        self.path = path
        self.version = version


class PositionTrimmed(RaytxnError):
    """A read below the stream's trim point: those entries were deleted on purpose."""


class CompactionReset(PositionTrimmed):
    """A compacted read resuming below a tombstone that compaction dropped after its delete
    retention: the reader would keep that key's old value. Read again from the earliest offset."""


class StorageUnavailable(RaytxnError):
    """The object store could not be reached or answered with a server error. Retriable."""

    retriable = True


class StorageFull(StorageUnavailable):
    """The object store has no room for a write (a local disk's ``ENOSPC`` or quota, an S3
    store's 507 Insufficient Storage). The request that gets it was refused before anything was
    written: it changed nothing. Retriable, as space may come back (freed, or trimmed by
    retention): clients retry it until their deadline, and once space is back the engine goes on
    by itself. Writes already accepted when the store filled wait for space instead (their
    callers may get ``StorageUnavailable``, outcome unknown, after the append timeout)."""


class ActorUnavailable(RaytxnError):
    """The actor serving the request died and is restarting. Retriable."""

    retriable = True


class ActorNotFound(ActorUnavailable):
    """No actor of that name exists now: not created yet, being re-created, or deleted (whoever
    can tell deleted from coming back checks the catalog). Retriable."""


class CannotPlaceActor(RaytxnError):
    """The cluster has no room for another actor (its memory is reserved by the actors already
    running): passivate idle ones (``EngineConfig.passivate_idle_s``), lower
    ``EngineConfig.actor_memory_mib``, or add a node. Final for the request that needed it."""


# --- installation ----------------------------------------------------------------------------


class MissingExtra(RaytxnError, ImportError):
    """A part of raytxn that needs an optional dependency the install lacks: the message names
    the extra to install (``pip install 'raytxn[spark]'``). An ``ImportError`` too, so code that
    probes for an optional part with ``except ImportError`` keeps working.

    ``extra`` is the extra's name, ``module`` the missing import."""

    def __init__(self, message: str, extra: str = "", module: str = "") -> None:
        super().__init__(message, extra, module)
        self.extra = extra
        self.module = module

    def __str__(self) -> str:
        return self.args[0]


def is_retriable(error: BaseException) -> bool:
    """True when ``error`` is a raytxn error marked retriable."""
    return isinstance(error, RaytxnError) and error.retriable
