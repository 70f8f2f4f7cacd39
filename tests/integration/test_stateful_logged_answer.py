"""Keyed state on an engine that answers commits once logged (``commit_answer="logged"``,
Kafka's EndTxn): a stateful batch reads the state its predecessor committed.

There a commit returns once COMMITTING is durable and the markers follow a moment later, so a
pipeline's next batch could refresh its state before the last batch's markers reached the state
topic: it read the count as it was before that batch and wrote it back, and the batch's updates
were lost (a running count of 20 ended at 5 here, the state partition's markers held back 0.5 s).
The stateful pipelines now commit with ``until_applied=True``: the coordinator answers that
commit once every participant applied it, whatever the engine's ``commit_answer``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.connectors.stateful import StatefulPipeline
from raytxn.connectors.wordcount import running_wordcount
from raytxn.ids import partition_actor_name
from tests.engine import engine_client, new_topic

pytestmark = pytest.mark.ray

MARKER_DELAY_S = 0.5


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, commit_answer="logged")


def _markers_late(client: rt.Client, topic: str) -> ActorRef:
    """Every COMMIT or ABORT marker of ``topic``'s partition 0 waits ``MARKER_DELAY_S`` first."""
    ref = ActorRef(partition_actor_name(topic, 0), client.token)
    ref.call("arm_fault", "partition.before_marker", "delay", 1000, 1.0, None, MARKER_DELAY_S)
    return ref


def test_a_batch_reads_the_state_its_predecessor_committed(client: rt.Client) -> None:
    source, sink, state = new_topic(client, 1, "src"), new_topic(client, 1, "sink"), new_topic(client, 1, "state")
    producer = client.create_producer(source, batching_max_messages=5)
    for _ in range(20):
        producer.send_async(b"word")
    producer.flush()
    late = _markers_late(client, state)
    pipeline = StatefulPipeline(client, source, "wc", sink, state, running_wordcount, "wc-logged",
                                batch_max_messages=5)
    try:
        stats = pipeline.run(until_idle=True)
        assert len(stats) == 4 and dict(pipeline.state) == {"word": b"20"}
    finally:
        pipeline.close()
        late.call("disarm_fault")
    with client.table_view(sink) as totals:  # each batch's total as it committed it
        assert totals.items() == {"word": b"20"}


def test_a_plain_commit_is_still_answered_at_the_log(client: rt.Client) -> None:
    """Without ``until_applied`` the engine's setting holds: the commit returns before the late
    marker, so what it wrote is not readable yet; with it, the commit returns once it is."""
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1, compacted=True)
    late = _markers_late(client, topic)
    try:
        producer = client.create_producer(topic)
        txn = client.new_transaction()
        producer.send(b"v", key="k", txn=txn)
        txn.commit()
        assert client.read_compacted(topic) == []  # the marker is on its way
        txn = client.new_transaction()
        producer.send(b"w", key="k", txn=txn)
        txn.commit(until_applied=True)
        assert [r["value"] for r in client.read_compacted(topic)] == [b"v", b"w"]
    finally:
        late.call("disarm_fault")
