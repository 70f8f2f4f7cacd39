"""The chaos workload: consume-transform-produce under a seeded random schedule of faults.

Input topic `in` (3 partitions) holds N orders. Worker threads, each with its own Shared
consumer and producers, move every order in one transaction to two output topics (`out-a`,
`out-b`, 2 partitions each) and acknowledge it in the same transaction; some transactions are
aborted on purpose. Meanwhile a fault thread follows a schedule drawn from the seed: at random
moments it arms a fault point (any point of any actor kind, action crash/raise/delay/drop_reply)
in a random actor, or kills a random actor. Everything observed is recorded in a History; at the
end the outputs are drained and ``raytxn.tools.checker.check`` judges invariants 1-6. The same seed
gives the same schedule (``ChaosResult.schedule``), so a failing seed replays it. A run lasts until
its last fault fired, however fast its orders are done, and a kill waits for its target to serve
(``READY_BEFORE_KILL_S``), so that every kill ends an incarnation that had started.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from raytxn.client.rpc import ActorRef
from raytxn.errors import RaytxnError, Timeout, TransactionAlreadyAborted, TransactionTimedOut
from raytxn.ids import coordinator_actor_name, partition_actor_name, subscription_actor_name
from raytxn.tools.chaos_evidence import client_story, partitions_of, stored_story
from raytxn.tools.checker import Anomaly, Report, check
from raytxn.tools.history import History, as_txn

MAX_NOTES = 2000
MAX_FEED_ATTEMPTS = 10  # sends of one order a steady feed makes before it gives up
READY_BEFORE_KILL_S = 10.0  # how long a kill waits for its target to serve (else it is skipped)

POINTS = {
    "coordinator": ["coordinator.after_log_new", "coordinator.after_log_committing", "coordinator.after_log_aborting",
                    "coordinator.after_send_end", "coordinator.before_log_complete", "coordinator.complete_lingering",
                    "coordinator.after_log_complete"],
    "partition": ["partition.before_append", "partition.after_append_before_reply", "partition.before_marker",
                  "partition.after_marker", "partition.before_snapshot"],
    "subscription": ["subscription.before_pending_ack_log", "subscription.after_pending_ack_log",
                     "subscription.before_commit_log", "subscription.after_commit_log",
                     "subscription.after_cursor_persist"],
    "ledger": ["ledger.before_put"],
}
ACTIONS = ("crash", "raise", "delay", "drop_reply")


@dataclass
class ChaosResult:
    seed: int
    txns: int
    committed: int
    aborted: int
    seconds: float
    schedule: list[dict[str, Any]]
    faults_fired: int
    report: Report
    errors: dict[str, int] = field(default_factory=dict)
    # When not clean: the anomalies' story, client side and stored side (``chaos_evidence``)
    evidence: list[str] = field(default_factory=list)
    # The scheduled faults that did not fire: their target was not running then (a hosted
    # actor not activated yet, a process restarting), so nothing was killed or armed.
    skipped: list[dict[str, Any]] = field(default_factory=list)
    # Each actor killed, and the incarnation it was killed in.
    killed_incarnations: dict[str, int] = field(default_factory=dict)
    # The actors no fault was drawn for (``spare_last``).
    spared: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.report.clean

    def summary(self) -> str:
        return (f"seed {self.seed}: {self.txns} orders, {self.committed} committed / {self.aborted} aborted txns, "
                f"{len(self.schedule)} faults scheduled, {self.seconds:.1f}s; checker: "
                f"{'clean' if self.clean else self.report.summary()}")


def make_schedule(seed: int, actors: dict[str, list[str]], count: int, interval_s: float,
                  dormant_ratio: float = 0.0) -> list[dict[str, Any]]:
    """``count`` fault events drawn from ``seed``: when (offset s), what, where. With
    ``dormant_ratio``, that share of the kills of partitions and subscriptions are for good
    (``kill_for_good``: the actor is dormant, as after a passivation, until a call activates it);
    without it the draws, and so every earlier seed's schedule, are as they were."""
    rng = random.Random(seed)
    events = []
    at = 0.0
    for _ in range(count):
        at += rng.uniform(0.5, 1.5) * interval_s
        if rng.random() < 0.2:
            kind = rng.choice(["coordinator", "partition", "subscription"])
            do = "kill"
            if dormant_ratio and kind != "coordinator" and rng.random() < dormant_ratio:
                do = "kill_for_good"
            events.append({"at": round(at, 3), "do": do, "actor": rng.choice(actors[kind])})
            continue
        kind = rng.choice(list(POINTS))
        target_kind = rng.choice(["coordinator", "partition", "subscription"]) if kind == "ledger" else kind
        events.append({"at": round(at, 3), "do": "arm", "point": rng.choice(POINTS[kind]),
                       "action": rng.choice(ACTIONS), "actor": rng.choice(actors[target_kind]),
                       "delay_s": round(rng.uniform(0.05, 0.5), 3)})
    return events


