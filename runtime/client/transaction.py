"""The client's transaction: ``client.new_transaction()`` / ``with client.transaction() as txn``.

It remembers which partitions and subscriptions it registered with its coordinator (once each,
before the first append or ack there), and every send and ack made in it that is still
outstanding. ``commit`` first waits for those; if any failed, the transaction is aborted and the
error raised, so a commit never covers a partial set of writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import threading
from typing import TYPE_CHECKING, Any

from raytxn.errors import InvalidTxnState, RaytxnError, TransactionAlreadyAborted, TransactionAlreadyCommitted
from raytxn.ids import TxnID

if TYPE_CHECKING:
    from raytxn.client.client import Client


class TxnClientState(enum.StrEnum):
    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    ERROR = "ERROR"


class Transaction:
    def __init__(self, client: Client, txn_id: TxnID, timeout_s: float, transactional_id: str | None = None,
                 epoch: int | None = None) -> None:
        self._client = client
        self.id = txn_id
        self.timeout_s = timeout_s
        self.transactional_id = transactional_id
        self.epoch = epoch
        self.state = TxnClientState.OPEN
        # Registrations in flight or done, keyed by participant; futures live on the client loop.
        self._registrations: dict[tuple, asyncio.Future] = {}
        self._outstanding: set[concurrent.futures.Future | asyncio.Future] = set()
        self._failure: BaseException | None = None
        self._flushers: set[Any] = set()  # producers holding unsent batches of this txn
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Transaction({self.id}, {self.state})"

    # --- used by producers and consumers (on the client loop) ------------------------------

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
        if self.state is not TxnClientState.OPEN:
            raise (TransactionAlreadyAborted if self.state is TxnClientState.ABORTED else InvalidTxnState)(
                f"{self.id} is {self.state}")
        self.state = TxnClientState.COMMITTING
        try:
            self._wait_outstanding()
        except BaseException:
            self.state = TxnClientState.OPEN
            self.abort()
            raise
        if self._failure is not None:
            failure = self._failure
            self.state = TxnClientState.OPEN
            self.abort()
            raise failure
        try:
            self._client.coordinators.end_txn(self.id, "COMMIT", self.epoch)
        except TransactionAlreadyCommitted:
            pass
        except RaytxnError:
            self.state = TxnClientState.ERROR
            raise
        self.state = TxnClientState.COMMITTED

    def abort(self) -> None:
        if self.state is TxnClientState.ABORTED:
            return
        if self.state is TxnClientState.COMMITTED:
            raise TransactionAlreadyCommitted(f"{self.id} committed")
        self.state = TxnClientState.ABORTING
        try:
            self._wait_outstanding(ignore_errors=True)
            self._client.coordinators.end_txn(self.id, "ABORT", self.epoch)
        except TransactionAlreadyAborted:
            pass
        except RaytxnError:
            self.state = TxnClientState.ERROR
            raise
        self.state = TxnClientState.ABORTED

    def _wait_outstanding(self, ignore_errors: bool = False) -> None:
        for producer in list(self._flushers):
            producer.flush_txn(self)
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
