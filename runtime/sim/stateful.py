"""Exactly-once keyed state (``Workload.stateful``; the "stateful" profile): the rule of
``raytxn.connectors.stateful.StatefulPipeline`` run by the real actors in the simulator.

Keyed inputs (``Workload.inputs`` of them, ``KEYS`` keys) go to ``src``. One pipeline, the
transactional id ``sp``, keeps a count per key in the compacted topic ``state`` (a small
threshold: it compacts itself and trims its live ledger in the run, ``compacted.py``) and writes
one output per input to ``sink``. Each incarnation of the pipeline registers the id (its epoch
fences the older ones), loads a table of the state (``SimTable``: the real table view's core),
and runs batches as ``StatefulPipeline.run_batch`` does:

1. lease ``src``'s next committed range of each partition (holder ``sp``, the epoch);
2. read the ranges from storage (the real range reader);
3. refresh the table: every update committed before, its predecessors' too;
4. begin a txn of the id, register the sink and state partitions and the input subscription;
5. send an output per input, and per key of the batch its new state: ``count@through``, the
   count plus the batch's inputs of the key, and the position of the last of them;
6. ack the leases' ends in the txn, and commit (or abort on purpose: ``abort``).

An incarnation crashes at any of those points now and then (``CRASH_POINTS``: its process dies,
leaving leases, an open txn, a commit in flight), and its successor starts after a restart delay,
or at once. Now and then the successor starts while the incarnation is mid-batch: the incarnation
goes on as a zombie, whose lease, txn, acks and commit must all be refused.

Checked (``violations``), on top of the exactly-once checker (inputs consumed at most once in
committed txns, outputs stored once, nothing aborted or open delivered):

- **state**: for each key, the state's latest committed value (a new table, at the end) counts
  exactly the inputs of the key consumed by committed batches (none applied twice, none lost),
  and its ``through`` is the last of them;
- **version**: every committed batch read, for each key it updated, the state as of exactly the
  committed inputs of the key before its own (never ahead of the acked input, never behind);
- **output**: the sink's drain holds each input consumed by a committed batch once, and no
  output of any other;
- **lost**: every input is consumed by a committed batch or still in the input subscription's
  drain (a cumulative ack covers positions: the checker alone cannot see an input acked unread);
- **fencing**: no batch of an incarnation committed after its successor registered.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytxn.client.message import MessageId
from raytxn.client.rpc import retriable
from raytxn.client.transaction import TxnClientState, TxnStateMachine
from raytxn.errors import ConcurrentTransactions, Fenced, RaytxnError, StorageUnavailable
from raytxn.hashing import partition_for
from raytxn.ids import TxnID, partition_actor_name, subscription_actor_name
from raytxn.ledger.ranges import read_range_async
from raytxn.protocol.entry_format import MessageRecord, encode_message
from raytxn.sim.compacted import CompactedTopic, Generations, SimTable
from raytxn.sim.pipelined import ClientProcess
from raytxn.tools.checker import COMMITTED, UNDECIDED
from raytxn.tools.history import FinalState, History, SendOk

if TYPE_CHECKING:
    from raytxn.sim.driver import Driver

SRC, SINK, STATE = "src", "sink", "state"
SUB_INPUT, SUB_OUTPUT = "sp", "check"      # the pipeline's leases on src; the sink's, drained at the end
PIPELINE = "sp"                             # the pipeline's transactional id and lease holder
KEYS = 6
SEED_PAUSE_S = (0.0, 0.04)                  # between two batches of inputs
THRESHOLD_BYTES = 500
MAX_ENTRIES = (1, 2)                        # per lease
LEASE_TIMEOUT_S = 1.0
IDLE_S = 0.05
CRASH = 0.3                                 # per batch: the incarnation dies at one of CRASH_POINTS
CRASH_POINTS = ("leased", "read", "state_read", "begun", "registered", "outputs_sent", "state_sent", "acked",
                "commit_sent", "committed")
ZOMBIE = 0.12                               # per batch: the successor starts mid-batch
AT_ONCE = 0.5                               # per crash: the successor starts at once
RESTART_S = (0.01, 0.5)
READ_ATTEMPTS = 5
LOAD_ATTEMPTS = 200
MAX_INCARNATIONS = 200


def state_topic(partitions: int) -> CompactedTopic:
    return CompactedTopic(STATE, partitions, (), THRESHOLD_BYTES)


class _Crash(Exception):
    """The incarnation's process dies here: nothing after this point runs."""


