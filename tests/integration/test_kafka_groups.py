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
from tests.kafka_clients import RawKafka, poll_values

pytestmark = pytest.mark.ray

# A group's first commit creates its subscription and starts the subscription's actors, seconds
# under CI load; librdkafka holds the member's heartbeats behind that commit on the same
# connection and, at a 6 s session timeout, once gave up the session (client-side) and rejoined,
# failing the commit with ILLEGAL_GENERATION. No test here waits out a member's session.
FAST_GROUP = {"session.timeout.ms": 30000, "heartbeat.interval.ms": 300, "fetch.wait.max.ms": 100,
              "topic.metadata.refresh.interval.ms": 2000}


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.fixture(scope="module")
def gateway(client: rt.Client) -> Iterator[dict[str, Any]]:
    # No initial rebalance delay (as Kafka's own tests set it): every group here would wait 3 s
    # before its first generation. test_consumers_started_together_... runs with the default.
    address = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1", initial_rebalance_delay_ms=0)
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
    got = poll_values(second, 4, quiet_s=0.5)
    assert sorted(m.value() for m in got) == [b"b0", b"b1", b"b2", b"b3"]
    second.commit(message=got[-1], asynchronous=False)   # one partition's offset, past that message
    second.close()
    last = got[-1]
    uncommitted = sorted(m.value() for m in got if m.partition() != last.partition() or m.offset() > last.offset())
    # The offsets are the subscription's, so a kafka-python member of the group resumes there too
    # and commits the rest ...
    # Under load (CI, two test workers) kafka-python led the group's join before its metadata held
    # the topic ("No partition metadata for topic") and assigned itself nothing: with a 2 s
    # metadata age once it looked again only after its default 5 minutes, and once (stop 30) not
    # within 30 s. So it subscribes only once its metadata holds the topic's partitions.
    other = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                          auto_offset_reset="earliest", heartbeat_interval_ms=300, session_timeout_ms=30000,
                          metadata_max_age_ms=2000)
    deadline = time.monotonic() + 30
    while other.partitions_for_topic(topic) != {0, 1}:
        assert time.monotonic() < deadline, f"kafka-python's metadata never held {topic}"
        time.sleep(0.1)
    other.subscribe([topic])
    records = []
    deadline = time.monotonic() + 30
    while len(records) < len(uncommitted) and time.monotonic() < deadline:
        for batch in other.poll(timeout_ms=200).values():
            records.extend(batch)
    assert sorted(r.value for r in records) == uncommitted
    other.commit()
    assert other.committed(KpTopicPartition(topic, 0)) == 7 and other.committed(KpTopicPartition(topic, 1)) == 7
    other.close()
    # ... and a raytxn consumer of the subscription named after the group finds nothing left.
    native = client.subscribe(topic, group)
    assert nothing_more(native)
    produce(bootstrap, topic, [b"c0"])
    assert [m.value() for m in receive_all(native, 1)] == [b"c0"]
    native.close()


def test_two_consumers_of_a_group_split_the_partitions(client: rt.Client, bootstrap: str) -> None:
    topic, group = new_topic(client, partitions=4), f"g-{uuid.uuid4().hex[:8]}"
    first, second = group_consumer(bootstrap, group), group_consumer(bootstrap, group)
    first.subscribe([topic])
    second.subscribe([topic])
    deadline = time.monotonic() + 30
    while not (len(first.assignment()) == 2 and len(second.assignment()) == 2):
        assert time.monotonic() < deadline, (first.assignment(), second.assignment())
        for consumer in (first, second):
            assert consumer.poll(0.05) is None  # nothing produced yet
    owned = {c: {tp.partition for tp in c.assignment()} for c in (first, second)}
    assert owned[first] | owned[second] == {0, 1, 2, 3} and not owned[first] & owned[second]

    produce(bootstrap, topic, [f"v{i}".encode() for i in range(20)], partitions=4)
    got: dict[Any, list[Any]] = {first: [], second: []}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < 20 and time.monotonic() < deadline:
        for consumer in (first, second):
            message = consumer.poll(0.05)
            if message is not None:
                assert message.error() is None, message.error()
                got[consumer].append(message)
    for consumer, messages in got.items():
        assert {m.partition() for m in messages} == owned[consumer]
    assert sorted(m.value() for ms in got.values() for m in ms) == sorted(f"v{i}".encode() for i in range(20))
    first.close()
    second.close()


