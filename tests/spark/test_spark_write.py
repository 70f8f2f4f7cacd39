"""Spark on Ray (RayDP) writing into transactions: parallel from the tasks, exactly once even
when a task fails midway and is retried."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.connectors import spark as sc
from raytxn.ids import partition_actor_name
from tests.engine import engine_client, visible_values

pytestmark = [pytest.mark.ray, pytest.mark.spark]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def visible(topic: str, partitions: int) -> list[bytes]:
    return visible_values(topic, range(partitions))

def test_write_in_txn_visible_at_commit_only(client: rt.Client, spark) -> None:
    topic = f"sw-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2)
    df = spark.createDataFrame([(f"k{i % 17}", f"v{i}") for i in range(1000)], ["key", "value"]).repartition(4)
    txn = client.new_transaction(timeout=120)
    assert sc.write(df, client, topic, txn, key_col="key", batch_rows=100) == 1000
    assert visible(topic, 2) == []
    txn.commit()
    got = visible(topic, 2)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(1000))


def test_task_failing_midway_is_retried_without_duplicates(client: rt.Client, spark) -> None:
    topic = f"sf-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 3)
    rows = [(f"k{i}", f"v{i}") for i in range(900)]
    df = spark.createDataFrame(rows, ["key", "value"]).repartition(3)

    def fail_first_attempt(spark_partition: int, attempt: int, rows_sent: int) -> None:
        if spark_partition == 1 and attempt == 0 and rows_sent >= 100:
            raise RuntimeError("injected task failure after writing part of the partition")

    txn = client.new_transaction(timeout=120)
    assert sc.write(df, client, topic, txn, key_col="key", batch_rows=50, fault=fail_first_attempt) == 900
    txn.commit()
    got = visible(topic, 3)
    assert len(got) == 900 and sorted(got) == sorted(f"v{i}".encode() for i in range(900))
    duplicates = sum(ActorRef(partition_actor_name(topic, p)).call("stats")["duplicates"] for p in range(3))
    assert duplicates >= 1, "the retried task never re-sent a batch: the failure was not midway"
