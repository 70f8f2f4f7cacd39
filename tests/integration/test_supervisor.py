"""The supervisor keeps every actor running and recovered; the fault API arms points from a
driver; clients ride over crashes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef, unwrap
from raytxn.cluster import wait_names_released
from raytxn.errors import ActorUnavailable, InvalidArgument
from raytxn.ids import NAMESPACE, SUPERVISOR_NAME, coordinator_actor_name, partition_actor_name
from tests.engine import engine_client, wait_for
from tests.engine import health_row as row

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.3)


def test_health_reports_every_actor(client: rt.Client) -> None:
    topic = f"h-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2)
    health = client.health()
    names = {r["name"] for r in health["actors"]}
    partitions = {partition_actor_name(topic, 0), partition_actor_name(topic, 1)}
    assert {coordinator_actor_name(0), coordinator_actor_name(1)} | partitions <= names
    assert health["healthy"], health
    # a new topic's partitions start on first use: dormant until then, coordinators always up
    assert {r["name"] for r in health["actors"] if r["state"] == "DORMANT"} >= partitions
    assert all(r["incarnation"] >= 1 for r in health["actors"] if r["kind"] == "coordinator")
    client.create_producer(topic).send(b"x", key="k")
    started = [r for r in client.health()["actors"] if r["name"] in partitions and r["state"] == "ALIVE"]
    assert started and all(r["incarnation"] >= 1 and r["activations"] == 1 for r in started)


def test_killed_actor_is_recovered_without_any_client_call(client: rt.Client) -> None:
    topic = f"k-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    client.create_producer(topic).send(b"before")
    name = partition_actor_name(topic, 0)
    before = row(client, name)
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
    # nobody calls the partition: the supervisor's probe drives the new incarnation's recovery
    wait_for(lambda: (r := row(client, name))["state"] == "ALIVE" and r["incarnation"] > before["incarnation"],
             what="restart seen by the supervisor")
    after = row(client, name)
    assert after["restarts"] == before["restarts"] + 1
    assert after["last_recovery_ms"] >= before["last_recovery_ms"]


def test_actor_killed_for_good_is_dormant_and_the_next_call_activates_it(client: rt.Client) -> None:
    topic = f"d-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    producer = client.create_producer(topic)
    producer.send(b"kept")
    name = partition_actor_name(topic, 0)
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    wait_for(lambda: row(client, name)["state"] == "DORMANT", what="dormant")
    activations = row(client, name)["activations"]
    producer.send(b"after")  # finds no actor: its ActorRef asks the supervisor to activate it
    assert row(client, name)["activations"] == activations + 1
    stats = ActorRef(name).call("stats")
    assert stats["applied_entries"] == 2  # the data survived: recovered from storage


def test_probes_reuse_handles_and_still_see_a_replaced_actor(client: rt.Client) -> None:
    """The watch resolves a handle by name once, not on every probe (a GCS call and a new
    ActorHandle each, 70% of the supervisor's busy samples under load), and still follows an
    actor replaced by a new incarnation: killed for good, activated again, then restarted."""
    topic = f"r-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    producer = client.create_producer(topic)
    producer.send(b"one")
    name = partition_actor_name(topic, 0)
    wait_for(lambda: row(client, name)["state"] == "ALIVE", what="probed alive")
    lookups = client.health()["handle_lookups"]
    time.sleep(1.2)  # four watch rounds, each probing the coordinators and the partition
    assert client.health()["handle_lookups"] == lookups
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    producer.send(b"two")  # activates a new actor under the same name
    replaced = row(client, name)
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
    # only a probe through the new incarnation's handle sees this restart
    wait_for(lambda: (r := row(client, name))["state"] == "ALIVE" and r["restarts"] > replaced["restarts"],
             what="restart of the replacement seen by the supervisor")
    coordinator = coordinator_actor_name(0)
    recreated = row(client, coordinator)["recreated"]
    ray.kill(ray.get_actor(coordinator, namespace=NAMESPACE), no_restart=True)
    wait_for(lambda: (r := row(client, coordinator))["recreated"] > recreated and r["state"] == "ALIVE",
             what="dead coordinator created again")
    assert ActorRef(name).call("stats")["applied_entries"] == 2


def test_coordinators_import_the_actor_classes_at_start(client: rt.Client) -> None:
    """A coordinator's first commit must not import partition.py (Ray loads a handle's class on
    first use): the coordinator imports every engine actor module as it starts."""
    for index in range(client.config.coordinator.num_coordinators):
        assert ActorRef(coordinator_actor_name(index)).call("ready")["actor_classes_imported"] is True


def test_fault_api_arm_list_disarm_and_ride_over(client: rt.Client) -> None:
    topic = f"f-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    producer = client.create_producer(topic)
    with pytest.raises(InvalidArgument):
        client.faults.arm("nonsense.point")
    with pytest.raises(InvalidArgument):
        client.faults.arm("partition.before_append", action="explode", topic=topic)
    armed = client.faults.arm("partition.before_append", action="delay", delay_s=0.3, times=2, topic=topic)
    assert armed == [partition_actor_name(topic, 0)]
    assert client.faults.list(topic)[partition_actor_name(topic, 0)][0]["point"] == "partition.before_append"
    t0 = time.monotonic()
    producer.send(b"slow")
    assert time.monotonic() - t0 >= 0.3
    client.faults.disarm("partition.before_append", topic=topic)
    assert client.faults.list(topic) == {}
    client.subscribe(topic, "watchers").close()  # every actor kind answers list/arm/disarm
    armed = client.faults.arm("subscription.after_cursor_persist", action="delay", delay_s=0.01, topic=topic)
    assert list(client.faults.list(topic)) == armed
    client.faults.disarm(topic=topic)
    assert client.faults.list(topic) == {}
    # storage errors at the ledger are retried inside the actor: the send still lands once
    client.faults.arm("ledger.before_put", action="raise", times=3, topic=topic,
                      actor=partition_actor_name(topic, 0))
    producer.send(b"through storage errors")
    # a crash after the durable append: the producer retries, the partition dedups
    client.faults.arm("partition.after_append_before_reply", action="crash", topic=topic)
    producer.send(b"through a crash")
    stats = ActorRef(partition_actor_name(topic, 0)).call("stats")
    assert stats["applied_entries"] == 3 and stats["incarnation"] == 2


def test_coordinator_crash_during_commit_via_fault_api(client: rt.Client) -> None:
    topic = f"c-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction()
    for i in range(4):
        producer.send(f"m{i}".encode(), key=str(i), txn=txn)
    client.faults.arm("coordinator.after_log_committing", "crash", actor=coordinator_actor_name(txn.id.tc_id))
    txn.commit()
    assert client.coordinators.get_txn(txn.id)["state"] == "COMMITTED"
    for p in range(2):
        assert ActorRef(partition_actor_name(topic, p)).call("stats")["ongoing_txns"] == 0


def test_once_shut_down_the_supervisor_creates_no_actor(client: rt.Client) -> None:
    """Last in this module: it stops the module's engine. After ``shutdown_actors`` nothing may
    create an actor again: a watch round under way found the coordinators just killed and
    created them again, and a teardown then waited 30 s for names that never went."""
    topic = f"s-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    supervisor = ray.get_actor(SUPERVISOR_NAME, namespace=NAMESPACE)
    wait_names_released(ray.get(supervisor.shutdown_actors.remote(auth=client.token)))
    with pytest.raises(ray.exceptions.RayTaskError) as refused:  # an activation, as a client's call asks
        ray.get(supervisor.activate.remote(partition_actor_name(topic, 0), auth=client.token))
    assert isinstance(unwrap(refused.value), ActorUnavailable)
    time.sleep(1.0)  # three of the watch's rounds, had it not stopped
    registered = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
    assert registered == {SUPERVISOR_NAME}, registered