def test_consumers_started_together_get_one_assignment_each_after_the_initial_delay(client: rt.Client) -> None:
    """With the gateway's default initial rebalance delay (Kafka's 3 s), two consumers started
    together land in the group's first generation: each is assigned once, half the partitions.
    Without it the first to join would be given all four, then rebalance when the second came."""
    gateway = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1")
    try:
        topic, group = new_topic(client, partitions=4), f"g-{uuid.uuid4().hex[:8]}"
        consumers = [group_consumer(gateway["bootstrap"], group) for _ in range(2)]
        assigned: list[list[set[int]]] = [[], []]
        for consumer, seen in zip(consumers, assigned, strict=True):
            consumer.subscribe([topic], on_assign=lambda _c, tps, seen=seen: seen.append({tp.partition for tp in tps}))
        started = time.monotonic()
        wait_for_assignment(consumers, 2)
        waited_s = time.monotonic() - started
        settle_until = time.monotonic() + 1.0  # no later rebalance either
        while time.monotonic() < settle_until:
            for consumer in consumers:
                consumer.poll(0.05)
        assert [len(seen) for seen in assigned] == [1, 1], assigned
        generation = ray.get(gateway["actor"].__ray_call__.remote(
            lambda gateway_actor: gateway_actor.groups.table.groups[group].generation))
        assert generation == 1, f"the group is at generation {generation}, not its first"
        assert assigned[0][0] | assigned[1][0] == {0, 1, 2, 3} and not assigned[0][0] & assigned[1][0]
        assert waited_s >= 2.9, f"the first generation came after {waited_s:.2f} s, before the 3 s delay"
        for consumer in consumers:
            consumer.close()
    finally:
        ray.kill(gateway["actor"], no_restart=True)


