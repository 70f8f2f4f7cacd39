"""The partition actor ``partition-<topic>-<p>``: a thin shell around ``TransactionBuffer``.

It owns the partition's managed ledger (stream ``topics/<topic>/<p>``) and the buffer's snapshots
(objects under ``topics/<topic>/<p>/snapshots/``), and does the I/O, waiting and timers; every
decision is the buffer's. Appends and markers are prepared, queued on the ledger with no await in
between (so the ledger order is the preparation order), and applied in the ledger's
``on_durable`` callback in entry order, before anyone is answered.

Reads return only committed, non-aborted data up to ``max_read_position``, skip markers and
aborted data, and always say where to continue, so no reader is ever stuck behind them.

Recovery: open the ledger (sealing the previous incarnation's), restore the newest complete
snapshot, replay the entries after it, prune aborted txns whose ledgers were trimmed, then abort
dangling txns at or below the known low watermarks.

Kafka offsets (``protocol.offsets``): each entry's header is stamped with its dense base offset as
it is handed to the ledger; ``kafka_offsets``, ``locate_offset``, ``kafka_read``, ``kafka_locate``
and ``kafka_offset_of`` serve the Kafka gateway (``raytxn.kafka``).

Retention: every ``retention_check_s`` the partition reads its subscriptions' persisted cursors
and its topic's retention policy from storage (``actors/retention.py``), lets
``protocol.retention`` decide how far it may trim, and trims there (never past its newest
snapshot, written first if needed), forgetting aborted txns whose markers went with it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import msgspec
import psutil
import ray

from raytxn import testing_bugs
from raytxn.actors.compaction import PartitionCompaction
from raytxn.actors.partition_browse import PartitionBrowse
from raytxn.actors.partition_kafka import PartitionKafka
from raytxn.actors.partition_producers import ProducerStates
from raytxn.actors.retention import topic_and_marks
from raytxn.actors.shell import ActorRefs, ActorShell, Clock, ray_actor_options, replay
from raytxn.actors.topic_permissions import TopicPermissions
from raytxn.auth import Access, AuthConfig, Authorizer, guarded
from raytxn.client.rpc import retriable
from raytxn.config import PartitionConfig
from raytxn.errors import (
    CorruptLedger,
    InvalidArgument,
    MessageTooLarge,
    OutOfOrderSequence,
    PositionTrimmed,
    StorageFull,
    StorageUnavailable,
)
from raytxn.faults import FaultPoints, FaultTarget
from raytxn.ids import EARLIEST, Position, TxnID, partition_actor_name, partition_stream
from raytxn.ledger import Entry, ManagedLedger
from raytxn.ledger.snapshots import join_segments, newest_complete, obsolete_segments, split_snapshot
from raytxn.ledger.storage import ObjectExists, Storage
from raytxn.metrics import PartitionMetrics
from raytxn.protocol.compaction import compacted_entry_records
from raytxn.protocol.cursor import next_position
from raytxn.protocol.entry_format import (
    EntryHeader,
    decode_header,
    decode_submitted_batch,
    entry_records,
)
from raytxn.protocol.lease import RangeCount, RangePlan
from raytxn.protocol.packed_records import PackedRecords
from raytxn.protocol.retention import StoredObject, acked_bound, compacted_retention_cut, retention_cut
from raytxn.protocol.txn_buffer import TransactionBuffer, TxnBufferSnapshot
from raytxn.protocol.txnlog import EndAction
from raytxn.waiting import Signal

FAULT_POINTS = (
    "partition.before_append",
    "partition.after_append_before_reply",
    "partition.before_marker",
    "partition.after_marker",
    "partition.before_snapshot",
)


# How long an append that arrived before the batch it follows waits for it (Ray's delivery to an
# async actor can reorder one caller's calls by a few ms) before it is refused as out of order.
OUT_OF_ORDER_WAIT_S = 0.05
# How long a retried batch waits for its first attempt, still being written, to land (a ledger
# append's own timeout): a retry never waits without end on a store that stays full.
ORIGINAL_WAIT_S = 60.0


@dataclass(frozen=True)
class AppendResult:
    position: Position | None     # None: a duplicate whose original entry is no longer known
    count: int
    duplicate: bool
    base_offset: int | None = None  # the entry's first Kafka offset (None for a duplicate)


log = logging.getLogger(__name__)
_snapshot_decoder = msgspec.msgpack.Decoder(TxnBufferSnapshot)
# Listings of the snapshots a start takes at most, when the newest one's segments vanish under it
# (a zombie predecessor deleting it after writing a newer one): a bound, not a number it needs.
SNAPSHOT_LIST_ATTEMPTS = 8
_encoder = msgspec.msgpack.Encoder()


class PartitionBuffer(ProducerStates, PartitionKafka, PartitionBrowse, ActorShell, FaultTarget, TopicPermissions):
    actor_kind = "partition"

    def __init__(self, topic: str, partition: int, storage_url: str | None = None,
                 storage_options: dict[str, Any] | None = None, config: PartitionConfig | None = None,
                 auth: AuthConfig | None = None, *, clock: Clock | None = None,
                 actor_refs: ActorRefs | None = None, storage: Storage | None = None,
                 compaction: tuple[bool, int | None] | None = None) -> None:
        """``compaction``: the topic's (compacted, compaction_threshold_bytes), as the supervisor
        hands it from its catalog; None reads the catalog at start."""
        super().__init__(partition_actor_name(topic, partition), clock, actor_refs)
        self.authorizer = Authorizer(auth)
        self.topic = topic
        self.partition = partition
        self.config = config or PartitionConfig()
        # A given ``storage`` (a simulator's) replaces the one the URL names.
        self.storage = storage if storage is not None else Storage.from_url(storage_url, **(storage_options or {}))
        self.stream = partition_stream(topic, partition)
        self.snapshot_prefix = f"{self.stream}/snapshots"
        self.buffer = TransactionBuffer()
        self.faults = FaultPoints()
        self._ledger: ManagedLedger | None = None
        self._advanced = Signal()  # readers long-polling for the readable end to move
        self._sequence_waiters: list[asyncio.Future] = []  # appends waiting for the batch they follow
        self._ended_since_snapshot = 0
        self._changed_since_snapshot = False
        self._snapshotting: asyncio.Task | None = None
        self._timers: list[asyncio.Task] = []
        self._trim_lock = asyncio.Lock()
        self._pin_pending = False  # a trim whose first kept entry is not yet an offset index point (see _pin_log_start)
        self.compaction = PartitionCompaction(self.storage, topic, partition, self.stream, compaction)
        self.info: dict[str, Any] = {"topic": topic, "partition": partition, "snapshots_written": 0,
                                     "appends": 0, "duplicates": 0, "out_of_order": 0, "markers": 0,
                                     "bytes_in": 0, "messages_in": 0, "kafka_messages_out": 0,
                                     "kafka_reads": 0, "kafka_read_entries": 0,
                                     "trims": 0, "aborted_pruned": 0}
        self.metrics = PartitionMetrics(topic, partition)

    # --- start and recovery ----------------------------------------------------------------

    async def _start(self) -> None:
        ledger = self._ledger = await ManagedLedger.open(self.storage, self.stream)
        await self.compaction.load()
        ledger.faults = self.faults
        self.buffer = TransactionBuffer()
        snapshot_id = None
        start = Position(0, 0)
        found = await self._newest_snapshot()
        if found is not None:
            snapshot_id, names, blobs = found
            try:
                snapshot = _snapshot_decoder.decode(join_segments(blobs, snapshot_id, self.snapshot_prefix, names))
            except msgspec.DecodeError as e:  # the segments' CRCs held: a writer bug or tampering
                raise CorruptLedger(f"undecodable snapshot {names[0]}...: {e}", names[0]) from e
            self.buffer = TransactionBuffer.from_snapshot(snapshot)
            last = snapshot.last_position
            start = Position(last.ledger_id, last.entry_id + 1) if last != EARLIEST else start

        def apply(entry: Entry) -> None:
            self.buffer.apply(decode_header(entry.records[0], f"{self.stream}@{entry.position}"), entry.position)

        replayed = await replay(ledger, apply, start)
        self.buffer.prune_aborted(ledger.trimmed_below)
        await self._pin_log_start()  # the snapshot may predate the last trim's pin
        for tc_id in self.buffer.ongoing_coordinators():
            await self._write_markers(self.buffer.prepare_dangling(tc_id, self.buffer.low_watermark(tc_id)))
        self.info.update(incarnation=ledger.incarnation, replayed_entries=replayed,
                         recovered_from_snapshot=snapshot_id)
        self.metrics.max_read_lag(self.buffer.lag_entries)
        self._timers = [self._background(self._snapshot_timer(), "snapshot timer"),
                        self._background(self._dangling_timer(), "dangling-txn timer"),
                        self._background(self._retention_timer(), "retention timer")]

    async def _newest_snapshot(self) -> tuple[int, list[str], list[bytes]] | None:
        """The newest complete snapshot's id, its segments' names and their bytes, or None. A segment that vanishes
        between the listing and its read was deleted as obsolete by a writer that has just
        completed a newer snapshot (the previous incarnation, still running as a zombie), so the
        listing is taken again; the same snapshot vanishing twice in a row is corruption."""
        vanished: str | None = None
        for _ in range(SNAPSHOT_LIST_ATTEMPTS):
            found = newest_complete(await self.storage.list(self.snapshot_prefix))
            if found is None:
                return None
            snapshot_id, names = found
            blobs = []
            for name in names:
                data = await self.storage.get(name)
                if data is None:
                    break
                blobs.append(data)
            else:
                return snapshot_id, names, blobs
            if vanished == name:
                break
            vanished = name
        raise CorruptLedger(f"snapshot segment {vanished} vanished", vanished)

    @guarded(Access.PUBLIC)
    async def ready(self) -> dict[str, Any]:
        await self._started()
        return self._ready_info()

    def _passivation_blockers(self) -> list[str]:
        # An open txn needs its marker here; an append waiting for the batch it follows needs it.
        why = []
        if open_txns := len(self.buffer.ongoing_txns()):
            why.append(f"{open_txns} open txns")
        if self._sequence_waiters:
            why.append(f"{len(self._sequence_waiters)} appends waiting for their predecessors")
        return why

    async def _before_passivate(self) -> None:
        if self._changed_since_snapshot or self._ended_since_snapshot:
            await self._snapshot_now()  # the next incarnation replays nothing

    def _end_long_polls(self) -> None:
        self._advanced.notify_all()  # the reads waiting for the end to move answer (``read``)

    # --- appends ---------------------------------------------------------------------------

    def _apply(self, header: EntryHeader) -> Any:
        buffer = self.buffer  # the one this write was prepared on, also if a start is retried

        def on_durable(position: Position) -> None:
            buffer.apply(header, position)
            self._changed_since_snapshot = True
        return on_durable

    @guarded(Access.PRODUCE)
    async def append(self, producer: str, first_sequence: int, messages: list[bytes],
                     txn: TxnID | None = None, previous_sequence: int = -1,
                     producer_epoch: int = 0) -> AppendResult:
        """Append one producer batch (one ledger entry) of encoded ``MessageRecord``s. Idempotent
        by (producer, epoch, sequence): a retried batch is not stored again and gets the original
        position when known. ``previous_sequence``: the last sequence id of the producer's batch
        this one follows, still unacknowledged (-1: none); a batch arriving before it is refused
        with ``OutOfOrderSequence`` (the buffer's sequence rule). ``producer_epoch``: the one
        ``init_producer`` gave this incarnation (0: none asked); an older one is ``Fenced``."""
        await self._started()
        if not messages:
            raise InvalidArgument("empty batch")
        # every record decodes (so no reader meets a bad one), once: the sizes and a compacted topic's keys
        value_sizes, first_keyless = decode_submitted_batch(messages, find_keyless=self.compaction.compacted)
        if max(value_sizes) > self.config.max_message_bytes:
            raise MessageTooLarge(f"message of {max(value_sizes)} bytes exceeds "
                                  f"{self.config.max_message_bytes} on {self.topic}-{self.partition}")
        self.compaction.check_append(first_keyless)
        value_bytes = sum(value_sizes)
        header = EntryHeader("data", txn, producer, first_sequence, first_sequence + len(messages) - 1,
                             len(messages), self.clock.now_ms(), producer_epoch=producer_epoch)
        await self.faults.hit("partition.before_append", txn=txn, producer=producer, first_sequence=first_sequence)
        wait_until = None
        original_by: float | None = None
        while True:
            try:
                decision = self.buffer.prepare_append(header, previous_sequence)
            except OutOfOrderSequence:
                # Ray may hand an async actor one caller's calls out of order: give the batch it
                # follows a moment to arrive before refusing (then the producer resends in order).
                now = self.clock.monotonic()
                wait_until = now + OUT_OF_ORDER_WAIT_S if wait_until is None else wait_until
                if now >= wait_until:
                    self.info["out_of_order"] += 1
                    raise
                await self._next_prepared(wait_until - now)
                continue
            if not (decision.duplicate and decision.in_flight):
                break
            # The original is being written: answer with its outcome, or, if it does not land
            # within an append's own timeout (a full or unreachable store), say so as it would.
            if original_by is None:
                original_by = self.clock.monotonic() + ORIGINAL_WAIT_S
            if self.clock.monotonic() > original_by:
                raise StorageUnavailable(f"{self.topic}-{self.partition}: the first attempt of this batch is still "
                                         f"being written after {ORIGINAL_WAIT_S}s; it may still land: retry")
            await asyncio.sleep(0.002)
        if not decision.duplicate:
            try:  # refused while the store is full, before it is queued: it changes nothing
                self.storage.check_space()
            except StorageFull:
                self.buffer.cancel_append(header)
                raise
            self._wake_sequence_waiters()  # no await: its ledger append is queued before they run
        if decision.duplicate:
            self.info["duplicates"] += 1
            return AppendResult(decision.position, len(messages), True)
        try:
            position, base_offset = await self._ledger_append(header, messages)
        except MessageTooLarge:
            self.buffer.cancel_append(header)
            raise
        self.info["appends"] += 1
        self.info["bytes_in"] += value_bytes
        self.info["messages_in"] += len(messages)
        self.metrics.appended(len(messages), sum(map(len, messages)))
        await self._notify()
        await self.faults.hit("partition.after_append_before_reply", txn=txn, producer=producer)
        return AppendResult(position, len(messages), False, base_offset)

    async def _next_prepared(self, timeout_s: float) -> None:
        """Wait until another append is prepared here (or ``timeout_s`` passed)."""
        waiter = asyncio.get_running_loop().create_future()
        self._sequence_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            if waiter in self._sequence_waiters:
                self._sequence_waiters.remove(waiter)

    def _wake_sequence_waiters(self) -> None:
        waiters, self._sequence_waiters = self._sequence_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _ledger_append(self, header: EntryHeader, messages: list[bytes]) -> tuple[Position, int]:
        """Append one entry; a failed write stops this incarnation (see the actor shell). The
        header gets its Kafka base offset here, with no await before the ledger queues the entry,
        so offsets follow ledger order (``protocol.offsets``). Returns position and base offset."""
        assert self._ledger is not None
        stamped = self.buffer.stamp(header)
        records = entry_records(stamped, messages)
        assert stamped.base_offset is not None
        try:
            position = await self._write(self._ledger.append(records, on_durable=self._apply(stamped)))
            return position, stamped.base_offset
        except MessageTooLarge:  # refused before it was queued: the newest stamp, taken back
            self.buffer.unstamp(stamped)
            raise

    async def _notify(self) -> None:
        """After appends and markers: wake waiting readers (the readable end may have moved)."""
        self.metrics.max_read_lag(self.buffer.lag_entries)
        self._advanced.notify_all()

    # --- ends ------------------------------------------------------------------------------

    @guarded(Access.SUPERUSER)
    async def end_txn(self, txn: TxnID, action: EndAction, low_watermark: int) -> None:
        """End-on-partition from the coordinator: write the COMMIT/ABORT marker (and aborts of
        dangling txns at or below the watermark). Idempotent."""
        await self._started()
        decision = self.buffer.prepare_end(txn, action, low_watermark)
        if not decision.write_marker:
            # An end of a txn this incarnation never saw (or ended) writes nothing here, so
            # nothing would fence a zombie incarnation that answers it while its successor holds
            # the txn's data: the coordinator would count this partition done, and a commit's
            # data would later be aborted as dangling (simulator, stale-handles seed 4).
            assert self._ledger is not None
            await self._write(self._ledger.check_still_writer())
        await self._write_markers(decision)

    async def _write_markers(self, decision: Any) -> None:
        headers = decision.markers(self.clock.now_ms())
        if not headers:
            return
        await self.faults.hit("partition.before_marker", txn=decision.txn)
        if len(headers) == 1:  # the usual end: no task and no gather (a commit waits for this)
            await self._ledger_append(headers[0], [])
        else:  # queued back to back (no await between), so they land in this order
            await asyncio.gather(*[asyncio.ensure_future(self._ledger_append(h, [])) for h in headers])
        self.info["markers"] += len(headers)
        self._ended_since_snapshot += len(headers)
        await self._notify()
        await self.faults.hit("partition.after_marker", txn=decision.txn)
        if self._ended_since_snapshot >= self.config.snapshot_every_txns:
            self._start_snapshot()

    async def _dangling_timer(self) -> None:
        while True:
            await asyncio.sleep(self.config.dangling_check_s)
            try:
                for tc_id in self.buffer.ongoing_coordinators():
                    await self._write_markers(self.buffer.prepare_dangling(tc_id, self.buffer.low_watermark(tc_id)))
            except Exception as error:
                if not retriable(error):
                    raise  # (a failed write already stopped this incarnation; anything else is a bug)
                log.warning("dangling-txn check of %s failed; the next one tries again", self.stream, exc_info=True)

    # --- reads -----------------------------------------------------------------------------

    @guarded(Access.CONSUME)
    async def read(self, start: Position, max_entries: int = 100, max_wait_s: float = 0.0,
                   compacted: bool = False) -> dict[str, Any]:
        """Visible entries at or after ``start`` as ``(position, records)`` (records[0] is the
        encoded header; the records packed, ``PackedRecords``: two buffers to pickle, not one
        ``bytes`` per message), and ``next``: where to continue. Waits up to ``max_wait_s``.

        ``compacted`` (a ``read_compacted`` subscription's read): at or below a compacted topic's
        published horizon the entries come from the compacted ledger, each holding only its
        kept records, and ``kept`` gives per entry its message count and the indexes they had (Pulsar's compacted
        read: below the horizon the compacted ledger, above it the live one). The horizon
        used is the newest this partition knows, and the live ledger is never trimmed past it,
        so a read that goes on at ``next`` finds either newer compacted records or live ones."""
        await self._started()
        assert self._ledger is not None
        max_entries = min(max_entries, self.config.max_read_entries)
        if compacted and self.compaction.compacted and max_entries > 0:
            view = await self.compaction.entries(start, max_entries)
            if view is not None:
                found, nxt = view
                return {"entries": [(e.position, PackedRecords.pack(compacted_entry_records(e))) for e in found],
                        "kept": [(e.count, e.indexes) for e in found], "next": nxt,
                        "max_read": self.buffer.max_read_position}
        start = max(start, self._ledger.trimmed_below)
        deadline = self.clock.monotonic() + max_wait_s
        while (self.buffer.max_read_position < start and self.clock.monotonic() < deadline
               and self._draining is None):
            if not await self._advanced.wait(deadline - self.clock.monotonic()):
                break
        max_read = self.buffer.max_read_position
        if max_read < start:
            return {"entries": [], "next": start, "max_read": max_read}
        start, scanned = await self._read_retained(start, max_entries, max_read)
        visible = []
        for entry in scanned:
            header = decode_header(entry.records[0], f"{self.stream}@{entry.position}")
            if self.buffer.is_visible(header, entry.position):
                visible.append((entry.position, PackedRecords.pack(entry.records)))
        nxt = start
        if scanned:
            last = scanned[-1].position
            nxt = Position(last.ledger_id, last.entry_id + 1)
        return {"entries": visible, "next": nxt, "max_read": max_read}

    async def _read_retained(self, start: Position, max_entries: int, end: Position) -> tuple[Position, list[Entry]]:
        """Ledger entries from ``start``, or from the trim point once retention passed ``start``
        (also while the read runs); returns where the read began and the entries."""
        assert self._ledger is not None
        while True:
            start = max(start, self._ledger.trimmed_below)
            try:
                return start, await self._ledger.read(start, max_entries=max_entries, end=end)
            except PositionTrimmed:
                if self._ledger.trimmed_below <= start:
                    raise
                # The trim point moved past `start` meanwhile: read on from there (it only grows).

    @guarded(Access.CONSUME)
    async def range_plan(self, start: Position, max_messages: int | None = None,
                         max_bytes: int | None = None) -> RangePlan:
        """What a subscription needs to lease the range from ``start`` (the bulk path, no
        payloads go out): the readable end, the ledgers' ends, the trim point and the aborted
        spans. With ``max_messages``/``max_bytes`` the end is the last entry within those bounds
        from ``start`` (at least one entry), counting every entry's messages and record bytes;
        the plan then also says what it holds and what the entry the bounds left out holds."""
        await self._started()
        assert self._ledger is not None
        for bound, what in ((max_messages, "max_messages"), (max_bytes, "max_bytes")):
            if bound is not None and (type(bound) is not int or bound < 1):
                raise InvalidArgument(f"{what} must be a positive int, got {bound!r}")
        ledger = self._ledger
        start = max(start, ledger.trimmed_below, Position(0, 0))
        end = self.buffer.max_read_position
        counted = RangeCount()
        if (max_messages is not None or max_bytes is not None) and end >= start:
            end, counted = await self._bounded_end(start, end, max_messages, max_bytes)
        last = ledger.last_position
        ends = tuple((info.ledger_id, info.last_entry_id if info.closed or info.ledger_id != last.ledger_id
                      else last.entry_id) for info in ledger.ledgers)
        return RangePlan(end, ends, tuple(self.buffer.aborted_between(start, end)), start, counted)

    async def _bounded_end(self, start: Position, end: Position, max_messages: int | None,
                           max_bytes: int | None) -> tuple[Position, RangeCount]:
        """The last entry in ``start..end`` within the bounds (the first entry even when it alone
        passes them), with what ``start`` up to it holds and what the next entry, the one the
        bounds cut off, holds; reads entry headers, at most ``max_read_entries`` per read."""
        messages = size = 0
        position, last = start, None
        while position <= end:
            position, entries = await self._read_retained(position, self.config.max_read_entries, end)
            if not entries:
                break
            for entry in entries:
                header = decode_header(entry.records[0], f"{self.stream}@{entry.position}")
                entry_size = sum(len(record) for record in entry.records[1:])
                over = (max_messages is not None and messages + header.count > max_messages) or (
                    max_bytes is not None and size + entry_size > max_bytes)
                if over and last is not None:
                    return last, RangeCount(messages, size, header.count, entry_size)
                messages, size, last = messages + header.count, size + entry_size, entry.position
                if over:
                    return last, RangeCount(messages, size)
            position = Position(last.ledger_id, last.entry_id + 1)
        return (end, RangeCount()) if last is None else (last, RangeCount(messages, size))

    @guarded(Access.PRODUCE)
    async def init_producer(self, producer: str) -> tuple[int, int]:
        """A new incarnation of ``producer`` here: the ``(epoch, first sequence id)`` it sends
        with. The epoch is above every one known for the name, so the appends of older
        incarnations still on their way are ``Fenced`` (the buffer's epoch rule); sequence ids
        start again at 0 in it."""
        await self._started()
        if testing_bugs.REINTRODUCED["restarted_producer_collision"]:  # test only: as before epochs and the fix
            known = self.buffer.dedup_position(producer)
            return self.buffer.producer_epoch(producer), known[0] + 1 if known else 0
        if testing_bugs.REINTRODUCED["no_producer_epochs"]:  # test only: as after the fix, before epochs
            return self.buffer.producer_epoch(producer), self.buffer.highest_sequence(producer) + 1
        assert self._ledger is not None
        return self.buffer.init_producer(producer, incarnation=self._ledger.incarnation), 0

    @guarded(Access.PRODUCE)
    async def last_sequence(self, producer: str) -> int:
        """The highest sequence id stored or being stored for ``producer`` (-1 if none is known)."""
        await self._started()
        if testing_bugs.REINTRODUCED["restarted_producer_collision"]:  # test only: as before the fix
            known = self.buffer.dedup_position(producer)
            return known[0] if known else -1
        return self.buffer.highest_sequence(producer)

    @guarded(Access.CONSUME)
    async def last_message_id(self) -> Position | None:
        """The position of the last visible data entry (None if there is none)."""
        await self._started()
        assert self._ledger is not None
        max_read = self.buffer.max_read_position
        end = max_read
        while end >= max(self._ledger.trimmed_below, Position(0, 0)):
            window_start = Position(end.ledger_id, max(0, end.entry_id - 256))
            window_start, entries = await self._read_retained(window_start, 257, end)
            for entry in reversed(entries):
                header = decode_header(entry.records[0], f"{self.stream}@{entry.position}")
                if not header.is_marker and self.buffer.is_visible(header, entry.position):
                    return entry.position
            if window_start.entry_id > 0:
                end = Position(end.ledger_id, window_start.entry_id - 1)
                continue
            earlier = [i for i in self._ledger.ledgers if i.ledger_id < end.ledger_id and i.last_entry_id >= 0]
            if not earlier:
                return None
            end = Position(earlier[-1].ledger_id, earlier[-1].last_entry_id)
        return None

    # --- snapshots and trimming ------------------------------------------------------------

    def _start_snapshot(self) -> None:
        if self._snapshotting is None:
            self._snapshotting = asyncio.get_running_loop().create_task(self._write_snapshot())

    @guarded(Access.SUPERUSER)
    async def snapshot(self) -> dict[str, Any]:
        """Write a snapshot now (also happens every N ended txns or T seconds)."""
        return await self._snapshot_now()

    async def _snapshot_now(self) -> dict[str, Any]:
        await self._started()
        self._start_snapshot()
        assert self._snapshotting is not None
        await asyncio.shield(self._snapshotting)
        return dict(self.info.get("last_snapshot", {}))

    async def _write_snapshot(self) -> None:
        try:
            await self.faults.hit("partition.before_snapshot")
            snapshot = self.buffer.snapshot()  # synchronous: the state after last_position
            self._ended_since_snapshot = 0
            self._changed_since_snapshot = False
            last = snapshot.last_position
            snapshot_id = (last.ledger_id << 32 | last.entry_id) if last != EARLIEST else 0
            data = _encoder.encode(snapshot)
            for name, segment in split_snapshot(data, snapshot_id, self.config.snapshot_segment_bytes,
                                                version=self.storage.write_format):
                try:
                    await self.storage.create(f"{self.snapshot_prefix}/{name}", segment)
                except ObjectExists:
                    pass  # the same position snapshotted before: identical bytes
            listing = await self.storage.list(self.snapshot_prefix)
            await self.storage.delete(obsolete_segments(listing))
            self.info["snapshots_written"] += 1
            self.info["last_snapshot"] = {"id": snapshot_id, "last_position": str(last), "bytes": len(data),
                                          "aborted": len(snapshot.aborted), "time_ms": self.clock.now_ms()}
        finally:
            self._snapshotting = None

    async def _snapshot_timer(self) -> None:
        while True:
            await asyncio.sleep(self.config.snapshot_interval_s)
            if self._changed_since_snapshot:
                self._start_snapshot()

    @guarded(Access.SUPERUSER)
    async def trim(self, below: Position) -> str:
        """Delete entries below ``below``, but never what a subscription has not acked (by its
        persisted cursor), nor past the newest snapshot or max_read_position; aborted txns whose
        marker was deleted are forgotten. Returns the trim point."""
        await self._started()
        if not isinstance(below, Position):
            raise InvalidArgument(f"trim takes a Position, got {below!r}")
        _info, marks = await topic_and_marks(self.storage, self.topic, self.partition)
        bound = acked_bound(marks, self._readable_end())
        below = below if bound is None else min(below, bound)
        if self.compaction.compacted:  # never past the horizon: above it the live ledger is the only copy
            horizon = await self.compaction.refresh()
            below = min(below, self._ledger.trimmed_below if horizon is None else next_position(horizon))
        return str(await self._trim_to(below))

    @guarded(Access.SUPERUSER)
    async def apply_retention(self) -> dict[str, Any]:
        """Trim as far as the subscriptions and the topic's retention policy allow, now (it also
        happens every ``retention_check_s``). Returns what was decided."""
        await self._started()
        return await self._apply_retention()

    async def _apply_retention(self) -> dict[str, Any]:
        assert self._ledger is not None
        topic, marks = await topic_and_marks(self.storage, self.topic, self.partition)
        if topic is None:  # not (or no longer) in the catalog: nothing says what may go
            return {"trimmed_below": str(self._ledger.trimmed_below), "topic_known": False}
        policy = topic.retention
        objects = ([StoredObject(*chunk) for chunk in await self._ledger.stored_objects()]
                   if policy.is_set or policy.compacted else [])
        if policy.compacted:
            horizon = await self.compaction.compact_if_due(objects, self.buffer, self.clock.now_ms())
            cut = compacted_retention_cut(self._ledger.trimmed_below, self._readable_end(), marks, policy, objects,
                                          self.clock.now_ms(), horizon)
        else:
            cut = retention_cut(self._ledger.trimmed_below, self._readable_end(), marks, policy, objects,
                                self.clock.now_ms())
        trimmed = await self._trim_to(cut)
        result = {"trimmed_below": str(trimmed), "topic_known": True, "subscriptions": len(marks),
                  "slowest": None if not marks or None in marks else str(min(marks)),
                  "time_ms": self.clock.now_ms()}
        self.info["last_retention"] = result
        return result

    async def _retention_timer(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_s)
            try:
                await self._apply_retention()
            except Exception:  # a storage hiccup: the next check tries again
                log.warning("retention of %s failed", self.stream, exc_info=True)

    def _readable_end(self) -> Position:
        """Everything below it is readable: nothing at or above it may be trimmed."""
        return next_position(self.buffer.max_read_position)

    async def _trim_to(self, cut: Position) -> Position:
        """Trim below ``cut``, bounded by the newest snapshot (recovery replays from there; one is
        written first when the newest does not reach ``cut``) and the readable end."""
        assert self._ledger is not None
        async with self._trim_lock:
            cut = min(cut, self._readable_end())
            if cut <= self._ledger.trimmed_below:
                if self._pin_pending:  # the last trim's pin failed (a storage fault): again now
                    self._changed_since_snapshot |= await self._pin_log_start()
                return self._ledger.trimmed_below
            covered = await self._snapshot_covers()
            if covered < cut:
                await self._snapshot_now()
                covered = await self._snapshot_covers()
            trimmed = await self._write(self._ledger.trim(min(cut, covered)))
            pruned = self.buffer.prune_aborted(trimmed)
            self._changed_since_snapshot |= pruned > 0  # the next snapshot is smaller
            self._pin_pending = True
            self._changed_since_snapshot |= await self._pin_log_start()
            self.info["trims"] += 1
            self.info["aborted_pruned"] += pruned
            return trimmed

    async def _pin_log_start(self) -> bool:
        """Make the first entry kept after the trim point a point of the Kafka offset index, at
        the base offset it carries (``OffsetIndex.pin``): retention trims at any entry, and the
        entries between the trim point and the next point were otherwise out of reach by offset
        (a Kafka group committed there resumed past them). One entry read; nothing when the entry
        is not applied yet (the index then has no point left, and its apply makes one) or is from
        before offsets (it carries none)."""
        assert self._ledger is not None
        try:
            first = await self._ledger.read(self._ledger.trimmed_below, max_entries=1)
        except PositionTrimmed:  # a newer trim overtook this read: that trim pins its own start
            return False
        self._pin_pending = False
        if not first:
            return False
        header = decode_header(first[0].records[0], f"{self.stream}@{first[0].position}")
        offsets = self.buffer.offsets
        if header.base_offset is None or header.base_offset >= offsets.next_offset:
            return False
        return offsets.pin(first[0].position, header.base_offset)

    async def _snapshot_covers(self) -> Position:
        """The newest complete snapshot holds the state of every entry below this."""
        newest = newest_complete(await self.storage.list(self.snapshot_prefix))
        if newest is None or newest[0] == 0:  # id 0 is also the snapshot of nothing: trust it with nothing
            return EARLIEST
        sid = newest[0]
        return next_position(Position(sid >> 32, sid & 0xFFFFFFFF))

    # --- introspection and faults ----------------------------------------------------------

    @guarded(Access.AUTHENTICATED)
    async def stats(self, storage: bool = False) -> dict[str, Any]:
        """The buffer's and ledger's state and counters; ``storage``: also ``storage_bytes``, the
        bytes of the partition's ledger objects in the store (one listing)."""
        await self._started()
        assert self._ledger is not None
        buffer_stats = msgspec.structs.asdict(self.buffer.stats(self.clock.now_ms()))
        stats = {**self.info, **{k: str(v) if isinstance(v, (Position, TxnID)) else v
                                 for k, v in buffer_stats.items()}}
        stats["ledgers"] = [i.ledger_id for i in self._ledger.ledgers]
        stats["rss_bytes"] = psutil.Process().memory_info().rss
        stats["trimmed_below"] = str(self._ledger.trimmed_below)
        stats["compaction"] = {"compacted": self.compaction.compacted, **self.compaction.info}
        stats["kafka_offsets"] = self._kafka_offsets()
        if storage:  # one listing of the ledger objects: asked for by the console's stats refresh, not on every call
            stats["storage_bytes"] = sum(chunk.size for chunk in await self._ledger.stored_objects())
        return stats


PartitionActor = ray.remote(**ray_actor_options(max_concurrency=10_000))(PartitionBuffer)