@dataclass
class Batch:
    """One batch an incarnation ran to its end call (or crashed in after acking)."""

    txn: TxnID
    epoch: int
    inputs: list[tuple[str, str, MessageId]]           # (uid, key, id) in position order
    read: dict[str, State]                              # key -> the state the batch read of it
    fenced_at: float | None = None                      # when a successor registered, if it did meanwhile
    commit_issued: float | None = None
    sent: set[str] = field(default_factory=set)         # the uids of its sends that went out


Place = tuple[int, int, int]          # (ledger_id, entry_id, batch_index) of an input
State = tuple[int, Place | None]      # a key's state: its count, and the last input counted


def _place(mid: MessageId) -> Place:
    return mid.ledger_id, mid.entry_id, mid.batch_index


def encode_state(count: int, through: MessageId) -> bytes:
    return f"{count}@{through.ledger_id}:{through.entry_id}:{through.batch_index}".encode()


def decode_state(value: bytes) -> State:
    count, _, through = value.decode().partition("@")
    ledger_id, entry_id, index = (int(part) for part in through.split(":"))
    return int(count), (ledger_id, entry_id, index)


@dataclass
class StatefulRun:
    d: Driver
    batches: list[Batch] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)       # input uid -> key
    registered_at: list[tuple[int, float]] = field(default_factory=list)  # (incarnation, when it registered)
    errors: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    final_state: dict[str, bytes] | None = None
    _seeded: bool = False
    _current: asyncio.Task | None = None
    _incarnations: int = 0
    _last_work: float = 0.0

    def __post_init__(self) -> None:
        self.generations = Generations(self.d.world, STATE, self.partitions)

    def stats(self) -> dict[str, int]:
        """What the run did (for tests and the command's summary)."""
        return {**self.counts, "batches": len(self.batches), "incarnations": self._incarnations,
                "generations": len(self.generations.published)}

    def jobs(self) -> list[Any]:
        return [self.seed_inputs(), self.pipeline()]

    @property
    def partitions(self) -> int:
        return self.d.w.partitions

    async def seed_inputs(self) -> None:
        d = self.d
        i = 0
        while i < d.w.inputs:
            key = f"k{d.rng.randrange(KEYS)}"
            uids = [f"s-{j}" for j in range(i, min(i + d.rng.randint(1, 3), d.w.inputs))]
            self.keys.update(dict.fromkeys(uids, key))
            await d.append("seeder", SRC, partition_for(key, self.partitions), uids, None, key)
            i += len(uids)
            await asyncio.sleep(d.rng.uniform(*SEED_PAUSE_S))
        self._seeded = True

    def done(self) -> bool:
        """The inputs are all seeded and the faults stopped, and no batch found work for longer
        than a txn or a lease can hold inputs back; or no txn may begin any more."""
        d = self.d
        if d._txn_cap_reached():
            return True
        if not self._seeded or d.quiet_since is None:
            return False
        return d.now() - max(d.quiet_since, self._last_work) > 2 * d.w.txn_timeout_ms / 1000 + 2.0

    # --- the incarnations ----------------------------------------------------------------------

    async def pipeline(self) -> None:
        """Runs incarnations one after another: the next one after a crash (after a restart
        delay, or at once), or the one a zombie's successor started."""
        d = self.d
        self._current = self._start()
        while self._incarnations < MAX_INCARNATIONS:
            task = self._current
            await asyncio.gather(task, return_exceptions=True)
            if self._current is not task:
                continue  # it became a zombie: its successor runs
            if not task.cancelled() and task.exception() is not None:  # not a crash: the verdict
                raise task.exception()  # type: ignore[misc]
            if self.done():
                return
            if d.rng.random() >= AT_ONCE:
                await asyncio.sleep(d.rng.uniform(*RESTART_S))
            self._current = self._start()
        raise RuntimeError(f"the pipeline ran {MAX_INCARNATIONS} incarnations")

    def _start(self) -> asyncio.Task:
        self._incarnations += 1
        process = ClientProcess(f"pipeline#{self._incarnations}")
        return self.d.world.loop.spawn(process, _Incarnation(self, self._incarnations, process).run())

    def successor_now(self) -> None:
        """A new incarnation starts now, beside the running one (which goes on as a zombie)."""
        self.d._trace("pipeline_successor", self._incarnations + 1)
        self._current = self._start()

    # --- the checks ----------------------------------------------------------------------------

    def violations(self, history: History, outcomes: dict[Any, str]) -> list[str]:
        found = list(self.errors)
        committed = [b for b in self.batches if outcomes.get(b.txn) == COMMITTED]
        undecided_keys = {key for b in self.batches if outcomes.get(b.txn) == UNDECIDED for _, key, _ in b.inputs}
        consumed: dict[str, list[MessageId]] = defaultdict(list)  # key -> committed inputs' ids
        for batch in committed:
            for _, key, mid in batch.inputs:
                consumed[key].append(mid)
        for mids in consumed.values():
            mids.sort()
        found += self._version_violations(committed, consumed, undecided_keys)
        found += self._state_violations(consumed, undecided_keys)
        found += output_violations(history, committed)
        for batch in committed:
            fenced, issued = batch.fenced_at, batch.commit_issued
            if fenced is not None and issued is not None and issued > fenced:
                found.append(f"fencing: batch {batch.txn} of epoch {batch.epoch} committed, its commit asked for at "
                             f"t={batch.commit_issued:.3f}, after its successor registered at t={batch.fenced_at:.3f}")
        return found

    def _version_violations(self, committed: list[Batch], consumed: dict[str, list[MessageId]],
                            undecided: set[str]) -> list[str]:
        found = []
        for batch in committed:
            firsts: dict[str, MessageId] = {}
            for _, key, mid in batch.inputs:
                firsts.setdefault(key, mid)
            for key, first in firsts.items():
                if key in undecided:
                    continue
                before = [mid for mid in consumed[key] if mid < first]
                expected: State = (len(before), _place(before[-1]) if before else None)
                if batch.read[key] != expected:
                    where = "ahead of" if batch.read[key][0] > expected[0] else "behind"
                    found.append(f"version: batch {batch.txn} read {key} as {batch.read[key]}, {where} the committed "
                                 f"inputs of the key before the batch: {expected}")
                    break
        return found

    def _state_violations(self, consumed: dict[str, list[MessageId]], undecided: set[str]) -> list[str]:
        if self.final_state is None:
            return ["state: the final table never loaded"]
        found = []
        for key in sorted(set(consumed) | set(self.final_state)):
            if key in undecided:
                continue
            value = self.final_state.get(key)
            count, through = (0, None) if value is None else decode_state(value)
            mids = consumed.get(key, [])
            if count != len(mids):
                found.append(f"state: {key} counts {count} inputs, {len(mids)} were consumed by committed batches "
                             f"({'applied twice' if count > len(mids) else 'lost'})")
            elif mids and through != _place(mids[-1]):
                found.append(f"state: {key} went through {through}, its last committed input is {_place(mids[-1])}")
        return found

    async def finish(self) -> None:
        """The state as a new table loads it at the end."""
        table = SimTable(self.d.world, STATE, self.partitions)
        try:
            await table.load_async()
        except RaytxnError as error:  # no fault is on now: the verdict
            self.errors.append(f"table: the final table failed to load: {error!r}")
            return
        self.final_state = table.items()


