"""Columnar receive on a real engine: ``Consumer.receive_batch`` returns an Arrow table and one ack
handle; the handle's acks go as ranges, plain or in a txn (commit and abort visibility,
redelivery after abort and negative ack, a conflicting batch ack changing nothing), and range
acks hold across a subscription actor restart. One engine for the module."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

import raytxn as rt
from raytxn.client.consumer import Consumer
from raytxn.client.rpc import ActorRef
from raytxn.config import SubscriptionConfig
from raytxn.errors import InvalidArgument, TransactionConflict
from raytxn.ids import subscription_actor_name
from tests.engine import engine_client, new_topic, restart_actor

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, subscription=SubscriptionConfig(read_wait_s=0.2))


def produce(client: rt.Client, topic: str, count: int, batch: int = 1, prefix: str = "m") -> None:
    # The delay is long so that entries are cut by the count or the flush, never by a slow loop.
    producer = client.create_producer(topic, batching_max_messages=batch, batching_max_delay_ms=60_000)
    futures = [producer.send_async(f"{prefix}{i}".encode(), key=f"k{i % 3}", properties={"i": str(i)} if i == 0
                                   else None, event_time=1_000 + i) for i in range(count)]
    producer.flush()
    for future in futures:
        future.result()
    producer.close()


def receive(consumer: Consumer, count: int, timeout: float = 20.0) -> rt.MessageBatch:
    """One batch of exactly ``count`` messages (waiting until that many are queued)."""
    deadline = time.monotonic() + timeout
    while True:
        stats_queued = consumer._queued  # what the fetch loop has brought so far
        if stats_queued >= count or time.monotonic() > deadline:
            return consumer.receive_batch(max_messages=count, timeout_s=1.0)
        time.sleep(0.02)


def values(batch: rt.MessageBatch) -> list[bytes]:
    return batch.table.column("value").to_pylist()


def sub_stats(topic: str, sub: str = "sub") -> dict:
    return ActorRef(subscription_actor_name(topic, 0, sub)).call("stats")


def test_a_batch_is_an_arrow_table_and_its_plain_ack_acks_all_of_it(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    produce(client, topic, 10, batch=4)  # entries of 4, 4 and 2 messages
    batch = receive(consumer, 10)
    table = batch.table
    assert isinstance(table, pa.Table) and len(batch) == table.num_rows == 10
    assert values(batch) == [f"m{i}".encode() for i in range(10)]
    assert table.column("key").to_pylist() == [f"k{i % 3}" for i in range(10)]
    assert table.column("properties").to_pylist()[:2] == [[("i", "0")], []]
    assert [t.value for t in table.column("event_time")] == [1_000 + i for i in range(10)]
    assert table.column("batch_index").to_pylist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert len(set(table.column("entry_id").to_pylist())) == 3
    assert table.column("redelivery_count").to_pylist() == [0] * 10
    assert table.column("partition").to_pylist() == [0] * 10
    batch.ack_async().result(timeout=20)  # applied: one range for the three entries
    stats = sub_stats(topic)
    assert stats["unacked"] == 0 and stats["acked_ranges"] == 0
    assert consumer.receive_batch(timeout_s=0.3).num_rows == 0
    consumer.close()


def test_txn_batch_ack_commit_acks_and_abort_redelivers(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub", consumer_type=rt.ConsumerType.Shared)
    produce(client, topic, 6, batch=3)
    batch = receive(consumer, 6)
    txn = client.new_transaction()
    batch.ack(txn=txn)  # logged: pending in txn
    assert sub_stats(topic)["pending_ack"]["per_txn"][0]["entries"] == 2
    txn.abort()
    again = receive(consumer, 6)  # the abort hands them back
    assert values(again) == values(batch)
    assert again.table.column("redelivery_count").to_pylist() == [1] * 6
    txn = client.new_transaction()
    again.ack(txn=txn)
    txn.commit()
    stats = sub_stats(topic)
    assert stats["pending_ack"]["txns"] == [] and stats["unacked"] == 0
    assert consumer.receive_batch(timeout_s=0.3).num_rows == 0
    consumer.close()


def test_negative_ack_of_some_rows_redelivers_just_those(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub", negative_ack_redelivery_delay_s=0.05)
    produce(client, topic, 4)
    batch = receive(consumer, 4)
    batch.ack_rows([0, 2])
    batch.negative_ack([1, 3])
    again = receive(consumer, 2)
    assert values(again) == [b"m1", b"m3"]
    assert again.table.column("redelivery_count").to_pylist() == [1, 1]
    with pytest.raises(InvalidArgument):
        again.ack_rows([2])
    again.ack()
    consumer.close()


def test_a_conflicting_batch_ack_raises_and_changes_nothing(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    produce(client, topic, 5)
    batch = receive(consumer, 5)
    first = client.new_transaction()
    batch.ack_rows([3], txn=first)
    second = client.new_transaction()
    with pytest.raises(TransactionConflict):
        batch.ack(txn=second)
    per_txn = sub_stats(topic)["pending_ack"]["per_txn"]
    assert [(t["txn"], t["entries"]) for t in per_txn] == [(str(first.id), 1)]  # nothing of the second
    second.abort()
    first.commit()
    batch.ack()  # plain: the rest (the entry the first txn acked is acked already)
    consumer.close()
    stats = sub_stats(topic)
    assert stats["unacked"] == 0 and stats["pending_ack"]["txns"] == []


def test_range_acks_hold_across_a_subscription_restart(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    produce(client, topic, 20)  # one entry each
    batch = receive(consumer, 10)
    txn = client.new_transaction()
    batch.ack(txn=txn)  # one range of ten entries, logged in the pending-ack log
    name = subscription_actor_name(topic, 0, "sub")
    restart_actor(name)  # replays the log: the range's entries are pending in txn again
    txn.commit()
    rest = receive(consumer, 10)  # what the new incarnation delivers: the other ten, not the txn's
    assert values(rest) == [f"m{i}".encode() for i in range(10, 20)]
    rest.ack_async().result(timeout=20)
    ActorRef(name).call("persist_cursor")
    restart_actor(name)
    assert consumer.receive_batch(timeout_s=1.0).num_rows == 0
    last = rest.table.slice(9).to_pylist()[0]
    assert sub_stats(topic)["mark_delete_position"] == f"<{last['ledger_id']},{last['entry_id']}>"
    consumer.close()
