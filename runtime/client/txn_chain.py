"""The next transaction, begun with the commit of the one before (``commit_and_begin``).

A client that commits one transaction after another (a loop of ``new_transaction``, sends,
``commit``) would pay, for each, a coordinator round trip and a log write to begin it with its
first send, before that send's append can go out. Instead, a commit of a transaction without a
transactional id asks its coordinator to begin the next one in the same log entry as COMMITTING,
with the same partitions and subscriptions registered (a steady stream of transactions touches
the same participants each time; a wrong guess costs an end there that writes nothing). The next
``new_transaction`` with the same timeout takes it: its first send to those partitions goes
straight to the append.

The chained txn is a real open transaction from the commit on: its timeout runs from then, and it
holds its coordinator's low watermark. So it is taken only within ``max_age_s`` of its begin, and
a timer releases it once that age has passed with nobody taking it, as does ``close``: an idle
client keeps no transaction open for longer than that. A client that dies leaves it to its
coordinator's timeout, as any transaction it had open. Deleting a topic it names releases it too
(``drop_topics``): its commit would otherwise end on an actor that died with the topic.

A chained txn nobody takes is released (``release_unused``): the coordinator aborts it straight
to ABORTED in one log entry, with no end to the participants it was registered with. None of them
heard of it (nothing was sent or acked in it), so an idle pause after a commit leaves no abort
markers for readers to meet (Kafka offsets, lease ranges), as an ordinary abort would.

``CoordinatorConfig.chain_begin`` turns it on for an engine, ``client.txn_chain.enabled`` for
one client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raytxn.errors import RaytxnError
from raytxn.ids import TxnID

if TYPE_CHECKING:
    from raytxn.client.client import Client

log = logging.getLogger(__name__)
MAX_AGE_S = 1.0  # a chained txn not taken within this long is released


@dataclass(frozen=True)
class ChainedTxn:
    txn_id: TxnID
    timeout_s: float
    began_at: float  # time.monotonic() taken before the commit was asked: never after the coordinator's
    partitions: tuple[tuple[str, int], ...]
    subscriptions: tuple[tuple[str, int, str], ...]


class TxnChain:
    """At most one chained txn per client, offered by a commit and taken by ``new_transaction``."""

    def __init__(self, client: Client, enabled: bool, max_age_s: float = MAX_AGE_S) -> None:
        self._client = client
        self.enabled = enabled
        self.max_age_s = max_age_s
        self._next: ChainedTxn | None = None
        self._lock = threading.Lock()
        self.taken = 0      # chained txns handed to new_transaction
        self.discarded = 0  # chained txns released unused (too old, another timeout, closed, a topic deleted)

    def offer(self, chained: ChainedTxn) -> None:
        """Keep ``chained`` for the next ``new_transaction``; one kept before is released."""
        with self._lock:
            previous, self._next = self._next, chained
        if previous is not None:
            self._discard(previous)
        self._client.loop.call_soon(self._arm_expiry, chained)

    def take(self, timeout_s: float) -> ChainedTxn | None:
        """The chained txn, if there is one, begun with ``timeout_s`` and young enough; any other
        is released."""
        with self._lock:
            chained, self._next = self._next, None
        if chained is None:
            return None
        if chained.timeout_s != timeout_s or time.monotonic() - chained.began_at > self.max_age_s:
            self._discard(chained)
            return None
        self.taken += 1
        return chained

    def drop_topics(self, topics: set[str]) -> None:
        """Release the chained txn if it was begun with a partition or subscription of
        ``topics``, which are about to be deleted. Taken, it would end there at its commit: an
        end to an actor that died with its topic, retried until the catalog says the topic is
        gone (50 ms here), and a commit waiting for it."""
        with self._lock:
            chained = self._next
            if chained is None or not any(
                    participant[0] in topics for participant in (*chained.partitions, *chained.subscriptions)):
                return
            self._next = None
        self._discard(chained)

    def close(self) -> None:
        """Release the chained txn, if any, and wait for that (errors are only logged)."""
        with self._lock:
            chained, self._next = self._next, None
        if chained is not None:
            self.discarded += 1
            try:
                self._client.coordinators.release_unused(chained.txn_id)
            except RaytxnError as error:
                log.warning("chained %s not aborted at close (its timeout will abort it): %r", chained.txn_id, error)

    # --- on the client loop ----------------------------------------------------------------

    def _arm_expiry(self, chained: ChainedTxn) -> None:
        delay = max(0.0, chained.began_at + self.max_age_s - time.monotonic())
        asyncio.get_running_loop().call_later(delay, self._expire, chained)

    def _expire(self, chained: ChainedTxn) -> None:
        with self._lock:
            if self._next is not chained:
                return  # taken, or replaced (and discarded) already
            self._next = None
        self._discard(chained)

    def _discard(self, chained: ChainedTxn) -> None:
        self.discarded += 1
        self._client.loop.submit(self._release(chained.txn_id))

    async def _release(self, txn_id: TxnID) -> None:
        try:
            await self._client.coordinators.release_unused_async(txn_id)
        except RaytxnError as error:
            log.warning("unused chained %s not aborted (its timeout will abort it): %r", txn_id, error)