def output_violations(history: History, committed: list[Batch]) -> list[str]:
    """**output** and **lost** of the module docstring (``committed``: the committed batches)."""
    outputs: Counter[str] = Counter()
    drained_inputs: set[str] = set()
    stored_inputs: list[str] = []
    for event in history.events:
        if isinstance(event, FinalState) and event.subscription == SUB_OUTPUT:
            outputs.update(message.msg_uid.removeprefix("o:") for message in event.messages)
        elif isinstance(event, FinalState) and event.subscription == SUB_INPUT:
            drained_inputs.update(message.msg_uid for message in event.messages)
        elif isinstance(event, SendOk) and event.message_id.topic == SRC:
            stored_inputs.append(event.msg_uid)
    done = {uid for batch in committed for uid, _, _ in batch.inputs}
    found = []
    wrong = sorted(uid for uid in done | set(outputs) if outputs[uid] != (uid in done))
    if wrong:
        found.append(f"output: inputs whose outputs the sink holds a wrong number of times: "
                     f"{[(uid, outputs[uid]) for uid in wrong[:5]]}")
    lost = [uid for uid in stored_inputs if uid not in done and uid not in drained_inputs]
    if lost:
        found.append(f"lost: {len(lost)} inputs neither consumed by a committed batch nor left in the drain of "
                     f"{SUB_INPUT}: {lost[:5]}")
    return found


