"""Subscription leases and range reads on a real engine (local Ray, file:// storage): the bulk
path of docs/design.md §6. A lease hands a reader the next committed range of each partition without
payloads; any process reads the range's chunks straight from the ledger objects; the range's end
is acked cumulatively in a txn, so commit moves the cursor and abort, release or expiry hand the
range out again, in order."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.config import SubscriptionConfig
from raytxn.errors import Fenced, InvalidArgument, NotAllowed
from raytxn.ids import subscription_actor_name
from tests.engine import engine_client, new_topic, restart_actor

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    config = SubscriptionConfig(cursor_snapshot_interval_s=0.2, trim_interval_s=0.5)
    yield from engine_client(tmp_path_factory, subscription=config)


def fill_four_partitions(client: rt.Client, topic: str, per_partition: int, entry_messages: int) -> None:
    """``per_partition`` messages ``p{p}-{i}`` on each of the topic's 4 partitions, in entries of
    ``entry_messages`` (one producer batch each)."""
    from raytxn.hashing import partition_for

    producer = client.create_producer(topic, batching_max_messages=entry_messages)
    for p in range(4):
        key = next(k for k in (f"k{i}" for i in range(1000)) if partition_for(k, 4) == p)
        producer.send_batch([f"p{p}-{i}".encode() for i in range(per_partition)],
                            keys=[key] * per_partition).result(timeout=60)


def values(leases: rt.LeaseSet, **chunking: int) -> list[bytes]:
    """Every leased message's value, read chunk by chunk (per partition in append order)."""
    out = []
    for chunk in leases.chunks(**chunking):
        out.extend(chunk.read(columns=["value"]).column("value").to_pylist())
    return out


def produce(client: rt.Client, topic: str, count: int, prefix: str = "m", txn: rt.Transaction | None = None) -> None:
    producer = client.create_producer(topic, batching_max_messages=1)  # an entry per message
    for i in range(count):
        producer.send(f"{prefix}{i}".encode(), txn=txn)
    producer.flush()


def produce_keyed(client: rt.Client, topic: str, count: int, prefix: str) -> None:
    """``count`` messages keyed by their number, over the topic's partitions."""
    producer = client.create_producer(topic)
    for i in range(count):
        producer.send(f"{prefix}{i}".encode(), key=str(i))
    producer.flush()


def test_a_lease_reads_committed_data_and_stops_at_an_open_txn(client: rt.Client) -> None:
    """Markers and aborted data are skipped, committed txn data and plain data are read, and the
    range stops below an open txn (max_read_position)."""
    topic = new_topic(client)
    produce(client, topic, 3, "plain")
    committed = client.new_transaction()
    produce(client, topic, 2, "committed", committed)
    aborted = client.new_transaction()
    produce(client, topic, 2, "aborted", aborted)
    aborted.abort()
    committed.commit()
    produce(client, topic, 1, "after")
    open_txn = client.new_transaction()
    produce(client, topic, 1, "open", open_txn)
    produce(client, topic, 1, "behind-open")  # above max_read until the txn ends
    leases = client.lease_ranges(topic, "bulk", "reader")
    expected = [b"plain0", b"plain1", b"plain2", b"committed0", b"committed1", b"after0"]
    assert values(leases) == expected
    assert values(leases, max_entries=1) == expected  # any cut into chunks reads the same
    txn = client.new_transaction()
    leases.acknowledge(txn)
    txn.commit()
    open_txn.commit()
    rest = client.lease_ranges(topic, "bulk", "reader")
    assert values(rest) == [b"open0", b"behind-open0"]


def test_abort_hands_the_range_out_again_and_commit_moves_past_it(client: rt.Client) -> None:
    topic = new_topic(client, partitions=3)
    produce_keyed(client, topic, 60, "v")
    producer = client.create_producer(topic)
    first = client.lease_ranges(topic, "s", "reader")
    assert len(first.leases) == 3
    read = sorted(values(first, min_chunks=7))
    assert read == sorted(f"v{i}".encode() for i in range(60))
    txn = client.new_transaction()
    first.acknowledge(txn)
    txn.abort()
    again = client.lease_ranges(topic, "s", "reader")
    assert {p: (lease.start, lease.end) for p, lease in again.leases.items()} == {
        p: (lease.start, lease.end) for p, lease in first.leases.items()}
    txn = client.new_transaction()
    again.acknowledge(txn)
    txn.commit()
    assert not client.lease_ranges(topic, "s", "reader")  # nothing past the cursor
    producer.send(b"new", key="0")
    producer.flush()
    assert values(client.lease_ranges(topic, "s", "reader")) == [b"new"]