def wait_for_assignment(consumers: list[Any], each: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(len(c.assignment()) == each for c in consumers):
        assert time.monotonic() < deadline, [c.assignment() for c in consumers]
        for consumer in consumers:
            consumer.poll(0.05)


def test_a_static_member_restarts_into_its_partitions_without_a_rebalance(
        client: rt.Client, bootstrap: str, gateway: dict[str, Any]) -> None:
    """Static membership (group.instance.id): a consumer that closes (a static member sends no
    LeaveGroup) and starts again under the same instance id gets its partition back in the same
    generation, and the other member keeps its partition throughout."""
    topic, group = new_topic(client, partitions=2), f"g-{uuid.uuid4().hex[:8]}"
    first = group_consumer(bootstrap, group, **{"group.instance.id": "first"})
    second = group_consumer(bootstrap, group, **{"group.instance.id": "second"})
    for consumer in (first, second):
        consumer.subscribe([topic])
    wait_for_assignment([first, second], 1)
    before = ray.get(gateway["actor"].stats.remote())["groups"][group]
    kept, owned = first.assignment()[0].partition, second.assignment()[0].partition
    second.close()
    again = group_consumer(bootstrap, group, **{"group.instance.id": "second"})
    again.subscribe([topic])
    wait_for_assignment([again], 1)
    assert again.assignment()[0].partition == owned
    produce(bootstrap, topic, [f"v{i}".encode() for i in range(4)], partitions=2)
    got = {c: [m.value() for m in poll_values(c, 2, quiet_s=0.5)] for c in (first, again)}
    assert got[first] == [f"v{i}".encode() for i in range(kept, 4, 2)]
    assert got[again] == [f"v{i}".encode() for i in range(owned, 4, 2)]
    after = ray.get(gateway["actor"].stats.remote())["groups"][group]
    assert (after["generation"], after["members"]) == (before["generation"], 2)
    assert [tp.partition for tp in first.assignment()] == [kept]
    first.close()
    again.close()


def test_admin_lists_describes_and_deletes_groups(client: rt.Client, bootstrap: str) -> None:
    """confluent-kafka's AdminClient on the gateway: a group with a member is Stable and
    described with its member and assignment; a subscription without members (committed offsets
    only) is an Empty group, deleted with its subscription; a group with members is not deleted;
    bad and unknown groups get Kafka's answers."""
    from confluent_kafka import ConsumerGroupState, KafkaException
    from confluent_kafka.admin import AdminClient

    topic, active, idle = new_topic(client, partitions=2), f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    client.subscribe(topic, idle, initial_position="earliest").close()      # offsets only: Empty
    consumer = group_consumer(bootstrap, active, **{"client.id": "admin-test"})
    consumer.subscribe([topic])
    wait_for_assignment([consumer], 2)
    admin = AdminClient({"bootstrap.servers": bootstrap})

    listed = admin.list_consumer_groups(request_timeout=30).result()
    states = {g.group_id: g.state for g in listed.valid}
    assert (states[active], states[idle]) == (ConsumerGroupState.STABLE, ConsumerGroupState.EMPTY)
    stable = admin.list_consumer_groups(request_timeout=30, states={ConsumerGroupState.STABLE}).result()
    assert active in {g.group_id for g in stable.valid} and idle not in {g.group_id for g in stable.valid}

    described = {g: f.result() for g, f in admin.describe_consumer_groups([active, idle, "nobody-here"],
                                                                          request_timeout=30).items()}
    (member,) = described[active].members
    assert (described[active].state, described[active].partition_assignor) == (ConsumerGroupState.STABLE, "range")
    assert (member.client_id, member.host) == ("admin-test", "/127.0.0.1")
    assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == [(topic, 0), (topic, 1)]
    assert (described[idle].state, described[idle].members) == (ConsumerGroupState.EMPTY, [])
    assert described["nobody-here"].state == ConsumerGroupState.DEAD

    with pytest.raises(KafkaException) as refused:
        admin.delete_consumer_groups([active], request_timeout=30)[active].result()
    assert refused.value.args[0].code() == 68                                 # NON_EMPTY_GROUP
    admin.delete_consumer_groups([idle], request_timeout=30)[idle].result()
    assert idle not in client.supervisor.call("get_topic", topic)["subscriptions"]
    with pytest.raises(KafkaException) as unknown:
        admin.delete_consumer_groups([idle], request_timeout=30)[idle].result()
    assert unknown.value.args[0].code() == 69                                 # GROUP_ID_NOT_FOUND
    consumer.close()


# --- exactly-once consume-transform-produce ----------------------------------------------------

def rewind_to_committed(consumer: Any) -> None:
    """After an abort: fetch again from the committed offsets (Kafka's EOS loop does this)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    for tp in consumer.committed(consumer.assignment(), timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))


def committed_total(consumer: Any, topic: str, partitions: int) -> int:
    from confluent_kafka import TopicPartition

    committed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    return sum(max(tp.offset, 0) for tp in committed)


def take(consumer: Any, most: int, wait_s: float = 1.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + wait_s
    while len(out) < most and time.monotonic() < deadline:
        message = consumer.poll(0.05)
        if message is not None:
            assert message.error() is None, message.error()
            out.append(message)
    return out


class Revokes:
    """Counts a consumer's revokes (on_revoke; the first assignment is none). A batch polled across
    a rebalance may hold messages of the old assignment and then, fetched again from the committed
    offsets under the new one, the same messages twice (seen once in the gateway crash test: two
    inputs twice in the sink), and ``position`` then names the new assignment's offsets: an
    exactly-once loop must not commit such a batch (as a rebalance listener or a Kafka Streams
    task aborts on a revoke). Not a gateway matter: a real Kafka's consumer does the same."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, consumer: Any, partitions: list[Any]) -> None:
        self.count += 1


def eos_loop(bootstrap: str, source: str, sink: str, partitions: int, count: int, group: str,
             between: Any = None, max_rounds: int = 60) -> int:
    """Consume from ``source`` in ``group``, produce each value upper-cased to ``sink`` and send
    the offsets to the same transaction, until the group's committed offsets cover ``count``
    inputs. ``between(round, consumer, producer)`` runs after a round's sends, before its offsets
    and commit (where tests abort or kill actors). Returns the rounds it took."""
    from confluent_kafka import KafkaException, Producer

    consumer = group_consumer(bootstrap, group, **{"isolation.level": "read_committed"})
    revokes = Revokes()
    consumer.subscribe([source], on_revoke=revokes)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"eos-{group}",
                         "transaction.timeout.ms": 60000, "linger.ms": 5})
    producer.init_transactions(30)
    rounds = 0
    try:
        while committed_total(consumer, source, partitions) < count:
            rounds += 1
            assert rounds <= max_rounds, f"no progress after {max_rounds} rounds"
            seen = revokes.count
            batch = take(consumer, 6)
            if revokes.count != seen:  # taken across a rebalance: drop it, start from the committed offsets
                print(f"eos_loop: round {rounds} dropped {[(m.partition(), m.offset()) for m in batch]}")
                rewind_to_committed(consumer)
                continue
            if not batch:
                continue
            producer.begin_transaction()
            for message in batch:
                producer.produce(sink, value=message.value().upper())
            if between is not None and between(rounds, consumer, producer):
                continue  # it aborted the round
            try:
                producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                     consumer.consumer_group_metadata(), 30)
                producer.commit_transaction(30)
            except KafkaException as e:
                if not e.args[0].txn_requires_abort():
                    raise
                producer.abort_transaction(30)
                rewind_to_committed(consumer)
    finally:
        consumer.close()
    return rounds


