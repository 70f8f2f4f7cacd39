"""``raytxn bench peers`` (issue 56): raytxn beside a real Apache Kafka broker in one run.

Three sides do the same work: **kafka** (confluent-kafka against a real single-node KRaft broker
on loopback, ``raytxn.tools.peers.KafkaBroker``), **gateway** (the same confluent-kafka code
against raytxn's Kafka-protocol gateway) and **native** (the raytxn client). Every figure is also
a ratio to Kafka's. The workloads (``bench_peers_clients``), 100 B messages:

* idempotent produce of N messages on 1 and 4 partitions, and ``read_committed`` consume of them;
* the produce loop with a commit every 100 ms, for some seconds (confluent's ``begin/commit``; the
  native client's synchronous and pipelined patterns), beside the same loop with a ``flush``
  instead of the commit (``over_plain``: what transactions cost each client on this loop);
* commit latency p50/p99 (begin, one send, commit) and end-to-end latency p50/p99 (a message sent
  in a txn and committed, until a ``read_committed`` consumer has it);
* the exactly-once consume-transform-produce loop (``send_offsets_to_transaction``; natively
  ``receive_batch`` + ``send_batch`` + ``ack(txn)``) in msgs/s;
* Spark (``bench_peers_spark``): the word count as Structured Streaming on Kafka, on the gateway,
  and ``ExactlyOncePipeline`` on raytxn, rows/s and the first micro-batch's latency.

The machine is shared (2 cores, other helpers' tests): a single run swings by 20% or more. So
every round runs every workload on the three sides, each on fresh topics, the sides' order
rotated round by round; a side's figure is the median of its rounds and its ratio to Kafka the
median of the rounds' own ratios (runs seconds apart, which see the same machine).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import raytxn as rt
from raytxn.tools import bench_peers_clients as work
from raytxn.tools.bench import _percentile
from raytxn.tools.bench_engine import local_engine_with_gateway
from raytxn.tools.bench_kafka import _kafka_consume, _kafka_produce, _native_consume, _native_produce

SIDES = ("kafka", "gateway", "native")
CLIENTS = {"kafka": "confluent-kafka -> Kafka 4 broker", "gateway": "confluent-kafka -> raytxn gateway",
           "native": "raytxn client"}
LOOP_PATTERNS = {"kafka": ("plain", "txn_sync"), "gateway": ("plain", "txn_sync"),
                 "native": ("plain", "txn_sync", "txn_async")}
# short (CI smoke) and full; any of them can be set with ``--size key=value``. spark_rows is not a
# multiple of spark_batch: both sides then end on one half batch; at a multiple, Spark's rounding
# down per partition leaves a few rows over for a tiny extra batch that distorts the steady median.
SIZES = {
    False: {"rounds": 3, "messages": 100_000, "seconds": 5.0, "samples": 200, "eos_messages": 50_000,
            "spark": True, "spark_rows": 175_000, "spark_batch": 50_000, "kafka_bootstrap": ""},
    True: {"rounds": 1, "messages": 5_000, "seconds": 1.0, "samples": 20, "eos_messages": 3_000,
           "spark": True, "spark_rows": 7_000, "spark_batch": 2_000, "kafka_bootstrap": ""},
}


@dataclass
class Sides:
    """The three sides' endpoints, and their topics (made and dropped per run)."""

    client: rt.Client
    kafka: str
    gateway: str
    admin: Any = None
    made: list[tuple[str, str]] = field(default_factory=list)
    gateway_actor: Any = None  # the gateway's Ray actor (its stats: requests served by API)

    def bootstrap(self, side: str) -> str:
        return self.kafka if side == "kafka" else self.gateway

    def topic(self, side: str, purpose: str, partitions: int = 1) -> str:
        """A fresh topic on ``side`` (the gateway's and native's are raytxn topics), its
        partitions led (Kafka) or their actors started (raytxn) before it is used."""
        name = f"peers-{purpose}-{side}-{uuid.uuid4().hex[:8]}"
        if side == "kafka":
            from confluent_kafka.admin import NewTopic

            self.admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
            deadline = time.monotonic() + 30
            while True:
                meta = self.admin.list_topics(name, timeout=10).topics.get(name)
                if meta is not None and len(meta.partitions) == partitions and all(
                        p.leader >= 0 for p in meta.partitions.values()):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kafka topic {name}: no leaders after 30 s")
                time.sleep(0.05)
        else:
            self.client.create_topic(name, partitions)
            from raytxn.client.rpc import ActorRef
            from raytxn.ids import partition_actor_name

            for partition in range(partitions):  # activated before the clock starts
                ActorRef(partition_actor_name(name, partition), self.client.token).call("ready")
        self.made.append((side, name))
        return name

    def drop_topics(self) -> None:
        """Drop what this run made: a full bench writes GBs to the broker's and the engine's logs."""
        kafka = [name for side, name in self.made if side == "kafka"]
        if kafka:
            for future in self.admin.delete_topics(kafka).values():
                future.result(30)
        for side, name in self.made:
            if side != "kafka":
                self.client.delete_topic(name)
        self.made.clear()


