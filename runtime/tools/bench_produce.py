"""Benchmarks of the partition path: produce throughput plain vs transactional, recovery from a
snapshot vs full replay, and the partition actor's memory under committed traffic."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef, retry
from raytxn.cluster import stop_engine
from raytxn.ids import NAMESPACE, TxnID, partition_actor_name
from raytxn.protocol.entry_format import MessageRecord, encode_message
from raytxn.protocol.txnlog import EndAction
from raytxn.tools.bench_ceiling import measure_ceiling
from raytxn.tools.bench_commit_floor import CommitFloor

PAYLOAD = b"x" * 100


def _engine(**config: object) -> rt.Client:
    if ray.is_initialized():
        stop_engine()
    return rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-')}", **config)


MODES = ("plain", "txn", "txn_sync", "batch")
# What the synchronous pattern's cost over plain is made of, one step at a time (``_produce``):
# sends in a txn (one txn for the whole run), then a commit every window that the sender does not
# wait for, then txn_sync itself (the sender waits for it).
PARTS_OF_TXN_SYNC = ("txn_one", "txn_bg_commit")
# The synchronous pattern's floor on this design: plain, and after each window's flush a commit of
# bare actors (``CommitFloor``: the commit's Ray calls and puts, nothing else) that the sender waits
# for. txn_sync over it is what the engine's own code costs the pattern.
FLOOR_OF_TXN_SYNC = "floor_sync"
BATCH_CALL = 1000  # messages per send_batch call in the "batch" mode


def _produce(client: rt.Client, topic: str, messages: int, transactional: bool = False,
             mode: str | None = None, floor: CommitFloor | None = None) -> float:
    """Send ``messages`` of 100 B in windows of 100 ms; returns durable (committed) msgs/s.

    ``plain``: ``send_async`` in a loop, ``flush`` every window. ``txn``: one txn per window,
    committed in the background while the next one sends, and begun (``new_transaction_async``)
    while the previous one still sends, as a pipeline would. ``txn_sync``: the plain synchronous
    pattern a new user writes: ``new_transaction()``, ``send_async`` in a loop, then ``commit()``
    (which flushes) in the sender's thread, every window. ``batch``: ``send_batch`` of 1,000
    messages a call, ``flush`` every window. ``txn_one``: plain's pattern with every send in one
    txn, committed at the end. ``txn_bg_commit``: txn_sync's, but after the window's ``flush`` the
    commit goes to another thread and the next window starts at once. ``floor_sync``: plain's,
    and after each window's ``flush`` the sender waits for one commit of ``floor`` (bare actors).
    Without a ``mode``: ``txn`` if ``transactional``, else ``plain``."""
    mode = mode or ("txn" if transactional else "plain")
    producer = client.create_producer(topic, batching_max_delay_ms=2)
    committer = concurrent.futures.ThreadPoolExecutor(1)
    commits: list[concurrent.futures.Future] = []
    batch_values = [PAYLOAD] * BATCH_CALL
    # Started and warm before the clock starts, as the ceiling's actor is: a topic's partitions
    # activate on their first call, which cost a 600k run (2-3 s) a tenth of its rate.
    for partition in range(client.get_topic(topic)["partitions"]):
        ActorRef(partition_actor_name(topic, partition)).call("ready")
    start = time.perf_counter()
    sent = 0
    next_txn = client.new_transaction_async(timeout=60) if mode == "txn" else None
    whole_run_txn = client.new_transaction(timeout=600) if mode == "txn_one" else None
    while sent < messages:
        txn = whole_run_txn
        if mode == "txn":
            assert next_txn is not None
            txn = next_txn.result()
            next_txn = client.new_transaction_async(timeout=60)
        elif mode in ("txn_sync", "txn_bg_commit"):
            txn = client.new_transaction(timeout=60)
        window_end = time.perf_counter() + 0.1  # one transaction (or flush) per 100 ms
        while sent < messages and time.perf_counter() < window_end:
            if mode == "batch":
                producer.send_batch(batch_values)
                sent += BATCH_CALL
            else:
                for _ in range(200):
                    producer.send_async(PAYLOAD, txn=txn)
                sent += 200
        _end_window(mode, producer, txn, committer, commits, floor)
    producer.flush()
    if whole_run_txn is not None:
        whole_run_txn.commit()
    for commit in commits:
        commit.result()
    elapsed = time.perf_counter() - start
    if next_txn is not None:
        next_txn.result().abort()  # begun for a window that never came
    committer.shutdown()
    return sent / elapsed


def _end_window(mode: str, producer: Any, txn: Any, committer: concurrent.futures.Executor,
                commits: list[concurrent.futures.Future], floor: CommitFloor | None = None) -> None:
    if mode == "txn":
        commits.append(committer.submit(txn.commit))  # the next txn starts meanwhile
    elif mode == "txn_sync":
        txn.commit()
    else:
        producer.flush()
        if mode == "txn_bg_commit":
            commits.append(committer.submit(txn.commit))
        elif mode == FLOOR_OF_TXN_SYNC:
            assert floor is not None, "floor_sync needs a CommitFloor"
            floor.commit()


def bench_produce(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """Produce throughput of 100 B messages on 1 and 4 partitions in four modes (``_produce``:
    plain, txn, txn_sync, batch), their ratios (txn and txn_sync to plain), and each one's ratio
    to this machine's ceiling (``bench_ceiling``) measured in every round. On 1 partition also the
    parts of txn_sync's cost (``PARTS_OF_TXN_SYNC``) and its floor on this design
    (``FLOOR_OF_TXN_SYNC``), and then all of that again on an engine answering commits once logged.

    A run sends 3M messages (4-6 s, 30-40 windows), so the last window's flush or commit (~0.1 s,
    counted: the rate is of committed messages) weighs little: at 600k a run had become about 1 s,
    7 windows, and its end a tenth of it. On a 2-core machine runs of the same mode still differ by
    up to 20% from minute to minute (the driver, the partition actors, the coordinators and Ray
    share the cores), so the modes alternate, each on a fresh topic, the order rotated every
    round, and a ratio is the median over rounds of the ratio of a round's two runs; the medians
    of each mode and every run are in the row too."""
    rounds = 2 if short else 3
    # 1 partition, where the steps from plain to txn_sync run, gets more: they differ by a few
    # percent, less than one round's swing.
    rounds_1p = 2 if short else 7
    messages = 50_000 if short else 3_000_000
    client = _engine()
    try:
        rows = [_produce_rounds(client, 1, messages, rounds_1p, (*MODES, *PARTS_OF_TXN_SYNC, FLOOR_OF_TXN_SYNC),
                                progress),
                _produce_rounds(client, 4, messages, rounds, MODES, progress, beside_one=True)]
    finally:
        client.close()
        stop_engine()
    # The synchronous pattern again, on an engine answering commits once logged (Kafka's EndTxn):
    # the commit blocks the sender for COMMITTING's put, not for the partition's marker too.
    client = _engine(commit_answer="logged")
    try:
        rows.append(_produce_rounds(client, 1, messages, rounds_1p,
                                    ("plain", "txn_sync", *PARTS_OF_TXN_SYNC, FLOOR_OF_TXN_SYNC), progress, "logged"))
    finally:
        client.close()
        stop_engine()
    return rows


def _produce_rounds(client: rt.Client, partitions: int, messages: int, rounds: int, modes: tuple[str, ...],
                    progress: Callable[[str], None], commit_answer: str = "applied", beside_one: bool = False) -> dict:
    """``rounds`` rounds of ``modes`` on fresh topics of ``partitions``, each round beside its own
    ceiling, the order rotated; the row of their medians (``produce_row``). ``floor_sync``'s floor
    answers as the engine does (``commit_answer``). With ``beside_one`` each mode also runs on 1
    partition right beside its run (``<mode>_1p``; which of the two goes first alternates by round):
    the row's ratio to 1 partition is then of runs a few seconds apart, not of another row's rounds
    minutes earlier (the machine's speed drifts by more than the 10% such a ratio is held to)."""
    runs_of = {mode: [(partitions, mode)] + ([(1, f"{mode}_1p")] if beside_one else []) for mode in modes}
    rates: dict[str, list[float]] = {key: [] for mode in modes for _, key in runs_of[mode]}
    rates["ceiling"] = []
    with contextlib.ExitStack() as cleanup:
        floor: CommitFloor | None = None
        if FLOOR_OF_TXN_SYNC in modes:
            floor = cleanup.enter_context(contextlib.closing(CommitFloor(answer_at_log=commit_answer == "logged")))
        for round_ in range(rounds):
            rates["ceiling"].append(measure_ceiling(messages))  # this round's ceiling, same load
            order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
            for mode in order if round_ % 2 == 0 else tuple(reversed(order)):
                for parts, key in runs_of[mode] if round_ % 2 == 0 else reversed(runs_of[mode]):
                    topic = f"bench-{key.replace('_', '-')}-{parts}-{commit_answer}-{round_}"
                    client.create_topic(topic, parts)
                    rates[key].append(_produce(client, topic, messages, mode=mode, floor=floor))
                    client.delete_topic(topic)  # its ledgers go: a full bench writes ~30 GB
            progress(f"  {partitions} partition(s), commits answered once {commit_answer}, round {round_ + 1}/"
                     f"{rounds}: " + ", ".join(f"{mode} {rates[mode][-1]:9.0f}" for mode in modes)
                     + f" msgs/s, ceiling {rates['ceiling'][-1]:9.0f}"
                     + ("; beside them on 1 partition: " + ", ".join(f"{mode} {rates[mode + '_1p'][-1]:9.0f}"
                                                                    for mode in modes) if beside_one else ""))
    row = produce_row(partitions, messages, rates, commit_answer)
    if floor is not None:
        row["floor_sync_commits"] = floor.lone_commits  # one a window of every floor_sync run
    progress(f"  {partitions} partition(s) median: plain {row['plain_msgs_per_s']:9.0f}, txn/plain "
             f"{row.get('txn_over_plain')}, txn_sync/plain {row.get('txn_sync_over_plain')}, batch/ceiling "
             f"{row.get('batch_over_ceiling')}, txn_sync/floor_sync {row.get('txn_sync_over_floor_sync')}")
    return row


def produce_row(partitions: int, messages: int, rates: dict[str, list[float]], commit_answer: str = "applied") -> dict:
    """``rates``: msgs/s of every run of each mode (plain, and any of txn, txn_sync and batch),
    and of the ceiling probe (``bench_ceiling``), round by round; ratios are medians of each
    round's own ratio. ``commit_answer``: when the engine answered commits. With ``floor_sync``,
    also ``txn_sync_over_floor_sync``: the engine's synchronous pattern over its floor on this
    design, round by round. With ``<mode>_1p`` (the mode's runs on 1 partition beside these),
    ``<mode>_over_1p``: this row's partitions over 1, round by round."""

    def per_round(mode: str, base: str) -> float:
        return round(statistics.median(a / b for a, b in zip(rates[mode], rates[base], strict=True)), 3)

    modes = [mode for mode in (*MODES, *PARTS_OF_TXN_SYNC, FLOOR_OF_TXN_SYNC) if rates.get(mode)]
    row: dict = {"bench": "produce", "partitions": partitions, "commit_answer": commit_answer,
                 "message_bytes": len(PAYLOAD), "messages_per_run": messages, "rounds": len(rates["plain"])}
    for mode in modes:
        row[f"{mode}_msgs_per_s"] = round(statistics.median(rates[mode]), 1)
    for mode in ("txn", "txn_sync", *PARTS_OF_TXN_SYNC, FLOOR_OF_TXN_SYNC):
        if mode in modes:
            row[f"{mode}_over_plain"] = per_round(mode, "plain")
    if "txn_sync" in modes and FLOOR_OF_TXN_SYNC in modes:
        row["txn_sync_over_floor_sync"] = per_round("txn_sync", FLOOR_OF_TXN_SYNC)
    row["ceiling_msgs_per_s"] = round(statistics.median(rates["ceiling"]), 1)
    for mode in modes:
        row[f"{mode}_over_ceiling"] = per_round(mode, "ceiling")
    beside_one = [mode for mode in modes if rates.get(f"{mode}_1p")]
    for mode in beside_one:
        row[f"{mode}_over_1p"] = per_round(mode, f"{mode}_1p")
    for key in (*modes, *(f"{mode}_1p" for mode in beside_one), "ceiling"):
        row[f"{key}_runs"] = [round(r) for r in rates[key]]
    return row


def _restart(ref: ActorRef, name: str) -> dict:
    old = ref.call("ready")["incarnation"]
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
    while True:
        info = ref.call("ready")
        if info["incarnation"] > old:
            return info
        time.sleep(0.02)


def bench_recovery(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """Recovery of a partition holding N aborted txns: newest snapshot + tail vs full replay."""
    from raytxn.config import PartitionConfig

    # No automatic snapshots: the first restart must replay the whole ledger.
    client = _engine(partition=PartitionConfig(snapshot_every_txns=10**9, snapshot_interval_s=10**9))
    aborted = 1_000 if short else 10_000
    try:
        client.create_topic("bench-recovery", 1)
        name = partition_actor_name("bench-recovery", 0)
        ref = ActorRef(name)
        handle = ray.get_actor(name, namespace=NAMESPACE)
        # Straight at the partition, as a coordinator would: append in txn i, then abort it.
        tc = 77  # a coordinator id no real coordinator uses: this partition only
        record = encode_message(MessageRecord(PAYLOAD))
        for chunk in range(0, aborted, 500):
            ids = range(chunk, min(chunk + 500, aborted))
            # Appends (a producer per txn) and ends are idempotent: a chunk may be sent again.
            retry(lambda ids=ids: ray.get([handle.append.remote(f"bench-{i}", 0, [record],
                                                                 TxnID(tc, i)) for i in ids]), 120)
            retry(lambda ids=ids: ray.get([handle.end_txn.remote(TxnID(tc, i), EndAction.ABORT, -1) for i in ids]), 120)
        full = _restart(ref, name)
        assert full["recovered_from_snapshot"] is None and full["replayed_entries"] >= 2 * aborted, full
        ref.call("snapshot")
        snap = _restart(ref, name)
        assert snap["recovered_from_snapshot"] is not None
        stats = ref.call("stats")
        assert stats["aborted_txns"] == aborted, stats
        row = recovery_row(aborted, full["recovery_ms"], snap["recovery_ms"])
        progress(f"  {aborted} aborted txns: full replay {row['full_replay_ms']} ms, "
                 f"snapshot {row['snapshot_ms']} ms")
        return [row]
    finally:
        client.close()
        stop_engine()


def recovery_row(aborted: int, full_replay_ms: float, snapshot_ms: float) -> dict:
    return {"bench": "recovery", "aborted_txns": aborted, "entries": 2 * aborted,
            "full_replay_ms": full_replay_ms, "snapshot_ms": snapshot_ms,
            "speedup": round(full_replay_ms / max(snapshot_ms, 0.001), 2)}


def bench_partition_memory(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """Resident memory of the partition actor after 10k committed messages vs after 1M (100k in
    short mode): committed traffic must not grow it (no per-message state is kept)."""
    client = _engine()
    big = 100_000 if short else 1_000_000
    try:
        client.create_topic("bench-memory", 1)
        ref = ActorRef(partition_actor_name("bench-memory", 0))
        _produce(client, "bench-memory", 10_000, transactional=True)
        gc.collect()
        small_rss = ref.call("stats")["rss_bytes"]
        _produce(client, "bench-memory", big - 10_000, transactional=True)
        row = partition_memory_row(10_000, big, small_rss, ref.call("stats"))
        progress(f"  RSS after 10k: {row['rss_small_mb']} MiB, after {big}: {row['rss_big_mb']} MiB "
                 f"(ratio {row['ratio']})")
        return [row]
    finally:
        client.close()
        stop_engine()


def partition_memory_row(small: int, big: int, small_rss: int, big_stats: dict) -> dict:
    """``big_stats``: the partition's stats after ``big`` messages."""
    return {"bench": "partition_memory", "small_messages": small, "big_messages": big,
            "rss_small_mb": round(small_rss / 2**20, 1), "rss_big_mb": round(big_stats["rss_bytes"] / 2**20, 1),
            "ratio": round(big_stats["rss_bytes"] / small_rss, 3), "ongoing_txns": big_stats["ongoing_txns"],
            "aborted_txns": big_stats["aborted_txns"]}


def bench_crash_recovery(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """Time from an actor's kill to its new incarnation serving again (recovered), p50/p99 over
    50 kills per actor kind (10 in short mode). The actors hold some state while killed."""
    from raytxn.ids import coordinator_actor_name, subscription_actor_name

    client = _engine()
    kills = 10 if short else 50
    rows = []
    try:
        client.create_topic("bench-crash", 1)
        producer = client.create_producer("bench-crash")
        for _ in range(20):
            with client.transaction() as txn:
                producer.send(PAYLOAD, txn=txn)
        targets = {"coordinator": coordinator_actor_name(0), "partition": partition_actor_name("bench-crash", 0)}
        try:
            client.subscribe("bench-crash", "bench-sub")  # type: ignore[attr-defined]
            targets["subscription"] = subscription_actor_name("bench-crash", 0, "bench-sub")
        except AttributeError:
            pass  # no subscriptions in this build
        for kind, name in targets.items():
            ref = ActorRef(name)
            times = []
            for _ in range(kills):
                old = ref.call("ready")["incarnation"]
                handle = ray.get_actor(name, namespace=NAMESPACE)
                t0 = time.perf_counter()
                ray.kill(handle, no_restart=False)
                while True:  # Ray queues calls to a restarting actor: each get returns on restart
                    try:
                        info = ray.get(handle.ready.remote(), timeout=60)
                    except Exception:  # noqa: BLE001 - the call hit the dying incarnation
                        time.sleep(0.005)
                        continue
                    if info["incarnation"] > old:
                        break
                times.append((time.perf_counter() - t0) * 1000)
            row = crash_recovery_row(kind, times)
            progress(f"  {kind:12} kill -> serving: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
            rows.append(row)
    finally:
        client.close()
        stop_engine()
    return rows


def crash_recovery_row(kind: str, kill_to_serving_ms: list[float]) -> dict:
    times = sorted(kill_to_serving_ms)
    return {"bench": "crash_recovery", "actor": kind, "kills": len(times),
            "p50_ms": round(times[len(times) // 2], 1), "p99_ms": round(times[int(len(times) * 0.99)], 1),
            "max_ms": round(times[-1], 1)}
