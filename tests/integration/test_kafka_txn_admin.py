"""The transaction paths other frameworks use, through the Kafka gateway with real clients: EndTxn
from a new connection and a new gateway (Flink's KafkaSink resuming a transaction after a restart,
driven here by Kafka's own protocol messages over a socket since Flink is not here), KIP-447
fencing of a zombie's send_offsets_to_transaction (confluent-kafka), require_stable offset
fetches during a transaction, and the KIP-664 listings with kafka-python's KafkaAdminClient."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.kafka import wire
from raytxn.kafka.gateway import start_gateway
from raytxn.kafka.transactions import INVALID_TXN_STATE
from tests.engine import engine_client, new_topic, visible_values
from tests.kafka_clients import RawKafka, gateway_bootstrap, poll_values

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def bootstrap(client: rt.Client) -> Iterator[str]:
    yield from gateway_bootstrap()


@contextlib.contextmanager
def gateway() -> Iterator[dict[str, Any]]:
    """A gateway of its own (killed at the end, if the test did not kill it first)."""
    address = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1")
    try:
        yield address
    finally:
        with contextlib.suppress(Exception):
            ray.kill(address["actor"], no_restart=True)


class RawTxnProducer:
    """InitProducerId, AddPartitionsToTxn and transactional Produce over one raw connection."""

    def __init__(self, raw: RawKafka, transactional_id: str) -> None:
        from kafka.protocol.producer import InitProducerIdRequest

        self.raw, self.tid, self.sequence = raw, transactional_id, 0
        init = raw.call(InitProducerIdRequest, 3, transactional_id=transactional_id, transaction_timeout_ms=60000,
                        producer_id=-1, producer_epoch=-1)
        assert init.error_code == wire.NONE
        self.producer_id, self.epoch = init.producer_id, init.producer_epoch

    def send_in_txn(self, topic: str, values: list[bytes]) -> None:
        from kafka.protocol.producer import AddPartitionsToTxnRequest, ProduceRequest
        from kafka.record.memory_records import MemoryRecordsBuilder

        topics = [AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])]
        added = self.raw.call(AddPartitionsToTxnRequest, 3, v3_and_below_transactional_id=self.tid,
                              v3_and_below_producer_id=self.producer_id,
                              v3_and_below_producer_epoch=self.epoch, v3_and_below_topics=topics)
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == wire.NONE
        builder = MemoryRecordsBuilder(2, 0, 1 << 20, transactional=True, producer_id=self.producer_id,
                                       producer_epoch=self.epoch, base_sequence=self.sequence)
        for value in values:
            builder.append(int(time.time() * 1000), None, value)
        builder.close()
        self.sequence += len(values)
        data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=builder.buffer())])
        produced = self.raw.call(ProduceRequest, 7, transactional_id=self.tid, acks=-1, timeout_ms=30000,
                                 topic_data=[data])
        assert produced.responses[0].partition_responses[0].error_code == wire.NONE


def end_txn(bootstrap: str, tid: str, producer_id: int, epoch: int, commit: bool) -> int:
    """EndTxn from a connection of its own, holding only the transaction's ids (Flink's resume)."""
    from kafka.protocol.producer import EndTxnRequest

    raw = RawKafka(bootstrap)
    try:
        return raw.call(EndTxnRequest, 3, transactional_id=tid, producer_id=producer_id, producer_epoch=epoch,
                        committed=commit).error_code
    finally:
        raw.close()


def read_committed(bootstrap: str, topic: str, count: int, quiet_s: float = 1.0) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = [m.value() for m in poll_values(consumer, count, quiet_s=quiet_s)]
    consumer.close()
    return values


# --- EndTxn from a new connection and a new gateway (Flink's resume) -------------------------

def test_end_txn_from_a_second_connection_and_after_the_first_gateway_died(client: rt.Client, bootstrap: str) -> None:
    """A transaction begun on one connection is committed by an EndTxn from another connection
    holding only its producer id and epoch; one begun through a gateway that then died is
    committed from a connection to another gateway, and one aborted so leaves nothing. A
    repeated commit is success, an abort after the commit INVALID_TXN_STATE (never a silent
    success), and a fenced epoch's EndTxn is refused."""
    topic, tid = new_topic(client), f"flink-{uuid.uuid4().hex[:6]}"
    first = RawTxnProducer(RawKafka(bootstrap), tid)
    first.send_in_txn(topic, [b"a0", b"a1"])
    assert read_committed(bootstrap, topic, 0, quiet_s=0.5) == []                 # open: nothing visible yet
    assert end_txn(bootstrap, tid, first.producer_id, first.epoch, commit=True) == wire.NONE
    assert end_txn(bootstrap, tid, first.producer_id, first.epoch, commit=True) == wire.NONE  # a repeat
    assert end_txn(bootstrap, tid, first.producer_id, first.epoch, commit=False) == INVALID_TXN_STATE
    assert read_committed(bootstrap, topic, 2) == [b"a0", b"a1"]

    with gateway() as dying, gateway() as other:
        first.raw.close()
        resumed = RawTxnProducer(RawKafka(dying["bootstrap"]), tid)  # a new epoch, through a gateway that dies
        resumed.send_in_txn(topic, [b"b0"])
        resumed.send_in_txn(topic, [b"b1"])
        ray.kill(dying["actor"], no_restart=True)
        stale = end_txn(other["bootstrap"], tid, first.producer_id, first.epoch, commit=True)
        assert stale == wire.INVALID_PRODUCER_EPOCH                                   # the old epoch is fenced
        assert end_txn(other["bootstrap"], tid, resumed.producer_id, resumed.epoch, commit=True) == wire.NONE
        assert read_committed(other["bootstrap"], topic, 4) == [b"a0", b"a1", b"b0", b"b1"]

        aborted = RawTxnProducer(RawKafka(other["bootstrap"]), tid)
        aborted.send_in_txn(topic, [b"never"])
        aborted.raw.close()
        assert end_txn(bootstrap, tid, aborted.producer_id, aborted.epoch, commit=False) == wire.NONE
        assert end_txn(other["bootstrap"], tid, aborted.producer_id, aborted.epoch, commit=True) == \
            INVALID_TXN_STATE                                               # it aborted: no commit now
    assert read_committed(bootstrap, topic, 4) == [b"a0", b"a1", b"b0", b"b1"]
    assert visible_values(topic) == [b"a0", b"a1", b"b0", b"b1"]                  # raytxn's own read agrees


