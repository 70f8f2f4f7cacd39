"""Lease holders (``Workload.lease_holders``; the "leases" profile): the bulk path of docs/design.md §6
through the real subscription actor's lease calls and the real range reader.

The output topic gets a second subscription, ``lz``, that only leases consume (consumers and
leases do not mix on one subscription). The output is where the transactions write (the
pipeline's outputs, the transactional producers', committed, aborted, timed out, open), so the
leases meet ``max_read_position`` held back by open txns and ranges with aborted spans. Each
holder ``L<i>`` asks a partition of ``lz`` for its next range (``lease``), reads it straight from
the simulated storage with the lease's aborted spans (``raytxn.ledger.ranges.read_range_async``,
what Spark and Ray Data tasks run), and consumes it in one txn: the lease's end acked cumulatively
in it (``ack_lease``); the txn then commits, aborts (the range goes out again) or is left to time
out, as the driver's pipeline does. Now and then a holder instead:

- releases the range unread (``release_lease``);
- renews the lease before acking (``renew_lease``);
- grows the lease by a few entries before reading it (``grow_lease``), as a reader filling a
  bounded set does;
- stalls past the lease's timeout before it acks: the range may have gone to another holder, and
  its ack must then be refused;
- is taken over by its own next epoch (a restarted driver): the old epoch goes on as a zombie,
  whose ack must be refused (``Fenced`` or ``NotAllowed``), while the new epoch works the range;
- leases its next range while the acked one's txn ends (a pipeline overlapping its commits): the
  chained lease is read and acked in a txn of its own, its ack held by the subscription until
  the first txn ended, and refused when that one aborted (or timed out).

Judged, on top of the exactly-once checker (which sees each leased message as received by its
holder, so an aborted or uncommitted message in a range is an ``aborted_read`` or
``uncommitted_read``; the cumulative ack in the txn; and each message's consumption in it, so one
consumed in two committed txns is a ``duplicate``):

- ``unprocessed``: every message visible on the output (plain, or of a committed txn) is consumed
  by a committed (or undecided) txn of a lease holder, or still in ``lz``'s final drain (a
  cumulative ack covers positions: the checker alone cannot see a range acked but never read);
- ``violations``: **exclusivity**: two successful ``ack_lease`` calls of different leases whose
  ranges overlap, where the first one's txn committed (the range was pending in that txn, then
  below the cursor: no lease may hold it again); and range reads that failed for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raytxn.client.message import MessageId
from raytxn.client.transaction import TxnClientState
from raytxn.errors import RaytxnError, StorageUnavailable
from raytxn.ids import Position, TxnID
from raytxn.ledger.ranges import read_range_async
from raytxn.tools.checker import COMMITTED, UNDECIDED
from raytxn.tools.history import FinalState, History, SendFailed, SendOk, Sent, Transformed

if TYPE_CHECKING:
    from raytxn.sim.driver import Driver

SUB_LEASE = "lz"
LEASE_TIMEOUT_S = 1.0
MAX_ENTRIES = (1, 4)
IDLE_S = 0.1              # after no lease came (another holder's stands, or nothing readable)
READ_ATTEMPTS = 5
RELEASE, RENEW, STALL, TAKEOVER = 0.08, 0.1, 0.05, 0.05   # per lease, the holder's other moves
GROW = 0.25               # per lease worked: grow it first (``grow_lease``), as a filling bounded reader does
CHAIN = 0.3               # per lease worked: lease the next range while its txn ends (a chained lease)


@dataclass(frozen=True)
class LeaseAck:
    """An ``ack_lease`` that succeeded: the lease's range, acked in ``txn``, answered at ``t``."""

    lease_id: int
    holder: str
    partition: int
    start: Position
    end: Position
    txn: TxnID
    t: float


