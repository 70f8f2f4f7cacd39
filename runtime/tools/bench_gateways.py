"""Benchmark of several Kafka gateways (issue 57): ``bench_gateways(short=False, **size) -> rows``.

Two client processes at once, each a confluent-kafka producer and then a consumer (assign mode,
read_committed) of its own 4-partition topic (N keyless 100 B messages each), against one gateway
and against a peer group of two (``start_gateways``), in the same run, rounds alternating the two.

What is timed is serving, nothing else. Each client process sets itself up first (imports,
connection, metadata; a producer also writes one message to each partition and waits for it, as a
partition's actor starts on its first use) and says it is ready; only when every client is ready
does the driver give them all one start time, a fraction of a second ahead. (Before this
hand-shake the start was a fixed 4 s after the processes were spawned: on a loaded machine the
partition actors' starts ran past it, and the figure was those starts, 200-2,000 msgs/s.) A
consumer assigns its partitions only at the start (assigned before, librdkafka would fetch them
all ahead of it). The figure is the two clients' messages over the time from the start to the later
one's last message (produce: delivery reports; consume: the last message). Each row also has the
time to each client's first message, the part of the run that is start-up, not serving
(``first_message_share``).

The ratio two/one is the figure; the one-gateway run is its floor, measured the same way on the
same machine. On one machine the two gateways share its cores with the engine's actors and the
clients, so beside each figure the bench says where the CPU went while it was taken: the CPU
seconds of the gateways serving, of the engine's other processes, of the client processes and of
everything else on the machine (other users), and how busy the machine's cores were.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import psutil
import ray

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.config import SubscriptionConfig
from raytxn.errors import InvalidArgument
from raytxn.ids import NAMESPACE
from raytxn.tools.processes import cpu_seconds, machine_busy_s, ray_processes

PAYLOAD = b"x" * 100
PARTITIONS = 4
CLIENTS = 2
GO_AHEAD_S = 0.3      # the start time given to the ready clients is this far ahead
READY_TIMEOUT_S = 300.0  # a client not ready by then fails the bench (actors start slowly under load)
CLIENT_TIMEOUT_S = 300.0
PEER_GROUP = "bench"
SIZES = {False: {"rounds": 3, "messages": 300_000}, True: {"rounds": 2, "messages": 50_000}}
SETUPS = ("one", "two")


def _client_main(op: str, bootstrap: str, topic: str, count: int) -> None:
    """One client process: sets up, prints ``{"ready": true}``, reads ``{"start_at": t}`` (wall
    clock) from stdin, then ``op``s ("produce" or "consume") ``count`` messages of ``topic`` from
    ``t``; prints when its first and last messages came and its CPU seconds, as JSON."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    first: list[float] = []
    if op == "produce":
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                             "sticky.partitioning.linger.ms": 0})
        producer.list_topics(topic, timeout=30)
        for partition in range(PARTITIONS):  # each partition's actor started: see the docstring
            producer.produce(topic, PAYLOAD, partition=partition)
        if producer.flush(CLIENT_TIMEOUT_S):
            raise SystemExit("warm-up messages undelivered")
        start_at = _ready_then_start()
        cpu0 = _own_cpu()
        producer.produce(topic, PAYLOAD, on_delivery=lambda err, _msg: first.append(time.time()))
        for _ in range(count - 1):
            while True:
                try:
                    producer.produce(topic, PAYLOAD)
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        left = producer.flush(CLIENT_TIMEOUT_S)
        if left:
            raise SystemExit(f"{left} messages undelivered")
    else:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "fetch.wait.max.ms": 100})
        consumer.list_topics(topic, timeout=30)
        start_at = _ready_then_start()
        cpu0 = _own_cpu()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        count += PARTITIONS  # the producer's warm-up messages
        got, deadline = 0, time.monotonic() + CLIENT_TIMEOUT_S
        while got < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"consumed {got} of {count}")
            got += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
            if got and not first:
                first.append(time.time())
        consumer.close()
    done_at = time.time()
    print(json.dumps({"start_at": start_at, "first_at": first[0], "done_at": done_at, "cpu_s": _own_cpu() - cpu0}),
          flush=True)