def test_a_confluent_transaction_is_committed_by_a_raw_end_txn_through_another_gateway(
        client: rt.Client, bootstrap: str) -> None:
    """confluent-kafka (librdkafka) produces in a transaction and stops without committing; a
    second gateway's connection commits it from the producer id and epoch the first gateway's
    DescribeTransactions shows, as Flink's committer does with what its checkpoint kept."""
    from confluent_kafka import Producer
    from kafka.protocol.admin.transactions import DescribeTransactionsRequest

    topic, tid = new_topic(client), f"ck-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 60000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    raw = RawKafka(bootstrap)
    described = raw.call(DescribeTransactionsRequest, 0, transactional_ids=[tid]).transaction_states[0]
    raw.close()
    assert (described.error_code, described.transaction_state) == (wire.NONE, "Ongoing")
    with gateway() as other:
        assert end_txn(other["bootstrap"], tid, described.producer_id, described.producer_epoch, True) == wire.NONE
    assert read_committed(bootstrap, topic, 3) == [b"v0", b"v1", b"v2"]
    del producer  # (its transaction is committed: nothing left to abort)


# --- KIP-447: a zombie's offsets are fenced by the group's generation ------------------------

def test_a_zombies_send_offsets_to_transaction_is_fenced_after_a_rebalance(client: rt.Client, bootstrap: str) -> None:
    """Two consumers of a group; the first is the zombie: it read a message under the old
    generation, then the group rebalanced (a second member joined and the zombie did not poll
    again). Its send_offsets_to_transaction carries the stale generation, is refused with a
    fencing error and its transaction cannot commit; nothing of its output or offsets lands.
    The live member's transaction commits its offset."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    source, sink, group = new_topic(client), new_topic(client), f"g-{uuid.uuid4().hex[:6]}"
    feeder = Producer({"bootstrap.servers": bootstrap})
    for i in range(4):
        feeder.produce(source, value=f"m{i}".encode(), partition=0)
    assert feeder.flush(30) == 0
    config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "isolation.level": "read_committed", "session.timeout.ms": 30000,
              "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 100,
              # the rebalance timeout (at least session.timeout.ms): a rebalance under way when a
              # member closes waits at most this, where librdkafka's close waits for it (with the
              # default, 300 s, a close once hung past 20 min here)
              "max.poll.interval.ms": 30000}
    zombie = Consumer(config)
    zombie.subscribe([source])
    taken = poll_values(zombie, 1, timeout_s=60)
    assert taken, "the first member got nothing"
    stale_metadata = zombie.consumer_group_metadata()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"z-{group}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(30)

    live = Consumer(config)
    rebalanced: list[Any] = []
    live.subscribe([source], on_assign=lambda consumer, partitions: rebalanced.append(partitions))
    # The second member's join rebalances the group (its on_assign runs, with the one partition
    # or none): the zombie's old metadata is one generation behind from then on.
    deadline = time.monotonic() + 60
    while not rebalanced and time.monotonic() < deadline:
        live.poll(0.1)
        zombie.poll(0.1)
    assert rebalanced, "the group never rebalanced"

    producer.begin_transaction()
    producer.produce(sink, value=b"zombie-output", partition=0)
    with pytest.raises(KafkaException) as fenced:
        producer.send_offsets_to_transaction([TopicPartition(source, 0, taken[0].offset() + 1)], stale_metadata, 30)
    assert fenced.value.args[0].code() in (22, 25, 82), fenced.value   # ILLEGAL_GENERATION & co.
    with contextlib.suppress(KafkaException):
        producer.abort_transaction(30)
    zombie.close()

    assert read_committed(bootstrap, sink, 0, quiet_s=0.5) == []                 # the zombie's output never landed
    committed = live.committed([TopicPartition(source, 0)], 30)[0].offset
    assert committed < 0                                                          # nor its offsets
    closing = threading.Thread(target=live.close, daemon=True)  # bounded: a stuck close fails, not hangs
    closing.start()
    closing.join(60)
    assert not closing.is_alive(), "the live member's close did not return in 60 s"


# --- require_stable --------------------------------------------------------------------------

def test_require_stable_fetch_waits_for_an_open_transactions_offsets(client: rt.Client, bootstrap: str) -> None:
    """A read_committed consumer's committed() (OffsetFetch v7, require_stable) during a
    transaction holding the group's offsets gets UNSTABLE_OFFSET_COMMIT (raw) and retries until it
    ended (confluent-kafka's committed() does that by itself), then reads the new offset."""
    import threading

    from confluent_kafka import Consumer, Producer, TopicPartition
    from kafka.protocol.consumer import OffsetFetchRequest

    source, sink, group = new_topic(client), new_topic(client), f"s-{uuid.uuid4().hex[:6]}"
    feeder = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        feeder.produce(source, value=f"m{i}".encode(), partition=0)
    assert feeder.flush(30) == 0
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"rs-{group}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(source, 0, 0)])
    assert len(poll_values(consumer, 3)) == 3
    producer.begin_transaction()
    producer.produce(sink, value=b"out", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 3)], consumer.consumer_group_metadata(), 30)

    raw = RawKafka(bootstrap)
    fetch = {"group_id": group, "require_stable": True,
             "topics": [OffsetFetchRequest.OffsetFetchRequestTopic(name=source, partition_indexes=[0])]}
    assert raw.call(OffsetFetchRequest, 7, **fetch).topics[0].partitions[0].error_code == wire.UNSTABLE_OFFSET_COMMIT
    unstable = raw.call(OffsetFetchRequest, 7, **{**fetch, "require_stable": False}).topics[0].partitions[0]
    assert (unstable.error_code, unstable.committed_offset) == (wire.NONE, -1)  # without: the committed one
    answer: list[Any] = []
    asking = threading.Thread(target=lambda: answer.append(consumer.committed([TopicPartition(source, 0)], 30)))
    asking.start()
    time.sleep(1.5)
    assert asking.is_alive() and not answer                                      # it waits while the txn is open
    producer.commit_transaction(30)
    asking.join(30)
    assert answer and answer[0][0].offset == 3                                    # then sees the new offset
    stable = raw.call(OffsetFetchRequest, 7, **fetch).topics[0].partitions[0]
    assert (stable.error_code, stable.committed_offset) == (wire.NONE, 3)
    raw.close()
    consumer.close()


