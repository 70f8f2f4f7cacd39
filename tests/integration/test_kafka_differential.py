"""Differential tests: the gateway's real-client scenarios run, with the same client code and the
same assertions, against raytxn's Kafka gateway and against a real Apache Kafka 4 broker (one
KRaft node on loopback, from ``raytxn.tools.peers``). So the assertions hold Kafka's behaviour,
not only the gateway's. Where the two differ, a test below named ``test_difference_...`` says
how (docs: the peers note's list of differences).

One Ray engine with one gateway, and one broker, each alive only while its half of the module
runs (the ``peer`` fixture is module-scoped and parametrized, so pytest runs all tests of one
peer, then all of the other's)."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.kafka.gateway import start_gateway
from tests.engine import engine_client
from tests.kafka_clients import poll_values
from tests.peers import create_kafka_topic, running_broker

pytestmark = [pytest.mark.ray, pytest.mark.slow(seconds=7)]  # each test, alone: 22 ran in 158 s loaded

GATEWAY, KAFKA = "raytxn-gateway", "kafka"

# As in test_kafka_groups: a long session (a group's first commit starts actors on the gateway),
# quick heartbeats and fetch waits so no test waits out a timer.
FAST_GROUP = {"session.timeout.ms": 30000, "heartbeat.interval.ms": 300, "fetch.wait.max.ms": 100,
              "topic.metadata.refresh.interval.ms": 2000}


@dataclass
class Peer:
    """A Kafka-protocol endpoint and how to make a topic on it."""

    name: str
    bootstrap: str
    make_topic: Callable[[str, int], None]

    def new_topic(self, partitions: int = 1) -> str:
        topic = f"d-{uuid.uuid4().hex[:8]}"
        self.make_topic(topic, partitions)
        return topic


def gateway_peer(request: pytest.FixtureRequest) -> Iterator[Peer]:
    tmp_path_factory = request.getfixturevalue("tmp_path_factory")
    request.getfixturevalue("ray_session")
    engine = engine_client(tmp_path_factory)
    client: rt.Client = next(engine)
    address = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1", initial_rebalance_delay_ms=0)
    try:
        yield Peer(GATEWAY, address["bootstrap"], client.create_topic)
    finally:
        ray.kill(address["actor"], no_restart=True)
        engine.close()   # closes the client and stops the engine (engine_client's finally)


def kafka_peer() -> Iterator[Peer]:
    for broker in running_broker():
        yield Peer(KAFKA, broker.bootstrap, functools.partial(create_kafka_topic, broker.bootstrap))


@pytest.fixture(scope="module", params=[GATEWAY, KAFKA])
def peer(request: pytest.FixtureRequest) -> Iterator[Peer]:
    yield from (gateway_peer(request) if request.param == GATEWAY else kafka_peer())


# --- client helpers (the same for both peers) ---------------------------------------------------

def consumer_at(bootstrap: str, topic: str, isolation: str, partition: int = 0) -> Any:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, partition, 0)])
    return consumer


def group_consumer(bootstrap: str, group: str, **config: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, **FAST_GROUP, **config})


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 1) -> None:
    """Message i to partition i mod ``partitions``, idempotently."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % partitions)
    assert producer.flush(30) == 0


def transactional_producer(bootstrap: str, transactional_id: str) -> Any:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 60000, "linger.ms": 5})
    producer.init_transactions(60)
    return producer


def read_committed_values(bootstrap: str, topic: str, count: int, partition: int = 0) -> list[bytes]:
    consumer = consumer_at(bootstrap, topic, "read_committed", partition)
    values = [m.value() for m in poll_values(consumer, count, quiet_s=0.5)]
    consumer.close()
    return values


# --- the scenarios ------------------------------------------------------------------------------