async def lease_holder(d: Driver, index: int, topic: str) -> None:
    holder = f"L{index}"
    coordinators = d.coordinator_client(f"owner-{holder}")
    epoch = 0
    polls = 0
    while not d.leases_done():
        polls += 1
        partition = (polls + index) % d.w.partitions
        ref = d._subscription(topic, partition, SUB_LEASE)
        lease = await _lease(d, ref, holder, epoch)
        if lease is None:
            await asyncio.sleep(IDLE_S)
            continue
        move = d.rng.random()
        if move < RELEASE:
            await _call(d, ref, "release_lease", lease.lease_id, holder, epoch)
            continue
        if move < RELEASE + TAKEOVER:
            # A restarted driver: the next epoch takes the lease over at once; this one goes on
            # as a zombie with its old lease, and the new one works the range next time round.
            d.world.trace.add("driver", "lease_takeover", holder, epoch + 1)
            zombie_epoch, epoch = epoch, epoch + 1
            await _lease(d, ref, holder, epoch)
            await _work(d, ref, coordinators, topic, partition, holder, zombie_epoch, lease, zombie=True)
            continue
        if move < RELEASE + TAKEOVER + RENEW:
            await _call(d, ref, "renew_lease", lease.lease_id, holder, epoch, LEASE_TIMEOUT_S)
        elif move < RELEASE + TAKEOVER + RENEW + STALL:
            await asyncio.sleep(LEASE_TIMEOUT_S * d.rng.uniform(1.0, 2.0))
        if d.rng.random() < GROW:
            lease = await _grow(d, ref, holder, epoch, lease)
        await _work(d, ref, coordinators, topic, partition, holder, epoch, lease, chain=d.rng.random() < CHAIN)
    for partition in range(d.w.partitions):  # give back any lease still standing (so lz drains)
        ref = d._subscription(topic, partition, SUB_LEASE)
        lease = await _lease(d, ref, holder, epoch, plan=False)
        if lease is not None:
            await _call(d, ref, "release_lease", lease.lease_id, holder, epoch)


async def _lease(d: Driver, ref: Any, holder: str, epoch: int, plan: bool = True) -> Any:
    try:
        return await ref.call_async("lease", holder, epoch, d.rng.randint(*MAX_ENTRIES) if plan else 1,
                                    timeout_s=LEASE_TIMEOUT_S, deadline_s=d.call_deadline_s)
    except Exception as error:  # noqa: BLE001 - fenced, or away past the deadline: no lease this time
        d._unexpected(f"lease {holder}", error)
        d.counts.error(error)
        return None


async def _grow(d: Driver, ref: Any, holder: str, epoch: int, lease: Any) -> Any:
    """The lease grown by up to a few entries (a bounded reader filling its set), or as it was
    when the grow is refused (the lease expired meanwhile: its ack will be refused too)."""
    entries = sum(last - first + 1 for _, first, last in lease.spans)
    try:
        return await ref.call_async("grow_lease", lease.lease_id, holder, epoch, entries + d.rng.randint(1, 3),
                                    deadline_s=d.call_deadline_s)
    except Exception as error:  # noqa: BLE001 - expired, restarted, or taken over meanwhile
        d._unexpected("grow_lease", error)
        d.counts.error(error)
        return lease


async def _call(d: Driver, ref: Any, method: str, *args: Any) -> bool:
    try:
        await ref.call_async(method, *args, deadline_s=d.call_deadline_s)
        return True
    except Exception as error:  # noqa: BLE001 - the lease ended meanwhile (expired, restarted)
        d._unexpected(f"{method}", error)
        d.counts.error(error)
        return False


async def _read(d: Driver, topic: str, partition: int, lease: Any) -> list[tuple[MessageId, str]] | None:
    """The lease's visible messages, read from storage as a bulk task reads them."""
    for _ in range(READ_ATTEMPTS):
        try:
            batches = await read_range_async(d.world.storage, topic, partition, lease.start, lease.end,
                                             lease.aborted, columns=["value", "ledger_id", "entry_id", "batch_index"])
        except StorageUnavailable as error:
            d.counts.error(error)
            await asyncio.sleep(0.05)
            continue
        except RaytxnError as error:  # e.g. trimmed under it: the holder gives the range up
            d.counts.error(error)
            d.lease_read_errors.append(f"{topic}-{partition} {lease.start}..{lease.end}: {error!r}")
            return None
        found = []
        for batch in batches:
            columns = batch.to_pydict()
            for value, ledger_id, entry_id, batch_index in zip(columns["value"], columns["ledger_id"],
                                                               columns["entry_id"], columns["batch_index"],
                                                               strict=True):
                found.append((MessageId(topic, partition, ledger_id, entry_id, batch_index), value.decode()))
        return found
    return None


