"""Benchmark of several Kafka gateways (issue 57): ``bench_gateways(short=False) -> rows``.

Two client processes at once, each a confluent-kafka producer and then a consumer (assign mode,
read_committed) of its own 4-partition topic (N keyless 100 B messages each), against one gateway
and against a peer group of two (``start_gateways``), in the same run, rounds alternating the two.
Each process connects and fetches metadata first (a producer also writes one message to each
partition and waits for it: a partition's actor starts on first use, and the bench measures a
running gateway, not that start), then waits for a start time given to both; a consumer assigns
its partitions only then (assigned before, librdkafka would fetch them all ahead of the start).
The figure is the two clients' messages over the time from that start to the later one's last
message (produce: delivery reports; consume: the last message). The ratio two/one is the figure;
the one-gateway run is its floor, measured the same way on the same machine.

On one machine the two gateways share its cores with the engine's actors and the clients, so the
ratio says what a second process buys when the cores are there, not what two nodes would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.config import SubscriptionConfig
from raytxn.ids import NAMESPACE

PAYLOAD = b"x" * 100
PARTITIONS = 4
CLIENTS = 2
START_DELAY_S = 4.0   # set-up time of a client process before the common start
CLIENT_TIMEOUT_S = 300.0
PEER_GROUP = "bench"


def _client_main(op: str, bootstrap: str, topic: str, count: int, start_at: float) -> None:
    """One client process: ``op`` ("produce" or "consume") ``count`` messages of ``topic`` from
    ``start_at`` (wall clock); prints the wall time it was done at, as JSON."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    if op == "produce":
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                             "sticky.partitioning.linger.ms": 0})
        producer.list_topics(topic, timeout=30)
        for partition in range(PARTITIONS):  # warm-up, before the start: see the docstring
            producer.produce(topic, PAYLOAD, partition=partition)
        if producer.flush(CLIENT_TIMEOUT_S):
            raise SystemExit("warm-up messages undelivered")
        time.sleep(max(0.0, start_at - time.time()))
        for _ in range(count):
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
        time.sleep(max(0.0, start_at - time.time()))
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        count += PARTITIONS  # the producer's warm-up messages
        got, deadline = 0, time.monotonic() + CLIENT_TIMEOUT_S
        while got < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"consumed {got} of {count}")
            got += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
        consumer.close()
    print(json.dumps({"done_at": time.time()}))


def _clients(op: str, bootstraps: list[str], topics: list[str], count: int) -> float:
    """msgs/s of ``CLIENTS`` processes at once, one per topic, client i bootstrapped on
    ``bootstraps[i]``."""
    start_at = time.time() + START_DELAY_S
    procs = [subprocess.Popen([sys.executable, "-m", "raytxn.tools.bench_gateways", op, bootstrap, topic,
                               str(count), repr(start_at)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for bootstrap, topic in zip(bootstraps, topics, strict=True)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=CLIENT_TIMEOUT_S + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"bench client failed ({proc.returncode}): {err[-2000:]}")
        done.append(json.loads(out.strip().splitlines()[-1])["done_at"])
    return len(topics) * count / (max(done) - start_at)


def bench_gateways(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    from raytxn.kafka.gateway import start_gateway, start_gateways, stop_gateways

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-gateways-')}",
                        subscription=SubscriptionConfig())
    count, rounds = (20_000, 2) if short else (200_000, 3)
    single: dict[str, Any] | None = None
    rates: dict[str, dict[str, list[float]]] = {op: {"one": [], "two": []} for op in ("produce", "consume")}
    try:
        options = {"bind_host": "127.0.0.1", "advertised_host": "127.0.0.1",
                   "num_coordinators": client.config.coordinator.num_coordinators}
        single = start_gateway(0, **options)
        pair = start_gateways(2, 0, peer_group=PEER_GROUP, **options)
        bootstraps = {"one": [single["bootstrap"]] * CLIENTS, "two": [g["bootstrap"] for g in pair]}
        for round_ in range(rounds):
            for setup in (("one", "two") if round_ % 2 == 0 else ("two", "one")):
                topics = [f"bench-gw-{setup}-{i}-{time.monotonic_ns()}" for i in range(CLIENTS)]
                for topic in topics:
                    client.create_topic(topic, PARTITIONS)
                for op in ("produce", "consume"):
                    rates[op][setup].append(_clients(op, bootstraps[setup], topics, count))
                for topic in topics:
                    client.delete_topic(topic)
            progress(f"  round {round_ + 1}/{rounds}: " + ", ".join(
                f"{op} one {rates[op]['one'][-1]:8.0f} two {rates[op]['two'][-1]:8.0f}" for op in rates) + " msgs/s")
    finally:
        if single is not None:
            ray.kill(single["actor"], no_restart=True)
        stop_gateways(PEER_GROUP)
        client.close()
        stop_engine()
        if started_ray:
            ray.shutdown()
    rows = gateway_rows(count, rates)
    for row in rows:
        progress(f"  {row['op']}: one gateway {row['one_gateway_msgs_per_s']:.0f}, two "
                 f"{row['two_gateways_msgs_per_s']:.0f} msgs/s, two/one {row['two_over_one']:.3f}")
    return rows


def gateway_rows(count: int, rates: dict[str, dict[str, list[float]]]) -> list[dict]:
    """A row per operation: the best round of one gateway and of two (``rates[op]``: msgs/s of
    every round of "one" and "two") and their ratio."""
    rows = []
    for op, sides in rates.items():
        one, two = max(sides["one"]), max(sides["two"])
        rows.append({"bench": "gateways", "op": op, "clients": CLIENTS, "partitions": PARTITIONS,
                     "message_bytes": len(PAYLOAD), "messages_per_client": count, "rounds": len(sides["one"]),
                     "one_gateway_msgs_per_s": round(one, 1), "two_gateways_msgs_per_s": round(two, 1),
                     "two_over_one": round(two / one, 3),
                     "one_gateway_runs": [round(r) for r in sides["one"]],
                     "two_gateways_runs": [round(r) for r in sides["two"]]})
    return rows


if __name__ == "__main__":  # a client process of the bench
    _client_main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
