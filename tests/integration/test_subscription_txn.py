"""Transactional acks on a real engine (coordinators, partition and subscription actors, file://
storage): the pending-ack rules end to end, commit and abort, coordinator timeouts, the low
watermark, recovery by log replay after a crash at every step of ack and commit, log trimming,
and an exactly-once move from one topic to another. One engine for the module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import ray

import raytxn as rt
from raytxn.actors.subscription import FAULT_POINTS
from raytxn.client import consumer as consumer_module
from raytxn.client.consumer import Consumer
from raytxn.client.message import Message
from raytxn.client.rpc import ActorRef
from raytxn.client.transaction import TxnClientState
from raytxn.config import SubscriptionConfig
from raytxn.errors import (
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    TransactionAlreadyAborted,
    TransactionConflict,
    TransactionTimedOut,
)
from raytxn.ids import NAMESPACE, TxnID, subscription_actor_name
from tests.engine import engine_client, new_topic, nothing_more, receive_all

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("drop_new_topics")]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    config = SubscriptionConfig(max_index_lag=2, cursor_snapshot_interval_s=0.2, trim_interval_s=0.5,
                                read_wait_s=0.2, stale_txn_check_s=1.0)
    yield from engine_client(tmp_path_factory, subscription=config)


def send(client: rt.Client, topic: str, count: int, batch: bool = False, prefix: str = "m") -> list[rt.MessageId]:
    # The delay is long so that a batch is sealed by its count or the flush, never by a slow loop:
    # at the default 1 ms a busy CI split a batch of four into two entries.
    producer = client.create_producer(topic, batching_max_messages=count if batch else 1,
                                      batching_max_delay_ms=60_000)
    futures = [producer.send_async(f"{prefix}{i}".encode()) for i in range(count)]
    producer.flush()
    return [future.result() for future in futures]


def received(client: rt.Client, count: int) -> tuple[str, Consumer, list[rt.MessageId], list[Message]]:
    """A new topic with ``count`` messages, one entry each, all received by an exclusive consumer
    of subscription "sub"."""
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    ids = send(client, topic, count)
    return topic, consumer, ids, receive_all(consumer, count)


def actor(topic: str, sub: str = "sub") -> ActorRef:
    return ActorRef(subscription_actor_name(topic, 0, sub))


def stats(topic: str, sub: str = "sub") -> dict:
    return actor(topic, sub).call("stats")


def restart(topic: str, sub: str = "sub") -> dict:
    """Kill the subscription actor's process; Ray restarts it and it recovers from its log.
    Returns the new incarnation's ``ready`` facts."""
    before = actor(topic, sub).call("ready")["incarnation"]
    ray.kill(ray.get_actor(subscription_actor_name(topic, 0, sub), namespace=NAMESPACE), no_restart=False)
    deadline = time.monotonic() + 30
    while True:  # the old process may still answer for a moment
        info = actor(topic, sub).call("ready")
        if info["incarnation"] > before or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def fresh_consumer(client: rt.Client, old: Consumer, topic: str) -> Consumer:
    """Replace an exclusive consumer by a new one (with an empty receiver queue)."""
    old.close()
    return client.subscribe(topic, "sub")


def test_commit_makes_acks_permanent_across_a_restart(client: rt.Client) -> None:
    topic, consumer, ids, got = received(client, 5)
    with client.transaction() as txn:
        consumer.acknowledge(got[0], txn)
        consumer.acknowledge(got[1], txn)
        pending = stats(topic)["pending_ack"]
        assert pending["txns"] == [str(txn.id)] and pending["positions"] == 2  # kept apart until commit
    after = stats(topic)
    assert after["pending_ack"]["txns"] == [] and after["mark_delete_position"] == str(ids[1].position)
    incarnation = after["incarnation"]
    assert restart(topic)["incarnation"] == incarnation + 1
    consumer = fresh_consumer(client, consumer, topic)
    assert [m.message_id() for m in receive_all(consumer, 3)] == ids[2:]
    assert nothing_more(consumer)
    consumer.close()


