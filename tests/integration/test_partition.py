"""Topics, producers and partition actors on a real engine (local Ray, file:// storage):
read-committed visibility, ordering, idempotent retries, recovery with and without snapshots."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.actors.partition import partition_stream
from raytxn.client.message import MessageId
from raytxn.config import PartitionConfig
from raytxn.errors import (
    ActorUnavailable,
    Fenced,
    InvalidArgument,
    InvalidTopicName,
    MessageTooLarge,
    NotAllowed,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionTimedOut,
)
from raytxn.hashing import partition_for
from raytxn.ids import NAMESPACE, Position, partition_actor_name
from raytxn.ledger import ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import MessageRecord, encode_message
from tests.engine import activate, engine_client, new_topic, partition_ref, restart_actor, visible_values

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, partition=PartitionConfig(snapshot_segment_bytes=160,
                                                                         dangling_check_s=0.5))


def visible(topic: str, p: int = 0) -> list[bytes]:
    """Every readable message value of a partition, in order, through the dispatch read path."""
    return visible_values(topic, [p])

def stats(topic: str, p: int = 0) -> dict:
    return partition_ref(topic, p).call("stats")


def restart_partition(topic: str, p: int = 0) -> dict:
    """Kill the partition actor's process; Ray restarts it and it recovers from storage."""
    return restart_actor(partition_actor_name(topic, p))


# --- topics --------------------------------------------------------------------------------


def test_topic_admin_and_errors(client: rt.Client) -> None:
    topic = new_topic(client, 3)
    assert client.get_topic(topic)["partitions"] == 3
    assert topic in [t["name"] for t in client.list_topics()]
    with pytest.raises(TopicAlreadyExists):
        client.create_topic(topic, 3)
    for bad in ["", "a b", "x/y", "../etc", "-lead", "é"]:
        with pytest.raises(InvalidTopicName):
            client.create_topic(bad)
    with pytest.raises(InvalidArgument):
        client.create_topic(f"ok-{uuid.uuid4().hex[:6]}", 0)
    with pytest.raises(TopicNotFound):
        client.create_producer("no-such-topic")
    with pytest.raises(TopicNotFound):
        client.topic_stats("no-such-topic")
    # the catalog survives a restart of the supervisor
    ray.kill(ray.get_actor("supervisor", namespace=NAMESPACE), no_restart=False)
    assert client.get_topic(topic)["partitions"] == 3
    client.delete_topic(topic)
    with pytest.raises(TopicNotFound):
        client.get_topic(topic)
    with pytest.raises(TopicNotFound):
        client.delete_topic(topic)


# --- producers -----------------------------------------------------------------------------


def test_send_ids_ordering_routing_and_batches(client: rt.Client) -> None:
    topic = new_topic(client, 4)
    producer = client.create_producer(topic, batching_max_delay_ms=20)
    ids = [producer.send(f"k{i}".encode(), key=f"key-{i % 7}") for i in range(28)]
    for i, message_id in enumerate(ids):
        assert message_id.partition == partition_for(f"key-{i % 7}", 4)
        assert MessageId.deserialize(message_id.serialize()) == message_id
        assert hash(message_id) == hash(MessageId.deserialize(message_id.serialize()))
    for p in range(4):
        mine = [m for m in ids if m.partition == p]
        assert mine == sorted(mine)  # ordered within a partition, in send order
    futures = [producer.send_async(f"b{i}".encode(), key="same") for i in range(50)]
    producer.flush()
    batch_ids = [f.result() for f in futures]
    entries = {(m.ledger_id, m.entry_id) for m in batch_ids}
    assert len(entries) < 50  # batched: several messages per entry
    for entry in entries:
        indexes = sorted(m.batch_index for m in batch_ids if (m.ledger_id, m.entry_id) == entry)
        assert indexes == list(range(len(indexes)))
    p = partition_for("same", 4)
    assert visible(topic, p)[-50:] == [f"b{i}".encode() for i in range(50)]


