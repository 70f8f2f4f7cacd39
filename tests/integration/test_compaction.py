"""Compaction on the real engine (``Client.compact``, ``Client.read_compacted``): each key's latest
committed value below the horizon, aborted and open data never in a compacted ledger, original
offsets, tombstones and their retention, a crash at every step of a compaction, two at once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import raytxn as rt
from raytxn.client.compaction import storage_of
from raytxn.errors import CompactionReset, Fenced
from raytxn.faults import FaultPoints, InjectedFault
from raytxn.ids import Position, partition_stream
from raytxn.ledger.compacted import compacted_prefix, read_published
from raytxn.protocol.retention import DEFAULT_COMPACTION_THRESHOLD_BYTES
from tests.engine import engine_client, new_topic, wait_for

pytestmark = pytest.mark.ray
STEPS = ("compaction.before_data", "compaction.after_data", "compaction.after_publish")


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def send(client: rt.Client, topic: str, pairs: list[tuple[str | None, bytes]],
         txn: rt.Transaction | None = None) -> None:
    producer = client.create_producer(topic, batching_max_messages=1)
    for key, value in pairs:
        producer.send(value, key=key, txn=txn)
    producer.flush()


def state(records: list[dict]) -> dict[str, bytes]:
    """The fold of a compacted read: the latest value per key, tombstones deleting."""
    out: dict[str, bytes] = {}
    for record in records:
        if record["value"] is None:
            out.pop(record["key"], None)
        else:
            out[record["key"]] = record["value"]
    return out


def test_a_compaction_keeps_the_latest_committed_value_per_key_at_its_offset(client: rt.Client) -> None:
    topic = new_topic(client)
    send(client, topic, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), (None, b"keyless")])  # offsets 0..3
    aborted = client.new_transaction()
    send(client, topic, [("a", b"aborted"), ("c", b"aborted")], aborted)              # 4, 5
    aborted.abort()                                                                   # marker 6
    committed = client.new_transaction()
    send(client, topic, [("b", b"b2")], committed)                                    # 7
    committed.commit()                                                                # marker 8
    open_txn = client.new_transaction()
    send(client, topic, [("b", b"open")], open_txn)                                   # 9: open
    send(client, topic, [("d", b"above")])                                            # 10: above it
    [row] = client.compact(topic)
    assert (row["generation"], row["next_offset"], row["records"]) == (1, 9, 2)
    assert (row["skipped_aborted"], row["skipped_keyless"]) == (2, 1)
    read = client.read_compacted(topic)
    assert [(r["offset"], r["key"], r["value"]) for r in read] == [(2, "a", b"a2"), (7, "b", b"b2")]
    open_txn.commit()
    assert state(client.read_compacted(topic)) == {"a": b"a2", "b": b"open", "d": b"above"}
    [second] = client.compact(topic)
    assert second["generation"] == 2 and second["records"] == 3
    assert [(r["offset"], r["key"]) for r in client.read_compacted(topic)] == [(2, "a"), (9, "b"), (10, "d")]
    # a normal subscription still reads the whole log: compaction removes nothing from it
    consumer = client.subscribe(topic, "whole", initial_position="earliest")
    values = [consumer.receive(timeout=10).value() for _ in range(7)]
    assert values == [b"a1", b"b1", b"a2", b"keyless", b"b2", b"open", b"above"]


def test_tombstones_stay_for_their_retention_then_a_resuming_reader_is_reset(client: rt.Client) -> None:
    topic = new_topic(client)
    send(client, topic, [("a", b"1"), ("b", b"1"), ("b", b"")])  # b deleted at offset 2
    [row] = client.compact(topic, delete_retention_ms=3_600_000)
    assert row["tombstones"] == 1
    assert [(r["key"], r["value"]) for r in client.read_compacted(topic)] == [("a", b"1"), ("b", None)]
    assert client.read_compacted(topic, from_offset=2)[0]["key"] == "b"  # a reader behind sees the delete
    [row] = client.compact(topic, delete_retention_ms=0)  # now past it: dropped
    assert (row["tombstones"], row["dropped_tombstones"]) == (0, 1)
    assert state(client.read_compacted(topic)) == {"a": b"1"}
    with pytest.raises(CompactionReset, match="earliest"):
        client.read_compacted(topic, from_offset=1)  # held b=1, would never see its delete
    assert client.read_compacted(topic, from_offset=3) == []


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_of_a_compaction_loses_nothing(client: rt.Client, step: str) -> None:
    """An injected fault at each step stands for a crash there: what readers see is one
    generation or the next, never a mix, and the next compaction cleans up after it."""
    topic = new_topic(client)
    send(client, topic, [("a", b"1"), ("b", b"1")])
    client.compact(topic)
    send(client, topic, [("a", b"2"), ("c", b"1")])
    expected = {"a": b"2", "b": b"1", "c": b"1"}
    faults = FaultPoints()
    faults.arm(step, "raise")
    from raytxn.client.compaction import compact_topic

    with pytest.raises(InjectedFault):
        client.loop.run(compact_topic(client, topic, faults=faults))
    assert state(client.read_compacted(topic)) == expected
    stream = partition_stream(topic, 0)
    published = client.loop.run(read_published(storage_of(client), stream))
    assert published is not None and published.horizon.generation == (2 if step == "compaction.after_publish" else 1)
    [row] = client.compact(topic)
    # Generation 2 either way: published by this compaction, or (a fault after the publish) by the
    # failed one, when this one finds nothing new to fold and publishes nothing.
    assert row["generation"] == 2
    assert state(client.read_compacted(topic)) == expected
    data = client.loop.run(storage_of(client).list(f"{compacted_prefix(stream)}/data"))
    horizons = client.loop.run(storage_of(client).list(f"{compacted_prefix(stream)}/horizons"))
    assert len(data) == 1 and len(horizons) == 1, (data, horizons)  # orphans and superseded ones deleted


def test_two_compactions_at_once_publish_one_generation(client: rt.Client) -> None:
    topic = new_topic(client)
    send(client, topic, [("a", b"1"), ("a", b"2")])
    from raytxn.client.compaction import compact_topic

    async def both() -> list[object]:
        return await asyncio.gather(compact_topic(client, topic), compact_topic(client, topic),
                                    return_exceptions=True)

    outcomes = client.loop.run(both())
    won = [o for o in outcomes if isinstance(o, list)]
    assert len(won) >= 1 and all(isinstance(o, Fenced) for o in outcomes if not isinstance(o, list))
    assert state(client.read_compacted(topic)) == {"a": b"2"}


def test_bad_requests_are_refused(client: rt.Client, tmp_path: Path) -> None:
    topic = new_topic(client)
    with pytest.raises(rt.errors.InvalidArgument, match="partition"):
        client.compact(topic, partition=3)
    with pytest.raises(rt.errors.TopicNotFound):
        client.compact("no-such-topic")
    with pytest.raises(rt.errors.InvalidArgument, match="delete_retention_ms"):
        client.compact(topic, delete_retention_ms=-1)
    with pytest.raises(rt.errors.InvalidArgument, match="offset"):
        client.read_compacted(topic, from_offset=-1)


def test_a_deleted_topics_compacted_ledgers_go_with_it(client: rt.Client) -> None:
    topic = new_topic(client)
    send(client, topic, [("a", b"old")])
    client.compact(topic)
    client.delete_topic(topic)
    client.create_topic(topic)
    send(client, topic, [("b", b"new")])
    assert state(client.read_compacted(topic)) == {"b": b"new"}


# --- table views ------------------------------------------------------------------------------


def test_a_table_view_loads_the_compacted_view_then_tails_committed_data(client: rt.Client) -> None:
    topic = new_topic(client, partitions=2)
    producer = client.create_producer(topic)
    for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("c", b"")]:
        producer.send(value, key=key)
    client.compact(topic)
    producer.send(b"1", key="d")  # after the horizon
    with client.table_view(topic, poll_interval_s=0.05) as view:
        assert view.items() == {"a": b"2", "b": b"1", "d": b"1"} and len(view) == 3 and "c" not in view
        heard: list[tuple[str, bytes | None]] = []
        view.listen(lambda key, value: heard.append((key, value)))
        aborted = client.new_transaction()
        producer.send(b"aborted", key="b", txn=aborted)
        aborted.abort()
        producer.send(b"", key="b")                # b deleted
        producer.send(b"3", key="a")
        txn = client.new_transaction()
        producer.send(b"open", key="a", txn=txn)
        view.refresh()
        assert view.get("a") == b"3" and view.get("b") is None  # the open txn's value not yet
        txn.commit()
        view.refresh()  # everything committed before the call: the txn's value is in
        assert view.get("a") == b"open"
        assert [h for h in heard if h[0] == "a"] == [("a", b"3"), ("a", b"open")]
        assert ("b", None) in heard and ("b", b"aborted") not in heard
        producer.send(b"tail", key="e")
        wait_for(lambda: view.get("e") == b"tail", what="the background tail applies a new message")
        position = view.refresh()  # nothing open: it reflects every offset of every partition
        stats = client.topic_stats(topic)["partition_stats"]
        assert position == view.position == {p: stats[p]["kafka_offsets"]["high_watermark"] for p in range(2)}


def test_a_table_views_listener_hears_the_log_in_order_and_a_raising_one_is_counted(client: rt.Client) -> None:
    topic = new_topic(client)
    producer = client.create_producer(topic)
    with client.table_view(topic, poll_interval_s=0.05) as view:
        heard: list[tuple[str, bytes | None]] = []
        view.listen(lambda key, value: heard.append((key, value)))
        view.listen(lambda key, value: 1 / 0)
        for i in range(20):
            producer.send(str(i).encode(), key=f"k{i % 3}")
        producer.send(b"", key="k0")
        view.refresh()
        assert heard == [(f"k{i % 3}", str(i).encode()) for i in range(20)] + [("k0", None)]
        assert view.listener_errors == 21 and view.items() == {"k1": b"19", "k2": b"17"}
        existing: list[str] = []
        view.listen(lambda key, value: existing.append(key), existing=True)
        assert sorted(existing) == ["k1", "k2"]
    with pytest.raises(rt.errors.InvalidArgument, match="closed"):
        view.refresh()


def test_bad_table_view_requests_are_refused(client: rt.Client) -> None:
    with pytest.raises(rt.errors.TopicNotFound):
        client.table_view("no-such-topic")
    with pytest.raises(rt.errors.InvalidArgument, match="poll_interval_s"):
        client.table_view(new_topic(client), poll_interval_s=0)


# --- compacted topics: the topic property -----------------------------------------------------


def test_a_compacted_topic_refuses_keyless_messages_and_stores_nothing_of_them(client: rt.Client) -> None:
    from raytxn.errors import KeylessMessage
    from tests.engine import partition_ref

    topic = f"c-{uuid.uuid4().hex[:8]}"
    made = client.create_topic(topic, compacted=True)
    assert made["compacted"] and made["compaction_threshold_bytes"] == DEFAULT_COMPACTION_THRESHOLD_BYTES
    assert client.get_topic(topic)["compacted"] is True
    producer = client.create_producer(topic, batching_max_messages=1)
    with pytest.raises(KeylessMessage, match="no key"):
        producer.send(b"keyless")
    producer.close()
    send(client, topic, [("k", b"v")])
    assert partition_ref(topic).call("stats")["compaction"]["compacted"] is True
    assert [(r["offset"], r["key"], r["value"]) for r in client.read_compacted(topic)] == [(0, "k", b"v")]
    plain = new_topic(client)
    send(client, plain, [(None, b"keyless is fine here")])
    assert client.get_topic(plain)["compacted"] is False


def test_a_compacted_partition_compacts_itself_and_trims_only_below_its_horizon(client: rt.Client) -> None:
    from tests.engine import partition_ref

    topic = f"c-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, compacted=True, compaction_threshold_bytes=1)
    ref = partition_ref(topic)
    send(client, topic, [(f"k{i % 3}", f"v{i}".encode()) for i in range(9)])      # offsets 0..8
    open_txn = client.new_transaction()
    send(client, topic, [("k0", b"open")], open_txn)                              # 9: open
    send(client, topic, [("k9", b"after the open txn")])                          # 10
    decided = ref.call("apply_retention")
    compaction = ref.call("stats")["compaction"]
    assert compaction["compactions"] == 1 and compaction["last_compaction"]["records"] == 3
    published = asyncio.run(read_published(storage_of(client), partition_stream(topic, 0)))
    assert published is not None and published.horizon.next_offset == 9          # stops before the open txn
    # No subscription and no limits: everything the horizon covers goes from the live ledger, not one entry more.
    horizon = published.horizon.horizon
    assert decided["trimmed_below"] == str(Position(horizon.ledger_id, horizon.entry_id + 1))
    assert state(client.read_compacted(topic)) == {"k0": b"v6", "k1": b"v7", "k2": b"v8"}  # 10 waits for 9
    open_txn.commit()
    # Asked to trim past everything, the partition stops at the horizon: above it the live ledger is the only copy.
    assert ref.call("trim", Position(1 << 30, 0)) == decided["trimmed_below"]
    with client.table_view(topic) as view:
        assert view.items() == {"k0": b"open", "k1": b"v7", "k2": b"v8", "k9": b"after the open txn"}
    ref.call("apply_retention")                                                    # past the threshold again
    assert ref.call("stats")["compaction"]["compactions"] == 2
    assert [r["offset"] for r in client.read_compacted(topic)] == [7, 8, 9, 10]


def test_a_compacted_topics_subscription_keeps_its_backlog_and_a_lower_threshold_waits(client: rt.Client) -> None:
    from tests.engine import partition_ref

    topic = f"c-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, compacted=True, compaction_threshold_bytes=1 << 30)
    ref = partition_ref(topic)
    consumer = client.subscribe(topic, "slow", initial_position="earliest")
    send(client, topic, [("a", b"1"), ("a", b"2"), ("b", b"3")])
    before = ref.call("stats")["trimmed_below"]
    assert ref.call("apply_retention")["trimmed_below"] == before                  # under the threshold: no compaction
    assert ref.call("stats")["compaction"]["compactions"] == 0
    [row] = client.compact(topic)                                                   # on request
    assert row["records"] == 2
    assert ref.call("apply_retention")["trimmed_below"] == before                  # the subscription acked nothing
    assert [consumer.receive(timeout=10).value() for _ in range(3)] == [b"1", b"2", b"3"]
    consumer.close()


def test_bad_compaction_settings_are_refused_and_create_nothing(client: rt.Client) -> None:
    from raytxn.errors import InvalidArgument

    topic = f"c-{uuid.uuid4().hex[:8]}"
    for kwargs in ({"compaction_threshold_bytes": 10}, {"compacted": True, "compaction_threshold_bytes": 0},
                   {"compacted": True, "compaction_threshold_bytes": "big"}, {"compacted": "yes"}):
        with pytest.raises(InvalidArgument):
            client.create_topic(topic, **kwargs)
        with pytest.raises(InvalidArgument):
            client.create_topics([topic], **kwargs)
    assert topic not in {t["name"] for t in client.list_topics()}


# --- compacted readers (Client.compacted_reader) ------------------------------------------------

def view(records: list[dict]) -> list[tuple[int, str, bytes | None]]:
    return [(r["offset"], r["key"], r["value"]) for r in records]


def test_a_compacted_reader_reads_the_view_then_what_commits_later(client: rt.Client,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from raytxn.client import reader as reader_module
    from raytxn.errors import Timeout

    topic = new_topic(client)
    send(client, topic, [("a", b"a1"), ("b", b"b1"), ("a", b"a2")])               # offsets 0..2
    client.compact(topic)
    reader = client.compacted_reader(topic)
    assert view(reader.read_available()) == [(1, "b", b"b1"), (2, "a", b"a2")]    # a1 compacted away
    assert reader.position == 3 and not reader.has_message_available()
    with pytest.raises(Timeout):
        reader.read_next(timeout=0.3)
    open_txn, aborted = client.new_transaction(), client.new_transaction()
    send(client, topic, [("c", b"c1")], open_txn)                                 # 3, open
    send(client, topic, [("a", b"never")], aborted)                               # 4, aborted
    aborted.abort()                                                               # marker 5
    assert not reader.has_message_available()                                     # open data waits
    open_txn.commit()                                                             # marker 6
    send(client, topic, [("b", b"")])                                             # 7: b's tombstone
    assert view([reader.read_next(timeout=10), reader.read_next(timeout=10)]) == [(3, "c", b"c1"), (7, "b", None)]
    # A new reader from a position goes on there; seek goes back into the compacted view.
    later = client.compacted_reader(topic, from_offset=reader.position)
    send(client, topic, [("d", b"d1")])                                           # 8
    assert view(later.read_available()) == view(reader.read_available()) == [(8, "d", b"d1")]
    reader.seek(0)
    monkeypatch.setattr(reader_module, "MAX_RECORDS_PER_POLL", 1)                 # many bounded polls: same records
    assert [r["offset"] for r in reader] == [1, 2, 3, 7, 8]
    assert state(client.read_compacted(topic)) == {"a": b"a2", "c": b"c1", "d": b"d1"}
    later.close()
    reader.close()


def test_a_compacted_reader_behind_retention_goes_on_from_the_compacted_view(client: rt.Client) -> None:
    """Its next entry trimmed under it (retention follows the horizon, and it holds no
    subscription): it gets the latest value of each key written at or after its position, what a
    Kafka consumer behind the log cleaner gets, and never an older one."""
    from tests.engine import partition_ref

    topic = f"c-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, compacted=True, compaction_threshold_bytes=1)
    send(client, topic, [("k0", b"v0"), ("k1", b"v1")])                           # offsets 0, 1
    with client.compacted_reader(topic) as reader:
        assert [r["offset"] for r in reader.read_available()] == [0, 1]
        send(client, topic, [(f"k{i % 2}", f"v{i}".encode()) for i in range(2, 8)])  # 2..7
        decided = partition_ref(topic).call("apply_retention")                    # compacts, trims below 8
        assert decided["trimmed_below"] is not None
        assert view(reader.read_available()) == [(6, "k0", b"v6"), (7, "k1", b"v7")]
        send(client, topic, [("k0", b"v8")])
        assert view([reader.read_next(timeout=10)]) == [(8, "k0", b"v8")]


def test_bad_compacted_reader_requests_are_refused(client: rt.Client) -> None:
    from raytxn.errors import InvalidArgument, TopicNotFound

    topic = new_topic(client)
    with pytest.raises(TopicNotFound):
        client.compacted_reader(f"absent-{uuid.uuid4().hex[:8]}")
    for kwargs in ({"partition": 1}, {"partition": "0"}, {"from_offset": -1}, {"from_offset": 1.5},
                   {"poll_interval_s": 0}):
        with pytest.raises(InvalidArgument):
            client.compacted_reader(topic, **kwargs)
    reader = client.compacted_reader(topic)
    for call in (lambda: reader.read_available(0), lambda: reader.seek(-2)):
        with pytest.raises(InvalidArgument):
            call()
    reader.close()
    with pytest.raises(InvalidArgument, match="closed"):
        reader.read_next(timeout=1)


# --- read_compacted subscriptions (Pulsar's readCompacted consumers) ------------------------------

def test_a_read_compacted_subscription_gets_each_keys_latest_value_then_the_live_tail(client: rt.Client) -> None:
    """Below the horizon the consumer gets the compacted view at the original message ids (a
    batch's folded messages count as consumed), above it every message; unacked ones come
    back to the next consumer, acked ones (and what compaction folded) never do."""
    from raytxn.client.rpc import ActorRef
    from raytxn.errors import Timeout
    from raytxn.ids import subscription_actor_name
    from tests.engine import nothing_more, receive_all

    topic = f"c-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, compacted=True)
    batched = client.create_producer(topic, batching_max_messages=3, batching_max_delay_ms=1000)
    for key, value in [("a", b"a1"), ("b", b"b1"), ("a", b"a2")]:                 # one entry of 3
        batched.send_async(value, key=key)
    batched.flush()
    aborted = client.new_transaction()
    send(client, topic, [("c", b"aborted")], aborted)
    aborted.abort()
    send(client, topic, [("b", b"")])                                             # b's tombstone
    client.compact(topic)
    send(client, topic, [("a", b"a3")])                                           # above the horizon
    whole = client.subscribe(topic, "whole", initial_position="earliest")
    ids = {m.value(): m.message_id() for m in receive_all(whole, 5)}
    assert set(ids) == {b"a1", b"b1", b"a2", b"", b"a3"}
    assert [ids[v].position for v in (b"a1", b"b1")] == [ids[b"a2"].position] * 2 and ids[b"a2"].batch_index == 2

    consumer = client.subscribe(topic, "rc", initial_position="earliest", read_compacted=True)
    got = receive_all(consumer, 3)
    assert [(m.key(), m.value()) for m in got] == [("a", b"a2"), ("b", b""), ("a", b"a3")]
    assert [m.message_id() for m in got] == [ids[b"a2"], ids[b""], ids[b"a3"]]
    assert nothing_more(consumer)
    consumer.acknowledge(got[0])
    consumer.close()
    again = client.subscribe(topic, "rc", read_compacted=True)
    assert [m.value() for m in receive_all(again, 2)] == [b"", b"a3"]             # a2 acked, a1 and b1 folded
    for message in (got[1], got[2]):
        again.acknowledge(message)
    send(client, topic, [("d", b"d1")])
    last = again.receive(timeout=10)
    assert last.value() == b"d1"
    again.acknowledge_async(last).result(timeout=10)
    stats = ActorRef(subscription_actor_name(topic, 0, "rc")).call("stats")
    assert (stats["backlog_entries"], stats["partially_acked_batches"]) == (0, 0)  # the batch's folded a1, b1 too
    again.close()
    final = client.subscribe(topic, "rc", read_compacted=True)
    with pytest.raises(Timeout):
        final.receive(timeout=0.5)
    final.close()
    whole.close()


def test_a_read_compacted_subscription_created_after_retention_sees_every_key(client: rt.Client) -> None:
    """Retention trimmed the live ledger below the horizon: a plain subscription created now at
    earliest sees what is left, a read_compacted one the latest value of every key."""
    from raytxn.client.rpc import ActorRef
    from raytxn.ids import subscription_actor_name
    from tests.engine import nothing_more, partition_ref, receive_all, restart_actor

    topic = f"c-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, compacted=True, compaction_threshold_bytes=1)
    send(client, topic, [(f"k{i % 4}", f"v{i}".encode()) for i in range(12)])    # offsets 0..11
    decided = partition_ref(topic).call("apply_retention")                        # compacts, trims all below 12
    assert decided["trimmed_below"] != "0:0"
    send(client, topic, [("k0", b"live")])
    plain = client.subscribe(topic, "plain", initial_position="earliest")
    assert [m.value() for m in receive_all(plain, 1)] == [b"live"] and nothing_more(plain)
    plain.close()
    consumer = client.subscribe(topic, "view", initial_position="earliest", read_compacted=True,
                                consumer_type="Failover")
    first = receive_all(consumer, 2)
    assert [(m.key(), m.value()) for m in first] == [("k0", b"v8"), ("k1", b"v9")]
    for message in first:
        consumer.acknowledge_async(message).result(timeout=10)  # at the subscription
    name = subscription_actor_name(topic, 0, "view")
    ActorRef(name).call("persist_cursor")  # plain acks reach storage with the cursor (else redelivered)
    restart_actor(name)  # it recovers, and the consumer subscribes again
    rest = receive_all(consumer, 3, timeout=30)
    assert [(m.key(), m.value()) for m in rest] == [("k2", b"v10"), ("k3", b"v11"), ("k0", b"live")]
    consumer.close()


def test_bad_read_compacted_requests_are_refused(client: rt.Client) -> None:
    from raytxn.errors import InvalidArgument, NotAllowed

    plain = new_topic(client)
    with pytest.raises(InvalidArgument, match="not compacted"):
        client.subscribe(plain, "s", read_compacted=True)
    topic = f"c-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, compacted=True)
    for kwargs in ({"consumer_type": "Shared"}, {"consumer_type": "Key_Shared"}):
        with pytest.raises(InvalidArgument, match="Exclusive or Failover"):
            client.subscribe(topic, "s", read_compacted=True, **kwargs)
    with pytest.raises(InvalidArgument):
        client.subscribe(topic, "s", read_compacted=1)  # type: ignore[arg-type]
    first = client.subscribe(topic, "f", consumer_type="Failover", read_compacted=True)
    with pytest.raises(NotAllowed, match="read_compacted=False"):
        client.subscribe(topic, "f", consumer_type="Failover")
    first.close()
    client.subscribe(topic, "f", consumer_type="Failover").close()  # alone, it may read either way
