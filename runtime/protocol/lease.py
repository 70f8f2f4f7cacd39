"""Subscription leases, pure: the bulk path's handing out of ranges (docs/design.md §6).

A lease gives one holder the next committed range ``start..end`` of one subscription partition,
at or below the partition's ``max_read_position``, without payloads; the holder reads it straight
from storage (``raytxn.ledger.ranges``) with the aborted spans the lease carries. While the lease
holds, the range counts as delivered to the holder alone, so acknowledging its end cumulatively
inside a txn is legal.

One lease at a time per subscription partition, with one exception. Acks are cumulative: a second
range could only be committed together with the first, so handing it to another reader would buy
nothing and would let one txn ack another's range. (The bulk reader's parallelism is across
partitions, as in Spark's Kafka source: one range per partition per batch.) The exception is the
holder's own next range while its acked one waits for its txn's end: a pipeline reads and writes
batch N+1 while batch N commits. That **successor** lease starts past the acked range and is
chained to it: its end can be acked only once the acked range's txn committed (the subscription
holds the ack until then, so no two cumulative acks are ever pending at once, as Pulsar's pending
ack requires), and the acked range's abort drops it, because the aborted range goes out again
first.

States (one enum, every transition checked, ``coordinator_state`` style):

    GRANTED --its end acked cumulatively in txn T--> ACKED(T)
    GRANTED --the holder grows it past its end--> GRANTED (same id: a bounded reader filling its batch)
    ACKED(T) --T commits--> (gone: the cursor is past the range)
    ACKED(T) --T aborts--> (gone: the range is handed out again, from the cursor, in order)
    GRANTED --release, timeout, or the holder's newer epoch--> (gone: handed out again)

    successor: GRANTED, chained behind the holder's ACKED(T) lease (same holder and epoch)
      --T commits--> GRANTED, the one standing lease      --T aborts--> (gone with T's range)

An ACKED lease neither expires nor can be released: its txn ends it (and the txn's own timeout
bounds that). Holders are fenced by epoch like transactional ids: a call under an older epoch than
the holder's newest is ``Fenced``; a newer epoch takes over the holder's lease at once (a restarted
driver need not wait out its zombie's timeout). Leases are volatile: after a restart of the
subscription the table is empty, a holder's call naming its old lease is refused
(``NotAllowed``), and the range is granted again from the cursor. An ack the old holder still
makes meets the pending-ack rules (``TransactionConflict``), so a range is never committed twice.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from raytxn.errors import Fenced, InvalidArgument, NotAllowed
from raytxn.ids import Position, TxnID
from raytxn.protocol.txn_buffer import AbortedTxn

MAX_HOLDERS = 10_000  # newest epochs remembered (least recently used forgotten first)


class LeaseStatus(enum.StrEnum):
    GRANTED = "granted"
    ACKED = "acked"  # its end is acked cumulatively in ``txn``, pending


class RangeCount(msgspec.Struct, frozen=True):
    """What a bounded range holds (messages and record bytes, markers and aborted data
    included), and what the entry right after it holds when a bound left that entry out: a
    reader bounding a set of ranges adds such entries where its set-wide bound has room
    (``LeaseTable.grow``). -1: not counted (no bound asked), or no entry was left out."""

    messages: int = -1
    size: int = -1
    next_messages: int = -1
    next_size: int = -1


class Lease(msgspec.Struct, frozen=True):
    """A range handed to ``holder``: entries ``start..end`` of the partition, inclusive, and the
    aborted txn spans meeting it (what a range reader needs to hide aborted data)."""

    lease_id: int
    holder: str
    epoch: int
    start: Position
    end: Position
    aborted: tuple[AbortedTxn, ...]
    expires_at_ms: int
    status: LeaseStatus = LeaseStatus.GRANTED
    txn: TxnID | None = None
    # ``start..end`` as ``(ledger_id, first_entry_id, last_entry_id)`` per ledger crossed; every
    # id in a span exists, so a reader may cut spans anywhere into chunks (``ledger_spans``).
    spans: tuple[tuple[int, int, int], ...] = ()
    counted: RangeCount = RangeCount()  # what start..end holds, if known


class RangePlan(msgspec.Struct, frozen=True):
    """The partition's side of a grant: the end of what a lease may hold (its
    ``max_read_position``, or less when a message or byte bound cut it), the ``(ledger_id,
    last_entry_id)`` of its ledgers (the open one's last written entry), its aborted spans from
    the start on, and its first entry not trimmed (a cursor below it starts there)."""

    max_read: Position
    ledger_ends: tuple[tuple[int, int], ...]
    aborted: tuple[AbortedTxn, ...]
    first_readable: Position = Position(0, 0)
    counted: RangeCount = RangeCount()  # from first_readable to max_read


def plan_range(plan: RangePlan, start: Position, max_entries: int) -> tuple[Position, Position] | None:
    """The first ``max_entries`` entries at or after ``start`` and at or below ``plan.max_read``,
    as real entry positions ``(first, last)``; None when there is none."""
    if max_entries < 1:
        raise InvalidArgument("max_entries must be >= 1")
    first: Position | None = None
    remaining = max_entries
    for ledger_id, last_entry_id in sorted(plan.ledger_ends):
        if ledger_id < start.ledger_id or last_entry_id < 0:
            continue
        from_entry = max(start.entry_id, 0) if ledger_id == start.ledger_id else 0
        to_entry = min(last_entry_id, from_entry + remaining - 1)
        if ledger_id == plan.max_read.ledger_id:
            to_entry = min(to_entry, plan.max_read.entry_id)
        elif ledger_id > plan.max_read.ledger_id:
            break
        if to_entry < from_entry:
            continue
        first = first or Position(ledger_id, from_entry)
        remaining -= to_entry - from_entry + 1
        last = Position(ledger_id, to_entry)
        if remaining == 0 or last >= plan.max_read:
            break
    return None if first is None else (first, last)


def ledger_spans(plan: RangePlan, first: Position, last: Position) -> tuple[tuple[int, int, int], ...]:
    """The range ``first..last`` as ``(ledger_id, first_entry_id, last_entry_id)`` spans, one per
    ledger it crosses: every entry id in a span exists, so a reader may cut a span anywhere into
    chunks whose ends are real entries (``raytxn.ledger.ranges`` wants that)."""
    spans = []
    for ledger_id, last_entry_id in sorted(plan.ledger_ends):
        if ledger_id < first.ledger_id or ledger_id > last.ledger_id or last_entry_id < 0:
            continue
        lo = first.entry_id if ledger_id == first.ledger_id else 0
        hi = min(last_entry_id, last.entry_id) if ledger_id == last.ledger_id else last_entry_id
        if lo <= hi:
            spans.append((ledger_id, lo, hi))
    return tuple(spans)


UNCOUNTED = RangeCount()


def _meeting(aborted: Sequence[AbortedTxn], first: Position, last: Position) -> tuple[AbortedTxn, ...]:
    """The aborted spans that meet ``first..last`` (what a reader of it must hide)."""
    return tuple(a for a in aborted if a.first_position <= last and first <= a.marker_position)


class LeaseTable:
    """The outstanding lease of one subscription partition (and its holder's chained successor,
    see the module docstring) and the holders' newest epochs."""

    def __init__(self, first_id: int = 0) -> None:
        """``first_id``: lease ids start above it; an actor passes one unique to its incarnation,
        so a lease id of an earlier incarnation never names a lease of this one."""
        self.current: Lease | None = None
        # The holder's next range while ``current`` is ACKED and its txn has not ended: set only
        # behind an ACKED ``current`` of the same holder and epoch, always GRANTED.
        self.successor: Lease | None = None
        self._epochs: OrderedDict[str, int] = OrderedDict()
        self._next_id = first_id

    def check_invariants(self) -> None:
        current, successor = self.current, self.successor
        for lease in (current, successor):
            assert lease is None or lease.lease_id <= self._next_id, lease
        if successor is not None:
            assert current is not None and current.status is LeaseStatus.ACKED, (current, successor)
            assert successor.status is LeaseStatus.GRANTED, successor
            assert (successor.holder, successor.epoch) == (current.holder, current.epoch), (current, successor)
            assert successor.start > current.end, (current, successor)

    # --- granting ----------------------------------------------------------------------------

    def check_holder(self, holder: str, epoch: int) -> None:
        """``Fenced`` for an epoch older than the holder's newest (remembers newer ones)."""
        if not holder or type(epoch) is not int or epoch < 0:
            raise InvalidArgument(f"a lease holder is a name and an epoch >= 0, got {holder!r}, {epoch!r}")
        newest = self._epochs.pop(holder, -1)
        self._epochs[holder] = max(newest, epoch)
        while len(self._epochs) > MAX_HOLDERS:
            self._epochs.popitem(last=False)
        if epoch < newest:
            raise Fenced(f"lease holder {holder!r}: epoch {epoch} is fenced by epoch {newest}")

    def prepare_grant(self, holder: str, epoch: int, now_ms: int) -> Lease | bool | None:
        """Before planning a range: the holder's own standing lease (a retry: grant it again), False
        when another holder's lease stands (nothing for this one now), or None: plan a new one
        (chained behind the holder's acked lease when that stands). Expired leases and the
        holder's older epoch's leases are dropped here."""
        self.check_holder(holder, epoch)
        lease = self.current
        if lease is None:
            return None
        if lease.status is LeaseStatus.GRANTED:
            if lease.holder == holder and lease.epoch == epoch:
                return lease
            if lease.holder == holder or lease.expires_at_ms <= now_ms:
                self.current = None  # superseded by the holder's newer epoch, or timed out
                return None
            return False
        # ACKED: only its txn ends it. Its own holder and epoch may have the next range.
        if lease.holder != holder or lease.epoch != epoch:
            if lease.holder == holder:  # (an older epoch was Fenced above)
                self.successor = None  # superseded by the holder's newer epoch
            return False
        successor = self.successor
        if successor is not None and successor.expires_at_ms <= now_ms:
            self.successor = successor = None
        return successor

    def grant(self, holder: str, epoch: int, first: Position, last: Position, aborted: Sequence[AbortedTxn],
              now_ms: int, timeout_ms: int, spans: tuple[tuple[int, int, int], ...] = (),
              counted: RangeCount = UNCOUNTED) -> Lease:
        """Record the lease of ``first..last`` (after ``prepare_grant`` said None): the standing
        one, or the successor of the holder's acked lease when ``first`` is past that one's end."""
        current = self.current
        chained = (current is not None and current.status is LeaseStatus.ACKED and self.successor is None
                   and (current.holder, current.epoch) == (holder, epoch) and first > current.end)
        if current is not None and not chained:
            raise NotAllowed(f"lease {current.lease_id} of {current.holder!r} is outstanding")
        if last < first or timeout_ms <= 0:
            raise InvalidArgument(f"invalid lease {first}..{last} for {timeout_ms} ms")
        self._next_id += 1
        lease = Lease(self._next_id, holder, epoch, first, last, _meeting(aborted, first, last), now_ms + timeout_ms,
                      spans=spans, counted=counted)
        if chained:
            self.successor = lease
        else:
            self.current = lease
        return lease

    def grow(self, lease_id: int, holder: str, epoch: int, last: Position, aborted: Sequence[AbortedTxn],
             spans: tuple[tuple[int, int, int], ...], counted: RangeCount) -> Lease:
        """Extend the holder's unacked lease to end at ``last`` (past its end; nobody else can
        have the entries after it, one lease standing per subscription partition): a bounded
        reader adds the entry its share left out when the set's bound has room for it."""
        lease = self.held(lease_id, holder, epoch)
        if lease.status is not LeaseStatus.GRANTED:
            raise NotAllowed(f"lease {lease_id}: its end is acked in {lease.txn}; it cannot grow")
        if last <= lease.end:
            raise InvalidArgument(f"lease {lease_id} ends at {lease.end}; growing it to {last} does not grow it")
        grown = msgspec.structs.replace(lease, end=last, aborted=_meeting(aborted, lease.start, last), spans=spans,
                                        counted=counted)
        return self._replace(lease, grown)

    def _replace(self, lease: Lease, changed: Lease | None) -> Lease:
        """Put ``changed`` (None: nothing) in the slot ``lease`` holds; returns ``lease``."""
        if self.current is lease:
            self.current = changed
        else:
            assert self.successor is lease, (lease, self.current, self.successor)
            self.successor = changed
        return changed if changed is not None else lease

    # --- holder calls ------------------------------------------------------------------------

    def held(self, lease_id: int, holder: str, epoch: int) -> Lease:
        self.check_holder(holder, epoch)
        for lease in (self.current, self.successor):
            if lease is not None and lease.lease_id == lease_id and lease.holder == holder and lease.epoch == epoch:
                return lease
        raise NotAllowed(f"lease {lease_id} of {holder!r} is not held: it ended, expired, or the "
                         "subscription restarted; ask for a new one")

    def waiting_on(self, lease_id: int, holder: str, epoch: int) -> TxnID | None:
        """The txn whose end the held lease's ack waits for: the acked lease's, when this is its
        successor (None: it may be acked now). ``NotAllowed`` when it is not held."""
        lease = self.held(lease_id, holder, epoch)
        if lease is self.successor:
            assert self.current is not None and self.current.txn is not None
            return self.current.txn
        return None

    def release(self, lease_id: int, holder: str, epoch: int) -> Lease:
        """Give the range back unread or unacked: it goes out again, in order."""
        lease = self.held(lease_id, holder, epoch)
        if lease.status is not LeaseStatus.GRANTED:
            raise NotAllowed(f"lease {lease_id}: its end is acked in {lease.txn}; end that txn instead")
        return self._replace(lease, None)

    def renew(self, lease_id: int, holder: str, epoch: int, now_ms: int, timeout_ms: int) -> Lease:
        lease = self.held(lease_id, holder, epoch)
        return self._replace(lease, msgspec.structs.replace(
            lease, expires_at_ms=max(lease.expires_at_ms, now_ms + timeout_ms)))

    def expire(self, now_ms: int) -> Lease | None:
        """Drop a lease whose time is up and no txn holds its end; returns it if dropped."""
        for lease in (self.current, self.successor):
            if lease is not None and lease.status is LeaseStatus.GRANTED and lease.expires_at_ms <= now_ms:
                return self._replace(lease, None)
        return None

    # --- what the pending-ack log says (applied in log order) --------------------------------

    def on_cumulative_ack(self, txn: TxnID, position: Position) -> None:
        """A cumulative ack in ``txn`` up to ``position`` was logged: a lease whose range holds it
        is now ended by that txn. (Never the successor's: its ack waits for the acked lease's end.)"""
        lease = self.current
        if lease is not None and lease.status is LeaseStatus.GRANTED and lease.start <= position <= lease.end:
            self.current = msgspec.structs.replace(lease, status=LeaseStatus.ACKED, txn=txn)
        successor = self.successor
        assert successor is None or not successor.start <= position <= successor.end, (txn, position, successor)

    def on_given_back(self, first: Position) -> None:
        """An abort gave messages back from ``first`` on. A granted lease (standing, or a
        successor) starting past them no longer starts at the first message neither acked nor
        held (say one granted after a restart, past a pending cumulative ack that has now
        aborted): its cumulative ack would cover them unread, so it is dropped. (No acked lease
        can start past them: one cumulative ack is pending at a time, and it was the aborted
        txn's.)"""
        if self.successor is not None and self.successor.start > first:
            self.successor = None
        current = self.current
        if current is not None and current.status is LeaseStatus.GRANTED and current.start > first:
            self.current = None

    def on_txn_end(self, txn: TxnID, committed: bool) -> Lease | None:
        """``txn`` committed or aborted: the lease its ack held is over (committed: the cursor is
        past it, and its successor stands; aborted: the range goes out again, and the successor's
        after it, so the successor is dropped). Returns the lease ended."""
        lease = self.current
        if lease is not None and lease.status is LeaseStatus.ACKED and lease.txn == txn:
            self.current = self.successor if committed else None
            self.successor = None
            return lease
        return None