def test_bounds_cut_the_range_by_entries_messages_or_bytes(client: rt.Client) -> None:
    topic = new_topic(client)
    produce(client, topic, 10)  # ten entries of one 2-byte message each
    for bound, expected in (({"max_entries": 3}, 3), ({"max_messages": 4}, 4), ({"max_bytes": 5 * 12}, None)):
        leases = client.lease_ranges(topic, f"bounded-{next(iter(bound))}", "reader", **bound)
        got = values(leases)
        if expected is not None:
            assert len(got) == expected, bound
        else:
            assert 1 <= len(got) < 10, bound
        assert got == [f"m{i}".encode() for i in range(len(got))]
    for bad in ({"max_entries": 0}, {"max_messages": 0}, {"max_bytes": -1}, {"timeout_s": 0}):
        with pytest.raises(InvalidArgument):
            client.lease_ranges(topic, "bad-bounds", "reader", **bad)


def test_a_bounded_set_fills_with_the_entries_its_even_shares_left_out(client: rt.Client) -> None:
    """``max_messages`` over 4 partitions of 3-message entries: each even share (5) holds one
    entry; the set then grows by the left-out entries that fit (18 of 20, not 12), never past
    the bound, and acking the grown set in a txn moves every cursor past exactly what was read."""
    topic = new_topic(client, partitions=4)
    fill_four_partitions(client, topic, 30, entry_messages=3)
    read: list[bytes] = []
    for batch in range(8):
        leases = client.lease_ranges(topic, "filled", "reader", max_messages=20)
        got = values(leases)
        assert len(got) <= 20, (batch, leases)
        if batch < 4:  # 120 messages, 30 a partition: the first batches are full but for a 3-message entry
            assert len(got) == 18, (batch, leases)
            assert all(lease.counted.messages == len(values_of(leases, p))
                       for p, lease in leases.leases.items())
        txn = client.new_transaction()
        leases.acknowledge(txn)
        txn.commit()
        read.extend(got)
        if not leases:
            break
    assert sorted(read) == sorted(f"p{p}-{i}".encode() for p in range(4) for i in range(30))
    for p in range(4):  # each partition's messages in order, each once
        assert [v for v in read if v.startswith(f"p{p}-".encode())] == [f"p{p}-{i}".encode() for i in range(30)]


def test_a_bounded_set_never_passes_its_bound_when_entries_are_larger_than_a_share(client: rt.Client) -> None:
    """4 partitions of 7-message entries, ``max_messages=10``: each share (3) holds a whole entry
    (7), so the four shares together took 28 before the set gave back what passed its bound. Now
    every set holds at most 10 (one entry), the partitions take turns, and acking each set in a
    txn reads every message once, in order."""
    topic = new_topic(client, partitions=4)
    fill_four_partitions(client, topic, 14, entry_messages=7)
    read: list[bytes] = []
    firsts = set()
    for _ in range(12):
        leases = client.lease_ranges(topic, "trimmed", "reader", max_messages=10)
        if not leases:
            break
        got = values(leases)
        assert len(got) == 7 and len(leases.leases) == 1, leases  # one entry fits the bound, two do not
        firsts.add(next(iter(leases.leases)))
        txn = client.new_transaction()
        leases.acknowledge(txn)
        txn.commit()
        read.extend(got)
    assert firsts == {0, 1, 2, 3}
    for p in range(4):
        assert [v for v in read if v.startswith(f"p{p}-".encode())] == [f"p{p}-{i}".encode() for i in range(14)]
    assert len(read) == 56


def values_of(leases: rt.LeaseSet, partition: int) -> list[bytes]:
    return [v for chunk in leases.chunks() if chunk.partition == partition
            for v in chunk.read(columns=["value"]).column("value").to_pylist()]


