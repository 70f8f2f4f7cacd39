"""The simulator's workload: producers, transactional producers with fencing, and
consume-transform-produce workers, recording a ``History`` for the exactly-once checker.

The client package runs on its own thread with Ray object refs, so it cannot run in the
simulator's loop unchanged. What runs here unchanged: ``CoordinatorClient`` (its routing and its
async calls ``begin_txn_async``/``new_txn_async``/``add_partitions_async``; its ``end_txn`` and
``register_transactional_id`` block, so their calls are made here, awaited, with the same
arguments), the ``ActorRef.call_async`` retry policy, ``TxnStateMachine`` for each transaction's
client-side state, and ``encode_plain``. The rest are thin callers of the actor methods with the
names and arguments the client uses: ``append`` as ``producer.py``'s resend path,
``subscribe``/``fetch``/``ack``/``redeliver`` as ``consumer.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raytxn.client.coordinator_client import CoordinatorClient
from raytxn.client.message import MessageId
from raytxn.client.producer import encode_plain
from raytxn.client.transaction import TxnClientState, TxnStateMachine
from raytxn.errors import (
    Fenced,
    InvalidTxnState,
    ParticipantEndFailed,
    RaytxnError,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionTimedOut,
)
from raytxn.hashing import partition_for
from raytxn.ids import Position, TxnID, coordinator_actor_name, partition_actor_name, subscription_actor_name
from raytxn.protocol.entry_format import MessageRecord, decode_message, encode_message
from raytxn.protocol.txnlog import EndAction
from raytxn.sim.keyshared import KEYS, KeyLog
from raytxn.sim.world import World
from raytxn.tools.history import History

TOPIC_IN, TOPIC_OUT = "in", "out"
SUB_PIPE, SUB_VERIFY = "cp", "verify"  # the pipeline's input subscription; the output's, drained at the end
CALL_DEADLINE_S = 30.0     # the client's deadline for one call (it retries within it)
FETCH_WAIT_S = 0.2
MAX_FETCH = 8
MAX_DRAIN_FETCHES = 10_000
MAX_REGISTER_ATTEMPTS = 100
REGISTER_RETRY_S = 1.0
IDLE_SLACK_S = 5.0         # with the txn timeout: how long idle workers wait for redeliveries
KEY_SHARED_JOIN_S = (0.1, 1.5)   # when the Key_Shared workers after the first subscribe
KEY_SHARED_CHURN = 0.03          # per poll: a Key_Shared worker leaves a partition and comes back
KEY_SHARED_AWAY_S = (0.0, 0.3)


def _value_uid(record: bytes) -> str:
    return decode_message(record).value.decode()


@dataclass(frozen=True)
class Workload:
    inputs: int = 56               # messages the pipeline moves, each in its own txn
    partitions: int = 2            # of each topic
    coordinators: int = 2
    workers: int = 2               # consume-transform-produce workers
    tid_producers: int = 2         # producers with a transactional id
    tid_txns: int = 18             # txns each of them runs
    txn_timeout_ms: int = 2000
    abort: float = 0.15            # a txn its worker aborts on purpose
    forget: float = 0.03           # a txn its worker leaves open: the coordinator times it out
    refence: float = 0.15          # a tid producer's successor registers mid-txn: the old one is a zombie
    # None: no cap. N: the clients begin no txn after the N-th (a shrunk schedule's knob: the run is
    # the uncapped one up to that txn, then the workload winds down; inputs left untransformed are
    # simply still on the pipeline's subscription, where the final drain finds them).
    max_txns: int | None = None
    # Off in the classic profiles (their traces stay as they are); see workloads.py:
    exclusive_turns: bool = False  # the pipeline's consumers: Exclusive ones taking turns, cumulative acks
    doomed_topics: int = 0         # topics deleted under the txns that write and ack there
    # Off in the classic profiles too; see pipelined.py (the real Producer, max_in_flight > 1):
    pipelined_producers: int = 0   # producers of keyed plain sends to the output, appends pipelined
    pipelined_messages: int = 60   # messages each of them sends
    client_crash: float = 0.0      # per producer incarnation: its client process crashes mid-run
    # per crash: the successor starts at once, racing the dead incarnation's appends still in the
    # network (which its producer epoch must fence), instead of after a restart delay
    client_restart_at_once: float = 0.0
    lease_holders: int = 0         # holders of range leases on the output's own subscription (leases.py)
    key_shared: bool = False       # keyed inputs, consumed through Key_Shared subscriptions (keyshared.py)
    # The pipeline's workers commit with commit_and_begin and run their next txn in the one it
    # began (runtime/client/txn_chain.py), registering what it lacks; an unused one is released.
    chain_begin: bool = False
    # When the coordinators answer a commit (CoordinatorConfig.commit_answer): "logged" answers
    # once COMMITTING is durable, and the markers reach the participants after the answer.
    commit_answer: str = "applied"
    # The pipeline from "in" to "out" and the tid producers writing "out" (off: neither topic
    # exists, for the workloads of their own below).
    pipeline: bool = True
    # Keyed writers on a compacted topic, compacting itself and compacted from outside, read by an
    # auditing subscription and a table (compaction.py); its txn writers are tid_producers of
    # tid_txns txns each, with abort, forget and refence.
    compaction: bool = False
    # A pipeline keeping keyed state in a compacted topic, committing outputs, state updates and
    # input acks in one txn of its transactional id, its incarnations crashing mid-batch and
    # left as zombies (stateful.py); it moves ``inputs`` inputs, aborting batches (``abort``).
    stateful: bool = False


@dataclass
class Counts:
    txns: int = 0
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    fenced: int = 0
    chained: int = 0  # txns a worker ran in the txn its previous commit began
    released: int = 0  # chained txns no worker took, aborted with release_unused
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, error: BaseException) -> None:
        name = type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


class Driver:
    def __init__(self, world: World, rng: random.Random, workload: Workload, history: History) -> None:
        self.world = world
        self.rng = rng
        self.w = workload
        self.history = history
        self.counts = Counts()
        self.unexpected: list[str] = []      # errors no client should ever see: the run fails
        self._coordinators = [world.network.ref(coordinator_actor_name(i)) for i in range(workload.coordinators)]
        self._sequences: dict[tuple[str, str, int], int] = {}   # (producer, topic, partition) -> next sequence
        self._requests = 0
        self.transformed: set[str] = set()   # input uids whose transform txn committed (membership only)
        self.quiet_since: float | None = None  # when the faults stopped
        self._worker_coordinators: dict[str, CoordinatorClient] = {}
        # worker -> the txn its last commit began, and the (partitions, subscriptions) registered with it
        self._chained: dict[str, tuple[TxnID, TxnStateMachine, tuple[list, list]]] = {}
        self.last_received = 0.0
        self.txns_started = 0  # txns the clients set out to begin (for max_txns)
        self.pipelined_acked: list[str] = []  # pipelined sends whose future resolved without error
        self.pipelined_failed: list[str] = []  # and those whose future failed: "uid: error"
        self.lease_acks: list[Any] = []        # leases.LeaseAck of every ack_lease that succeeded
        self.last_leased = 0.0                 # when a lease holder last read a message
        self.lease_read_errors: list[str] = []
        self.call_deadline_s = CALL_DEADLINE_S
        self.key_log = KeyLog()  # what the Key_Shared workers got, acked and gave back (keyshared.py)
        self.output_topic = TOPIC_OUT

    def workers_done(self) -> bool:
        """Every input transformed; or, once faults stopped, nothing received for longer than a
        txn can hold an input (an input lost or stuck shows in the final drain and the checker);
        or no txn may begin any more."""
        if len(self.transformed) >= self.w.inputs or self._txn_cap_reached():
            return True
        if self.quiet_since is None:
            return False
        idle_since = max(self.quiet_since, self.last_received)
        return self.now() - idle_since > 2 * self.w.txn_timeout_ms / 1000 + IDLE_SLACK_S

    def leases_done(self) -> bool:
        """``workers_done`` for the lease holders: once faults stopped, no leased message read for
        longer than a txn can hold one back; or no txn may begin any more."""
        if self._txn_cap_reached():
            return True
        if self.quiet_since is None:
            return False
        idle_since = max(self.quiet_since, self.last_leased)
        return self.now() - idle_since > 2 * self.w.txn_timeout_ms / 1000 + IDLE_SLACK_S

    def now(self) -> float:
        return self.world.loop.time()

    def _txn_cap_reached(self) -> bool:
        return self.w.max_txns is not None and self.txns_started >= self.w.max_txns

    def _may_begin(self) -> bool:
        """Called right before a client begins a txn: False once ``max_txns`` have been begun."""
        if self._txn_cap_reached():
            return False
        self.txns_started += 1
        return True

    def _ref(self, name: str) -> Any:
        return self.world.network.ref(name)

    def _trace(self, *fields: object) -> None:
        self.world.trace.add("driver", *fields)

    def _unexpected(self, where: str, error: BaseException) -> None:
        if not isinstance(error, RaytxnError):
            self.unexpected.append(f"{where}: {error!r}")

    # --- producing -------------------------------------------------------------------------

    async def append(self, producer: str, topic: str, partition: int, uids: list[str], txn: TxnID | None,
                     routing_key: str | None = None) -> bool:
        """One batch, as the producer's resend path sends it (``previous_sequence`` -1), recorded
        per message (all with the key ``routing_key``, if any); True when it is stored."""
        key = (producer, topic, partition)
        first = self._sequences.get(key, 0)
        self._sequences[key] = first + len(uids)
        for uid in uids:
            self.history.send(uid, topic, partition, txn, producer, self.now())
        records = [encode_plain(uid.encode()) if routing_key is None
                   else encode_message(MessageRecord(uid.encode(), routing_key)) for uid in uids]
        try:
            result = await self._ref(partition_actor_name(topic, partition)).call_async(
                "append", producer, first, records, txn, -1, deadline_s=CALL_DEADLINE_S)
        except Exception as error:  # noqa: BLE001 - the outcome is unknown: recorded so
            self._unexpected(f"append {uids[0]}", error)
            self.counts.error(error)
            for uid in uids:
                self.history.send_failed(uid, error, self.now(), producer=producer)
            return False
        for index, uid in enumerate(uids):
            if result.position is None:
                self.history.send_failed(uid, "PositionUnknown", self.now(), producer=producer)
            else:
                self.history.send_ok(uid, MessageId(topic, partition, result.position.ledger_id,
                                                    result.position.entry_id, index), self.now(),
                                     producer=producer)
        return True

    async def seed_inputs(self) -> None:
        """The pipeline's input: plain sends, a few messages per batch."""
        i = 0
        while i < self.w.inputs:
            count = min(self.rng.randint(1, 3), self.w.inputs - i)
            partition = self.rng.randrange(self.w.partitions)
            uids = [f"in-{j}" for j in range(i, i + count)]
            key = None
            if self.w.key_shared:  # a key per batch, routed as the producer routes keys
                key = f"k{self.rng.randrange(KEYS)}"
                partition = partition_for(key, self.w.partitions)
                self.key_log.keys.update(dict.fromkeys(uids, key))
            await self.append("seeder", TOPIC_IN, partition, uids, None, key)
            i += count

    # --- ending transactions ---------------------------------------------------------------

    def coordinator_client(self, owner: str) -> CoordinatorClient:
        """The client's own routing (round-robin begins, a transactional id's home coordinator)
        over the simulated network."""
        return CoordinatorClient(self.w.coordinators, owner, CALL_DEADLINE_S, actor_refs=self.world.network.ref)

    async def end(self, txn: TxnID, machine: TxnStateMachine, commit: bool, coordinators: CoordinatorClient,
                  epoch: int | None = None, tid: str | None = None,
                  chain: tuple[list, list] | None = None, release: bool = False,
                  applied: bool = False) -> TxnID | None:
        """Commit (unless the client's state machine says it cannot) or abort, as
        ``Transaction.commit``/``abort`` do, and record the outcome. With ``chain`` (partitions,
        subscriptions) a commit is ``commit_and_begin``: returns the next txn it began, if any.
        With ``release`` the abort is ``release_unused``, as a client's unused chained txn's; with
        ``applied`` a commit is answered once applied (``Transaction.commit(until_applied=True)``)."""
        if commit and machine.state is not TxnClientState.OPEN:
            commit = False  # ABORT_ONLY or TIMED_OUT: the client aborts instead
        issued = self.now()
        machine.transition_to(TxnClientState.COMMITTING if commit else TxnClientState.ABORTING)
        action = EndAction.COMMIT if commit else EndAction.ABORT
        record = self.history.txn_commit if commit else self.history.txn_abort
        try:
            # CoordinatorClient.end_txn's (or commit_and_begin's) call, awaited (its own is blocking).
            next_txn = None
            if commit and chain is not None:
                state, next_txn = await coordinators.ref(txn.tc_id).call_async(
                    "commit_and_begin", txn, coordinators.owner, self.w.txn_timeout_ms, *chain,
                    deadline_s=coordinators.deadline_s)
            elif release:
                assert not commit
                state = await coordinators.ref(txn.tc_id).call_async("release_unused", txn, coordinators.owner,
                                                                     deadline_s=coordinators.deadline_s)
            else:
                applying = (applied,) if applied else ()  # (as CoordinatorClient.end_txn sends it: only when set)
                state = await coordinators.ref(txn.tc_id).call_async("end_txn", txn, action, coordinators.owner, epoch,
                                                                     tid, *applying, deadline_s=coordinators.deadline_s)
        except (TransactionTimedOut, InvalidTxnState) as error:
            # Timed out, or ended the other way already: the coordinator's answer names it (any
            # other state conflict leaves the outcome to the checker).
            outcome = ("committed" if isinstance(error, TransactionAlreadyCommitted) else
                       "aborted" if isinstance(error, TransactionTimedOut | TransactionAlreadyAborted) else "unknown")
            self._trace("end_refused", str(txn), type(error).__name__)
            record(txn, outcome, self.now(), issued_at=issued)
            self._count(outcome)
            return None
        except Exception as error:  # noqa: BLE001 - fenced, or the coordinator away past the deadline
            self._unexpected(f"end {txn}", error)
            self.counts.error(error)
            if isinstance(error, Fenced):
                self.counts.fenced += 1
            self._trace("end_unknown", str(txn), type(error).__name__)
            machine.transition_to(TxnClientState.ERROR, if_allowed=True)
            record(txn, "unknown", self.now(), issued_at=issued)
            self._count("unknown")
            return None
        outcome = "committed" if state == "COMMITTED" else "aborted"
        if commit and outcome == "committed":
            machine.transition_to(TxnClientState.COMMITTED)
        elif commit:
            machine.transition_to(TxnClientState.ABORTING)
            machine.transition_to(TxnClientState.ABORTED)
        elif outcome == "aborted":
            machine.transition_to(TxnClientState.ABORTED)
        record(txn, outcome, self.now(), issued_at=issued)
        self._count(outcome)
        return next_txn if outcome == "committed" else None

    def _count(self, outcome: str) -> None:
        if outcome == "committed":
            self.counts.committed += 1
        elif outcome == "aborted":
            self.counts.aborted += 1
        else:
            self.counts.unknown += 1

    def _machine(self, txn: TxnID) -> TxnStateMachine:
        self.counts.txns += 1
        self.history.txn_begin(txn, self.now())
        return TxnStateMachine(txn, self.now() + self.w.txn_timeout_ms / 1000, clock=self.now)

    # --- transactional producers with fencing ----------------------------------------------

    async def tid_producer(self, index: int) -> None:
        tid = f"tp-{index}"
        coordinators = self.coordinator_client(f"owner-{tid}")
        epoch = await self._register(coordinators, tid)
        for n in range(self.w.tid_txns):
            if not self._may_begin():
                break
            try:
                txn = await coordinators.new_txn_async(self.w.txn_timeout_ms, tid, epoch)
            except Exception as error:  # noqa: BLE001 - e.g. the last txn of the id not ended yet
                self._unexpected(f"new_txn {tid}", error)
                self.counts.error(error)
                if isinstance(error, Fenced):  # another instance took the id: start over, as a new one
                    epoch = await self._register(coordinators, tid)
                continue
            machine = self._machine(txn)
            partition = self.rng.randrange(self.w.partitions)
            zombie = self.rng.random() < self.w.refence
            if zombie:
                # The producer's successor registers now: the open txn is aborted, the epoch bumped,
                # and this (old) producer goes on with its stale epoch, as a zombie would.
                epoch_next = await self._register(coordinators, tid)
                self._trace("refenced", tid, epoch, epoch_next)
            await self._fill(txn, machine, coordinators, epoch, [(TOPIC_OUT, partition)],
                             f"{tid}-e{epoch}", partition, [f"{tid}-{n}-{k}" for k in range(self.rng.randint(1, 3))])
            await self.end(txn, machine, self.rng.random() >= self.w.abort, coordinators, epoch, tid)
            if zombie:
                epoch = epoch_next

    async def _register(self, coordinators: CoordinatorClient, tid: str) -> int:
        """Register ``tid`` (a new producer instance). ``ParticipantEndFailed``: the epoch was
        bumped, but a participant refused the abort of the id's open txn; the coordinator's
        contract is that a retry drives it again, so the producer retries, as an application would."""
        for _ in range(MAX_REGISTER_ATTEMPTS):
            try:
                # CoordinatorClient.register_transactional_id's call, awaited, without a deadline.
                return await coordinators.ref(coordinators.home_of(tid)).call_async(
                    "register_transactional_id", tid, deadline_s=None)
            except ParticipantEndFailed as error:
                self.counts.error(error)
                self._trace("register_refused", tid)
                await asyncio.sleep(REGISTER_RETRY_S)
        raise RuntimeError(f"{tid}: register_transactional_id refused {MAX_REGISTER_ATTEMPTS} times")

    async def _fill(self, txn: TxnID, machine: TxnStateMachine, coordinators: CoordinatorClient, epoch: int | None,
                    partitions: list[tuple[str, int]], producer: str, partition: int, uids: list[str]) -> None:
        try:
            await coordinators.add_partitions_async(txn, partitions, epoch)
        except Exception as error:  # noqa: BLE001 - fenced, timed out: the client's txn is ABORT_ONLY
            self._unexpected(f"add_partitions {txn}", error)
            self.counts.error(error)
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)
            return
        if not await self.append(producer, TOPIC_OUT, partition, uids, txn):
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=RuntimeError("send failed"), if_allowed=True)

    # --- consume-transform-produce ---------------------------------------------------------

    def _subscription(self, topic: str, partition: int, name: str) -> Any:
        return self._ref(subscription_actor_name(topic, partition, name))

    async def _subscribe(self, consumer: str, partition: int) -> None:
        await self._subscription(TOPIC_IN, partition, SUB_PIPE).call_async(
            "subscribe", consumer, consumer, "Key_Shared" if self.w.key_shared else "Shared", deadline_s=None)

    async def worker(self, index: int) -> None:
        consumer = f"w{index}"
        self._worker_coordinators[consumer] = self.coordinator_client(f"owner-{consumer}")
        if self.w.key_shared and index > 0:  # joins late: keys move to it from the others
            await asyncio.sleep(self.rng.uniform(*KEY_SHARED_JOIN_S))
        for partition in range(self.w.partitions):
            await self._subscribe(consumer, partition)
        self.history.subscribe(consumer, SUB_PIPE, TOPIC_IN, self.now(), from_earliest=True)
        polls = 0
        while not self.workers_done():
            polls += 1
            partition = polls % self.w.partitions
            if self.w.key_shared and self.rng.random() < KEY_SHARED_CHURN:
                await self._leave_and_rejoin(consumer, partition)
            try:
                reply = await self._subscription(TOPIC_IN, partition, SUB_PIPE).call_async(
                    "fetch", consumer, MAX_FETCH, FETCH_WAIT_S, deadline_s=CALL_DEADLINE_S)
            except Exception as error:  # noqa: BLE001 - as the consumer's fetch loop: try again
                self._unexpected(f"fetch {consumer}", error)
                self.counts.error(error)
                continue
            if not reply["registered"]:
                self.key_log.reset(consumer, partition, self.now())
                await self._subscribe(consumer, partition)
                self.history.reset(consumer, SUB_PIPE, self.now())
                continue
            messages = list(self._received(consumer, partition, reply["messages"], reply["generation"][0]))
            if not messages:
                self.history.receive_timeout(consumer, SUB_PIPE, self.now(), topic=TOPIC_IN)
            for message in messages:
                await self.transform(consumer, partition, *message)
        await self.abort_chained(consumer)
        for partition in range(self.w.partitions):
            # Closing gives back what it still holds (a capped run leaves inputs it never took).
            self.key_log.reset(consumer, partition, self.now())
            await self._subscription(TOPIC_IN, partition, SUB_PIPE).call_async(
                "close_consumer", consumer, deadline_s=None)

    def _received(self, consumer: str, partition: int, wire: list, incarnation: int) -> Any:
        for ledger_id, entry_id, batch_size, _publish_ms, indexes, counts, records in wire:
            for k, batch_index in enumerate(indexes):
                uid = decode_message(records[k]).value.decode()
                mid = MessageId(TOPIC_IN, partition, ledger_id, entry_id, batch_index)
                self.history.receive(consumer, SUB_PIPE, TOPIC_IN, partition, mid, uid,
                                     counts[k] if counts else 0, self.now())
                self.key_log.received(consumer, mid, uid, self.now(), incarnation)
                self.last_received = self.now()
                yield mid, uid, batch_size

    async def transform(self, consumer: str, partition: int, mid: MessageId, uid: str, batch_size: int) -> None:
        """One input moved to the output and acked, in one txn (begun lazily with both
        participants, as the client's first registration does)."""
        if not self._may_begin():
            return  # left unacked: redelivered once the worker closes, and drained at the end
        out_partition = self.rng.randrange(self.w.partitions)
        coordinators = self._worker_coordinators[consumer]
        wanted = ([(TOPIC_OUT, out_partition)], [(TOPIC_IN, partition, SUB_PIPE)])
        try:
            chained = self._chained.pop(consumer, None)
            if chained is not None:
                txn, machine, registered = chained
                self.counts.chained += 1
                await self._register_missing(coordinators, txn, wanted, registered)
            else:
                txn = await coordinators.begin_txn_async(self.w.txn_timeout_ms, *wanted)
                machine = self._machine(txn)
        except Exception as error:  # noqa: BLE001 - the input stays unacked: redelivered later
            self._unexpected("begin_txn", error)
            self.counts.error(error)
            if chained is not None:  # as the client's: a failed registration makes it abort-only
                await self.end(txn, machine, False, coordinators)
            await self._give_back(consumer, partition, mid)
            return
        # The same output uid for every attempt of this worker (a second commit would show twice);
        # per worker, because the history resolves a uid's attempts oldest first, and two workers'
        # attempts (after a timeout redelivered the input) may resolve out of order.
        out_uid = f"{uid}>{consumer}"
        if not await self.append(f"w-{consumer}", TOPIC_OUT, out_partition, [out_uid], txn):
            # As the client's transaction: a failed send makes it ABORT_ONLY (commit aborts it).
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=RuntimeError("send failed"), if_allowed=True)
        self.history.ack(consumer, SUB_PIPE, mid, txn, self.now())
        self.key_log.acked(consumer, mid, self.now())
        await self.ack_in_txn(self._subscription(TOPIC_IN, partition, SUB_PIPE), consumer, mid, batch_size,
                              False, txn, machine)
        self.history.consume_transform_produce(uid, [out_uid], txn, subscription=SUB_PIPE, t=self.now())
        ending = self.now()
        if await self.finish(txn, machine, coordinators, chain_for=consumer, participants=wanted):
            self.transformed.add(uid)
            self.key_log.settled(mid, ending)

    async def ack_in_txn(self, ref: Any, consumer: str, mid: MessageId, batch_size: int, cumulative: bool,
                         txn: TxnID, machine: TxnStateMachine) -> None:
        """One ack call in ``txn``, with a request id (retries of it are safe); a refused or
        unanswered one leaves the txn unable to commit, as the client's transaction does."""
        self._requests += 1
        try:
            acks, runs = [(Position(mid.ledger_id, mid.entry_id), mid.batch_index, batch_size)], None
            if not cumulative and batch_size > 1:  # as the client's ack groups send a batch index
                acks, runs = [], [(mid.ledger_id, mid.entry_id, batch_size, mid.batch_index, mid.batch_index)]
            await ref.call_async("ack", consumer, acks, cumulative, txn, deadline_s=CALL_DEADLINE_S,
                                 request_id=f"{consumer}-{self._requests}", ranges=None, runs=runs)
        except Exception as error:  # noqa: BLE001 - conflict or away: the txn cannot commit
            self._unexpected(f"ack {txn}", error)
            self.counts.error(error)
            machine.transition_to(TxnClientState.ABORT_ONLY, cause=error, if_allowed=True)

    async def finish(self, txn: TxnID, machine: TxnStateMachine, coordinators: CoordinatorClient,
                     chain_for: str | None = None, participants: tuple[list, list] | None = None) -> bool:
        """Leave ``txn`` open now and then (``forget``: its timeout ends it), else end it,
        aborting it now and then on purpose; True when it committed. With ``chain_for`` (a
        worker, when the workload chains begins) a commit begins that worker's next txn with
        ``participants``."""
        if self.rng.random() < self.w.forget:
            self._trace("forgotten", str(txn))
            return False  # never ended by its client: the coordinator times it out
        chain = participants if self.w.chain_begin and chain_for is not None else None
        next_txn = await self.end(txn, machine, self.rng.random() >= self.w.abort, coordinators, chain=chain)
        if next_txn is not None:
            assert chain_for is not None
            self._chained[chain_for] = (next_txn, self._machine(next_txn), chain)
        return machine.state is TxnClientState.COMMITTED

    async def _register_missing(self, coordinators: CoordinatorClient, txn: TxnID, wanted: tuple[list, list],
                                registered: tuple[list, list]) -> None:
        """A chained txn's registrations of the participants its commit did not register, as the
        client's ``register`` makes them before a send or ack (it knows what the commit registered)."""
        if missing := [p for p in wanted[0] if p not in registered[0]]:
            await coordinators.add_partitions_async(txn, missing)
        if missing := [s for s in wanted[1] if s not in registered[1]]:
            await coordinators.add_subscriptions_async(txn, missing)

    async def abort_chained(self, consumer: str) -> None:
        """A worker's chained txn nobody will use: aborted, as the client's expiry does."""
        chained = self._chained.pop(consumer, None)
        if chained is not None:
            txn, machine, _ = chained
            self.counts.released += 1
            await self.end(txn, machine, False, self._worker_coordinators[consumer], release=True)

    async def _give_back(self, consumer: str, partition: int, mid: MessageId) -> None:
        self.key_log.released(consumer, mid, self.now())
        try:
            await self._subscription(TOPIC_IN, partition, SUB_PIPE).call_async(
                "redeliver", consumer, [(Position(mid.ledger_id, mid.entry_id), mid.batch_index)],
                deadline_s=CALL_DEADLINE_S)
        except Exception as error:  # noqa: BLE001 - the subscription restarted: it redelivers anyway
            self.counts.error(error)

    async def _leave_and_rejoin(self, consumer: str, partition: int) -> None:
        """Key_Shared churn: close this partition's consumer (what it holds goes back, its keys
        move to the others) and subscribe again a moment later (some keys move back)."""
        self._trace("leave", consumer, partition)
        self.key_log.reset(consumer, partition, self.now())
        self.history.reset(consumer, SUB_PIPE, self.now())
        try:
            await self._subscription(TOPIC_IN, partition, SUB_PIPE).call_async(
                "close_consumer", consumer, deadline_s=CALL_DEADLINE_S)
        except Exception as error:  # noqa: BLE001 - away: its restart forgets the consumer anyway
            self._unexpected(f"close {consumer}", error)
            self.counts.error(error)
        await asyncio.sleep(self.rng.uniform(*KEY_SHARED_AWAY_S))
        await self._subscribe(consumer, partition)

    # --- the end ---------------------------------------------------------------------------

    async def drain(self, topic: str, subscription: str, uid_of: Callable[[bytes], str] = _value_uid) -> None:
        """Every message still unacked on ``subscription``, from a fresh consumer, as the
        history's final state (``uid_of``: a message's uid, from its record)."""
        consumer = f"drain-{subscription}"
        found: list[tuple[int, MessageId, str]] = []
        for partition in range(self.w.partitions):
            ref = self._subscription(topic, partition, subscription)
            await ref.call_async("subscribe", consumer, consumer, "Shared", deadline_s=None)
            empty = 0
            for _ in range(MAX_DRAIN_FETCHES):
                reply = await ref.call_async("fetch", consumer, 1000, 0.5, deadline_s=None)
                if not reply["registered"]:  # the subscription restarted (or passivated) and forgot it
                    await ref.call_async("subscribe", consumer, consumer, "Shared", deadline_s=None)
                    empty = 0
                    continue
                if not reply["messages"]:
                    empty += 1
                    if empty >= 3:
                        break
                    continue
                empty = 0
                for ledger_id, entry_id, _size, _ms, indexes, _counts, records in reply["messages"]:
                    for k, batch_index in enumerate(indexes):
                        uid = uid_of(records[k])
                        found.append((partition, MessageId(topic, partition, ledger_id, entry_id, batch_index), uid))
            else:
                raise AssertionError(f"drain of {subscription} on {topic}-{partition} never ended")
        self.history.final_state(subscription, topic, found, partitions=range(self.w.partitions), t=self.now())

    async def live_txns(self) -> list[str]:
        """Transactions still live at any coordinator."""
        live: list[str] = []
        for coordinator in self._coordinators:
            rows = await coordinator.call_async("list_txns", 1000, 0, deadline_s=None)
            live.extend(row["txn"] for row in rows)
        return live

    async def low_watermarks(self) -> list[tuple[int, int]]:
        """Per coordinator: (low watermark, next sequence)."""
        marks = []
        for coordinator in self._coordinators:
            stats = await coordinator.call_async("stats", deadline_s=None)
            marks.append((stats["low_watermark"], stats["next_sequence"]))
        return marks

