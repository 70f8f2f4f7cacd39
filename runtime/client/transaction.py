"""The client's transaction: ``client.new_transaction()`` / ``with client.transaction() as txn``.

It remembers which partitions and subscriptions it registered with its coordinator (once each,
before the first append or ack there), which producers and consumers hold work of it not sent
yet, and every send and ack made in it that is still outstanding. ``commit`` first flushes the
held work and waits for the outstanding; if any failed, the transaction is aborted and the error
raised, so a commit never covers a partial set of writes.

Its state is an explicit state machine, as in Kafka's ``TransactionManager``: one enum, one table
of valid previous states, and ``TxnStateMachine.transition_to`` as the only way to change it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from raytxn.errors import InvalidTxnState, RaytxnError, TransactionAlreadyAborted, TransactionAlreadyCommitted
from raytxn.ids import TxnID
from raytxn.protocol.txnlog import EndAction

if TYPE_CHECKING:
    from raytxn.client.client import Client


class TxnClientState(enum.StrEnum):
    """State of a transaction as its client sees it."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"  # commit called: flushing, waiting, then asking the coordinator
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    ERROR = "ERROR"  # the coordinator refused the end, or the call failed: only abort may follow


# Kafka's validPreviousStates, for the client's view. A commit whose sends or acks failed goes
# COMMITTING -> ABORTING; ABORTING -> ABORTING is abort called again after one interrupted before
# its answer came back (ending is idempotent at the coordinator).
VALID_PREVIOUS_STATES: dict[TxnClientState, frozenset[TxnClientState]] = {
    TxnClientState.OPEN: frozenset(),  # only the constructor makes it
    TxnClientState.COMMITTING: frozenset({TxnClientState.OPEN}),
    TxnClientState.COMMITTED: frozenset({TxnClientState.COMMITTING}),
    TxnClientState.ABORTING: frozenset({TxnClientState.OPEN, TxnClientState.COMMITTING,
                                        TxnClientState.ABORTING, TxnClientState.ERROR}),
    TxnClientState.ABORTED: frozenset({TxnClientState.ABORTING}),
    TxnClientState.ERROR: frozenset({TxnClientState.COMMITTING, TxnClientState.ABORTING}),
}


class TxnStateMachine:
    """The state of one client transaction; ``transition_to`` is its only mutator."""

    def __init__(self, txn_id: TxnID) -> None:
        self.txn_id = txn_id
        self._state = TxnClientState.OPEN
        self._lock = threading.Lock()  # commit and abort may race from two threads

    @property
    def state(self) -> TxnClientState:
        return self._state

    def transition_to(self, target: TxnClientState) -> None:
        """Move to ``target`` when the current state is one of its valid previous states.
        Otherwise refused, changing nothing: ``TransactionAlreadyCommitted`` from COMMITTED,
        ``TransactionAlreadyAborted`` from ABORTED, ``InvalidTxnState`` from any other state."""
        with self._lock:
            current = self._state
            if current not in VALID_PREVIOUS_STATES[target]:
                message = f"{self.txn_id} is {current}: {current} -> {target} not allowed"
                if current is TxnClientState.COMMITTED:
                    raise TransactionAlreadyCommitted(message)
                if current is TxnClientState.ABORTED:
                    raise TransactionAlreadyAborted(message)
                raise InvalidTxnState(message)
            self._state = target


class TxnFlusher(Protocol):
    """A producer or consumer that may hold work of a transaction it has not sent yet."""

    def flush_txn(self, txn: Transaction) -> None:
        """Send the work of ``txn`` held here (tracked as outstanding) and ``txn.release(self)``."""