def test_abort_redelivers_without_being_asked(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    send(client, topic, 2)
    first, _unacked = receive_all(consumer, 2)
    txn = client.new_transaction()
    consumer.acknowledge(first, txn)
    assert nothing_more(consumer, 0.3)
    txn.abort()
    again = consumer.receive(timeout=15)
    assert again.message_id() == first.message_id() and again.redelivery_count() == 1
    assert nothing_more(consumer, 0.3)  # the second is still with the consumer, unacked: not resent
    assert stats(topic)["pending_ack"]["txns"] == []
    consumer.close()


def test_two_txns_acking_one_message_conflict(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    send(client, topic, 2)
    first, second = receive_all(consumer, 2)
    txn1, txn2 = client.new_transaction(), client.new_transaction()
    consumer.acknowledge(first, txn1)
    consumer.acknowledge(first, txn1)  # again in the same txn: a no-op
    with pytest.raises(TransactionConflict, match="pending in"):
        consumer.acknowledge(first, txn2)
    with pytest.raises(TransactionConflict):  # the failed ack dooms txn2: commit aborts it
        txn2.commit()
    assert txn2.state is TxnClientState.ABORTED
    txn1.commit()
    consumer.acknowledge_async(second).result()  # plain
    for message in (first, second):  # acked already (in a txn, then plainly)
        txn3 = client.new_transaction()
        with pytest.raises(TransactionConflict, match="already acked"):
            consumer.acknowledge(message, txn3)
        txn3.abort()
    assert stats(topic)["pending_ack"]["txns"] == []
    consumer.close()


def test_batch_index_conflicts_and_abort_restores_the_ack_set(client: rt.Client) -> None:
    """The seed's worked example: txn1 acks TTTF and TTFT (indexes 3 and 2), txn2 acks TFTT
    (index 1); aborting txn2 restores TTFF and redelivers index 1."""
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    ids = send(client, topic, 4, batch=True)
    got = receive_all(consumer, 4)
    assert [m.message_id().batch_index for m in got] == [0, 1, 2, 3]
    txn1, txn2, txn3 = (client.new_transaction() for _ in range(3))
    consumer.acknowledge(got[3], txn1)
    consumer.acknowledge(got[2], txn1)
    consumer.acknowledge(got[1], txn2)
    with pytest.raises(TransactionConflict, match="batch index 2"):
        consumer.acknowledge(got[2], txn3)
    pending = stats(topic)["pending_ack"]
    assert pending["batch_indexes"] == 3 and len(pending["txns"]) == 2
    txn2.abort()
    again = consumer.receive(timeout=15)
    assert again.message_id() == ids[1] and again.redelivery_count() == 1
    assert stats(topic)["pending_ack"]["batch_indexes"] == 2  # TTFF: txn1's indexes only
    with pytest.raises(TransactionConflict):
        txn3.commit()
    txn1.commit()
    after = stats(topic)
    assert after["partially_acked_batches"] == 1 and after["pending_ack"]["txns"] == []
    consumer.acknowledge(got[0])
    consumer.acknowledge_async(again).result()
    after = stats(topic)
    assert after["partially_acked_batches"] == 0 and after["mark_delete_position"] == str(ids[0].position)
    consumer.close()


def test_async_txn_acks_of_a_whole_batch_go_as_one_entry_ack(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    first = send(client, topic, 4, batch=True)
    second = send(client, topic, 4, batch=True)
    got = receive_all(consumer, 8)
    txn = client.new_transaction()
    whole = [consumer.acknowledge_async(m, txn) for m in got[:4]]
    half = [consumer.acknowledge_async(m, txn) for m in got[4:6]]
    for future in whole:
        future.result(timeout=10)  # sent as one whole-entry ack once the txn acked all four
    assert not any(future.done() for future in half)  # held until the entry is complete or commit
    [pending] = stats(topic)["pending_ack"]["per_txn"]
    assert (pending["entries"], pending["batch_indexes"]) == (1, 0)
    txn.commit()
    assert all(future.done() and future.exception() is None for future in half)
    after = stats(topic)
    assert after["mark_delete_position"] == str(first[0].position) and after["partially_acked_batches"] == 1
    assert second[0].position != first[0].position
    consumer.acknowledge_async(got[6]).result()
    txn2 = client.new_transaction()
    acks = [consumer.acknowledge_async(m, txn2) for m in got[4:]]  # all four: two of them acked already
    with pytest.raises(TransactionConflict, match="already acked"):
        acks[-1].result(timeout=10)
    with pytest.raises(TransactionConflict):
        txn2.commit()
    consumer.close()


def test_held_txn_acks_interleaved_over_entries_and_txns_out_of_order_and_repeated_ack_each_message_once(
        client: rt.Client) -> None:
    """The consumer holds a txn's async acks of a batch entry as a run while they come in order
    (acked on a fast path) and as a set after: interleaving two entries and two txns, repeating
    acks and going out of order leaves each txn exactly the indexes it acked."""
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    first = send(client, topic, 6, batch=True, prefix="a")
    second = send(client, topic, 6, batch=True, prefix="b")
    got = receive_all(consumer, 12)
    a, b = got[:6], got[6:]
    txn1, txn2 = client.new_transaction(), client.new_transaction()
    for message, txn in [(a[0], txn1), (a[1], txn1), (b[0], txn1), (a[2], txn1), (a[2], txn1),  # a repeat
                         (a[3], txn2), (a[4], txn2),  # txn2 in the entry txn1 holds a run of
                         (b[2], txn1), (b[1], txn1),  # out of order
                         (a[5], txn1), (b[3], txn1)]:
        consumer.acknowledge_async(message, txn)
    txn2.commit()
    assert stats(topic)["partially_acked_batches"] == 1  # a's 3 and 4
    other = client.new_transaction()
    with pytest.raises(TransactionConflict, match="already acked"):
        consumer.acknowledge(a[4], other)
    other.abort()
    txn1.commit()
    after = stats(topic)
    assert after["mark_delete_position"] == str(first[0].position)  # all of a: txn1's 0-2 and 5, txn2's 3-4
    assert after["partially_acked_batches"] == 1 and second[0].position != first[0].position
    consumer.close()
    consumer = client.subscribe(topic, "sub")
    assert [m.value() for m in receive_all(consumer, 2)] == [b"b4", b"b5"]  # b's 0-3 were acked once
    assert nothing_more(consumer)
    consumer.close()


def test_acking_a_message_never_delivered_is_refused(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub", receiver_queue_size=1)
    ids = send(client, topic, 5)
    first = consumer.receive(timeout=15)
    assert first.message_id() == ids[0]
    for never_delivered in (ids[4],  # the receiver queue holds one: not dispatched yet
                            rt.MessageId(topic, 0, ids[0].ledger_id + 5, 0)):
        txn = client.new_transaction()
        with pytest.raises(NotAllowed, match="never delivered"):
            consumer.acknowledge(never_delivered, txn)
        txn.abort()
    consumer.close()


def test_cumulative_acks_in_txns(client: rt.Client) -> None:
    topic, consumer, ids, got = received(client, 8)
    txn1, txn2 = client.new_transaction(), client.new_transaction()
    consumer.acknowledge_cumulative(got[2], txn1)
    assert stats(topic)["pending_ack"]["cumulative"] == [str(txn1.id), str(ids[2].position)]
    with pytest.raises(TransactionConflict):  # under txn1's cumulative ack
        consumer.acknowledge(got[1], txn2)
    txn2.abort()
    txn3 = client.new_transaction()
    with pytest.raises(TransactionConflict):  # one pending cumulative ack per subscription
        consumer.acknowledge_cumulative(got[4], txn3)
    txn3.abort()
    consumer.acknowledge_cumulative(got[4], txn1)  # moving its own cumulative ack up is fine
    with pytest.raises(TransactionConflict):  # a plain cumulative ack over pending txn acks
        consumer.acknowledge_cumulative_async(got[5]).result()
    txn1.commit()
    assert stats(topic)["mark_delete_position"] == str(ids[4].position)
    txn4 = client.new_transaction()
    consumer.acknowledge_cumulative(got[6], txn4)
    with pytest.raises(TransactionConflict, match="below its own"):
        consumer.acknowledge_cumulative(got[5], txn4)
    txn5 = client.new_transaction()
    with pytest.raises(TransactionConflict, match="mark-delete"):
        consumer.acknowledge_cumulative(got[4], txn5)
    txn5.abort()
    txn4.abort()  # the failed ack doomed it anyway
    redelivered = receive_all(consumer, 2)  # what its cumulative ack covered, not got[7] (still out)
    assert [m.message_id() for m in redelivered] == ids[5:7] and nothing_more(consumer, 0.3)
    restart(topic)
    consumer = fresh_consumer(client, consumer, topic)
    assert [m.message_id() for m in receive_all(consumer, 3)] == ids[5:]
    assert nothing_more(consumer)
    consumer.close()


def test_a_retried_cumulative_ack_call_succeeds_and_a_new_call_repeating_it_conflicts_across_restarts(
        client: rt.Client) -> None:
    """Pulsar refuses a txn's cumulative ack at or below its own pending one. The consumer's retry
    of a call whose reply was lost (here: the actor crashed right after logging it) must still
    succeed: each call carries a request id, logged with its record and rebuilt by replay."""
    topic, consumer, ids, got = received(client, 4)
    txn = client.new_transaction()
    consumer.acknowledge(got[0], txn)  # registers the subscription with the txn
    incarnation = stats(topic)["incarnation"]
    actor(topic).call("arm_fault", "subscription.after_pending_ack_log", "crash")
    consumer.acknowledge_cumulative(got[1], txn)  # logged, crash, the client retries: done
    after = stats(topic)
    assert after["incarnation"] == incarnation + 1
    assert after["pending_ack"]["cumulative"] == [str(txn.id), str(ids[1].position)]

    def ack_cumulative(position: rt.MessageId, request_id: str, in_txn: rt.Transaction = txn) -> None:
        actor(topic).call("ack", consumer.consumer_id, [(position.position, 0, 1)], True, in_txn.id,
                          request_id=request_id)

    ack_cumulative(ids[2], "call-1")
    entries = stats(topic)["log"]["entries"]
    for _ in range(2):  # live, then after a restart rebuilt it from the log
        ack_cumulative(ids[2], "call-1")  # a retry of that call: done, nothing logged
        assert stats(topic)["log"]["entries"] == entries
        with pytest.raises(TransactionConflict, match="at or below its own"):  # a new call, the same ack
            ack_cumulative(ids[2], "call-2")
        with pytest.raises(TransactionConflict, match="at or below its own"):
            ack_cumulative(ids[1], "call-3")
        restart(topic)
    other = client.new_transaction()
    with pytest.raises(TransactionConflict, match="holds a pending cumulative ack"):
        ack_cumulative(ids[3], "call-4", other)
    other.abort()
    txn.commit()
    assert stats(topic)["mark_delete_position"] == str(ids[2].position)
    consumer = fresh_consumer(client, consumer, topic)
    assert [m.message_id() for m in receive_all(consumer, 1)] == ids[3:] and nothing_more(consumer, 0.3)
    consumer.close()


def test_txn_acks_of_what_a_committed_txn_acked_conflict_across_a_restart(client: rt.Client) -> None:
    """Individual or cumulative, a txn ack naming a message a committed txn acked is a conflict
    (Pulsar: "already acked before"), also above a gap the mark-delete position has not passed;
    plain acks of messages pending in a txn stay allowed (ignored), as in Pulsar."""
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    ids = send(client, topic, 4) + send(client, topic, 3, batch=True)
    got = receive_all(consumer, 7)
    mark_delete = stats(topic)["mark_delete_position"]
    with client.transaction() as txn:
        consumer.acknowledge(got[2], txn)
        consumer.acknowledge(got[4], txn)  # batch index 0 of the last entry
    assert stats(topic)["mark_delete_position"] == mark_delete  # got[0] and got[1] are not acked
    for restarted in (False, True):
        for message in (got[2], got[4]):
            for ack in (consumer.acknowledge, consumer.acknowledge_cumulative):
                later = client.new_transaction()
                with pytest.raises(TransactionConflict, match="already acked"):
                    ack(message, later)
                later.abort()
        if not restarted:
            restart(topic)
            consumer = fresh_consumer(client, consumer, topic)
            unacked = receive_all(consumer, 5)  # everything but the two acked, again
            assert [m.message_id() for m in unacked] == [ids[0], ids[1], ids[3], ids[5], ids[6]]
            got = [*unacked[:2], ids[2], unacked[2], ids[4], *unacked[3:]]  # numbered as before
    txn = client.new_transaction()
    consumer.acknowledge_cumulative(got[5], txn)  # past them is fine: index 1 of the batch
    consumer.acknowledge_async(got[3]).result()  # plain, of a message pending in txn: ignored, no error
    txn.commit()
    after = stats(topic)
    assert after["mark_delete_position"] == str(ids[3].position) and after["partially_acked_batches"] == 1
    consumer.close()


def test_a_txns_async_acks_go_at_commit_or_once_their_group_is_old(client: rt.Client,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Held until the commit, as Kafka sends a txn's offsets once: none reaches the subscription
    before it while their group is younger than TXN_ACK_GROUP_DELAY_S. A caller who waits on an
    ack's future without committing is answered once the group is that old."""
    topic, consumer, ids, got = received(client, 6)
    monkeypatch.setattr(consumer_module, "TXN_ACK_GROUP_DELAY_S", 60.0)
    txn = client.new_transaction()
    acks = [consumer.acknowledge_async(message, txn) for message in got[:4]]
    time.sleep(0.5)
    assert stats(topic)["pending_ack"]["txns"] == [] and not any(ack.done() for ack in acks)
    txn.commit()
    assert all(ack.done() and ack.exception() is None for ack in acks)
    assert stats(topic)["mark_delete_position"] == str(ids[3].position)
    monkeypatch.setattr(consumer_module, "TXN_ACK_GROUP_DELAY_S", 0.05)
    txn2 = client.new_transaction()
    consumer.acknowledge_async(got[4], txn2).result(timeout=10)  # no commit: the group got old
    assert stats(topic)["pending_ack"]["txns"] == [str(txn2.id)]
    other = client.new_transaction()
    with pytest.raises(TransactionConflict):  # what the txn acked is not the others' to ack
        consumer.acknowledge(got[4], other)
    other.abort()
    txn2.abort()
    assert [m.message_id() for m in receive_all(consumer, 1)] == [ids[4]]
    consumer.close()


def test_async_cumulative_acks_in_a_txn_go_as_one_call_for_the_highest(client: rt.Client) -> None:
    """Grouped together they were one call naming several messages, which a cumulative ack may not."""
    topic, consumer, ids, got = received(client, 3)
    txn = client.new_transaction()
    acks = [consumer.acknowledge_cumulative_async(message, txn) for message in got[:2]]
    for ack in acks:
        ack.result(timeout=10)
    txn.commit()
    assert stats(topic)["mark_delete_position"] == str(ids[1].position)
    consumer.close()


def test_coordinator_timeout_aborts_pending_acks(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    send(client, topic, 1)
    message = consumer.receive(timeout=15)
    txn = client.new_transaction(timeout=1.0)
    consumer.acknowledge(message, txn)
    again = consumer.receive(timeout=15)  # the coordinator aborts it at the timeout
    assert again.message_id() == message.message_id() and again.redelivery_count() == 1
    with pytest.raises((TransactionTimedOut, TransactionAlreadyAborted)):
        txn.commit()
    consumer.acknowledge_async(again).result()
    assert stats(topic)["pending_ack"]["txns"] == []
    consumer.close()


def test_low_watermark_aborts_a_dangling_ack(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    send(client, topic, 2)
    first, second = receive_all(consumer, 2)
    # An ack that reaches the subscription for a txn that never registered it (as a zombie's late
    # ack would): no end is ever sent here for it.
    dangling = client.new_transaction()
    actor(topic).call("ack", consumer.consumer_id, [(first.message_id().position, 0, 1)], False, dangling.id)
    dangling.commit()
    assert stats(topic)["pending_ack"]["txns"] == [str(dangling.id)]
    later = client.new_transaction()
    while later.id.tc_id != dangling.id.tc_id:  # the watermark is per coordinator
        later.abort()
        later = client.new_transaction()
    consumer.acknowledge(second, later)
    later.commit()  # its end carries a low watermark >= the dangling txn's sequence
    assert stats(topic)["pending_ack"]["txns"] == []
    again = consumer.receive(timeout=15)
    assert again.message_id() == first.message_id() and again.redelivery_count() == 1
    consumer.close()


def test_a_dangling_ack_of_a_txn_its_coordinator_ended_is_aborted_with_no_later_end(client: rt.Client) -> None:
    topic = new_topic(client)
    consumer = client.subscribe(topic, "sub")
    send(client, topic, 3)
    first, second, third = receive_all(consumer, 3)
    # Acks that reach the subscription in txns that never registered it, as an ack arriving after
    # its txn's end did: no end comes here for any. One txn is committed at its coordinator, one
    # still open there, and one its coordinator never handed out (above its low watermark: not
    # knowing it proves nothing, as a zombie coordinator's older table would not know a new txn).
    ended = client.new_transaction()
    actor(topic).call("ack", consumer.consumer_id, [(first.message_id().position, 0, 1)], False, ended.id)
    ended.commit()
    still_open = client.new_transaction(timeout=8)
    actor(topic).call("ack", consumer.consumer_id, [(second.message_id().position, 0, 1)], False, still_open.id)
    unknown = TxnID(ended.id.tc_id, 1 << 40)
    actor(topic).call("ack", consumer.consumer_id, [(third.message_id().position, 0, 1)], False, unknown)
    assert set(stats(topic)["pending_ack"]["txns"]) == {str(ended.id), str(still_open.id), str(unknown)}
    # With no later txn of that coordinator, only the stale-txn check (every second here) frees
    # the first message: it asks the coordinator, which has ended the txn.
    again = consumer.receive(timeout=15)
    assert again.message_id() == first.message_id() and again.redelivery_count() == 1
    assert nothing_more(consumer, 2.5)  # two more checks: the others' messages stay held
    after = stats(topic)
    assert set(after["pending_ack"]["txns"]) == {str(still_open.id), str(unknown)}
    assert after["stale_txns_aborted"] == 1
    # It times out at its coordinator (no end comes here for it either). A check that found it
    # open asks again once its deadline has passed, and frees its message.
    assert consumer.receive(timeout=20).message_id() == second.message_id()
    final = stats(topic)
    assert final["pending_ack"]["txns"] == [str(unknown)] and final["stale_txns_aborted"] == 2
    consumer.close()


@pytest.fixture(scope="module")
def crash_topic(client: rt.Client) -> str:
    """One topic for the crash tests (each acks everything it sent before it ends)."""
    return new_topic(client)


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_recovery_by_log_replay_after_a_crash(client: rt.Client, crash_topic: str, point: str) -> None:
    topic = crash_topic
    consumer = client.subscribe(topic, "sub")
    ids = send(client, topic, 3, prefix=point)
    got = receive_all(consumer, 3)
    assert [m.message_id() for m in got] == ids
    incarnation = stats(topic)["incarnation"]
    actor(topic).call("arm_fault", point, "crash")
    with client.transaction() as txn:  # the client retries acks, the coordinator retries the end
        consumer.acknowledge(got[0], txn)
        consumer.acknowledge(got[1], txn)
    if point == "subscription.after_cursor_persist":
        actor(topic).call("persist_cursor")  # the timer may have persisted (and crashed) already
    after = stats(topic)
    assert after["incarnation"] == incarnation + 1  # it did crash, once
    assert after["pending_ack"]["txns"] == [] and after["mark_delete_position"] == str(ids[1].position)
    consumer = fresh_consumer(client, consumer, topic)
    [rest] = receive_all(consumer, 1)
    assert rest.message_id() == ids[2] and nothing_more(consumer, 0.3)
    consumer.acknowledge_async(rest).result()
    actor(topic).call("persist_cursor")  # plain acks are durable once persisted: the next test starts clean
    consumer.close()


def test_log_is_trimmed_as_mark_delete_moves_and_on_a_timer(client: rt.Client) -> None:
    topic, consumer, ids, got = received(client, 20)

    def ack_each_in_a_txn(messages: list[Message]) -> None:
        for message in messages:
            with client.transaction() as txn:
                consumer.acknowledge(message, txn)

    def log_after_timer(trimmed: Callable[[dict], bool]) -> dict:
        deadline = time.monotonic() + 10
        while True:  # nothing is acked meanwhile: only the timer trims
            current = stats(topic)
            if trimmed(current) or time.monotonic() > deadline:
                return current
            time.sleep(0.1)

    untrimmed = stats(topic)["log"]["trimmed_below"]
    ack_each_in_a_txn(got[:8])  # 16 log entries: an ACK and a COMMIT per txn
    first = log_after_timer(lambda s: s["log"]["entries"] <= 3)
    # The ledger's trim point is the durable proof of a trim (the log_trims counter starts again
    # at 0 in a new incarnation, and a loaded machine may restart an actor).
    assert first["log"]["entries"] <= 3 and first["log"]["trimmed_below"] != untrimmed
    ack_each_in_a_txn(got[9:])  # got[8] is not acked: the mark-delete position stays below it
    time.sleep(1.2)  # a few timer rounds
    stuck = stats(topic)
    assert stuck["mark_delete_position"] == str(ids[7].position)
    assert stuck["log"]["entries"] >= 20  # the records of acks above the mark-delete position stay
    ack_each_in_a_txn([got[8]])
    trimmed = log_after_timer(lambda s: s["log"]["entries"] <= 3)
    assert trimmed["mark_delete_position"] == str(ids[19].position) and trimmed["log"]["entries"] <= 3
    recovered = restart(topic)
    assert recovered["replayed_records"] <= 3
    assert stats(topic)["mark_delete_position"] == str(ids[19].position)
    consumer.close()


def test_exactly_once_move_between_topics(client: rt.Client) -> None:
    """Consume from A and produce to B in one txn per message, with an abort and a subscription
    crash in between: B holds every input's output exactly once."""
    source, sink = new_topic(client), new_topic(client)
    consumer = client.subscribe(source, "mover")
    checker = client.subscribe(sink, "check", initial_position=rt.InitialPosition.Earliest)
    producer = client.create_producer(sink)
    count = 30
    send(client, source, count)
    moved: set[bytes] = set()
    aborted = crashed = False
    deadline = time.monotonic() + 60
    while len(moved) < count and time.monotonic() < deadline:
        message = consumer.receive(timeout=15)
        txn = client.new_transaction()
        producer.send(message.value() + b"-out", txn=txn)
        try:
            consumer.acknowledge(message, txn)
        except TransactionConflict:  # a copy redelivered by the restarted actor, moved already
            txn.abort()
            continue
        if len(moved) == 10 and not aborted:
            aborted = True
            txn.abort()  # the input comes back, the output is never visible
            continue
        if len(moved) == 20 and not crashed:
            crashed = True
            actor(source, "mover").call("arm_fault", "subscription.after_commit_log", "crash")
        txn.commit()
        moved.add(message.value())
    assert aborted and crashed and len(moved) == count
    outputs = [m.value() for m in receive_all(checker, count)]
    assert sorted(outputs) == sorted(f"m{i}-out".encode() for i in range(count))
    assert nothing_more(checker)
    assert stats(source, "mover")["backlog_entries"] == 0
    consumer.close()
    checker.close()


@pytest.mark.parametrize("refused_ack", ["acknowledge", "acknowledge_async"])
def test_an_ack_refused_at_once_makes_its_transaction_abort_only(client: rt.Client, refused_ack: str) -> None:
    """Pulsar's testCommitFailure for acks: an ack that raised in the caller's thread (a message
    of another topic), caught and ignored, dooms the txn, whether it waited or not. Its other ack
    never takes effect: commit raises that error and aborts, also after the subscription
    restarted, and the message comes back."""
    topic, consumer, ids, (first, second) = received(client, 2)
    txn = client.new_transaction()
    consumer.acknowledge(first, txn)
    with pytest.raises(InvalidArgument, match="not a message of"):
        getattr(consumer, refused_ack)(rt.MessageId("elsewhere", 0, 0, 0), txn)
    assert txn.state is TxnClientState.ABORT_ONLY
    with pytest.raises(InvalidTxnState, match="earlier one failed"):
        consumer.acknowledge_async(second, txn)
    restart(topic)
    with pytest.raises(InvalidArgument, match="not a message of"):
        txn.commit()
    assert txn.state is TxnClientState.ABORTED
    assert client.coordinators.get_txn(txn.id)["state"] == "ABORTED"
    after = stats(topic)
    assert after["pending_ack"]["txns"] == [] and after["mark_delete_position"] != str(ids[0].position)
    consumer = fresh_consumer(client, consumer, topic)
    assert [m.message_id() for m in receive_all(consumer, 2)] == ids  # both come back
    consumer.close()


def test_a_timed_out_transaction_refuses_acks_without_a_round_trip(client: rt.Client) -> None:
    """Past its timeout a txn reads TIMED_OUT with no call made; an ack with it raises
    TransactionTimedOut in the caller's thread (the subscription, which had the abort, would
    answer TransactionAlreadyAborted, and through the future); commit raises it too."""
    _topic, consumer, _ids, (first, second) = received(client, 2)
    txn = client.new_transaction(timeout=1.0)
    consumer.acknowledge(first, txn)
    time.sleep(1.05)
    assert txn.state is TxnClientState.TIMED_OUT
    with pytest.raises(TransactionTimedOut):
        consumer.acknowledge_async(second, txn)
    with pytest.raises(TransactionTimedOut):
        consumer.acknowledge(second, txn)
    assert txn.state is TxnClientState.TIMED_OUT
    with pytest.raises(TransactionTimedOut):
        txn.commit()
    assert txn.state is TxnClientState.ABORTED
    with client.transaction() as other:  # nothing of the timed-out txn is left in the way
        consumer.acknowledge(first, other)
        consumer.acknowledge(second, other)
    consumer.close()


@pytest.mark.parametrize("fault", ["delay", "crash"])
def test_a_commit_the_coordinator_timed_out_returns_once_every_subscription_has_the_abort(
        client: rt.Client, fault: str) -> None:
    """Pulsar: acks become available again once the abort completes. The coordinator times the
    txn out and is slow to tell the subscriptions (or crashes and re-drives the abort after its
    restart); the commit raises TransactionTimedOut only once both have the abort, so another
    txn may at once ack what it held, with no conflict."""
    topic = new_topic(client)
    consumers = {sub: client.subscribe(topic, sub, consumer_type=rt.ConsumerType.Shared) for sub in ("a", "b")}
    send(client, topic, 1)
    messages = {sub: consumer.receive(timeout=15) for sub, consumer in consumers.items()}
    txn = client.new_transaction(timeout=1.0)
    for sub, consumer in consumers.items():
        consumer.acknowledge(messages[sub], txn)
    client.faults.arm("coordinator.after_log_aborting", fault, match={"txn": txn.id}, delay_s=3.0)
    time.sleep(1.2)  # the coordinator's timer has logged the abort by now
    with pytest.raises(TransactionTimedOut):
        txn.commit()
    assert txn.state is TxnClientState.ABORTED
    retry = client.new_transaction()
    for sub, consumer in consumers.items():
        consumer.acknowledge(messages[sub], retry)
    retry.commit()
    for sub, consumer in consumers.items():
        assert stats(topic, sub)["pending_ack"]["txns"] == []
        consumer.close()


def test_the_pending_ack_log_keeps_none_of_its_objects_in_memory(client: rt.Client) -> None:
    # A subscription reads its pending-ack log only when it starts, so the ledger's read cache
    # only grew its process between trims (the 30-minute soak's subscriptions). A txn left open
    # holds the log untrimmed, so every record is still there to be cached.
    topic, consumer, _, got = received(client, 11)
    held = client.new_transaction(timeout=120)
    consumer.acknowledge(got[0], held)
    for message in got[1:]:
        txn = client.new_transaction()
        consumer.acknowledge(message, txn)
        txn.commit()
    log = stats(topic)["log"]
    assert log["entries"] >= 21, log  # 11 acks and 10 commit records, none trimmed
    assert log["cached_objects"] <= 1, log  # the ledger keeps its last object at most
    restart(topic)  # replay reads every object once, and keeps none
    log = stats(topic)["log"]
    assert log["entries"] >= 21 and log["cached_objects"] <= 1, log
    held.abort()
    consumer.close()
