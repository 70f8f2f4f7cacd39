"""The Ray Data connector on a real engine: ``write_topic`` produces from Ray tasks inside a txn
(invisible until commit, exactly once even when a task fails midway and is retried), and
``read_topic`` returns a subscription's next range with a handle acking exactly it in a txn."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.connectors.ray_data import read_topic, write_topic
from raytxn.ids import partition_actor_name
from tests.engine import engine_client, visible_values

pytestmark = pytest.mark.ray

COLUMNS = ["key", "value", "properties", "event_time", "publish_time", "topic", "partition", "message_id"]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    from raytxn.config import SubscriptionConfig

    yield from engine_client(tmp_path_factory, subscription=SubscriptionConfig(consumer_timeout_s=3.0))


def visible(topic: str, partitions: int) -> list[bytes]:
    """Every committed message of the topic, read straight from the partition actors."""
    return visible_values(topic, range(partitions))

def duplicates(topic: str, partitions: int) -> int:
    return sum(ActorRef(partition_actor_name(topic, p)).call("stats")["duplicates"] for p in range(partitions))


def rows_dataset(n: int, blocks: int) -> ray.data.Dataset:
    return ray.data.from_items([{"key": f"k{i % 13}", "value": f"v{i}", "properties": {"i": str(i)}}
                                for i in range(n)]).repartition(blocks)


def test_write_topic_in_txn_visible_at_commit_only_exactly_once(client: rt.Client) -> None:
    topic = f"rdw-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 3)
    txn = client.new_transaction(timeout=120)
    assert write_topic(rows_dataset(600, 4), client, topic, txn, key_col="key", properties_col="properties",
                       batch_rows=50) == 600
    assert visible(topic, 3) == []
    txn.commit()
    assert sorted(visible(topic, 3)) == sorted(f"v{i}".encode() for i in range(600))
    assert duplicates(topic, 3) == 0


def test_task_failing_midway_is_retried_without_duplicates(client: rt.Client, tmp_path: Path) -> None:
    topic = f"rdf-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 3)
    marker = tmp_path / "failed-once"  # the tasks run in other processes: a file says "already failed"

    def fail_first_attempt(block: int, attempt: int, rows_sent: int) -> None:
        if block == 1 and rows_sent >= 100 and not marker.exists():
            marker.write_text(f"attempt {attempt}")
            raise RuntimeError("injected task failure after writing part of the block")

    txn = client.new_transaction(timeout=120)
    assert write_topic(rows_dataset(900, 3), client, topic, txn, key_col="key", batch_rows=50,
                       fault=fail_first_attempt) == 900
    txn.commit()
    assert marker.read_text() == "attempt 0", "the fault never fired"
    got = visible(topic, 3)
    assert len(got) == 900 and sorted(got) == sorted(f"v{i}".encode() for i in range(900))
    assert duplicates(topic, 3) > 0, "the retried task never re-sent a batch: the failure was not midway"


def produce(client: rt.Client, topic: str, n: int, **options: int) -> None:
    producer = client.create_producer(topic, **options)
    for i in range(n):
        producer.send_async(f"m{i}".encode(), key=f"k{i}", properties={"n": str(i)})
    producer.flush()
    producer.close()


def test_read_topic_range_acked_in_committed_txn(client: rt.Client) -> None:
    topic = f"rdr-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2)
    produce(client, topic, 50)
    ds, handle = read_topic(client, topic, "sub")
    try:
        assert ds.schema().names == COLUMNS and handle.count >= 1
        rows = ds.take_all()
        assert len(rows) == 50
        assert sorted(r["value"] for r in rows) == sorted(f"m{i}".encode() for i in range(50))
        assert all(json.loads(r["properties"]) == {"n": r["value"].decode()[1:]} for r in rows)
        assert {r["partition"] for r in rows} == {0, 1} and all(r["topic"] == topic for r in rows)
        txn = client.new_transaction(timeout=60)
        handle.acknowledge(txn)
        txn.commit()
    finally:
        handle.close()
    ds, handle = read_topic(client, topic, "sub")
    handle.close()
    assert handle.count == 0 and ds.count() == 0


def test_read_topic_max_messages_and_aborted_ack_reads_again(client: rt.Client) -> None:
    topic = f"rda-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 1)
    produce(client, topic, 30, batching_max_messages=1)  # bounds cut at entries: one message each
    ds, handle = read_topic(client, topic, "sub", max_messages=10)
    try:
        first = [r["value"] for r in ds.take_all()]
        assert first == [f"m{i}".encode() for i in range(10)]  # one partition: in publish order
        txn = client.new_transaction(timeout=60)
        handle.acknowledge(txn)
        txn.abort()
    finally:
        handle.close()
    ds, handle = read_topic(client, topic, "sub")
    try:
        assert [r["value"] for r in ds.take_all()] == [f"m{i}".encode() for i in range(30)]
        txn = client.new_transaction(timeout=60)
        handle.acknowledge(txn)
        txn.commit()
    finally:
        handle.close()
    ds, handle = read_topic(client, topic, "sub")
    handle.close()
    assert ds.count() == 0


def latest_values(client: rt.Client, topic: str) -> dict[str, bytes]:
    """Each live key's latest committed value, folded from ``read_compacted`` (independent of
    the pipeline's own state read)."""
    latest: dict[str, bytes | None] = {}
    for p in range(client.get_topic(topic)["partitions"]):
        for record in client.read_compacted(topic, p):
            latest[record["key"]] = record["value"]
    return {key: value for key, value in latest.items() if value}