def _ready_then_start() -> float:
    print(json.dumps({"ready": True}), flush=True)
    start_at = float(json.loads(sys.stdin.readline())["start_at"])
    time.sleep(max(0.0, start_at - time.time()))
    return start_at


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class Run:
    """One timed run of the clients: the rate, the start-up share, and where the CPU went."""

    msgs_per_s: float
    wall_s: float
    first_message_s: float  # the later client's first message after the start
    cpu_s: dict[str, float] = field(default_factory=dict)  # gateways, engine, clients, others
    busy: float = 0.0  # share of the machine's cores busy over the run
    load: float = 0.0  # 1-minute load average at the start


def _read_line(proc: subprocess.Popen, timeout_s: float, err: IO[str]) -> dict[str, Any]:
    """The next JSON line a client prints; a client silent for ``timeout_s`` is killed (and fails
    the bench, with what it wrote to stderr)."""
    assert proc.stdout is not None
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    try:
        while True:  # bounded: a client prints two lines, then exits (EOF)
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=60)
                err.seek(0)
                raise RuntimeError(f"bench client failed ({proc.returncode}): {err.read()[-2000:]}")
            if line.startswith("{"):
                return json.loads(line)
    finally:
        watchdog.cancel()


def _clients(op: str, bootstraps: list[str], topics: list[str], count: int, gateway_pids: list[int]) -> Run:
    """``CLIENTS`` processes at once, one per topic, client i bootstrapped on ``bootstraps[i]``;
    the CPU of ``gateway_pids`` (the gateways under test), of this Ray's other processes, of the
    clients and of the rest of the machine is measured from the start to the last one done."""
    errs = [tempfile.TemporaryFile("w+") for _ in topics]  # a file, not a pipe: a chatty client never blocks
    procs = [subprocess.Popen([sys.executable, "-m", "raytxn.tools.bench_gateways", op, bootstrap, topic, str(count)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
             for bootstrap, topic, err in zip(bootstraps, topics, errs, strict=True)]
    try:
        for proc, err in zip(procs, errs, strict=True):
            _read_line(proc, READY_TIMEOUT_S, err)  # {"ready": true}
        engine = [pid for pid in ray_processes().values() if pid not in gateway_pids]
        start_at = time.time() + GO_AHEAD_S
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"start_at": start_at}) + "\n")
            proc.stdin.flush()
        time.sleep(max(0.0, start_at - time.time()))
        load = os.getloadavg()[0]
        before = ([cpu_seconds(p) for p in gateway_pids], [cpu_seconds(p) for p in engine], machine_busy_s())
        results = [_read_line(proc, CLIENT_TIMEOUT_S + 60, err) for proc, err in zip(procs, errs, strict=True)]
        after = ([cpu_seconds(p) for p in gateway_pids], [cpu_seconds(p) for p in engine], machine_busy_s())
        for proc in procs:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for err in errs:
            err.close()
    wall = max(r["done_at"] for r in results) - start_at
    cpu = {"gateways": sum(after[0]) - sum(before[0]), "engine": sum(after[1]) - sum(before[1]),
           "clients": sum(r["cpu_s"] for r in results)}
    cpu["others"] = max(0.0, after[2] - before[2] - sum(cpu.values()))
    return Run(len(topics) * count / wall, wall, max(r["first_at"] for r in results) - start_at,
               {k: round(v, 2) for k, v in cpu.items()}, (after[2] - before[2]) / (wall * psutil.cpu_count()), load)