def fault_targets(coordinators: int, sizes: dict[str, int], topic_in: str,
                  spare_last: bool = False) -> tuple[dict[str, list[str]], list[str]]:
    """The actors a schedule draws its faults from, per kind, and those it spares. With
    ``spare_last``: the last coordinator, the last partition of every topic and the input's
    last subscription (its ``chaos`` subscription on that partition), when a kind has another
    left to fault; the workload still runs through them, so they carry its load unkilled for
    the whole run (without it, every actor a fault may hit, as before)."""
    actors = {
        "coordinator": [coordinator_actor_name(i) for i in range(coordinators)],
        "partition": [partition_actor_name(t, p) for t, n in sizes.items() for p in range(n)],
        "subscription": [subscription_actor_name(topic_in, p, "chaos") for p in range(sizes[topic_in])],
    }
    if not spare_last:
        return actors, []
    spared = [coordinator_actor_name(coordinators - 1),
              *(partition_actor_name(t, n - 1) for t, n in sizes.items()),
              subscription_actor_name(topic_in, sizes[topic_in] - 1, "chaos")]
    for kind, names in actors.items():
        left = [name for name in names if name not in spared]
        if not left:  # one of its kind: faulted still (a kind no fault can reach tests nothing)
            spared = [name for name in spared if name not in names]
            continue
        actors[kind] = left
    return actors, spared


