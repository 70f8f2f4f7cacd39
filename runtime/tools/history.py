"""What a workload observed: the history the exactly-once checker (``raytxn.tools.checker``) judges.

A workload (chaos test, consume-transform-produce job, benchmark) calls one ``History`` method per
thing it did or saw; the recorder only appends. Nothing here judges anything: a history full of
nonsense records fine and ``check`` reports the nonsense as ``malformed``.

Conventions the checker relies on:

- **Time** is float seconds from one clock shared by every recording thread (``time.monotonic()``
  in one process, or ``time.time()`` across hosts with synchronized clocks). Each method takes the
  time of *its* event: ``send`` when the send was issued, ``send_ok`` when its result came back,
  ``txn_commit`` when the outcome came back (plus ``issued_at`` = when commit was called),
  ``receive`` when the application got the message, ``subscribe`` when the subscribe call returned.
- **msg_uid** names one logical message (a uuid the workload put in the payload). Sending the same
  msg_uid again (an application-level retry, or a transform that derives output uids from its
  input) is another *attempt* at that message; the checker expects at most one stored copy of it to
  be visible.
- **Order** of one consumer's receives is the recording order, which the recorder captures as a
  sequence number under its lock; times only need to be right, not distinct.
- **Message ids** are ``raytxn.client.message.MessageId``; a 5-tuple ``(topic, partition, ledger_id,
  entry_id, batch_index)`` or anything with those attributes is converted.
- **Transactions** are ``TxnID`` (a client ``Transaction`` is reduced to its ``id``).

Recording is thread-safe: one lock orders all events.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Literal

import msgspec

from raytxn.client.message import MessageId
from raytxn.ids import TxnID
from raytxn.protocol.txnlog import EndAction

TxnOutcome = Literal["committed", "aborted", "unknown"]
TXN_OUTCOMES: tuple[str, ...] = ("committed", "aborted", "unknown")

Txn = Hashable  # a TxnID in practice; anything hashable and printable works


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every event: ``seq`` = recording order (assigned by ``History``), ``t`` = seconds."""

    seq: int
    t: float


class Subscribed(Event, frozen=True, kw_only=True, tag="subscribe"):
    """``consumer`` joined ``subscription`` on ``topic``. The subscription's first ``Subscribed``
    fixes where it starts: at the earliest message when ``from_earliest``, else at ``t``."""

    consumer: str
    subscription: str
    topic: str
    from_earliest: bool


class Sent(Event, frozen=True, kw_only=True, tag="send"):
    """A send was issued (one attempt at ``msg_uid``); ``partition`` None = routed by the client."""

    msg_uid: str
    topic: str
    partition: int | None
    txn: Txn | None
    producer: str


class SendOk(Event, frozen=True, kw_only=True, tag="send_ok"):
    """The oldest unresolved attempt at ``msg_uid`` by ``producer`` succeeded and is stored at
    ``message_id``. ``producer`` None: the oldest unresolved attempt by anyone, which is only
    unambiguous when a single producer has one (see ``History.send_ok``)."""

    msg_uid: str
    message_id: MessageId
    producer: str | None = None


class SendFailed(Event, frozen=True, kw_only=True, tag="send_failed"):
    """The oldest unresolved attempt at ``msg_uid`` by ``producer`` (None: as for ``SendOk``)
    failed: it may or may not be stored."""

    msg_uid: str
    error_name: str
    producer: str | None = None


class TxnBegun(Event, frozen=True, kw_only=True, tag="txn_begin"):
    txn: Txn


class TxnEnded(Event, frozen=True, kw_only=True, tag="txn_end"):
    """``action`` (commit or abort) was called at ``issued_at`` (None: not recorded) and its
    outcome came back at ``t``: committed, aborted, or unknown (the client gave up)."""

    txn: Txn
    action: EndAction
    outcome: TxnOutcome
    issued_at: float | None


class Received(Event, frozen=True, kw_only=True, tag="receive"):
    consumer: str
    subscription: str
    topic: str
    partition: int
    message_id: MessageId
    msg_uid: str
    redelivery_count: int


class ReceiveTimedOut(Event, frozen=True, kw_only=True, tag="receive_timeout"):
    """``consumer`` asked for a message and got none (``topic`` None: every topic it consumes)."""

    consumer: str
    subscription: str
    topic: str | None


