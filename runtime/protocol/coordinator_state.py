"""The pure state machine of one transaction coordinator.

Modelled on Kafka's ``TransactionMetadata``: one state enum and its table of allowed previous
states (both in ``txnlog``, beside the records that change the state), and every change done as
**prepare -> log -> apply**. ``prepare_*`` methods validate a request and return the record(s) to
log; they change no durable state. The caller appends the records to the transaction log and,
once they are durable, passes each one to ``apply``, which is the only mutator and is also what
replays the log after a restart. So the live table and a table rebuilt from the log are the same.

No Ray, no I/O, no clock: every method that needs the time takes ``now_ms``.

Contract for the caller (the coordinator actor):

* Apply records in log order, right after they became durable (no await in between). Records
  of one ``prepare_register_transactional_id`` go into the log as one batch, in list order.
* Serialize prepare -> log -> apply per transaction and per transactional id (a lock keyed by
  either). ``apply`` re-checks what a race could break (a sequence used twice, an illegal
  transition, a transaction opened under a fenced epoch) and raises ``InvalidTxnState``; such a
  record would also stop the replay, so it must not reach the log.
* New transactions without a transactional id may be prepared concurrently: ``prepare_new_txn``
  reserves its sequence, so two preparations never get the same one. A reservation whose record
  is never logged leaves a harmless gap.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Container, Iterable
from typing import Any

import msgspec

from raytxn import testing_bugs
from raytxn.errors import (
    ConcurrentTransactions,
    Fenced,
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    NotAuthorized,
    TransactionNotFound,
    TransactionTimedOut,
)
from raytxn.ids import TxnID
from raytxn.protocol.coordinator_rules import (
    EndResult,
    TxnMeta,
    check_ms,
    check_tid,
    check_timeout_ms,
    describe_txn,
    ended_error,
    normalize_participants,
    outcome_of,
)
from raytxn.protocol.txnlog import (
    FINAL_STATES,
    LIVE_STATES,
    VALID_PREVIOUS_STATES,
    AbortReason,
    AddPartitions,
    AddSubscriptions,
    Checkpoint,
    EndAction,
    NewTxn,
    Outcome,
    Partition,
    Record,
    RegisterTransactionalId,
    Subscription,
    TxnState,
    UpdateState,
    end_action,
)

# Re-exported: the actor needs only this module.
__all__ = [
    "DEFAULT_MAX_RECENT_OUTCOMES", "DEFAULT_MAX_TIMEOUT_MS", "FINAL_STATES", "LIVE_STATES",
    "VALID_PREVIOUS_STATES", "AbortReason", "CoordinatorState", "EndAction", "EndResult", "Outcome",
    "TxnMeta", "TxnState", "describe_txn", "outcome_of",
]

DEFAULT_MAX_TIMEOUT_MS = 15 * 60 * 1000  # Kafka's transaction.max.timeout.ms default
DEFAULT_MAX_RECENT_OUTCOMES = 100_000


class CoordinatorState:
    """Transaction table, sequence counter, deadlines and transactional ids of coordinator
    ``tc_id``."""

    def __init__(self, tc_id: int, *, max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS,
                 max_recent_outcomes: int = DEFAULT_MAX_RECENT_OUTCOMES) -> None:
        if max_timeout_ms <= 0 or max_recent_outcomes < 0:
            raise InvalidArgument("max_timeout_ms must be > 0 and max_recent_outcomes >= 0")
        self.tc_id = tc_id
        self.max_timeout_ms = max_timeout_ms
        self.max_recent_outcomes = max_recent_outcomes
        self._next_sequence = 0  # durable: advanced only by apply
        # Volatile: sequences handed out by prepare_new_txn, possibly not logged yet.
        self._reserved_sequence = 0
        self._live: dict[int, TxnMeta] = {}  # sequence -> entry, in sequence order
        # Live sequences ascending, ended ones dropped lazily: the low watermark in O(1) amortized.
        self._live_order: deque[int] = deque()
        # Min-heap of (deadline_ms, sequence); entries of txns no longer OPEN are dropped lazily.
        self._deadlines: list[tuple[int, int]] = []
        self._open_by_tid: dict[str, int] = {}  # transactional id -> sequence of its OPEN txn
        self._epochs: dict[str, int] = {}  # transactional id -> current epoch
        # transactional id -> sequence of its last txn (live or ended); kept by NewTxn and checkpoints
        self._last_by_tid: dict[str, int] = {}
        self._tid_principals: dict[str, str] = {}  # transactional id -> the principal owning it (auth on)
        self._outcomes: OrderedDict[int, Outcome] = OrderedDict()  # finished, oldest first
        self._counts = dict.fromkeys(LIVE_STATES, 0)
        self._totals = dict.fromkeys(Outcome, 0)  # outcomes applied since this object was built

    # --- queries ---------------------------------------------------------------------------

    @property
    def next_sequence(self) -> int:
        """The sequence the next applied NewTxn may have at least (durable counter)."""
        return self._next_sequence

    def min_live_sequence(self) -> int | None:
        """The lowest sequence not ended yet (OPEN, COMMITTING or ABORTING), or None."""
        while self._live_order and self._live_order[0] not in self._live:
            self._live_order.popleft()
        return self._live_order[0] if self._live_order else None

    @property
    def low_watermark(self) -> int:
        """Every sequence at or below this one has ended: (lowest live sequence) - 1, or
        ``next_sequence - 1`` when nothing is live."""
        lowest = self.min_live_sequence()
        return (self._next_sequence if lowest is None else lowest) - 1

    def get(self, txn: TxnID) -> TxnMeta | None:
        """The table entry of a live transaction, else None."""
        return self._live.get(txn.sequence) if txn.tc_id == self.tc_id else None

    def outcome(self, txn: TxnID) -> Outcome | None:
        """How ``txn`` ended, while it is remembered among the recent outcomes."""
        return self._outcomes.get(txn.sequence) if txn.tc_id == self.tc_id else None

    def live_txns(self) -> list[TxnMeta]:
        """Every transaction not ended yet, in sequence order."""
        return list(self._live.values())

    def live_count(self) -> int:
        """How many transactions have not ended yet."""
        return len(self._live)

    def recent(self, limit: int) -> list[tuple[int, Outcome]]:
        """(sequence, outcome) of the ``limit`` transactions that finished last, the latest first."""
        return list(itertools.islice(reversed(self._outcomes.items()), limit))

    def older_than(self, now_ms: int, min_age_ms: int = 0, limit: int | None = None) -> list[TxnMeta]:
        """Live transactions begun ``min_age_ms`` or more before ``now_ms``, the oldest first, at
        most ``limit``: the hanging ones an operator looks for (every live one with 0)."""
        check_ms(min_age_ms, "min_age_ms")
        if limit is not None and (type(limit) is not int or limit < 1):
            raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
        found: Iterable[TxnMeta] = self._live.values()
        if min_age_ms > 0:
            found = [meta for meta in found if now_ms - meta.start_ms >= min_age_ms]
        return sorted(found, key=_age_order) if limit is None else heapq.nsmallest(limit, found, key=_age_order)

    def count_older_than(self, now_ms: int, min_age_ms: int) -> int:
        """How many live transactions began ``min_age_ms`` or more before ``now_ms``."""
        return sum(1 for meta in self._live.values() if now_ms - meta.start_ms >= min_age_ms)

    def txns_in(self, state: TxnState) -> list[TxnMeta]:
        """The live transactions in ``state`` (none for COMMITTED/ABORTED: those are forgotten)."""
        return [meta for meta in self._live.values() if meta.state is state]

    def transactional_ids(self) -> dict[str, int]:
        """Every registered transactional id with its current epoch."""
        return dict(self._epochs)

    def recent_outcomes(self) -> list[tuple[int, Outcome]]:
        """(sequence, outcome) of the remembered finished transactions, oldest first."""
        return list(self._outcomes.items())

    def expired(self, now_ms: int) -> list[TxnID]:
        """OPEN transactions whose deadline passed, earliest deadline first. They stay armed
        until a logged timeout abort takes them out of OPEN."""
        due: list[tuple[int, int]] = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            entry = heapq.heappop(self._deadlines)
            meta = self._live.get(entry[1])
            if meta is not None and meta.state is TxnState.OPEN:
                due.append(entry)
        for entry in due:
            heapq.heappush(self._deadlines, entry)
        return [TxnID(self.tc_id, sequence) for _, sequence in due]

    def next_deadline_ms(self, skip: Container[int] = ()) -> int | None:
        """The earliest deadline of an OPEN transaction (for the timer), or None. ``skip``: the
        sequences left out (txns whose timeout is already under way); a scan of the heap, so the
        timer only asks it while some timeout runs."""
        while self._deadlines and not self._is_open(self._deadlines[0][1]):
            heapq.heappop(self._deadlines)  # lazy cleanup: the head is an OPEN txn's, if any
        if not self._deadlines:
            return None
        deadline_ms, sequence = self._deadlines[0]
        if sequence not in skip:
            return deadline_ms
        return min((deadline_ms for deadline_ms, sequence in self._deadlines
                    if sequence not in skip and self._is_open(sequence)), default=None)

    def open_deadline_ms(self, txn: TxnID) -> int | None:
        """``txn``'s deadline while it is OPEN (its timeout still to come), else None."""
        meta = self.get(txn)
        return meta.deadline_ms if meta is not None and meta.state is TxnState.OPEN else None

    def _is_open(self, sequence: int) -> bool:
        meta = self._live.get(sequence)
        return meta is not None and meta.state is TxnState.OPEN

    # --- prepare: validate a request, return what to log, change nothing durable --------------

    def prepare_new_txn(self, now_ms: int, timeout_ms: int, owner: str,
                        transactional_id: str | None = None, epoch: int | None = None) -> NewTxn:
        """A NewTxn with a fresh sequence, after checking the timeout and the id's epoch."""
        check_ms(now_ms, "now_ms")
        if not isinstance(owner, str) or not owner:
            raise InvalidArgument(f"owner must be a non-empty string, got {owner!r}")
        check_timeout_ms(timeout_ms, self.max_timeout_ms)
        if transactional_id is None:
            if epoch is not None:
                raise InvalidArgument("an epoch is only given with a transactional id")
        else:
            check_tid(transactional_id)
            if type(epoch) is not int:
                raise InvalidArgument(f"transactional id {transactional_id!r} needs its epoch, got {epoch!r}")
            current = self._epochs.get(transactional_id)
            if current is None:
                raise Fenced(f"transactional id {transactional_id!r} is not registered: register it first")
            if epoch != current:
                raise Fenced(f"transactional id {transactional_id!r}: epoch {epoch} is fenced by {current}")
            open_sequence = self._open_by_tid.get(transactional_id)
            if open_sequence is not None:
                raise ConcurrentTransactions(f"transactional id {transactional_id!r} already has an open transaction "
                                 f"{TxnID(self.tc_id, open_sequence)}")
        # Reserve (volatile) so that concurrent preparations never share a sequence.
        sequence = max(self._next_sequence, self._reserved_sequence)
        self._reserved_sequence = sequence + 1
        return NewTxn(TxnID(self.tc_id, sequence), owner, timeout_ms, now_ms, transactional_id, epoch)

    def repeated_new_txn(self, transactional_id: str, epoch: int | None, owner: str) -> TxnID | None:
        """The transaction a new_txn of (id, epoch, owner) already began, when this call repeats
        one whose NewTxn was logged but whose answer was lost (the coordinator died after its log
        write, or the reply was dropped): the id's OPEN txn under that epoch and owner, with no
        participant yet. Nobody but the caller that never heard of it could have registered one,
        so answering it again is the idempotent retry, as Kafka's AddPartitionsToTxn is for a
        transaction already Ongoing. None otherwise: ``prepare_new_txn`` decides (it refuses a
        txn that has participants with ConcurrentTransactions: the caller lost track of data)."""
        sequence = self._open_by_tid.get(transactional_id)
        if sequence is None or type(epoch) is not int:
            return None
        meta = self._live[sequence]
        if meta.epoch != epoch or meta.owner != owner or meta.partitions or meta.subscriptions:
            return None
        return meta.txn

    def transactional_id_txn(self, transactional_id: str) -> tuple[int, TxnMeta | None] | None:
        """(the id's current epoch, its OPEN txn or None), or None for an id never registered
        here: what a Kafka gateway that restarted needs to take its producer's transaction up
        again."""
        epoch = self._epochs.get(transactional_id)
        if epoch is None:
            return None
        sequence = self._open_by_tid.get(transactional_id)
        return epoch, (self._live[sequence] if sequence is not None else None)

    def last_txn_of(self, transactional_id: str) -> tuple[TxnID, TxnMeta | Outcome | None] | None:
        """The id's last transaction with its live entry, its remembered outcome, or None when
        its outcome is forgotten; None for an id that never began one here. A Kafka EndTxn that
        finds no open txn answers by it (a repeat of the end that took, or the txn timed out)."""
        sequence = self._last_by_tid.get(transactional_id)
        if sequence is None:
            return None
        return TxnID(self.tc_id, sequence), self._live.get(sequence) or self._outcomes.get(sequence)

    def prepare_begin(self, now_ms: int, timeout_ms: int, owner: str, partitions: Iterable[Partition] = (),
                      subscriptions: Iterable[Subscription] = (), transactional_id: str | None = None,
                      epoch: int | None = None) -> list[Record]:
        """A NewTxn followed by the registration of its first participants, to be logged as one
        entry (a client's lazy begin: the transaction starts with its first send or ack, one
        round trip and one log write instead of two of each). Checked as ``prepare_new_txn``."""
        wanted_partitions = normalize_participants(partitions, 2, "partitions")
        wanted_subscriptions = normalize_participants(subscriptions, 3, "subscriptions")
        new = self.prepare_new_txn(now_ms, timeout_ms, owner, transactional_id, epoch)
        records: list[Record] = [new]
        if wanted_partitions:
            records.append(AddPartitions(new.txn, wanted_partitions, now_ms))
        if wanted_subscriptions:
            records.append(AddSubscriptions(new.txn, wanted_subscriptions, now_ms))
        return records

    def prepare_chained_begin(self, end: Record, now_ms: int, timeout_ms: int, owner: str,
                              partitions: Iterable[Partition], subscriptions: Iterable[Subscription]) -> list[Record]:
        """The begin of the owner's next txn, to be logged in the entry of ``end`` (a commit that
        begins the next txn, ``commit_and_begin``): ``prepare_begin``'s records after a COMMITTING
        record, nothing after any other (an abort begins nothing). Checked as ``prepare_begin``."""
        if not isinstance(end, UpdateState) or end.new_state is not TxnState.COMMITTING:
            return []
        return self.prepare_begin(now_ms, timeout_ms, owner, partitions, subscriptions)

    def prepare_add_partitions(self, txn: TxnID, partitions: Iterable[Partition], owner: str,
                               now_ms: int, epoch: int | None = None) -> AddPartitions | None:
        """An AddPartitions of the partitions not registered yet, or None when all are."""
        wanted = normalize_participants(partitions, 2, "partitions")
        meta = self._open_for_change(txn, owner, now_ms, epoch)
        known = set(meta.partitions)
        added = tuple(partition for partition in wanted if partition not in known)
        return AddPartitions(txn, added, now_ms) if added else None

    def prepare_add_subscriptions(self, txn: TxnID, subscriptions: Iterable[Subscription], owner: str,
                                  now_ms: int, epoch: int | None = None) -> AddSubscriptions | None:
        """An AddSubscriptions of the subscriptions not registered yet, or None when all are."""
        wanted = normalize_participants(subscriptions, 3, "subscriptions")
        meta = self._open_for_change(txn, owner, now_ms, epoch)
        known = set(meta.subscriptions)
        added = tuple(subscription for subscription in wanted if subscription not in known)
        return AddSubscriptions(txn, added, now_ms) if added else None

    def prepare_end(self, txn: TxnID, action: EndAction | str, owner: str, now_ms: int,
                    epoch: int | None = None, transactional_id: str | None = None) -> EndResult:
        """Start committing or aborting ``txn``, or answer a repeated end (see ``EndResult``).

        ``transactional_id`` (with ``epoch``) is the caller's own: once ``txn`` is forgotten, only
        its outcome is left, and the id tells a zombie's end (its epoch no longer current) from
        a retried one, so a zombie learns it is fenced even after its txn timed out and ended."""
        action = end_action(action)
        check_ms(now_ms, "now_ms")
        found = self._lookup(txn)
        if isinstance(found, Outcome):
            if transactional_id is not None and epoch is not None:
                current = self._epochs.get(check_tid(transactional_id))
                if current != epoch and not testing_bugs.REINTRODUCED["no_tid_fencing"]:
                    raise Fenced(f"{txn}: epoch {epoch} of {transactional_id!r} is fenced by {current}")
            final = TxnState.COMMITTED if found is Outcome.COMMITTED else TxnState.ABORTED
            return self._repeated_end(txn, action, found, final)
        self._check_caller(found, owner, epoch)
        if found.state is not TxnState.OPEN:
            return self._repeated_end(txn, action, outcome_of(found.state, found.abort_reason), found.state)
        timed_out = now_ms >= found.deadline_ms  # the timer may not have fired yet
        if action is EndAction.COMMIT:
            if timed_out:
                raise TransactionTimedOut(f"{txn} passed its deadline; it will be aborted")
            return EndResult(UpdateState(txn, TxnState.COMMITTING, now_ms), TxnState.COMMITTING)
        reason = AbortReason.TIMEOUT if timed_out else AbortReason.CLIENT
        return EndResult(UpdateState(txn, TxnState.ABORTING, now_ms, reason), TxnState.ABORTING)

    def prepare_release_unused(self, txn: TxnID, owner: str, now_ms: int) -> list[UpdateState]:
        """The abort of an OPEN txn its owner never used (a chained txn nobody took:
        client/txn_chain.py), straight to ABORTED in one entry: ABORTING, then ABORTED, with no
        end sent to its registered participants. None of them ever heard of it (registration is
        the coordinator's alone, and no send or ack was made in it), so none holds anything of
        it, and no abort marker is written that readers would meet. Should an owner release a
        txn it did use, a partition holding its data aborts it as dangling once a later end
        brings it a low watermark past it. [] when it was aborted already (a retry); a txn with
        a transactional id, or a commit begun, is refused."""
        check_ms(now_ms, "now_ms")
        found = self._lookup(txn)
        if isinstance(found, Outcome):
            if found is Outcome.COMMITTED:
                raise ended_error(txn, found, ending=False)
            return []
        self._check_caller(found, owner, None)
        if found.transactional_id is not None:
            raise InvalidArgument(f"{txn} has a transactional id: its abort must reach its participants")
        if found.state is TxnState.ABORTING:
            return []
        if found.state is not TxnState.OPEN:
            raise ended_error(txn, outcome_of(found.state, found.abort_reason), ending=True)
        return [UpdateState(txn, TxnState.ABORTING, now_ms, AbortReason.CLIENT),
                UpdateState(txn, TxnState.ABORTED, now_ms, AbortReason.CLIENT)]

    def prepare_complete(self, txn: TxnID, now_ms: int) -> UpdateState | None:
        """The final UpdateState (COMMITTING->COMMITTED, ABORTING->ABORTED) once every
        participant has the end; None when ``txn`` is already finished."""
        check_ms(now_ms, "now_ms")
        found = self._lookup(txn)
        if isinstance(found, Outcome):
            return None
        if found.state is TxnState.COMMITTING:
            return UpdateState(txn, TxnState.COMMITTED, now_ms)
        if found.state is TxnState.ABORTING:
            return UpdateState(txn, TxnState.ABORTED, now_ms, found.abort_reason)
        raise InvalidTxnState(f"{txn} is {found.state}: end it before completing it")

    def prepare_timeout(self, txn: TxnID, now_ms: int) -> UpdateState | None:
        """The timeout abort of an OPEN transaction past its deadline; None when there is
        nothing to time out (it ended meanwhile, or is not due)."""
        meta = self.get(txn)
        if meta is None or meta.state is not TxnState.OPEN or now_ms < meta.deadline_ms:
            return None
        return UpdateState(txn, TxnState.ABORTING, now_ms, AbortReason.TIMEOUT)

    def transactional_id_principal(self, transactional_id: str) -> str | None:
        """The principal that owns the id (registered it first with auth on), or None."""
        return self._tid_principals.get(transactional_id)

    def acting_owner(self, txn: TxnID, owner: str, principal: str | None, superuser: bool) -> str:
        """Who a request on ``txn`` acts as. Auth off (``principal`` None): the owner the client
        names. Auth on: its principal, which must own the txn (``NotAuthorized``), or a superuser,
        who acts as the txn's owner (as Pulsar's ownership check lets superusers through)."""
        if principal is None:
            return owner
        meta = self.get(txn)
        if meta is None:
            return principal  # unknown or ended: the prepare that follows says which
        if superuser:
            return meta.owner
        if meta.owner != principal:
            raise NotAuthorized(f"{txn} is owned by {meta.owner!r}, not {principal!r}")
        return principal

    def check_transactional_id_principal(self, transactional_id: str, principal: str | None,
                                         superuser: bool) -> None:
        """``NotAuthorized`` unless ``principal`` may use the id: its owner, a superuser, or any
        caller while nobody owns it (auth off, or never registered)."""
        owner = self._tid_principals.get(transactional_id)
        if principal is None or owner is None or owner == principal or superuser:
            return
        raise NotAuthorized(f"transactional id {transactional_id!r} belongs to {owner!r}, not {principal!r}")

    def prepare_register_transactional_id(self, transactional_id: str, now_ms: int,
                                          principal: str | None = None) -> list[Record]:
        """Records that fence the id's older incarnations: the abort (FENCED) of its OPEN
        transaction, if any, then RegisterTransactionalId with the next epoch (0 the first time).
        Log them as one batch, in this order. The new epoch is ``records[-1].epoch``."""
        check_tid(transactional_id)
        check_ms(now_ms, "now_ms")
        records: list[Record] = []
        open_sequence = self._open_by_tid.get(transactional_id)
        if open_sequence is not None and not testing_bugs.REINTRODUCED["no_tid_fencing"]:
            txn = TxnID(self.tc_id, open_sequence)
            records.append(UpdateState(txn, TxnState.ABORTING, now_ms, AbortReason.FENCED))
        epoch = self._epochs.get(transactional_id, -1) + 1
        records.append(RegisterTransactionalId(transactional_id, epoch, now_ms, principal))
        return records

    def prepare_checkpoint(self) -> Checkpoint:
        """What lets the log drop the records of transactions ended before it. Take it with
        nothing in flight (every prepared record applied) and read ``min_live_sequence()`` at the
        same time: once the checkpoint is durable, the records before it of transactions below
        that sequence (below ``next_sequence`` when nothing is live), its RegisterTransactionalId
        records and older checkpoints may be dropped. Records of live transactions must stay."""
        return Checkpoint(
            next_sequence=max(self._next_sequence, self._reserved_sequence),
            transactional_ids=dict(self._epochs),
            recent_outcomes=list(self._outcomes.items()),
            transactional_id_principals=dict(self._tid_principals),
            last_txns=dict(self._last_by_tid),
        )

    def compacted_records(self) -> list[Record]:
        """A minimal log that replays into this state: the records re-creating each live
        transaction, then a checkpoint. For starting a fresh log (e.g. a new incarnation's
        ledger, right after recovery) so the old one can be deleted. Like ``prepare_checkpoint``,
        call it with nothing in flight."""
        records: list[Record] = []
        for meta in self._live.values():
            records.append(NewTxn(meta.txn, meta.owner, meta.timeout_ms, meta.start_ms,
                                  meta.transactional_id, meta.epoch))
            # Each follow-up record carries last_modified_ms, so the replayed entry equals this one.
            if meta.partitions:
                records.append(AddPartitions(meta.txn, meta.partitions, meta.last_modified_ms))
            if meta.subscriptions:
                records.append(AddSubscriptions(meta.txn, meta.subscriptions, meta.last_modified_ms))
            if meta.state is not TxnState.OPEN:
                records.append(UpdateState(meta.txn, meta.state, meta.last_modified_ms, meta.abort_reason))
        records.append(self.prepare_checkpoint())
        return records

    # --- apply: the only mutator -------------------------------------------------------------

    def apply(self, record: Record) -> None:
        """Make a logged record take effect. Atomic: when it raises (``InvalidTxnState``),
        nothing changed."""
        if isinstance(record, NewTxn):
            self._apply_new_txn(record)
        elif isinstance(record, AddPartitions):
            self._apply_add(record.txn, "partitions", record.partitions, record.now_ms)
        elif isinstance(record, AddSubscriptions):
            self._apply_add(record.txn, "subscriptions", record.subscriptions, record.now_ms)
        elif isinstance(record, UpdateState):
            self._apply_update_state(record)
        elif isinstance(record, RegisterTransactionalId):
            self._apply_register(record)
        elif isinstance(record, Checkpoint):
            self._apply_checkpoint(record)
        else:
            raise InvalidArgument(f"not a transaction log record: {record!r}")
        assert len(self._live) == sum(self._counts.values()), "state counts out of step with the table"

    def replay(self, records: Iterable[Record]) -> int:
        """Apply ``records`` in order (a log read back after a restart); how many there were."""
        count = 0
        for record in records:
            self.apply(record)
            count += 1
        return count

    def _apply_new_txn(self, record: NewTxn) -> None:
        txn, tid = record.txn, record.transactional_id
        self._check_own(txn)
        if txn.sequence < self._next_sequence:
            raise InvalidTxnState(f"{txn}: sequence already used (next is {self._next_sequence})")
        if tid is not None:
            current = self._epochs.get(tid, -1)
            if record.epoch is None or record.epoch < current:
                raise InvalidTxnState(f"{txn}: epoch {record.epoch} of {tid!r} is fenced by {current}")
            if tid in self._open_by_tid:
                raise InvalidTxnState(f"{txn}: {tid!r} already has an open transaction")
            # A higher epoch than known: its registration was trimmed from the log; keep the max.
            self._epochs[tid] = record.epoch
            self._open_by_tid[tid] = txn.sequence
            self._last_by_tid[tid] = txn.sequence
        deadline_ms = record.start_ms + record.timeout_ms
        self._live[txn.sequence] = TxnMeta(
            txn=txn, state=TxnState.OPEN, owner=record.owner, timeout_ms=record.timeout_ms,
            start_ms=record.start_ms, deadline_ms=deadline_ms, last_modified_ms=record.start_ms,
            transactional_id=tid, epoch=record.epoch)
        self._live_order.append(txn.sequence)
        heapq.heappush(self._deadlines, (deadline_ms, txn.sequence))
        self._next_sequence = txn.sequence + 1
        self._reserved_sequence = max(self._reserved_sequence, self._next_sequence)
        self._counts[TxnState.OPEN] += 1

    def _apply_add(self, txn: TxnID, field: str, items: tuple[tuple[Any, ...], ...], now_ms: int) -> None:
        meta = self._live.get(txn.sequence) if txn.tc_id == self.tc_id else None
        if meta is None or meta.state is not TxnState.OPEN:
            state = self._state_name(txn, meta)
            raise InvalidTxnState(f"{txn}: cannot add {field} in state {state}")
        known: tuple[tuple[Any, ...], ...] = getattr(meta, field)
        merged = dict.fromkeys(known)
        merged.update(dict.fromkeys(items))
        changes = {field: tuple(merged), "last_modified_ms": now_ms}
        self._live[txn.sequence] = msgspec.structs.replace(meta, **changes)

    def _apply_update_state(self, record: UpdateState) -> None:
        txn, new = record.txn, record.new_state
        meta = self._live.get(txn.sequence) if txn.tc_id == self.tc_id else None
        if meta is None or meta.state not in VALID_PREVIOUS_STATES[new]:
            raise InvalidTxnState(f"{txn}: {self._state_name(txn, meta)} -> {new} not allowed")
        if new is TxnState.ABORTING:
            reason_ok = record.reason is not None
        elif new is TxnState.ABORTED:
            reason_ok = record.reason is meta.abort_reason
        else:
            reason_ok = record.reason is None
        if not reason_ok:
            raise InvalidTxnState(f"{txn}: {meta.state} -> {new} with abort reason {record.reason} "
                                  "not allowed")
        sequence = txn.sequence
        self._counts[meta.state] -= 1
        if meta.state is TxnState.OPEN and meta.transactional_id is not None:
            self._open_by_tid.pop(meta.transactional_id, None)
        if new in FINAL_STATES:
            del self._live[sequence]
            outcome = outcome_of(new, meta.abort_reason)
            self._totals[outcome] += 1
            self._outcomes[sequence] = outcome
            while len(self._outcomes) > self.max_recent_outcomes:
                self._outcomes.popitem(last=False)
        else:
            self._live[sequence] = msgspec.structs.replace(
                meta, state=new, abort_reason=record.reason, last_modified_ms=record.now_ms)
            self._counts[new] += 1

    def _apply_register(self, record: RegisterTransactionalId) -> None:
        tid = record.transactional_id
        current = self._epochs.get(tid, -1)
        if record.epoch <= current:
            raise InvalidTxnState(f"transactional id {tid!r}: epoch {record.epoch} is not above {current}")
        if tid in self._open_by_tid and not testing_bugs.REINTRODUCED["no_tid_fencing"]:
            # Its OPEN txn must be fenced (aborted) by an earlier record of the same batch.
            open_txn = TxnID(self.tc_id, self._open_by_tid[tid])
            raise InvalidTxnState(f"transactional id {tid!r}: {open_txn} is still OPEN under the old epoch")
        self._epochs[tid] = record.epoch
        if record.principal is not None:
            self._tid_principals.setdefault(tid, record.principal)

    def _apply_checkpoint(self, record: Checkpoint) -> None:
        for sequence, outcome in record.recent_outcomes:
            known = self._outcomes.get(sequence, outcome)
            if sequence in self._live or known != outcome or sequence >= record.next_sequence:
                raise InvalidTxnState(f"checkpoint outcome {outcome} of {TxnID(self.tc_id, sequence)} "
                                      f"contradicts the log")
        # Outcomes the checkpoint lacks were forgotten before it, or finished while it was being
        # written: keep them as the oldest, so a bounded map evicts them first.
        from_checkpoint = dict(record.recent_outcomes)
        merged = OrderedDict((seq, out) for seq, out in self._outcomes.items() if seq not in from_checkpoint)
        merged.update(from_checkpoint)
        while len(merged) > self.max_recent_outcomes:
            merged.popitem(last=False)
        self._outcomes = merged
        for tid, epoch in record.transactional_ids.items():
            # Records logged before the checkpoint but applied after it was taken may be newer.
            self._epochs[tid] = max(epoch, self._epochs.get(tid, epoch))
        for tid, principal in record.transactional_id_principals.items():
            self._tid_principals.setdefault(tid, principal)
        for tid, sequence in record.last_txns.items():
            self._last_by_tid[tid] = max(sequence, self._last_by_tid.get(tid, sequence))
        self._next_sequence = max(self._next_sequence, record.next_sequence)
        self._reserved_sequence = max(self._reserved_sequence, self._next_sequence)

    # --- helpers -----------------------------------------------------------------------------

    def _check_own(self, txn: TxnID) -> None:
        if not isinstance(txn, TxnID) or txn.tc_id != self.tc_id:
            raise InvalidTxnState(f"{txn!r} does not belong to coordinator {self.tc_id}")

    def _state_name(self, txn: TxnID, meta: TxnMeta | None) -> str:
        if meta is not None:
            return meta.state
        outcome = self.outcome(txn)
        if outcome is None:
            return "unknown"
        return TxnState.COMMITTED if outcome is Outcome.COMMITTED else TxnState.ABORTED

    def _lookup(self, txn: TxnID) -> TxnMeta | Outcome:
        """The live entry or remembered outcome of ``txn``; TransactionNotFound otherwise."""
        if not isinstance(txn, TxnID):
            raise InvalidArgument(f"not a transaction id: {txn!r}")
        if txn.tc_id != self.tc_id:
            raise TransactionNotFound(f"{txn} belongs to coordinator {txn.tc_id}, not {self.tc_id}")
        meta = self._live.get(txn.sequence)
        if meta is not None:
            return meta
        outcome = self._outcomes.get(txn.sequence)
        if outcome is not None:
            return outcome
        if 0 <= txn.sequence < self._next_sequence:
            raise TransactionNotFound(f"{txn} has ended and its outcome is no longer remembered")
        raise TransactionNotFound(f"{txn} is unknown")

    def _check_caller(self, meta: TxnMeta, owner: str, epoch: int | None) -> None:
        """The owner must match; under a transactional id, the caller's epoch (the txn's own
        when not given) must be the id's current one."""
        if owner != meta.owner:
            raise NotAllowed(f"{meta.txn} is owned by {meta.owner!r}, not {owner!r}")
        tid = meta.transactional_id
        if tid is None:
            if epoch is not None:
                raise InvalidArgument(f"{meta.txn} has no transactional id: no epoch expected")
            return
        caller_epoch = meta.epoch if epoch is None else epoch
        current = self._epochs.get(tid)
        if caller_epoch != current and not testing_bugs.REINTRODUCED["no_tid_fencing"]:
            raise Fenced(f"{meta.txn}: epoch {caller_epoch} of {tid!r} is fenced by {current}")

    def _open_for_change(self, txn: TxnID, owner: str, now_ms: int, epoch: int | None) -> TxnMeta:
        check_ms(now_ms, "now_ms")
        found = self._lookup(txn)
        if isinstance(found, Outcome):
            raise ended_error(txn, found, ending=False)
        self._check_caller(found, owner, epoch)
        if found.state is not TxnState.OPEN:
            raise ended_error(txn, outcome_of(found.state, found.abort_reason), ending=True)
        if now_ms >= found.deadline_ms:
            raise TransactionTimedOut(f"{txn} passed its deadline; it will be aborted")
        return found

    @staticmethod
    def _repeated_end(txn: TxnID, action: EndAction, outcome: Outcome, state: TxnState) -> EndResult:
        """A repeated end is success when it asks for what happens anyway, else an error. A txn
        fenced by its transactional id refuses every end as ``Fenced``, even an abort (Kafka's
        EndTxn with a stale epoch): its caller is a zombie and must learn so."""
        committed = outcome is Outcome.COMMITTED
        if committed == (action is EndAction.COMMIT) and outcome is not Outcome.FENCED:
            return EndResult(None, state)
        raise ended_error(txn, outcome, ending=state not in FINAL_STATES)

    # --- introspection -----------------------------------------------------------------------

    def stats(self, now_ms: int, slowest: int = 10) -> dict[str, Any]:
        """Counts, totals (since this object was built, replay included) and the ``slowest``
        oldest live transactions."""
        oldest = self.older_than(now_ms, 0, slowest)
        aborted = sum(count for outcome, count in self._totals.items() if outcome is not Outcome.COMMITTED)
        return {
            "tc_id": self.tc_id,
            "states": {**{state.value: count for state, count in self._counts.items()},
                       TxnState.COMMITTED.value: self._totals[Outcome.COMMITTED],
                       TxnState.ABORTED.value: aborted},
            "live": len(self._live),
            "committed_total": self._totals[Outcome.COMMITTED],
            "aborted_total": aborted,
            "timed_out_total": self._totals[Outcome.TIMED_OUT],
            "fenced_total": self._totals[Outcome.FENCED],
            "low_watermark": self.low_watermark,
            "next_sequence": self._next_sequence,
            "next_deadline_ms": self.next_deadline_ms(),
            "transactional_ids": len(self._epochs),
            "recent_outcomes": len(self._outcomes),
            "slowest_txns": [describe_txn(meta, now_ms) for meta in oldest],
        }

    def check_invariants(self) -> None:
        """Assert the invariants of the whole table (O(n): for tests and debugging)."""
        assert all(sequence < self._next_sequence for sequence in self._live), "live sequence >= next"
        assert self._reserved_sequence >= self._next_sequence
        assert list(self._live) == sorted(self._live), "table not in sequence order"
        assert set(self._live) <= set(self._live_order), "live txn missing from the watermark queue"
        assert not set(self._live) & set(self._outcomes), "txn both live and finished"
        assert all(sequence < self._next_sequence for sequence in self._outcomes)
        assert len(self._outcomes) <= self.max_recent_outcomes
        for state in LIVE_STATES:
            assert self._counts[state] == sum(1 for m in self._live.values() if m.state is state), state
        open_seqs = {m.txn.sequence for m in self._live.values() if m.state is TxnState.OPEN}
        assert open_seqs <= {sequence for _, sequence in self._deadlines}, "OPEN txn without deadline"
        self.next_deadline_ms()  # lazy cleanup: afterwards the heap's head is an OPEN txn
        if self._deadlines:
            assert self._deadlines[0][1] in open_seqs
        for tid, sequence in self._open_by_tid.items():
            meta = self._live[sequence]
            assert meta.state is TxnState.OPEN and meta.transactional_id == tid, tid
            assert meta.epoch is not None and meta.epoch == self._epochs[tid]
        for tid, sequence in self._last_by_tid.items():
            assert tid in self._epochs and sequence < self._next_sequence, tid
            assert self._open_by_tid.get(tid, sequence) == sequence, f"{tid}: open txn is not its last"
        assert len(self._open_by_tid) == sum(
            1 for m in self._live.values() if m.state is TxnState.OPEN and m.transactional_id is not None)
        for meta in self._live.values():
            assert meta.deadline_ms == meta.start_ms + meta.timeout_ms
            assert (meta.abort_reason is not None) == (meta.state is TxnState.ABORTING)


def _age_order(meta: TxnMeta) -> tuple[int, int]:
    return meta.start_ms, meta.txn.sequence