# --- KIP-664 listings ------------------------------------------------------------------------

def test_list_describe_and_describe_producers_with_kafka_python_admin(client: rt.Client, bootstrap: str) -> None:
    """KafkaAdminClient's list_transactions (with state and producer id filters),
    describe_transactions and describe_producers see an open transaction (Ongoing, its
    partition, its start offset on the partition), then its commit (CompleteCommit, no open
    txn on the partition); an unknown id is TRANSACTIONAL_ID_NOT_FOUND, and
    find_hanging_transactions finds nothing hanging."""
    import kafka.errors as kafka_errors
    from confluent_kafka import Producer
    from kafka import KafkaAdminClient, TopicPartition

    topic, tid = new_topic(client), f"adm-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 45000,
                         "enable.idempotence": True})
    producer.init_transactions(30)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    plain.produce(topic, value=b"before", partition=0)
    assert plain.flush(30) == 0
    producer.begin_transaction()
    producer.produce(topic, value=b"in-txn", partition=0)
    assert producer.flush(30) == 0
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        listed = [t for ts in admin.list_transactions().values() for t in ts if t.transactional_id == tid]
        assert len(listed) == 1 and listed[0].state.value == "Ongoing"
        producer_id = listed[0].producer_id
        assert [t.transactional_id for ts in admin.list_transactions(producer_id_filters=[producer_id]).values()
                for t in ts] == [tid]
        assert not [t for ts in admin.list_transactions(state_filters=["CompleteCommit"]).values()
                    for t in ts if t.transactional_id == tid]
        described = admin.describe_transactions([tid])[tid]
        assert (described.state.value, described.producer_id) == ("Ongoing", producer_id)
        assert described.transaction_timeout_ms == 45000
        assert described.topic_partitions == {TopicPartition(topic, 0)}
        assert 0 < time.time() * 1000 - described.transaction_start_time_ms < 120_000
        producers = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)].active_producers
        in_txn = [p for p in producers if p.producer_id == producer_id]
        assert len(in_txn) == 1 and in_txn[0].current_transaction_start_offset == 1   # after "before" at 0
        assert in_txn[0].producer_epoch == described.producer_epoch and in_txn[0].last_sequence == 0
        others = [p for p in producers if p.producer_id != producer_id]
        assert len(others) == 1 and others[0].current_transaction_start_offset == -1  # the idempotent one
        assert others[0].last_timestamp > 0
        assert admin.find_hanging_transactions() == []                             # young, not hanging

        producer.commit_transaction(30)
        described = admin.describe_transactions([tid])[tid]
        assert (described.state.value, described.topic_partitions) == ("CompleteCommit", set())
        producers = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)].active_producers
        assert all(p.current_transaction_start_offset == -1 for p in producers)
        with pytest.raises(kafka_errors.BrokerResponseError) as unknown:
            admin.describe_transactions([f"nobody-{tid}"])
        assert unknown.value.errno == 105                                            # TRANSACTIONAL_ID_NOT_FOUND
        with pytest.raises(kafka_errors.BrokerResponseError) as no_partition:
            admin.describe_producers([TopicPartition(topic, 5)], broker_id=0)
        assert no_partition.value.errno == wire.UNKNOWN_TOPIC_OR_PARTITION
    finally:
        admin.close()