class Acked(Event, frozen=True, kw_only=True, tag="ack"):
    """An ack issued at ``t``: individual, or cumulative (everything up to ``message_id`` on its
    partition). With ``txn`` it takes effect iff that txn commits."""

    consumer: str
    subscription: str
    message_id: MessageId
    txn: Txn | None
    cumulative: bool


class Reset(Event, frozen=True, kw_only=True, tag="reset"):
    """``consumer``'s stream on ``subscription`` restarted (reconnect or seek): what it receives
    next need not continue the order of what it received before. ``seek`` = the subscription's
    cursor was moved, so acked messages may come back and unacked ones may be skipped."""

    consumer: str
    subscription: str
    seek: bool


class Transformed(Event, frozen=True, kw_only=True, tag="transform"):
    """One consume-transform-produce step: ``input_msg_uid`` was consumed (acked) in ``txn`` on
    ``subscription`` (None: the one where ``txn`` acked it) and produced ``output_msg_uids`` in
    the same ``txn``."""

    input_msg_uid: str
    output_msg_uids: tuple[str, ...]
    txn: Txn
    subscription: str | None


class DrainedMessage(msgspec.Struct, frozen=True, array_like=True):
    partition: int
    message_id: MessageId
    msg_uid: str


class FinalState(Event, frozen=True, kw_only=True, tag="final_state"):
    """A full drain of ``subscription``'s backlog on ``topic`` after the workload stopped (and
    after every transaction ended or timed out): every message still unacked, each listed once.
    ``partitions`` None = all partitions of the topic were drained."""

    subscription: str
    topic: str
    messages: tuple[DrainedMessage, ...]
    partitions: tuple[int, ...] | None


def as_message_id(value: Any) -> MessageId:
    """``value`` as a ``MessageId``: a MessageId, a 5-tuple ``(topic, partition, ledger_id,
    entry_id, batch_index)`` (4-tuple: batch index 0), or an object with those attributes."""
    if isinstance(value, MessageId):
        return value
    if isinstance(value, tuple | list):
        return MessageId(*value)
    batch_index = getattr(value, "batch_index", 0)
    return MessageId(value.topic, value.partition, value.ledger_id, value.entry_id, batch_index)


def as_txn(txn: Any) -> Txn | None:
    """A transaction key: TxnIDs as they are, a client ``Transaction`` as its ``id``."""
    if txn is None or isinstance(txn, TxnID):
        return txn
    inner = getattr(txn, "id", None)
    return inner if isinstance(inner, TxnID) else txn


def _check_outcome(outcome: str) -> TxnOutcome:
    # A typo here would silently turn a committed txn into a malformed one: fail at the call site.
    if outcome not in TXN_OUTCOMES:
        raise ValueError(f"outcome must be one of {TXN_OUTCOMES}, not {outcome!r}")
    return outcome  # type: ignore[return-value]