@contextmanager
def _broker(bootstrap: str, started_pids: list[int] | None = None) -> Iterator[str]:
    """A fresh Kafka broker of our own (stopped after; its PID put in ``started_pids``), or the
    one at ``bootstrap``."""
    if bootstrap:
        yield bootstrap
        return
    from raytxn.tools.peers import KafkaBroker

    with KafkaBroker() as broker:
        if started_pids is not None:
            started_pids[:] = [broker.pid]
        yield broker.bootstrap


@contextmanager
def running_sides(kafka_bootstrap: str = "") -> Iterator[Sides]:
    """A Kafka broker (``_broker``), a raytxn engine on a file:// store (on this process's Ray, or
    a fresh local one stopped at the end) and a gateway on 127.0.0.1; all stopped after."""
    from confluent_kafka.admin import AdminClient

    with _broker(kafka_bootstrap) as kafka, local_engine_with_gateway("raytxn-bench-peers-") as (client, gateway):
        yield Sides(client, kafka, gateway["bootstrap"], AdminClient({"bootstrap.servers": kafka}),
                    gateway_actor=gateway["actor"])


class Figures:
    """Every round's measurement of every (case, side): msgs/s, or a list of latencies in ms."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], list[Any]] = {}

    def add(self, case: str, side: str, value: Any) -> None:
        self.runs.setdefault((case, side), []).append(value)

    def last(self, case: str, side: str) -> Any:
        return self.runs[(case, side)][-1]

    def rate_ratio(self, case: str, side: str, base_case: str, base_side: str) -> float | None:
        mine, base = self.runs.get((case, side)), self.runs.get((base_case, base_side))
        if not mine or not base:
            return None
        return round(statistics.median(a / b for a, b in zip(mine, base, strict=False)), 3)

    def latency_ratio(self, case: str, side: str, q: float) -> float | None:
        mine, base = self.runs.get((case, side)), self.runs.get((case, "kafka"))
        if not mine or not base:
            return None
        return round(statistics.median(_percentile(sorted(a), q) / _percentile(sorted(b), q)
                                       for a, b in zip(mine, base, strict=False)), 3)


def _rotated(round_: int) -> tuple[str, ...]:
    shift = round_ % len(SIDES)
    return SIDES[shift:] + SIDES[:shift]


def _round(sides: Sides, figures: Figures, size: dict, round_: int, progress: Callable[[str], None]) -> None:
    """Every Kafka-client workload once on each side, in this round's order of sides."""
    order = _rotated(round_)
    client = sides.client
    for partitions in (1, 4):
        for side in order:
            topic = sides.topic(side, f"produce{partitions}", partitions)
            if side == "native":
                produced = _native_produce(client, topic, size["messages"])
                consumed, _ = _native_consume(client, topic, size["messages"])
            else:
                produced = _kafka_produce(sides.bootstrap(side), topic, size["messages"])
                consumed, _ = _kafka_consume(sides.bootstrap(side), topic, partitions, size["messages"])
            figures.add(f"produce/{partitions}", side, size["messages"] / produced)
            figures.add(f"consume/{partitions}", side, size["messages"] / consumed)
        sides.drop_topics()
        progress(_line(figures, round_, f"produce/{partitions}"))
        progress(_line(figures, round_, f"consume/{partitions}"))
    for side in order:
        for pattern in LOOP_PATTERNS[side]:
            topic = sides.topic(side, f"loop-{pattern.replace('_', '-')}")
            if side == "native":
                rate = work.native_loop(client, topic, size["seconds"], pattern)
            else:
                rate = work.kafka_loop(sides.bootstrap(side), topic, size["seconds"], pattern != "plain")
            figures.add(f"loop/{pattern}", side, rate)
        sides.drop_topics()
    progress(f"  round {round_ + 1} loop: " + ", ".join(
        f"{side} {pattern} {figures.last(f'loop/{pattern}', side):.0f}"
        for side in SIDES for pattern in LOOP_PATTERNS[side]) + " msgs/s")
    for side in order:
        topic = sides.topic(side, "commit")
        if side == "native":
            figures.add("commit", side, work.native_commit_latencies(client, topic, size["samples"]))
        else:
            figures.add("commit", side, work.kafka_commit_latencies(sides.bootstrap(side), topic, size["samples"]))
        topic = sides.topic(side, "e2e")
        if side == "native":
            figures.add("e2e", side, work.native_end_to_end(client, topic, size["samples"]))
        else:
            figures.add("e2e", side, work.kafka_end_to_end(sides.bootstrap(side), topic, size["samples"]))
        sides.drop_topics()
    progress(f"  round {round_ + 1} latency p50: " + ", ".join(
        f"{case} {side} {statistics.median(figures.last(case, side)):.2f}" for case in ("commit", "e2e")
        for side in SIDES) + " ms")
    for side in order:
        source, sink = sides.topic(side, "eos-in"), sides.topic(side, "eos-out")
        if side == "native":
            work.native_fill(client, source, size["eos_messages"])
            rate = work.native_eos_loop(client, source, sink, size["eos_messages"])
        else:
            work.kafka_fill(sides.bootstrap(side), source, size["eos_messages"])
            rate = work.kafka_eos_loop(sides.bootstrap(side), source, sink, size["eos_messages"])
        figures.add("eos", side, rate)
        sides.drop_topics()
    progress(_line(figures, round_, "eos"))


