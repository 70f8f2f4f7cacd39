"""What a coordinator tells about its transactional ids (a mixin of ``TransactionCoordinator``):
the open transaction of one id, for a Kafka gateway that did not serve its producer so far
(``describe_transactional_id``), and every id with its last transaction, for Kafka's
ListTransactions and DescribeTransactions (KIP-664) and operators (``describe_transactional_ids``).
Read-only: both answer from the state machine's table, which is rebuilt from the log, so any
gateway answers the same after any crash."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raytxn.auth import Access, guarded
from raytxn.errors import InvalidArgument, NotAuthorized
from raytxn.protocol.coordinator_state import Outcome, TxnMeta

if TYPE_CHECKING:
    from raytxn.protocol.coordinator_state import CoordinatorState

MAX_DESCRIBED_IDS = 10_000  # one answer's rows (an operator's listing, not a scan of the world)


class TransactionalIdViews:
    state: CoordinatorState

    @guarded(Access.AUTHENTICATED)
    async def describe_transactional_id(self, transactional_id: str,
                                        caller: str | None = None) -> dict[str, Any] | None:
        """The id's current epoch and its OPEN transaction (owner, timeout, participants), and
        its last transaction (``last_txn``; ``last_owner`` while it is live, ``last_outcome`` once it
        ended and while remembered), for a Kafka gateway that meets a producer it did not serve so
        far; None when the id is not registered. With auth on, the id's principal or a superuser
        only."""
        await self._started()
        self._check_tid_owner(transactional_id)
        self._check_tid_principal(transactional_id, caller)
        found = self.state.transactional_id_txn(transactional_id)
        if found is None:
            return None
        epoch, meta = found
        last = self.state.last_txn_of(transactional_id)
        return {"epoch": epoch, "txn": meta and meta.txn, "owner": meta and meta.owner,
                "timeout_ms": meta and meta.timeout_ms, "partitions": list(meta.partitions) if meta else [],
                "subscriptions": list(meta.subscriptions) if meta else [],
                "last_txn": last and last[0],
                "last_owner": last[1].owner if last and isinstance(last[1], TxnMeta) else None,
                "last_outcome": str(last[1]) if last and isinstance(last[1], Outcome) else None}

    @guarded(Access.AUTHENTICATED)
    async def describe_transactional_ids(self, transactional_ids: list[str] | None = None,
                                         caller: str | None = None) -> list[dict[str, Any]]:
        """One row per transactional id of this coordinator (those named, or every one, at most
        ``MAX_DESCRIBED_IDS``), sorted: ``epoch``, and of its last transaction ``txn``, ``state``
        (OPEN, COMMITTING, ABORTING, COMMITTED, ABORTED; None: it never began one, or its outcome
        is forgotten), ``outcome``, ``owner``, ``timeout_ms``, ``start_ms``, ``partitions``,
        ``subscriptions``. A named id not registered here has ``epoch`` None. With auth on, ids
        of other principals are left out (a superuser sees every one)."""
        await self._started()
        if transactional_ids is not None and (not isinstance(transactional_ids, list)
                                              or not all(isinstance(t, str) for t in transactional_ids)):
            raise InvalidArgument(f"transactional_ids must be a list of strings, got {transactional_ids!r}")
        await self._answered_ends_logged()  # a caller reads its own end
        epochs = self.state.transactional_ids()
        wanted = sorted(epochs) if transactional_ids is None else list(dict.fromkeys(transactional_ids))
        rows = []
        for tid in wanted[:MAX_DESCRIBED_IDS]:
            try:
                self._check_tid_principal(tid, caller)
            except NotAuthorized:
                continue
            rows.append(_row(tid, epochs.get(tid), self.state.last_txn_of(tid)))
        return rows


def _row(tid: str, epoch: int | None, last: tuple[Any, TxnMeta | Outcome | None] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"transactional_id": tid, "epoch": epoch, "txn": None, "state": None, "outcome": None,
                           "owner": None, "timeout_ms": None, "start_ms": None, "partitions": [],
                           "subscriptions": []}
    if last is None:
        return row
    txn, found = last
    row["txn"] = txn
    if isinstance(found, Outcome):
        row["outcome"] = str(found)
        row["state"] = "COMMITTED" if found is Outcome.COMMITTED else "ABORTED"
    elif found is not None:
        row.update(state=str(found.state), owner=found.owner, timeout_ms=found.timeout_ms, start_ms=found.start_ms,
                   partitions=[list(p) for p in found.partitions],
                   subscriptions=[list(s) for s in found.subscriptions])
    return row