def read_committed_values(bootstrap: str, topic: str, count: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = [m.value() for m in poll_values(consumer, count, quiet_s=0.5)]
    consumer.close()
    return values


def test_exactly_once_consume_transform_produce_with_an_aborted_round(client: rt.Client, bootstrap: str) -> None:
    """send_offsets_to_transaction: the offsets commit with the output or not at all. The first
    round is aborted: neither its output nor its offsets are ever visible, and the loop redoes
    its inputs from the committed offsets."""
    from confluent_kafka import TopicPartition

    source, sink, group = new_topic(client, partitions=2), new_topic(client), f"g-{uuid.uuid4().hex[:8]}"
    inputs = [f"in-{i}".encode() for i in range(16)]
    produce(bootstrap, source, inputs, partitions=2)

    def abort_first(round_: int, consumer: Any, producer: Any) -> bool:
        if round_ != 1:
            return False
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)
        committed = consumer.committed([TopicPartition(source, 0), TopicPartition(source, 1)], timeout=30)
        assert all(tp.offset < 0 for tp in committed), committed   # the aborted offsets are not committed
        rewind_to_committed(consumer)
        return True

    eos_loop(bootstrap, source, sink, 2, len(inputs), group, abort_first)
    assert sorted(read_committed_values(bootstrap, sink, len(inputs))) == sorted(v.upper() for v in inputs)
    # The group's committed offsets are the ends of the source's partitions.
    later = group_consumer(bootstrap, group, **{"isolation.level": "read_committed"})
    committed = later.committed([TopicPartition(source, 0), TopicPartition(source, 1)], timeout=30)
    assert [tp.offset for tp in committed] == [8, 8]
    later.close()


# `make test-extended` runs it (the suite's 30 minutes are spent); the suite keeps the same loop
# with an aborted round, above, and the engine's own actor kills (tests/chaos).
@pytest.mark.extended
def test_exactly_once_under_actor_kills(client: rt.Client, bootstrap: str) -> None:
    """The same loop while the source partition's actor, the group subscription's actor, the
    transaction's coordinator and the sink partition's actor are killed mid-transaction (after
    the round's sends, before its offsets and commit; Ray restarts each, and it recovers from
    storage): the sink, read read_committed, holds each input exactly once."""
    from raytxn.client.rpc import ActorRef
    from raytxn.hashing import coordinator_for
    from raytxn.ids import NAMESPACE, coordinator_actor_name, partition_actor_name, subscription_actor_name

    source, sink, group = new_topic(client), new_topic(client), f"g-{uuid.uuid4().hex[:8]}"
    inputs = [f"in-{i}".encode() for i in range(24)]
    produce(bootstrap, source, inputs)
    home = coordinator_for(f"eos-{group}", client.config.coordinator.num_coordinators)
    victims = {1: partition_actor_name(source, 0), 2: subscription_actor_name(source, 0, group),
               3: coordinator_actor_name(home), 4: partition_actor_name(sink, 0)}
    incarnations: dict[str, int] = {}
    # Victims go by the rounds that took a batch, not the round number: a round that finds nothing
    # (the group still joining, as on two gateways) never reaches this hook.
    batches_taken = [0]

    def kill(round_: int, consumer: Any, producer: Any) -> bool:
        batches_taken[0] += 1
        name = victims.get(batches_taken[0])
        if name is not None:
            incarnations[name] = ActorRef(name).call("ready")["incarnation"]
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
        return False

    eos_loop(bootstrap, source, sink, 1, len(inputs), group, kill)
    assert list(incarnations) == list(victims.values())
    for name, before in incarnations.items():  # each was killed and recovered
        assert ActorRef(name).call("ready")["incarnation"] > before, name
    assert sorted(read_committed_values(bootstrap, sink, len(inputs))) == sorted(v.upper() for v in inputs)


# --- bad input -------------------------------------------------------------------------------

