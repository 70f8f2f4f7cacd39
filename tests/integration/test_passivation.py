"""Passivation (issue 17): idle partition and subscription actors stop, the next call starts them
again, and nothing is lost or duplicated across it; what holds an actor up (an open txn, an
attached consumer) keeps it; a txn whose participant is dormant still commits and aborts; and an
actor the cluster has no room for is a clear error, not a hang. One engine for the module,
passivating after 1 s idle, whose watcher probes at most 4 live actors per round (so every test
here also runs with the probes rotating)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.errors import CannotPlaceActor
from raytxn.hashing import partition_for
from raytxn.ids import NAMESPACE, coordinator_actor_name, partition_actor_name, subscription_actor_name
from tests.engine import engine_client, new_topic, nothing_more, receive_all, visible_values, wait_for
from tests.engine import health_row as row

pytestmark = pytest.mark.ray

IDLE_S = 1.0


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.3, passivate_idle_s=IDLE_S, max_probes_per_watch=4)


def live(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def test_idle_actors_are_passivated_and_the_next_call_activates_them_exactly_once(client: rt.Client) -> None:
    topic = new_topic(client, prefix="idle")
    partition, sub = partition_actor_name(topic, 0), subscription_actor_name(topic, 0, "s")
    consumer = client.subscribe(topic, "s", initial_position="earliest")
    producer = client.create_producer(topic)
    producer.send(b"before-1")
    producer.send(b"before-2")
    [first] = receive_all(consumer, 1)
    consumer.acknowledge(first)
    consumer.close()  # "before-2" stays unacked: delivered again after passivation
    wait_for(lambda: all(row(client, name)["passivations"] == 1 and not live(name) for name in (sub, partition)),
             what="both passivated")  # counted when it agreed, gone once Ray released its name
    health = client.health()
    assert health["healthy"] and health["dormant"] >= 2, health
    assert row(client, sub)["state"] == row(client, partition)["state"] == "DORMANT"

    producer.send(b"after")  # activates the partition
    consumer = client.subscribe(topic, "s")  # activates the subscription
    values = [m.value() for m in receive_all(consumer, 2)]
    assert values == [b"before-2", b"after"]  # the ack before passivation held; nothing lost
    assert nothing_more(consumer)
    consumer.close()
    assert visible_values(topic) == [b"before-1", b"before-2", b"after"]


def test_under_a_probe_budget_six_idle_partitions_are_all_passivated(client: rt.Client) -> None:
    """The end-to-end check of the probe budget (the rotation itself: tests/unit/test_shell.py)."""
    topic = new_topic(client, prefix="rotate", partitions=6)
    producer = client.create_producer(topic)
    for partition in range(6):
        key = next(f"k{i}" for i in range(1000) if partition_for(f"k{i}", 6) == partition)
        producer.send(b"p%d" % partition, key=key)
    names = [partition_actor_name(topic, partition) for partition in range(6)]
    wait_for(lambda: all(row(client, name)["passivations"] == 1 for name in names), timeout_s=60,
             what="all six passivated")
    assert sorted(visible_values(topic, range(6))) == sorted(b"p%d" % partition for partition in range(6))


def test_an_open_txn_and_an_attached_consumer_hold_their_actors(client: rt.Client) -> None:
    topic = new_topic(client, prefix="held")
    partition, sub = partition_actor_name(topic, 0), subscription_actor_name(topic, 0, "s")
    consumer = client.subscribe(topic, "s", initial_position="earliest")
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout=60)
    producer.send(b"in-txn", txn=txn)
    time.sleep(IDLE_S * 3)  # several watch rounds past the idle time
    assert live(partition) and live(sub)
    assert "1 open txns" in row(client, partition)["passivation_blockers"]
    assert "1 consumers attached" in row(client, sub)["passivation_blockers"]
    txn.commit()
    assert receive_all(consumer, 1)[0].value() == b"in-txn"
    consumer.close()
    wait_for(lambda: not live(partition) and not live(sub), what="passivated once released")


@pytest.mark.parametrize("commit", [True, False])
def test_a_txn_commits_or_aborts_on_a_dormant_participant(client: rt.Client, commit: bool) -> None:
    topic = new_topic(client, prefix="span")
    partition = partition_actor_name(topic, 0)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout=60)
    producer.send(b"spanning", txn=txn)
    # The participant goes away with the txn open (as a crash would take it: a passivation
    # never does, the open txn holds it): the coordinator's end must start it again.
    ray.kill(ray.get_actor(partition, namespace=NAMESPACE), no_restart=True)
    wait_for(lambda: row(client, partition)["state"] == "DORMANT", what="dormant")
    if commit:
        txn.commit()
    else:
        txn.abort()
    assert row(client, partition)["state"] == "ALIVE"  # the end activated it before returning
    assert visible_values(topic) == ([b"spanning"] if commit else [])
    stats = ActorRef(partition).call("stats")
    assert stats["ongoing_txns"] == 0, stats


def test_health_counts_a_passivation_by_the_time_the_actors_name_is_gone(client: rt.Client) -> None:
    """Health read right after the name went away already shows the passivation. Before, the
    supervisor counted it only once its kill loop saw the name released (a poll every 50 ms), and
    a health call in between showed the actor DORMANT with no passivation: CI saw it once."""
    topic = new_topic(client, prefix="counted")
    name = partition_actor_name(topic, 0)
    client.create_producer(topic).send(b"x")
    deadline = time.monotonic() + 30 * IDLE_S
    while live(name):
        assert time.monotonic() < deadline, "never passivated"
        time.sleep(0.005)
    seen = row(client, name)  # at once: within the old window
    assert (seen["state"], seen["passivations"]) == ("DORMANT", 1), seen


def test_bulk_created_topics_start_no_actor_until_used(client: rt.Client) -> None:
    prefix = f"bulk-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{i}" for i in range(50)]
    created = client.create_topics(names, partitions=2, subscriptions=["s"])
    assert [t["name"] for t in created] == names
    # No actor of these topics (counting every actor instead raced with other tests' actors
    # being passivated meanwhile: CI once saw one fewer).
    assert [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if prefix in a["name"]] == []
    listed = {t["name"]: t for t in client.list_topics()}
    assert all(listed[name]["partitions"] == 2 and listed[name]["subscriptions"] == ["s"] for name in names)
    # an "earliest" subscription made lazily still sees every message
    producer = client.create_producer(names[7])
    producer.send(b"one", key="a")
    consumer = client.subscribe(names[7], "s")
    assert receive_all(consumer, 1)[0].value() == b"one"
    consumer.close()
    client.delete_topics(names)
    assert not {t["name"] for t in client.list_topics()} & set(names)


def test_metrics_count_passivations_activations_and_dormant_actors(client: rt.Client) -> None:
    from tests.integration.test_metrics import total, wait_for_metrics

    topic = new_topic(client, prefix="metered")
    client.create_producer(topic).send(b"x")  # an activation; a passivation follows 1 s later
    wait_for(lambda: row(client, partition_actor_name(topic, 0))["passivations"] == 1, what="passivated")

    def shown(samples: dict) -> bool:
        return (total(samples, "ray_raytxn_passivations_total", actor_kind="partition") >= 1
                and total(samples, "ray_raytxn_activations_total", actor_kind="partition") >= 1
                and total(samples, "ray_raytxn_actors", actor_kind="partition", state="dormant") >= 1)

    wait_for_metrics(shown, "passivations, activations and the dormant partitions gauge")


def test_watching_an_idle_actor_does_not_keep_it(client: rt.Client) -> None:
    """Stats and backlog counts are observations, not traffic (an operator's console asks them
    every second or two): an idle partition and subscription asked them all along are passivated
    all the same. Before, every stats call counted as a call, and a watched actor never passivated."""
    topic = new_topic(client, prefix="watched")
    partition, sub = partition_actor_name(topic, 0), subscription_actor_name(topic, 0, "s")
    client.create_producer(topic).send(b"one")
    consumer = client.subscribe(topic, "s", initial_position="earliest")
    consumer.acknowledge(receive_all(consumer, 1)[0])
    consumer.close()
    handles = {name: ray.get_actor(name, namespace=NAMESPACE) for name in (partition, sub)}  # no activation
    deadline = time.monotonic() + 30 * IDLE_S
    while any(live(name) for name in handles):
        assert time.monotonic() < deadline, "a watched idle actor was never passivated"
        for name, handle in handles.items():
            if live(name):
                try:
                    ray.get(handle.stats.remote(**({"backlog": True} if name == sub else {"storage": True})),
                            timeout=10)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError):
                    pass  # passivating as it was asked
        time.sleep(0.3 * IDLE_S)
    assert row(client, partition)["passivations"] >= 1 and row(client, sub)["passivations"] >= 1


# Last: it stops the module's engine.
def test_an_actor_the_cluster_has_no_room_for_is_a_clear_error(client: rt.Client,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    client.close()
    from raytxn.cluster import stop_engine

    stop_engine()
    # Each actor the supervisor starts reserves more memory than the whole cluster has: its
    # coordinators cannot be placed, and connect says so instead of waiting forever.
    total_mib = int(ray.cluster_resources()["memory"]) >> 20
    began = time.monotonic()
    try:
        with pytest.raises(CannotPlaceActor, match="Ray memory"):
            rt.connect(storage=f"file://{tmp_path_factory.mktemp('tight')}", num_coordinators=1,
                       actor_memory_mib=total_mib + 1)
        assert time.monotonic() - began < 30
        assert not live(coordinator_actor_name(0))  # the pending actor was removed
    finally:
        stop_engine()