def test_stateful_data_pipeline_keeps_running_totals_exactly_once(client: rt.Client) -> None:
    """Ray Data's keyed state: running word totals in a compacted state topic, exact across a
    batch that wrote its output and state updates and then failed before its commit; the state
    is read by Ray tasks (read_state), and bad settings are refused."""
    from raytxn.connectors.ray_data import StatefulDataPipeline, read_state
    from raytxn.connectors.wordcount import expected_counts, running_wordcount_ray, sample_lines

    run = uuid.uuid4().hex[:6]
    source, sink, state = f"rd-lines-{run}", f"rd-totals-{run}", f"rd-state-{run}"
    client.create_topic(source, 2)
    client.create_topic(sink, 2)
    client.create_topic(state, 2, compacted=True)
    lines = sample_lines(60)
    producer = client.create_producer(source, batching_max_messages=5)
    for i, line in enumerate(lines):
        producer.send_async(line.encode(), key=str(i))
    producer.flush()
    failed: list[int] = []

    def fail_once(batch: int) -> None:
        if batch == 1 and not failed:
            failed.append(batch)
            raise RuntimeError("injected failure before batch 1's commit")

    pipeline = StatefulDataPipeline(client, source, "rd", sink, state, running_wordcount_ray, f"rd-{run}",
                                    batch_max_messages=30, before_commit=fail_once)
    stats = pipeline.run(until_idle=True)
    assert failed and sum(s.rows_in for s in stats) == 60 and len(stats) >= 2
    assert [s.attempt for s in stats if s.attempt] == [1] and all(s.state_updates for s in stats)
    expected = {word: str(n).encode() for word, n in expected_counts(lines).items()}
    assert latest_values(client, state) == expected
    assert latest_values(client, sink) == expected
    assert {r["key"]: r["value"] for r in read_state(client, state).take_all()} == expected
    for bad, message in [((source, sink, source), "of its own"), ((source, sink, sink), "of its own"),
                         ((source, state, sink), "not compacted")]:
        with pytest.raises(rt.errors.InvalidArgument, match=message):
            StatefulDataPipeline(client, bad[0], "rd", bad[1], bad[2], running_wordcount_ray, f"bad-{run}")
    with pytest.raises(rt.errors.InvalidArgument, match="not a compacted topic"):
        read_state(client, sink)