def test_idempotent_produce_offsets_keys_headers_and_watermarks(peer: Peer) -> None:
    from confluent_kafka import Producer

    topic = peer.new_topic(partitions=2)
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": peer.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(10):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2,
                         headers=[("h", b"x")], on_delivery=lambda e, m: delivered.append((e, m)))
    assert producer.flush(30) == 0
    assert all(error is None for error, _ in delivered)
    assert sorted((m.partition(), m.offset()) for _, m in delivered) == sorted((i % 2, i // 2) for i in range(10))
    got = []
    for partition in (0, 1):
        consumer = consumer_at(peer.bootstrap, topic, "read_uncommitted", partition)
        got += [(m.partition(), m.offset(), m.key(), m.value(), m.headers()) for m in poll_values(consumer, 5)]
        assert consumer.get_watermark_offsets(consumer.assignment()[0], timeout=30) == (0, 5)
        consumer.close()
    assert sorted(got) == sorted((i % 2, i // 2, f"k{i}".encode(), f"v{i}".encode(), [("h", b"x")])
                                 for i in range(10))


def test_read_committed_skips_aborted_and_waits_for_open_transactions(peer: Peer) -> None:
    """Each transaction's marker takes an offset; read_committed never shows aborted data, and
    holds back everything after an open transaction (the last stable offset) until it ends."""
    topic = peer.new_topic()
    txn = transactional_producer(peer.bootstrap, f"tx-{topic}")
    txn.begin_transaction()
    txn.produce(topic, value=b"committed", partition=0)          # 0, marker 1
    txn.commit_transaction(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"aborted-1", partition=0)          # 2
    txn.produce(topic, value=b"aborted-2", partition=0)          # 3, marker 4
    txn.flush(30)
    txn.abort_transaction(30)
    produce(peer.bootstrap, topic, [f"plain-{i}".encode() for i in range(5)])   # 5..9
    txn.begin_transaction()
    txn.produce(topic, value=b"open", partition=0)               # 10: holds back what follows
    txn.flush(30)
    produce(peer.bootstrap, topic, [b"after-open"])             # 11

    committed = consumer_at(peer.bootstrap, topic, "read_committed")
    values = [m.value() for m in poll_values(committed, 6, quiet_s=1.5)]
    assert values == [b"committed", *(f"plain-{i}".encode() for i in range(5))]
    uncommitted = consumer_at(peer.bootstrap, topic, "read_uncommitted")
    values = [(m.offset(), m.value()) for m in poll_values(uncommitted, 10, quiet_s=1.0)]
    assert values == [(0, b"committed"), (2, b"aborted-1"), (3, b"aborted-2"),
                      *((5 + i, f"plain-{i}".encode()) for i in range(5)), (10, b"open"), (11, b"after-open")]
    uncommitted.close()
    txn.commit_transaction(30)                                   # marker 12
    later = poll_values(committed, 2, quiet_s=0.5)
    assert [(m.offset(), m.value()) for m in later] == [(10, b"open"), (11, b"after-open")]
    assert committed.get_watermark_offsets(committed.assignment()[0], timeout=30) == (0, 13)
    committed.close()


def test_a_group_consumer_commits_and_the_next_one_resumes_after_it(peer: Peer) -> None:
    from confluent_kafka import TopicPartition

    topic, group = peer.new_topic(partitions=2), f"g-{uuid.uuid4().hex[:8]}"
    produce(peer.bootstrap, topic, [f"a{i}".encode() for i in range(10)], partitions=2)
    first = group_consumer(peer.bootstrap, group)
    first.subscribe([topic])
    assert sorted(m.value() for m in poll_values(first, 10)) == sorted(f"a{i}".encode() for i in range(10))
    first.commit(asynchronous=False)
    committed = first.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 5), (1, 5)]
    first.close()

    produce(peer.bootstrap, topic, [f"b{i}".encode() for i in range(4)], partitions=2)
    second = group_consumer(peer.bootstrap, group)
    second.subscribe([topic])
    assert sorted(m.value() for m in poll_values(second, 4, quiet_s=0.5)) == [b"b0", b"b1", b"b2", b"b3"]
    second.commit(asynchronous=False)
    committed = second.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 7), (1, 7)]
    second.close()


