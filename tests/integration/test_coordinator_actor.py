"""Coordinator actors on a real local Ray with a file:// transaction log, reaching stand-in
participant actors by their partition/subscription names."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import ray

from raytxn.client.coordinator_client import CoordinatorClient
from raytxn.cluster import start_coordinators, stop_actor
from raytxn.config import CoordinatorConfig, EngineConfig
from raytxn.errors import (
    Fenced,
    InvalidArgument,
    NotAllowed,
    ParticipantEndFailed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionNotFound,
    TransactionTimedOut,
)
from raytxn.hashing import coordinator_for
from raytxn.ids import NAMESPACE, TxnID, coordinator_actor_name, partition_actor_name, subscription_actor_name
from raytxn.ledger import chunk_path
from raytxn.ledger.metadata import read_metadata
from raytxn.ledger.storage import Storage
from raytxn.protocol.txnlog import EndAction
from raytxn.tools.testing import start_participant

pytestmark = pytest.mark.ray

STALLED_END_RETRY_S = 1.5  # this module's coordinators drive a refused end again this often


@dataclass
class Env:
    config: EngineConfig
    client: CoordinatorClient
    topic: str
    participants: dict[str, object]

    def tc(self, tc_id: int) -> object:
        return ray.get_actor(coordinator_actor_name(tc_id), namespace=NAMESPACE)

    def calls(self, name: str) -> list[tuple[TxnID, EndAction, int]]:
        return ray.get(self.participants[name].calls.remote())

    def restart(self, tc_id: int) -> dict:
        """Kill the coordinator's process; Ray restarts it and it recovers from its log. Waits
        for the new incarnation: a `ready` sent right after the kill may still be answered by the
        dying one, and then nobody would have started the new one's recovery."""
        before = self.wait_ready(tc_id)["incarnation"]
        ray.kill(self.tc(tc_id), no_restart=False)
        deadline = time.monotonic() + 60
        while (ready := self.wait_ready(tc_id))["incarnation"] == before:
            assert time.monotonic() < deadline, f"coordinator {tc_id} did not restart"
            time.sleep(0.05)
        return ready

    def wait_ready(self, tc_id: int) -> dict:
        return self.client.ref(tc_id).call("ready", deadline_s=60)


@pytest.fixture(scope="module")
def coordinators(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineConfig]:
    """Two coordinators shared by the module's tests (each test uses its own topic)."""
    config = EngineConfig(storage_url=f"file://{tmp_path_factory.mktemp('coordinators')}",
                          coordinator=CoordinatorConfig(num_coordinators=2,
                                                        slow_txn_threshold_ms=1000,
                                                        stalled_end_retry_s=STALLED_END_RETRY_S))
    start_coordinators(config)
    try:
        yield config
    finally:
        for tc_id in range(2):
            stop_actor(coordinator_actor_name(tc_id))


