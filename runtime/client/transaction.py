"""The client's transaction: ``client.new_transaction()`` / ``with client.transaction() as txn``.

It remembers which partitions and subscriptions it registered with its coordinator (once each,
before the first append or ack there), which producers and consumers hold work of it not sent
yet, and every send and ack made in it that is still outstanding. ``commit`` first flushes the
held work and waits for the outstanding; if any failed, the transaction is aborted and the error
raised, so a commit never covers a partial set of writes.

Its state is an explicit state machine, as in Kafka's ``TransactionManager``: one enum, one table
of valid previous states, and ``TxnStateMachine.transition_to`` as the only way to change it.
Two states say a transaction can no longer commit before any end was asked for:

* ABORT_ONLY (Kafka's ABORTABLE_ERROR, Pulsar's failed-op check in ``commit``): a send or ack made
  with it failed - also one raised right in the caller's thread, and one the caller caught and
  ignored. ``commit`` aborts it and raises that first error.
* TIMED_OUT (Pulsar's TIME_OUT): its timeout passed while it was OPEN. It reads so without any
  call; sends and acks raise ``TransactionTimedOut`` without a round trip, and so does ``commit``,
  after aborting it. A timer on the client loop moves it there at the deadline, as Pulsar's
  timer does, so that a send or an ack tests a flag (``TxnStateMachine.sendable``) rather than
  the clock; one taken in the moment before the timer fires fails on its future instead.

``commit`` and ``abort`` return (or raise) only once every participant has applied the outcome:
a commit that ends up aborting waits for the abort, so the caller may at once redo the work in
another transaction without colliding with what this one held. An engine whose coordinators answer
commits once logged (``CoordinatorConfig.commit_answer="logged"``, Kafka's behaviour) returns from
a commit once it is decided and durable; its participants apply it a moment later.

A transaction without a transactional id begins lazily, as Kafka's ``beginTransaction`` does:
``new_transaction`` makes no call, and its first registration (the first send or ack with it)
begins it at a coordinator and registers those participants in the same call and log entry
(``begin_txn``). Reading ``id`` before then begins it on the spot. One that ends without ever
having begun ends here: nothing was written anywhere, so there is nothing to end elsewhere.
A transaction with a transactional id begins at once, so that a fenced epoch or a second open
transaction of the id is refused by ``new_transaction`` itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol

from raytxn.client.txn_chain import ChainedTxn
from raytxn.errors import (
    Fenced,
    InvalidArgument,
    InvalidTxnState,
    RaytxnError,
    Timeout,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionTimedOut,
)
from raytxn.ids import TxnID
from raytxn.protocol.txnlog import EndAction

if TYPE_CHECKING:
    from raytxn.client.client import Client


class TxnClientState(enum.StrEnum):
    """State of a transaction as its client sees it."""

    OPEN = "OPEN"
    ABORT_ONLY = "ABORT_ONLY"  # a send or ack failed: commit aborts it and raises that error
    TIMED_OUT = "TIMED_OUT"  # its timeout passed while OPEN: commit aborts it, raises TransactionTimedOut
    COMMITTING = "COMMITTING"  # commit called: flushing, waiting, then asking the coordinator
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    ERROR = "ERROR"  # the coordinator refused the end, or the call failed: only abort may follow


_S = TxnClientState  # short, for the table
_monotonic = time.monotonic  # a Transaction's clock (its machine's default), looked up once
# Kafka's validPreviousStates, for the client's view. COMMITTING -> ABORT_ONLY is a send or ack
# the commit waited for that failed; COMMITTING -> ABORTING an abort called while a commit waits,
# or the coordinator answering the commit with TransactionTimedOut or TransactionAlreadyAborted
# (then the client waits for that abort); ABORTING -> ABORTING is abort
# called again after one interrupted before its answer came back (ending is idempotent at the
# coordinator).
VALID_PREVIOUS_STATES: dict[TxnClientState, frozenset[TxnClientState]] = {
    _S.OPEN: frozenset(),  # only the constructor makes it
    _S.ABORT_ONLY: frozenset({_S.OPEN, _S.COMMITTING}),
    _S.TIMED_OUT: frozenset({_S.OPEN}),
    _S.COMMITTING: frozenset({_S.OPEN}),
    _S.COMMITTED: frozenset({_S.COMMITTING}),
    _S.ABORTING: frozenset({_S.OPEN, _S.ABORT_ONLY, _S.TIMED_OUT, _S.COMMITTING, _S.ABORTING, _S.ERROR}),
    _S.ABORTED: frozenset({_S.ABORTING}),
    _S.ERROR: frozenset({_S.COMMITTING, _S.ABORTING}),
}
# Not ended by its client: ``with`` aborts a transaction in one of these on an exception.
UNENDED_STATES = frozenset({_S.OPEN, _S.ABORT_ONLY, _S.TIMED_OUT, _S.COMMITTING})


class TxnStateMachine:
    """The state of one client transaction; ``transition_to`` is its only mutator.

    ``txn_id`` names it in errors (None until a lazy transaction begins). ``deadline`` is on
    ``clock`` (``time.monotonic`` by default): once it passed, an OPEN machine is TIMED_OUT,
    whether its state is read or a transition asked for."""

    def __init__(self, txn_id: TxnID | None, deadline: float = math.inf,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.txn_id = txn_id
        self.deadline = deadline  # fixed: ``open_until`` holds it while OPEN
        self._clock = clock
        self._state = _S.OPEN
        # ``deadline`` while OPEN, -inf in every other state: ``is_open`` in one comparison.
        self.open_until = deadline
        # ``state is OPEN`` as a plain attribute, set only by the moves (``_move_locked``): a send
        # or an ack tests it without a call or a clock read. Past the deadline it turns False when
        # the client's timer times the txn out (``time_out_if_due``, as Pulsar's TransactionImpl
        # times out from a timer) or a read of the state does.
        self.sendable = True
        self._cause: BaseException | None = None
        self._lock = threading.Lock()  # commit, abort and failing sends may race from several threads

    @property
    def state(self) -> TxnClientState:
        if self._state is _S.OPEN and self.past_deadline():
            with self._lock:
                self._time_out_if_due_locked()
        return self._state

    def past_deadline(self) -> bool:
        return self._clock() >= self.deadline

    def is_open(self) -> bool:
        """OPEN and within its deadline: ``state is OPEN`` in one call, for every send and ack."""
        return self._clock() < self.open_until

    @property
    def cause(self) -> BaseException | None:
        """The failure that made it ABORT_ONLY (the first one), else None."""
        return self._cause

    def transition_to(self, target: TxnClientState, *, cause: BaseException | None = None,
                      if_allowed: bool = False) -> bool:
        """Move to ``target`` when the current state is one of its valid previous states (an OPEN
        machine past its deadline is TIMED_OUT first); ``cause`` is the failure a move to
        ABORT_ONLY needs. Otherwise nothing changes: with ``if_allowed`` it returns False, else it
        raises ``TransactionAlreadyCommitted`` from COMMITTED, ``TransactionAlreadyAborted`` from
        ABORTED, ``InvalidTxnState`` from any other state."""
        if (target is _S.ABORT_ONLY) != (cause is not None):
            raise InvalidArgument(f"{self.txn_id}: a move to ABORT_ONLY, and only that, needs its cause")
        with self._lock:
            self._time_out_if_due_locked()
            return self._move_locked(target, cause, if_allowed)

    def time_out_if_due(self) -> float | None:
        """The timeout timer's check: TIMED_OUT if OPEN past the deadline. None once no longer
        OPEN, else the seconds still left (a timer that fired early is armed again for them)."""
        with self._lock:
            self._time_out_if_due_locked()
            return None if self._state is not _S.OPEN else max(0.0, self.deadline - self._clock())

    def _time_out_if_due_locked(self) -> None:
        if self._state is _S.OPEN and self.past_deadline():
            self._move_locked(_S.TIMED_OUT, None, False)

    def _move_locked(self, target: TxnClientState, cause: BaseException | None, if_allowed: bool) -> bool:
        current = self._state
        if current not in VALID_PREVIOUS_STATES[target]:
            if if_allowed:
                return False
            message = f"{self.txn_id} is {current}: {current} -> {target} not allowed"
            if current is _S.COMMITTED:
                raise TransactionAlreadyCommitted(message)
            if current is _S.ABORTED:
                raise TransactionAlreadyAborted(message)
            raise InvalidTxnState(message)
        if cause is not None:
            self._cause = cause
        self._state = target
        self.open_until = -math.inf  # no state moves back to OPEN
        self.sendable = False
        return True


class TxnFlusher(Protocol):
    """A producer or consumer that may hold work of a transaction it has not sent yet."""

    def flush_txn(self, txn: Transaction) -> None:
        """Send the work of ``txn`` held here (tracked as outstanding) and ``txn.release(self)``."""


class Transaction:
    def __init__(self, client: Client, txn_id: TxnID | None, timeout_s: float, transactional_id: str | None = None,
                 epoch: int | None = None, began_at: float | None = None, registered: Iterable[tuple] = ()) -> None:
        """``txn_id`` None: begin lazily (see the module docstring). ``began_at``:
        ``time.monotonic()`` taken before the coordinator was asked for the txn, so the client's
        deadline never falls after the coordinator's (now when not given). ``registered``:
        (kind, participant) pairs its coordinator registered already (a chained txn)."""
        if txn_id is None and transactional_id is not None:
            raise InvalidArgument("a transaction with a transactional id begins at once: pass its id")
        self._client = client
        self._id = txn_id
        self._begin: asyncio.Future | None = None  # the lazy begin's call, on the client loop
        self.timeout_s = timeout_s
        self.transactional_id = transactional_id
        self.epoch = epoch
        began_at = time.monotonic() if began_at is None else began_at
        # Its state; producers and consumers read ``machine.sendable`` on every send and ack.
        self.machine = TxnStateMachine(txn_id, began_at + timeout_s)
        # Registrations in flight or done, keyed by participant; futures live on the client loop.
        self._registrations: dict[tuple, asyncio.Future] = {}
        self._preregistered = frozenset(registered)
        # Participants a send or ack went to (not guesses registered early): the next chained
        # txn registers these (runtime/client/txn_chain.py).
        self._used: set[tuple] = set()
        self._outstanding: set[concurrent.futures.Future | asyncio.Future] = set()
        self._holders: set[TxnFlusher] = set()  # producers and consumers holding unsent work of it
        self._lock = threading.Lock()
        # Times it out at its deadline on the client loop (``TxnStateMachine.sendable``); cancelled
        # once it ends, so an ended txn is not kept until its deadline.
        self._timeout_timer: asyncio.TimerHandle | None = None
        if math.isfinite(self.machine.deadline):
            client.loop.call_soon(self._arm_timeout)

    def __repr__(self) -> str:
        return f"Transaction({self._id or 'not begun'}, {self.state})"

    def _arm_timeout(self, delay_s: float | None = None) -> None:
        """On the client loop: call ``_timeout_due`` at the deadline (or in ``delay_s``)."""
        if delay_s is None:
            delay_s = max(0.0, self.machine.deadline - _monotonic())
        self._timeout_timer = asyncio.get_running_loop().call_later(delay_s, self._timeout_due)

    def _timeout_due(self) -> None:
        left = self.machine.time_out_if_due()
        if left is None:  # TIMED_OUT now, or ended before
            self._timeout_timer = None
        else:  # fired a moment early for the machine's clock: again, for what is left
            self._arm_timeout(left)

    def _disarm_timeout(self) -> None:
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
            self._timeout_timer = None

    @property
    def id(self) -> TxnID:
        """Its id at the coordinator. A lazy transaction not begun yet begins here (a blocking
        call: not from the client's loop); ``InvalidTxnState`` for one that ended without ever
        beginning (nothing was sent or acked with it, so no coordinator knows it)."""
        txn_id = self._id
        if txn_id is None:
            txn_id = self._client.loop.run(self._begun())
        return txn_id

    @property
    def _label(self) -> str:
        return str(self._id) if self._id is not None else "a transaction not begun"

    @property
    def began(self) -> bool:
        """Whether a coordinator knows it (always, with a transactional id)."""
        return self._id is not None

    async def _begun(self) -> TxnID:
        if self._id is None:
            await self.register_many("partition", [])
        assert self._id is not None
        return self._id

    @property
    def state(self) -> TxnClientState:
        """Reads TIMED_OUT once the timeout passed while OPEN, without any call."""
        return self.machine.state

    # --- used by producers and consumers ---------------------------------------------------

    def operation(self) -> _Operation:
        """``with txn.operation():`` around a send or ack made with this txn: refused as
        ``check_open`` says, and any error raised inside makes the txn abort-only (``fail``),
        whether its caller catches it or not."""
        return _Operation(self)

    def hold(self, holder: TxnFlusher) -> None:
        """``holder`` has work of this txn it has not sent yet (batched sends, grouped or held
        acks): ``commit`` and ``abort`` call ``holder.flush_txn(self)`` before they wait for the
        outstanding sends and acks. Idempotent; call it after ``check_open``."""
        with self._lock:
            self._holders.add(holder)

    def release(self, holder: TxnFlusher) -> None:
        """``holder`` holds no unsent work of this txn any more (what it sent is tracked)."""
        with self._lock:
            self._holders.discard(holder)

    def check_open(self) -> None:
        """Nothing unless OPEN. ``TransactionTimedOut`` once its timeout passed, with no round
        trip; ``InvalidTxnState`` (chained to the failure) when abort-only, and when ending or
        ended (``TransactionAlreadyCommitted``/``TransactionAlreadyAborted`` once it has)."""
        if _monotonic() < self.machine.open_until:  # OPEN, and before its deadline: every send and ack
            return
        state = self.state
        if state is TxnClientState.OPEN:
            return
        if state is TxnClientState.TIMED_OUT:
            raise self._timed_out()
        message = f"{self._label} is {state}; no more sends or acks"
        if state is TxnClientState.ABORT_ONLY:
            cause = self.machine.cause
            raise InvalidTxnState(f"{message}: an earlier one failed ({cause!r})") from cause
        if state is TxnClientState.COMMITTED:
            raise TransactionAlreadyCommitted(message)
        if state is TxnClientState.ABORTED:
            raise TransactionAlreadyAborted(message)
        raise InvalidTxnState(message)

    def _timed_out(self) -> TransactionTimedOut:
        return TransactionTimedOut(f"{self._label} passed its timeout of {self.timeout_s}s; it is aborted")

    async def register(self, kind: str, participant: tuple) -> None:
        """Register a partition (``kind="partition"``) or subscription with the coordinator,
        once per txn; concurrent callers share the one registration. Every send and ack passes
        here right before it goes out: past the timeout it raises ``TransactionTimedOut`` instead."""
        if self.machine.past_deadline():
            raise self._timed_out()
        self._used.add((kind, participant))
        if (kind, participant) in self._preregistered:
            return
        future = self._registrations.get((kind, participant))
        if future is None:
            await self.register_many(kind, [participant])
        else:
            await asyncio.shield(future)

    def registered(self, kind: str, participants: list[tuple]) -> bool:
        """Whether every one of ``participants`` is registered (or being registered, by a call
        under way) in this begun txn: ``register_many`` of them would do nothing. False before a
        lazy txn's begin, which its first registration makes. On the client loop."""
        return self._id is not None and not self._unregistered(kind, participants)

    def _unregistered(self, kind: str, participants: list[tuple]) -> list[tuple]:
        """Those of ``participants`` (once each, in order) neither registered nor being registered."""
        return [p for p in dict.fromkeys(participants)
                if (kind, p) not in self._registrations and (kind, p) not in self._preregistered]

    async def register_many(self, kind: str, participants: list[tuple]) -> None:
        """Register those of ``participants`` not registered yet, in one coordinator call (one
        log record); callers registering one of them meanwhile wait for that call. The first
        call of a lazy transaction begins it with them (``begin_txn``)."""
        if self._id is None:
            if self._begin is None:
                await self._begin_with(kind, participants)
                return
            await asyncio.shield(self._begin)
        txn_id = self._id
        assert txn_id is not None, "the begin awaited above sets the id (or raises)"
        loop = asyncio.get_running_loop()
        new = self._unregistered(kind, participants)
        if not new:
            return
        futures = {p: loop.create_future() for p in new}
        for p, future in futures.items():
            self._registrations[(kind, p)] = future
        try:
            coordinators = self._client.coordinators
            if kind == "partition":
                await coordinators.add_partitions_async(txn_id, new, self.epoch)
            else:
                await coordinators.add_subscriptions_async(txn_id, new, self.epoch)
        except BaseException as e:
            for p, future in futures.items():
                del self._registrations[(kind, p)]
                future.set_exception(e)
                future.exception()  # retrieved: waiters re-raise it through `await future`
            raise
        for future in futures.values():
            future.set_result(None)

    async def _begin_with(self, kind: str, participants: list[tuple]) -> None:
        """Begin this lazy transaction at a coordinator with ``participants`` registered, in one
        call; concurrent registrations wait for it. Refused once its end is under way (a send
        racing the end must not begin a transaction nobody will end)."""
        state = self.state
        if state not in (TxnClientState.OPEN, TxnClientState.COMMITTING, TxnClientState.ABORT_ONLY):
            if state is TxnClientState.TIMED_OUT:
                raise self._timed_out()
            raise InvalidTxnState(f"{self!r}: too late to begin it")
        loop = asyncio.get_running_loop()
        new = list(dict.fromkeys(participants))
        begin = self._begin = loop.create_future()
        futures = {p: loop.create_future() for p in new}
        for p, future in futures.items():
            self._registrations[(kind, p)] = future
        timeout_ms = max(1, int(self.timeout_s * 1000))
        try:
            txn_id = await self._client.coordinators.begin_txn_async(
                timeout_ms, new if kind == "partition" else [], new if kind != "partition" else [])
        except BaseException as e:
            self._begin = None  # a later registration tries again
            for p, future in futures.items():
                del self._registrations[(kind, p)]
                future.set_exception(e)
                future.exception()
            begin.set_exception(e)
            begin.exception()
            raise
        self._id = txn_id
        self.machine.txn_id = txn_id
        for future in futures.values():
            future.set_result(None)
        begin.set_result(txn_id)

    async def _settle_begin(self) -> None:
        """Wait for a lazy begin in flight (its failure is the sender's to report)."""
        begin = self._begin
        if begin is not None and self._id is None:
            await asyncio.wait([begin])

    def fail(self, error: BaseException) -> None:
        """A send or ack made with this txn failed: it becomes abort-only (``commit`` aborts it and
        raises ``error``). The first failure is kept; a txn that timed out, or is ending or ended,
        stays as it is."""
        self.machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)

    def track(self, future: concurrent.futures.Future | asyncio.Future) -> None:
        """Count a send or ack as outstanding until it completes; a failure dooms the txn."""
        with self._lock:
            self._outstanding.add(future)

        def done(f: Any) -> None:
            if not f.cancelled() and f.exception() is not None:
                self.fail(f.exception())  # before it stops being outstanding: commit must see one or the other
            with self._lock:
                self._outstanding.discard(f)

        future.add_done_callback(done)

    # --- ending ----------------------------------------------------------------------------

    def commit(self, until_applied: bool = False) -> None:
        """Wait for outstanding sends and acks, then commit. If the txn cannot commit (a send or
        ack failed, its timeout passed, the coordinator timed it out or aborted it), abort it and
        raise why (the failure, ``TransactionTimedOut``, ``TransactionAlreadyAborted``) once every
        participant has the abort. ``until_applied``: return once every participant applied the
        commit also on an engine that answers commits once logged (``commit_answer="logged"``),
        for a caller whose next step reads what this txn wrote (a stateful pipeline's next batch
        reads the state this one updated)."""
        if self.state is TxnClientState.COMMITTED:
            return
        if self.machine.transition_to(TxnClientState.COMMITTING, if_allowed=True):
            try:
                self._wait_outstanding(committing=True)
            except BaseException as error:  # noqa: BLE001 - raised after the abort
                self.fail(error)  # e.g. interrupted: what it waited for may still fail
                self._abort_then_raise(error)
        elif self.state is TxnClientState.TIMED_OUT:
            self._abort_then_raise(self._timed_out())
        elif self.state is not TxnClientState.ABORT_ONLY:
            self.machine.transition_to(TxnClientState.COMMITTING)  # raises why it may not
        if self.state is TxnClientState.ABORT_ONLY:
            assert self.machine.cause is not None
            self._abort_then_raise(self.machine.cause)
        try:
            self._end_at_coordinator(EndAction.COMMIT, TransactionAlreadyCommitted, TxnClientState.COMMITTED,
                                     applied=until_applied)
        except (TransactionTimedOut, TransactionAlreadyAborted) as refused:
            # Timed out or aborted there (an operator's abort): wait until every participant has it.
            self._abort_then_raise(refused)

    def abort(self) -> None:
        """Wait for outstanding sends and acks (their errors do not matter here), then abort;
        returns once every participant has the abort. ``TransactionAlreadyCommitted`` once
        committed."""
        if self.state is TxnClientState.ABORTED:
            return
        self.machine.transition_to(TxnClientState.ABORTING)
        self._end_at_coordinator(EndAction.ABORT, TransactionAlreadyAborted, TxnClientState.ABORTED,
                                 before=lambda: self._wait_outstanding(committing=False))

    def _end_at_coordinator(self, action: EndAction, already_ended: type[RaytxnError], final: TxnClientState,
                            before: Callable[[], None] | None = None, applied: bool = False) -> None:
        """Run ``before``, end the txn at its coordinator (ended that way already counts as done;
        the coordinator answers once every participant applied the end, or a commit once logged),
        then move to ``final``;
        any other failure leaves the txn in ERROR, from which only abort may follow."""
        try:
            if before is not None:
                before()
            if self._id is None:
                self._client.loop.run(self._settle_begin())
            if self._id is None:  # never began: no coordinator or participant knows it
                self.machine.transition_to(final)
                return
            if action is EndAction.COMMIT and self._chains() and not applied:
                self._commit_and_begin_next()
            else:
                self._client.coordinators.end_txn(self._id, action, self.epoch, self.transactional_id, applied)
        except already_ended:
            pass
        except RaytxnError:
            self.machine.transition_to(TxnClientState.ERROR)
            raise
        self.machine.transition_to(final)
        self._client.loop.call_soon(self._disarm_timeout)

    def _chains(self) -> bool:
        """Whether this commit begins the client's next txn (runtime/client/txn_chain.py): only
        for txns without a transactional id (one with an id begins its next with its epoch), and
        only when a send or ack went out in it."""
        return self._client.txn_chain.enabled and self.transactional_id is None and bool(self._used)

    def _commit_and_begin_next(self) -> None:
        assert self._id is not None
        used = sorted(self._used)
        partitions = tuple(p for kind, p in used if kind == "partition")
        subscriptions = tuple(p for kind, p in used if kind == "subscription")
        began_at = time.monotonic()  # before the coordinator's begin: the chained txn's deadline is never later
        _, next_txn = self._client.coordinators.commit_and_begin(
            self._id, max(1, int(self.timeout_s * 1000)), list(partitions), list(subscriptions))
        if next_txn is not None:
            self._client.txn_chain.offer(ChainedTxn(next_txn, self.timeout_s, began_at, partitions, subscriptions))

    def _abort_then_raise(self, cause: BaseException) -> NoReturn:
        """For a commit that cannot happen: abort, then raise ``cause``. If the abort fails, that
        failure is chained to ``cause``, except ``Fenced``: it is raised itself (with ``cause``
        chained), since a fenced producer must stop, as Kafka's ProducerFenced is fatal, while
        ``cause`` alone (a timeout, a failed send) would invite a retry."""
        try:
            self.abort()
        except Fenced as fenced:
            raise fenced from cause
        except RaytxnError as abort_failure:
            raise cause from abort_failure
        raise cause

    def _wait_outstanding(self, committing: bool) -> None:
        """Flush the holders, then wait (up to the txn's timeout) for the outstanding sends and
        acks. When ``committing``, a failed one, or one still outstanding, makes the txn
        abort-only."""
        with self._lock:
            holders = list(self._holders)
        for holder in holders:
            holder.flush_txn(self)
        with self._lock:
            pending = [f for f in self._outstanding if isinstance(f, concurrent.futures.Future)]
        if not pending:
            return
        done, not_done = concurrent.futures.wait(pending, timeout=self.timeout_s)
        if not committing:
            return
        for future in done:
            error = future.exception()
            if error is not None:
                self.fail(error)
        if not_done:
            self.fail(Timeout(f"{self._label}: {len(not_done)} sends or acks still outstanding after "
                              f"{self.timeout_s}s"))

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        elif self.state in UNENDED_STATES:
            try:
                self.abort()
            except RaytxnError:
                pass  # the original exception matters more; the txn times out if this failed


class _Operation:
    """What ``Transaction.operation`` returns: a class, not a generator, for it wraps every send
    (a generator-based context manager cost 3 us a message, this one under 1)."""

    __slots__ = ("txn",)

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn

    def __enter__(self) -> None:
        self.txn.check_open()

    def __exit__(self, exc_type: Any, error: BaseException | None, tb: Any) -> Literal[False]:
        if error is not None:
            self.txn.fail(error)
        return False  # the error goes on to the caller
