"""Several Kafka gateways as one cluster (``start_gateways``), with real Kafka clients: Metadata lists
them all, partitions are spread over them per client, each consumer group is coordinated by one
and the others say NOT_COORDINATOR, and the crash of one under a transactional producer and a
consumer group loses and duplicates nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.ids import NAMESPACE
from raytxn.kafka.gateway import peer_actor_name, stop_gateways
from raytxn.kafka.peers import NOT_COORDINATOR
from raytxn.kafka.wire import FindCoordinatorRequest, MetadataRequest
from tests.engine import engine_client, new_topic, wait_for
from tests.integration.test_kafka_groups import eos_loop, group_consumer, produce, read_committed_values
from tests.kafka_clients import RawKafka, gateway_stats, peer_group_addresses, poll_values, start_peer_group

pytestmark = pytest.mark.ray
GROUP = "test-peers"


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def _start(count: int = 2) -> list[dict[str, Any]]:
    return start_peer_group(GROUP, count)


@pytest.fixture(scope="module")
def gateways(client: rt.Client) -> Iterator[list[dict[str, Any]]]:
    yield from peer_group_addresses(GROUP)


_stats = gateway_stats


def _bootstrap(addresses: list[dict[str, Any]]) -> str:
    return ",".join(a["bootstrap"] for a in addresses)


def _produce_requests(address: dict[str, Any]) -> int:
    return sum(n for key, n in _stats(address)["versions"].items() if key.startswith("0/"))


def _fetch_requests(address: dict[str, Any]) -> int:
    return sum(n for key, n in _stats(address)["versions"].items() if key.startswith("1/"))


def test_metadata_from_either_gateway_lists_both_and_spreads_a_clients_partitions(
        client: rt.Client, gateways: list[dict[str, Any]]) -> None:
    topic = new_topic(client, partitions=4)
    handed_out = []
    for address in gateways:
        answer = RawKafka(address["bootstrap"], client_id="spread-test").call(
            MetadataRequest, 4, topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False)
        assert sorted((b.node_id, b.port) for b in answer.brokers) == [(0, gateways[0]["port"]),
                                                                      (1, gateways[1]["port"])]
        (described,) = answer.topics
        handed_out.append([p.leader_id for p in sorted(described.partitions, key=lambda p: p.partition_index)])
    assert sorted(handed_out[0]) == [0, 0, 1, 1]
    assert handed_out[0] == handed_out[1]  # both gateways hand one client the same leaders


def test_a_producer_and_a_consumer_given_one_gateway_use_both(client: rt.Client,
                                                              gateways: list[dict[str, Any]]) -> None:
    """Bootstrapped on gateway 0 only, librdkafka learns of gateway 1 from Metadata and sends it
    the partitions it leads: both gateways append and serve fetches, and every message comes back."""
    from confluent_kafka import Consumer, TopicPartition

    topic = new_topic(client, partitions=4)
    produced_before = [_produce_requests(a) for a in gateways]
    values = [f"m{i}".encode() for i in range(200)]
    produce(gateways[0]["bootstrap"], topic, values, partitions=4)
    assert all(_produce_requests(a) > before for a, before in zip(gateways, produced_before, strict=True))

    fetched_before = [_fetch_requests(a) for a in gateways]
    consumer = Consumer({"bootstrap.servers": gateways[1]["bootstrap"], "group.id": "unused",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    got = poll_values(consumer, len(values), quiet_s=0.5)
    consumer.close()
    assert sorted(m.value() for m in got) == sorted(values)
    assert all(_fetch_requests(a) > before for a, before in zip(gateways, fetched_before, strict=True))


def test_a_group_is_coordinated_by_one_gateway_and_the_other_says_not_coordinator(
        client: rt.Client, gateways: list[dict[str, Any]]) -> None:
    from kafka.protocol.consumer import HeartbeatRequest

    group = f"g-{uuid.uuid4().hex[:8]}"
    answers = [RawKafka(a["bootstrap"]).call(FindCoordinatorRequest, 1, key=group, key_type=0) for a in gateways]
    assert len({(a.node_id, a.port) for a in answers}) == 1 and answers[0].error_code == 0
    coordinator = answers[0].node_id
    other = gateways[1 - coordinator]
    beat = RawKafka(other["bootstrap"]).call(HeartbeatRequest, 3, group_id=group, generation_id=1,
                                             member_id="m", group_instance_id=None)
    assert beat.error_code == NOT_COORDINATOR
    assert group not in _stats(other)["groups"]  # refused before it touched the group table

    topic = new_topic(client, partitions=2)
    produce(gateways[0]["bootstrap"], topic, [b"a", b"b", b"c", b"d"], partitions=2)
    consumer = group_consumer(_bootstrap(gateways), group)
    consumer.subscribe([topic])
    got = poll_values(consumer, 4, quiet_s=0.3)
    consumer.commit(asynchronous=False)
    # the member is in the coordinator's table only (until it leaves: an empty group is dropped)
    assert group in _stats(gateways[coordinator])["groups"] and group not in _stats(other)["groups"]
    consumer.close()
    assert sorted(m.value() for m in got) == [b"a", b"b", b"c", b"d"]


@pytest.mark.slow(seconds=30)
def test_the_crash_of_a_gateway_under_an_exactly_once_loop_loses_and_duplicates_nothing(
        client: rt.Client, gateways: list[dict[str, Any]]) -> None:
    """A consume-transform-produce loop (a consumer group, a transactional producer, the offsets in
    the transaction) on both gateways. In round 2, mid-transaction, the gateway coordinating the
    group is killed: the clients reconnect to the other, the group rejoins there, and the
    transaction goes on or aborts and is redone. In round 5 the gateway is started again and
    takes its groups back (after its settling time). Read read_committed, the sink holds each
    input exactly once."""
    source, sink, group = new_topic(client, partitions=2), new_topic(client), f"g-{uuid.uuid4().hex[:8]}"
    inputs = [f"in-{i}".encode() for i in range(40)]
    produce(gateways[0]["bootstrap"], source, inputs, partitions=2)
    coordinator = RawKafka(gateways[0]["bootstrap"]).call(FindCoordinatorRequest, 1, key=group, key_type=0).node_id
    survivor = gateways[1 - coordinator]
    events: list[str] = []

    def crash_and_return(round_: int, consumer: Any, producer: Any) -> bool:
        if not events and round_ >= 2:  # (a round that took no input does not get here)
            ray.kill(ray.get_actor(peer_actor_name(GROUP, coordinator), namespace=NAMESPACE), no_restart=True)
            wait_for(lambda: _stats(survivor)["peers"] == [survivor["node_id"]], what="the survivor alone")
            # the dead one is still a listed broker (for librdkafka#5511: peers.DEPARTED_LISTED_S), leading nothing
            answer = RawKafka(survivor["bootstrap"], client_id="after-the-kill").call(
                MetadataRequest, 4, topics=[MetadataRequest.MetadataRequestTopic(name=source)],
                allow_auto_topic_creation=False)
            assert sorted(b.node_id for b in answer.brokers) == [0, 1]
            assert {p.leader_id for p in answer.topics[0].partitions} == {survivor["node_id"]}
            events.append("killed")
        elif events == ["killed"] and round_ >= 5:
            gateways[:] = _start()  # the killed one again, under its broker id; the survivor kept
            wait_for(lambda: all(_stats(a)["peers"] == [0, 1] for a in gateways), what="both again")
            events.append("restarted")
        return False

    eos_loop(_bootstrap(gateways), source, sink, 2, len(inputs), group, crash_and_return, max_rounds=120)
    assert events == ["killed", "restarted"]
    assert sorted(read_committed_values(_bootstrap(gateways), sink, len(inputs))) == sorted(
        v.upper() for v in inputs)


@pytest.mark.slow(seconds=20)
def test_raytxn_kafka_gateways_starts_a_peer_group_from_the_command_line(client: rt.Client) -> None:
    """``raytxn kafka --gateways 2`` (its own process): two gateways, one bootstrap list that a
    confluent-kafka producer and consumer use; bad counts and names are refused with the error
    that says why, starting nothing."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from tests.integration.test_cli import cli, cli_json

    started = cli_json("kafka", "--gateways", "2", "--port", "0", "--peer-group", "cli")
    try:
        assert [g["node_id"] for g in started["gateways"]] == [0, 1]
        assert started["bootstrap"] == ",".join(g["bootstrap"] for g in started["gateways"])
        topic = new_topic(client, partitions=2)
        producer = Producer({"bootstrap.servers": started["bootstrap"]})
        for i in range(10):
            producer.produce(topic, value=f"c{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": started["bootstrap"], "group.id": "cli-check",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        assert sorted(m.value() for m in poll_values(consumer, 10)) == sorted(f"c{i}".encode() for i in range(10))
        consumer.close()
    finally:
        assert stop_gateways("cli") == 2
    for args, says in ((("--gateways", "65"), "gateways: an int in 1..64"),
                       (("--gateways", "2", "--peer-group", "no/slash"), "letters, digits")):
        refused = cli("kafka", "--port", "0", *args)
        assert refused.returncode != 0 and says in refused.stdout + refused.stderr, refused.stdout + refused.stderr
        assert "Traceback" not in refused.stdout + refused.stderr
    assert stop_gateways("cli") == 0  # the refused ones started nothing