@pytest.fixture(scope="module")
def participants(coordinators: EngineConfig) -> Iterator[tuple[str, dict[str, object]]]:
    """Stand-in participants of one topic, shared by the module; reset before each test."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    names = [partition_actor_name(topic, 0), partition_actor_name(topic, 1),
             subscription_actor_name(topic, 0, "sub")]
    handles = {name: start_participant(name) for name in names}
    try:
        yield topic, handles
    finally:
        for name in names:
            stop_actor(name)


@pytest.fixture
def env(coordinators: EngineConfig, participants: tuple[str, dict[str, object]]) -> Env:
    topic, handles = participants
    ray.get([p.reset.remote() for p in handles.values()])
    return Env(coordinators, CoordinatorClient(2, owner="alice", deadline_s=60), topic, handles)


def test_commit_reaches_every_participant(env: Env) -> None:
    txn = env.client.new_txn(timeout_ms=30_000)
    env.client.add_partitions(txn, [(env.topic, 0), (env.topic, 1)])
    env.client.add_partitions(txn, [(env.topic, 0)])  # repeated: nothing new
    env.client.add_subscriptions(txn, [(env.topic, 0, "sub")])
    assert env.client.get_txn(txn)["state"] == "OPEN"
    committed_before = env.client.stats()[txn.tc_id]["committed_total"]
    assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"
    for name in env.participants:
        calls = env.calls(name)
        assert [(t, a) for t, a, _ in calls] == [(txn, "COMMIT")]
        assert calls[0][2] < txn.sequence  # the low watermark never covers a live txn
    assert env.client.get_txn(txn)["state"] == "COMMITTED"
    # idempotent for the same action, an error for the opposite one
    assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"
    with pytest.raises(TransactionAlreadyCommitted):
        env.client.end_txn(txn, EndAction.ABORT)
    stats = env.client.stats()[txn.tc_id]
    assert stats["committed_total"] == committed_before + 1
    assert all(row["txn"] != str(txn) for row in stats["slowest_txns"])


def test_a_participant_is_looked_up_when_a_txn_registers_it_not_at_its_end(env: Env) -> None:
    """A coordinator looks up a participant it has no reference to, and has Ray connect to it
    (one ``ready`` call), in a worker thread as soon as a txn registers it (``ActorRef.prefetch``):
    for an actor its process never called that took 30-80 ms, which a commit would otherwise
    wait for, with the coordinator's loop blocked."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    name = partition_actor_name(topic, 0)
    participant = start_participant(name)
    try:
        txn = env.client.new_txn(timeout_ms=30_000)
        assert ray.get(participant.readies.remote()) == 0
        env.client.add_partitions(txn, [(topic, 0)])
        deadline = time.monotonic() + 20
        while ray.get(participant.readies.remote()) == 0:  # before any end: the txn is open
            assert time.monotonic() < deadline, "the coordinator never looked the participant up"
            time.sleep(0.05)
        assert ray.get(participant.calls.remote()) == []
        assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"
        assert [(t, a) for t, a, _ in ray.get(participant.calls.remote())] == [(txn, "COMMIT")]
        # Registered again at the same coordinator, it is not looked up again.
        again = env.client.new_txn(timeout_ms=30_000)
        while again.tc_id != txn.tc_id:  # round-robin: at most one turn of the coordinators
            env.client.end_txn(again, EndAction.ABORT)
            again = env.client.new_txn(timeout_ms=30_000)
        env.client.add_partitions(again, [(topic, 0)])
        assert env.client.end_txn(again, EndAction.COMMIT) == "COMMITTED"
        assert ray.get(participant.readies.remote()) == 1
    finally:
        stop_actor(name)


def test_abort_and_errors(env: Env) -> None:
    txn = env.client.new_txn()
    env.client.add_partitions(txn, [(env.topic, 1)])
    assert env.client.end_txn(txn, EndAction.ABORT) == "ABORTED"
    assert [(t, a) for t, a, _ in env.calls(partition_actor_name(env.topic, 1))] == [(txn, "ABORT")]
    assert env.calls(partition_actor_name(env.topic, 0)) == []
    with pytest.raises(TransactionAlreadyAborted):
        env.client.end_txn(txn, EndAction.COMMIT)
    with pytest.raises(TransactionNotFound):
        env.client.end_txn(TxnID(txn.tc_id, 10_000), EndAction.COMMIT)
    with pytest.raises(TransactionNotFound):
        env.client.get_txn(TxnID(txn.tc_id, 10_000))


def test_round_robin_and_routing(env: Env) -> None:
    before = sum(s["committed_total"] for s in env.client.stats())
    txns = [env.client.new_txn() for _ in range(6)]
    assert [t.tc_id for t in txns] == [0, 1, 0, 1, 0, 1]
    for txn in txns:
        assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"
    assert sum(s["committed_total"] for s in env.client.stats()) == before + 6


def test_only_the_owner_may_change_a_txn_also_after_restart(env: Env) -> None:
    txn = env.client.new_txn()
    mallory = CoordinatorClient(2, owner="mallory")
    with pytest.raises(NotAllowed):
        mallory.add_partitions(txn, [(env.topic, 0)])
    with pytest.raises(NotAllowed):
        mallory.end_txn(txn, EndAction.ABORT)
    env.restart(txn.tc_id)
    with pytest.raises(NotAllowed):
        mallory.end_txn(txn, EndAction.COMMIT)
    assert env.client.get_txn(txn)["state"] == "OPEN"
    assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"


def test_timeout_aborts_and_later_calls_get_timed_out(env: Env) -> None:
    txn = env.client.new_txn(timeout_ms=300)
    env.client.add_partitions(txn, [(env.topic, 0)])
    deadline = time.monotonic() + 10
    while not env.calls(partition_actor_name(env.topic, 0)):
        assert time.monotonic() < deadline, "timeout never aborted the txn"
        time.sleep(0.05)
    assert [(t, a) for t, a, _ in env.calls(partition_actor_name(env.topic, 0))] == [(txn, "ABORT")]
    with pytest.raises(TransactionTimedOut):
        env.client.end_txn(txn, EndAction.COMMIT)
    with pytest.raises(TransactionTimedOut):
        env.client.add_partitions(txn, [(env.topic, 1)])
    assert env.client.stats()[txn.tc_id]["timed_out_total"] >= 1