def test_bad_group_requests_get_kafka_errors_and_change_nothing(client: rt.Client, bootstrap: str) -> None:
    from kafka.protocol.consumer import (
        HeartbeatRequest,
        JoinGroupRequest,
        LeaveGroupRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        SyncGroupRequest,
    )
    from kafka.protocol.producer import (
        AddOffsetsToTxnRequest,
        EndTxnRequest,
        InitProducerIdRequest,
        TxnOffsetCommitRequest,
    )

    from raytxn.kafka import wire

    topic, group = new_topic(client), f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [b"x0", b"x1", b"x2"])
    raw = RawKafka(bootstrap)
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")]

    # The member must outlive every call below (it sends no heartbeat between them), and a CI
    # machine under load took more than 6 s over them once: the group then expired, and an
    # unknown member's commit answered ILLEGAL_GENERATION (an unknown group) instead of 25.
    def join(group_id: str = group, instance: str | None = None, session_ms: int = 120_000) -> Any:
        return raw.call(JoinGroupRequest, 5, group_id=group_id, session_timeout_ms=session_ms,
                        rebalance_timeout_ms=6000, member_id="", group_instance_id=instance,
                        protocol_type="consumer", protocols=protocols)

    def commit(offset: int, member: str, generation: int, name: str = topic, group_id: str = group) -> int:
        part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")
        answer = raw.call(OffsetCommitRequest, 8, group_id=group_id, generation_id_or_member_epoch=generation,
                          member_id=member, group_instance_id=None,
                          topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=name, partitions=[part])])
        return answer.topics[0].partitions[0].error_code

    def committed() -> int:
        answer = raw.call(OffsetFetchRequest, 7, group_id=group, require_stable=True,
                          topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])])
        return answer.topics[0].partitions[0].committed_offset

    joined = join()
    member, generation = joined.member_id, joined.generation_id
    assert (joined.error_code, joined.leader) == (wire.NONE, member) and generation >= 1
    stale = generation + 7
    beat = {"group_id": group, "group_instance_id": None}
    assert raw.call(HeartbeatRequest, 3, generation_id=generation, member_id="nobody", **beat).error_code == 25
    assert raw.call(HeartbeatRequest, 3, generation_id=stale, member_id=member, **beat).error_code == 22
    sync = {"group_id": group, "group_instance_id": None, "protocol_type": "consumer", "protocol_name": "range"}
    assert raw.call(SyncGroupRequest, 5, generation_id=stale, member_id=member, assignments=[], **sync).error_code == 22
    assert raw.call(SyncGroupRequest, 5, generation_id=generation, member_id="x", assignments=[],
                    **sync).error_code == 25
    assignment = [SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=b"all")]
    synced = raw.call(SyncGroupRequest, 5, generation_id=generation, member_id=member, assignments=assignment, **sync)
    assert (synced.error_code, synced.assignment) == (wire.NONE, b"all")

    assert commit(2, member, generation) == wire.NONE and committed() == 2
    assert commit(1, member, stale) == 22                         # ILLEGAL_GENERATION
    assert commit(1, "nobody", generation) == 25                       # UNKNOWN_MEMBER_ID
    assert commit(1, "", -1) == 25                            # a managed group takes no member-less commit
    assert commit(9, member, generation) == wire.OFFSET_OUT_OF_RANGE   # past the high watermark (3)
    assert commit(1, member, generation, name="no-such-topic") == wire.UNKNOWN_TOPIC_OR_PARTITION
    assert commit(1, member, generation, group_id="bad group!") == wire.INVALID_GROUP_ID
    assert join("bad group!").error_code == wire.INVALID_GROUP_ID
    assert join(instance="bad instance!").error_code == wire.INVALID_REQUEST   # not a name
    assert join(session_ms=10).error_code == 26                                # INVALID_SESSION_TIMEOUT
    assert committed() == 2                                   # none of them changed the offset

    # Raytxn consumers on the group's subscription and the group's commits do not mix.
    native = client.subscribe(topic, group)
    assert commit(3, member, generation) == wire.INCONSISTENT_GROUP_PROTOCOL
    native.close()
    assert commit(3, member, generation) == wire.NONE and committed() == 3
    assert commit(0, member, generation) == wire.NONE and committed() == 0  # a plain commit may go back

    # Transactional offsets from a producer the gateway does not know.
    txn_fields = {"transactional_id": "nobody", "producer_id": 42, "producer_epoch": 0, "group_id": group}
    assert raw.call(AddOffsetsToTxnRequest, 0, **txn_fields).error_code == 49      # INVALID_PRODUCER_ID_MAPPING
    part = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
        partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata="")
    answer = raw.call(TxnOffsetCommitRequest, 3, generation_id=generation, member_id=member, group_instance_id=None,
                      topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic, partitions=[part])],
                      **txn_fields)
    assert answer.topics[0].partitions[0].error_code == 49 and committed() == 0

    # A known transactional producer: the txn's offsets are checked against the group and the log.
    init = raw.call(InitProducerIdRequest, 3, transactional_id=f"raw-{group}", transaction_timeout_ms=60000,
                    producer_id=-1, producer_epoch=-1)
    ids = {"transactional_id": f"raw-{group}", "producer_id": init.producer_id,
           "producer_epoch": init.producer_epoch, "group_id": group}

    def txn_commit(offset: int, generation: int = generation, member_id: str = member) -> int:
        part = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")
        topics = [TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic, partitions=[part])]
        return raw.call(TxnOffsetCommitRequest, 3, generation_id=generation, member_id=member_id,
                        group_instance_id=None, topics=topics, **ids).topics[0].partitions[0].error_code

    assert txn_commit(1) == 48                                # INVALID_TXN_STATE: no AddOffsetsToTxn yet
    assert raw.call(AddOffsetsToTxnRequest, 0, **ids).error_code == wire.NONE
    assert txn_commit(1, generation=stale) == 22
    assert txn_commit(1, member_id="nobody") == 25
    assert txn_commit(9) == wire.OFFSET_OUT_OF_RANGE
    assert commit(2, member, generation) == wire.NONE
    assert txn_commit(1) == wire.OFFSET_OUT_OF_RANGE          # a transaction only moves it forward
    assert txn_commit(3) == wire.NONE
    assert commit(3, member, generation) == wire.CONCURRENT_TRANSACTIONS   # the txn's offsets are pending
    pending = raw.call(OffsetFetchRequest, 7, group_id=group, require_stable=True,
                       topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])])
    assert pending.topics[0].partitions[0].error_code == wire.UNSTABLE_OFFSET_COMMIT
    ended = raw.call(EndTxnRequest, 3, committed=False, **{k: v for k, v in ids.items() if k != "group_id"})
    assert ended.error_code == wire.NONE and committed() == 2     # aborted with the txn

    # A member not heard from for its session timeout is gone, by time alone.
    other_group = f"{group}-short"
    short = join(other_group, session_ms=1000)
    assert short.error_code == wire.NONE
    time.sleep(1.6)
    assert raw.call(HeartbeatRequest, 3, group_id=other_group, generation_id=short.generation_id,
                    member_id=short.member_id, group_instance_id=None).error_code == 25
    assert raw.call(LeaveGroupRequest, 1, group_id=other_group, member_id=short.member_id).error_code == 25
    assert raw.call(LeaveGroupRequest, 1, group_id=group, member_id=member).error_code == wire.NONE
    assert raw.call(HeartbeatRequest, 3, generation_id=generation, member_id=member, **beat).error_code == 25
    raw.close()