def test_one_holder_at_a_time_and_a_newer_epoch_takes_over(client: rt.Client) -> None:
    topic = new_topic(client)
    produce(client, topic, 5)
    held = client.lease_ranges(topic, "s", "pipeline-a", epoch=0)
    assert held.entries == 5
    assert not client.lease_ranges(topic, "s", "pipeline-b")  # a's lease stands
    retry = client.lease_ranges(topic, "s", "pipeline-a", epoch=0)  # the holder's retry: the same lease
    assert retry.leases[0].lease_id == held.leases[0].lease_id
    successor = client.lease_ranges(topic, "s", "pipeline-a", epoch=1)  # restarted: takes over at once
    assert (successor.leases[0].start, successor.leases[0].end) == (held.leases[0].start, held.leases[0].end)
    with pytest.raises(Fenced):
        client.lease_ranges(topic, "s", "pipeline-a", epoch=0)
    zombie_txn = client.new_transaction()
    with pytest.raises(Fenced):
        held.acknowledge(zombie_txn)
    with pytest.raises(Fenced):
        zombie_txn.commit()  # abort-only after the refused ack
    successor.release()
    assert client.lease_ranges(topic, "s", "pipeline-b").entries == 5


def test_an_expired_lease_goes_to_the_next_reader_and_its_holders_commit_fails(client: rt.Client) -> None:
    """The holder stalls past its lease's timeout: the range goes to another reader, and the
    stalled holder's ack (so its commit) fails, so the range is committed once."""
    topic = new_topic(client)
    produce(client, topic, 4)
    stalled = client.lease_ranges(topic, "s", "stalled", timeout_s=0.5)
    time.sleep(2.0)  # past the timeout and a maintenance tick
    taken = client.lease_ranges(topic, "s", "next")
    assert values(taken) == values(stalled)
    late = client.new_transaction()
    with pytest.raises(NotAllowed, match="not held"):
        stalled.acknowledge(late)
    with pytest.raises(NotAllowed):
        late.commit()
    txn = client.new_transaction()
    taken.acknowledge(txn)
    txn.commit()
    assert not client.lease_ranges(topic, "s", "next")


def test_an_ack_sent_without_waiting_commits_with_its_txn_or_makes_it_abort_only(client: rt.Client) -> None:
    """``acknowledge_async``: the acks travel while the txn's other work goes on; commit moves
    the cursors past the ranges. An ack refused (an expired lease) comes through the future, and
    the txn can then only abort, as with ``acknowledge``."""
    topic = new_topic(client, partitions=2)
    produce_keyed(client, topic, 10, "a")
    leases = client.lease_ranges(topic, "s", "async")
    txn = client.new_transaction()
    future = leases.acknowledge_async(txn)
    assert future.result(timeout=30) is None
    txn.commit()
    assert not client.lease_ranges(topic, "s", "async")  # committed: nothing past the cursors

    produce(client, topic, 3, "b")
    stalled = client.lease_ranges(topic, "s", "async", timeout_s=0.5)
    time.sleep(2.0)  # past the timeout and a maintenance tick
    taken = client.lease_ranges(topic, "s", "next")
    late = client.new_transaction()
    refused = stalled.acknowledge_async(late)
    with pytest.raises(NotAllowed, match="not held"):
        refused.result(timeout=30)
    with pytest.raises(rt.errors.InvalidTxnState, match="earlier one failed"):
        late.check_open()
    late.abort()
    assert sorted(values(taken)) == [b"b0", b"b1", b"b2"]
    txn = client.new_transaction()
    taken.acknowledge(txn)
    txn.commit()
    assert not client.lease_ranges(topic, "s", "next")


def test_the_next_range_is_leased_while_the_last_commits_and_its_ack_waits_for_that_end(client: rt.Client) -> None:
    """A pipeline leases and reads batch N+1 while batch N's txn commits: the holder's next range
    chains behind its acked one, and nobody else gets a range meanwhile. The subscription holds
    the chained range's ack until the first txn ended: after its commit the ack goes through;
    after its abort the ack is refused, and both ranges go out again from the aborted one's
    start."""
    topic = new_topic(client, partitions=1)
    produce(client, topic, 4, "a")
    first = client.lease_ranges(topic, "s", "chain")
    t1 = client.new_transaction()
    first.acknowledge(t1)
    produce(client, topic, 3, "b")
    second = client.lease_ranges(topic, "s", "chain")  # while t1 is open: chained past its range
    assert values(second) == [b"b0", b"b1", b"b2"]
    assert not client.lease_ranges(topic, "s", "other")
    t2 = client.new_transaction()
    held = second.acknowledge_async(t2)
    time.sleep(0.5)
    assert not held.done()  # held until t1 ends
    t1.commit()
    assert held.result(timeout=30) is None
    t2.commit()
    assert not client.lease_ranges(topic, "s", "chain")  # both committed: nothing past the cursor

    produce(client, topic, 2, "c")
    third = client.lease_ranges(topic, "s", "chain")
    t3 = client.new_transaction()
    third.acknowledge(t3)
    produce(client, topic, 2, "d")
    fourth = client.lease_ranges(topic, "s", "chain")
    assert values(fourth) == [b"d0", b"d1"]
    t4 = client.new_transaction()
    refused = fourth.acknowledge_async(t4)
    t3.abort()
    with pytest.raises(NotAllowed, match="not held"):
        refused.result(timeout=30)
    t4.abort()
    again = client.lease_ranges(topic, "s", "chain")
    assert values(again) == [b"c0", b"c1", b"d0", b"d1"]