def run_chaos(client: Any, txns: int = 300, seed: int = 1, workers: int = 3, txn_timeout_s: float = 10.0,
              fault_interval_s: float = 1.0, abort_ratio: float = 0.1, time_limit_s: float = 600.0,
              progress: Any = None, partitions: tuple[int, int, int] = (3, 2, 2),
              dormant_ratio: float = 0.0, feed_per_s: float = 0.0,
              observe: Callable[[dict[str, Any]], None] | None = None, spare_last: bool = False) -> ChaosResult:
    """Run the workload on ``client``'s engine and judge it; see the module docstring.
    ``partitions``: of the input topic and the two outputs. ``dormant_ratio``: see ``make_schedule``
    (an engine with a short ``passivate_idle_s`` also passivates idle actors during the run).

    ``feed_per_s`` > 0: a steady load (the soak, ``raytxn bench soak``): the orders are sent at
    that rate while the workers run, not all before, and the faults are spread over the time
    that takes. ``observe`` gets the counts (``t`` seconds since the start, ``fed``,
    ``committed``, ``aborted``, ``done``, ``fired``) about five times a second. ``spare_last``:
    the faults spare some actors the workload runs through (``fault_targets``), so that a long
    run has processes that live all of it (the soak judges memory on them)."""
    import raytxn as rt

    rng = random.Random(seed)
    run = f"c{seed}-{rng.randrange(16**6):06x}"
    topic_in, out_a, out_b = f"{run}-in", f"{run}-out-a", f"{run}-out-b"
    sizes = dict(zip((topic_in, out_a, out_b), partitions, strict=True))
    for topic, count in sizes.items():
        client.create_topic(topic, count)
    history = History()
    now = time.monotonic
    seeder = client.create_producer(topic_in, send_timeout_s=120)
    fed = [0]  # orders sent so far

    def feed(count: int, per_s: float) -> None:
        """Send ``count`` orders, at ``per_s`` a second (0: at once, before the run). A steady
        feed meets the faults: a send that fails is sent again, as an application would (the
        same uid: the checker accepts one stored copy)."""
        began = now()
        for i in range(count):
            if per_s > 0:
                time.sleep(max(0.0, began + i / per_s - now()))
            uid = f"in-{i}"
            for attempt in range(MAX_FEED_ATTEMPTS):
                history.send(uid, topic_in, None, None, seeder.producer_name, now())
                try:
                    history.send_ok(uid, seeder.send(uid.encode(), key=uid), now(), producer=seeder.producer_name)
                    break
                except RaytxnError as e:
                    history.send_failed(uid, e, now(), producer=seeder.producer_name)
                    if per_s <= 0 or attempt + 1 == MAX_FEED_ATTEMPTS:
                        raise
                    note_error(e, None, None, f"feed {uid}")
            fed[0] = i + 1

    if feed_per_s <= 0:
        feed(txns, 0.0)
    consumers = [client.subscribe(topic_in, "chaos", consumer_type=rt.ConsumerType.Shared,
                                  initial_position=rt.InitialPosition.Earliest, consumer_name=f"w{w}",
                                  ack_timeout_s=txn_timeout_s * 2)
                 for w in range(workers)]
    for w in range(workers):
        history.subscribe(f"w{w}", "chaos", topic_in, now(), from_earliest=True)
    actors, spared = fault_targets(client.config.coordinator.num_coordinators, sizes, topic_in, spare_last)
    expected_s = max(5.0, txns * 0.05, txns / feed_per_s if feed_per_s > 0 else 0.0)
    schedule = make_schedule(seed, actors, max(3, int(expected_s / fault_interval_s)), fault_interval_s,
                             dormant_ratio)
    done: set[str] = set()
    counts = {"committed": 0, "aborted": 0, "fired": 0}
    errors: dict[str, int] = {}
    skipped: list[dict[str, Any]] = []  # scheduled faults whose target was not running
    killed_incarnations: dict[str, int] = {}
    notes: deque[tuple] = deque(maxlen=MAX_NOTES)  # (t, worker, txn, where, error) for the evidence
    lock = threading.Lock()
    stop = threading.Event()
    start = now()

    def note_error(e: BaseException, w: int | None = None, txn: Any = None, where: str = "") -> None:
        with lock:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            notes.append((now() - start, f"w{w}", as_txn(txn), where, repr(e)[:300]))

    def worker(w: int) -> None:
        consumer = consumers[w]
        rewinds_seen = 0
        wrng = random.Random(seed * 1000 + w)
        producer_a = client.create_producer(out_a, producer_name=f"{run}-w{w}-a", send_timeout_s=120)
        producer_b = client.create_producer(out_b, producer_name=f"{run}-w{w}-b", send_timeout_s=120)
        while not stop.is_set():
            try:
                msg = consumer.receive(timeout=1)
            except Timeout:
                history.receive_timeout(f"w{w}", "chaos", now(), topic=topic_in)
                continue
            except RaytxnError as e:
                note_error(e, w, None, "receive")
                continue
            uid = msg.value().decode()
            if consumer.rewinds_seen != rewinds_seen:  # the subscription restarted: order starts over
                rewinds_seen = consumer.rewinds_seen
                history.reset(f"w{w}", "chaos", now())
            history.receive(f"w{w}", "chaos", topic_in, msg.message_id().partition, msg.message_id(), uid,
                            msg.redelivery_count(), now())
            try:
                txn = client.new_transaction(timeout=txn_timeout_s)
            except RaytxnError as e:
                note_error(e, w, None, f"new_transaction for {uid}")
                consumer.negative_acknowledge(msg)
                continue
            history.txn_begin(txn.id, now())
            outputs = [f"a-{uid}", f"b-{uid}"]
            try:
                for out_uid, producer, topic in ((outputs[0], producer_a, out_a), (outputs[1], producer_b, out_b)):
                    history.send(out_uid, topic, None, txn.id, producer.producer_name, now())
                    try:
                        history.send_ok(out_uid, producer.send(out_uid.encode(), key=uid, txn=txn), now(),
                                         producer=producer.producer_name)
                    except RaytxnError as e:
                        history.send_failed(out_uid, e, now(), producer=producer.producer_name)
                        raise
                history.ack(f"w{w}", "chaos", msg.message_id(), txn.id, now())
                consumer.acknowledge(msg, txn=txn)
                history.consume_transform_produce(uid, outputs, txn.id, subscription="chaos", t=now())
            except RaytxnError as e:
                note_error(e, w, txn, f"send or ack for {uid}")
                _abort(history, txn, now)
                with lock:
                    counts["aborted"] += 1
                continue
            if wrng.random() < abort_ratio:
                _abort(history, txn, now)
                with lock:
                    counts["aborted"] += 1
                continue
            issued = now()
            try:
                txn.commit()
                history.txn_commit(txn.id, "committed", now(), issued_at=issued)
                with lock:
                    counts["committed"] += 1
                    done.add(uid)
            except (TransactionAlreadyAborted, TransactionTimedOut) as e:
                note_error(e, w, txn, "commit")
                history.txn_commit(txn.id, "aborted", now(), issued_at=issued)
                with lock:
                    counts["aborted"] += 1
            except RaytxnError as e:
                note_error(e, w, txn, "commit")
                history.txn_commit(txn.id, "unknown", now(), issued_at=issued)

    def faults() -> None:
        for event in schedule:
            while now() - start < event["at"]:
                if stop.is_set():
                    return
                time.sleep(0.02)
            try:
                if event["do"] in ("kill", "kill_for_good"):
                    # Killed once it serves: a hosted actor killed during its first start (its
                    # first call came late, under load) would come back as its first incarnation.
                    target = ActorRef(event["actor"], client.token)
                    serving_in = target.call("ready", deadline_s=READY_BEFORE_KILL_S)["incarnation"]
                    client.faults.kill(event["actor"], restart=event["do"] == "kill")
                    killed_incarnations[event["actor"]] = serving_in
                else:
                    client.faults.arm(event["point"], event["action"], actor=event["actor"],
                                      delay_s=event["delay_s"])
                counts["fired"] += 1
            except RaytxnError as e:  # the target is restarting, or dormant: that fault is skipped
                note_error(e, None, None, f"fault {event}")
                skipped.append(event)
            if progress:
                progress(f"  t={now() - start:5.1f}s fault {event}")

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(workers)]
    fault_thread = threading.Thread(target=faults, daemon=True)
    if feed_per_s > 0:
        threads.append(threading.Thread(target=feed, args=(txns, feed_per_s), daemon=True))
    for thread in [*threads, fault_thread]:
        thread.start()
    last_report = 0.0
    # Until every order is done and every scheduled fault has fired: a run whose orders were all
    # done before its first fault (a fast machine) would otherwise test nothing.
    while (len(done) < txns or fault_thread.is_alive()) and now() - start < time_limit_s:
        time.sleep(0.2)
        if observe is not None:
            with lock:
                counts_now = {"t": now() - start, "fed": fed[0], "done": len(done), **counts}
            observe(counts_now)
        if progress and now() - last_report >= 5:
            last_report = now()
            progress(f"  t={now() - start:5.1f}s {len(done)}/{txns} orders done")
    stop.set()
    for thread in [*threads, fault_thread]:
        thread.join(timeout=180)
    for name in {e["actor"] for e in schedule}:
        try:
            client.faults.disarm(actor=name)
        except RaytxnError:
            pass
    for consumer in consumers:
        consumer.close()
    time.sleep(txn_timeout_s + 1)  # txns abandoned by a failed client time out
    drain_into(history, client, topic_in, "chaos", now)
    drain_into(history, client, out_a, "verify", now)
    drain_into(history, client, out_b, "verify", now)
    report = check(history, txn_timeout_s=txn_timeout_s * 2 + 5, stuck_slack_s=30.0)
    missing = txns - len(done)
    if missing:  # every order must have been processed by the end
        report.lost.append(Anomaly("lost", f"{missing} orders",
                                   f"{missing} orders never committed within {time_limit_s}s"))
    # (the evidence tells the story of the first few orders never done, too)
    stuck = [Anomaly("lost", f"order {uid}", "never committed", msg_uid=uid)
             for uid in [f"in-{i}" for i in range(txns) if f"in-{i}" not in done][:3]]
    story = [] if report.clean else evidence(client, history, [*report.anomalies(), *stuck], notes)
    return ChaosResult(seed, txns, counts["committed"], counts["aborted"], now() - start, schedule,
                       counts["fired"], report, errors, story, skipped, killed_incarnations, spared)