def test_open_txn_deadline_rearmed_after_restart(env: Env) -> None:
    # Long enough for Ray to restart the process (about 2 s, more on a loaded CI machine: with
    # 1.5 s the txn was sometimes aborting already when the new incarnation first answered).
    txn = env.client.new_txn(timeout_ms=6000)
    env.client.add_partitions(txn, [(env.topic, 1)])
    env.restart(txn.tc_id)
    assert env.client.get_txn(txn)["state"] == "OPEN"
    deadline = time.monotonic() + 20
    while env.client.get_txn(txn)["state"] != "ABORTED":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [(t, a) for t, a, _ in env.calls(partition_actor_name(env.topic, 1))] == [(txn, "ABORT")]


@pytest.mark.parametrize("point", ["coordinator.after_log_committing", "coordinator.after_send_end",
                                   "coordinator.before_log_complete", "coordinator.complete_lingering",
                                   "coordinator.after_log_complete"])
def test_crash_at_each_step_of_commit_ends_committed(env: Env, point: str) -> None:
    txn = env.client.new_txn()
    env.client.add_partitions(txn, [(env.topic, 0), (env.topic, 1)])
    env.client.add_subscriptions(txn, [(env.topic, 0, "sub")])
    before = env.wait_ready(txn.tc_id)
    ray.get(env.tc(txn.tc_id).arm_fault.remote(point, "crash"))
    assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"  # rides over the crash
    # The points from after_send_end on come after the answer (every participant has the end by
    # then; the COMMITTED record is logged off the caller's path): the crash may land just after.
    deadline = time.monotonic() + 30
    while env.wait_ready(txn.tc_id)["incarnation"] == before["incarnation"]:
        assert time.monotonic() < deadline, "the fault point was never hit"
        time.sleep(0.05)
    for name in env.participants:
        actions = {a for t, a, _ in env.calls(name) if t == txn}
        assert actions == {"COMMIT"}, f"{name} got {actions}"
    assert env.client.get_txn(txn)["state"] == "COMMITTED"
    # the sequence counter survives: a new txn gets a fresh sequence
    fresh = env.client.new_txn()
    assert fresh.tc_id != txn.tc_id or fresh.sequence > txn.sequence


def test_crash_after_log_aborting_ends_aborted(env: Env) -> None:
    txn = env.client.new_txn()
    env.client.add_partitions(txn, [(env.topic, 0)])
    ray.get(env.tc(txn.tc_id).arm_fault.remote("coordinator.after_log_aborting", "crash"))
    assert env.client.end_txn(txn, EndAction.ABORT) == "ABORTED"
    assert {a for t, a, _ in env.calls(partition_actor_name(env.topic, 0)) if t == txn} == {"ABORT"}


def test_failing_and_restarting_participants_do_not_leave_a_txn_half_ended(env: Env) -> None:
    txn = env.client.new_txn()
    env.client.add_partitions(txn, [(env.topic, 0), (env.topic, 1)])
    flaky = env.participants[partition_actor_name(env.topic, 0)]
    ray.get(flaky.fail_next.remote(3))
    retries_before = env.client.stats()[txn.tc_id]["end_retries"]
    assert env.client.end_txn(txn, EndAction.COMMIT) == "COMMITTED"
    assert env.client.stats()[txn.tc_id]["end_retries"] >= retries_before + 3
    assert [(t, a) for t, a, _ in env.calls(partition_actor_name(env.topic, 0))] == [(txn, "COMMIT")]

    # a participant that is gone for a while: the end waits for it, then completes
    txn2 = env.client.new_txn()
    env.client.add_partitions(txn2, [(env.topic, 1)])
    name = partition_actor_name(env.topic, 1)
    stop_actor(name)
    # The action as a plain str, as a caller outside the package may send it: accepted too.
    pending = env.client.ref(txn2.tc_id).handle().end_txn.remote(txn2, "COMMIT", "alice", None)
    time.sleep(0.5)
    assert env.client.get_txn(txn2)["state"] == "COMMITTING"
    env.participants[name] = start_participant(name)
    assert ray.get(pending, timeout=30) == "COMMITTED"
    assert [(t, a) for t, a, _ in env.calls(name)] == [(txn2, "COMMIT")]