def test_a_renewed_lease_outlives_its_first_timeout(client: rt.Client) -> None:
    topic = new_topic(client)
    produce(client, topic, 2)
    held = client.lease_ranges(topic, "s", "slow", timeout_s=1.0)
    for _ in range(3):
        time.sleep(0.5)
        held.renew(timeout_s=1.0)
    assert not client.lease_ranges(topic, "s", "other")
    txn = client.new_transaction()
    held.acknowledge(txn)
    txn.commit()


def test_a_restarted_subscription_refuses_old_leases_and_keeps_a_pending_ack(client: rt.Client) -> None:
    """Leases are volatile. A lease not yet acked is refused after the restart and its range
    granted again; a range acked in a txn still open is not handed out again while the txn may
    commit, and the txn's commit then moves the cursor past it."""
    topic = new_topic(client)
    produce(client, topic, 3, "a")
    unacked = client.lease_ranges(topic, "s", "reader")
    restart_actor(subscription_actor_name(topic, 0, "s"))
    txn = client.new_transaction()
    with pytest.raises(NotAllowed):
        unacked.acknowledge(txn)
    txn.abort()
    granted = client.lease_ranges(topic, "s", "reader")
    assert values(granted) == [b"a0", b"a1", b"a2"]
    pending = client.new_transaction()
    granted.acknowledge(pending)
    restart_actor(subscription_actor_name(topic, 0, "s"))
    produce(client, topic, 1, "b")
    assert values(client.lease_ranges(topic, "s", "reader")) == [b"b0"]  # not a0..a2 again
    pending.commit()


def test_consumers_and_leases_do_not_mix_on_one_subscription(client: rt.Client) -> None:
    topic = new_topic(client)
    produce(client, topic, 2)
    consumer = client.subscribe(topic, "mixed", initial_position="earliest")
    with pytest.raises(NotAllowed, match="consumers"):
        client.lease_ranges(topic, "mixed", "reader")
    consumer.close()
    held = client.lease_ranges(topic, "mixed", "reader")
    with pytest.raises(NotAllowed, match="lease"):
        client.subscribe(topic, "mixed")
    held.release()


def test_two_readers_on_two_subscriptions_each_get_every_message(client: rt.Client) -> None:
    topic = new_topic(client, partitions=2)
    produce_keyed(client, topic, 20, "x")
    for subscription in ("left", "right"):
        leases = client.lease_ranges(topic, subscription, f"reader-{subscription}")
        assert sorted(values(leases)) == sorted(f"x{i}".encode() for i in range(20))
        txn = client.new_transaction()
        leases.acknowledge(txn)
        txn.commit()


def test_lease_calls_on_unknown_topics_and_leases_are_refused(client: rt.Client) -> None:
    with pytest.raises(rt.errors.TopicNotFound):
        client.lease_ranges("no-such-topic", "s", "reader")
    topic = new_topic(client)
    produce(client, topic, 1)
    held = client.lease_ranges(topic, "s", "reader")
    held.release()
    with pytest.raises(NotAllowed):
        held.release()  # released already
    from raytxn.client.rpc import ActorRef

    subscription = ActorRef(subscription_actor_name(topic, 0, "s"), client.token)
    lease = held.leases[0]
    with pytest.raises(NotAllowed):  # not held any more: it cannot grow either
        client.loop.run(subscription.call_async("grow_lease", lease.lease_id, "reader", 0, 10, 5))
    again = client.lease_ranges(topic, "s", "reader").leases[0]
    for bad, error in (((again.lease_id, "reader", 0, 10, 0), InvalidArgument),
                       ((again.lease_id, "reader", 0, 0, 5), InvalidArgument),
                       ((again.lease_id, "intruder", 0, 10, 5), NotAllowed)):
        with pytest.raises(error):
            client.loop.run(subscription.call_async("grow_lease", *bad))
    assert client.lease_ranges(topic, "s", "reader").leases[0] == again  # unchanged by the refused calls