def test_every_served_version_of_the_group_apis_answers(client: rt.Client, bootstrap: str) -> None:
    """The oldest and newest version served of each group API, as a client would send it."""
    from kafka.protocol.consumer import (
        HeartbeatRequest,
        JoinGroupRequest,
        LeaveGroupRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        SyncGroupRequest,
    )
    from kafka.protocol.producer import AddOffsetsToTxnRequest, TxnOffsetCommitRequest

    from raytxn.kafka import wire

    topic = new_topic(client)
    produce(bootstrap, topic, [b"y0", b"y1"])
    raw = RawKafka(bootstrap)
    protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")]
    for low, high in [(0, 0), (7, 4)]:  # (JoinGroup/SyncGroup/Heartbeat/OffsetFetch version, LeaveGroup's)
        group = f"g-{uuid.uuid4().hex[:8]}"
        joined = raw.call(JoinGroupRequest, low, group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000,
                          member_id="", group_instance_id=None, protocol_type="consumer", protocols=protocols)
        member, generation = joined.member_id, joined.generation_id
        assert joined.error_code == wire.NONE and [m.member_id for m in joined.members] == [member]
        assignment = [SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=b"a")]
        synced = raw.call(SyncGroupRequest, min(low, 5), group_id=group, generation_id=generation, member_id=member,
                          group_instance_id=None, protocol_type="consumer", protocol_name="range",
                          assignments=assignment)
        assert (synced.error_code, synced.assignment) == (wire.NONE, b"a")
        assert raw.call(HeartbeatRequest, min(low, 4), group_id=group, generation_id=generation, member_id=member,
                        group_instance_id=None).error_code == wire.NONE
        commit_version = 2 if low == 0 else 8
        part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata="")
        committed = raw.call(OffsetCommitRequest, commit_version, group_id=group, member_id=member,
                             generation_id_or_member_epoch=generation, group_instance_id=None, retention_time_ms=-1,
                             topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[part])])
        assert committed.topics[0].partitions[0].error_code == wire.NONE
        fetch_version = 1 if low == 0 else 7
        fetched = raw.call(OffsetFetchRequest, fetch_version, group_id=group, require_stable=False,
                           topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])])
        assert fetched.topics[0].partitions[0].committed_offset == 1
        if low:  # v2+: no topics asks for every topic the group committed on
            every = raw.call(OffsetFetchRequest, fetch_version, group_id=group, require_stable=False, topics=None)
            assert [(t.name, [p.committed_offset for p in t.partitions]) for t in every.topics] == [(topic, [1])]
        members = [LeaveGroupRequest.MemberIdentity(member_id=member, group_instance_id=None, reason=None)]
        left = raw.call(LeaveGroupRequest, high, group_id=group, member_id=member, members=members)
        assert left.error_code == wire.NONE
        txn = {"transactional_id": "nobody", "producer_id": 1, "producer_epoch": 0, "group_id": group}
        assert raw.call(AddOffsetsToTxnRequest, 3 if low else 0, **txn).error_code == 49
        topics = [TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic, partitions=[
            TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata="")])]
        answer = raw.call(TxnOffsetCommitRequest, 3 if low else 0, generation_id=-1, member_id="",
                          group_instance_id=None, topics=topics, **txn)
        assert answer.topics[0].partitions[0].error_code == 49
    raw.close()


