"""The subscription actor's lease calls: the bulk path's side of a subscription (docs/design.md §6).

A reader (a Spark driver, a Ray Data plan, any driver) asks for the next committed range of a
subscription partition; nothing but positions goes back, and the reader's tasks read the range
straight from the ledger objects (``raytxn.ledger.ranges``). The decisions are
``SubscriptionState.grant_lease`` and ``LeaseTable``'s (``raytxn.protocol.lease``); this mixin does
the partition call, the locking and the expiry timer.

* ``lease``: grant (or, for the holder's retry, return again) the range from the cursor, bounded
  by entries, messages or bytes, and at or below the partition's ``max_read_position``.
* ``grow_lease``: the holder extends its unacked range within new bounds (filling a bounded set).
* ``ack_lease``: the holder acknowledges its whole range in a txn, as one cumulative ack of its
  end; refused (``NotAllowed``) once the lease expired, was released, or the subscription
  restarted, so a stalled holder's commit fails while the range went to someone else. The ack of
  a chained lease (the holder's next range, granted while its acked one commits) is held here
  until that txn ended, at most ``CHAIN_WAIT_S``: after a commit it is logged, after an abort it
  is refused (the lease went with the aborted range).
* ``release_lease`` / ``renew_lease``: give the range back unacked, or keep it longer.
* ``expire_leases``: the maintenance loop's tick; an expired range goes out again, in order.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from raytxn.auth import Access, guarded
from raytxn.errors import InvalidArgument, TransactionConflict
from raytxn.ids import TxnID
from raytxn.protocol.lease import Lease

if TYPE_CHECKING:
    from raytxn.actors.shell import Clock
    from raytxn.client.rpc import ActorRef
    from raytxn.protocol.subscription_state import SubscriptionState

MAX_LEASE_TIMEOUT_S = 3600.0
MAX_LEASE_ENTRIES = 1_000_000
# How long a chained lease's ack waits for its predecessor's txn to end. A commit's markers take
# milliseconds; past this, the caller gets ``TransactionConflict`` (its txn then aborts) rather
# than holding its call open for as long as that txn may live.
CHAIN_WAIT_S = 10.0


def _check_bounds(max_entries: object, timeout_s: object) -> None:
    if type(max_entries) is not int or not 0 < max_entries <= MAX_LEASE_ENTRIES:
        raise InvalidArgument(f"max_entries must be an int in 1..{MAX_LEASE_ENTRIES}, got {max_entries!r}")
    if not isinstance(timeout_s, int | float) or not 0 < timeout_s <= MAX_LEASE_TIMEOUT_S:
        raise InvalidArgument(f"a lease timeout is 0 < s <= {MAX_LEASE_TIMEOUT_S}, got {timeout_s!r}")


class SubscriptionLeases:
    """Mixed into ``Subscription``; uses its state, lock, partition ref, clock and log."""

    state: SubscriptionState
    clock: Clock
    info: dict[str, Any]
    _lock: asyncio.Lock
    _lease_turn: asyncio.Condition  # over ``_lock``: notified when a txn ends (a successor's ack may go)
    _partition: ActorRef

    if TYPE_CHECKING:  # the Subscription's own (defining them here would shadow them)
        def _changed(self) -> None: ...
        async def _started(self) -> None: ...
        async def _log(self, record: Any) -> Any: ...
        def _pending_ack_changed(self) -> None: ...

    @guarded(Access.CONSUME)
    async def lease(self, holder: str, epoch: int, max_entries: int = 10_000, max_messages: int | None = None,
                    max_bytes: int | None = None, timeout_s: float = 60.0) -> Lease | None:
        """The next range for ``holder`` (its standing lease again on a retry), or None: another
        holder's lease stands, or nothing is readable past the cursor. ``Fenced`` for an epoch
        older than the holder's newest; a newer epoch takes over the holder's lease at once.
        Lease ids are unique across incarnations: a restart ends every lease."""
        await self._started()
        _check_bounds(max_entries, timeout_s)
        async with self._lock:
            state = self.state
            standing = state.leases.prepare_grant(holder, epoch, self.clock.now_ms())
            if standing is not None:
                return standing or None
            plan = await self._partition.call_async("range_plan", state.lease_start(), max_messages, max_bytes)
            granted = state.grant_lease(holder, epoch, self.clock.now_ms(), plan, max_entries, int(timeout_s * 1000))
            if granted is not None:
                self.info["leases_granted"] = self.info.get("leases_granted", 0) + 1
            return granted

    @guarded(Access.CONSUME)
    async def grow_lease(self, lease_id: int, holder: str, epoch: int, max_entries: int = 10_000,
                         max_messages: int | None = None, max_bytes: int | None = None) -> Lease:
        """The holder's unacked lease grown to the last entry from its start within the bounds
        (unchanged when that is no further): a reader whose set of ranges has room left under
        its bound adds the entry a partition's share left out (``RangeCount.next_messages``).
        ``NotAllowed`` when the lease is not held, or is acked."""
        await self._started()
        _check_bounds(max_entries, 1.0)
        async with self._lock:
            lease = self.state.leases.held(lease_id, holder, epoch)
            plan = await self._partition.call_async("range_plan", lease.start, max_messages, max_bytes)
            return self.state.grow_lease(lease_id, holder, epoch, plan, max_entries)

    @guarded(Access.CONSUME)
    async def ack_lease(self, lease_id: int, holder: str, epoch: int, txn: TxnID | None,
                        request_id: str | None = None) -> None:
        """Acknowledge the leased range in ``txn`` (one cumulative ack of its end, logged before
        this returns); the lease then ends with ``txn``: commit moves the cursor past it, abort
        hands it out again. ``txn=None``: a plain cumulative ack, and the lease ends at once
        (at-least-once readers). ``NotAllowed`` when the lease is not held (any more)."""
        await self._started()
        if txn is not None and not isinstance(txn, TxnID):
            raise InvalidArgument(f"not a transaction id: {txn!r}")
        async with self._lease_turn:
            await self._predecessor_ended(lease_id, holder, epoch)
            if txn is None:
                self.state.ack_lease_plain(lease_id, holder, epoch)
                self._changed()
                return
            record = self.state.prepare_lease_ack(lease_id, holder, epoch, txn, request_id)
            if record is not None:
                await self._log(record)
            self._pending_ack_changed()

    async def _predecessor_ended(self, lease_id: int, holder: str, epoch: int) -> None:
        """Return (holding ``_lock``) once the held lease may be acked: at once, or for a chained
        lease once its predecessor's txn ended; ``NotAllowed`` when the lease is not held (its
        predecessor aborted, it expired, ...), ``TransactionConflict`` after ``CHAIN_WAIT_S``."""
        def may_ack() -> bool:
            return self.state.leases.waiting_on(lease_id, holder, epoch) is None

        if may_ack():  # (the common case: no task for the wait)
            return
        try:
            await asyncio.wait_for(self._lease_turn.wait_for(may_ack), CHAIN_WAIT_S)
        except TimeoutError:
            raise TransactionConflict(f"lease {lease_id} follows a range acked in a txn that has not ended after "
                                      f"{CHAIN_WAIT_S}s") from None

    @guarded(Access.CONSUME)
    async def release_lease(self, lease_id: int, holder: str, epoch: int) -> None:
        """Give the range back unacknowledged: the next lease starts at it again."""
        await self._started()
        async with self._lock:
            self.state.leases.release(lease_id, holder, epoch)

    @guarded(Access.CONSUME)
    async def renew_lease(self, lease_id: int, holder: str, epoch: int, timeout_s: float = 60.0) -> Lease:
        """Keep the lease ``timeout_s`` longer from now (a slow reader's heartbeat)."""
        await self._started()
        _check_bounds(1, timeout_s)
        async with self._lock:
            return self.state.leases.renew(lease_id, holder, epoch, self.clock.now_ms(), int(timeout_s * 1000))

    def expire_leases(self) -> Lease | None:
        """Drop a lease whose time is up (no txn holds its end); its range goes out again."""
        expired = self.state.leases.expire(self.clock.now_ms())
        if expired is not None:
            self.info["leases_expired"] = self.info.get("leases_expired", 0) + 1
        return expired
