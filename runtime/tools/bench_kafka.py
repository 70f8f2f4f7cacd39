"""Benchmark of the Kafka-protocol gateway (issue 18): ``bench_kafka(short=False) -> rows``.

Real Kafka clients through the gateway against the native raytxn client, on the same engine in
the same run, each figure also a ratio gateway/native of the best rounds:

* produce: N keyless messages of 100 B with confluent-kafka's ``Producer`` (idempotent, so
  acks=all; librdkafka's default batching, ``linger.ms`` 5), timed from the first ``produce``
  until every delivery report came (``flush``), vs ``Producer.send_async`` + ``flush`` of the
  same N on another topic;
* consume: each topic's N read back, the Kafka one by a confluent-kafka ``Consumer`` in assign
  mode (the gateway serves no consumer groups yet: no commits, ``isolation.level``
  read_committed, ``consume`` of up to 1,000 messages a call), the native one by a subscription
  consumer (``receive_batch`` + one range ack per batch). Timed from the first read call (the
  consumer made, assigned or subscribed before) to the N-th message; the time to the first
  message is also in the row (the best round's), as it weighs on a short run: librdkafka's first
  fetch comes after its offset request (its metadata is fetched before the clock starts).

The Kafka producer sets ``sticky.partitioning.linger.ms`` 0: with librdkafka's default sticky
partitioner, keyless messages produced this fast all go to one partition for long stretches, and
the 4-partition case would be a 1-partition one.

On 1 and 4 partitions; rounds alternate the two clients (the order swapped every round), each on
fresh topics, and the best round of each counts (the machine may be shared). Runs a whole engine
on a file:// store in a temporary directory, on the Ray this process is connected to, or on a
fresh local one that it stops at the end; the gateway actor listens on a free port of 127.0.0.1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import raytxn as rt
from raytxn.tools.bench_engine import local_engine_with_gateway
from raytxn.tools.bench_subscription import BATCH_MESSAGES, BATCH_QUEUE  # the same batches, the same queue

PAYLOAD = b"x" * 100
CONSUME_CALL = 1000        # messages per confluent consume() call
READ_TIMEOUT_S = 60.0      # a read that stalls this long fails the bench


def _kafka_produce(bootstrap: str, topic: str, count: int) -> float:
    """Seconds to produce ``count`` messages with confluent-kafka until all delivery reports came."""
    from confluent_kafka import Producer

    failed: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "sticky.partitioning.linger.ms": 0, "on_delivery": report})
    producer.list_topics(topic, timeout=30)  # connected, metadata known: not part of the timing
    t0 = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, PAYLOAD)
                break
            except BufferError:  # the local queue is full: serve delivery reports, then retry
                producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(READ_TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if left or failed:
        raise RuntimeError(f"confluent-kafka producer: {left} undelivered, {len(failed)} failed ({failed[:3]})")
    return seconds


def _native_produce(client: rt.Client, topic: str, count: int) -> float:
    """Seconds to ``send_async`` ``count`` messages and ``flush`` them (all acknowledged)."""
    producer = client.create_producer(topic)
    t0 = time.perf_counter()
    futures = [producer.send_async(PAYLOAD) for _ in range(count)]
    producer.flush()
    futures[-1].result()
    seconds = time.perf_counter() - t0
    producer.close()
    return seconds


def _kafka_consume(bootstrap: str, topic: str, partitions: int, count: int) -> tuple[float, float]:
    """Seconds for a confluent-kafka consumer in assign mode to read ``count`` messages, and
    seconds to its first message."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raytxn-bench-unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})
    # Its metadata first, as a consumer that is made and ready: assigned before librdkafka knows
    # the partitions' leader, it arms its offset-query retry timer (500 ms) and sends ListOffsets
    # only when that fires, on any broker (its debug log: "no current leader for partition:
    # (re)starting offset query timer"); that was 0.5 s of the 0.53 s to the first message.
    consumer.list_topics(topic, timeout=READ_TIMEOUT_S)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got = 0
    first = None
    t0 = time.perf_counter()
    deadline = time.monotonic() + READ_TIMEOUT_S
    while got < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"confluent-kafka consumer: {got} of {count} messages in {READ_TIMEOUT_S}s")
        for message in consumer.consume(min(CONSUME_CALL, count - got), timeout=0.1):
            if message.error() is not None:
                raise RuntimeError(f"confluent-kafka consumer: {message.error()}")
            got += 1
        if got and first is None:
            first = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    consumer.close()
    assert first is not None
    return seconds, first


