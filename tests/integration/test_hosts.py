"""Hosts (issue 17, actors/host.py): with ``actor_hosts`` set, partitions and subscriptions are
served many per process. Messages go through them exactly once, an idle hosted actor is
passivated out of its host (its tasks cancelled) and comes back on the next call, and a
transaction spanning hosted participants commits across the crash of a host. One engine for the
module, with two hosts, passivating after 1 s idle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.errors import ActorUnavailable, InvalidArgument
from raytxn.ids import NAMESPACE, host_actor_name, host_for, partition_actor_name, subscription_actor_name
from tests.engine import engine_client, nothing_more, receive_all, visible_values, wait_for
from tests.engine import health_row as row

pytestmark = pytest.mark.ray

HOSTS = 2
IDLE_S = 1.0


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.3, passivate_idle_s=IDLE_S, actor_hosts=HOSTS)


def named_actors() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}


def host_ready(index: int) -> dict:
    return ActorRef(host_actor_name(index)).call("ready")


def test_hosted_topics_carry_messages_exactly_once_without_a_process_each(client: rt.Client) -> None:
    topics = [f"h{uuid.uuid4().hex[:6]}-{i}" for i in range(12)]
    client.create_topics(topics, subscriptions=["s"])
    producer = {topic: client.create_producer(topic) for topic in topics}
    for topic in topics:
        producer[topic].send(f"{topic}-plain".encode())
    txn = client.new_transaction()
    for topic in topics:
        producer[topic].send(f"{topic}-txn".encode(), txn=txn)
    txn.commit()
    for topic in topics:
        consumer = client.subscribe(topic, "s")
        messages = receive_all(consumer, 2)
        assert [m.value() for m in messages] == [f"{topic}-plain".encode(), f"{topic}-txn".encode()]
        for message in messages:
            consumer.acknowledge(message)
        consumer.close()
    names = {partition_actor_name(t, 0) for t in topics} | {subscription_actor_name(t, 0, "s") for t in topics}
    assert not names & named_actors()  # no process of their own: the hosts serve them
    assert {host_actor_name(i) for i in range(HOSTS)} <= named_actors()
    rows = {name: row(client, name) for name in names}
    assert {r["host"] for r in rows.values()} == {host_for(n, HOSTS) for n in names}

    wait_for(lambda: all(row(client, name)["passivations"] >= 1 for name in names), timeout_s=60,
             what="every hosted actor passivated")
    for index in range(HOSTS):  # dropped from the hosts with every task they created
        wait_for(lambda index=index: host_ready(index)["owned_tasks"] == 0, what=f"host {index} idle")
    for topic in topics:  # the next calls activate them again; the acks before passivation held
        producer[topic].send(f"{topic}-after".encode())
        consumer = client.subscribe(topic, "s")
        assert [m.value() for m in receive_all(consumer, 1)] == [f"{topic}-after".encode()]
        assert nothing_more(consumer, 0.2)
        consumer.close()
    assert all(row(client, name)["activations"] >= 2 for name in names)



def test_a_txn_spanning_hosted_participants_commits_across_the_crash_of_their_host(client: rt.Client) -> None:
    """A consume-transform-produce txn: its output partition and its input subscription are
    hosted; the sink's host is killed before the commit (Ray restarts it empty). The commit
    reaches both participants, activated again: the output is visible once, the ack holds."""
    source, sink = f"src{uuid.uuid4().hex[:6]}", f"dst{uuid.uuid4().hex[:6]}"
    client.create_topics([source, sink], subscriptions=["s"])
    client.create_producer(source).send(b"in")
    consumer = client.subscribe(source, "s")
    [message] = receive_all(consumer, 1)
    txn = client.new_transaction()
    client.create_producer(sink).send(b"IN", txn=txn)
    consumer.acknowledge(message, txn=txn)
    host = host_for(partition_actor_name(sink, 0), HOSTS)
    pid_before = ActorRef(host).call("ready")["pid"]
    ray.kill(ray.get_actor(host, namespace=NAMESPACE), no_restart=False)
    txn.commit()
    assert ActorRef(host).call("ready")["pid"] != pid_before  # the participant's host was restarted
    assert visible_values(sink) == [b"IN"]
    consumer.close()
    again = client.subscribe(source, "s")
    assert nothing_more(again, 1.0)  # the txn's ack committed: "in" is not delivered again
    again.close()


def test_faults_kill_of_a_hosted_actor_is_a_crash_of_that_actor_alone(client: rt.Client) -> None:
    """``client.faults.kill`` of a hosted partition mid-transaction: its host drops it (its host
    process and the other actors it serves live on), the commit activates it again from storage
    as a new incarnation, and the txn's output is visible once. Killing what does not run is
    ActorUnavailable."""
    topic = f"kill{uuid.uuid4().hex[:6]}"
    client.create_topic(topic)
    name = partition_actor_name(topic, 0)
    producer = client.create_producer(topic)
    producer.send(b"before")
    host = host_for(name, HOSTS)
    pid_before, incarnation_before = ActorRef(host).call("ready")["pid"], row(client, name)["incarnation"]
    txn = client.new_transaction()
    producer.send(b"in-txn", txn=txn)
    client.faults.kill(name)
    # Dropped: gone, or already activated again by a call racing the check (a new incarnation,
    # None while it recovers), never the incarnation that held the txn's entry in memory.
    hosted = ActorRef(host).call("hosted")
    assert name not in hosted or hosted[name]["incarnation"] != incarnation_before
    txn.commit()
    assert ActorRef(host).call("ready")["pid"] == pid_before
    wait_for(lambda: row(client, name)["incarnation"] > incarnation_before, what="a new incarnation")
    assert visible_values(topic) == [b"before", b"in-txn"]
    with pytest.raises(ActorUnavailable):
        client.faults.kill(partition_actor_name(f"never{uuid.uuid4().hex[:6]}", 0))


def test_a_host_serves_only_what_a_dedicated_actor_serves_and_names_it_hosts(client: rt.Client) -> None:
    topic = f"bad{uuid.uuid4().hex[:6]}"
    client.create_topics([topic])
    client.create_producer(topic).send(b"x")  # activates the partition in its host
    name = partition_actor_name(topic, 0)
    host = ray.get_actor(host_for(name, HOSTS), namespace=NAMESPACE)
    for method, args in (("_start", ()), ("no_such_method", ()), ("ready", (1, 2, 3))):
        with pytest.raises(InvalidArgument):
            ray.get(host.call.remote(name, method, args, {}))
    with pytest.raises(ActorUnavailable, match="not hosted"):
        ray.get(host.call.remote(partition_actor_name(topic + "x", 0), "ready", (), {}))
    assert visible_values(topic) == [b"x"]  # none of it changed anything