def test_the_listings_come_from_the_coordinators_so_a_new_gateway_gives_the_same(client: rt.Client) -> None:
    """A gateway that never served the producer lists and describes its open transaction the same
    (state, producer id and epoch, partitions): nothing of it is the first gateway's memory."""
    from kafka.protocol.admin.transactions import DescribeTransactionsRequest, ListTransactionsRequest

    topic, tid = new_topic(client), f"two-{uuid.uuid4().hex[:6]}"
    with gateway() as serving, gateway() as fresh:
        producer = RawTxnProducer(RawKafka(serving["bootstrap"]), tid)
        producer.send_in_txn(topic, [b"x"])
        answers = []
        for address in (serving, fresh):
            raw = RawKafka(address["bootstrap"])
            listed = raw.call(ListTransactionsRequest, 1, state_filters=["Ongoing", "NoSuchState"],
                              producer_id_filters=[producer.producer_id], duration_filter=-1)
            described = raw.call(DescribeTransactionsRequest, 0, transactional_ids=[tid]).transaction_states[0]
            raw.close()
            assert listed.unknown_state_filters == ["NoSuchState"]
            answers.append(([(t.transactional_id, t.transaction_state) for t in listed.transaction_states],
                            described.transaction_state, described.producer_epoch,
                            [(t.topic, t.partitions) for t in described.topics]))
        assert answers[0] == answers[1] == ([(tid, "Ongoing")], "Ongoing", producer.epoch, [(topic, [0])])
        assert end_txn(fresh["bootstrap"], tid, producer.producer_id, producer.epoch, commit=False) == wire.NONE
        producer.raw.close()