def test_keyless_round_robin_and_oversized(client: rt.Client) -> None:
    topic = new_topic(client, 3)
    # Batches are sealed only when full (or by the flush): with the default 1 ms delay, a sender
    # slowed by a loaded machine let a batch go out part full, and CI once saw a 20-message
    # window span two partitions.
    producer = client.create_producer(topic, batching_max_messages=10, max_in_flight=2,
                                      batching_max_delay_ms=60_000)
    futures = [producer.send_async(f"v{i}".encode()) for i in range(120)]
    producer.flush()
    # sticky: two batches (max_in_flight) of 10 on a partition, then the next one
    assert [futures[i].result().partition for i in range(0, 120, 20)] == [0, 1, 2, 0, 1, 2]
    assert all(len({f.result().partition for f in futures[i:i + 20]}) == 1 for i in range(0, 120, 20))
    before = [stats(topic, p)["applied_entries"] for p in range(3)]
    with pytest.raises(MessageTooLarge):
        producer.send(b"x" * (5 * 1024 * 1024 + 1))
    assert [stats(topic, p)["applied_entries"] for p in range(3)] == before
    with pytest.raises(InvalidArgument):
        producer.send("not bytes")  # type: ignore[arg-type]


# --- transactions: visibility ----------------------------------------------------------------


def test_commit_makes_writes_visible_together_across_topics(client: rt.Client) -> None:
    a, b = new_topic(client, 2), new_topic(client, 1)
    pa, pb = client.create_producer(a), client.create_producer(b)
    txn = client.new_transaction(timeout=30)
    for i in range(6):
        pa.send(f"a{i}".encode(), key=str(i), txn=txn)
    pb.send(b"b0", txn=txn)
    assert visible(a, 0) + visible(a, 1) + visible(b) == []  # open: nothing visible anywhere
    txn.commit()
    assert sorted(visible(a, 0) + visible(a, 1)) == [f"a{i}".encode() for i in range(6)]
    assert visible(b) == [b"b0"]


