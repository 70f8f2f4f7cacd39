"""Vocabulary and rules of the coordinator state machine, kept apart so that
``coordinator_state`` reads in one sitting: the table entry (``TxnMeta``), the answer of
``prepare_end`` (``EndResult``), the error a closed transaction answers with, and argument
checks. (The state enum and its allowed transitions are in ``txnlog``.) Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from raytxn.errors import (
    Fenced,
    InvalidArgument,
    RaytxnError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionTimedOut,
)
from raytxn.ids import TxnID, check_name
from raytxn.protocol.txnlog import (
    FINAL_STATES,
    AbortReason,
    Outcome,
    Partition,
    Subscription,
    TxnState,
    UpdateState,
)


class TxnMeta(msgspec.Struct, frozen=True):
    """One entry of the transaction table (replaced, never mutated, on every change)."""

    txn: TxnID
    state: TxnState
    owner: str
    timeout_ms: int
    start_ms: int
    deadline_ms: int
    last_modified_ms: int
    partitions: tuple[Partition, ...] = ()  # in registration order, no duplicates
    subscriptions: tuple[Subscription, ...] = ()
    transactional_id: str | None = None
    epoch: int | None = None
    abort_reason: AbortReason | None = None


class EndResult(msgspec.Struct, frozen=True):
    """Answer of ``prepare_end``.

    ``record`` set: log it, apply it, then drive the end to every participant and complete.
    ``record`` None: nothing to log, the same end was asked before; ``state`` says where it is:
    COMMITTING/ABORTING - being driven (wait for that driver, or start one after a restart);
    COMMITTED/ABORTED - finished, answer success at once."""

    record: UpdateState | None
    state: TxnState

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES


def outcome_of(state: TxnState, reason: AbortReason | None) -> Outcome:
    """The outcome a transaction in (or heading for) ``state`` ends with."""
    if state in (TxnState.COMMITTING, TxnState.COMMITTED):
        return Outcome.COMMITTED
    if reason is AbortReason.TIMEOUT:
        return Outcome.TIMED_OUT
    if reason is AbortReason.FENCED:
        return Outcome.FENCED
    return Outcome.ABORTED


def ended_error(txn: TxnID, outcome: Outcome, ending: bool) -> RaytxnError:
    """The error for a request that needs an OPEN transaction which ended (or, with ``ending``,
    is ending) with ``outcome``."""
    if outcome is Outcome.COMMITTED:
        return TransactionAlreadyCommitted(f"{txn} is {'committing' if ending else 'committed'}")
    if outcome is Outcome.TIMED_OUT:
        return TransactionTimedOut(f"{txn} passed its deadline and was aborted")
    if outcome is Outcome.FENCED:
        return Fenced(f"{txn} was aborted because its transactional id was registered again")
    return TransactionAlreadyAborted(f"{txn} is {'aborting' if ending else 'aborted'}")


def check_ms(value: object, what: str) -> int:
    """``value`` when it is a non-negative int (a time or duration in ms), else InvalidArgument."""
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"{what} must be a non-negative integer of milliseconds, got {value!r}")
    return value


def check_timeout_ms(timeout_ms: object, max_timeout_ms: int) -> int:
    """``timeout_ms`` when it is an int in 1..``max_timeout_ms``, else InvalidArgument (the
    coordinator's rule; the client checks it too, since a lazy begin reaches the coordinator only
    with the first send)."""
    if type(timeout_ms) is not int or not 0 < timeout_ms <= max_timeout_ms:
        raise InvalidArgument(f"timeout_ms must be in 1..{max_timeout_ms}, got {timeout_ms!r}")
    return timeout_ms


def check_tid(transactional_id: object) -> str:
    """``transactional_id`` when it is a string of 1-255 characters, else InvalidArgument."""
    if not isinstance(transactional_id, str) or not 0 < len(transactional_id) <= 255:
        raise InvalidArgument(f"transactional id must be a string of 1-255 characters, "
                              f"got {transactional_id!r}")
    return transactional_id


def _check_partition(topic: object, partition: object) -> None:
    check_name(topic, "topic")
    if type(partition) is not int or partition < 0:
        raise InvalidArgument(f"partition must be a non-negative integer, got {partition!r}")


def normalize_participants(items: object, width: int, what: str) -> tuple[tuple[Any, ...], ...]:
    """``items`` as a tuple of ``width``-tuples in first-seen order without duplicates."""
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise InvalidArgument(f"{what} must be a list of tuples, got {items!r}")
    result: dict[tuple[Any, ...], None] = {}
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != width:
            raise InvalidArgument(f"each of {what} must have {width} items, got {item!r}")
        _check_partition(item[0], item[1])
        if width == 3:
            check_name(item[2], "subscription")
        result[tuple(item)] = None
    return tuple(result)


def describe_txn(meta: TxnMeta, now_ms: int) -> dict[str, Any]:
    """An operator's view of a live transaction: who owns it, how old it is, when it times out,
    and its participants (the partitions and subscriptions its end must reach)."""
    return {"txn": str(meta.txn), "tc_id": meta.txn.tc_id, "sequence": meta.txn.sequence,
            "state": meta.state.value, "owner": meta.owner, "start_ms": meta.start_ms,
            "age_ms": now_ms - meta.start_ms, "deadline_ms": meta.deadline_ms,
            "deadline_in_ms": meta.deadline_ms - now_ms, "last_modified_ms": meta.last_modified_ms,
            "partitions": [list(p) for p in meta.partitions],
            "subscriptions": [list(s) for s in meta.subscriptions],
            "transactional_id": meta.transactional_id, "epoch": meta.epoch,
            "abort_reason": None if meta.abort_reason is None else meta.abort_reason.value}
