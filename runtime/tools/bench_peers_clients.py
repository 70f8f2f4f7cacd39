"""The workloads of ``raytxn bench peers`` (``bench_peers``), one function per workload and client.

Each workload runs the same way through confluent-kafka (against the real Kafka broker or
raytxn's gateway: the ``bootstrap`` argument says which) and through the native raytxn client, so
that a round of ``bench_peers`` can run it on all three sides and take ratios. Messages are 100 B;
every function measures from its first send or read (clients made, connected and warm before).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from typing import Any

import raytxn as rt
from raytxn.tools.bench_kafka import PAYLOAD

WINDOW_S = 0.1            # a transaction (or a flush) per 100 ms in the produce loops
SENDS_PER_CHECK = 200     # sends between two looks at the clock (as bench produce does)
EOS_BATCH = 1000          # input messages per transaction of the consume-transform-produce loop
READ_TIMEOUT_S = 60.0     # a read that stalls this long fails the bench
TXN_TIMEOUT_MS = 60_000

# A consumer's fetch returns as soon as data is there; this bounds the wait when it is not (the
# end-to-end latency's consumer waits on an empty topic between messages).
FETCH_WAIT_MS = 100


def _producer_config(bootstrap: str, **extra: Any) -> dict:
    # sticky.partitioning.linger.ms 0: librdkafka's sticky partitioner otherwise sends keyless
    # messages produced this fast to one partition for long stretches (bench_kafka's note).
    return {"bootstrap.servers": bootstrap, "linger.ms": 5, "sticky.partitioning.linger.ms": 0, **extra}


def _check(err: Any, _msg: Any, failed: list[Any]) -> None:
    if err is not None:
        failed.append(err)


def _produce_one(producer: Any, topic: str, value: bytes = PAYLOAD) -> None:
    while True:
        try:
            producer.produce(topic, value)
            return
        except BufferError:  # librdkafka's local queue is full: serve delivery reports, then retry
            producer.poll(0.01)


def transactional_producer(bootstrap: str, name: str, **extra: Any) -> Any:
    """A confluent-kafka producer with a fresh transactional.id, ``init_transactions`` done."""
    from confluent_kafka import Producer

    producer = Producer(_producer_config(bootstrap, **{"transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
                                                       "transaction.timeout.ms": TXN_TIMEOUT_MS, **extra}))
    producer.init_transactions(30)
    return producer


# --- the produce loop: a flush or a commit every 100 ms ---------------------------------------


def kafka_loop(bootstrap: str, topic: str, seconds: float, transactional: bool) -> float:
    """Committed (or, plain, acknowledged) msgs/s of confluent-kafka's loop: produce for 100 ms,
    then ``commit_transaction`` (which flushes; ``begin_transaction`` before the next window) or,
    plain, ``flush`` of an idempotent producer; for ``seconds``."""
    from confluent_kafka import Producer

    failed: list[Any] = []
    report = {"on_delivery": lambda err, msg: _check(err, msg, failed)}
    if transactional:
        producer = transactional_producer(bootstrap, "bench-peers-loop", **report)
    else:
        producer = Producer(_producer_config(bootstrap, **{"enable.idempotence": True, "acks": "all", **report}))
    producer.list_topics(topic, timeout=30)
    sent = 0
    start = time.perf_counter()
    run_end = start + seconds
    while time.perf_counter() < run_end:
        if transactional:
            producer.begin_transaction()
        window_end = time.perf_counter() + WINDOW_S
        while time.perf_counter() < window_end:
            for _ in range(SENDS_PER_CHECK):
                _produce_one(producer, topic)
            producer.poll(0)
            sent += SENDS_PER_CHECK
        if transactional:
            producer.commit_transaction(30)
        elif producer.flush(READ_TIMEOUT_S):
            raise RuntimeError("confluent-kafka producer: messages left undelivered after a flush")
    elapsed = time.perf_counter() - start
    if failed:
        raise RuntimeError(f"confluent-kafka producer: {len(failed)} failed ({failed[:3]})")
    return sent / elapsed


def native_loop(client: rt.Client, topic: str, seconds: float, mode: str) -> float:
    """The same loop with the native client. ``plain``: ``send_async``, ``flush`` every window.
    ``txn_sync``: the synchronous pattern (``new_transaction()``, ``send_async`` in it, ``commit()``
    in the sender's thread). ``txn_async``: the pipelined one (``bench produce``'s txn mode): the
    next txn begun while this one sends, each commit in the background while the next sends."""
    producer = client.create_producer(topic, batching_max_delay_ms=2)
    committer = concurrent.futures.ThreadPoolExecutor(1)
    commits: list[concurrent.futures.Future] = []
    next_txn = client.new_transaction_async(timeout=60) if mode == "txn_async" else None
    sent = 0
    start = time.perf_counter()
    run_end = start + seconds
    while time.perf_counter() < run_end:
        txn = None
        if mode == "txn_async":
            assert next_txn is not None
            txn = next_txn.result()
            next_txn = client.new_transaction_async(timeout=60)
        elif mode == "txn_sync":
            txn = client.new_transaction(timeout=60)
        window_end = time.perf_counter() + WINDOW_S
        while time.perf_counter() < window_end:
            for _ in range(SENDS_PER_CHECK):
                producer.send_async(PAYLOAD, txn=txn)
            sent += SENDS_PER_CHECK
        if mode == "txn_async":
            commits.append(committer.submit(txn.commit))
        elif mode == "txn_sync":
            txn.commit()
        else:
            producer.flush()
    for commit in commits:
        commit.result()
    elapsed = time.perf_counter() - start
    if next_txn is not None:
        next_txn.result().abort()  # begun for a window that never came
    committer.shutdown()
    producer.close()
    return sent / elapsed


# --- commit latency: begin, one send, commit -------------------------------------------------


def kafka_commit_latencies(bootstrap: str, topic: str, samples: int) -> list[float]:
    """ms of ``begin_transaction``, one ``produce``, ``commit_transaction``, one after another."""
    producer = transactional_producer(bootstrap, "bench-peers-commit")
    producer.list_topics(topic, timeout=30)
    for _ in range(3):  # the first txn of a producer registers its partition with the coordinator
        producer.begin_transaction()
        producer.produce(topic, PAYLOAD)
        producer.commit_transaction(30)
    latencies = []
    for _ in range(samples):
        t0 = time.perf_counter()
        producer.begin_transaction()
        producer.produce(topic, PAYLOAD)
        producer.commit_transaction(30)
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


def native_commit_latencies(client: rt.Client, topic: str, samples: int) -> list[float]:
    """ms of ``new_transaction()``, one synchronous ``send``, ``commit()``."""
    producer = client.create_producer(topic)
    for _ in range(3):
        txn = client.new_transaction()
        producer.send(PAYLOAD, txn=txn)
        txn.commit()
    latencies = []
    for _ in range(samples):
        t0 = time.perf_counter()
        txn = client.new_transaction()
        producer.send(PAYLOAD, txn=txn)
        txn.commit()
        latencies.append((time.perf_counter() - t0) * 1000)
    producer.close()
    return latencies


# --- end-to-end latency: produced in a txn, seen by a read_committed consumer -----------------


def _stamp() -> bytes:
    return time.perf_counter_ns().to_bytes(8, "big") + PAYLOAD[8:]


def _age_ms(value: bytes) -> float:
    return (time.perf_counter_ns() - int.from_bytes(value[:8], "big")) / 1e6


def _wait_seen(seen: threading.Event) -> None:
    if not seen.wait(READ_TIMEOUT_S):
        raise RuntimeError(f"end-to-end: a committed message was not read in {READ_TIMEOUT_S}s")
    seen.clear()


def kafka_end_to_end(bootstrap: str, topic: str, samples: int) -> list[float]:
    """ms from ``produce`` (in a txn, committed at once) to a ``read_committed`` consumer's
    ``poll`` returning it, one message at a time; the consumer polls in a thread."""
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-e2e-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": FETCH_WAIT_MS})
    consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
    producer = transactional_producer(bootstrap, "bench-peers-e2e")
    latencies: list[float] = []
    seen, stop = threading.Event(), threading.Event()

    def read() -> None:
        while not stop.is_set():
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                latencies.append(_age_ms(message.value()))
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        time.sleep(0.5)  # the consumer's first fetch (its offset lookup) is not part of a sample
        for _ in range(samples + 3):
            producer.begin_transaction()
            producer.produce(topic, _stamp())
            producer.commit_transaction(30)
            _wait_seen(seen)
    finally:
        stop.set()
        reader.join(5)
        consumer.close()
    return latencies[3:]


def native_end_to_end(client: rt.Client, topic: str, samples: int) -> list[float]:
    """ms from ``send`` (in a txn, committed at once) to a subscription consumer's ``receive``."""
    consumer = client.subscribe(topic, f"bench-e2e-{uuid.uuid4().hex[:6]}")
    producer = client.create_producer(topic)
    latencies: list[float] = []
    seen, stop = threading.Event(), threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                message = consumer.receive(timeout=0.05)
            except rt.errors.Timeout:
                continue
            latencies.append(_age_ms(message.value()))
            consumer.acknowledge(message)
            seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for _ in range(samples + 3):
            txn = client.new_transaction()
            producer.send(_stamp(), txn=txn)
            txn.commit()
            _wait_seen(seen)
    finally:
        stop.set()
        reader.join(5)
        consumer.close()
        producer.close()
    return latencies[3:]