def test_every_served_version_of_the_group_admin_apis_answers(client: rt.Client, bootstrap: str) -> None:
    """ListGroups, DescribeGroups and DeleteGroups at their oldest and newest versions served:
    a group with offsets only is listed and described Empty; bad group ids get INVALID_GROUP_ID
    and delete nothing."""
    from kafka.protocol.admin import DeleteGroupsRequest, DescribeGroupsRequest, ListGroupsRequest

    from raytxn.kafka import wire

    topic = new_topic(client)
    raw = RawKafka(bootstrap)
    for list_v, describe_v, delete_v in [(0, 0, 0), (4, 5, 2)]:
        group = f"g-{uuid.uuid4().hex[:8]}"
        client.subscribe(topic, group, initial_position="earliest").close()
        listed = raw.call(ListGroupsRequest, list_v, states_filter=["Empty"] if list_v else None)
        assert listed.error_code == wire.NONE and group in {g.group_id for g in listed.groups}
        described = raw.call(DescribeGroupsRequest, describe_v, groups=[group, "bad group!"],
                             include_authorized_operations=False)
        assert [(g.group_id, g.error_code, g.group_state) for g in described.groups] == [
            (group, wire.NONE, "Empty"), ("bad group!", wire.INVALID_GROUP_ID, "Dead")]
        deleted = raw.call(DeleteGroupsRequest, delete_v, groups_names=["bad group!", group])
        assert [(r.group_id, r.error_code) for r in deleted.results] == [
            ("bad group!", wire.INVALID_GROUP_ID), (group, wire.NONE)]
        assert group not in client.supervisor.call("get_topic", topic)["subscriptions"]
    raw.close()


def test_committed_offsets_outlive_the_gateway_and_the_subscription_actor(client: rt.Client, bootstrap: str) -> None:
    """Nothing about offsets is the gateway's: after the group's subscription actor restarts and
    through another gateway, the committed offset is the same."""
    from confluent_kafka import TopicPartition

    from raytxn.ids import subscription_actor_name
    from tests.engine import restart_actor

    topic, group = new_topic(client), f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [b"z0", b"z1", b"z2"])
    consumer = group_consumer(bootstrap, group)
    consumer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    consumer.close()
    restart_actor(subscription_actor_name(topic, 0, group))
    other = start_gateway(0, bind_host="127.0.0.1", advertised_host="127.0.0.1", initial_rebalance_delay_ms=0)
    try:
        later = group_consumer(other["bootstrap"], group)
        assert [tp.offset for tp in later.committed([TopicPartition(topic, 0)], timeout=30)] == [2]
        later.subscribe([topic])
        assert [m.value() for m in poll_values(later, 1)] == [b"z2"]
        later.close()
    finally:
        ray.kill(other["actor"], no_restart=True)


def test_a_group_resumes_at_its_offset_after_retention_trims_below_it(client: rt.Client, bootstrap: str) -> None:
    """Retention follows the group's committed offset, which is rarely at a ledger's start: after
    the trim, the log start offset is the committed one and the group resumes there, through a
    partition restart too. Before the fix the trim point was no offset index point: the log start
    jumped to the high watermark, the committed offset 4 read back as 10 and the group skipped
    every message it had not consumed."""
    from confluent_kafka import TopicPartition

    from raytxn.ids import partition_actor_name
    from tests.engine import partition_ref, restart_actor

    topic, group = new_topic(client), f"g-{uuid.uuid4().hex[:8]}"
    for i in range(10):  # an entry each, so the trim can fall inside the ledger
        produce(bootstrap, topic, [f"r{i}".encode()])
    consumer = group_consumer(bootstrap, group)
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    consumer.close()
    partition = partition_ref(topic)
    assert partition.call("apply_retention")["trimmed_below"] != "<0,0>"   # the group's mark: trimmed below it
    assert partition.call("kafka_offsets")["log_start"] == 4
    for _ in range(2):  # now, and after a restart recovering from a snapshot older than the trim's pin
        later = group_consumer(bootstrap, group)
        assert [tp.offset for tp in later.committed([TopicPartition(topic, 0)], timeout=30)] == [4]
        later.subscribe([topic])
        assert [m.value() for m in poll_values(later, 6, quiet_s=0.5)] == [f"r{i}".encode() for i in range(4, 10)]
        later.close()
        restart_actor(partition_actor_name(topic, 0))
        assert partition.call("kafka_offsets")["log_start"] == 4


