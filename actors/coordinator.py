"""The transaction coordinator actor ``tc-<id>``: a thin shell around ``CoordinatorState``.

It owns the state machine and the transaction log (a managed ledger), and does the I/O, locking,
timers and retries; every decision is the state machine's. Each request is prepare -> log ->
apply: the record is appended to the log, and the state machine applies it in the ledger's
``on_durable`` callback, in log order, before anyone is answered.

end_txn: log COMMITTING/ABORTING, send the end (with the low watermark) to every participant in
parallel, answer the caller, log COMMITTED/ABORTED (the end's driver yields until the answer is
out before it prepares that record). The outcome is durable from the first record and every
participant has it before the answer, so the last record is off the caller's path (one durable
write less per commit). Nor does it need a put of its own: nothing waits for it but the
bookkeeping, and a coordinator that recovers without it drives the end to the participants again,
which they take as a repeat. So it is a lingering entry of the log (``ManagedLedger.enqueue``): it
goes in the put of the next entry logged, or alone after ``complete_linger_ms``, and a client
committing one txn after another costs this coordinator one put a txn, not two. ``get_txn``,
``list_txns``, ``stats``, ``ready`` and ``compact`` first wait for the last records of ends already
answered (put at once meanwhile), so a caller reads its own end. With
``commit_answer="logged"`` a commit is answered as Kafka's EndTxn is, once COMMITTING is logged
and its driver started: the decision is durable and recovery re-drives it, so the answer skips the
participants' round trip and their marker puts; the txn reads COMMITTING until they have it.
Recovery replays the log and re-drives every COMMITTING/ABORTING txn, so a crash at any step ends
with the same outcome. ``commit_and_begin`` is end_txn(COMMIT) whose COMMITTING entry also
begins the caller's next txn (NewTxn and its registrations): one entry, so the next txn costs the
client no round trip and no write of its own. Participants are called through
``ActorRef`` (``participants.py``), and their failures sorted by its one classification:

* retriable (the actor restarting, or not found while it is re-created): retried with the shared
  backoff until it takes, however long (a restarting participant must not leave the txn half
  ended);
* no actor, and its topic or subscription is deleted: that participant counts as done (its data is
  gone, nothing is left to end; waiting would pin this coordinator's low watermark forever);
* anything else (the participant refuses the end: a broken invariant, or storage it cannot
  recover from): not retried, since a retry meets the same refusal. It is logged and counted
  (metric ``raytxn_txn_end_failures`` by error kind, ``end_failures`` in stats), and this drive
  stops: the txn stays COMMITTING/ABORTING (its outcome is logged and never reversed; the other
  participants get their end), listed under ``stalled_ends`` in stats, and it pins the low
  watermark. It is driven again every ``stalled_end_retry_s``, because a refusal may pass: a
  participant whose start failed (a snapshot segment deleted under it by a zombie predecessor,
  found by the simulator) refuses every call until its process restarts a few seconds later, and
  a txn left stalled until the next coordinator restart would pin the watermark with nothing
  wrong any more. Also when this coordinator restarts, and on an explicit call: the next
  ``end_txn`` of the same action (its owner or a superuser), which meanwhile get
  ``ParticipantEndFailed``.

The log is compacted: after ``compact_after_entries`` entries the live state is appended as one
entry ending with a Checkpoint record, and everything before it is trimmed. Replay starts at the
last such entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from typing import Any

import ray

from raytxn.actors.coordinator_tids import TransactionalIdViews
from raytxn.actors.participants import end_on_participant, participant_name
from raytxn.actors.shell import (
    ActorRefs,
    ActorShell,
    Clock,
    engine_actor_classes_imported,
    import_engine_actor_classes,
    ray_actor_options,
    replay,
)
from raytxn.auth import Access, AuthConfig, Authorizer, guarded
from raytxn.client.rpc import ActorRef
from raytxn.config import CoordinatorConfig
from raytxn.errors import (
    InvalidArgument,
    NotAllowed,
    ParticipantEndFailed,
    RaytxnError,
    TopicNotFound,
    TransactionNotFound,
)
from raytxn.faults import FaultPoints, FaultTarget
from raytxn.hashing import coordinator_for
from raytxn.ids import SUPERVISOR_NAME, Position, TxnID, coordinator_actor_name
from raytxn.ledger import Entry, ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.metrics import CoordinatorMetrics
from raytxn.protocol.coordinator_state import CoordinatorState, EndAction, TxnMeta, TxnState, describe_txn
from raytxn.protocol.txnlog import Checkpoint, NewTxn, Record, decode_record, encode_record
from raytxn.waiting import yield_to_woken_tasks

FAULT_POINTS = (
    "coordinator.after_log_new",
    "coordinator.after_log_committing",
    "coordinator.after_log_aborting",
    "coordinator.after_send_end",
    "coordinator.before_log_complete",
    "coordinator.complete_lingering",  # its last record queued, lingering for the next put
    "coordinator.after_log_complete",
)

MAX_STALLED_SHOWN = 100  # stalled ends listed in stats

log = logging.getLogger(__name__)


def log_stream(tc_id: int) -> str:
    return f"coordinator/{tc_id}/log"


class TransactionCoordinator(TransactionalIdViews, ActorShell, FaultTarget):
    """See the module docstring. Create with ``CoordinatorActor.options(name=...)``."""

    actor_kind = "coordinator"

    def __init__(self, tc_id: int, storage_url: str | None = None,
                 storage_options: dict[str, Any] | None = None, config: CoordinatorConfig | None = None,
                 auth: AuthConfig | None = None, *, clock: Clock | None = None,
                 actor_refs: ActorRefs | None = None, storage: Storage | None = None) -> None:
        super().__init__(coordinator_actor_name(tc_id), clock, actor_refs)
        import_engine_actor_classes()  # its first commit's calls to partitions would import them
        self.tc_id = tc_id
        self.authorizer = Authorizer(auth)
        self.config = config or CoordinatorConfig()
        # A given ``storage`` (a simulator's) replaces the one the URL names.
        self.storage = storage if storage is not None else Storage.from_url(storage_url, **(storage_options or {}))
        self.state = self._new_state()
        self.faults = FaultPoints()
        self._participants: dict[tuple[str, tuple], ActorRef] = {}
        self._ledger: ManagedLedger | None = None
        self._timer_task: asyncio.Task | None = None
        self._locks: dict[object, asyncio.Lock] = {}
        self._drivers: dict[TxnID, asyncio.Task] = {}
        # Per drive: done once every participant applied the end (the caller is answered then;
        # the COMMITTED/ABORTED record is logged after, off the caller's path).
        self._applied: dict[TxnID, asyncio.Future] = {}
        self._timing_out: dict[TxnID, asyncio.Task] = {}  # the timeouts under way
        # The timer's sleep (``_timer``): what wakes it, that wake-up, and when it is due (ms).
        self._timer_waiter: asyncio.Future | None = None
        self._timer_wake: asyncio.TimerHandle | None = None
        self._timer_due_ms: int | None = None
        self._unapplied = 0                      # entries logged but not applied yet
        # Callers waiting for the last records of answered ends: none lingers meanwhile.
        self._ends_awaited = 0
        self._writes_open = asyncio.Event()      # cleared while a compaction runs
        self._writes_open.set()
        self._entries_since_compaction = 0
        self._compaction: asyncio.Task | None = None
        self._stalled: dict[TxnID, str] = {}  # txns whose last drive a participant refused: why
        self._stalled_at: dict[TxnID, int] = {}  # ... and when (ms): driven again stalled_end_retry_s later
        self.info: dict[str, Any] = {"tc_id": tc_id, "end_retries": 0, "compactions": 0, "end_failures": {},
                                     "commits_answered_at_log": 0}
        self.metrics = CoordinatorMetrics(tc_id)

    # --- start and recovery ----------------------------------------------------------------

    def _new_state(self) -> CoordinatorState:
        return CoordinatorState(self.tc_id, max_timeout_ms=self.config.max_timeout_ms,
                                max_recent_outcomes=self.config.max_recent_outcomes)

    async def _start(self) -> None:
        self._ledger = await ManagedLedger.open(self.storage, log_stream(self.tc_id), self.config.log_config())
        self._ledger.faults = self.faults
        self.state = self._new_state()
        self._entries_since_compaction = 0

        def apply(entry: Entry) -> None:
            where = f"{log_stream(self.tc_id)}@{entry.position}"
            records = [decode_record(raw, where) for raw in entry.records]
            if records and isinstance(records[-1], Checkpoint):
                # The whole live state as of here (older entries may outlive a crash before the
                # trim): the replay starts over from it.
                self.state = self._new_state()
                self._entries_since_compaction = 0
            for record in records:
                self.state.apply(record)
            self._entries_since_compaction += 1

        await replay(self._ledger, apply)
        self.info.update(incarnation=self._ledger.incarnation, replayed_entries=self._entries_since_compaction)
        for state in (TxnState.COMMITTING, TxnState.ABORTING):
            for meta in self.state.txns_in(state):
                self._drive(meta.txn)
        self._timer_task = self._background(self._timer(), "timer")
        if self._entries_since_compaction >= self.config.compact_after_entries:
            self._maybe_compact(force=True)

    @guarded(Access.PUBLIC)
    async def ready(self) -> dict[str, Any]:
        """Wait for recovery (and for the last records of ends already answered); returns this
        incarnation's facts."""
        await self._started()
        await self._answered_ends_logged()
        return {**self.info, "actor_classes_imported": engine_actor_classes_imported(), "pid": os.getpid()}

    def _drain_pending(self) -> int:
        # Ends being driven (and timeouts turning into ends): a drain lets them reach their
        # participants and log their last record, so the next incarnation re-drives none.
        return len(self._drivers) + len(self._timing_out)

    async def _before_passivate(self) -> None:  # (a drain's: coordinators are never passivated)
        await self._answered_ends_logged()

    # --- logging ---------------------------------------------------------------------------

    def _lock(self, key: object) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _log(self, records: list[Record]) -> Position:
        """Append ``records`` as one entry; they are applied in log order once durable.

        Callers prepare and call this with no await in between, so the log order is the order
        of preparation. A failed write stops this incarnation (see the actor shell)."""
        return await self._logged(self._queue_log(records))

    def _queue_log(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future:
        """Queue ``records`` as one log entry (lingering up to ``linger_s`` for company); the
        future is its position once durable and applied (wait with ``_logged``)."""
        assert self._ledger is not None
        state = self.state
        begun = [record.txn for record in records if type(record) is NewTxn]

        def apply(_position: Position) -> None:
            self._unapplied -= 1
            for record in records:
                state.apply(record)
            for txn in begun:  # a new txn's deadline may come before the timer's next wake-up
                self._timer_due_by(state.open_deadline_ms(txn))

        queued = self._ledger.enqueue([encode_record(r) for r in records], on_durable=apply, linger_s=linger_s)
        self._unapplied += 1  # after the enqueue: one refused (MessageTooLarge) is never applied
        return queued

    async def _logged(self, queued: asyncio.Future) -> Position:
        assert self._ledger is not None
        position = await self._write(self._ledger.durable(queued))
        self._entries_since_compaction += 1
        self._maybe_compact()
        return position

    async def _writable(self) -> None:
        await self._started()
        await self._writes_open.wait()

    async def _log_complete(self, txn: TxnID, record: Record) -> None:
        """Log a txn's last record: lingering for the next put (module docstring), unless it is
        off or someone waits for it."""
        linger_s = 0.0 if self._ends_awaited else self.config.complete_linger_ms / 1000
        queued = self._queue_log([record], linger_s)
        if linger_s:
            await self.faults.hit("coordinator.complete_lingering", txn=txn)
        await self._logged(queued)

    # --- requests --------------------------------------------------------------------------

    @guarded(Access.AUTHENTICATED)
    async def new_txn(self, timeout_ms: int | None, owner: str, transactional_id: str | None = None,
                      epoch: int | None = None, caller: str | None = None) -> TxnID:
        """Begin a transaction; with a transactional id, ``epoch`` must be its current one. With
        auth on, the caller's principal owns it (``owner`` is ignored)."""
        if caller is not None:
            owner = caller
        if transactional_id is not None:
            self._check_tid_owner(transactional_id)
            await self._started()
            self._check_tid_principal(transactional_id, caller)
        timeout_ms = self.config.default_timeout_ms if timeout_ms is None else timeout_ms
        key = ("tid", transactional_id) if transactional_id is not None else None
        async with self._lock(key) if key else contextlib.nullcontext():
            await self._writable()
            if transactional_id is not None:
                repeated = self.state.repeated_new_txn(transactional_id, epoch, owner)
                if repeated is not None:
                    return repeated
            self.storage.check_space()  # new work is refused while the store is full (StorageFull)
            record = self.state.prepare_new_txn(self.clock.now_ms(), timeout_ms, owner, transactional_id, epoch)
            await self._log([record])
        self.metrics.txn_begun()
        await self.faults.hit("coordinator.after_log_new", txn=record.txn)
        return record.txn

    @guarded(Access.AUTHENTICATED)
    async def begin_txn(self, timeout_ms: int | None, owner: str, partitions: list[tuple[str, int]],
                        subscriptions: list[tuple[str, int, str]], caller: str | None = None) -> TxnID:
        """Begin a transaction together with the registration of its first participants: one
        log entry (NewTxn, then AddPartitions/AddSubscriptions), so a client that begins lazily
        pays one round trip and one write where ``new_txn`` and ``add_*`` cost two of each."""
        if caller is not None:
            owner = caller
        timeout_ms = self.config.default_timeout_ms if timeout_ms is None else timeout_ms
        await self._writable()
        self.storage.check_space()
        records = self.state.prepare_begin(self.clock.now_ms(), timeout_ms, owner, partitions, subscriptions)
        await self._log(records)
        self._prefetch_participants(records[0].txn)
        self.metrics.txn_begun()
        await self.faults.hit("coordinator.after_log_new", txn=records[0].txn)
        return records[0].txn

    @guarded(Access.AUTHENTICATED)
    async def register_transactional_id(self, transactional_id: str, caller: str | None = None) -> int:
        """Bump the id's epoch durably, aborting its open txn: older epochs are fenced. Returns
        once every txn of the id has ended at every participant (Kafka's initTransactions), so the
        new incarnation may at once redo what the old one held (``ParticipantEndFailed``, the
        epoch bumped all the same, when a participant refuses that abort: a retry drives it
        again). With auth on, the id belongs to the principal that registered it first: others
        get NotAuthorized."""
        self._check_tid_owner(transactional_id)
        async with self._lock(("tid", transactional_id)):
            await self._writable()
            self._check_tid_principal(transactional_id, caller)
            records = self.state.prepare_register_transactional_id(transactional_id, self.clock.now_ms(), caller)
            fenced_txns = [r.txn for r in records[:-1]]
            locks = [self._lock(txn) for txn in fenced_txns]
            for lock in locks:
                await lock.acquire()
            try:
                await self._writable()
                records = self.state.prepare_register_transactional_id(transactional_id, self.clock.now_ms(), caller)
                await self._log(records)
            finally:
                for lock in locks:
                    lock.release()
        ending = [meta.txn for meta in self.state.live_txns()
                  if meta.transactional_id == transactional_id and meta.state is not TxnState.OPEN]
        for txn in ending:
            self._drive(txn)
        # Ended at every participant, not necessarily logged so (its last record may linger).
        await asyncio.shield(asyncio.gather(*(self._applied[txn] for txn in ending)))
        return records[-1].epoch

    @guarded(Access.AUTHENTICATED)
    async def add_partitions(self, txn: TxnID, partitions: Iterable[tuple[str, int]], owner: str,
                             epoch: int | None = None, caller: str | None = None) -> None:
        async with self._lock(txn):
            await self._writable()
            owner = self._acting_owner(txn, owner, caller)
            record = self.state.prepare_add_partitions(txn, partitions, owner, self.clock.now_ms(), epoch)
            if record is not None:
                self.storage.check_space()
                await self._log([record])
                self._prefetch_participants(txn)

    @guarded(Access.AUTHENTICATED)
    async def add_subscriptions(self, txn: TxnID, subscriptions: Iterable[tuple[str, int, str]], owner: str,
                                epoch: int | None = None, caller: str | None = None) -> None:
        async with self._lock(txn):
            await self._writable()
            owner = self._acting_owner(txn, owner, caller)
            record = self.state.prepare_add_subscriptions(txn, subscriptions, owner, self.clock.now_ms(), epoch)
            if record is not None:
                self.storage.check_space()
                await self._log([record])
                self._prefetch_participants(txn)

    @guarded(Access.AUTHENTICATED)
    async def end_txn(self, txn: TxnID, action: EndAction, owner: str, epoch: int | None = None,
                      transactional_id: str | None = None, applied: bool = False, caller: str | None = None) -> str:
        """Commit or abort; returns the final state (COMMITTED or ABORTED) once every participant
        has it (a commit once it is logged, with ``commit_answer="logged"``, unless ``applied``:
        a caller about to read what it committed). Idempotent for the same action; ``Fenced`` for
        a stale epoch of ``transactional_id``."""
        state, _ = await self._end_txn(txn, action, owner, epoch, caller, transactional_id, applied=applied)
        return state

    @guarded(Access.AUTHENTICATED)
    async def commit_and_begin(self, txn: TxnID, owner: str, timeout_ms: int, partitions: list[tuple[str, int]],
                               subscriptions: list[tuple[str, int, str]],
                               caller: str | None = None) -> tuple[str, TxnID | None]:
        """Commit ``txn`` (as ``end_txn``) and begin the owner's next transaction with
        ``partitions`` and ``subscriptions`` registered, in the one log entry of COMMITTING: a
        client committing one transaction after another then begins each without a round trip or
        a write of its own (runtime/client/txn_chain.py). Returns the final state and the next
        txn; no next txn (None) when the commit had been asked before (a retry whose first
        attempt began one: that one times out unused, aborted like any abandoned txn) or when
        the next one cannot begin (the commit happens all the same)."""
        return await self._end_txn(txn, EndAction.COMMIT, owner, None, caller,
                                   begin_next=(timeout_ms, partitions, subscriptions))

    @guarded(Access.AUTHENTICATED)
    async def release_unused(self, txn: TxnID, owner: str, caller: str | None = None) -> str:
        """Abort an open txn its owner never used, without an end to its participants
        (``CoordinatorState.prepare_release_unused``): a chained txn nobody took. Idempotent;
        returns ABORTED."""
        async with self._lock(txn):
            await self._writable()
            owner = self._acting_owner(txn, owner, caller)
            records = self.state.prepare_release_unused(txn, owner, self.clock.now_ms())
            if records:
                await self._log(records)
                self.metrics.txn_ended(committed=False)
        if not records:
            task = self._drivers.get(txn)
            if task is not None:  # an abort already under way (its timeout): answer once it is done
                await asyncio.shield(self._applied[txn])
        self._locks.pop(txn, None)
        return str(TxnState.ABORTED)

    async def _end_txn(self, txn: TxnID, action: EndAction, owner: str, epoch: int | None,
                       caller: str | None, transactional_id: str | None = None,
                       begin_next: tuple[int, list, list] | None = None,
                       applied: bool = False) -> tuple[str, TxnID | None]:
        requested = self.clock.monotonic()
        next_txn = None
        async with self._lock(txn):
            await self._writable()
            owner = self._acting_owner(txn, owner, caller)
            result = self.state.prepare_end(txn, action, owner, self.clock.now_ms(), epoch, transactional_id)
            if result.record is not None:
                begun = self._prepare_next(result.record, owner, caller, begin_next)
                await self._log([result.record, *begun])
                if begun:
                    next_txn = begun[0].txn
                    self.metrics.txn_begun()
            elif result.finished:
                return str(result.state), None
        self._drive(txn)
        if action is EndAction.COMMIT and not applied and self._answers_at_log(txn):
            self.info["commits_answered_at_log"] += 1
            committed = True
        else:
            await asyncio.shield(self._applied[txn])
            committed = self._ended_committed(txn)
        # Only the request that started the commit is timed: a retried end_txn would count it twice.
        if result.record is not None and result.record.new_state is TxnState.COMMITTING:
            self.metrics.commit_latency((self.clock.monotonic() - requested) * 1000)
        return str(TxnState.COMMITTED if committed else TxnState.ABORTED), next_txn

    def _ended_committed(self, txn: TxnID) -> bool:
        """Whether ``txn``, which every participant has the end of, committed."""
        meta = self.state.get(txn)
        if meta is not None:  # the last record is on its way
            assert meta.state in (TxnState.COMMITTING, TxnState.ABORTING), f"{txn} applied but {meta.state}"
            return meta.state is TxnState.COMMITTING
        outcome = self.state.outcome(txn)
        assert outcome is not None, f"{txn} driven to its end without an outcome"
        return outcome == "COMMITTED"

    def _answers_at_log(self, txn: TxnID) -> bool:
        """Whether this commit is answered now, with COMMITTING logged and its driver started
        (``commit_answer="logged"``, Kafka's EndTxn), rather than once every participant has it.
        Only a txn still COMMITTING here: one whose driver already finished (or was never needed)
        is answered by the usual path, which reads its outcome."""
        if self.config.commit_answer != "logged":
            return False
        meta = self.state.get(txn)
        return meta is not None and meta.state is TxnState.COMMITTING

    def _prepare_next(self, end: Record, owner: str, caller: str | None,
                      begin_next: tuple[int, list, list] | None) -> list[Record]:
        """The records beginning the next txn of ``commit_and_begin`` (none without one, or when
        they are refused: the commit must not fail for the sake of the next txn)."""
        if begin_next is None:
            return []
        timeout_ms, partitions, subscriptions = begin_next
        try:
            return self.state.prepare_chained_begin(end, self.clock.now_ms(), timeout_ms, caller or owner, partitions,
                                                    subscriptions)
        except RaytxnError as refused:
            log.warning("coordinator %d: the next txn of %s not begun with its commit: %r", self.tc_id, owner, refused)
            return []

    def _acting_owner(self, txn: TxnID, owner: str, principal: str | None) -> str:
        return self.state.acting_owner(txn, owner, principal, self.authorizer.is_superuser(principal))

    def _check_tid_principal(self, transactional_id: str, principal: str | None) -> None:
        self.state.check_transactional_id_principal(transactional_id, principal,
                                                    self.authorizer.is_superuser(principal))

    def _check_tid_owner(self, transactional_id: str) -> None:
        home = coordinator_for(transactional_id, self.config.num_coordinators)
        if home != self.tc_id:
            raise NotAllowed(f"transactional id {transactional_id!r} belongs to coordinator {home}")

    # --- driving ends ----------------------------------------------------------------------

    def _drive(self, txn: TxnID) -> asyncio.Task:
        """The task driving ``txn`` to its end (started unless running); ``_applied[txn]`` is done
        once every participant has the end, or fails as the task does."""
        task = self._drivers.get(txn)
        if task is None:
            loop = asyncio.get_running_loop()
            applied = self._applied[txn] = loop.create_future()
            task = loop.create_task(self._run_end(txn, applied))
            self._drivers[txn] = task
            task.add_done_callback(lambda done: self._driven(txn, done, applied))
        return task

    def _driven(self, txn: TxnID, task: asyncio.Task, applied: asyncio.Future) -> None:
        self._drivers.pop(txn, None)
        self._applied.pop(txn, None)
        refused_ms = self._stalled_at.get(txn)
        if refused_ms is not None:  # a participant refused the end: the timer drives it again later
            self._timer_due_by(refused_ms + int(self.config.stalled_end_retry_s * 1000))
        if not applied.done():
            if task.cancelled():
                applied.cancel()
            elif task.exception() is not None:
                applied.set_exception(task.exception())
            else:
                applied.set_result(None)  # nothing to drive: it had ended already
        if not task.cancelled():
            task.exception()  # a stalled end is logged and kept in _stalled; nobody may be waiting
        if not applied.cancelled():
            applied.exception()  # retrieved: waiters re-raise it through `await`

    async def _answered_ends_logged(self) -> None:
        """Wait for the last record of every end whose caller was answered (each is one write
        away), so that a read after an answered end sees it ended. Ends still reaching their
        participants are not waited for."""
        completing = [task for txn, task in list(self._drivers.items())
                      if (applied := self._applied.get(txn)) is not None and applied.done()]
        if completing:
            assert self._ledger is not None
            self._ends_awaited += 1  # their last records are put at once meanwhile
            try:
                self._ledger.flush_lingering()
                await asyncio.wait(completing)
            finally:
                self._ends_awaited -= 1

    async def _run_end(self, txn: TxnID, applied: asyncio.Future) -> None:
        meta = self.state.get(txn)
        if meta is None:
            return
        committing = meta.state is TxnState.COMMITTING
        assert meta.state in (TxnState.COMMITTING, TxnState.ABORTING), f"{txn} is {meta.state}"
        await self.faults.hit("coordinator.after_log_committing" if committing else
                              "coordinator.after_log_aborting", txn=txn)
        action = EndAction.COMMIT if committing else EndAction.ABORT
        participants = _participants_of(meta)
        if len(participants) == 1:  # most txns: no task and no gather on the commit's path
            await self._send_end(*participants[0], txn, action)
        else:  # every participant that takes the end gets it, also when another refuses it
            sent = await asyncio.gather(*(self._send_end(kind, ident, txn, action) for kind, ident in participants),
                                        return_exceptions=True)
            refused = [result for result in sent if isinstance(result, BaseException)]
            if refused:
                raise refused[0]
        self._stalled.pop(txn, None)
        self._stalled_at.pop(txn, None)
        applied.set_result(None)
        # Its caller is answered first: it waits for ``applied`` behind ``asyncio.shield``, two
        # loop iterations from here, and the last record below is not on its path.
        await yield_to_woken_tasks(iterations=2)
        await self.faults.hit("coordinator.after_send_end", txn=txn)
        async with self._lock(txn):
            await self.faults.hit("coordinator.before_log_complete", txn=txn)
            await self._writable()
            record = self.state.prepare_complete(txn, self.clock.now_ms())
            if record is not None:
                await self._log_complete(txn, record)
                self.metrics.txn_ended(committed=committing)
        self._locks.pop(txn, None)
        await self.faults.hit("coordinator.after_log_complete", txn=txn)

    def _prefetch_participants(self, txn: TxnID) -> None:
        """Look up, in a worker thread, the txn's participants this coordinator has no reference
        to yet (``ActorRef.prefetch``), once they are registered: their end comes at the commit,
        and a lookup there would hold the commit, and this loop, for tens of ms."""
        meta = self.state.get(txn)
        if meta is None:
            return
        for kind, ident in _participants_of(meta):
            if (kind, ident) not in self._participants:
                self._participant(kind, ident).prefetch()

    def _participant(self, kind: str, ident: tuple) -> ActorRef:
        # Kept: a fresh one would look its actor up again (ray.get_actor, a blocking call to the
        # GCS, on this loop) for every end of every txn. It looks up again after a failure.
        ref = self._participants.get((kind, ident))
        if ref is None:
            ref = self._participants[(kind, ident)] = self._actor_ref(participant_name(kind, ident))
        return ref

    async def _send_end(self, kind: str, ident: tuple, txn: TxnID, action: EndAction) -> None:
        """End ``txn`` on one participant by the rules of the module docstring; raises
        ``ParticipantEndFailed`` when it refuses."""

        def retrying() -> None:
            self.info["end_retries"] += 1

        try:
            delivered = await end_on_participant(
                self._participant(kind, ident), txn, action, lambda: self.state.low_watermark,
                lambda: self._participant_deleted(kind, ident), retrying, self.config.end_retry_backoff_s)
        except Exception as error:  # only a non-retriable error gets here: end_on_participant retries the others
            self._end_refused(txn, kind, ident, action, error)
            raise ParticipantEndFailed(f"{kind} {ident} refused {action} of {txn}: {error!r}; the txn stays "
                                       f"{_ending(action)} until driven again") from error
        if not delivered:
            self.info["ends_to_deleted"] = self.info.get("ends_to_deleted", 0) + 1
            self._participants.pop((kind, ident), None)

    def _end_refused(self, txn: TxnID, kind: str, ident: tuple, action: EndAction, error: BaseException) -> None:
        error_kind = type(error).__name__
        self.metrics.end_failed(error_kind)
        failures = self.info["end_failures"]
        failures[error_kind] = failures.get(error_kind, 0) + 1
        self._stalled[txn] = f"{kind} {ident}: {error!r}"
        self._stalled_at[txn] = self.clock.now_ms()
        log.warning("coordinator %s: %s %s refused %s of %s (%r); the txn stays %s until this coordinator "
                    "restarts or end_txn is called again", self.tc_id, kind, ident, action, txn, error,
                    _ending(action))

    async def _participant_deleted(self, kind: str, ident: tuple) -> bool:
        """Whether the catalog no longer has the participant's topic (or subscription). False
        whenever that cannot be told (no supervisor): the caller retries."""
        try:
            info = await self._actor_ref(SUPERVISOR_NAME).call_async("get_topic", ident[0], deadline_s=5.0)
        except TopicNotFound:
            return True
        except Exception:  # noqa: BLE001 - the supervisor is away: decide on a later attempt
            return False
        return kind == "subscription" and ident[2] not in info["subscriptions"]

    # --- timeouts --------------------------------------------------------------------------

    async def _timer(self) -> None:
        """Times out expired txns, drives stalled ends again and reports slow txns, each when it
        falls due. It sleeps until the earliest of these, and whatever brings one forward wakes
        it sooner (``_timer_due_by``): a begin (a new deadline), a timeout that did not take, a
        stalled txn's drive ending. So an idle coordinator wakes once per ``slow_txn_report_s``,
        not on a fixed tick."""
        loop = asyncio.get_running_loop()
        next_report_ms = 0
        retry_stalled_ms = int(self.config.stalled_end_retry_s * 1000)
        while True:
            now = self.clock.now_ms()
            if now >= next_report_ms:
                self.metrics.slow_txns(self.state.count_older_than(now, self.config.slow_txn_threshold_ms))
                self.metrics.open_txns(self.state.live_count())
                next_report_ms = now + int(self.config.slow_txn_report_s * 1000)
            due_ms = next_report_ms
            for txn, refused_ms in list(self._stalled_at.items()):
                if txn in self._drivers:  # one drive per stalled txn at a time; its end wakes the timer
                    continue
                if now - refused_ms >= retry_stalled_ms:
                    self._stalled_at[txn] = now  # a refusal again restarts the wait
                    self._drive(txn)
                else:
                    due_ms = min(due_ms, refused_ms + retry_stalled_ms)
            for txn in self.state.expired(now):
                if txn not in self._timing_out:
                    self._timing_out[txn] = loop.create_task(self._time_out(txn))
            # The earliest deadline of an OPEN txn whose timeout is not under way already (the
            # end of a timeout brings the timer forward if its txn is still OPEN).
            deadline_ms = self.state.next_deadline_ms(skip={txn.sequence for txn in self._timing_out})
            if deadline_ms is not None:
                due_ms = min(due_ms, deadline_ms)
            await self._timer_sleep(loop, due_ms, now)

    async def _timer_sleep(self, loop: asyncio.AbstractEventLoop, due_ms: int, now_ms: int) -> None:
        """Sleep until ``due_ms``, or until ``_timer_due_by`` brings the wake-up forward."""
        waiter = self._timer_waiter = loop.create_future()
        self._timer_due_ms = due_ms
        self._timer_wake = loop.call_later(_timer_delay_s(due_ms, now_ms), _wake_timer, waiter)
        try:
            await waiter
        finally:
            self._timer_wake.cancel()
            self._timer_waiter = self._timer_wake = self._timer_due_ms = None

    def _timer_due_by(self, due_ms: int | None) -> None:
        """Make the sleeping timer wake by ``due_ms`` (something falls due then), if later."""
        waiter, wake, timer_due_ms = self._timer_waiter, self._timer_wake, self._timer_due_ms
        if due_ms is None or waiter is None or wake is None or timer_due_ms is None or due_ms >= timer_due_ms:
            return
        wake.cancel()
        self._timer_due_ms = due_ms
        self._timer_wake = waiter.get_loop().call_later(_timer_delay_s(due_ms, self.clock.now_ms()), _wake_timer,
                                                        waiter)

    async def _time_out(self, txn: TxnID) -> None:
        try:
            async with self._lock(txn):
                await self._writable()
                record = self.state.prepare_timeout(txn, self.clock.now_ms())
                if record is None:
                    return
                await self._log([record])
                self.metrics.txn_timed_out()
            self._drive(txn)
        finally:
            self._timing_out.pop(txn, None)
            self._timer_due_by(self.state.open_deadline_ms(txn))  # still OPEN (it did not take): again soon

    # --- compaction ------------------------------------------------------------------------

    def _maybe_compact(self, force: bool = False) -> None:
        due = self._entries_since_compaction >= self.config.compact_after_entries
        if (due or force) and self._compaction is None:
            self._compaction = asyncio.get_running_loop().create_task(self._compact())

    @guarded(Access.SUPERUSER)
    async def compact(self) -> dict[str, Any]:
        """Write the live state anew and trim the log below it (also runs by itself)."""
        await self._started()
        await self._answered_ends_logged()
        self._maybe_compact(force=True)
        if self._compaction is not None:
            await asyncio.shield(self._compaction)
        return {"trimmed_below": str(self._ledger.trimmed_below) if self._ledger else None}

    async def _compact(self) -> None:
        assert self._ledger is not None
        try:
            self._writes_open.clear()
            self._ledger.flush_lingering()  # nothing is queued after them: writes are closed
            while self._unapplied:
                await asyncio.sleep(0.001)
            # Nothing in flight, and no await until the entry is queued: it captures exactly
            # the state every earlier entry produced.
            records = self.state.compacted_records()
            position = await self._write(self._ledger.append([encode_record(r) for r in records]))
            self._writes_open.set()
            self._entries_since_compaction = 1
            await self._write(self._ledger.trim(position))
            self.info["compactions"] += 1
        finally:
            self._writes_open.set()
            self._compaction = None

    # --- introspection and faults ----------------------------------------------------------

    @guarded(Access.AUTHENTICATED)
    async def get_txn(self, txn: TxnID, caller: str | None = None) -> dict[str, Any]:
        """The txn's entry (state, owner, participants, times) or its remembered outcome. With
        auth on, only its owner or a superuser may look."""
        await self._started()
        self._acting_owner(txn, "", caller)
        await self._answered_ends_logged()
        meta = self.state.get(txn)
        if meta is not None:
            return describe_txn(meta, self.clock.now_ms())
        outcome = self.state.outcome(txn)
        if outcome is None:
            raise TransactionNotFound(f"{txn} is not known to coordinator {self.tc_id}")
        return {"txn": str(txn), "tc_id": txn.tc_id, "sequence": txn.sequence,
                "state": "COMMITTED" if outcome == "COMMITTED" else "ABORTED", "outcome": str(outcome)}

    @guarded(Access.SUPERUSER)
    async def list_txns(self, limit: int = 100, older_than_ms: int = 0) -> list[dict[str, Any]]:
        """Live transactions begun ``older_than_ms`` or more ago, the oldest first, with their
        age and participants (for operators hunting hanging transactions)."""
        await self._started()
        await self._answered_ends_logged()
        now = self.clock.now_ms()
        return [describe_txn(meta, now) for meta in self.state.older_than(now, older_than_ms, limit)]

    @guarded(Access.SUPERUSER)
    async def recent_outcomes(self, limit: int = 100) -> list[dict[str, Any]]:
        """How the ``limit`` transactions that finished last here ended, the latest first."""
        await self._started()
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
        await self._answered_ends_logged()
        return [{"txn": str(TxnID(self.tc_id, sequence)), "tc_id": self.tc_id, "sequence": sequence,
                 "outcome": str(outcome)} for sequence, outcome in self.state.recent(limit)]

    @guarded(Access.SUPERUSER)
    async def admin_abort(self, txn: TxnID) -> str:
        """Abort a transaction whoever owns it (operators; with auth on, superusers only)."""
        await self._started()
        meta = self.state.get(txn)
        owner = meta.owner if meta is not None else ""
        state, _ = await self._end_txn(txn, EndAction.ABORT, owner, meta.epoch if meta is not None else None, None)
        return state

    @guarded(Access.AUTHENTICATED)
    async def stats(self) -> dict[str, Any]:
        await self._started()
        await self._answered_ends_logged()
        assert self._ledger is not None
        stats = self.state.stats(self.clock.now_ms())
        stats.update(self.info)
        stats["log"] = {"ledgers": len(self._ledger.ledgers), "last_position": str(self._ledger.last_position),
                        "trimmed_below": str(self._ledger.trimmed_below),
                        "entries_since_compaction": self._entries_since_compaction}
        stats["ending"] = len(self._drivers)
        stats["stalled_ends"] = {str(txn): why for txn, why in list(self._stalled.items())[:MAX_STALLED_SHOWN]}
        stats["slow_txn_threshold_ms"] = self.config.slow_txn_threshold_ms
        stats["slow_txns"] = self.state.count_older_than(self.clock.now_ms(), self.config.slow_txn_threshold_ms)
        return stats


def _timer_delay_s(due_ms: int, now_ms: int) -> float:
    """How long the timer sleeps: until ``due_ms``, and at least 1 ms (a due time already past,
    such as a timeout that did not take, is retried that soon rather than in a busy loop)."""
    return max(0.001, (due_ms - now_ms) / 1000)


def _wake_timer(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _participants_of(meta: TxnMeta) -> list[tuple[str, tuple]]:
    """A txn's participants as ``(kind, ident)``: its partitions, then its subscriptions."""
    return [*(("partition", p) for p in meta.partitions), *(("subscription", s) for s in meta.subscriptions)]


def _ending(action: EndAction) -> str:
    return str(TxnState.COMMITTING if action is EndAction.COMMIT else TxnState.ABORTING)


CoordinatorActor = ray.remote(**ray_actor_options(max_concurrency=10_000))(TransactionCoordinator)