class _Incarnation:
    """One process of the pipeline: its epoch, table and batches."""

    def __init__(self, run: StatefulRun, incarnation: int, process: ClientProcess) -> None:
        self.pipeline, self.d, self.incarnation, self.process = run, run.d, incarnation, process
        self.coordinators = run.d.coordinator_client(f"owner-{PIPELINE}-{incarnation}")
        self.epoch = -1
        self.consumer = ""
        self.table = SimTable(run.d.world, STATE, run.partitions)
        self.fenced = False
        self.zombie = False

    async def run(self) -> None:
        d = self.d
        self.epoch = await d._register(self.coordinators, PIPELINE)
        # From here on the older epochs are fenced: a commit of theirs asked for later must fail
        # (one asked for before may land first, and the registration waits for it to end).
        self.pipeline.registered_at.append((self.incarnation, d.now()))
        self.consumer = f"{PIPELINE}.e{self.epoch}"
        d._trace("pipeline_start", self.incarnation, self.epoch)
        for _ in range(LOAD_ATTEMPTS):
            if await self._load():
                break
            await asyncio.sleep(IDLE_S)
        else:
            raise RuntimeError(f"{self.consumer}: the state table did not load in {LOAD_ATTEMPTS} attempts")
        while not self.fenced and not self.pipeline.done():
            crash_at = d.rng.choice(CRASH_POINTS) if d.rng.random() < CRASH and d.quiet_since is None else None
            zombie_at = (d.rng.choice(CRASH_POINTS[:-1]) if crash_at is None and not self.zombie
                         and d.rng.random() < ZOMBIE and d.quiet_since is None else None)
            try:
                worked = await self.batch(crash_at, zombie_at)
            except _Crash:
                d._trace("pipeline_crash", self.incarnation, crash_at)
                self.pipeline.counts["crashes"] += 1
                d.world.loop.kill_owner(self.process)  # its calls on their way die with it (this task too)
                return
            if self.zombie:
                return  # its one batch as a zombie is over; the successor runs
            if not worked:
                await asyncio.sleep(IDLE_S)

    async def _load(self) -> bool:
        try:
            await self.table.load_async()
            return True
        except RaytxnError as error:
            self._table_error("load", error)
            return False

    def _table_error(self, what: str, error: RaytxnError) -> None:
        self.d.counts.error(error)
        if not retriable(error):
            self.pipeline.errors.append(f"table: {what} failed: {error!r}")

    def _point(self, name: str, crash_at: str | None, zombie_at: str | None) -> None:
        if name == crash_at:
            raise _Crash(name)
        if name == zombie_at:
            self.zombie = True
            self.pipeline.counts["zombies"] += 1
            self.pipeline.successor_now()

    def _refused(self, what: str, error: BaseException) -> None:
        d = self.d
        d._unexpected(f"{what} {self.consumer}", error)
        d.counts.error(error)
        if isinstance(error, Fenced):
            self.fenced = True
            self.pipeline.counts["fenced"] += 1

    async def batch(self, crash_at: str | None, zombie_at: str | None) -> bool:
        """One batch; False when there was nothing to do (or it gave up before its txn)."""
        d = self.d
        leases = await self._lease()
        if not leases:
            return False
        self._point("leased", crash_at, zombie_at)
        rows = await self._read(leases)
        if rows is None:
            await self._release(leases)
            return False
        self._point("read", crash_at, zombie_at)
        try:
            await self.table.refresh_async()
        except RaytxnError as error:
            self._table_error("refresh", error)
            await self._release(leases)
            return False
        held = self.table.items()
        read: dict[str, State] = {key: (0, None) if key not in held else decode_state(held[key]) for _, key, _ in rows}
        self._point("state_read", crash_at, zombie_at)
        if not d._may_begin():
            await self._release(leases)
            return False
        try:
            txn = await self.coordinators.new_txn_async(d.w.txn_timeout_ms, PIPELINE, self.epoch)
        except Exception as error:  # noqa: BLE001 - fenced, or the last txn still open (a crash left it)
            self._refused("new_txn", error)
            if not isinstance(error, ConcurrentTransactions | Fenced):
                self.pipeline.errors.append(f"error: new_txn {self.consumer}: {error!r}")
            await self._release(leases)
            return False
        machine = d._machine(txn)
        self._point("begun", crash_at, zombie_at)
        batch = Batch(txn, self.epoch, rows, read)
        self.pipeline.batches.append(batch)
        self.pipeline._last_work = d.now()
        await self._work(batch, machine, leases, crash_at, zombie_at)
        return True

    async def _work(self, batch: Batch, machine: TxnStateMachine, leases: list[Any], crash_at: str | None,
                    zombie_at: str | None) -> None:
        d, txn = self.d, batch.txn
        counts: dict[str, int] = Counter(key for _, key, _ in batch.inputs)
        lasts = {key: mid for _, key, mid in batch.inputs}
        sink = sorted({partition_for(key, self.pipeline.partitions) for key in counts})
        try:
            await self.coordinators.add_partitions_async(txn, [(SINK, p) for p in sink] + [(STATE, p) for p in sink],
                                                         self.epoch)
            await self.coordinators.add_subscriptions_async(
                txn, [(SRC, lease.partition, SUB_INPUT) for lease in leases], self.epoch)
        except Exception as error:  # noqa: BLE001 - fenced, timed out: the txn cannot commit
            self._refused("register", error)
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
        self._point("registered", crash_at, zombie_at)
        producer = f"{PIPELINE}-e{self.epoch}-t{txn.tc_id}-{txn.sequence}"
        by_partition: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for uid, key, _ in batch.inputs:
            by_partition[partition_for(key, self.pipeline.partitions)].append((f"o:{uid}", key))
        for partition, outputs in sorted(by_partition.items()):
            await self._send(batch, machine, producer, SINK, partition, outputs)
        self._point("outputs_sent", crash_at, zombie_at)
        for key in sorted(counts):
            value = encode_state(batch.read[key][0] + counts[key], lasts[key])
            await self._send(batch, machine, producer, STATE, partition_for(key, self.pipeline.partitions),
                             [(f"st:{txn.tc_id}.{txn.sequence}:{key}", key)], value)
        self._point("state_sent", crash_at, zombie_at)
        await self._ack(batch, machine, leases)
        self._point("acked", crash_at, zombie_at)
        commit = d.rng.random() >= d.w.abort
        batch.fenced_at = self._fenced_at()
        if commit:
            batch.commit_issued = d.now()
        if crash_at == "commit_sent":  # the process dies with its end call on its way
            issued = d.now()
            ending = d.world.loop.create_task(d.end(txn, machine, commit, self.coordinators, self.epoch, PIPELINE,
                                                    applied=True))
            await asyncio.sleep(d.rng.uniform(0.0, 0.01))
            if not ending.done():  # what it asked for may or may not have reached the coordinator
                record = d.history.txn_commit if commit else d.history.txn_abort
                record(txn, "unknown", d.now(), issued_at=issued)
                raise _Crash("commit_sent")
            await ending  # answered before the crash could land
        else:  # answered once applied, as StatefulPipeline's commit(until_applied=True): the next batch reads it
            await d.end(txn, machine, commit, self.coordinators, self.epoch, PIPELINE, applied=True)
        batch.fenced_at = self._fenced_at()
        self._point("committed", crash_at, zombie_at)

    def _fenced_at(self) -> float | None:
        """When an incarnation after this one registered, if one did."""
        later = [t for incarnation, t in self.pipeline.registered_at if incarnation > self.incarnation]
        return min(later) if later else None

    async def _send(self, batch: Batch, machine: TxnStateMachine, producer: str, topic: str, partition: int,
                    messages: list[tuple[str, str]], value: bytes | None = None) -> None:
        """Keyed sends of one partition in the batch's txn (each message's value its uid, or
        ``value``); none once the txn cannot commit."""
        d, txn = self.d, batch.txn
        if machine.state is not TxnClientState.OPEN:
            return
        batch.sent.update(uid for uid, _ in messages)
        first = d._sequences.get((producer, topic, partition), 0)
        d._sequences[producer, topic, partition] = first + len(messages)
        for uid, _ in messages:
            d.history.send(uid, topic, partition, txn, producer, d.now())
        records = [encode_message(MessageRecord(value if value is not None else uid.encode(), key))
                   for uid, key in messages]
        try:
            result = await d._ref(partition_actor_name(topic, partition)).call_async(
                "append", producer, first, records, txn, -1, deadline_s=d.call_deadline_s)
        except Exception as error:  # noqa: BLE001 - unknown outcome: the txn cannot commit
            self._refused(f"append {topic}", error)
            for uid, _ in messages:
                d.history.send_failed(uid, error, d.now(), producer=producer)
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
            return
        for index, (uid, _) in enumerate(messages):
            if result.position is None:
                d.history.send_failed(uid, "PositionUnknown", d.now(), producer=producer)
            else:
                d.history.send_ok(uid, MessageId(topic, partition, result.position.ledger_id,
                                                 result.position.entry_id, index), d.now(), producer=producer)

    # --- leases --------------------------------------------------------------------------------

    def _ref(self, partition: int) -> Any:
        return self.d._ref(subscription_actor_name(SRC, partition, SUB_INPUT))

    async def _lease(self) -> list[Any]:
        d = self.d
        leases = []
        for partition in range(self.pipeline.partitions):
            try:
                lease = await self._ref(partition).call_async(
                    "lease", PIPELINE, self.epoch, d.rng.randint(*MAX_ENTRIES), timeout_s=LEASE_TIMEOUT_S,
                    deadline_s=d.call_deadline_s)
            except Exception as error:  # noqa: BLE001 - fenced, or away past the deadline
                self._refused("lease", error)
                if self.fenced:
                    break
                continue
            if lease is not None:
                leases.append(_Leased(partition, lease))
        return leases

    async def _release(self, leases: list[Any]) -> None:
        for leased in leases:
            try:
                await self._ref(leased.partition).call_async("release_lease", leased.lease.lease_id, PIPELINE,
                                                             self.epoch, deadline_s=self.d.call_deadline_s)
            except Exception as error:  # noqa: BLE001 - expired or taken over meanwhile: it went out again
                self._refused("release_lease", error)

    async def _read(self, leases: list[Any]) -> list[tuple[str, str, MessageId]] | None:
        """The leased inputs, read from storage as a bulk task reads them (None: unreadable now)."""
        d = self.d
        rows = []
        for leased in leases:
            lease = leased.lease
            for _ in range(READ_ATTEMPTS):
                try:
                    batches = await read_range_async(d.world.storage, SRC, leased.partition, lease.start, lease.end,
                                                     lease.aborted,
                                                     columns=["key", "value", "ledger_id", "entry_id", "batch_index"])
                    break
                except StorageUnavailable as error:
                    d.counts.error(error)
                    await asyncio.sleep(0.05)
            else:
                return None
            for batch in batches:
                columns = batch.to_pydict()
                for key, value, ledger_id, entry_id, index in zip(
                        columns["key"], columns["value"], columns["ledger_id"], columns["entry_id"],
                        columns["batch_index"], strict=True):
                    mid = MessageId(SRC, leased.partition, ledger_id, entry_id, index)
                    rows.append((value.decode(), key, mid))
                    d.history.receive(self.consumer, SUB_INPUT, SRC, leased.partition, mid, value.decode(), 0, d.now())
        return rows

    async def _ack(self, batch: Batch, machine: TxnStateMachine, leases: list[Any]) -> None:
        d = self.d
        for leased in leases:
            last = [mid for _, _, mid in batch.inputs if mid.partition == leased.partition]
            if last:
                d.history.ack(self.consumer, SUB_INPUT, last[-1], batch.txn, d.now(), cumulative=True)
            d._requests += 1
            try:
                await self._ref(leased.partition).call_async(
                    "ack_lease", leased.lease.lease_id, PIPELINE, self.epoch, batch.txn,
                    request_id=f"{self.consumer}-{d._requests}", deadline_s=d.call_deadline_s)
            except Exception as error:  # noqa: BLE001 - the lease is not held any more: no commit
                self._refused("ack_lease", error)
                machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
        for uid, _, _ in batch.inputs:
            outputs = [f"o:{uid}"] if f"o:{uid}" in batch.sent else []
            d.history.consume_transform_produce(uid, outputs, batch.txn, subscription=SUB_INPUT, t=d.now())


@dataclass(frozen=True)
class _Leased:
    partition: int
    lease: Any