def _line(figures: Figures, round_: int, case: str) -> str:
    return f"  round {round_ + 1} {case}: " + ", ".join(
        f"{side} {figures.last(case, side):.0f}" for side in SIDES) + " msgs/s"


def _warm_up(sides: Sides, progress: Callable[[str], None]) -> None:
    """A transaction and a group's first commit on each Kafka-protocol side before any clock runs:
    Kafka creates its __transaction_state (50 partitions) and __consumer_offsets topics then."""
    t0 = time.perf_counter()
    for side in ("kafka", "gateway"):
        source, sink = sides.topic(side, "warm-in"), sides.topic(side, "warm-out")
        work.kafka_fill(sides.bootstrap(side), source, 10)
        work.kafka_eos_loop(sides.bootstrap(side), source, sink, 10)
    sides.drop_topics()
    progress(f"  warm-up (Kafka's internal topics, the gateway's coordinators): {time.perf_counter() - t0:.1f} s")


CASES = (  # (case key, row's case, partitions, pattern)
    ("produce/1", "idempotent produce", 1, None), ("produce/4", "idempotent produce", 4, None),
    ("consume/1", "read_committed consume", 1, None), ("consume/4", "read_committed consume", 4, None),
    ("loop/plain", "produce loop, flush every 100 ms", 1, "plain"),
    ("loop/txn_sync", "produce loop, commit every 100 ms", 1, "txn_sync"),
    ("loop/txn_async", "produce loop, commit every 100 ms", 1, "txn_async"),
    ("eos", "exactly-once consume-transform-produce", 1, None),
)