async def _work(d: Driver, ref: Any, coordinators: Any, topic: str, partition: int, holder: str, epoch: int,
                lease: Any, zombie: bool = False, chain: bool = False) -> None:
    """Read the lease's range and consume it in one txn, acking the lease's end; with ``chain``,
    work the partition's next range (a lease chained behind this one) while that txn ends."""
    messages = await _read(d, topic, partition, lease)
    if messages is None:
        await _call(d, ref, "release_lease", lease.lease_id, holder, epoch)
        return
    consumer = f"{holder}.{epoch}"
    for mid, uid in messages:
        d.history.receive(consumer, SUB_LEASE, topic, partition, mid, uid, 0, d.now())
        d.last_leased = d.now()
    if not d._may_begin():
        await _call(d, ref, "release_lease", lease.lease_id, holder, epoch)
        return
    try:
        txn = await coordinators.begin_txn_async(d.w.txn_timeout_ms, [], [(topic, partition, SUB_LEASE)])
    except Exception as error:  # noqa: BLE001 - nothing acked: the lease expires or is released
        d._unexpected("begin_txn", error)
        d.counts.error(error)
        await _call(d, ref, "release_lease", lease.lease_id, holder, epoch)
        return
    machine = d._machine(txn)
    if messages:
        d.history.ack(consumer, SUB_LEASE, messages[-1][0], txn, d.now(), cumulative=True)
    d._requests += 1
    try:
        await ref.call_async("ack_lease", lease.lease_id, holder, epoch, txn, request_id=f"{consumer}-{d._requests}",
                             deadline_s=d.call_deadline_s)
    except Exception as error:  # noqa: BLE001 - the lease is not held any more: the txn cannot commit
        d._unexpected(f"ack_lease {txn}", error)
        d.counts.error(error)
        d.world.trace.add("driver", "lease_ack_refused", consumer, type(error).__name__, zombie)
        machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
    else:
        d.lease_acks.append(LeaseAck(lease.lease_id, consumer, partition, lease.start, lease.end, txn, d.now()))
    for _, uid in messages:
        d.history.consume_transform_produce(uid, [], txn, subscription=SUB_LEASE, t=d.now())
    if not chain:
        await d.finish(txn, machine, coordinators)
        return
    ending = asyncio.ensure_future(d.finish(txn, machine, coordinators))
    following = await _lease(d, ref, holder, epoch)
    if following is not None:
        d.world.trace.add("driver", "lease_chained", consumer, following.lease_id, str(txn))
        await _work(d, ref, coordinators, topic, partition, holder, epoch, following)
    await ending


def unprocessed(history: History, outcomes: dict[Any, str], topic: str) -> list[str]:
    """The messages visible on ``topic`` (plain, or stored in a committed txn) that no committed
    or undecided txn consumed on ``lz`` and that ``lz``'s final drain does not show either."""
    attempts: dict[str, list[TxnID | None]] = {}
    visible: dict[str, None] = {}
    done: set[str] = set()
    for event in history.events:
        if isinstance(event, Sent):
            if event.topic == topic:
                attempts.setdefault(event.msg_uid, []).append(event.txn)
        elif isinstance(event, SendOk | SendFailed):
            pending = attempts.get(event.msg_uid)
            if pending:  # the oldest unresolved attempt, as the checker resolves them
                txn = pending.pop(0)
                if isinstance(event, SendOk) and (txn is None or outcomes.get(txn) == COMMITTED):
                    visible[event.msg_uid] = None
        elif (isinstance(event, Transformed) and event.subscription == SUB_LEASE
              and outcomes.get(event.txn) in (COMMITTED, UNDECIDED)):
            done.add(event.input_msg_uid)
        elif isinstance(event, FinalState) and event.subscription == SUB_LEASE:
            done.update(message.msg_uid for message in event.messages)
    return [uid for uid in visible if uid not in done]


def violations(acks: Iterable[LeaseAck], outcomes: dict[Any, str], read_errors: list[str]) -> list[str]:
    """See the module docstring; ``outcomes``: the checker's effective outcome of every txn."""
    found = []
    by_partition: dict[int, list[LeaseAck]] = {}
    for ack in acks:
        by_partition.setdefault(ack.partition, []).append(ack)
    for partition, listed in sorted(by_partition.items()):
        listed.sort(key=lambda a: a.t)
        for i, first in enumerate(listed):
            if outcomes.get(first.txn) != COMMITTED:
                continue
            for later in listed[i + 1:]:
                if later.lease_id != first.lease_id and later.start <= first.end and first.start <= later.end:
                    found.append(f"exclusivity: lease {later.lease_id} of {later.holder} ({later.start}..{later.end}) "
                                 f"acked in {later.txn} at t={later.t:.3f}, over lease {first.lease_id} of "
                                 f"{first.holder} ({first.start}..{first.end}) acked in {first.txn}, committed "
                                 f"(partition {partition})")
                    break
    if read_errors:
        found.append(f"range reads failed: {read_errors[:3]}")
    return found
