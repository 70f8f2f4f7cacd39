"""Retention on a real engine (local Ray, file:// storage): a partition trims its ledger below its
slowest subscription's persisted cursor and as its topic's retention policy allows, so storage
shrinks while traffic flows; nothing unacked is lost; aborted-txn state goes with the trimmed
markers; a subscription created later at Earliest starts at the first retained entry; and all of
it holds across partition (and subscription) restarts."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import raytxn as rt
from raytxn.client.consumer import Consumer
from raytxn.client.producer import Producer
from raytxn.config import PartitionConfig, SubscriptionConfig
from raytxn.errors import InvalidArgument, Timeout, TopicNotFound
from raytxn.ids import EARLIEST, Position, partition_actor_name, subscription_actor_name
from raytxn.ledger.storage import Storage
from tests.engine import engine_client, new_topic, partition_ref, receive_all, restart_actor, visible_values

pytestmark = pytest.mark.ray

PAYLOAD = b"x" * 2000


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, partition=PartitionConfig(retention_check_s=0.2),
                             subscription=SubscriptionConfig(cursor_snapshot_interval_s=0.1, read_wait_s=0.2))


def stats(topic: str) -> dict:
    return partition_ref(topic).call("stats")


def trimmed_below(topic: str) -> Position:
    return Position(*(int(x) for x in stats(topic)["trimmed_below"].strip("<>").split(",")))


def stored_bytes(client: rt.Client, topic: str, ledgers_only: bool = False) -> int:
    """Bytes stored for partition 0 of the topic: its ledgers (and metadata and snapshots)."""
    storage = Storage.from_url(client.config.storage_url)
    prefixes = [f"streams/topics/{topic}/0/ledgers"] if ledgers_only else [f"streams/topics/{topic}/0",
                                                                          f"topics/{topic}/0"]
    return sum(info.size for prefix in prefixes for info in asyncio.run(storage.list_info(prefix)))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def send(producer: Producer, count: int, tag: str = "m") -> list[rt.MessageId]:
    return [producer.send(PAYLOAD + f"{tag}{i}".encode()) for i in range(count)]


def drain(consumer: Consumer) -> list[rt.Message]:
    """Every message the consumer gets until none arrives for 2 s (at most 1000)."""
    messages = []
    for _ in range(1000):
        try:
            messages.append(consumer.receive(timeout=2.0))
        except Timeout:
            break
    return messages


def restart_partition(topic: str) -> None:
    restart_actor(partition_actor_name(topic, 0))


def test_storage_shrinks_while_traffic_flows_also_across_partition_restarts(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub", initial_position="earliest")
    producer = client.create_producer(topic, batching_max_messages=1)  # one ledger entry per send
    round_bytes = 25 * len(PAYLOAD)
    peaks, troughs = [], []
    for round_no in range(6):
        ids = send(producer, 25, f"r{round_no}-")
        peaks.append(stored_bytes(client, topic))
        received = receive_all(consumer, 25)
        assert [m.message_id() for m in received] == ids  # every message, once, in order
        for message in received:
            consumer.acknowledge(message)
        # everything is acked: retention trims the ledger right up to the readable end
        wait_until(lambda ids=ids: trimmed_below(topic) > ids[-1].position, "everything acked is trimmed")
        wait_until(lambda: stored_bytes(client, topic) < round_bytes / 2, "the trimmed objects are deleted")
        troughs.append(stored_bytes(client, topic))
        if round_no in (2, 4):
            restart_partition(topic)  # the new incarnation writes a new ledger; the old one goes too
    assert all(peak > round_bytes for peak in peaks)
    assert all(trough < round_bytes / 2 for trough in troughs)
    assert stats(topic)["trims"] >= 1


def test_a_slow_subscription_holds_its_unacked_data_across_restarts(client: rt.Client) -> None:
    topic = new_topic(client)
    fast = client.subscribe(topic, "fast", initial_position="earliest")
    slow = client.subscribe(topic, "slow", initial_position="earliest")
    producer = client.create_producer(topic, batching_max_messages=1)
    ids = send(producer, 40)
    for message in receive_all(fast, 40):
        fast.acknowledge(message)
    for message in receive_all(slow, 10):
        slow.acknowledge(message)
    wait_until(lambda: trimmed_below(topic) == ids[10].position, "the slow subscription's acks are trimmed")
    restart_partition(topic)
    restart_actor(subscription_actor_name(topic, 0, "slow"))
    more = send(producer, 5, "more")
    for message in receive_all(fast, 5):
        fast.acknowledge(message)
    for _ in range(3):  # more checks, and more traffic acked by the fast one, move nothing past it
        partition_ref(topic).call("apply_retention")
    assert trimmed_below(topic) == ids[10].position
    assert stored_bytes(client, topic, ledgers_only=True) > 30 * len(PAYLOAD)  # still stored
    slow.close()
    slow = client.subscribe(topic, "slow")
    assert [m.message_id() for m in receive_all(slow, 35)] == ids[10:] + more
    slow.acknowledge_cumulative(more[-1])
    wait_until(lambda: trimmed_below(topic) > more[-1].position, "the slow subscription caught up")
    wait_until(lambda: stored_bytes(client, topic, ledgers_only=True) < 5 * len(PAYLOAD), "the ledgers shrink")


def test_a_deleted_subscription_holds_nothing_back(client: rt.Client) -> None:
    topic = new_topic(client)
    fast = client.subscribe(topic, "fast", initial_position="earliest")
    idle = client.subscribe(topic, "idle", initial_position="earliest")
    ids = send(client.create_producer(topic, batching_max_messages=1), 10)
    for message in receive_all(fast, 10):
        fast.acknowledge(message)
    partition_ref(topic).call("apply_retention")
    assert trimmed_below(topic) <= ids[0].position  # idle acked nothing
    idle.unsubscribe()
    wait_until(lambda: trimmed_below(topic) > ids[-1].position, "the rest is trimmed")


def test_aborted_txn_state_is_pruned_with_the_trimmed_markers(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic, batching_max_messages=1)
    kept = []
    for i in range(5):  # aborted data, its ABORT marker, then a kept message: five times
        txn = client.new_transaction()
        producer.send(b"aborted", txn=txn)
        txn.abort()
        kept.append(producer.send(f"kept{i}".encode()))
    partition_ref(topic).call("apply_retention")
    assert stats(topic)["aborted_txns"] == 5  # no subscription yet: everything stays
    consumer = client.subscribe(topic, "sub", initial_position="earliest")
    received = receive_all(consumer, 5)
    assert [m.value() for m in received] == [f"kept{i}".encode() for i in range(5)]
    # The subscription acks what it reads past without delivering (aborted data, markers): the
    # first aborted txn lay before kept0, so it goes before anything is acked by the consumer.
    wait_until(lambda: trimmed_below(topic) == kept[0].position, "what was read past is trimmed")
    # (The trim shows in stats while its write completes; the pruning follows it.)
    wait_until(lambda: stats(topic)["aborted_txns"] == 4, "the trimmed aborted txn is pruned")
    for message in received[:3]:
        consumer.acknowledge(message)
    # The subscription acked the aborted data and markers it read past too, so its mark-delete
    # bound is kept3: the markers of the first four aborted txns lie below the cut, the last above.
    wait_until(lambda: trimmed_below(topic) == kept[3].position, "the acked part is trimmed")
    assert stats(topic)["aborted_txns"] == 1 and stats(topic)["aborted_pruned"] == 4
    restart_partition(topic)
    assert stats(topic)["aborted_txns"] == 1
    assert visible_values(topic) == [b"kept3", b"kept4"]  # the retained aborted data stays hidden
    for message in received[3:]:
        consumer.acknowledge(message)
    wait_until(lambda: stats(topic)["aborted_txns"] == 0, "every aborted txn is pruned")
    restart_partition(topic)
    assert stats(topic)["aborted_txns"] == 0 and visible_values(topic) == []


def test_a_later_subscription_at_earliest_starts_at_the_first_retained_entry(client: rt.Client) -> None:
    topic = new_topic(client)
    first = client.subscribe(topic, "first", initial_position="earliest")
    producer = client.create_producer(topic, batching_max_messages=1)
    ids = send(producer, 20)
    received = receive_all(first, 20)
    for message in received[:12]:
        first.acknowledge(message)
    wait_until(lambda: trimmed_below(topic) == ids[12].position, "the acked entries are trimmed")
    late = client.subscribe(topic, "late", initial_position="earliest")
    assert [m.message_id() for m in receive_all(late, 8)] == ids[12:]
    assert partition_ref(topic).call("last_message_id") == ids[-1].position  # it scans back to the trim
    restart_partition(topic)
    later = client.subscribe(topic, "later", initial_position="earliest")
    assert [m.message_id() for m in receive_all(later, 8)] == ids[12:]


def test_a_topic_without_subscriptions_keeps_everything_unless_its_policy_says_otherwise(client: rt.Client) -> None:
    plain = new_topic(client)
    ids = send(client.create_producer(plain, batching_max_messages=1), 10)
    for _ in range(3):
        partition_ref(plain).call("apply_retention")
    assert trimmed_below(plain) == EARLIEST
    assert len(visible_values(plain)) == 10

    timed = f"timed-{uuid.uuid4().hex[:8]}"
    retention_s = 4.0
    client.create_topic(timed, retention_s=retention_s)
    assert client.get_topic(timed)["retention_s"] == retention_s
    producer = client.create_producer(timed, batching_max_messages=1)
    sent_at, ids = [], []
    for i in range(10):
        sent_at.append(time.monotonic())  # the entry's publish time is no earlier than this
        ids.extend(send(producer, 1, tag=f"t{i}"))
    trimmed = partition_ref(timed).call("apply_retention")["trimmed_below"]
    # An entry whose send began less than retention_s before this call returned is too young to
    # trim, however slow a loaded machine made the sends; the first of them bounds the trim.
    returned_at = time.monotonic()
    young = [i for i, at in enumerate(sent_at) if returned_at - at < retention_s]
    assert young, "the sends took longer than retention_s; no entry was provably too young"
    assert Position(*(int(x) for x in trimmed.strip("<>").split(","))) <= ids[young[0]].position
    wait_until(lambda: trimmed_below(timed) > ids[-1].position, "the data is older than retention_s")
    restart_partition(timed)
    assert visible_values(timed) == []
    late = client.subscribe(timed, "late", initial_position="earliest")
    fresh = client.create_producer(timed).send(b"after")
    assert receive_all(late, 1)[0].message_id() == fresh


def test_a_size_policy_keeps_acked_data_past_the_cursor(client: rt.Client) -> None:
    topic = f"sized-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, retention_bytes=8 * len(PAYLOAD))
    consumer = client.subscribe(topic, "sub", initial_position="earliest")
    producer = client.create_producer(topic, batching_max_messages=1)
    ids = send(producer, 30)
    for message in receive_all(consumer, 30):
        consumer.acknowledge(message)
    wait_until(lambda: trimmed_below(topic) > ids[10].position, "the policy lets the oldest go")
    for _ in range(3):
        partition_ref(topic).call("apply_retention")
    assert stored_bytes(client, topic, ledgers_only=True) >= 8 * len(PAYLOAD)
    restart_partition(topic)
    late = client.subscribe(topic, "late", initial_position="earliest")
    kept = drain(late)
    # at least 8 objects of a payload each stay (7 hold less than the limit), the newest, in order
    assert 8 <= len(kept) < 30 and [m.message_id() for m in kept] == ids[-len(kept):]


def test_bad_retention_is_rejected_and_creates_nothing(client: rt.Client) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    for options in ({"retention_bytes": -1}, {"retention_s": -5}, {"retention_bytes": "10"}):
        with pytest.raises(InvalidArgument):
            client.create_topic(name, **options)
    with pytest.raises(TopicNotFound):
        client.get_topic(name)