# --- the exactly-once consume-transform-produce loop ------------------------------------------


def kafka_eos_loop(bootstrap: str, source: str, sink: str, count: int) -> float:
    """msgs/s of confluent-kafka's exactly-once loop: a group consumer (read_committed) takes up
    to ``EOS_BATCH`` messages, a transaction produces each upper-cased to ``sink``, sends the
    consumer's positions (``send_offsets_to_transaction``) and commits; until ``count`` inputs.
    Timed from the first batch's arrival (the group join before it is not the loop's)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-eos-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": FETCH_WAIT_MS})
    consumer.subscribe([source])
    producer = transactional_producer(bootstrap, "bench-peers-eos")
    done, start = 0, None
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while done < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"exactly-once loop: {done} of {count} inputs in {READ_TIMEOUT_S}s")
            batch = consumer.consume(min(EOS_BATCH, count - done), timeout=0.1)
            if not batch:
                continue
            start = start or time.perf_counter()
            producer.begin_transaction()
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"confluent-kafka consumer: {message.error()}")
                _produce_one(producer, sink, message.value().upper())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            done += len(batch)
            deadline = time.monotonic() + READ_TIMEOUT_S
    finally:
        consumer.close()
    assert start is not None
    return count / (time.perf_counter() - start)


def native_eos_loop(client: rt.Client, source: str, sink: str, count: int) -> float:
    """The same loop with the native client: ``receive_batch`` of up to ``EOS_BATCH``, a
    transaction that ``send_batch``es the upper-cased values to ``sink`` and acks the batch in
    it, ``commit()``; timed from the first batch's arrival."""
    consumer = client.subscribe(source, f"bench-eos-{uuid.uuid4().hex[:6]}", initial_position="earliest",
                                receiver_queue_size=EOS_BATCH * 2)
    producer = client.create_producer(sink)
    done, start = 0, None
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while done < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"exactly-once loop: {done} of {count} inputs in {READ_TIMEOUT_S}s")
            batch = consumer.receive_batch(max_messages=min(EOS_BATCH, count - done), timeout_s=0.1)
            if not batch.num_rows:
                continue
            start = start or time.perf_counter()
            txn = client.new_transaction()
            producer.send_batch([value.upper() for value in batch.table.column("value").to_pylist()], txn=txn)
            batch.ack(txn=txn)
            txn.commit()
            done += batch.num_rows
            deadline = time.monotonic() + READ_TIMEOUT_S
    finally:
        consumer.close()
        producer.close()
    assert start is not None
    return count / (time.perf_counter() - start)


def kafka_fill(bootstrap: str, topic: str, count: int) -> None:
    """``count`` messages into ``topic`` (an idempotent producer, all acknowledged)."""
    from raytxn.tools.bench_kafka import _kafka_produce

    _kafka_produce(bootstrap, topic, count)


def native_fill(client: rt.Client, topic: str, count: int) -> None:
    producer = client.create_producer(topic)
    producer.send_batch([PAYLOAD] * count)
    producer.flush()
    producer.close()