class History:
    """Thread-safe, append-only recorder of a workload's observations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def _record(self, kind: type[Event], t: float, **fields: Any) -> None:
        with self._lock:
            self._events.append(kind(seq=len(self._events), t=float(t), **fields))

    @property
    def events(self) -> tuple[Event, ...]:
        """A snapshot of the events in recording order."""
        with self._lock:
            return tuple(self._events)

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    # --- producers ------------------------------------------------------------------------------

    def send(self, msg_uid: str, topic: str, partition: int | None, txn: Any, producer: str, t: float) -> None:
        """A send of ``msg_uid`` was issued (``txn`` None: a plain send)."""
        self._record(Sent, t, msg_uid=msg_uid, topic=topic, partition=partition, txn=as_txn(txn), producer=producer)

    def send_ok(self, msg_uid: str, message_id: Any, t: float, *, producer: str | None = None) -> None:
        """The send of ``msg_uid`` by ``producer`` is durable at ``message_id``.

        Name the producer whenever two producers may have a send of the same ``msg_uid`` under
        way at once (two workers handed the same input after a redelivery both send its output):
        without it the outcome goes to the oldest unresolved attempt, which may be the other
        producer's, and the checker would pin one txn's message on the other txn. When several
        producers have one unresolved, an outcome without a producer is reported ``malformed``."""
        self._record(SendOk, t, msg_uid=msg_uid, message_id=as_message_id(message_id), producer=producer)

    def send_failed(self, msg_uid: str, error: str | BaseException, t: float, *,
                    producer: str | None = None) -> None:
        """The send of ``msg_uid`` by ``producer`` failed (outcome unknown: it may still have been
        stored). ``producer``: as for ``send_ok``."""
        error_name = error if isinstance(error, str) else type(error).__name__
        self._record(SendFailed, t, msg_uid=msg_uid, error_name=error_name, producer=producer)

    # --- transactions ---------------------------------------------------------------------------

    def txn_begin(self, txn: Any, t: float) -> None:
        self._record(TxnBegun, t, txn=as_txn(txn))

    def txn_commit(self, txn: Any, outcome: str, t: float, *, issued_at: float | None = None) -> None:
        """Commit was called at ``issued_at`` and ended with ``outcome`` at ``t``. Pass
        ``issued_at``: without it the checker can only bound the call by the txn's last recorded
        operation, which makes the uncommitted-read check weaker."""
        self._record(TxnEnded, t, txn=as_txn(txn), action=EndAction.COMMIT, outcome=_check_outcome(outcome),
                     issued_at=None if issued_at is None else float(issued_at))

    def txn_abort(self, txn: Any, outcome: str, t: float, *, issued_at: float | None = None) -> None:
        """Abort was called (at ``issued_at``) and ended with ``outcome`` at ``t`` ("committed"
        when the abort found the txn already committed)."""
        self._record(TxnEnded, t, txn=as_txn(txn), action=EndAction.ABORT, outcome=_check_outcome(outcome),
                     issued_at=None if issued_at is None else float(issued_at))

    # --- consumers ------------------------------------------------------------------------------

    def subscribe(self, consumer: str, subscription: str, topic: str, t: float, *, from_earliest: bool = False) -> None:
        """``consumer`` subscribed (``t`` = when the call returned)."""
        self._record(Subscribed, t, consumer=consumer, subscription=subscription, topic=topic,
                     from_earliest=from_earliest)

    def receive(self, consumer: str, subscription: str, topic: str, partition: int, message_id: Any, msg_uid: str,
                redelivery_count: int, t: float) -> None:
        """The application got a message."""
        self._record(Received, t, consumer=consumer, subscription=subscription, topic=topic, partition=partition,
                     message_id=as_message_id(message_id), msg_uid=msg_uid, redelivery_count=redelivery_count)

    def receive_timeout(self, consumer: str, subscription: str, t: float, *, topic: str | None = None) -> None:
        """A receive returned nothing (the evidence the stuck check needs that someone was asking)."""
        self._record(ReceiveTimedOut, t, consumer=consumer, subscription=subscription, topic=topic)

    def ack(self, consumer: str, subscription: str, message_id: Any, txn: Any, t: float, *,
            cumulative: bool = False) -> None:
        """An ack was issued (in ``txn`` when given)."""
        self._record(Acked, t, consumer=consumer, subscription=subscription, message_id=as_message_id(message_id),
                     txn=as_txn(txn), cumulative=cumulative)

    def reset(self, consumer: str, subscription: str, t: float, *, seek: bool = False) -> None:
        """``consumer`` reconnected (or, with ``seek``, moved the subscription's cursor): its
        stream starts over."""
        self._record(Reset, t, consumer=consumer, subscription=subscription, seek=seek)

    # --- pipelines and the end ------------------------------------------------------------------

    def consume_transform_produce(self, input_msg_uid: str, output_msg_uids: Iterable[str], txn: Any, *,
                                  subscription: str | None = None, t: float = 0.0) -> None:
        """``input_msg_uid`` was acked in ``txn`` and turned into ``output_msg_uids`` sent in ``txn``
        (``subscription``: the pipeline's input subscription, when the txn's acks don't tell)."""
        self._record(Transformed, t, input_msg_uid=input_msg_uid, output_msg_uids=tuple(output_msg_uids),
                     txn=as_txn(txn), subscription=subscription)

    def final_state(self, subscription: str, topic: str, messages: Sequence[tuple[int, Any, str]], *,
                    partitions: Iterable[int] | None = None, t: float = 0.0) -> None:
        """A full drain of ``subscription`` on ``topic``: ``(partition, message_id, msg_uid)`` for
        every unacked message (``partitions``: the ones drained, None = all)."""
        drained = tuple(DrainedMessage(p, as_message_id(mid), uid) for p, mid, uid in messages)
        self._record(FinalState, t, subscription=subscription, topic=topic, messages=drained,
                     partitions=None if partitions is None else tuple(sorted(partitions)))
