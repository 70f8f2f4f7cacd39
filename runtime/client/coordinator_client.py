"""The client side of the coordinators: routing and retries.

New transactions go round-robin over the coordinators; every later call for a txn goes to its
``tc_id``; a transactional id always lives on coordinator ``stable_hash(id) % N`` (Kafka's rule),
so fencing for one id is decided in one place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from raytxn.client.rpc import ActorRef
from raytxn.hashing import coordinator_for
from raytxn.ids import TxnID, coordinator_actor_name
from raytxn.protocol.txnlog import EndAction


class CoordinatorClient:
    def __init__(self, num_coordinators: int, owner: str, deadline_s: float = 60.0, token: str | None = None,
                 actor_refs: Callable[[str, str | None], ActorRef] = ActorRef) -> None:
        self.num_coordinators = num_coordinators
        self.owner = owner
        self.deadline_s = deadline_s
        # ``actor_refs`` makes the reference to each coordinator (a simulator passes its network's).
        self._refs = [actor_refs(coordinator_actor_name(i), token) for i in range(num_coordinators)]
        self._round_robin = itertools.cycle(range(num_coordinators))

    def ref(self, tc_id: int) -> ActorRef:
        return self._refs[tc_id]

    def home_of(self, transactional_id: str) -> int:
        return coordinator_for(transactional_id, self.num_coordinators)

    def _begins(self, transactional_id: str | None) -> ActorRef:
        """The coordinator a new txn goes to: its id's home, else the next one round-robin."""
        return self._refs[self.home_of(transactional_id) if transactional_id is not None
                          else next(self._round_robin)]

    def new_txn(self, timeout_ms: int | None = None, transactional_id: str | None = None,
                epoch: int | None = None) -> TxnID:
        return self._begins(transactional_id).call("new_txn", timeout_ms, self.owner, transactional_id, epoch,
                                                   deadline_s=self.deadline_s)

    async def new_txn_async(self, timeout_ms: int | None = None, transactional_id: str | None = None,
                            epoch: int | None = None) -> TxnID:
        return await self._begins(transactional_id).call_async("new_txn", timeout_ms, self.owner, transactional_id,
                                                               epoch, deadline_s=self.deadline_s)

    async def begin_txn_async(self, timeout_ms: int, partitions: list[tuple[str, int]],
                              subscriptions: list[tuple[str, int, str]]) -> TxnID:
        """Begin a txn with its first participants registered, in one call (a lazy begin)."""
        return await self._begins(None).call_async("begin_txn", timeout_ms, self.owner, partitions, subscriptions,
                                                   deadline_s=self.deadline_s)

    def register_transactional_id(self, transactional_id: str) -> int:
        return self._refs[self.home_of(transactional_id)].call(
            "register_transactional_id", transactional_id, deadline_s=self.deadline_s)

    def add_partitions(self, txn: TxnID, partitions: list[tuple[str, int]], epoch: int | None = None) -> None:
        self._refs[txn.tc_id].call("add_partitions", txn, partitions, self.owner, epoch, deadline_s=self.deadline_s)

    async def add_partitions_async(self, txn: TxnID, partitions: list[tuple[str, int]],
                                   epoch: int | None = None) -> None:
        await self._refs[txn.tc_id].call_async("add_partitions", txn, partitions, self.owner, epoch,
                                               deadline_s=self.deadline_s)

    def add_subscriptions(self, txn: TxnID, subscriptions: list[tuple[str, int, str]],
                          epoch: int | None = None) -> None:
        self._refs[txn.tc_id].call("add_subscriptions", txn, subscriptions, self.owner, epoch,
                                   deadline_s=self.deadline_s)

    async def add_subscriptions_async(self, txn: TxnID, subscriptions: list[tuple[str, int, str]],
                                      epoch: int | None = None) -> None:
        await self._refs[txn.tc_id].call_async("add_subscriptions", txn, subscriptions, self.owner, epoch,
                                               deadline_s=self.deadline_s)

    def end_txn(self, txn: TxnID, action: EndAction, epoch: int | None = None,
                transactional_id: str | None = None, applied: bool = False) -> str:
        """``applied``: answered once every participant applied it, also where commits are
        answered once logged (``CoordinatorConfig.commit_answer``)."""
        if applied:  # (only then: a coordinator of a release before the argument still takes the others)
            return self._refs[txn.tc_id].call("end_txn", txn, action, self.owner, epoch, transactional_id, applied,
                                              deadline_s=self.deadline_s)
        return self._refs[txn.tc_id].call("end_txn", txn, action, self.owner, epoch, transactional_id,
                                          deadline_s=self.deadline_s)

    def release_unused(self, txn: TxnID) -> str:
        """Abort a txn this client never used (nothing sent or acked in it) without an end to
        its participants: a chained txn nobody took."""
        return self._refs[txn.tc_id].call("release_unused", txn, self.owner, deadline_s=self.deadline_s)

    async def release_unused_async(self, txn: TxnID) -> str:
        return await self._refs[txn.tc_id].call_async("release_unused", txn, self.owner, deadline_s=self.deadline_s)

    def commit_and_begin(self, txn: TxnID, timeout_ms: int, partitions: list[tuple[str, int]],
                         subscriptions: list[tuple[str, int, str]]) -> tuple[str, TxnID | None]:
        """Commit ``txn`` and begin the next one at its coordinator in the same log entry, with
        these participants registered (runtime/client/txn_chain.py)."""
        return self._refs[txn.tc_id].call("commit_and_begin", txn, self.owner, timeout_ms, partitions, subscriptions,
                                          deadline_s=self.deadline_s)

    def get_txn(self, txn: TxnID) -> dict[str, Any]:
        return self._refs[txn.tc_id].call("get_txn", txn, deadline_s=self.deadline_s)

    def stats(self) -> list[dict[str, Any]]:
        return [ref.call("stats", deadline_s=self.deadline_s) for ref in self._refs]

    def list_txns(self, older_than_ms: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Live transactions of every coordinator begun ``older_than_ms`` or more ago, the
        oldest first, at most ``limit`` (superusers)."""
        rows = [row for ref in self._refs
                for row in ref.call("list_txns", limit, older_than_ms, deadline_s=self.deadline_s)]
        return sorted(rows, key=lambda row: (row["start_ms"], row["tc_id"], row["sequence"]))[:limit]

    def admin_abort(self, txn: TxnID) -> str:
        """Abort ``txn`` whoever owns it (superusers)."""
        return self._refs[txn.tc_id].call("admin_abort", txn, deadline_s=self.deadline_s)