def evidence(client: Any, history: History, anomalies: list[Anomaly], notes: Iterable[tuple]) -> list[str]:
    """The client's and the stored side's story of ``anomalies`` (``chaos_evidence``), best effort."""
    lines = client_story(history, anomalies, notes)
    engine = client.config
    for topic, partition in partitions_of(history, anomalies):
        try:
            lines += stored_story(engine.storage_url, engine.storage_options, topic, partition)
        except Exception as e:  # noqa: BLE001 - evidence is best effort: the verdict stands without it
            lines.append(f"ledger of {topic}-{partition}: unreadable: {e!r}")
    return lines


def _abort(history: History, txn: Any, now: Any) -> None:
    issued = now()
    try:
        txn.abort()
        history.txn_abort(txn.id, "aborted", now(), issued_at=issued)
    except RaytxnError:
        history.txn_abort(txn.id, "unknown", now(), issued_at=issued)


def drain_into(history: History, client: Any, topic: str, subscription: str, now: Any,
               consumer_type: Any = None) -> None:
    """Read what is left for ``subscription`` (a new one starts at the earliest message) into
    ``history``'s final state of it; ``consumer_type``: the subscription's (default Exclusive)."""
    import raytxn as rt

    consumer = client.subscribe(topic, subscription, consumer_type=consumer_type or rt.ConsumerType.Exclusive,
                                initial_position=rt.InitialPosition.Earliest, consumer_name=f"drain-{subscription}")
    seen = []
    while True:
        try:
            msg = consumer.receive(timeout=3)
        except Timeout:
            break
        seen.append((msg.message_id().partition, msg.message_id(), msg.value().decode()))
    consumer.close()
    history.final_state(subscription, topic, seen, t=now())
