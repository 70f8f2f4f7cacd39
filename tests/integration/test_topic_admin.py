"""Topic and subscription admin survives a supervisor crash at every step: the supervisor is
killed (``os._exit``) at each of its fault points inside create/delete of a topic or a
subscription, Ray restarts it, and after its recovery the topic (subscription) either fully
exists (actors up, produce and consume work) or does not exist at all (no catalog entry, no
actors, no objects in the store), and a new one of the same name starts empty."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.errors import TopicNotFound
from raytxn.ids import NAMESPACE, SUPERVISOR_NAME, partition_actor_name, subscription_actor_name
from tests.engine import engine_client, nothing_more, receive_all

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("drop_new_topics")]

CREATE_POINTS = ["supervisor.after_save_creating", "supervisor.after_create_actors", "supervisor.after_activate"]
DELETE_POINTS = ["supervisor.after_mark_deleting", "supervisor.after_stop_actors",
                 "supervisor.after_delete_objects", "supervisor.after_remove_entry"]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.3)


def crash_at(client: rt.Client, point: str, **match: str) -> None:
    assert client.faults.arm(point, "crash", match=match) == [SUPERVISOR_NAME]


def assert_crashed(client: rt.Client) -> None:
    """The armed crash fired: a fault is disarmed only by firing (once) or by a restart."""
    assert ActorRef(SUPERVISOR_NAME).call("list_faults") == []


def objects_of(client: rt.Client, topic: str, subscription: str | None = None) -> list[Path]:
    """Every object in the store in a folder named after ``topic``; with ``subscription``, those
    of that subscription (``subscriptions/<topic>/<partition>/<subscription>/...``)."""
    root = Path(client.config.storage_url[len("file://"):])
    found = [path.relative_to(root) for path in root.rglob("*") if path.is_file()]
    if subscription is None:
        return [path for path in found if topic in path.parts]
    return [path for path in found if path.parts[1:3] == ("subscriptions", topic) and path.parts[4] == subscription]


def named_actors(prefix: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(prefix)]


def actors_of(topic: str) -> list[str]:
    return named_actors(f"partition-{topic}-") + named_actors(f"sub-{topic}-")


def supervised(client: rt.Client, topic: str) -> list[str]:
    return [name for name, kind in client.supervisor.call("list_actors", None, topic) if kind != "coordinator"]


def produce_and_consume(client: rt.Client, topic: str, partitions: int, subscription: str = "check") -> None:
    """The topic works end to end: a transaction's messages reach a new subscription."""
    producer = client.create_producer(topic)
    values = {f"{topic}-{i}".encode() for i in range(2 * partitions)}
    with client.transaction(timeout=30) as txn:
        for value in sorted(values):
            producer.send(value, key=value.decode(), txn=txn)
    consumer = client.subscribe(topic, subscription, initial_position="earliest")
    assert {m.value() for m in receive_all(consumer, len(values))} == values
    assert nothing_more(consumer)
    consumer.close()


def assert_topic_gone(client: rt.Client, topic: str) -> None:
    with pytest.raises(TopicNotFound):
        client.get_topic(topic)
    assert topic not in [t["name"] for t in client.list_topics()]
    assert actors_of(topic) == []
    assert supervised(client, topic) == []
    assert objects_of(client, topic) == []


def fill(client: rt.Client, topic: str, subscription: str) -> None:
    """Data of every kind: partition entries and markers, a subscription with acks and a cursor."""
    producer = client.create_producer(topic)
    producer.send(b"old-plain", key="a")
    with client.transaction(timeout=30) as txn:
        producer.send(b"old-txn", key="b", txn=txn)
    consumer = client.subscribe(topic, subscription, initial_position="earliest")
    with client.transaction(timeout=30) as txn:
        for message in receive_all(consumer, 2):
            consumer.acknowledge(message, txn=txn)
    consumer.close()
    assert objects_of(client, topic, subscription)


@pytest.mark.parametrize("point", CREATE_POINTS)
def test_supervisor_crash_in_create_topic_leaves_the_whole_topic(client: rt.Client, point: str) -> None:
    topic = f"create-{uuid.uuid4().hex[:8]}"
    crash_at(client, point, kind="topic", topic=topic)
    assert client.create_topic(topic, 2) == {"name": topic, "partitions": 2, "retention_bytes": None,
                                             "retention_s": None, "compacted": False,
                                             "compaction_threshold_bytes": None}
    assert_crashed(client)
    assert client.get_topic(topic)["partitions"] == 2
    assert [t["name"] for t in client.list_topics()].count(topic) == 1
    assert actors_of(topic) == []  # they start on first use
    assert sorted(supervised(client, topic)) == [partition_actor_name(topic, 0), partition_actor_name(topic, 1)]
    produce_and_consume(client, topic, 2)
    assert sorted(actors_of(topic))[:2] == [partition_actor_name(topic, 0), partition_actor_name(topic, 1)]