def _native_consume(client: rt.Client, topic: str, count: int) -> tuple[float, float]:
    """Seconds for a subscription consumer to ``receive_batch`` and range-ack ``count`` messages,
    and seconds to its first message."""
    consumer = client.subscribe(topic, "bench", initial_position=rt.InitialPosition.Earliest,
                                receiver_queue_size=BATCH_QUEUE)
    got = 0
    future = first = None
    t0 = time.perf_counter()
    deadline = time.monotonic() + READ_TIMEOUT_S
    while got < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"raytxn consumer: {got} of {count} messages in {READ_TIMEOUT_S}s")
        batch = consumer.receive_batch(max_messages=min(BATCH_MESSAGES, count - got), timeout_s=0.1)
        if batch.num_rows:
            got += batch.num_rows
            future = batch.ack_async()
            if first is None:
                first = time.perf_counter() - t0
    assert future is not None and first is not None
    future.result()
    seconds = time.perf_counter() - t0
    consumer.close()
    return seconds, first


def bench_kafka(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    rows: list[dict] = []
    count = 5_000 if short else 100_000
    rounds = 2 if short else 3
    with local_engine_with_gateway("raytxn-bench-kafka-") as (client, gateway):
        for partitions in (1, 4):
            rows += _partitions(client, gateway["bootstrap"], partitions, count, rounds, progress)
    return rows


def _partitions(client: rt.Client, bootstrap: str, partitions: int, count: int, rounds: int,
                progress: Callable[[str], None]) -> list[dict]:
    rates: dict[str, dict[str, list[float]]] = {op: {"gateway": [], "native": []} for op in ("produce", "consume")}
    first: dict[str, list[float]] = {"gateway": [], "native": []}
    for round_ in range(rounds):
        order = ("gateway", "native") if round_ % 2 == 0 else ("native", "gateway")
        for side in order:
            topic = f"bench-kafka-{side}-{partitions}-{time.monotonic_ns()}"
            client.create_topic(topic, partitions)
            if side == "gateway":
                produced = _kafka_produce(bootstrap, topic, count)
                consumed, first_s = _kafka_consume(bootstrap, topic, partitions, count)
            else:
                produced = _native_produce(client, topic, count)
                consumed, first_s = _native_consume(client, topic, count)
            client.delete_topic(topic)
            rates["produce"][side].append(count / produced)
            rates["consume"][side].append(count / consumed)
            first[side].append(first_s)
        progress(f"  {partitions} partition(s) round {round_ + 1}/{rounds}: " + ", ".join(
            f"{op} gateway {rates[op]['gateway'][-1]:8.0f} native {rates[op]['native'][-1]:8.0f}"
            for op in ("produce", "consume")) + " msgs/s")
    rows = kafka_rows(partitions, count, rates, first)
    for row in rows:
        progress(f"  {partitions} partition(s) {row['op']} (best rounds): gateway {row['gateway_msgs_per_s']:.0f}, "
                 f"native {row['native_msgs_per_s']:.0f} msgs/s, gateway/native {row['gateway_over_native']:.3f}")
    return rows


def kafka_rows(partitions: int, count: int, rates: dict[str, dict[str, list[float]]],
               first_message_s: dict[str, list[float]]) -> list[dict]:
    """A row per operation ("produce", "consume"): the best round of each side (``rates[op]``:
    msgs/s of every round of "gateway" and "native") and their ratio gateway/native; the consume
    row also has each side's shortest time to the first message (``first_message_s``: seconds,
    every round of "gateway" and "native")."""
    clients = {"produce": ("confluent-kafka Producer (idempotent, acks=all)", "Producer.send_async + flush"),
               "consume": ("confluent-kafka Consumer (assign, read_committed)", "receive_batch + range ack")}
    rows = []
    for op, sides in rates.items():
        gateway, native = max(sides["gateway"]), max(sides["native"])
        rows.append({"bench": "kafka", "op": op, "partitions": partitions, "message_bytes": len(PAYLOAD),
                     "messages": count, "rounds": len(sides["gateway"]), "gateway_client": clients[op][0],
                     "native_client": clients[op][1], "gateway_msgs_per_s": round(gateway, 1),
                     "native_msgs_per_s": round(native, 1), "gateway_over_native": round(gateway / native, 3),
                     "gateway_runs": [round(r) for r in sides["gateway"]],
                     "native_runs": [round(r) for r in sides["native"]]})
        for side in ("gateway", "native"):
            rows[-1][f"{side}_first_message_ms"] = (round(min(first_message_s[side]) * 1000, 1)
                                                    if op == "consume" else None)
    return rows
