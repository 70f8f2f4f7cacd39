"""Commits answered once logged (``CoordinatorConfig.commit_answer="logged"``, Kafka's EndTxn) on
a real engine (local Ray, file:// storage): the answer comes while the partition's marker is still
held, the messages become readable once the marker lands, a coordinator that dies after the
answer leaves the commit to its successor's re-drive, and aborts still wait for every participant."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.client.producer import Producer
from raytxn.client.transaction import Transaction
from raytxn.ids import coordinator_actor_name
from tests.engine import activate, engine_client, new_topic, restart_actor, visible_values, wait_for

pytestmark = pytest.mark.ray

HELD_S = 3.0  # how long the partition holds a marker back (the delay fault)


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, commit_answer="logged")


def _answered_at_log(client: rt.Client) -> int:
    return sum(stats["commits_answered_at_log"] for stats in client.coordinators.stats())


def _sent_with_marker_held(client: rt.Client, value: bytes) -> tuple[str, Producer, Transaction]:
    """A fresh topic, a producer, and an open txn that sent ``value`` there, whose partition
    will hold its marker back for ``HELD_S``."""
    topic = new_topic(client)
    activate(topic)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout=60)
    producer.send(value, txn=txn)
    client.faults.arm("partition.before_marker", "delay", delay_s=HELD_S, topic=topic)
    return topic, producer, txn


def test_a_commit_is_answered_while_the_partition_still_holds_its_marker(client: rt.Client) -> None:
    answered_before = _answered_at_log(client)
    topic, _producer, txn = _sent_with_marker_held(client, b"early")
    began = time.monotonic()
    txn.commit()
    answered_in = time.monotonic() - began
    # Answered once applied, the commit would have waited out the held marker.
    assert answered_in < HELD_S / 2, f"the commit took {answered_in:.2f}s"
    assert client.coordinators.get_txn(txn.id)["state"] == "COMMITTING"
    assert visible_values(topic) == []  # decided and durable, not applied yet
    assert _answered_at_log(client) == answered_before + 1
    wait_for(lambda: visible_values(topic) == [b"early"], what="the held marker to land")
    wait_for(lambda: client.coordinators.get_txn(txn.id)["state"] == "COMMITTED", what="COMMITTED logged")


def test_a_commit_answered_before_its_coordinator_died_is_applied_by_the_successor(client: rt.Client) -> None:
    topic = new_topic(client, partitions=2)
    activate(topic, 2)
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout=60)
    values = [f"v{i}".encode() for i in range(20)]
    for i, value in enumerate(values):
        producer.send_async(value, key=f"k{i}", txn=txn)
    # Every end the partitions get is refused (retriably) until disarmed: the coordinator that
    # answers keeps retrying, and dies before any marker is written.
    client.faults.arm("partition.before_marker", "raise", times=-1, topic=topic)
    txn.commit()
    txn_id = txn.id
    assert client.coordinators.get_txn(txn_id)["state"] == "COMMITTING"
    restart_actor(coordinator_actor_name(txn_id.tc_id))
    assert visible_values(topic, (0, 1)) == []
    client.faults.disarm("partition.before_marker", topic=topic)
    wait_for(lambda: sorted(visible_values(topic, (0, 1))) == sorted(values), what="the successor's markers")
    wait_for(lambda: client.coordinators.get_txn(txn_id)["state"] == "COMMITTED", what="COMMITTED logged")


def test_an_abort_is_still_answered_once_every_participant_has_it(client: rt.Client) -> None:
    topic, producer, txn = _sent_with_marker_held(client, b"aborted")
    began = time.monotonic()
    txn.abort()
    assert time.monotonic() - began >= HELD_S * 0.9
    assert client.coordinators.get_txn(txn.id)["state"] in ("ABORTING", "ABORTED")
    # Redone at once in another txn, as the abort's answer allows: only the redo is read.
    with client.transaction(timeout=60) as redo:
        producer.send(b"redone", txn=redo)
    wait_for(lambda: visible_values(topic) == [b"redone"], what="the redo")
