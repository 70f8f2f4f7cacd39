"""The subscription actor ``sub-<topic>-<p>-<name>``: a thin shell around ``SubscriptionState``.

It owns the subscription's pending-ack log, a managed ledger (stream
``subscriptions/<topic>/<p>/<name>/pending-ack``) whose metadata properties also hold the
persisted cursor, and does the I/O, locking and timers; every decision is the state's.

* Reading: one task pulls committed messages from ``partition-<topic>-<p>`` while consumers are
  attached and the queue has room, and dispatches them.
* Consumers pull: ``subscribe`` attaches one, ``fetch`` long-polls for up to ``max_messages``
  (its receiver queue's free room: the permits), ``ack``, ``redeliver`` (negative acks and ack
  timeouts, tracked by the consumer as Pulsar's client does), ``close_consumer``. A consumer that
  neither fetches nor pings (a zero fetch) for ``consumer_timeout_s`` is dropped, and its
  messages go to the others.
* Transactional acks and ends: prepare -> log -> apply under one lock. Records are applied in the
  ledger's ``on_durable`` callback, so the state changes in log order, and an ack is answered
  only once its record is durable. ``end_txn`` is the coordinator's participant call (idempotent).
  Plain acks take the same lock, so none lands between a txn ack's preparation and its apply.
* Kafka consumer groups (``kafka_commit``, ``kafka_committed``, ``kafka_delete_offset``): a group reads the partition
  through the Kafka gateway and commits offsets here, plainly (persisted before the answer) or
  inside a transaction (a cumulative ack in the pending-ack log, like any other), each with its
  metadata string, which the cursor keeps with its mark-delete bound.
* Durability: the cursor is persisted (at most every ``cursor_snapshot_interval_s``, and always
  before the log is trimmed) as a property of the pending-ack ledger together with the log
  position it includes. Recovery: restore it, replay the log (rebuilding the index), and deliver
  everything unacked again. The log is trimmed by the index every ``trim_interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray

from raytxn import testing_bugs
from raytxn.actors.shell import ActorRefs, ActorShell, Clock, ray_actor_options, replay
from raytxn.actors.subscription_leases import SubscriptionLeases
from raytxn.actors.topic_permissions import TopicPermissions
from raytxn.auth import Access, AuthConfig, Authorizer, guarded
from raytxn.client.rpc import ActorRef
from raytxn.config import SubscriptionConfig
from raytxn.errors import InvalidArgument, NotAllowed, TransactionNotFound
from raytxn.faults import FaultPoints, FaultTarget
from raytxn.ids import (
    EARLIEST,
    Position,
    TxnID,
    coordinator_actor_name,
    partition_actor_name,
    partition_stream,
    subscription_actor_name,
)
from raytxn.ledger import Entry, ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.metrics import SubscriptionMetrics
from raytxn.protocol.cursor import Cursor, next_position
from raytxn.protocol.entry_format import decode_header
from raytxn.protocol.lease import Lease, LeaseTable
from raytxn.protocol.pending_ack import Record, decode_record, encode_record
from raytxn.protocol.stale_txns import StaleTxns
from raytxn.protocol.subscription_state import (
    AckRange,
    AckTuple,
    IndexRun,
    PersistedCursor,
    SubscriptionState,
    count_entries,
    decode_persisted,
    encode_persisted,
)
from raytxn.protocol.txnlog import EndAction
from raytxn.waiting import Flag

FAULT_POINTS = (
    "subscription.before_pending_ack_log",
    "subscription.after_pending_ack_log",
    "subscription.before_commit_log",
    "subscription.after_commit_log",
    "subscription.after_cursor_persist",
)

CURSOR_PROPERTY = "cursor"
STALE_CHECK_DEADLINE_S = 5.0  # a stale-txn round's call to a coordinator
_OPEN_LEDGER_END = 1 << 62  # an open ledger's last entry is not in its metadata: count up to max_read

log = logging.getLogger(__name__)


def pending_ack_stream(topic: str, partition: int, subscription: str) -> str:
    return f"subscriptions/{topic}/{partition}/{subscription}/pending-ack"


class Subscription(SubscriptionLeases, ActorShell, FaultTarget, TopicPermissions):
    actor_kind = "subscription"

    def __init__(self, topic: str, partition: int, name: str, initial_position: str = "latest",
                 storage_url: str | None = None, storage_options: dict[str, Any] | None = None,
                 config: SubscriptionConfig | None = None, auth: AuthConfig | None = None, *,
                 clock: Clock | None = None, actor_refs: ActorRefs | None = None,
                 storage: Storage | None = None) -> None:
        super().__init__(subscription_actor_name(topic, partition, name), clock, actor_refs)
        self.authorizer = Authorizer(auth)
        self.topic = topic
        self.partition = partition
        self.name = name
        self.initial_position = initial_position
        self.config = config or SubscriptionConfig()
        # A given ``storage`` (a simulator's) replaces the one the URL names.
        self.storage = storage if storage is not None else Storage.from_url(storage_url, **(storage_options or {}))
        self.stream = pending_ack_stream(topic, partition, name)
        self.state = SubscriptionState(partition, Cursor(), self.config.max_index_lag)  # replaced by recovery
        self.faults = FaultPoints()
        self._partition = self._actor_ref(partition_actor_name(topic, partition))
        self._ledger: ManagedLedger | None = None
        self._partition_ledger: ManagedLedger | None = None  # read-only: ledger sizes for the backlog
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()          # prepare -> log -> apply, and every other state change
        self._lease_turn = asyncio.Condition(self._lock)  # a txn ended: a chained lease's ack may go
        self._persist_lock = asyncio.Lock()  # persisted cursor forms go out in order, trims after them
        self._wakeup = Flag()                # the reader: a rewind, a seek, new demand
        self._waiters: dict[str, Flag] = {}  # consumer id -> its waiting fetch
        self._last_persisted: PersistedCursor | None = None
        self._last_persist = 0.0
        self._last_trim = 0.0
        self._last_backlog = 0.0
        self._stale_txns = StaleTxns(self.config.stale_txn_check_s)  # which pending txns to ask about
        self._coordinators: dict[int, ActorRef] = {}  # tc_id -> the reference stale-txn rounds ask through
        self.info: dict[str, Any] = {"topic": topic, "partition": partition, "subscription": name,
                                     "cursor_persists": 0, "log_trims": 0, "consumers_dropped": 0,
                                     "stale_txns_aborted": 0, "messages_out": 0}
        self.metrics = SubscriptionMetrics(topic, partition, name)

    # --- start and recovery ----------------------------------------------------------------

    async def _start(self) -> None:
        ledger = self._ledger = await ManagedLedger.open(self.storage, self.stream, self.config.log_config())
        readable_end = (await self._partition.call_async("read", EARLIEST, 0, 0.0))["max_read"]
        raw = ledger.properties.get(CURSOR_PROPERTY)
        persisted = None if raw is None else decode_persisted(raw, self.stream)
        if persisted is not None:
            cursor = Cursor.from_snapshot(persisted.cursor)
        else:  # a new subscription: earliest, or everything up to now counts as acked
            cursor = Cursor() if self.initial_position == "earliest" else Cursor(readable_end)
        state = SubscriptionState(self.partition, cursor, self.config.max_index_lag,
                                  given_back=None if persisted is None else persisted.given_back)
        state.leases = LeaseTable(first_id=ledger.incarnation << 32)  # ids never repeat across restarts
        included = persisted.log_position if persisted is not None else EARLIEST
        replayed = 0

        def apply(entry: Entry) -> None:
            nonlocal replayed
            for raw_record in entry.records:
                record = decode_record(raw_record, f"{self.stream}@{entry.position}")
                state.apply(record, entry.position, in_cursor_snapshot=entry.position <= included)
                replayed += 1

        await replay(ledger, apply)
        state.recovered(readable_end)
        self.state = state
        self._last_persisted = persisted
        if persisted is None:
            await self._persist()  # fixes where "latest" was, for every later incarnation
        self.info.update(incarnation=ledger.incarnation, replayed_records=replayed)
        self._pending_ack_changed()
        self._tasks = [self._background(self._read_loop(), "read loop"),
                       self._background(self._maintenance_loop(), "maintenance loop"),
                       self._background(self._stale_txn_loop(), "stale-txn loop")]

    @guarded(Access.PUBLIC)
    async def ready(self) -> dict[str, Any]:
        await self._started()
        return self._ready_info()

    def _passivation_blockers(self) -> list[str]:
        # Attached consumers and a held lease are someone reading; acks pending in a txn wait
        # for its end here.
        why = []
        if consumers := len(self.state.dispatcher.consumer_ids()):
            why.append(f"{consumers} consumers attached")
        if txns := len(self.state.pending.pending_txns()):
            why.append(f"{txns} txns with pending acks")
        if self.state.leases.current is not None:
            why.append("a range lease is held")
        return why

    async def _before_passivate(self) -> None:
        await self._trim_log()  # the cursor persisted and the log trimmed: the next start replays little

    def _end_long_polls(self) -> None:
        for waiter in self._waiters.values():  # the consumers' waiting fetches answer (``fetch``)
            waiter.set()

    def _generation(self) -> tuple[int, int]:
        """Changes with every incarnation and seek: consumers drop messages prefetched before."""
        return (self.info.get("incarnation", 0), self.state.generation)

    # --- consumers -------------------------------------------------------------------------

    @guarded(Access.CONSUME)
    async def subscribe(self, consumer_id: str, consumer_name: str, consumer_type: str,
                        read_compacted: bool = False) -> dict[str, Any]:
        """Attach a consumer (again: a no-op); ``NotAllowed`` when the subscription's type or an
        exclusive consumer refuses it. ``read_compacted``: see ``SubscriptionState.add_consumer``."""
        await self._started()
        if type(read_compacted) is not bool:
            raise InvalidArgument(f"read_compacted must be a bool, got {read_compacted!r}")
        async with self._lock:
            self.state.add_consumer(consumer_id, consumer_name, consumer_type, self.clock.monotonic(),
                                    read_compacted)
        self._changed()
        return {"generation": self._generation()}

    @guarded(Access.CONSUME)
    async def fetch(self, consumer_id: str, max_messages: int, max_wait_s: float = 0.0) -> dict[str, Any]:
        """Up to ``max_messages`` messages for the consumer, waiting up to ``max_wait_s`` for the
        first, as ``WireEntry``s (a run of messages of one entry each). A zero fetch is a ping.
        ``registered`` False: subscribe again (this incarnation does not know the consumer, or
        dropped it)."""
        await self._started()
        state = self.state
        if not state.dispatcher.has_consumer(consumer_id):
            return {"registered": False, "generation": self._generation(), "messages": []}
        state.dispatcher.touch(consumer_id, self.clock.monotonic(), fetching=1)
        try:
            if max_messages > 0:
                state.dispatcher.want(consumer_id, max_messages)
                self._dispatch()
                if not state.dispatcher.has_outbox(consumer_id) and max_wait_s > 0:
                    waiter = self._waiters.setdefault(consumer_id, Flag())
                    waiter.clear()
                    await waiter.wait(max_wait_s)
            messages = state.take_entries(consumer_id)
        finally:
            state.dispatcher.touch(consumer_id, self.clock.monotonic(), fetching=-1)
        dispatched = sum(len(entry[4]) for entry in messages)  # entry[4]: batch indexes
        self.info["messages_out"] += dispatched
        self.metrics.dispatched(dispatched, sum(entry[6].nbytes for entry in messages))
        return {"registered": state.dispatcher.has_consumer(consumer_id), "generation": self._generation(),
                "messages": messages}

    @guarded(Access.CONSUME)
    async def redeliver(self, consumer_id: str, keys: list[tuple[Position, int]] | None = None) -> int:
        """Give back the consumer's outstanding messages (all, or these ``(position, batch
        index)``): negative acks and ack timeouts. Returns how many were its."""
        await self._started()
        async with self._lock:
            released = self.state.release(consumer_id, keys)
        self._changed()
        return released

    @guarded(Access.CONSUME)
    async def close_consumer(self, consumer_id: str) -> None:
        """Detach a consumer; its unacked messages go to the others."""
        await self._started()
        async with self._lock:
            self._detach(consumer_id)
        self._changed()

    def _detach(self, consumer_id: str) -> None:
        self.state.remove_consumer(consumer_id)
        waiter = self._waiters.pop(consumer_id, None)
        if waiter is not None:
            waiter.set()  # its waiting fetch returns now

    @guarded(Access.CONSUME)
    async def unsubscribe(self, consumer_id: str) -> None:
        """Check that the subscription may be deleted by this consumer: ``NotAllowed`` while others
        are attached. (The supervisor deletes it.)"""
        await self._started()
        others = [c for c in self.state.dispatcher.consumer_ids() if c != consumer_id]
        if others:
            raise NotAllowed(f"subscription {self.name} on {self.topic}-{self.partition} has {len(others)} "
                             "other consumer(s) attached")

    # --- acks and ends ---------------------------------------------------------------------

    @guarded(Access.CONSUME)
    async def ack(self, consumer_id: str, acks: list[AckTuple], cumulative: bool = False,
                  txn: TxnID | None = None, request_id: str | None = None,
                  ranges: list[AckRange] | None = None, runs: list[IndexRun] | None = None) -> None:
        """Acks of ``(position, batch_index, batch_size)``, of whole entries by ``ranges``
        ``(ledger_id, first_entry_id, last_entry_id)``, and of batch indexes by ``runs``
        ``(ledger_id, entry_id, batch_size, first_index, last_index)``. Plain ones change the
        cursor (which is persisted later); transactional ones return once logged in the
        pending-ack log. ``request_id`` names a transactional call: sent again (a retry), it
        succeeds once logged."""
        await self._started()
        self.state.dispatcher.touch(consumer_id, self.clock.monotonic())
        async with self._lock:
            if txn is None:
                self.state.ack(acks, cumulative, ranges or (), runs or ())
            else:
                record = self.state.prepare_ack(txn, acks, cumulative, request_id, ranges or (),
                                                consumer=consumer_id, runs=runs or ())
                if record is not None:  # refused while the store is full, before it is logged: changes nothing
                    self.storage.check_space()
                await self._log_pending_ack(txn, record)
        self._changed()

    @guarded(Access.SUPERUSER)
    async def end_txn(self, txn: TxnID, action: EndAction, low_watermark: int) -> None:
        """End-on-subscription from the coordinator: commit applies the txn's acks to the cursor,
        abort drops them and redelivers; dangling txns at or below the watermark are aborted.
        Idempotent (the coordinator retries until it succeeds)."""
        await self._started()
        async with self._lock:
            records = self.state.prepare_end(txn, action, low_watermark)
            if not any(r.txn == txn for r in records):
                # An end of a txn this incarnation holds no acks of logs nothing, so nothing would
                # fence a zombie incarnation that answers it while its successor holds the acks.
                # A commit's acks would later be aborted as dangling, their messages delivered and
                # committed again (simulator, stale-handles seed 24); an abort's would stay pending
                # until some later end brings a watermark past them, their messages held back from
                # every consumer meanwhile (stale-handles seed 21087: for good, in that run).
                assert self._ledger is not None
                await self._write(self._ledger.check_still_writer())
            for record in records:
                await self.faults.hit("subscription.before_commit_log", txn=record.txn)
                await self._log(record)
                await self.faults.hit("subscription.after_commit_log", txn=record.txn)
            self._pending_ack_changed()
            self._lease_turn.notify_all()
        self._changed()

    def _pending_ack_changed(self) -> None:
        pending = self.state.pending
        self.metrics.pending_ack(pending.pending_txn_count, pending.pending_position_count)

    async def _log(self, record: Record) -> Position:
        """Append one record; the state applies it as soon as it is durable, in log order. A
        failed write stops this incarnation (see the actor shell)."""
        assert self._ledger is not None
        state = self.state

        def apply(position: Position) -> None:
            state.apply(record, position)

        return await self._write(self._ledger.append([encode_record(record)], on_durable=apply))

    async def _log_pending_ack(self, txn: TxnID, record: Record | None) -> None:
        """Log a prepared txn ack (None: nothing to log, e.g. a retry) between its fault points;
        the caller holds ``_lock``."""
        if record is not None:
            await self.faults.hit("subscription.before_pending_ack_log", txn=txn)
            await self._log(record)
            await self.faults.hit("subscription.after_pending_ack_log", txn=txn)
        self._pending_ack_changed()

    # --- Kafka consumer groups (see SubscriptionState.first_unacked) ------------------------

    @guarded(Access.CONSUME)
    async def kafka_commit(self, first: Position, index: int, size: int | None, txn: TxnID | None = None,
                           request_id: str | None = None, metadata: str = "") -> None:
        """A Kafka consumer group's commit (the gateway maps the offset to a position with the
        partition's ``kafka_locate``): message ``index`` of the entry at ``first`` is the first
        not consumed, ``metadata`` the commit's metadata string. Plain: the cursor moves there
        (forward, or back), takes the metadata and is persisted before this returns. In ``txn``:
        a cumulative ack of everything before it carrying the metadata, returned once logged
        (retries by ``request_id`` succeed), applied when ``txn`` commits."""
        await self._started()
        async with self._lock:
            if txn is None:
                self.state.reader_commit(first, index, size, metadata)
            else:
                await self._log_pending_ack(txn, self.state.prepare_reader_commit(txn, first, index, size,
                                                                                  request_id, metadata))
        self._changed()
        if txn is None:
            async with self._persist_lock:
                await self._persist()

    @guarded(Access.CONSUME)
    async def kafka_delete_offset(self) -> bool:
        """A Kafka group's OffsetDelete: the group has no committed offset here any more (see
        ``SubscriptionState.reader_delete``), persisted before this returns whether anything
        changed."""
        await self._started()
        async with self._lock:
            changed = self.state.reader_delete()
        self._changed()
        async with self._persist_lock:
            await self._persist()
        return changed

    @guarded(Access.CONSUME)
    async def kafka_committed(self) -> dict[str, Any]:
        """Where a Kafka group's committed position is: ``position`` and ``index`` of the first
        message not acked (map them to an offset with the partition's ``kafka_offset_of``);
        ``metadata``: the committed metadata string;
        ``acked_nothing``: the cursor never moved (no commit yet); ``pending``: whether a
        transaction holds acks here (Kafka's pending transactional offsets, which a
        ``require_stable`` OffsetFetch waits out)."""
        await self._started()
        position, index = self.state.first_unacked()
        return {"position": position, "index": index, "metadata": self.state.cursor.metadata,
                "acked_nothing": self.state.acked_nothing(),
                "pending": self.state.pending.pending_txn_count > 0}

    # --- seek ------------------------------------------------------------------------------

    @guarded(Access.CONSUME)
    async def seek(self, position: Position | None = None, publish_time_ms: int | None = None) -> tuple[int, int]:
        """Deliver again from ``position`` (inclusive), or from the first message published at or
        after ``publish_time_ms``; returns the new generation."""
        await self._started()
        if (position is None) == (publish_time_ms is None):
            raise InvalidArgument("seek takes a position or a publish time")
        if publish_time_ms is not None:
            position = await self._position_at_time(publish_time_ms)
        assert position is not None
        async with self._lock:
            self.state.seek(position)
        for waiter in self._waiters.values():
            waiter.set()  # waiting fetches return, with the new generation
        self._changed()
        async with self._persist_lock:
            await self._persist()
        return self._generation()

    async def _position_at_time(self, publish_time_ms: int) -> Position:
        """The first entry published at or after the time (a linear scan of the partition), else
        the partition's end."""
        position = EARLIEST
        while True:
            reply = await self._partition.call_async("read", position, 1000, 0.0)
            for entry_position, records in reply["entries"]:
                if decode_header(records.record(0)).publish_time_ms >= publish_time_ms:  # the header alone
                    return entry_position
            if reply["next"] == position:
                return position
            position = reply["next"]

    # --- reading and dispatching -----------------------------------------------------------

    def _changed(self) -> None:
        """After any change: hand out what can go, and let the reader look again."""
        self._dispatch()
        self._wakeup.set()

    def _dispatch(self) -> None:
        for consumer_id in self.state.dispatch():
            waiter = self._waiters.get(consumer_id)
            if waiter is not None:
                waiter.set()
        if self.state.wants_read(self._read_ahead()):
            self._wakeup.set()

    def _read_ahead(self) -> int:
        return self.state.read_ahead(self.config.read_ahead_messages, self.config.max_read_ahead_messages)

    async def _read_loop(self) -> None:
        while True:
            state = self.state
            self._wakeup.clear()
            if not state.wants_read(self._read_ahead()):
                await self._wakeup.wait(1.0)
                continue
            start, generation, compacted = state.read_position, state.generation, state.read_compacted
            try:
                reply = await self._read_unless_rewound(start, generation, compacted)
            except Exception:  # the partition is restarting: try again shortly
                log.warning("read of %s-%s failed", self.topic, self.partition, exc_info=True)
                await asyncio.sleep(0.2)
                continue
            if reply is None or generation != state.generation or compacted != state.read_compacted:
                continue  # (the last: it read the way the consumers no longer read)
            state.on_read(start, reply["entries"], reply["next"], reply["max_read"], reply.get("kept"))
            self._dispatch()

    async def _read_unless_rewound(self, start: Position, generation: int,
                                   compacted: bool) -> dict[str, Any] | None:
        """A (long-polling) partition read from ``start``; None when a rewind below ``start`` or a
        seek made it pointless before it returned."""
        size = self.state.read_size(self._read_ahead(), self.config.read_batch_entries)
        read = asyncio.ensure_future(self._partition.call_async("read", start, size, self.config.read_wait_s,
                                                                compacted))
        while True:
            woken = self._wakeup.future()
            done, _ = await asyncio.wait({read, woken}, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            if read in done:
                return read.result()
            self._wakeup.clear()
            if self.state.read_position < start or self.state.generation != generation:
                read.cancel()  # reads change nothing: dropping one is harmless
                return None

    # --- durability ------------------------------------------------------------------------

    async def _persist(self) -> PersistedCursor:
        """Persist the cursor with the log position it includes (if it changed). Callers hold the
        persist lock (or are the recovery), so forms go out in the order they were taken."""
        assert self._ledger is not None
        persisted = self.state.persisted_form()  # one synchronous capture: cursor and log agree
        if persisted != self._last_persisted:
            await self._write(self._ledger.set_properties({CURSOR_PROPERTY: encode_persisted(persisted)}))
            self._last_persisted = persisted
            self.info["cursor_persists"] += 1
            await self.faults.hit("subscription.after_cursor_persist")
        self._last_persist = self.clock.monotonic()
        return persisted

    async def _trim_log(self) -> Position | None:
        """Persist the cursor, then delete the log entries its mark-delete position made useless."""
        assert self._ledger is not None
        async with self._persist_lock:
            persisted = await self._persist()
            point = self.state.trim_point(persisted)
            self._last_trim = self.clock.monotonic()
            if point is None or next_position(point) <= self._ledger.trimmed_below:
                return None
            await self._write(self._ledger.trim(next_position(point)))
            self.state.log_index.on_trimmed(point)
            self.info["log_trims"] += 1
            return point

    async def _maintenance_loop(self) -> None:
        config = self.config
        tick = max(0.05, min(1.0, config.cursor_snapshot_interval_s, config.trim_interval_s,
                             config.consumer_timeout_s / 4))
        while True:
            await asyncio.sleep(tick)
            try:
                now = self.clock.monotonic()
                idle = self.state.dispatcher.idle_consumers(now, config.consumer_timeout_s)
                if idle:
                    async with self._lock:
                        for consumer_id in idle:
                            self._detach(consumer_id)
                            self.info["consumers_dropped"] += 1
                    self._changed()
                self.state.dispatcher.prune_redeliveries(self.state.cursor.acked_below)
                self.expire_leases()
                if (config.backlog_metric_interval_s is not None and self._passivation_blockers()
                        and now - self._last_backlog >= config.backlog_metric_interval_s):
                    self._last_backlog = now  # someone reads here: the gauge follows (an idle one may passivate)
                    await self._count_backlog()
                if now - self._last_trim >= config.trim_interval_s:
                    await self._trim_log()
                elif now - self._last_persist >= config.cursor_snapshot_interval_s:
                    async with self._persist_lock:
                        await self._persist()
            except Exception:  # storage hiccup: the next tick tries again
                log.warning("maintenance of %s failed", self.stream, exc_info=True)

    async def _stale_txn_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.stale_txn_check_s)
            try:
                await self._end_stale_txns(self.clock.monotonic())
            except Exception:  # storage hiccup: the next round tries again
                log.warning("stale-txn check of %s failed", self.stream, exc_info=True)

    async def _end_stale_txns(self, now: float) -> int:
        """Abort the acks of txns pending here for ``stale_txn_check_s`` or more that their
        coordinator has ended (``raytxn.protocol.stale_txns`` says why and which); returns how
        many txns it aborted."""
        aborted = 0
        if testing_bugs.REINTRODUCED["acks_after_end_hang"]:  # test only: the check as before it existed
            return aborted
        for txn in self._stale_txns.due(self.state.pending.pending_txns(), now):
            try:
                ended = await self._ended_at_coordinator(txn, now)
            except Exception:  # the coordinator is away: the next round asks again
                log.info("stale-txn check of %s on %s: coordinator unreachable", txn, self.stream, exc_info=True)
                continue
            if not ended:
                continue
            async with self._lock:
                if not self.state.pending.is_pending(txn):
                    continue  # its end came meanwhile
                log.warning("%s: acks of %s pending after its coordinator ended it: aborted here", self.stream, txn)
                for record in self.state.prepare_end(txn, EndAction.ABORT, None):
                    await self._log(record)
                self.info["stale_txns_aborted"] += 1
                aborted += 1
                self._pending_ack_changed()
                self._lease_turn.notify_all()
            self._changed()
        return aborted

    async def _ended_at_coordinator(self, txn: TxnID, now: float) -> bool:
        """Ask the txn's coordinator about it (``get_txn``; ``stats`` for the low watermark when
        it does not know the txn), and judge the answer (``StaleTxns.ended``)."""
        coordinator = self._coordinators.get(txn.tc_id)
        if coordinator is None:
            coordinator = self._coordinators[txn.tc_id] = self._actor_ref(coordinator_actor_name(txn.tc_id))
        try:
            entry = await coordinator.call_async("get_txn", txn, deadline_s=STALE_CHECK_DEADLINE_S)
        except TransactionNotFound:
            marks = await coordinator.call_async("stats", deadline_s=STALE_CHECK_DEADLINE_S)
            return self._stale_txns.ended(txn, None, now, low_watermark=marks["low_watermark"])
        deadline_in_ms = entry.get("deadline_in_ms")
        return self._stale_txns.ended(txn, entry["state"], now,
                                      deadline_in_s=None if deadline_in_ms is None else deadline_in_ms / 1000)

    @guarded(Access.SUPERUSER)
    async def persist_cursor(self) -> str:
        """Persist the cursor now (it also happens on a timer); returns its mark-delete position."""
        await self._started()
        async with self._persist_lock:
            persisted = await self._persist()
        return str(Cursor.from_snapshot(persisted.cursor).mark_delete_position)

    @guarded(Access.SUPERUSER)
    async def trim_log(self) -> str | None:
        """Persist the cursor and trim the pending-ack log now (it also happens on a timer)."""
        await self._started()
        point = await self._trim_log()
        return None if point is None else str(point)

    # --- introspection and faults ----------------------------------------------------------

    @guarded(Access.AUTHENTICATED)
    async def stats(self, backlog: bool = False) -> dict[str, Any]:
        """Backlog, unacked, consumers, pending-ack txns and positions, log size, cursor, the
        range leases held. ``backlog``: also ``backlog_messages``, the messages still to consume
        up to the readable end, markers and aborted messages not counted (one bounded read of
        the partition's entry headers: ``backlog_exact`` False when it stopped short, a lower
        bound), and set the backlog gauge."""
        await self._started()
        assert self._ledger is not None
        # The partition's readable end: its backlog count says it (an observation, not traffic:
        # it keeps no idle partition from passivating), else a read of nothing.
        counted = await self._count_backlog() if backlog else None
        readable_end = (counted["max_read_position"] if counted is not None
                        else (await self._partition.call_async("read", EARLIEST, 0, 0.0))["max_read"])
        self.state.max_read = max(self.state.max_read, readable_end)  # also when nothing is read
        stats = {**self.info, **self.state.stats()}
        stats["backlog_entries"] = self.state.backlog_entries(await self._partition_ledger_ends())
        stats["leases"] = [lease_row(lease) for lease in (self.state.leases.current, self.state.leases.successor)
                           if lease is not None]
        if counted is not None:
            stats["backlog_messages"], stats["backlog_exact"] = counted["messages"], counted["exact"]
        last = self._ledger.last_position
        own_ends = [(info.ledger_id, info.last_entry_id if info.closed else last.entry_id)
                    for info in self._ledger.ledgers]
        stats["log"] = {"entries": count_entries(own_ends, self._ledger.trimmed_below, last),
                        "trimmed_below": str(self._ledger.trimmed_below), "last_position": str(last),
                        "ledgers": len(own_ends), "cached_objects": self._ledger.cached_objects}
        return stats

    async def _count_backlog(self) -> dict[str, Any]:
        """The partition's count of the messages this cursor has still to consume (markers and
        aborted messages not counted), set on the backlog gauge."""
        cursor = self.state.cursor
        counted = await self._partition.call_async("count_backlog", cursor.acked_below, cursor.acked_ranges(),
                                                   cursor.partially_acked())
        self.metrics.backlog(counted["messages"])
        return counted

    async def _partition_ledger_ends(self) -> list[tuple[int, int]]:
        if self._partition_ledger is None:
            self._partition_ledger = await ManagedLedger.open(
                self.storage, partition_stream(self.topic, self.partition), writable=False)
        else:
            await self._partition_ledger.refresh()
        return [(info.ledger_id, info.last_entry_id if info.closed else _OPEN_LEDGER_END)
                for info in self._partition_ledger.ledgers]

    @guarded(Access.AUTHENTICATED)
    def process_info(self) -> dict[str, int]:
        """This incarnation's process id and resident memory (benchmarks)."""
        import psutil

        return {"pid": os.getpid(), "rss": psutil.Process().memory_info().rss}


def lease_row(lease: Lease) -> dict[str, Any]:
    """A range lease as ``stats`` shows it: who holds it, what range, in what state."""
    return {"lease_id": lease.lease_id, "holder": lease.holder, "epoch": lease.epoch, "start": str(lease.start),
            "end": str(lease.end), "status": str(lease.status), "txn": None if lease.txn is None else str(lease.txn),
            "expires_at_ms": lease.expires_at_ms}


# (Fetches a consumer must subscribe again for are harmless to repeat, as ray_actor_options requires.)
SubscriptionActor = ray.remote(**ray_actor_options(max_concurrency=10_000))(Subscription)