def rewind_to_committed(consumer: Any) -> None:
    """After an abort: fetch again from the committed offsets (Kafka's EOS loop does this)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    for tp in consumer.committed(consumer.assignment(), timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def take(consumer: Any, most: int, wait_s: float = 1.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + wait_s
    while len(out) < most and time.monotonic() < deadline:
        message = consumer.poll(0.05)
        if message is not None:
            assert message.error() is None, message.error()
            out.append(message)
    return out


def test_consume_transform_produce_with_send_offsets_and_an_aborted_round(peer: Peer) -> None:
    """send_offsets_to_transaction: the offsets commit with the output or not at all. The first
    round aborts: neither its output nor its offsets are ever visible, and the loop redoes its
    inputs from the committed offsets."""
    from confluent_kafka import TopicPartition

    source, sink, group = peer.new_topic(partitions=2), peer.new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    inputs = [f"in-{i}".encode() for i in range(16)]
    produce(peer.bootstrap, source, inputs, partitions=2)
    consumer = group_consumer(peer.bootstrap, group, **{"isolation.level": "read_committed"})
    consumer.subscribe([source])
    producer = transactional_producer(peer.bootstrap, f"eos-{group}")
    parts = [TopicPartition(source, 0), TopicPartition(source, 1)]
    rounds = 0
    while sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=30)) < len(inputs):
        rounds += 1
        assert rounds <= 60, "no progress after 60 rounds"
        batch = take(consumer, 6)
        if not batch:
            continue
        producer.begin_transaction()
        for message in batch:
            producer.produce(sink, value=message.value().upper(), partition=0)
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        if rounds == 1:
            producer.abort_transaction(30)
            assert all(tp.offset < 0 for tp in consumer.committed(parts, timeout=30))
            rewind_to_committed(consumer)
            continue
        producer.commit_transaction(30)
    consumer.close()
    assert sorted(read_committed_values(peer.bootstrap, sink, len(inputs))) == sorted(v.upper() for v in inputs)
    later = group_consumer(peer.bootstrap, group, **{"isolation.level": "read_committed"})
    assert [tp.offset for tp in later.committed(parts, timeout=30)] == [8, 8]
    later.close()


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(peer: Peer) -> None:
    from confluent_kafka import KafkaError, KafkaException

    topic = peer.new_topic()
    transactional_id = f"tx-{topic}"
    zombie = transactional_producer(peer.bootstrap, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"committed", partition=0)
    zombie.commit_transaction(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    zombie.flush(30)
    successor = transactional_producer(peer.bootstrap, transactional_id)   # fences, aborts the open txn
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal() and fenced.value.args[0].code() == KafkaError._FENCED
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=0)
    successor.commit_transaction(30)
    assert read_committed_values(peer.bootstrap, topic, 2) == [b"committed", b"successor"]


def test_offsets_for_times_and_max_timestamp(peer: Peer) -> None:
    from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    topic, empty = peer.new_topic(), peer.new_topic()
    producer = Producer({"bootstrap.servers": peer.bootstrap, "enable.idempotence": True})
    for i, timestamp in enumerate((1_000, 2_000, 3_000)):
        producer.produce(topic, value=f"v{i}".encode(), timestamp=timestamp, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": peer.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    found = consumer.offsets_for_times([TopicPartition(topic, 0, 1_500)], timeout=30)
    assert [(tp.offset, tp.error) for tp in found] == [(1, None)]
    assert consumer.offsets_for_times([TopicPartition(topic, 0, 3_000)], timeout=30)[0].offset == 2
    assert consumer.offsets_for_times([TopicPartition(topic, 0, 3_001)], timeout=30)[0].offset == -1
    consumer.assign(found)
    assert [(m.offset(), m.value(), m.timestamp()[1]) for m in poll_values(consumer, 2, quiet_s=0.5)] == [
        (1, b"v1", 2_000), (2, b"v2", 3_000)]
    consumer.close()
    producer.produce(topic, value=b"v3", timestamp=2_500, partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": peer.bootstrap})
    asked = {TopicPartition(topic, 0): OffsetSpec.max_timestamp(), TopicPartition(empty, 0): OffsetSpec.max_timestamp()}
    answers = {tp.topic: future.result(timeout=30) for tp, future in admin.list_offsets(
        asked, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30).items()}
    assert (answers[topic].offset, answers[topic].timestamp) == (2, 3_000)
    assert answers[empty].offset == -1


def test_unknown_topic_metadata_is_unknown_topic_or_partition(peer: Peer) -> None:
    from confluent_kafka import KafkaError, Producer

    producer = Producer({"bootstrap.servers": peer.bootstrap, "allow.auto.create.topics": False})
    unknown = producer.list_topics(topic=f"no-such-{uuid.uuid4().hex[:6]}", timeout=30)
    (topic,) = unknown.topics.values()
    assert topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


# --- the differences, named ---------------------------------------------------------------------

def wait_until_gone(admin: Any, topic: str, timeout_s: float = 30) -> None:
    """Kafka deletes a topic asynchronously: its metadata may list it a moment after the answer."""
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics(timeout=30).topics:
        assert time.monotonic() < deadline, f"{topic} still listed {timeout_s} s after its deletion"
        time.sleep(0.2)


def create_error(admin: Any, topic: Any, **options: Any) -> Any:
    """The KafkaError a CreateTopics of ``topic`` (a NewTopic) answered, or None."""
    from confluent_kafka import KafkaException

    try:
        admin.create_topics([topic], request_timeout=30, **options)[topic.topic].result(30)
    except KafkaException as e:
        return e.args[0]
    return None


def test_create_describe_and_delete_topics_with_the_admin_client(peer: Peer) -> None:
    """confluent-kafka's AdminClient makes a compacted topic with a retention, reads its configs
    back, is refused an existing name, an unknown config, a bad partition count and a bad
    replication factor, validates without creating, and deletes."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

    admin = AdminClient({"bootstrap.servers": peer.bootstrap})
    topic = f"d-admin-{uuid.uuid4().hex[:8]}"
    configs = {"cleanup.policy": "compact", "retention.ms": "60000"}
    assert create_error(admin, NewTopic(topic, 3, 1, config=configs)) is None
    assert len(admin.list_topics(topic=topic, timeout=30).topics[topic].partitions) == 3
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource], request_timeout=30)[resource].result(30)
    assert described["cleanup.policy"].value == "compact" and described["retention.ms"].value == "60000"
    assert described["retention.bytes"].value == "-1" and described["retention.bytes"].is_default
    assert create_error(admin, NewTopic(topic, 3, 1)).code() == KafkaError.TOPIC_ALREADY_EXISTS
    other = f"d-admin-{uuid.uuid4().hex[:8]}"
    assert create_error(admin, NewTopic(other, 1, 1, config={"no.such.config": "1"})).code() == \
        KafkaError.INVALID_CONFIG
    assert create_error(admin, NewTopic(other, 1, 1, config={"retention.ms": "soon"})).code() == \
        KafkaError.INVALID_CONFIG
    assert create_error(admin, NewTopic(other, 1, 0)).code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert create_error(admin, NewTopic(other, 1, 1), validate_only=True) is None
    assert other not in admin.list_topics(timeout=30).topics  # validated only: not created
    missing = ConfigResource(ResourceType.TOPIC, other)
    with pytest.raises(Exception) as unknown:
        admin.describe_configs([missing], request_timeout=30)[missing].result(30)
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert admin.delete_topics([topic], request_timeout=30)[topic].result(30) is None
    wait_until_gone(admin, topic)
    with pytest.raises(Exception) as gone:
        admin.delete_topics([topic], request_timeout=30)[topic].result(30)
    assert gone.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_a_compacted_topic_made_by_create_topics_keeps_keys_only(peer: Peer) -> None:
    """A topic created with cleanup.policy=compact through the admin client refuses a keyless
    record (INVALID_RECORD on both: Kafka's compacted log takes keyed records only)."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": peer.bootstrap})
    topic = f"d-compact-{uuid.uuid4().hex[:8]}"
    assert create_error(admin, NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})) is None
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": peer.bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": 20000})
    producer.produce(topic, key=b"k", value=b"kept", partition=0, on_delivery=lambda e, m: delivered.append(e))
    assert producer.flush(30) == 0
    producer.produce(topic, value=b"keyless", partition=0, on_delivery=lambda e, m: delivered.append(e))
    producer.flush(30)
    assert delivered[0] is None and delivered[1] is not None
    assert delivered[1].code() == KafkaError.INVALID_RECORD, delivered[1]


def assignment_error(bootstrap: str, topic: str) -> int:
    """The error code of a CreateTopics of ``topic`` with one partition assigned to broker 1
    (kafka-python: confluent-kafka refuses an assignment locally in this version)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError as KafkaPythonError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, -1, -1, replica_assignments={0: [1]})])
    except KafkaPythonError as e:
        return int(e.errno)
    finally:
        admin.close()
    return 0