def test_participant_refusing_an_end_is_counted_and_driven_again_later(env: Env) -> None:
    """A non-retriable refusal stalls the txn in COMMITTING (never reversed: the other participant
    keeps its COMMIT). It is not retried at once (a retry would meet the same refusal), but driven
    again every ``stalled_end_retry_s`` and on the next end_txn, until the participant takes it."""
    txn = env.client.new_txn()
    env.client.add_partitions(txn, [(env.topic, 0), (env.topic, 1)])
    name, other = partition_actor_name(env.topic, 0), partition_actor_name(env.topic, 1)
    broken = env.participants[name]
    ray.get(broken.fail_next.remote(3, refuse=True))
    failures_before = env.client.stats()[txn.tc_id]["end_failures"].get("InvalidTxnState", 0)
    with pytest.raises(ParticipantEndFailed):
        env.client.end_txn(txn, "COMMIT")
    time.sleep(0.5)  # a retrying end would have called again many times (its backoff starts at 20 ms)
    assert ray.get(broken.attempts.remote()) == 1
    stats = env.client.stats()[txn.tc_id]
    assert stats["end_failures"]["InvalidTxnState"] == failures_before + 1
    assert "InvalidTxnState" in stats["stalled_ends"][str(txn)]
    assert env.client.get_txn(txn)["state"] == "COMMITTING"
    assert [(t, a) for t, a, _ in env.calls(other)] == [(txn, "COMMIT")]
    with pytest.raises(ParticipantEndFailed):  # an explicit end drives it again
        env.client.end_txn(txn, "COMMIT")
    # Nobody calls now: the coordinator drives it again on its own until the participant takes it.
    deadline = time.monotonic() + 5 * STALLED_END_RETRY_S + 10
    while env.client.get_txn(txn)["state"] != "COMMITTED":
        assert time.monotonic() < deadline, "the stalled txn was not driven again"
        time.sleep(0.1)
    assert ray.get(broken.attempts.remote()) == 4  # 3 refused, 1 taken: one attempt per drive
    assert [(t, a) for t, a, _ in env.calls(name)] == [(txn, "COMMIT")]
    assert str(txn) not in env.client.stats()[txn.tc_id]["stalled_ends"]


def test_transactional_id_fencing(env: Env) -> None:
    tid = f"pipeline-{uuid.uuid4().hex[:6]}"
    home = coordinator_for(tid, 2)
    epoch0 = env.client.register_transactional_id(tid)
    old = env.client.new_txn(transactional_id=tid, epoch=epoch0)
    assert old.tc_id == home
    env.client.add_partitions(old, [(env.topic, 0)], epoch=epoch0)
    epoch1 = env.client.register_transactional_id(tid)  # a new incarnation of the same pipeline
    assert epoch1 == epoch0 + 1
    deadline = time.monotonic() + 10
    while env.client.get_txn(old)["state"] != "ABORTED":  # the zombie's open txn is aborted
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert [(t, a) for t, a, _ in env.calls(partition_actor_name(env.topic, 0))] == [(old, "ABORT")]
    with pytest.raises(Fenced):
        env.client.end_txn(old, EndAction.COMMIT, epoch=epoch0)
    with pytest.raises(Fenced):
        env.client.new_txn(transactional_id=tid, epoch=epoch0)
    new = env.client.new_txn(transactional_id=tid, epoch=epoch1)
    # fencing survives a restart of the id's coordinator
    env.restart(home)
    with pytest.raises(Fenced):
        env.client.new_txn(transactional_id=tid, epoch=epoch0)
    assert env.client.end_txn(new, EndAction.COMMIT, epoch=epoch1) == "COMMITTED"
    # the id is decided by its home coordinator only
    other = 1 - home
    with pytest.raises(NotAllowed):
        env.client.ref(other).call("register_transactional_id", tid)


