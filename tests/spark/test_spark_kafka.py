"""Spark's own Kafka source (spark-sql-kafka-0-10, the connector Spark users read Kafka with) as a
batch: through raytxn's Kafka gateway on a raytxn topic whose transactions leave marker and
aborted-data gaps in the offsets, and on a real Apache Kafka 4 broker with the same assertions.
One Ray engine with one gateway, one broker, the package's one Spark session (which has the
connector's jars, tests/spark/conftest.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import raytxn as rt
from tests.engine import engine_client, visible_values
from tests.kafka_clients import gateway_bootstrap
from tests.peers import create_kafka_topic, running_broker

pytestmark = [pytest.mark.ray, pytest.mark.spark, pytest.mark.slow(120)]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def gateway(client: rt.Client) -> Iterator[str]:
    yield from gateway_bootstrap()


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    for broker in running_broker():
        yield broker.bootstrap


def spark_read(spark: Any, bootstrap: str, topic: str, isolation: str = "read_committed",
               starting: str = "earliest", ending: str = "latest") -> list[tuple[int, int, bytes]]:
    """One batch of Spark's Kafka source: (partition, offset, value) of every row, sorted."""
    frame = (spark.read.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic)
             .option("startingOffsets", starting)
             .option("endingOffsets", ending)
             .option("kafka.isolation.level", isolation)
             .load())
    return sorted((row.partition, row.offset, bytes(row.value)) for row in
                  frame.select("partition", "offset", "value").collect())


def test_spark_reads_a_raytxn_topic_with_marker_gaps_through_the_gateway(
        spark_kafka: Any, client: rt.Client, gateway: str) -> None:
    """raytxn's own transactions (native client) leave Kafka-offset gaps through the gateway: each
    commit or abort marker takes an offset, and the aborted data is there for read_uncommitted
    only. Spark's source reads across the gaps, from and to given offsets too (a range that
    starts on a marker and ends before the last transaction)."""
    topic = f"sk-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    producer = client.create_producer(topic)
    with client.transaction() as txn:
        producer.send(b"a0", txn=txn)          # 0
        producer.send(b"a1", txn=txn)          # 1, marker 2
    aborted = client.new_transaction()
    producer.send(b"b0", txn=aborted)          # 3
    producer.send(b"b1", txn=aborted)          # 4, marker 5
    aborted.abort()
    producer.send(b"c0")                       # 6
    with client.transaction() as txn:
        producer.send(b"d0", txn=txn)          # 7, marker 8

    assert spark_read(spark_kafka, gateway, topic) == [(0, 0, b"a0"), (0, 1, b"a1"), (0, 6, b"c0"), (0, 7, b"d0")]
    assert spark_read(spark_kafka, gateway, topic, isolation="read_uncommitted") == [
        (0, 0, b"a0"), (0, 1, b"a1"), (0, 3, b"b0"), (0, 4, b"b1"), (0, 6, b"c0"), (0, 7, b"d0")]
    ranged = spark_read(spark_kafka, gateway, topic, starting=json.dumps({topic: {"0": 2}}),
                        ending=json.dumps({topic: {"0": 7}}))
    assert ranged == [(0, 6, b"c0")]
    assert visible_values(topic) == [b"a0", b"a1", b"c0", b"d0"]   # what raytxn's own read path shows


def kafka_transactions(bootstrap: str, topic: str) -> None:
    """The same offsets as the native test's: commit a0 a1, abort b0 b1, plain c0, commit d0."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"a0", partition=0)
    producer.produce(topic, value=b"a1", partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"b0", partition=0)
    producer.produce(topic, value=b"b1", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    plain.produce(topic, value=b"c0", partition=0)
    assert plain.flush(30) == 0
    producer.begin_transaction()
    producer.produce(topic, value=b"d0", partition=0)
    producer.commit_transaction(30)


@pytest.mark.parametrize("peer", ["raytxn-gateway", "kafka"])
def test_spark_batch_over_kafka_transactions_the_same_on_gateway_and_kafka(
        spark_kafka: Any, client: rt.Client, request: pytest.FixtureRequest, peer: str) -> None:
    """A Kafka transactional producer's commits and aborts, then Spark's Kafka source: the same
    rows, offsets and gaps on the gateway as on a real broker (the differential test of Spark's
    source)."""
    topic = f"sk-{uuid.uuid4().hex[:8]}"
    if peer == "kafka":
        bootstrap = request.getfixturevalue("kafka")
        create_kafka_topic(bootstrap, topic, 1)
    else:
        bootstrap = request.getfixturevalue("gateway")
        client.create_topic(topic, 1)
    kafka_transactions(bootstrap, topic)
    assert spark_read(spark_kafka, bootstrap, topic) == [(0, 0, b"a0"), (0, 1, b"a1"), (0, 6, b"c0"), (0, 7, b"d0")]
    assert spark_read(spark_kafka, bootstrap, topic, isolation="read_uncommitted") == [
        (0, 0, b"a0"), (0, 1, b"a1"), (0, 3, b"b0"), (0, 4, b"b1"), (0, 6, b"c0"), (0, 7, b"d0")]
    assert spark_read(spark_kafka, bootstrap, topic, starting=json.dumps({topic: {"0": 2}}),
                      ending=json.dumps({topic: {"0": 7}})) == [(0, 6, b"c0")]