def bench_gateways(short: bool = False, progress: Callable[[str], None] = print, **size: Any) -> list[dict]:
    """The bench (module docstring); ``size``: ``rounds`` and ``messages`` (per client), over the
    defaults of ``short``."""
    from raytxn.kafka.gateway import start_gateway, start_gateways, stop_gateways

    unknown = sorted(set(size) - set(SIZES[short]))
    if unknown:
        raise InvalidArgument(f"bench gateways has no size {', '.join(unknown)}; it has {', '.join(SIZES[short])}")
    size = {**SIZES[short], **size}
    count, rounds = int(size["messages"]), int(size["rounds"])
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-gateways-')}",
                        subscription=SubscriptionConfig())
    single: dict[str, Any] | None = None
    runs: dict[str, dict[str, list[Run]]] = {op: {s: [] for s in SETUPS} for op in ("produce", "consume")}
    try:
        options = {"bind_host": "127.0.0.1", "advertised_host": "127.0.0.1",
                   "num_coordinators": client.config.coordinator.num_coordinators}
        single = start_gateway(0, **options)
        pair = start_gateways(2, 0, peer_group=PEER_GROUP, **options)
        bootstraps = {"one": [single["bootstrap"]] * CLIENTS, "two": [g["bootstrap"] for g in pair]}
        pids = {"one": [single["pid"]], "two": [g["pid"] for g in pair]}
        for round_ in range(rounds):
            for setup in (SETUPS if round_ % 2 == 0 else SETUPS[::-1]):
                topics = [f"bench-gw-{setup}-{i}-{time.monotonic_ns()}" for i in range(CLIENTS)]
                for topic in topics:
                    client.create_topic(topic, PARTITIONS)
                for op in ("produce", "consume"):
                    runs[op][setup].append(_clients(op, bootstraps[setup], topics, count, pids[setup]))
                for topic in topics:
                    client.delete_topic(topic)
            progress(f"  round {round_ + 1}/{rounds}: " + ", ".join(
                f"{op} one {runs[op]['one'][-1].msgs_per_s:8.0f} two {runs[op]['two'][-1].msgs_per_s:8.0f}"
                for op in runs) + " msgs/s")
    finally:
        if single is not None:
            ray.kill(single["actor"], no_restart=True)
        stop_gateways(PEER_GROUP)
        client.close()
        stop_engine()
        if started_ray:
            ray.shutdown()
    rows = gateway_rows(count, runs)
    for row in rows:
        if row["bench"] == "gateways":
            progress(f"  {row['op']}: one gateway {row['one_gateway_msgs_per_s']:.0f}, two "
                     f"{row['two_gateways_msgs_per_s']:.0f} msgs/s, two/one {row['two_over_one']:.3f}")
    return rows


def gateway_rows(count: int, runs: dict[str, dict[str, list[Run]]]) -> list[dict]:
    """A row per operation: the best round of one gateway and of two (``runs[op]``: every round
    of "one" and "two") and their ratio; then a row per operation and set-up saying where the CPU
    went in its best round (CPU seconds by kind of process, over the wall time of the run)."""
    rows, cpu_rows = [], []
    for op, sides in runs.items():
        best = {setup: max(sides[setup], key=lambda r: r.msgs_per_s) for setup in SETUPS}
        rows.append({"bench": "gateways", "op": op, "clients": CLIENTS, "partitions": PARTITIONS,
                     "message_bytes": len(PAYLOAD), "messages_per_client": count, "rounds": len(sides["one"]),
                     "one_gateway_msgs_per_s": round(best["one"].msgs_per_s, 1),
                     "two_gateways_msgs_per_s": round(best["two"].msgs_per_s, 1),
                     "two_over_one": round(best["two"].msgs_per_s / best["one"].msgs_per_s, 3),
                     "one_gateway_runs": [round(r.msgs_per_s) for r in sides["one"]],
                     "two_gateways_runs": [round(r.msgs_per_s) for r in sides["two"]]})
        for setup in SETUPS:
            run = best[setup]
            ours = sum(run.cpu_s.get(kind, 0.0) for kind in ("gateways", "engine", "clients"))
            cpu_rows.append({"bench": "gateways_cpu", "op": op, "gateways": SETUPS.index(setup) + 1,
                             "msgs_per_s": round(run.msgs_per_s, 1), "wall_s": round(run.wall_s, 3),
                             "first_message_share": round(run.first_message_s / run.wall_s, 3),
                             **{f"{kind}_cpu_s": run.cpu_s.get(kind, 0.0)
                                for kind in ("gateways", "engine", "clients", "others")},
                             # CPU of the run's own processes per message, and the gateways' part of it
                             "cpu_us_per_message": round(1e6 * ours / (run.msgs_per_s * run.wall_s), 2),
                             "gateways_share": round(run.cpu_s.get("gateways", 0.0) / ours, 3) if ours else 0.0,
                             "cores_busy": round(run.busy, 3), "load_1m": round(run.load, 2)})
    return rows + cpu_rows


if __name__ == "__main__":  # a client process of the bench
    _client_main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