def test_a_new_txn_whose_answer_was_lost_is_answered_with_the_txn_it_began(env: Env) -> None:
    """The home coordinator logs a transactional id's NewTxn, then the answer is lost (an armed
    drop_reply, as a crash right after the log write would): the client's retry gets the txn
    that was begun, not ConcurrentTransactions, and no second txn is begun. The txn commits."""
    tid = f"pipeline-{uuid.uuid4().hex[:6]}"
    home = coordinator_for(tid, 2)
    epoch = env.client.register_transactional_id(tid)
    ref = env.client.ref(home)
    ref.call("arm_fault", "coordinator.after_log_new", "drop_reply", 1, 1.0, None, 1.0)
    try:
        txn = env.client.new_txn(timeout_ms=30_000, transactional_id=tid, epoch=epoch)
        assert ref.call("list_faults") == []  # the answer was dropped once, and the call retried
    finally:
        ref.call("disarm_fault", None)
    begun = [row["txn"] for row in env.client.list_txns(limit=10_000) if row["transactional_id"] == tid]
    assert begun == [str(txn)]
    env.client.add_partitions(txn, [(env.topic, 0)], epoch=epoch)
    assert env.client.end_txn(txn, EndAction.COMMIT, epoch=epoch) == "COMMITTED"
    assert [(t, a) for t, a, _ in env.calls(partition_actor_name(env.topic, 0))] == [(txn, "COMMIT")]


def test_hanging_transactions_are_listed_by_age_with_participants_and_aborted(env: Env) -> None:
    old = env.client.new_txn(timeout_ms=60_000)
    env.client.add_partitions(old, [(env.topic, 0), (env.topic, 1)])
    env.client.add_subscriptions(old, [(env.topic, 0, "sub")])
    time.sleep(1.2)
    young = env.client.new_txn(timeout_ms=60_000)
    everything = [row["txn"] for row in env.client.list_txns()]
    assert everything.index(str(old)) < everything.index(str(young))  # the oldest first, over both coordinators
    hanging = {row["txn"]: row for row in env.client.list_txns(older_than_ms=1000)}
    assert str(old) in hanging and str(young) not in hanging
    row = hanging[str(old)]
    assert (row["state"], row["owner"], row["tc_id"], row["sequence"]) == ("OPEN", "alice", old.tc_id, old.sequence)
    assert 1000 <= row["age_ms"] < 30_000 and 30_000 < row["deadline_in_ms"] <= 59_000
    assert row["partitions"] == [[env.topic, 0], [env.topic, 1]] and row["subscriptions"] == [[env.topic, 0, "sub"]]
    assert len(env.client.list_txns(limit=1)) == 1
    described = env.client.get_txn(old)
    assert described["age_ms"] >= row["age_ms"] and described["partitions"] == row["partitions"]
    assert env.client.stats()[old.tc_id]["slow_txns"] >= 1  # this module's threshold is 1 s
    for bad in ((0, 0), (10, -1), (10, "1s")):
        with pytest.raises(InvalidArgument):
            env.client.ref(0).call("list_txns", *bad)
    # An operator ends the hanging one: its participants get the abort, it leaves the list.
    assert env.client.admin_abort(old) == "ABORTED"
    for name in env.participants:
        assert [(t, a) for t, a, _ in env.calls(name)] == [(old, "ABORT")]
    assert str(old) not in [row["txn"] for row in env.client.list_txns()]
    assert env.client.get_txn(old)["state"] == "ABORTED"
    assert env.client.admin_abort(old) == "ABORTED"  # idempotent
    assert env.client.end_txn(young, EndAction.COMMIT) == "COMMITTED"
    with pytest.raises(TransactionAlreadyCommitted):
        env.client.admin_abort(young)
    with pytest.raises(TransactionNotFound):
        env.client.admin_abort(TxnID(old.tc_id, 10**9))


@pytest.mark.parametrize("fault", ["delay", "crash"])
def test_registering_a_transactional_id_returns_once_the_fenced_txn_ended_everywhere(env: Env, fault: str) -> None:
    """Kafka's initTransactions: the new incarnation gets its epoch only once the zombie's open
    txn is aborted at every participant (also when the coordinator is slow to tell them, or
    crashes in between and re-drives the abort after its restart), so it may at once redo what
    the zombie held."""
    tid = f"pipeline-{uuid.uuid4().hex[:6]}"
    home = coordinator_for(tid, 2)
    zombie = env.client.new_txn(transactional_id=tid, epoch=env.client.register_transactional_id(tid))
    env.client.add_partitions(zombie, [(env.topic, 0)])
    env.client.add_subscriptions(zombie, [(env.topic, 0, "sub")])
    before = env.wait_ready(home)
    ray.get(env.tc(home).arm_fault.remote("coordinator.after_log_aborting", fault, match={"txn": zombie},
                                          delay_s=2.0))
    env.client.register_transactional_id(tid)
    for name in (partition_actor_name(env.topic, 0), subscription_actor_name(env.topic, 0, "sub")):
        assert [(t, a) for t, a, _ in env.calls(name)] == [(zombie, "ABORT")], name
    assert env.client.get_txn(zombie)["state"] == "ABORTED"
    assert (env.wait_ready(home)["incarnation"] > before["incarnation"]) == (fault == "crash")