def peer_rows(figures: Figures, size: dict) -> list[dict]:
    """A row per (case, side): its median over rounds, the median of its rounds' ratios to Kafka
    (and, in the produce loop, to the same side's plain loop), and every round's figure."""
    rows = []
    for key, case, partitions, pattern in CASES:
        for side in SIDES:
            runs = figures.runs.get((key, side))
            if not runs:
                continue
            row = {"bench": "peers", "case": case, "partitions": partitions, "pattern": pattern or "",
                   "side": side, "client": CLIENTS[side], "msgs_per_s": round(statistics.median(runs), 1),
                   "over_kafka": figures.rate_ratio(key, side, key, "kafka") if (key, "kafka") in figures.runs
                   else figures.rate_ratio(key, side, "loop/txn_sync", "kafka"),
                   "over_plain": figures.rate_ratio(key, side, "loop/plain", side) if key.startswith("loop/")
                   else None, "runs": [round(r) for r in runs]}
            rows.append(row)
    for key, case in (("commit", "commit latency (begin, 1 send, commit)"),
                      ("e2e", "end-to-end latency (txn send to read_committed read)")):
        for side in SIDES:
            runs = figures.runs.get((key, side))
            if not runs:
                continue
            pooled = sorted(x for run in runs for x in run)
            rows.append({"bench": "peers", "case": case, "side": side, "client": CLIENTS[side],
                         "samples": len(pooled), "p50_ms": round(_percentile(pooled, 0.5), 3),
                         "p99_ms": round(_percentile(pooled, 0.99), 3),
                         "p50_over_kafka": figures.latency_ratio(key, side, 0.5),
                         "p99_over_kafka": figures.latency_ratio(key, side, 0.99),
                         "p50_runs": [round(_percentile(sorted(r), 0.5), 3) for r in runs]})
    return rows


TARGETS = (  # (what, case key, side, kind, least ratio to Kafka; kind "p50" is Kafka's p50 over ours)
    ("native >= Kafka on the exactly-once loop", "eos", "native", "rate", 1.0),
    ("native >= Kafka on commit latency p50", "commit", "native", "p50", 1.0),
    ("gateway >= 0.8 of Kafka on produce (1 partition)", "produce/1", "gateway", "rate", 0.8),
    ("gateway >= 0.8 of Kafka on produce (4 partitions)", "produce/4", "gateway", "rate", 0.8),
    ("gateway >= 0.8 of Kafka on consume (1 partition)", "consume/1", "gateway", "rate", 0.8),
    ("gateway >= 0.8 of Kafka on consume (4 partitions)", "consume/4", "gateway", "rate", 0.8),
    ("gateway >= 0.5 of Kafka on the exactly-once loop", "eos", "gateway", "rate", 0.5),
)


def target_rows(figures: Figures) -> list[dict]:
    """The issue's targets against Kafka, each with its ratio (higher is better) and whether it
    was met in this run."""
    rows = []
    for what, key, side, kind, least in TARGETS:
        if kind == "rate":
            ratio = figures.rate_ratio(key, side, key, "kafka")
        else:
            over = figures.latency_ratio(key, side, 0.5)
            ratio = None if over is None else round(1 / over, 3)
        if ratio is not None:
            rows.append({"bench": "peers", "target": what, "ratio_to_kafka": ratio, "least": least,
                         "met": ratio >= least})
    return rows


def bench_peers(short: bool = False, progress: Callable[[str], None] = print, **size: Any) -> list[dict]:
    """The peers bench (module docstring). ``size``: any of ``SIZES``' keys, over the defaults of
    ``short``; ``spark=False`` leaves the Spark rows out; ``kafka_bootstrap`` (host:port) uses that
    running broker instead of starting one."""
    unknown = sorted(set(size) - set(SIZES[short]))
    if unknown:
        raise rt.errors.InvalidArgument(f"bench peers has no size {', '.join(unknown)}; "
                                        f"it has {', '.join(SIZES[short])}")
    size = {**SIZES[short], **size}
    figures = Figures()
    rows: list[dict] = []
    with running_sides(str(size["kafka_bootstrap"])) as sides:
        _warm_up(sides, progress)
        for round_ in range(int(size["rounds"])):
            _round(sides, figures, size, round_, progress)
        rows += peer_rows(figures, size)
        rows += target_rows(figures)
        if size["spark"]:
            from raytxn.tools.bench_peers_spark import bench_spark_peers

            rows += bench_spark_peers(sides, int(size["spark_rows"]), int(size["spark_batch"]),
                                      int(size["rounds"]), progress)
    return rows