def test_kafka_transactions_tool_lists_and_describes(client: rt.Client, bootstrap: str) -> None:
    """Kafka's own kafka-transactions tool (org.apache.kafka.tools.TransactionsCommand, from the
    Kafka 4.x jars runtime/tools/peers.py fetches) lists, describes and finds no hanging
    transaction against the gateway."""
    from raytxn.tools.peers import PeerUnavailable, kafka_tools_jars

    java = shutil.which("java")
    try:
        jars = sorted(kafka_tools_jars().glob("*.jar"))
    except PeerUnavailable as e:
        pytest.skip(f"Kafka's tools cannot be fetched here: {e}")
    if java is None or not any(_holds(j, "org/apache/kafka/tools/TransactionsCommand.class") for j in jars):
        pytest.skip("no java, or the kafka-tools jars hold no org.apache.kafka.tools.TransactionsCommand")
    topic, tid = new_topic(client), f"tool-{uuid.uuid4().hex[:6]}"
    producer = RawTxnProducer(RawKafka(bootstrap), tid)
    producer.send_in_txn(topic, [b"x"])
    classpath = os.pathsep.join(str(j) for j in jars)

    def tool(*args: str) -> str:
        done = subprocess.run([java, "-cp", classpath, "org.apache.kafka.tools.TransactionsCommand",
                               "--bootstrap-server", bootstrap, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert tid in tool("list")
    described = tool("describe", "--transactional-id", tid)
    assert "Ongoing" in described and f"{topic}-0" in described
    assert tid not in tool("find-hanging", "--broker-id", "0")
    assert end_txn(bootstrap, tid, producer.producer_id, producer.epoch, commit=True) == wire.NONE
    producer.raw.close()


def _holds(jar: Path, member: str) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(jar) as archive:
            return member in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


# --- ray.data.read_kafka through the gateway -------------------------------------------------

@pytest.mark.extended  # the suite's budget (27 s, most of it read_kafka's timeout at the end)
@pytest.mark.slow(seconds=35)  # read_kafka's read_committed tasks wait out their timeout at the end
def test_ray_data_read_kafka_counts_kafka_native_and_transactional_messages_exactly(
        client: rt.Client, bootstrap: str) -> None:
    """``ray.data.read_kafka`` (confluent-kafka consumers in Ray tasks) through the gateway, read
    committed, on a two-partition topic holding plain Kafka messages, native raytxn messages, a
    committed and an aborted native transaction, and a committed and an aborted Kafka
    transaction: every visible message exactly once, none of the aborted ones."""
    from confluent_kafka import Producer

    topic = new_topic(client, partitions=2)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(3):
        plain.produce(topic, value=f"kafka-{i}".encode(), partition=i % 2)
    assert plain.flush(30) == 0
    native = client.create_producer(topic)
    for i in range(2):
        native.send(f"native-{i}".encode(), key=f"k{i}")
    with client.transaction() as txn:
        for i in range(2):
            native.send(f"native-txn-{i}".encode(), key=f"t{i}", txn=txn)
    doomed = client.new_transaction()
    native.send(b"native-aborted", txn=doomed)
    doomed.abort()
    kafka_txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"rd-{uuid.uuid4().hex[:6]}"})
    kafka_txn.init_transactions(30)
    kafka_txn.begin_transaction()
    for i in range(2):
        kafka_txn.produce(topic, value=f"kafka-txn-{i}".encode(), partition=i % 2)
    kafka_txn.commit_transaction(30)
    kafka_txn.begin_transaction()
    kafka_txn.produce(topic, value=b"kafka-aborted", partition=0)
    kafka_txn.abort_transaction(30)

    dataset = ray.data.read_kafka(topic, bootstrap_servers=bootstrap, timeout_ms=20000,
                                  consumer_config={"isolation.level": "read_committed"})
    values = sorted(bytes(row["value"]) for row in dataset.take_all())
    assert values == sorted([*(f"kafka-{i}".encode() for i in range(3)), b"native-0", b"native-1",
                             b"native-txn-0", b"native-txn-1", b"kafka-txn-0", b"kafka-txn-1"])