def test_batched_log_and_compaction(env: Env) -> None:
    config = env.config
    handle = env.tc(0)
    storage = Storage.from_url(config.storage_url)
    before = set(asyncio.run(storage.list("streams/coordinator/0/log/ledgers")))  # earlier tests' entries
    # many concurrent begins share log puts: at most one put for every two calls (one each without
    # the group commit), counting only this test's puts
    refs = [handle.new_txn.remote(60_000, "alice") for _ in range(300)]
    txns = ray.get(refs)
    puts = set(asyncio.run(storage.list("streams/coordinator/0/log/ledgers"))) - before
    assert len(puts) <= 150, f"300 concurrent new_txn took {len(puts)} puts"
    print(f"300 concurrent new_txn: {len(puts)} puts; {len(before)} objects before")
    ray.get([handle.end_txn.remote(t, EndAction.COMMIT, "alice", None) for t in txns[:290]])
    open_txns = txns[290:]
    compactions = ray.get(handle.stats.remote())["compactions"]
    ray.get(handle.compact.remote())
    stats = ray.get(handle.stats.remote())
    assert stats["compactions"] == compactions + 1 and stats["log"]["trimmed_below"] != "<-1,-1>"
    remaining = asyncio.run(storage.list("streams/coordinator/0/log/ledgers"))
    # (The SEAL that fences each crashed incarnation's ledger stays: earlier tests restarted tc 0.)
    meta = asyncio.run(read_metadata(storage, "coordinator/0/log"))
    assert meta is not None
    tombstones = {chunk_path("coordinator/0/log", ledger, entry) for ledger, entry in meta.tombstones.items()}
    live = [path for path in remaining if path not in tombstones]
    assert len(live) <= 2, f"compaction did not trim the log: {live}"
    env.restart(0)
    for txn in open_txns:
        assert env.client.get_txn(txn)["state"] == "OPEN"
    assert env.client.get_txn(txns[0])["state"] == "COMMITTED"  # outcome kept by the checkpoint
    fresh = env.client.ref(0).call("new_txn", 60_000, "alice")
    assert fresh.sequence > max(t.sequence for t in txns)


def test_a_chained_commits_last_record_rides_with_the_next_commit(env: Env) -> None:
    """A client committing one txn after another costs the coordinator one put a txn, not two:
    each txn's COMMITTED record lingers (``complete_linger_ms``) and goes into the next commit's
    entry. A reader of its own end does not wait for the linger, and a crash while the record
    lingers ends the txn COMMITTED all the same (``test_crash_at_each_step_of_commit_ends_committed``,
    at ``coordinator.complete_lingering``)."""
    storage = Storage.from_url(env.config.storage_url)
    ref = env.client.ref(0)
    txn = ref.call("new_txn", 60_000, "alice")
    env.client.add_partitions(txn, [(env.topic, 0)])
    assert env.client.get_txn(txn)["state"] == "OPEN"  # nothing of this txn lingers now
    before = set(asyncio.run(storage.list("streams/coordinator/0/log/ledgers")))
    committed = []
    for _ in range(20):
        state, next_txn = ref.call("commit_and_begin", txn, "alice", 60_000, [(env.topic, 0)], [])
        assert state == "COMMITTED" and next_txn is not None
        committed.append(txn)
        txn = next_txn
    puts = set(asyncio.run(storage.list("streams/coordinator/0/log/ledgers"))) - before
    # 20 entries of COMMITTING and the next begin; a linger that passed between two commits on a
    # loaded machine costs one more each. Without the linger it is 40.
    print(f"20 chained commits: {len(puts)} puts")
    assert len(puts) <= 25, f"20 chained commits took {len(puts)} puts"
    started = time.monotonic()
    assert env.client.get_txn(committed[-1])["state"] == "COMMITTED"  # its record was still lingering
    assert time.monotonic() - started < 5
    assert {env.client.get_txn(t)["state"] for t in committed} == {"COMMITTED"}
    assert [t for t, a, _ in env.calls(partition_actor_name(env.topic, 0))] == committed
    env.client.end_txn(txn, EndAction.ABORT)
