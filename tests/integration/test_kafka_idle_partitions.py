"""A consumer of many idle partitions through the Kafka gateway (``kafka.idle_partitions``): the
gateway watches each idle partition once instead of reading it on every Fetch, and what is
produced to one of them later still comes at once. Real clients (confluent-kafka, which never opens
a fetch session, and kafka-python), a local Ray, an engine on file:// storage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.ids import partition_actor_name
from raytxn.kafka.gateway import start_gateway
from tests.engine import engine_client, new_topic
from tests.kafka_clients import gateway_stats, poll_values

pytestmark = pytest.mark.ray

PARTITIONS = 8
WAIT_MS = 100  # the consumers' fetch.wait.max.ms: ten Fetches a second while nothing comes


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, actor_hosts=1)  # eight partitions, one process


@pytest.fixture(scope="module")
def gateways(client: rt.Client) -> Iterator[dict[bool, dict[str, Any]]]:
    """A gateway that watches idle partitions (the default) and one that reads every partition of
    every Fetch, as before."""
    started = {watch: start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1", watch_idle=watch)
               for watch in (True, False)}
    try:
        yield started
    finally:
        for address in started.values():
            ray.kill(address["actor"], no_restart=True)


def _reads(topic: str) -> list[int]:
    """How often the gateway has called ``kafka_read`` on each partition of ``topic``."""
    return [ActorRef(partition_actor_name(topic, p)).call("stats")["kafka_reads"] for p in range(PARTITIONS)]


def _idle_consumer(bootstrap: str, topic: str, isolation: str = "read_committed") -> Any:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": isolation, "fetch.wait.max.ms": WAIT_MS})
    consumer.list_topics(topic, timeout=30)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return consumer


def _idle_for(consumer: Any, seconds: float, until: Callable[[], bool] | None = None) -> None:
    """Poll ``consumer`` (nothing comes) for ``seconds``, or with ``until``, until it holds (at most
    ``seconds``: it fails after)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        message = consumer.poll(0.1)
        assert message is None or message.error() is not None, "nothing was produced"
        if until is not None and until():
            return
    assert until is None, f"not so after {seconds} s of fetches"


def _produced_then_received_s(consumer: Any, produce: Any) -> tuple[float, list[Any]]:
    """Seconds from the produce's acknowledgement to the consumer's message, and the message."""
    produce()
    acked = time.monotonic()
    got = poll_values(consumer, 1, timeout_s=30)
    return time.monotonic() - acked, got


@pytest.mark.slow(seconds=25)
def test_idle_partitions_are_watched_once_not_read_on_every_fetch(client: rt.Client,
                                                                  gateways: dict[bool, dict[str, Any]]) -> None:
    """Eight partitions with nothing to read, a confluent-kafka consumer fetching ten times a
    second: the watching gateway reads each partition a few times (two reads find it idle, then
    one watch call stands for ``WATCH_S``), where the reading gateway reads each on every Fetch
    (its wait is one more call per partition). Fails without the watch: 3 s of fetches read each
    partition tens of times."""
    reads = {}
    for watch, address in gateways.items():
        topic = new_topic(client, partitions=PARTITIONS)
        consumer = _idle_consumer(address["bootstrap"], topic)
        try:
            if watch:  # the first Fetches: two reads of each find it idle, then it is watched
                # (until each is: on a loaded machine the consumer's first Fetches can take seconds)
                _idle_for(consumer, 30.0,
                          lambda at=address: gateway_stats(at)["idle_partitions"]["watched"] >= PARTITIONS)
            else:
                _idle_for(consumer, 1.0)
            before = _reads(topic)
            _idle_for(consumer, 3.0)
            reads[watch] = [after - b for after, b in zip(_reads(topic), before, strict=True)]
        finally:
            consumer.close()
    assert max(reads[True]) <= 2, reads  # a watch call at most (one ending and the next, at a WATCH_S edge)
    assert min(reads[False]) >= 20, reads  # ~30 Fetches in 3 s, each a read and a wait per partition
    stats = gateway_stats(gateways[True])["idle_partitions"]
    assert stats["answered"] >= PARTITIONS * 20 and stats["watched"] >= PARTITIONS, stats
    assert gateway_stats(gateways[False])["idle_partitions"] is None


@pytest.mark.slow(seconds=20)
def test_what_is_produced_to_a_watched_partition_comes_at_once(client: rt.Client,
                                                               gateways: dict[bool, dict[str, Any]]) -> None:
    """A message produced to a watched partition (plain, then in a transaction read committed)
    reaches the consumer within a Fetch's wait, not a watch's ``WATCH_S``; after it, the partition
    is read again (and watched again once idle), so what comes next comes too."""
    from confluent_kafka import Producer

    address = gateways[True]
    topic = new_topic(client, partitions=PARTITIONS)
    consumer = _idle_consumer(address["bootstrap"], topic)
    producer = Producer({"bootstrap.servers": address["bootstrap"], "enable.idempotence": True})
    txn_producer = Producer({"bootstrap.servers": address["bootstrap"], "transactional.id": f"idle-{uuid.uuid4()}"})
    txn_producer.init_transactions(60)
    try:
        _idle_for(consumer, 1.5)
        assert gateway_stats(address)["idle_partitions"]["watched"] >= PARTITIONS

        def plain(partition: int, value: bytes) -> Any:
            def produce() -> None:
                producer.produce(topic, value, partition=partition)
                assert producer.flush(30) == 0
            return produce

        def in_txn() -> None:
            txn_producer.begin_transaction()
            txn_producer.produce(topic, b"committed", partition=5)
            txn_producer.commit_transaction(30)

        for produce, partition, value in ((plain(3, b"first"), 3, b"first"), (in_txn, 5, b"committed"),
                                          (plain(3, b"again"), 3, b"again")):
            _idle_for(consumer, 0.5)  # idle again: watched again
            seconds, got = _produced_then_received_s(consumer, produce)
            assert [(m.partition(), m.value()) for m in got] == [(partition, value)]
            assert seconds < 2.0, (value, seconds)  # a Fetch's wait is 0.1 s; a watch's 10 s
    finally:
        consumer.close()


@pytest.mark.slow(seconds=15)
def test_kafka_python_reads_what_comes_to_idle_partitions(client: rt.Client,
                                                          gateways: dict[bool, dict[str, Any]]) -> None:
    """kafka-python (which would open a fetch session: the gateway answers sessionless, so it sends
    full Fetches) consumes a message produced to one of eight watched partitions at once."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    address = gateways[True]
    topic = new_topic(client, partitions=PARTITIONS)
    consumer = KafkaConsumer(bootstrap_servers=address["bootstrap"], enable_auto_commit=False, group_id=None,
                             fetch_max_wait_ms=WAIT_MS, isolation_level="read_committed")
    consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    consumer.seek_to_beginning()
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            assert not consumer.poll(timeout_ms=100)
        assert gateway_stats(address)["idle_partitions"]["watched"] >= PARTITIONS
        producer = KafkaProducer(bootstrap_servers=address["bootstrap"], acks="all")
        producer.send(topic, b"late", partition=6).get(timeout=30)
        producer.close()
        acked, got = time.monotonic(), []
        while not got and time.monotonic() - acked < 30:
            got = [r for records in consumer.poll(timeout_ms=100).values() for r in records]
        assert [(r.partition, r.value) for r in got] == [(6, b"late")]
        assert time.monotonic() - acked < 2.0
    finally:
        consumer.close()