class Transaction:
    def __init__(self, client: Client, txn_id: TxnID, timeout_s: float, transactional_id: str | None = None,
                 epoch: int | None = None) -> None:
        self._client = client
        self.id = txn_id
        self.timeout_s = timeout_s
        self.transactional_id = transactional_id
        self.epoch = epoch
        self._machine = TxnStateMachine(txn_id)
        # Registrations in flight or done, keyed by participant; futures live on the client loop.
        self._registrations: dict[tuple, asyncio.Future] = {}
        self._outstanding: set[concurrent.futures.Future | asyncio.Future] = set()
        self._failure: BaseException | None = None
        self._holders: set[TxnFlusher] = set()  # producers and consumers holding unsent work of it
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.state})"

    @property
    def state(self) -> TxnClientState:
        return self._machine.state

    # --- used by producers and consumers ---------------------------------------------------

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
        if self.state is not TxnClientState.OPEN:
            raise InvalidTxnState(f"{self.id} is {self.state}; no more sends or acks")

    async def register(self, kind: str, participant: tuple) -> None:
        """Register a partition (``kind="partition"``) or subscription with the coordinator,
        once per txn; concurrent callers share the one registration."""
        future = self._registrations.get((kind, participant))
        if future is None:
            await self.register_many(kind, [participant])
        else:
            await asyncio.shield(future)

    async def register_many(self, kind: str, participants: list[tuple]) -> None:
        """Register those of ``participants`` not registered yet, in one coordinator call (one
        log record); callers registering one of them meanwhile wait for that call."""
        loop = asyncio.get_running_loop()
        new = [p for p in dict.fromkeys(participants) if (kind, p) not in self._registrations]
        if not new:
            return
        futures = {p: loop.create_future() for p in new}
        for p, future in futures.items():
            self._registrations[(kind, p)] = future
        try:
            coordinators = self._client.coordinators
            if kind == "partition":
                await coordinators.add_partitions_async(self.id, new, self.epoch)
            else:
                await coordinators.add_subscriptions_async(self.id, new, self.epoch)
        except BaseException as e:
            for p, future in futures.items():
                del self._registrations[(kind, p)]
                future.set_exception(e)
                future.exception()  # retrieved: waiters re-raise it through `await future`
            raise
        for future in futures.values():
            future.set_result(None)

    def fail(self, error: BaseException) -> None:
        """A send or ack of this txn failed for good: commit will abort and raise ``error``."""
        if self._failure is None:
            self._failure = error

    def track(self, future: concurrent.futures.Future | asyncio.Future) -> None:
        """Count a send or ack as outstanding until it completes; a failure dooms the txn."""
        with self._lock:
            self._outstanding.add(future)

        def done(f: Any) -> None:
            with self._lock:
                self._outstanding.discard(f)
            if not f.cancelled() and f.exception() is not None:
                self.fail(f.exception())

        future.add_done_callback(done)

    # --- ending ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Wait for outstanding sends and acks, then commit. If one failed, abort and raise it."""
        if self.state is TxnClientState.COMMITTED:
            return
        self._machine.transition_to(TxnClientState.COMMITTING)
        try:
            self._wait_outstanding()
        except BaseException:
            self.abort()
            raise
        if self._failure is not None:
            failure = self._failure
            self.abort()
            raise failure
        self._end_at_coordinator(EndAction.COMMIT, TransactionAlreadyCommitted, TxnClientState.COMMITTED)

    def abort(self) -> None:
        """Wait for outstanding sends and acks (their errors do not matter here), then abort.
        ``TransactionAlreadyCommitted`` once committed."""
        if self.state is TxnClientState.ABORTED:
            return
        self._machine.transition_to(TxnClientState.ABORTING)
        self._end_at_coordinator(EndAction.ABORT, TransactionAlreadyAborted, TxnClientState.ABORTED,
                                 before=lambda: self._wait_outstanding(ignore_errors=True))

    def _end_at_coordinator(self, action: EndAction, already_ended: type[RaytxnError], final: TxnClientState,
                            before: Callable[[], None] | None = None) -> None:
        """Run ``before``, end the txn at its coordinator (ended that way already counts as done),
        then move to ``final``; any other failure leaves the txn in ERROR."""
        try:
            if before is not None:
                before()
            self._client.coordinators.end_txn(self.id, action, self.epoch)
        except already_ended:
            pass
        except RaytxnError:
            self._machine.transition_to(TxnClientState.ERROR)
            raise
        self._machine.transition_to(final)

    def _wait_outstanding(self, ignore_errors: bool = False) -> None:
        with self._lock:
            holders = list(self._holders)
        for holder in holders:
            holder.flush_txn(self)
        with self._lock:
            pending = list(self._outstanding)
        if pending:
            done, _ = concurrent.futures.wait(
                [f for f in pending if isinstance(f, concurrent.futures.Future)], timeout=self.timeout_s)
            if not ignore_errors:
                for f in done:
                    if f.exception() is not None:
                        raise f.exception()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        elif self.state in (TxnClientState.OPEN, TxnClientState.COMMITTING):
            try:
                self.abort()
            except RaytxnError:
                pass  # the original exception matters more; the txn times out if this failed