@pytest.mark.extended  # the suite crashes create_topic and delete_topic at each point; these walk the same points
@pytest.mark.parametrize("point", ["supervisor.after_save_creating", "supervisor.after_activate"])
def test_supervisor_crash_in_bulk_create_leaves_every_topic_whole(client: rt.Client, point: str) -> None:
    names = [f"bulkc-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    crash_at(client, point, kind="topics", topic=names[0])
    # "latest" subscriptions: two catalog writes with their actors started in between
    created = client.create_topics(names, 2, subscriptions=["s"], initial_position="latest")
    assert_crashed(client)
    assert [t["name"] for t in created] == names
    listed = {t["name"]: t for t in client.list_topics()}
    assert all(listed[name]["partitions"] == 2 and listed[name]["subscriptions"] == ["s"] for name in names)
    produce_and_consume(client, names[0], 2)


@pytest.mark.extended  # the suite crashes create_topic and delete_topic at each point; these walk the same points
@pytest.mark.parametrize("point", ["supervisor.after_mark_deleting", "supervisor.after_remove_entry"])
def test_supervisor_crash_in_bulk_delete_leaves_nothing(client: rt.Client, point: str) -> None:
    names = [f"bulkd-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    client.create_topics(names, 2)
    fill(client, names[1], "billing")
    crash_at(client, point, kind="topics", topic=names[0])
    client.delete_topics(names)
    assert_crashed(client)
    for name in names:
        assert_topic_gone(client, name)


@pytest.mark.parametrize("point", DELETE_POINTS)
def test_supervisor_crash_in_delete_topic_leaves_nothing(client: rt.Client, point: str) -> None:
    topic = f"delete-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    fill(client, topic, "billing")
    crash_at(client, point, kind="topic", topic=topic)
    client.delete_topic(topic)
    assert_crashed(client)
    assert_topic_gone(client, topic)
    # The same name again is a new, empty topic: no old ledger, cursor or snapshot is found.
    client.create_topic(topic, 2)
    for p in range(2):
        assert ActorRef(partition_actor_name(topic, p)).call("stats")["applied_entries"] == 0
    assert client.get_topic(topic)["subscriptions"] == []
    produce_and_consume(client, topic, 2, subscription="billing")


@pytest.mark.extended  # the suite crashes create_topic and delete_topic at each point; these walk the same points
@pytest.mark.parametrize("point", CREATE_POINTS)
def test_supervisor_crash_in_subscribe_leaves_the_whole_subscription(client: rt.Client, point: str) -> None:
    topic = f"sub-create-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    client.create_producer(topic).send(b"before", key="k")
    crash_at(client, point, kind="subscription", topic=topic, subscription="audit")
    consumer = client.subscribe(topic, "audit", initial_position="earliest")
    assert_crashed(client)
    assert client.get_topic(topic)["subscriptions"] == ["audit"]
    assert receive_all(consumer, 1)[0].value() == b"before"
    consumer.close()
    assert sorted(named_actors(f"sub-{topic}-")) == [subscription_actor_name(topic, p, "audit") for p in range(2)]


@pytest.mark.extended  # the suite crashes create_topic and delete_topic at each point; these walk the same points
@pytest.mark.parametrize("point", DELETE_POINTS)
def test_supervisor_crash_in_unsubscribe_leaves_nothing(client: rt.Client, point: str) -> None:
    topic = f"sub-delete-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 2)
    fill(client, topic, "audit")
    consumer = client.subscribe(topic, "audit")
    crash_at(client, point, kind="subscription", topic=topic, subscription="audit")
    consumer.unsubscribe()
    assert_crashed(client)
    assert client.get_topic(topic)["subscriptions"] == []
    assert named_actors(f"sub-{topic}-") == []
    assert supervised(client, topic) == [partition_actor_name(topic, p) for p in range(2)]
    assert objects_of(client, topic, "audit") == []
    # Subscribing again starts afresh at its initial position: the old cursor is gone.
    again = client.subscribe(topic, "audit", initial_position="earliest")
    assert sorted(m.value() for m in receive_all(again, 2)) == [b"old-plain", b"old-txn"]
    again.close()


def test_unsubscribe_deletes_only_that_subscriptions_data(client: rt.Client) -> None:
    """A subscription named like a partition (``0``) or like its topic: deleting it must not
    touch the others' cursors and pending-ack logs."""
    topic = f"keep-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(f"m{i}".encode())
    keep = client.subscribe(topic, "keep", initial_position="earliest")
    for message in receive_all(keep, 3):
        keep.acknowledge(message)
    keep.close()
    keeper = ActorRef(subscription_actor_name(topic, 0, "keep"))
    assert keeper.call("persist_cursor") != "<-1,-1>"
    for name in ("0", topic):
        client.subscribe(topic, name).unsubscribe()
        assert objects_of(client, topic, name) == []
    assert objects_of(client, topic, "keep")
    # After a restart the kept subscription recovers its cursor from the store: nothing again.
    ray.kill(ray.get_actor(subscription_actor_name(topic, 0, "keep"), namespace=NAMESPACE), no_restart=False)
    producer.send(b"after")
    again = client.subscribe(topic, "keep")
    assert receive_all(again, 1)[0].value() == b"after"
    assert nothing_more(again)
    again.close()
