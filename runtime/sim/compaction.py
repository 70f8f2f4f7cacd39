"""A compacted topic under faults (``Workload.compaction``; the "compaction" profile): issue 58's
compaction run by the real partition actors, compactor and readers in the simulator.

The topic ``kv`` (compacted, with a small threshold: ``compacted.py``) is written by

- transactional writers ``kt<i>`` (``Workload.tid_producers`` of them, ``tid_txns`` txns each): a
  txn writes 1-3 keyed records over the partitions, then commits, aborts on purpose (``abort``),
  is left open for its timeout (``forget``), or is fenced (``refence``): the id's next instance
  registers while the txn is open, before or after its sends, and the old one goes on as a zombie
  whose calls and commit must be refused;
- plain writers ``kp<i>``: batches of keyed records of one partition, each send resent with the
  same sequence ids until it is answered (the producer's resend path: the partition's dedup must
  drop the replays of a stored batch, across restarts, snapshots and trims).

A fifth of the records are tombstones (an empty value). A record's value is its uid (nothing for a
tombstone), and the uid also rides in a property, so every read names the write it shows.

Compaction happens three ways at once. Each partition compacts itself in its retention pass once
``THRESHOLD_BYTES`` lie above its horizon, and trims its live ledger below the horizon. An outside
compactor (``Client.compact``'s ``compact_partition``, from the partition's ``range_plan``)
compacts a random partition now and then, sometimes with a delete retention short enough to drop
tombstones, in a client process that dies at a random step of it now and then. And the nemesis
crashes partitions (leaving zombies) while either runs.

Three readers:

- the ``audit`` subscription, a plain consumer acking as it reads (its persisted cursor holds
  retention back, so nothing is trimmed before it read it): with its final drain this is the
  *committed history*, every committed message at its position. The exactly-once checker judges
  it against the sends: nothing committed lost, nothing aborted or open read, no message stored
  twice (dedup held);
- a table (``SimTable``, the real table view's core): loads the compacted view, then tails the
  committed data, loading again after a trim; after each refresh it notes what it holds of each
  partition, and up to where;
- a ``read_compacted`` subscription's consumer (``rc``, not in the catalog: it holds no
  retention back, and needs none), joining late: the compacted view below the horizon (the
  partition's compacted reads), then the live ledger.

``violations`` checks, on top of the checker:

- every generation published in the run (each one, not only the last): its records are committed
  messages (at their position and batch index, with their key and value), never aborted or open
  data; it holds, for every key, the latest committed message at or below its horizon (a tombstone
  there may have been dropped, a value not); its horizon was at or below the serving partition's
  ``max_read_position`` at the publish, and no txn with data at or below it could still have been
  open then (its end not asked for, not fenced, its timeout not reached);
- every state the table noted, and a read of each partition at the end (``read_compacted`` after
  one more compaction: the compacted view, then the live tail): the fold of the committed history
  up to there (the latest value of each key; a tombstone removes its key);
- the ``read_compacted`` consumer got committed messages only (at their places, with their keys
  and values), and ends with the latest value of each key whose latest committed message is a
  value;
- no value of a fenced txn is visible anywhere;
- the outside compactor met no error but a lost race (``Fenced``) or a storage outage.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raytxn.client.message import MessageId
from raytxn.client.rpc import retriable
from raytxn.client.transaction import TxnClientState, TxnStateMachine
from raytxn.errors import ConcurrentTransactions, Fenced, RaytxnError, StorageUnavailable
from raytxn.hashing import partition_for
from raytxn.ids import Position, TxnID, partition_actor_name, subscription_actor_name
from raytxn.ledger.compacted import compact_partition, read_compacted
from raytxn.protocol.compaction import DEFAULT_DELETE_RETENTION_MS
from raytxn.protocol.cursor import next_position
from raytxn.protocol.entry_format import MessageRecord, decode_message, encode_message
from raytxn.sim.compacted import CompactedTopic, Generation, Generations, SimTable, compactions
from raytxn.sim.pipelined import ClientProcess
from raytxn.tools.history import FinalState, History, Received, SendOk

if TYPE_CHECKING:
    from raytxn.sim.driver import Driver

KV, SUB_AUDIT, SUB_COMPACTED = "kv", "audit", "rc"
THRESHOLD_BYTES = 700        # a partition compacts itself once this much lies above its horizon
KEYS = 10
TOMBSTONE = 0.2              # per record: a tombstone
PLAIN_WRITERS = 2
PLAIN_BATCHES = 30           # each plain writer's batches
WRITE_PAUSE_S = (0.0, 0.08)
LATE_RESEND = 0.15           # per plain batch stored: resent once more, a while later
LATE_RESEND_AFTER_S = (0.2, 2.0)
SEND_DEADLINE_S = 3.0        # a plain send's attempt; then it is resent with the same sequence ids
MAX_RESENDS = 20
BEGIN_RETRY_S = 0.2           # after ConcurrentTransactions (the id's last txn is still open)
MAX_REFUSED_BEGINS = 200
FENCE_LATE = 0.5             # of the fenced txns: the successor registers after the sends, not before
COMPACT_EVERY_S = (0.1, 0.5)
COMPACTOR_CRASH = 0.3        # per outside compaction: its process dies at a random step
COMPACTOR_CRASH_AFTER_S = (0.0, 0.03)
SHORT_RETENTION = 0.25       # per outside compaction: a delete retention of 0-1 s (tombstones dropped)
TABLE_POLL_S = 0.3
COMPACTED_JOIN_S = (2.0, 6.0)  # when the read_compacted consumer subscribes: after compactions, mostly
MAX_FETCH, FETCH_WAIT_S = 16, 0.2
MAX_READS = 100_000          # fetches of a reader, at most
LOAD_ATTEMPTS = 100
MAX_FOUND = 50               # violations of the generations listed at most


def kv_topic(partitions: int) -> CompactedTopic:
    return CompactedTopic(KV, partitions, (SUB_AUDIT,), THRESHOLD_BYTES, uncatalogued=(SUB_COMPACTED,))


def uid_of(record: bytes) -> str:
    """The write a record of ``kv`` is (its ``uid`` property)."""
    return decode_message(record).properties["uid"]


@dataclass(frozen=True)
class Write:
    uid: str
    key: str
    value: bytes  # b"": a tombstone

    def record(self) -> bytes:
        return encode_message(MessageRecord(self.value, self.key, {"uid": self.uid}))


Mid = tuple[int, int, int]  # (ledger_id, entry_id, batch_index): a message's place in its partition
END = Position(2**62, 0)    # after every position


def _mid(message_id: Any) -> Mid:
    return message_id.ledger_id, message_id.entry_id, message_id.batch_index


class CompactionRun:
    """The workload's state and its jobs (see the module docstring)."""

    def __init__(self, d: Driver) -> None:
        self.d = d
        self.partitions = d.w.partitions
        keys = [f"k{i}" for i in range(KEYS)]
        self.keys_of = {p: [k for k in keys if partition_for(k, self.partitions) == p] for p in range(self.partitions)}
        assert all(self.keys_of.values()), self.keys_of
        self.writes: dict[str, Write] = {}
        self.txn_of: dict[str, TxnID] = {}
        self.may_end_from: dict[TxnID, float] = {}  # the earliest a txn could have ended (at any participant)
        self.fenced: set[TxnID] = set()
        self._sequences: dict[tuple[str, int], int] = {}
        self._firsts: dict[str, int] = {}  # a batch's first uid -> its first sequence id
        self.errors: list[str] = []
        self.table_views: list[tuple[int, Position, dict[str, bytes]]] = []
        self.final_views: list[tuple[str, int, Position, dict[str, bytes]]] = []
        # what the read_compacted consumer received: (partition, place, key, value, when)
        self.compacted_reads: list[tuple[int, Mid, str | None, bytes, float]] = []
        self.counts: Counter[str] = Counter()
        self.generations = Generations(d.world, KV, self.partitions)
        self._writers_running = 0
        self._last_read = 0.0
        self._table_loads = 0

    def stats(self) -> dict[str, int]:
        """What the run did (for tests and the command's summary)."""
        return {**self.counts, "generations": len(self.generations.published), "table_views": len(self.table_views),
                "table_loads": self._table_loads, "fenced_txns": len(self.fenced),
                "tombstones": sum(1 for write in self.writes.values() if not write.value),
                "compacted_view_reads": self._compacted_view_reads(),
                **compactions(self.d.world, KV, self.partitions)}

    def _compacted_view_reads(self) -> int:
        """The read_compacted consumer's messages at or below a horizon published before it got
        them: served from a compacted generation (or from the live ledger by a partition that had
        not heard of it yet)."""
        published = sorted((g.t, g.partition, g.horizon) for g in self.generations.published)
        count = 0
        for p, mid, _, _, t in self.compacted_reads:
            horizons = [h for when, q, h in published if q == p and when <= t]
            count += bool(horizons) and Position(mid[0], mid[1]) <= max(horizons)
        return count

    def jobs(self) -> list[Any]:
        d = self.d
        writers = [self._writer(self.txn_writer(i)) for i in range(d.w.tid_producers)]
        writers += [self._writer(self.plain_writer(i)) for i in range(PLAIN_WRITERS)]
        self._writers_running = len(writers)
        return [*writers, self.outside_compactor(), self.auditor(), self.table_reader(), self.compacted_reader()]

    async def _writer(self, job: Any) -> None:
        try:
            await job
        finally:
            self._writers_running -= 1

    def _writers_done(self) -> bool:
        return self._writers_running == 0

    def _readers_done(self) -> bool:
        """The writers are done, the faults stopped, and nothing was read for longer than an
        open txn can hold the partitions back."""
        d = self.d
        if not self._writers_done() or d.quiet_since is None:
            return False
        return d.now() - max(d.quiet_since, self._last_read) > 2 * d.w.txn_timeout_ms / 1000 + 2.0

    def _new_write(self, uid: str, key: str) -> Write:
        write = Write(uid, key, b"" if self.d.rng.random() < TOMBSTONE else uid.encode())
        self.writes[uid] = write
        return write

    # --- writers -------------------------------------------------------------------------------

    async def _send(self, producer: str, partition: int, writes: list[Write], txn: TxnID | None) -> bool:
        """One batch to ``partition``; a plain one is resent with the same sequence ids until it is
        answered. True when it is stored."""
        d = self.d
        first = self._sequences.get((producer, partition), 0)
        self._sequences[producer, partition] = first + len(writes)
        self._firsts[writes[0].uid] = first
        for write in writes:
            d.history.send(write.uid, KV, partition, txn, producer, d.now())
            if txn is not None:
                self.txn_of[write.uid] = txn
        records = [write.record() for write in writes]
        ref = d._ref(partition_actor_name(KV, partition))
        attempts = 1 if txn is not None else MAX_RESENDS
        for attempt in range(attempts):
            try:
                result = await ref.call_async("append", producer, first, records, txn, -1,
                                              deadline_s=d.call_deadline_s if txn is not None else SEND_DEADLINE_S)
                break
            except Exception as error:  # noqa: BLE001 - unknown outcome: resent, or recorded so
                d._unexpected(f"append {writes[0].uid}", error)
                d.counts.error(error)
                if attempt + 1 < attempts and not isinstance(error, Fenced):
                    self.counts["resends"] += 1
                    continue
                for write in writes:
                    d.history.send_failed(write.uid, error, d.now(), producer=producer)
                return False
        for index, write in enumerate(writes):
            if result.position is None:
                d.history.send_failed(write.uid, "PositionUnknown", d.now(), producer=producer)
            else:
                d.history.send_ok(write.uid, MessageId(KV, partition, result.position.ledger_id,
                                                       result.position.entry_id, index), d.now(), producer=producer)
        return True

    async def plain_writer(self, index: int) -> None:
        d = self.d
        producer = f"kp{index}"
        resends = []
        for n in range(PLAIN_BATCHES):
            partition = d.rng.randrange(self.partitions)
            writes = [self._new_write(f"{producer}-{n}-{k}", d.rng.choice(self.keys_of[partition]))
                      for k in range(d.rng.randint(1, 3))]
            if await self._send(producer, partition, writes, None) and d.rng.random() < LATE_RESEND:
                # As if the answer was lost and the producer resent the batch a while later (after
                # restarts, snapshots and trims): the partition's dedup must know it still.
                resends.append(d.world.loop.create_task(self._resend_late(producer, partition, writes)))
            await asyncio.sleep(d.rng.uniform(*WRITE_PAUSE_S))
        await asyncio.gather(*resends)

    async def _resend_late(self, producer: str, partition: int, writes: list[Write]) -> None:
        d = self.d
        first = self._firsts[writes[0].uid]
        await asyncio.sleep(d.rng.uniform(*LATE_RESEND_AFTER_S))
        d._trace("resend_late", producer, partition, first)
        try:
            result = await d._ref(partition_actor_name(KV, partition)).call_async(
                "append", producer, first, [write.record() for write in writes], None, -1, deadline_s=None)
        except RaytxnError as error:  # e.g. OutOfOrderSequence: refused, so not stored again either
            d.counts.error(error)
            return
        self.counts["late_resends_duplicate" if result.duplicate else "late_resends_stored"] += 1

    async def txn_writer(self, index: int) -> None:
        d = self.d
        tid = f"kt{index}"
        coordinators = d.coordinator_client(f"owner-{tid}")
        epoch = await d._register(coordinators, tid)
        n = refused = 0
        while n < d.w.tid_txns and refused < MAX_REFUSED_BEGINS:
            if not d._may_begin():
                break
            asked = d.now()
            try:
                txn = await coordinators.new_txn_async(d.w.txn_timeout_ms, tid, epoch)
            except Exception as error:  # noqa: BLE001 - the id's last txn still open, or fenced
                d._unexpected(f"new_txn {tid}", error)
                d.counts.error(error)
                refused += 1
                if isinstance(error, Fenced):
                    epoch = await d._register(coordinators, tid)
                elif isinstance(error, ConcurrentTransactions):  # a txn left open: until its timeout
                    await asyncio.sleep(BEGIN_RETRY_S)
                continue
            n += 1
            self.may_end_from[txn] = asked + d.w.txn_timeout_ms / 1000
            machine = d._machine(txn)
            writes: dict[int, list[Write]] = defaultdict(list)
            for k in range(d.rng.randint(1, 3)):
                key = f"k{d.rng.randrange(KEYS)}"
                writes[partition_for(key, self.partitions)].append(self._new_write(f"{tid}-{n}-{k}", key))
            fence = d.rng.random() < d.w.refence
            fence_late = fence and d.rng.random() < FENCE_LATE
            epoch_next = epoch
            if fence and not fence_late:
                epoch_next = await self._fence(coordinators, tid, txn, epoch)
            await self._fill(coordinators, txn, machine, epoch, f"{tid}-e{epoch}", writes)
            if fence_late:
                epoch_next = await self._fence(coordinators, tid, txn, epoch)
            if d.rng.random() < d.w.forget:
                d._trace("forgotten", str(txn))
            else:
                self.may_end_from[txn] = min(self.may_end_from[txn], d.now())
                await d.end(txn, machine, d.rng.random() >= d.w.abort, coordinators, epoch, tid)
            epoch = epoch_next

    async def _fence(self, coordinators: Any, tid: str, txn: TxnID, epoch: int) -> int:
        """The id's next instance registers while ``txn`` is open: it aborts ``txn`` at once."""
        self.fenced.add(txn)
        self.may_end_from[txn] = min(self.may_end_from[txn], self.d.now())
        epoch_next: int = await self.d._register(coordinators, tid)
        self.d._trace("refenced", tid, epoch, epoch_next)
        return epoch_next

    async def _fill(self, coordinators: Any, txn: TxnID, machine: TxnStateMachine, epoch: int, producer: str,
                    writes: dict[int, list[Write]]) -> None:
        d = self.d
        try:
            await coordinators.add_partitions_async(txn, [(KV, p) for p in sorted(writes)], epoch)
        except Exception as error:  # noqa: BLE001 - fenced, timed out: the client's txn is ABORT_ONLY
            d._unexpected(f"add_partitions {txn}", error)
            d.counts.error(error)
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
            return
        for partition in sorted(writes):
            if not await self._send(producer, partition, writes[partition], txn):
                machine.transition_to(TxnClientState.ABORT_ONLY, cause=RuntimeError("send failed"), if_allowed=True)
                return

    # --- compactions from outside --------------------------------------------------------------

    async def outside_compactor(self) -> None:
        d = self.d
        n = 0
        while not self._writers_done():
            await asyncio.sleep(d.rng.uniform(*COMPACT_EVERY_S))
            n += 1
            partition = d.rng.randrange(self.partitions)
            retention = (d.rng.randrange(1000) if d.rng.random() < SHORT_RETENTION else DEFAULT_DELETE_RETENTION_MS)
            process = ClientProcess(f"compactor#{n}")
            task = d.world.loop.spawn(process, self._compact(partition, retention))
            if d.rng.random() < COMPACTOR_CRASH and d.quiet_since is None:
                done, _ = await asyncio.wait([task], timeout=d.rng.uniform(*COMPACTOR_CRASH_AFTER_S))
                if not done:
                    d._trace("compactor_crash", process.label, partition)
                    d.world.loop.kill_owner(process)
                    self.counts["outside_crashed"] += 1
                    await asyncio.gather(task, return_exceptions=True)
                    continue
            await task

    async def _compact(self, partition: int, delete_retention_ms: int) -> bool:
        """One outside compaction of ``partition``, as ``Client.compact`` runs it; True when it
        published or found nothing new."""
        d = self.d
        try:
            plan = await d._ref(partition_actor_name(KV, partition)).call_async(
                "range_plan", Position(0, 0), deadline_s=d.call_deadline_s)
            result = await compact_partition(d.world.storage, KV, partition, plan.max_read, plan.aborted,
                                             d.world.clock.now_ms(), delete_retention_ms=delete_retention_ms)
        except Fenced:
            self.counts["outside_lost"] += 1  # another compaction published this generation first
            return False
        except StorageUnavailable:
            self.counts["outside_storage"] += 1
            return False
        except Exception as error:  # noqa: BLE001 - the verdict: a compaction may only lose a race
            self.errors.append(f"compactor: outside compaction of {KV}-{partition}: {error!r}")
            return False
        self.counts["outside_published" if result.publishes else "outside_unchanged"] += 1
        return True

    # --- readers -------------------------------------------------------------------------------

    async def auditor(self) -> None:
        """The audit subscription: every committed message, noted in the history, acked at once."""
        self.d.history.subscribe("auditor", SUB_AUDIT, KV, self.d.now(), from_earliest=True)
        await self._read(SUB_AUDIT, "auditor", "Shared")

    async def compacted_reader(self) -> None:
        """A ``read_compacted`` subscription's consumer, joining late (after compactions, mostly):
        the compacted view below the horizon, then the live ledger; then it reads what is left."""
        await asyncio.sleep(self.d.rng.uniform(*COMPACTED_JOIN_S))
        await self._read(SUB_COMPACTED, "compacted-reader", "Exclusive", read_compacted=True)

    async def _read(self, subscription: str, consumer: str, consumer_type: str, read_compacted: bool = False) -> None:
        """A consumer of ``subscription`` on every partition, fetching in turn and acking what it
        got, until the readers are done; then until its partitions are empty."""
        d = self.d
        audit = subscription == SUB_AUDIT
        refs = [d._ref(subscription_actor_name(KV, p, subscription)) for p in range(self.partitions)]
        for ref in refs:
            await ref.call_async("subscribe", consumer, consumer, consumer_type, read_compacted, deadline_s=None)
        polls = empty = 0
        while polls < MAX_READS and (not self._readers_done() or (not audit and empty < 3 * self.partitions)):
            partition = polls % self.partitions
            polls += 1
            try:
                reply = await refs[partition].call_async("fetch", consumer, MAX_FETCH, FETCH_WAIT_S,
                                                         deadline_s=d.call_deadline_s)
            except Exception as error:  # noqa: BLE001 - as the consumer's fetch loop: try again
                d._unexpected(f"fetch {consumer}", error)
                d.counts.error(error)
                continue
            if not reply["registered"]:
                await refs[partition].call_async("subscribe", consumer, consumer, consumer_type, read_compacted,
                                                 deadline_s=None)
                if audit:
                    d.history.reset(consumer, SUB_AUDIT, d.now())
                continue
            empty = 0 if reply["messages"] else empty + 1
            if not reply["messages"]:
                if audit:
                    d.history.receive_timeout(consumer, SUB_AUDIT, d.now(), topic=KV)
                continue
            await self._take(refs[partition], consumer, partition, reply["messages"], audit)
        for ref in refs:
            await ref.call_async("close_consumer", consumer, deadline_s=None)

    async def _take(self, ref: Any, consumer: str, partition: int, wire: list, audit: bool) -> None:
        """Note what a fetch brought (the audit's in the history), and ack it plainly (the cursor
        moves, and retention follows the audit's)."""
        d = self.d
        acks, runs = [], []
        for ledger_id, entry_id, batch_size, _ms, indexes, counts, records in wire:
            for k, batch_index in enumerate(indexes):
                mid = MessageId(KV, partition, ledger_id, entry_id, batch_index)
                if audit:
                    d.history.receive(consumer, SUB_AUDIT, KV, partition, mid, uid_of(records[k]),
                                      counts[k] if counts else 0, d.now())
                    d.history.ack(consumer, SUB_AUDIT, mid, None, d.now())
                else:  # a compacted entry's records keep no properties: known by their place
                    message = decode_message(records[k])
                    self.compacted_reads.append((partition, _mid(mid), message.key, message.value, d.now()))
                if batch_size > 1:
                    runs.append((ledger_id, entry_id, batch_size, batch_index, batch_index))
                else:
                    acks.append((Position(ledger_id, entry_id), batch_index, batch_size))
        if audit:
            self._last_read = d.now()
        d._requests += 1
        try:
            await ref.call_async("ack", consumer, acks, False, None, deadline_s=d.call_deadline_s,
                                 request_id=f"{consumer}-{d._requests}", ranges=None, runs=runs)
        except Exception as error:  # noqa: BLE001 - not acked: delivered again, and noted again
            d._unexpected(f"ack {consumer}", error)
            d.counts.error(error)

    async def table_reader(self) -> None:
        d = self.d
        table = SimTable(d.world, KV, self.partitions)
        await self._load(table)
        while not self._readers_done():
            await asyncio.sleep(TABLE_POLL_S)
            try:
                await table.refresh_async()
            except RaytxnError as error:  # as a table view's tail: the next round tries again
                self._table_error("refresh", error)
                continue
            self.table_views += [(p, *table.partition_view(p)) for p in range(self.partitions)]
            self._table_loads = table.loads

    async def _load(self, table: SimTable) -> None:
        for _ in range(LOAD_ATTEMPTS):
            try:
                await table.load_async()
                return
            except RaytxnError as error:  # a storage outage, a partition restarting: again
                self._table_error("load", error)
                await asyncio.sleep(TABLE_POLL_S)
        raise RuntimeError(f"a table of {KV} did not load in {LOAD_ATTEMPTS} attempts")

    def _table_error(self, what: str, error: RaytxnError) -> None:
        """A table's failed load or refresh: an outage or a restart passes (the next round tries
        again); any other error is the verdict (a table view's ``refresh()`` would raise it)."""
        self.d.counts.error(error)
        if not retriable(error):
            self.errors.append(f"table: {what} failed: {error!r}")

    # --- the end -------------------------------------------------------------------------------

    async def finish(self) -> None:
        """After the quiet period's drains: one more compaction of each partition, then its
        compacted view and live tail, read as a compacted reader and as a new table reads them."""
        d = self.d
        for partition in range(self.partitions):
            for _ in range(LOAD_ATTEMPTS):
                if await self._compact(partition, DEFAULT_DELETE_RETENTION_MS):
                    break
            plan = await d._ref(partition_actor_name(KV, partition)).call_async("range_plan", Position(0, 0),
                                                                                deadline_s=None)
            try:
                read = await read_compacted(d.world.storage, KV, partition, plan.max_read, plan.aborted, 0,
                                            plan.first_readable)
            except RaytxnError as error:  # no fault is on now: the verdict
                self.errors.append(f"final view: read_compacted of partition {partition} failed: {error!r}")
                continue
            folded: dict[str, bytes | None] = {}
            for record in read.records:
                folded[record["key"]] = record["value"]
            live = {key: value for key, value in folded.items() if value}
            self.final_views.append(("read_compacted", partition, next_position(plan.max_read), live))
        table = SimTable(d.world, KV, self.partitions)
        try:
            await table.load_async()
        except RaytxnError as error:
            self.errors.append(f"final view: a new table failed to load: {error!r}")
            return
        self.final_views += [("a new table", p, *table.partition_view(p)) for p in range(self.partitions)]

    # --- the checks ----------------------------------------------------------------------------

    def violations(self, history: History, outcomes: dict[Any, str]) -> list[str]:
        """See the module docstring; ``outcomes``: the checker's effective outcome of each txn."""
        found = list(self.errors)
        committed = self._committed(history)
        found += self._generation_violations(committed, history, outcomes)
        for p, below, held in self.table_views:
            if (wrong := _differs(held, self._fold(committed[p], below))) is not None:
                found.append(f"table: partition {p} below {below}: {wrong}")
                break
        for what, p, below, held in self.final_views:
            if (wrong := _differs(held, self._fold(committed[p], below))) is not None:
                found.append(f"final view ({what}): partition {p} below {below}: {wrong}")
        found += self._compacted_read_violations(committed)
        visible = {uid for messages in committed.values() for uid in messages.values()}
        shown = sorted(uid for uid in visible if self.txn_of.get(uid) in self.fenced)
        if shown:
            found.append(f"fencing: values of fenced txns are visible: {shown[:5]}")
        return found

    def _compacted_read_violations(self, committed: dict[int, dict[Mid, str]]) -> list[str]:
        """The read_compacted consumer got committed messages only, and ends with the latest value
        of every key whose latest committed message is a value. A key whose latest is a tombstone
        it may still hold an older value of, if tombstones were dropped: it lagged past their
        delete retention (Kafka's ``delete.retention.ms`` rule), and missed the delete."""
        found = []
        got: dict[int, dict[Mid, str]] = defaultdict(dict)
        for p, mid, key, value, _ in self.compacted_reads:
            uid = committed[p].get(mid)
            if uid is None or (self.writes[uid].key, self.writes[uid].value) != (key, value):
                found.append(f"compacted reader: partition {p}: got {key}={value!r} at {mid}, where the committed "
                             f"message is {uid}")
                break
            got[p][mid] = uid
        dropped = {g.partition for g in self.generations.published
                   if g.published.horizon.dropped_tombstones_through >= 0}
        for p in range(self.partitions):
            expected = self._fold(committed[p], END)
            held = self._fold(got[p], END)
            wrong = sorted(key for key in expected.keys() | held.keys() if held.get(key) != expected.get(key)
                           and (key in expected or p not in dropped))
            if wrong:
                found.append(f"compacted reader: partition {p}: "
                             f"{'; '.join(f'{k}: {held.get(k)!r}, not {expected.get(k)!r}' for k in wrong[:4])}")
        return found

    def _committed(self, history: History) -> dict[int, dict[Mid, str]]:
        """Per partition, the committed history the audit read: each message's place -> uid."""
        committed: dict[int, dict[Mid, str]] = {p: {} for p in range(self.partitions)}
        for event in history.events:
            if isinstance(event, Received) and event.subscription == SUB_AUDIT:
                committed[event.partition][_mid(event.message_id)] = event.msg_uid
            elif isinstance(event, FinalState) and event.subscription == SUB_AUDIT:
                for message in event.messages:
                    committed[message.partition][_mid(message.message_id)] = message.msg_uid
        return committed

    def _fold(self, messages: dict[Mid, str], below: Position) -> dict[str, bytes]:
        """The latest value of each key among the committed ``messages`` before ``below`` (a
        tombstone removes its key)."""
        folded: dict[str, bytes] = {}
        for mid in sorted(messages):
            if Position(mid[0], mid[1]) >= below:
                break
            write = self.writes[messages[mid]]
            if write.value:
                folded[write.key] = write.value
            else:
                folded.pop(write.key, None)
        return folded

    def _latest(self, messages: dict[Mid, str], through: Position) -> dict[str, tuple[Mid, Write]]:
        """Each key's latest committed message at or before ``through``."""
        latest: dict[str, tuple[Mid, Write]] = {}
        for mid in sorted(messages):
            if Position(mid[0], mid[1]) > through:
                break
            write = self.writes[messages[mid]]
            latest[write.key] = (mid, write)
        return latest

    def _generation_violations(self, committed: dict[int, dict[Mid, str]], history: History,
                               outcomes: dict[Any, str]) -> list[str]:
        found: list[str] = []
        stored = {(event.message_id.partition, _mid(event.message_id)): event.msg_uid for event in history.events
                  if isinstance(event, SendOk) and event.message_id.topic == KV}
        txn_positions = self._txn_positions(history)
        for generation in self.generations.published:
            p, h = generation.partition, generation.horizon
            name = f"generation {generation.number} of {KV}-{p} (horizon {h}, published at t={generation.t:.3f})"
            records = self.generations.records(generation)
            if records is None:
                found.append(f"lost: {name}: its data object {generation.published.data_path} was never written")
                continue
            latest = self._latest(committed[p], h)
            kept_keys = set()
            for record in records:
                mid = (record.position.ledger_id, record.position.entry_id, record.batch_index)
                uid = committed[p].get(mid)
                kept_keys.add(record.key)
                if uid is None:
                    sent = stored.get((p, mid))
                    txn = self.txn_of.get(sent or "")
                    found.append(f"uncommitted: {name}: holds {record.key}={record.value!r} at {mid}, not a committed "
                                 "message "
                                 f"(sent as {sent}, in txn {txn}: {outcomes.get(txn, 'unknown')})")
                elif self.writes[uid].key != record.key or self.writes[uid].value != (record.value or b""):
                    found.append(f"uncommitted: {name}: holds {record.key}={record.value!r} at {mid}, "
                                 f"where {uid} stands")
                elif record.position > h:
                    found.append(f"past horizon: {name}: holds {uid} at {mid}")
                elif latest[record.key][0] != mid:
                    found.append(f"stale: {name}: holds {uid} for {record.key}, whose latest committed message at or "
                                 f"below the horizon is {latest[record.key][1].uid}")
            lost = sorted(uid for key, (_, write) in latest.items() if write.value and key not in kept_keys
                          for uid in [write.uid])
            if lost:
                found.append(f"lost: {name}: lacks the latest committed values {lost[:5]} of their keys")
            if generation.max_read is not None and h > generation.max_read:
                found.append(f"max_read: {name}: horizon past the partition's max_read_position {generation.max_read}")
            found += self._open_at_publish(name, generation, txn_positions)
            if len(found) >= MAX_FOUND:
                break
        return found

    def _open_at_publish(self, name: str, generation: Generation,
                         txn_positions: dict[tuple[int, TxnID], Position]) -> list[str]:
        """Txns with data at or below the horizon that could not have ended by the publish."""
        for (p, txn), first in sorted(txn_positions.items(), key=lambda item: item[1]):
            if p == generation.partition and first <= generation.horizon and self.may_end_from[txn] > generation.t:
                return [f"open txn: {name}: txn {txn} had data at {first}, and could end at "
                        f"t={self.may_end_from[txn]:.3f} at the earliest: the horizon passed an open txn"]
        return []

    def _txn_positions(self, history: History) -> dict[tuple[int, TxnID], Position]:
        """(partition, txn) -> the first position of the txn's data there, from the sends."""
        first: dict[tuple[int, TxnID], Position] = {}
        for event in history.events:
            if isinstance(event, SendOk) and event.msg_uid in self.txn_of and event.message_id.topic == KV:
                mid = event.message_id
                where = (mid.partition, self.txn_of[event.msg_uid])
                position = Position(mid.ledger_id, mid.entry_id)
                first[where] = min(first.get(where, position), position)
        return first


def _differs(held: dict[str, bytes], expected: dict[str, bytes]) -> str | None:
    """What ``held`` gets wrong against ``expected`` (None: nothing)."""
    wrong = [f"{key}: {held.get(key)!r}, not {expected.get(key)!r}" for key in sorted(held.keys() | expected.keys())
             if held.get(key) != expected.get(key)]
    return None if not wrong else "; ".join(wrong[:4])