def test_difference_topic_configs_and_replicas(peer: Peer) -> None:
    """Difference 1: Kafka takes every topic config it defines, a replication factor up to its
    brokers and explicit replica assignments. The gateway honours cleanup.policy (delete or
    compact), retention.ms and retention.bytes, accepts the configs object storage makes moot
    (min.insync.replicas, segment.*), and refuses what it would not do (compact,delete,
    min.compaction.lag.ms: INVALID_CONFIG) and replica assignments (INVALID_REPLICA_ASSIGNMENT);
    any replication factor is taken, since the replicas are the object store's."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": peer.bootstrap})

    def name() -> str:
        return f"d-cfg-{uuid.uuid4().hex[:8]}"

    assert create_error(admin, NewTopic(name(), 1, 1, config={"min.insync.replicas": "1",
                                                              "segment.bytes": "1048576"})) is None
    both = create_error(admin, NewTopic(name(), 1, 1, config={"cleanup.policy": "compact,delete"}))
    lag = create_error(admin, NewTopic(name(), 1, 1, config={"min.compaction.lag.ms": "1000"}))
    assigned = assignment_error(peer.bootstrap, name())
    replicated = create_error(admin, NewTopic(name(), 1, 3))
    if peer.name == KAFKA:
        assert both is None and lag is None and assigned == 0
        assert replicated.code() == KafkaError.INVALID_REPLICATION_FACTOR  # one broker
    else:
        assert both.code() == KafkaError.INVALID_CONFIG and lag.code() == KafkaError.INVALID_CONFIG
        assert assigned == KafkaError.INVALID_REPLICA_ASSIGNMENT
        assert replicated is None


def test_difference_internal_topics_are_kafkas_only(peer: Peer) -> None:
    """Difference 2: Kafka keeps group offsets in its internal topic ``__consumer_offsets`` and
    lists it (once a group committed); the gateway keeps them as raytxn subscription cursors and
    answers the name with TOPIC_EXCEPTION (an invalid topic name there)."""
    from confluent_kafka import KafkaError, Producer

    topic, group = peer.new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    produce(peer.bootstrap, topic, [b"x"])
    consumer = group_consumer(peer.bootstrap, group)
    consumer.subscribe([topic])
    assert len(poll_values(consumer, 1)) == 1
    consumer.commit(asynchronous=False)
    consumer.close()
    producer = Producer({"bootstrap.servers": peer.bootstrap, "allow.auto.create.topics": False})
    internal = producer.list_topics(topic="__consumer_offsets", timeout=30).topics["__consumer_offsets"]
    if peer.name == KAFKA:
        assert internal.error is None and len(internal.partitions) >= 1
    else:
        assert internal.error is not None and internal.error.code() == KafkaError.TOPIC_EXCEPTION


def test_difference_auto_topic_creation_is_kafkas_only(peer: Peer) -> None:
    """Difference 3: Kafka (auto.create.topics.enable, on by default) creates a topic a producer
    names; the gateway never creates one (a raytxn topic's partition count is chosen when it is
    created), so the delivery fails with an unknown-topic error."""
    from confluent_kafka import KafkaError, Producer

    topic = f"d-auto-{uuid.uuid4().hex[:8]}"
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": peer.bootstrap, "allow.auto.create.topics": True,
                         "topic.metadata.propagation.max.ms": 2000, "message.timeout.ms": 15000})
    producer.produce(topic, value=b"x", on_delivery=lambda e, m: delivered.append((e, m)))
    producer.flush(30)
    ((error, message),) = delivered
    if peer.name == KAFKA:
        assert error is None and message.offset() == 0
    else:
        assert error is not None and error.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._MSG_TIMED_OUT), error


def api_keys(bootstrap: str) -> set[int]:
    """The API keys a broker advertises in ApiVersions v0 (a plain socket, no client library)."""
    import socket
    import struct

    host, port = bootstrap.rsplit(":", 1)
    body = struct.pack(">hhih", 18, 0, 1, 1) + b"t"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        answer = sock.recv(size, socket.MSG_WAITALL)
    correlation, error, count = struct.unpack(">ihi", answer[:10])
    assert (correlation, error) == (1, 0)
    return {struct.unpack(">h", answer[10 + 6 * i:12 + 6 * i])[0] for i in range(count)}


# What a client of the gateway has and a client of Kafka also has: produce, fetch, metadata,
# offsets, transactions, classic consumer groups and their admin, topic admin (CreateTopics 19,
# DeleteTopics 20, DescribeConfigs 32). SASL (17, 36) and the KIP-664 transaction listings (61,
# 65, 66) are served by both too.
COMMON_APIS = {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22, 24, 25, 26, 28, 32, 36, 42, 47,
               61, 65, 66}
# Kafka's only: AlterConfigs 33, CreatePartitions 37, DescribeCluster 60, KIP-848's
# ConsumerGroupHeartbeat 68, share groups 76.
KAFKA_ONLY_APIS = {33, 37, 60, 68, 76}


def test_difference_the_gateway_serves_a_subset_of_kafkas_apis(peer: Peer) -> None:
    """Difference 4: the gateway serves the client APIs of produce, fetch, transactions, classic
    groups and topic admin (create, delete, describe configs), and no config changes or
    partition additions, nor KIP-848's consumer group protocol (group.protocol=consumer) or
    share groups."""
    keys = api_keys(peer.bootstrap)
    assert COMMON_APIS <= keys
    if peer.name == KAFKA:
        assert KAFKA_ONLY_APIS <= keys
    else:
        assert keys == COMMON_APIS