def test_commit_metadata_is_kept_durably_and_with_transactions(client: rt.Client, bootstrap: str) -> None:
    """A committed offset's metadata string comes back from OffsetFetch after a restart of the
    subscription actor; a transactional producer's offsets keep theirs when the transaction
    commits (also across a restart while it is pending: it rides in the pending-ack log) and not
    when it aborts; past 4096 bytes a partition's commit fails and changes nothing."""
    from confluent_kafka import KafkaException, Producer, TopicPartition

    from raytxn.ids import subscription_actor_name
    from tests.engine import restart_actor

    topic, group = new_topic(client, partitions=2), f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [f"m{i}".encode() for i in range(12)], partitions=2)
    consumer = group_consumer(bootstrap, group)

    def committed() -> list[tuple[int, int, str | None]]:
        return [(tp.partition, tp.offset, tp.metadata)
                for tp in consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)]

    consumer.commit(offsets=[TopicPartition(topic, 0, 2, metadata="first of p0"),
                             TopicPartition(topic, 1, 1, metadata="p1 \u00e9")], asynchronous=False)
    assert committed() == [(0, 2, "first of p0"), (1, 1, "p1 \u00e9")]
    consumer.commit(offsets=[TopicPartition(topic, 0, 2, metadata="second of p0")], asynchronous=False)
    restart_actor(subscription_actor_name(topic, 0, group))
    assert committed() == [(0, 2, "second of p0"), (1, 1, "p1 \u00e9")]

    with pytest.raises(KafkaException) as too_large:
        consumer.commit(offsets=[TopicPartition(topic, 0, 3, metadata="x" * 4097),
                                 TopicPartition(topic, 1, 3, metadata="fits")], asynchronous=False)
    assert too_large.value.args[0].code() == 12                      # OFFSET_METADATA_TOO_LARGE
    assert committed() == [(0, 2, "second of p0"), (1, 3, "fits")]   # the other partition committed

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"meta-{group}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 4, metadata="txn committed")],
                                         consumer.consumer_group_metadata(), 30)
    restart_actor(subscription_actor_name(topic, 0, group))          # pending: only in the log now
    producer.commit_transaction(30)
    assert committed()[0] == (0, 4, "txn committed")
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 5, metadata="txn aborted"),
                                          TopicPartition(topic, 1, 3, metadata="only new metadata")],
                                         consumer.consumer_group_metadata(), 30)
    producer.abort_transaction(30)
    assert committed() == [(0, 4, "txn committed"), (1, 3, "fits")]
    producer.begin_transaction()                                     # the same offset, new metadata
    producer.send_offsets_to_transaction([TopicPartition(topic, 1, 3, metadata="only new metadata")],
                                         consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    assert committed() == [(0, 4, "txn committed"), (1, 3, "only new metadata")]
    consumer.close()


def test_offset_delete_forgets_a_partitions_committed_offset(client: rt.Client, bootstrap: str) -> None:
    """kafka-python's KafkaAdminClient.delete_group_offsets (OffsetDelete v0): the partition's
    offset and metadata are gone (OffsetFetch -1, also after the subscription actor restarts)
    and a new member starts there from auto.offset.reset, the other partition's offset stays;
    a topic a live member consumes gets GROUP_SUBSCRIBED_TO_TOPIC, an unknown partition
    UNKNOWN_TOPIC_OR_PARTITION, an unknown group GROUP_ID_NOT_FOUND, and none changes anything."""
    from confluent_kafka import OFFSET_INVALID, TopicPartition
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition
    from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError, UnknownTopicOrPartitionError

    from raytxn.ids import subscription_actor_name
    from tests.engine import restart_actor

    topic, group = new_topic(client, partitions=2), f"g-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [f"d{i}".encode() for i in range(4)], partitions=2)   # p0: d0 d2, p1: d1 d3
    first = group_consumer(bootstrap, group)
    first.commit(offsets=[TopicPartition(topic, 0, 2, metadata="gone"), TopicPartition(topic, 1, 1, metadata="kept")],
                 asynchronous=False)

    def committed(consumer: Any) -> list[tuple[int, int, str | None]]:
        return [(tp.partition, tp.offset, tp.metadata or "")
                for tp in consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)]

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        deleted = admin.delete_group_offsets(group, [KpTopicPartition(topic, 0), KpTopicPartition(topic, 7)])
        assert deleted == {KpTopicPartition(topic, 0): NoError,
                           KpTopicPartition(topic, 7): UnknownTopicOrPartitionError}
        restart_actor(subscription_actor_name(topic, 0, group))
        assert committed(first) == [(0, OFFSET_INVALID, ""), (1, 1, "kept")]   # (-1 on the wire)
        first.close()

        member = group_consumer(bootstrap, group)                # earliest on p0, the offset on p1
        member.subscribe([topic])
        assert sorted(m.value() for m in poll_values(member, 3, quiet_s=0.5)) == [b"d0", b"d2", b"d3"]
        refused = admin.delete_group_offsets(group, [KpTopicPartition(topic, 1)])
        assert refused == {KpTopicPartition(topic, 1): GroupSubscribedToTopicError}
        assert committed(member)[1] == (1, 1, "kept")
        member.close()
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group_offsets(f"nobody-{uuid.uuid4().hex[:8]}", [KpTopicPartition(topic, 0)])
    finally:
        admin.close()