def test_abort_hides_forever_and_context_manager(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    with pytest.raises(RuntimeError):
        with client.transaction() as txn:
            producer.send(b"doomed", txn=txn)
            raise RuntimeError("boom")
    assert txn.state == "ABORTED"
    with client.transaction() as ok:
        producer.send(b"kept", txn=ok)
    assert ok.state == "COMMITTED"
    producer.send(b"plain")
    assert visible(topic) == [b"kept", b"plain"]
    restart_partition(topic)
    assert visible(topic) == [b"kept", b"plain"]  # still hidden after recovery


def test_open_txn_holds_back_later_plain_messages(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    producer.send(b"before")
    txn = client.new_transaction()
    producer.send(b"in-txn", txn=txn)
    producer.send(b"after")  # appended after the txn's first message: held back
    assert visible(topic) == [b"before"]
    assert stats(topic)["ongoing_txns"] == 1 and stats(topic)["lag_entries"] >= 1
    assert stats(topic)["oldest_ongoing"] == str(txn.id)
    txn.commit()
    assert visible(topic) == [b"before", b"in-txn", b"after"]


def test_stable_position_seed_example(client: rt.Client) -> None:
    """txn1 -> m1, txn2 -> m2, txn1 -> m3: committing txn1 shows only m1 until txn2 ends."""
    topic = new_topic(client)
    producer = client.create_producer(topic)
    txn1, txn2 = client.new_transaction(), client.new_transaction()
    producer.send(b"m1", txn=txn1)
    producer.send(b"m2", txn=txn2)
    producer.send(b"m3", txn=txn1)
    txn1.commit()
    assert visible(topic) == [b"m1"]
    txn2.commit()
    assert visible(topic) == [b"m1", b"m2", b"m3"]


def test_timeout_aborts_and_unblocks(client: rt.Client) -> None:
    topic = new_topic(client)
    activate(topic)  # its start must not eat the txn's 0.8 s
    producer = client.create_producer(topic)
    txn = client.new_transaction(timeout=0.8)
    producer.send(b"never", txn=txn)
    producer.send(b"plain")
    assert visible(topic) == []
    deadline = time.monotonic() + 15
    while visible(topic) != [b"plain"]:
        assert time.monotonic() < deadline, f"still blocked: {stats(topic)}"
        time.sleep(0.1)
    with pytest.raises(TransactionTimedOut):
        txn.commit()


def test_late_append_below_low_watermark_rejected(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    txn = client.new_transaction()
    producer.send(b"x", txn=txn)
    txn.commit()
    for _ in range(3):  # later txns end, carrying a low watermark above txn
        with client.transaction() as later:
            producer.send(b"y", txn=later)
    late = encode_message(MessageRecord(b"late"))
    with pytest.raises(NotAllowed):
        partition_ref(topic).call("append", "late-producer", 0, [late], txn.id)
    assert b"late" not in visible(topic)


# --- idempotence and recovery --------------------------------------------------------------


def test_retried_send_after_partition_crash_is_stored_once(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    producer.send(b"first")
    handle = ray.get_actor(partition_actor_name(topic, 0), namespace=NAMESPACE)
    ray.get(handle.arm_fault.remote("partition.after_append_before_reply", "crash"))
    message_id = producer.send(b"second")  # durable, reply lost in the crash, retried
    assert visible(topic) == [b"first", b"second"]
    assert message_id.entry_id >= 0
    assert stats(topic)["incarnation"] == 2 and stats(topic)["duplicates"] == 1
    # a producer re-created with the same name sends in a new epoch (its ids start again at 0)
    named = client.create_producer(topic, producer_name="fixed-name")
    named.send(b"n1")
    again = client.create_producer(topic, producer_name="fixed-name")
    again.send(b"n2")
    assert visible(topic)[-2:] == [b"n1", b"n2"]


def test_a_new_incarnation_of_a_producer_name_fences_the_older_ones_appends(client: rt.Client) -> None:
    """Producer epochs: the append of an older incarnation still on its way (here sent by hand,
    as a dead client's call would arrive late) is refused once its successor started, also with
    the very sequence ids the successor uses, and the older producer object is fenced too. What
    the successor sends is stored, not taken for a duplicate of the older one's."""
    topic = new_topic(client)
    old = client.create_producer(topic, producer_name="incarnated")
    old.send(b"old-0")
    new = client.create_producer(topic, producer_name="incarnated")
    old_epoch, new_epoch = old._epochs[0], new._epochs[0]
    assert new_epoch > old_epoch
    late = [encode_message(MessageRecord(b"late"))]
    with pytest.raises(Fenced, match=f"epoch {old_epoch} is fenced by its epoch {new_epoch}"):
        partition_ref(topic).call("append", "incarnated", 1, late, None, 0, old_epoch)  # after 0
    with pytest.raises(Fenced):
        partition_ref(topic).call("append", "incarnated", 0, late, None, -1, old_epoch)
    assert new.send(b"new-0").entry_id >= 0  # sequence 0 again, in the new epoch: stored
    with pytest.raises(Fenced):
        old.send(b"old-1")
    assert visible(topic) == [b"old-0", b"new-0"]
    assert stats(topic)["duplicates"] == 0


def test_fenced_ledger_write_restarts_the_partition(client: rt.Client) -> None:
    """An incarnation whose append is fenced stops: the caller gets ActorUnavailable (retriable),
    the process ends, Ray starts an incarnation that recovers and takes the stream back, and the
    retried send lands once."""
    topic = new_topic(client)
    producer = client.create_producer(topic)
    producer.send(b"before")
    storage = Storage.from_url(client.config.storage_url, **client.config.storage_options)
    usurper = asyncio.run(ManagedLedger.open(storage, partition_stream(topic, 0)))  # seals the actor's ledger
    handle = ray.get_actor(partition_actor_name(topic, 0), namespace=NAMESPACE)
    batch = [encode_message(MessageRecord(b"fenced"))]
    with pytest.raises(ActorUnavailable, match="Fenced"):
        ray.get(handle.append.remote("direct", 0, batch))
    deadline = time.monotonic() + 60
    while (info := partition_ref(topic).call("ready"))["incarnation"] <= usurper.incarnation:
        assert time.monotonic() < deadline, "the stopped partition was not restarted"
        time.sleep(0.05)
    assert partition_ref(topic).call("append", "direct", 0, batch).duplicate is False  # the retry
    producer.send(b"after")
    assert visible(topic) == [b"before", b"fenced", b"after"]
    assert info["incarnation"] == usurper.incarnation + 1


def _state(topic: str) -> dict:
    s = stats(topic)
    return {k: s[k] for k in ("max_read_position", "last_position", "ongoing_txns", "aborted_txns", "dedup_producers")}


def test_recovery_with_and_without_snapshot_is_identical(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    for i in range(12):
        txn = client.new_transaction()
        producer.send(f"v{i}".encode(), txn=txn)
        txn.abort() if i % 3 == 0 else txn.commit()
    open_txn = client.new_transaction()
    producer.send(b"pending", txn=open_txn)
    before, seen = _state(topic), visible(topic)
    info = restart_partition(topic)  # full replay (no snapshot yet)
    assert info["recovered_from_snapshot"] is None and info["replayed_entries"] > 0
    assert _state(topic) == before and visible(topic) == seen
    snap = partition_ref(topic).call("snapshot")
    assert snap["aborted"] == 4
    info = restart_partition(topic)  # snapshot + replay of what follows it
    assert info["recovered_from_snapshot"] is not None
    assert _state(topic) == before and visible(topic) == seen
    open_txn.commit()
    assert visible(topic) == [*seen, b"pending"]


def test_incomplete_segmented_snapshot_is_ignored(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    for i in range(20):  # 20 aborted txns: the snapshot (160 B segments) needs several segments
        txn = client.new_transaction()
        producer.send(f"a{i}".encode(), txn=txn)
        txn.abort()
    first = partition_ref(topic).call("snapshot")
    producer.send(b"plain")
    txn = client.new_transaction()
    producer.send(b"z", txn=txn)
    txn.abort()
    second = partition_ref(topic).call("snapshot")
    assert second["id"] != first["id"]
    storage = Storage.from_url(client.config.storage_url)
    prefix = f"topics/{topic}/0/snapshots"
    names = asyncio.run(storage.list(prefix))
    newest = [n for n in names if f"/{second['id']:020d}/" in n]
    assert len(newest) > 1, "expected a segmented snapshot"
    asyncio.run(storage.delete([newest[-1]]))  # as if the writer crashed before its last segment
    before, seen = _state(topic), visible(topic)
    info = restart_partition(topic)
    assert info["recovered_from_snapshot"] != second["id"]
    assert _state(topic) == before and visible(topic) == seen == [b"plain"]


def test_aborted_txns_pruned_when_their_ledger_is_trimmed(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    for _ in range(3):
        txn = client.new_transaction()
        producer.send(b"gone", txn=txn)
        txn.abort()
    assert stats(topic)["aborted_txns"] == 3
    restart_partition(topic)  # the new incarnation writes to a new ledger
    producer.send(b"kept")
    current = max(stats(topic)["ledgers"])
    partition_ref(topic).call("trim", Position(current, 0))
    s = stats(topic)
    assert s["aborted_txns"] == 0 and min(s["ledgers"]) == current
    assert visible(topic) == [b"kept"]
    restart_partition(topic)
    assert stats(topic)["aborted_txns"] == 0 and visible(topic) == [b"kept"]


def test_last_message_id_is_the_last_visible_data_message(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    assert partition_ref(topic).call("last_message_id") is None  # nothing yet
    first = producer.send(b"one")
    txn = client.new_transaction()
    producer.send(b"aborted", txn=txn)
    txn.abort()  # its data and its marker come after `first`, but neither is visible
    assert partition_ref(topic).call("last_message_id") == first.position
    open_txn = client.new_transaction()
    producer.send(b"open", txn=open_txn)
    producer.send(b"held back")  # behind the open txn: not visible yet
    assert partition_ref(topic).call("last_message_id") == first.position
    open_txn.commit()
    assert partition_ref(topic).call("last_message_id") > first.position


def test_txn_over_a_deleted_topic_still_ends_and_frees_the_watermark(client: rt.Client) -> None:
    """Deleting a topic kills its actors and drops its data; a txn that wrote there and acked
    there must still reach its end (nothing is left to mark) rather than retry forever and pin the
    coordinator's low watermark, which every partition's aborted-txn pruning waits on."""
    doomed, kept = new_topic(client), new_topic(client)
    client.create_producer(doomed).send(b"input")
    consumer = client.subscribe(doomed, "s", initial_position="earliest")
    message = consumer.receive(timeout=20)
    txn = client.new_transaction(timeout=60)
    consumer.acknowledge(message, txn=txn)                         # a subscription participant
    client.create_producer(doomed).send(b"to be deleted", txn=txn)  # a partition participant
    client.create_producer(kept).send(b"kept", txn=txn)
    consumer.close()
    client.delete_topic(doomed)
    txn.commit()
    assert visible(kept) == [b"kept"]
    tc = client.coordinator_stats()[txn.id.tc_id]
    assert tc["ends_to_deleted"] == 2
    assert tc["low_watermark"] >= txn.id.sequence  # nothing at or below it is pending any more


# --- the cyclic collector ----------------------------------------------------------------------


def test_actor_and_client_processes_freeze_their_startup_objects(client: rt.Client) -> None:
    """An engine actor's process, after its first start, and a client's process keep their
    startup objects out of the cyclic collector's full walks (``raytxn.gc_freeze``): a Ray
    process tracks about 120k of them, and walking them cost a third of a produce run."""
    topic = new_topic(client)
    info = partition_ref(topic).call("ready")
    assert info["gc_frozen_objects"] > 10_000, info  # Ray's and raytxn's modules at least
    assert gc.get_freeze_count() > 10_000  # this test's process made a Client
    # A restarted incarnation is a new process: it freezes again, after its recovery.
    assert restart_partition(topic)["gc_frozen_objects"] > 10_000
