"""Kafka consumer groups and offsets through the gateway, with real Kafka clients (confluent-kafka,
kafka-python) and no mocks: a local Ray, an engine on file:// storage, a gateway actor on a free
port of 127.0.0.1. Group membership is the gateway's; committed offsets are the cursors of the
raytxn subscriptions named after the groups."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.kafka.gateway import start_gateway
from tests.engine import engine_client, new_topic, nothing_more, receive_all

pytestmark = pytest.mark.ray

FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300, "fetch.wait.max.ms": 100,
              "topic.metadata.refresh.interval.ms": 2000}


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def gateway(client: rt.Client) -> Iterator[dict[str, Any]]:
    address = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1")
    try:
        yield address
    finally:
        ray.kill(address["actor"], no_restart=True)


@pytest.fixture
def bootstrap(gateway: dict[str, Any]) -> str:
    return gateway["bootstrap"]


def group_consumer(bootstrap: str, group: str, **config: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, **FAST_GROUP, **config})


def poll_values(consumer: Any, count: int, timeout_s: float = 30, quiet_s: float = 0.0) -> list[Any]:
    """Messages until ``count`` came (then ``quiet_s`` more, to see that nothing else comes)."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None:
            assert message.error() is None, message.error()
            out.append(message)
        if len(out) >= count:
            quiet_until = quiet_until or time.monotonic() + quiet_s
            if time.monotonic() >= quiet_until:
                break
    return out


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 1) -> None:
    """Message i to partition i mod ``partitions``, through the gateway."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions)
    assert producer.flush(30) == 0


def test_a_group_consumer_commits_and_the_next_one_resumes_after_it(client: rt.Client, bootstrap: str) -> None:
    from confluent_kafka import TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    topic, group = new_topic(client, partitions=2), f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [f"a{i}".encode() for i in range(10)], partitions=2)
    first = group_consumer(bootstrap, group)
    first.subscribe([topic])
    got = poll_values(first, 10)
    assert sorted(m.value() for m in got) == sorted(f"a{i}".encode() for i in range(10))
    first.commit(asynchronous=False)
    committed = first.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 5), (1, 5)]
    first.close()

    produce(bootstrap, topic, [f"b{i}".encode() for i in range(4)], partitions=2)
    second = group_consumer(bootstrap, group)
    second.subscribe([topic])
    got = poll_values(second, 4, quiet_s=1.0)
    assert sorted(m.value() for m in got) == [b"b0", b"b1", b"b2", b"b3"]
    second.commit(message=got[-1], asynchronous=False)   # one partition's offset, past that message
    second.close()
    # The offsets are the subscription's cursor, so another client sees them too ...
    other = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    assert other.committed(KpTopicPartition(topic, got[-1].partition())) == got[-1].offset() + 1
    assert other.committed(KpTopicPartition(topic, 1 - got[-1].partition())) == 5
    other.close()
    # ... and raytxn's: a raytxn consumer of the subscription named after the group gets exactly
    # what was not committed.
    last = got[-1]
    uncommitted = sorted(m.value() for m in got if m.partition() != last.partition() or m.offset() > last.offset())
    native = client.subscribe(topic, group)
    assert sorted(m.value() for m in receive_all(native, len(uncommitted))) == uncommitted
    assert nothing_more(native)
    native.close()

