"""The dispatcher and the subscription state, driven directly (no Ray, no I/O): routing by
subscription type, outstanding messages and redelivery, reading with gaps, rewinds, plain and
transactional acks, persistence forms, backlog counting, and the client's ack coalescing."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raytxn.client.ack_spans import coalesce_spans
from raytxn.errors import InvalidArgument, NotAllowed, TransactionConflict
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor
from raytxn.protocol.dispatch import ConsumerType, Dispatcher, QueuedMessage
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_entry
from raytxn.protocol.pending_ack import AbortRecord, Ack, AckKind, AckRecord, CommitRecord
from raytxn.protocol.subscription_state import (
    SubscriptionState,
    count_entries,
    decode_persisted,
    encode_persisted,
    routing_key_of,
)
from raytxn.protocol.txnlog import EndAction
from tests.unit.test_ack_spans import spans_of

T1, T2 = TxnID(0, 1), TxnID(0, 2)


def P(ledger: int, entry: int) -> Position:
    return Position(ledger, entry)


def record(value: bytes, key: str | None = None) -> bytes:
    return encode_entry(EntryHeader("data", None, "p", 0, 0, 1, 1), [MessageRecord(value, key)])[1]


def queued(entry: int, index: int = 0, size: int = 1, key: str | None = None) -> QueuedMessage:
    return QueuedMessage(P(0, entry), index, size, 1000 + entry, record(b"v%d" % entry, key))


def never_settled(position: Position, size: int, indexes: list[int]) -> list[int]:
    return indexes


def fetch(dispatcher: Dispatcher, consumer_id: str, demand: int) -> list[int]:
    """The entry ids a fetch of ``demand`` messages gets (one dispatch pass)."""
    dispatcher.want(consumer_id, demand)
    dispatcher.dispatch(never_settled)
    return [message.position.entry_id for message, _ in dispatcher.take(consumer_id)]


# --- dispatcher --------------------------------------------------------------------------------


def test_exclusive_and_type_rules() -> None:
    dispatcher = Dispatcher(0, routing_key_of)
    dispatcher.add_consumer("a", "a", ConsumerType.Exclusive, 0.0)
    assert dispatcher.add_consumer("a", "a", "Exclusive", 1.0) == []  # again: a no-op
    with pytest.raises(NotAllowed):
        dispatcher.add_consumer("b", "b", ConsumerType.Exclusive, 0.0)
    with pytest.raises(NotAllowed):
        dispatcher.add_consumer("b", "b", ConsumerType.Shared, 0.0)
    with pytest.raises(InvalidArgument):
        dispatcher.add_consumer("c", "c", "Sharded", 0.0)
    dispatcher.remove_consumer("a")
    dispatcher.add_consumer("b", "b", ConsumerType.Shared, 0.0)  # nobody attached: any type
    assert dispatcher.type is ConsumerType.Shared


def test_shared_round_robin_and_release() -> None:
    dispatcher = Dispatcher(0, routing_key_of)
    for consumer in ("a", "b"):
        dispatcher.add_consumer(consumer, consumer, ConsumerType.Shared, 0.0)
    for entry in range(6):
        dispatcher.offer(queued(entry))
    dispatcher.want("a", 10)
    dispatcher.want("b", 10)
    assert sorted(dispatcher.dispatch(never_settled)) == ["a", "b"]
    got_a = [(m.position.entry_id, n) for m, n in dispatcher.take("a")]
    got_b = [(m.position.entry_id, n) for m, n in dispatcher.take("b")]
    assert got_a == [(0, 0), (2, 0), (4, 0)] and got_b == [(1, 0), (3, 0), (5, 0)]
    assert not dispatcher.offer(queued(2))  # outstanding: reading it again does not queue it
    assert dispatcher.release("b", [(P(0, 3), 0), (P(0, 2), 0)]) == [(P(0, 3), 0)]  # only b's own
    assert dispatcher.offer(queued(3))
    assert [(m.position.entry_id, n) for m, n in (dispatcher.want("a", 5), dispatcher.dispatch(never_settled),
                                                   dispatcher.take("a"))[2]] == [(3, 1)]  # counted
    assert dispatcher.remove_consumer("b") == [(P(0, 1), 0), (P(0, 5), 0)]
    assert dispatcher.outstanding == 4


def test_failover_active_consumer_and_switch() -> None:
    dispatcher = Dispatcher(1, routing_key_of)
    dispatcher.add_consumer("id-b", "b", ConsumerType.Failover, 0.0)
    dispatcher.offer(queued(0))
    assert fetch(dispatcher, "id-b", 5) == [0]
    # "a" sorts first; partition 1 % 2 = 1 -> "b" stays active
    assert dispatcher.add_consumer("id-a", "a", ConsumerType.Failover, 0.0) == []
    assert dispatcher.active_consumer() == "id-b"
    dispatcher.offer(queued(1))
    assert fetch(dispatcher, "id-a", 5) == []
    # "b" leaves: "a" takes over, and b's outstanding message comes back to be read again
    assert dispatcher.remove_consumer("id-b") == [(P(0, 0), 0)]
    assert dispatcher.active_consumer() == "id-a"
    assert fetch(dispatcher, "id-a", 5) == [1]
    # a newcomer that becomes active (sorted: a, z; 1 % 2 -> z) takes the old one's messages
    assert dispatcher.add_consumer("id-z", "z", ConsumerType.Failover, 0.0) == [(P(0, 1), 0)]
    assert dispatcher.active_consumer() == "id-z"


def test_key_shared_routes_keys_stably_and_blocked_keys_wait_in_order() -> None:
    dispatcher = Dispatcher(0, routing_key_of)
    for consumer in ("a", "b"):
        dispatcher.add_consumer(consumer, consumer, ConsumerType.KeyShared, 0.0)
    keys = [f"k{i}" for i in range(20)]
    owners = {key: dispatcher.consumer_of_key(key) for key in keys}
    assert set(owners.values()) == {"a", "b"}
    busy = owners["k0"]
    free = "a" if busy == "b" else "b"
    for entry, key in enumerate(["k0", *[k for k in keys if owners[k] == free][:2], "k0"]):
        dispatcher.offer(queued(entry, key=key))
    assert fetch(dispatcher, free, 10) == [1, 2]  # k0's messages wait for their consumer
    assert fetch(dispatcher, busy, 1) == [0]
    assert fetch(dispatcher, busy, 1) == [3]  # in order
    dispatcher.add_consumer("c", "c", ConsumerType.KeyShared, 0.0)
    moved = sum(dispatcher.consumer_of_key(key) != owners[key] for key in keys)
    assert all(dispatcher.consumer_of_key(key) in (owners[key], "c") for key in keys) and moved < len(keys)


def test_key_shared_keys_moving_to_a_new_consumer_wait_until_their_earlier_messages_are_acked() -> None:
    dispatcher = Dispatcher(0, routing_key_of)
    dispatcher.add_consumer("a", "a", ConsumerType.KeyShared, 0.0)
    keys = [f"k{i}" for i in range(12)]
    for entry in range(24):  # k0..k11, then k0..k11 again
        dispatcher.offer(queued(entry, key=keys[entry % 12]))
    assert fetch(dispatcher, "a", 12) == list(range(12))  # the first message of every key
    dispatcher.add_consumer("c", "c", ConsumerType.KeyShared, 1.0)
    moved = [key for key in keys if dispatcher.consumer_of_key(key) == "c"]
    stayed = [key for key in keys if key not in moved]
    assert moved and stayed
    assert fetch(dispatcher, "c", 100) == []  # each moved key's first message is still out with "a"
    assert dispatcher.draining_keys() == len(moved)
    assert fetch(dispatcher, "a", 100) == [12 + keys.index(key) for key in stayed]  # unmoved keys flow
    first, second, *_ = moved
    dispatcher.settle([(P(0, keys.index(first)), 0)])  # "a" acks the first key's message
    assert fetch(dispatcher, "c", 100) == [12 + keys.index(first)]
    assert dispatcher.release("a", [(P(0, keys.index(second)), 0)]) == [(P(0, keys.index(second)), 0)]
    dispatcher.offer(queued(keys.index(second), key=second))  # given back: read again, ahead of the later one
    assert fetch(dispatcher, "c", 100) == [keys.index(second), 12 + keys.index(second)]
    assert dispatcher.draining_keys() == len(moved) - 2
    dispatcher.remove_consumer("a")  # its outstanding messages are given back: nothing drains
    assert dispatcher.draining_keys() == 0


KEYS = ["k0", "k1", "k2", "k3", "k4", "k5"]
offer_op = st.tuples(st.just("offer"), st.sampled_from(KEYS))
fetch_op = st.tuples(st.just("fetch"), st.integers(0, 2), st.integers(1, 4))
dispatch_ops = st.lists(st.one_of(  # consumers are picked by index among those attached
    offer_op, offer_op, fetch_op, fetch_op, st.tuples(st.just("join")),
    st.tuples(st.just("leave"), st.integers(0, 2)),
    st.tuples(st.just("ack"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("nack"), st.integers(0, 2), st.integers(0, 3)),
), min_size=10, max_size=80)


@settings(max_examples=200, deadline=None)
@given(dispatch_ops)
@example([("join",), ("offer", "k0"), ("fetch", 0, 1), ("join",), ("offer", "k0"), ("fetch", 1, 1)])  # k0 moves
def test_key_shared_never_has_a_key_outstanding_with_two_consumers(ops: list[tuple]) -> None:
    """Consumers join and leave, fetch, ack and give back in any order: a key's messages are never
    outstanding with two consumers at once, each consumer gets a key's messages in order unless one
    was given back, and once everything is acked every message was delivered."""
    dispatcher = Dispatcher(0, routing_key_of)
    key_of: dict[int, str] = {}
    outstanding: dict[str, list[int]] = {}  # attached consumer -> entries it holds, in the order received
    delivered: set[int] = set()
    given_back: set[str] = set()  # keys with a redelivery: order may differ for them
    last_of_key: dict[tuple[str, str], int] = {}
    joined = 0

    def give_back(entries: list[int]) -> None:
        for entry in entries:
            given_back.add(key_of[entry])
            dispatcher.offer(queued(entry, key=key_of[entry]))  # read again, as a rewind does

    def take(consumer: str, demand: int) -> None:
        for entry in fetch(dispatcher, consumer, demand):
            key = key_of[entry]
            if key not in given_back:
                assert entry > last_of_key.get((consumer, key), -1)
            last_of_key[(consumer, key)] = entry
            holders = {c for c, entries in outstanding.items() for e in entries if key_of[e] == key}
            assert holders <= {consumer}, f"{key} is outstanding with {holders} and handed to {consumer}"
            outstanding[consumer].append(entry)
            delivered.add(entry)

    def join() -> None:
        nonlocal joined
        consumer = f"c{joined}"
        joined += 1
        dispatcher.add_consumer(consumer, consumer, ConsumerType.KeyShared, 0.0)
        outstanding[consumer] = []

    for op in ops:
        attached = sorted(outstanding)
        consumer = attached[op[1] % len(attached)] if len(op) > 1 and op[0] != "offer" and attached else None
        if op[0] == "offer":
            entry = len(key_of)
            key_of[entry] = op[1]
            dispatcher.offer(queued(entry, key=op[1]))
        elif op[0] == "join" and len(attached) < 3:
            join()
        elif op[0] == "leave" and consumer is not None:
            give_back([key[0].entry_id for key in dispatcher.remove_consumer(consumer)])
            del outstanding[consumer]
        elif op[0] == "fetch" and consumer is not None:
            take(consumer, op[2])
        elif op[0] in ("ack", "nack") and consumer is not None and outstanding[consumer]:
            entry = outstanding[consumer].pop(op[2] % len(outstanding[consumer]))
            if op[0] == "ack":
                assert dispatcher.settle([(P(0, entry), 0)]) == [(P(0, entry), 0)]
            else:
                assert dispatcher.release(consumer, [(P(0, entry), 0)]) == [(P(0, entry), 0)]
                give_back([entry])
    if not outstanding:
        join()
    for _ in range(len(key_of) + 1):  # everybody acks all it has and fetches: nothing stays stuck
        for entries in outstanding.values():
            dispatcher.settle([(P(0, entry), 0) for entry in entries])
            entries.clear()
        for consumer in list(outstanding):
            take(consumer, 100)
    assert delivered == set(key_of) and dispatcher.queued == 0


def test_settle_entries_and_cumulative_and_idle_consumers() -> None:
    dispatcher = Dispatcher(0, routing_key_of)
    dispatcher.add_consumer("a", "a", ConsumerType.Exclusive, 0.0)
    for index in range(3):
        dispatcher.offer(queued(5, index, 3))
    dispatcher.offer(queued(6))
    dispatcher.offer(queued(7))
    assert fetch(dispatcher, "a", 4) == [5, 5, 5, 6]
    assert dispatcher.settle_entry(P(0, 5)) == [(P(0, 5), i) for i in range(3)]
    assert dispatcher.settle_through(P(0, 7)) == [(P(0, 6), 0)] and dispatcher.queued == 0
    dispatcher.touch("a", 10.0, fetching=1)
    assert dispatcher.idle_consumers(100.0, 30.0) == []  # a waiting fetch counts as alive
    dispatcher.touch("a", 10.0, fetching=-1)
    assert dispatcher.idle_consumers(100.0, 30.0) == ["a"]


def test_batch_entries_go_out_whole_to_exclusive_consumers_and_shared_consumers_split_them() -> None:
    """The queue holds entries: an exclusive fetch whose demand ends inside one still takes it
    whole (Pulsar's dispatcher: the consumer's permits go below zero), and the next entry waits
    for the next fetch; Shared consumers get an entry's messages round-robin, each with the right
    record, no more than their demand."""
    values = [b"m%d" % i for i in range(10)]
    records = encode_entry(EntryHeader("data", None, "p", 0, 9, 10, 7), [MessageRecord(v) for v in values])
    dispatcher = Dispatcher(0, routing_key_of)
    dispatcher.add_consumer("a", "a", ConsumerType.Exclusive, 0.0)
    assert dispatcher.offer_entry(P(0, 1), 10, 7, records, list(range(10))) == 10
    assert dispatcher.offer_entry(P(0, 1), 10, 7, records, list(range(10))) == 0  # queued already
    assert dispatcher.offer_entry(P(0, 2), 10, 7, records, list(range(10))) == 10
    dispatcher.want("a", 4)
    dispatcher.dispatch(never_settled)
    first = dispatcher.take("a")
    assert [(m.batch_index, m.record) for m, _ in first] == [(i, records[i + 1]) for i in range(10)]
    assert dispatcher.queued == 10 and dispatcher.outstanding == 10 and dispatcher.first_queued() == (P(0, 2), 0)
    assert dispatcher.offer_entry(P(0, 1), 10, 7, records, list(range(10))) == 0  # outstanding
    dispatcher.want("a", 0)
    dispatcher.dispatch(never_settled)
    assert dispatcher.take("a") == []  # no demand: the next entry waits
    dispatcher.want("a", 100)
    dispatcher.dispatch(lambda position, size, indexes: [i for i in indexes if i != 7])  # 7 is settled by now
    assert [m.batch_index for m, _ in dispatcher.take("a")] == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert dispatcher.queued == 0 and dispatcher.outstanding == 19
    assert dispatcher.release("a", [(P(0, 1), 2)]) == [(P(0, 1), 2)]
    assert dispatcher.offer_entry(P(0, 1), 10, 7, records, [2]) == 1  # read again
    assert fetch(dispatcher, "a", 5) == [1]

    shared = Dispatcher(0, routing_key_of)
    for consumer in ("a", "b"):
        shared.add_consumer(consumer, consumer, ConsumerType.Shared, 0.0)
    shared.offer_entry(P(0, 1), 10, 7, records, list(range(10)))
    shared.want("a", 3)
    shared.want("b", 10)
    shared.dispatch(never_settled)
    got_a = [(m.batch_index, m.record) for m, _ in shared.take("a")]
    got_b = [(m.batch_index, m.record) for m, _ in shared.take("b")]
    assert [i for i, _ in got_a] == [0, 2, 4] and [i for i, _ in got_b] == [1, 3, 5, 6, 7, 8, 9]
    assert all(record == records[i + 1] for i, record in got_a + got_b)


# --- subscription state ------------------------------------------------------------------------


def data_entry(entry: int, values: list[bytes]) -> tuple[Position, list[bytes]]:
    header = EntryHeader("data", None, "p", entry * 10, entry * 10 + len(values) - 1, len(values), 1000)
    return P(0, entry), encode_entry(header, [MessageRecord(v) for v in values])


def state_with_consumer(consumer_type: ConsumerType = ConsumerType.Exclusive) -> SubscriptionState:
    state = SubscriptionState(0, Cursor())  # earliest
    state.add_consumer("a", "a", consumer_type, 0.0)
    return state


def deliver(state: SubscriptionState, demand: int = 100) -> list[tuple[int, int, int]]:
    state.dispatcher.want("a", demand)
    state.dispatch()
    return [(entry, index, redeliveries) for _, entry, index, _, _, redeliveries, _ in state.take("a")]


def test_reading_a_batch_again_skips_what_the_cursor_or_a_txn_holds_and_takes_whole_entries() -> None:
    state = state_with_consumer()
    position, records = data_entry(0, [b"v%d" % i for i in range(6)])
    state.on_read(state.read_position, [(position, records)], P(0, 1), P(0, 1))
    [entry] = (state.dispatcher.want("a", 100), state.dispatch(), state.take_entries("a"))[2]
    assert entry[4] == list(range(6)) and list(entry[6]) == records[1:] and entry[5] is None  # whole, as read
    state.ack([(position, 1, 6)])
    record = state.prepare_ack(T1, [(position, 3, 6)])
    assert record is not None
    state.apply(record, P(9, 0))
    assert state.release("a") == 4  # 0, 2, 4, 5: 1 is acked, 3 is T1's
    state.on_read(state.read_position, [(position, records)], P(0, 1), P(0, 1))
    [again] = (state.dispatcher.want("a", 100), state.dispatch(), state.take_entries("a"))[2]
    assert again[4] == [0, 2, 4, 5] and again[5] == [1, 1, 1, 1]
    assert list(again[6]) == [records[i + 1] for i in (0, 2, 4, 5)]


def test_reading_acks_gaps_and_queues_what_is_deliverable() -> None:
    state = state_with_consumer()
    # entry 1 is a marker (skipped by the partition), entries 3..4 were scanned but not visible
    entries = [data_entry(0, [b"a"]), data_entry(2, [b"b", b"c"])]
    assert state.on_read(state.read_position, entries, P(0, 5), P(0, 4)) == 3
    assert state.read_position == P(0, 5)
    assert deliver(state) == [(0, 0, 0), (2, 0, 0), (2, 1, 0)]
    assert state.delivered_through == P(0, 2)
    state.ack([(P(0, 0), None, None), (P(0, 2), 0, 2), (P(0, 2), 1, 2)])
    assert state.cursor.mark_delete_position == P(0, 4)  # the marker and the invisible tail too
    assert state.dispatcher.outstanding == 0


def test_release_rewinds_and_counts_redeliveries() -> None:
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(0, [b"a"]), data_entry(1, [b"b"])], P(0, 2), P(0, 1))
    assert deliver(state) == [(0, 0, 0), (1, 0, 0)]
    assert state.release("a", [(P(0, 0), 0)]) == 1
    assert state.read_position == P(0, 0)  # read it again from there
    state.on_read(P(0, 0), [data_entry(0, [b"a"]), data_entry(1, [b"b"])], P(0, 2), P(0, 1))
    assert deliver(state) == [(0, 0, 1)]  # entry 1 is still outstanding: not queued twice


def test_a_message_named_twice_in_one_release_is_given_back_once() -> None:
    """Regression (seen as KeyError: 0 from a subscription's redeliver under load): a consumer's
    redelivery request can name a message twice (due by its negative ack and by its ack timeout)."""
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(0, [b"a"]), data_entry(1, [b"b"])], P(0, 2), P(0, 1))
    assert deliver(state) == [(0, 0, 0), (1, 0, 0)]
    assert state.release("a", [(P(0, 0), 0), (P(0, 0), 0)]) == 1
    state.on_read(P(0, 0), [data_entry(0, [b"a"]), data_entry(1, [b"b"])], P(0, 2), P(0, 1))
    assert deliver(state) == [(0, 0, 1)]  # counted once: its first redelivery


def test_a_new_exclusive_consumer_gets_given_back_messages_before_later_queued_ones() -> None:
    """Regression: a closed consumer's outstanding messages were re-read behind messages still
    queued, so its successor received later ones first and a cumulative ack of those covered
    messages it never got (lost). A rewind now drops the queue from there and reads in order."""
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(i, [b"x"]) for i in range(4)], P(0, 4), P(0, 3))
    assert deliver(state, demand=2) == [(0, 0, 0), (1, 0, 0)]  # entries 2, 3 stay queued
    state.remove_consumer("a")
    assert state.read_position == P(0, 0) and state.dispatcher.queued == 0
    state.add_consumer("b", "b", ConsumerType.Exclusive, 1.0)
    state.dispatcher.want("b", 100)
    state.dispatch()
    assert state.take("b") == []  # nothing handed out before the re-read
    # a read that started before the rewind and lands after it queues nothing
    assert state.on_read(P(0, 2), [data_entry(2, [b"x"]), data_entry(3, [b"x"])], P(0, 4), P(0, 3)) == 0
    state.on_read(P(0, 0), [data_entry(i, [b"x"]) for i in range(4)], P(0, 4), P(0, 3))
    state.dispatcher.want("b", 100)
    state.dispatch()
    assert [(entry, redeliveries) for _, entry, _, _, _, redeliveries, _ in state.take("b")] == [
        (0, 1), (1, 1), (2, 0), (3, 0)]


def test_plain_acks_respect_pending_txn_acks() -> None:
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(0, [b"a"]), data_entry(1, [b"b"])], P(0, 2), P(0, 1))
    deliver(state)
    record = state.prepare_ack(T1, [(P(0, 1), None, None)])
    assert record is not None
    state.apply(record, P(9, 0))
    state.ack([(P(0, 1), None, None)])  # held by T1: ignored, as Pulsar does
    assert not state.cursor.is_acked(P(0, 1))
    with pytest.raises(TransactionConflict):
        state.ack([(P(0, 1), None, None)], cumulative=True)
    with pytest.raises(InvalidArgument):
        state.prepare_end(T1, "ROLLBACK", 0)
    assert state.pending.pending_txns() == [T1]
    assert state.prepare_end(T1, EndAction.COMMIT, 0) == [CommitRecord(T1)]
    state.apply(CommitRecord(T1), P(9, 1))
    assert state.cursor.is_acked(P(0, 1)) and state.pending.pending_txns() == []


def test_whole_entry_txn_ack_of_a_partially_acked_batch_conflicts() -> None:
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(0, [b"a", b"b", b"c"])], P(0, 1), P(0, 0))
    deliver(state)
    state.ack([(P(0, 0), 0, 3)])
    with pytest.raises(TransactionConflict, match="already acked"):
        state.prepare_ack(T1, [(P(0, 0), None, 3)])
    record = state.prepare_ack(T1, [(P(0, 0), 1, 3), (P(0, 0), 2, 3)])
    assert record is not None
    state.apply(record, P(9, 0))
    assert state.dispatcher.outstanding == 0


def test_a_txn_cumulative_ack_inside_a_batch_is_one_record_and_refuses_what_a_committed_txn_acked() -> None:
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(0, [b"a", b"b", b"c"])], P(0, 1), P(0, 0))
    deliver(state)
    record = state.prepare_ack(T1, [(P(0, 0), 0, 3)])
    assert record is not None
    state.apply(record, P(9, 0))
    state.apply(CommitRecord(T1), P(9, 1))
    with pytest.raises(TransactionConflict, match="already acked"):  # index 0 is T1's, committed
        state.prepare_ack(T2, [(P(0, 0), 0, 3)], cumulative=True, request="r0")
    record = state.prepare_ack(T2, [(P(0, 0), 1, 3)], cumulative=True, request="r1")
    assert record == AckRecord(T2, AckKind.CUMULATIVE, (Ack(P(0, 0), 1, 3),), "r1")
    state.apply(record, P(9, 2))
    assert state.dispatcher.outstanding == 1  # index 2 is still out
    assert state.prepare_ack(T2, [(P(0, 0), 1, 3)], cumulative=True, request="r1") is None  # a retry
    with pytest.raises(TransactionConflict, match="at or below its own"):  # a new call, the same ack
        state.prepare_ack(T2, [(P(0, 0), 1, 3)], cumulative=True, request="r2")


def test_abort_rewinds_to_what_the_txn_held_and_low_watermark_aborts_dangling_txns() -> None:
    state = state_with_consumer()
    state.on_read(state.read_position, [data_entry(i, [b"x"]) for i in range(4)], P(0, 4), P(0, 3))
    deliver(state)
    cumulative = state.prepare_ack(T1, [(P(0, 1), None, None)], cumulative=True)
    assert cumulative is not None
    state.apply(cumulative, P(9, 0))
    individual = state.prepare_ack(T2, [(P(0, 3), None, None)])
    assert individual is not None
    state.apply(individual, P(9, 1))
    assert state.read_position == P(0, 4)
    # T2 ends with a watermark covering T1 (dangling): T1 is aborted first
    records = state.prepare_end(T2, EndAction.ABORT, low_watermark=1)
    assert records == [AbortRecord(T1), AbortRecord(T2)]
    for number, end in enumerate(records):
        state.apply(end, P(9, 2 + number))
    assert state.read_position == P(0, 0) and state.pending.pending_txns() == []
    state.on_read(P(0, 0), [data_entry(i, [b"x"]) for i in range(4)], P(0, 4), P(0, 3))
    assert deliver(state) == [(0, 0, 1), (1, 0, 1), (3, 0, 1)]  # entry 2 is still with the consumer


def test_cumulative_acks_are_refused_on_shared_subscriptions() -> None:
    state = state_with_consumer(ConsumerType.Shared)
    with pytest.raises(NotAllowed):
        state.ack([(P(0, 0), None, None)], cumulative=True)
    with pytest.raises(NotAllowed):
        state.prepare_ack(T1, [(P(0, 0), None, None)], cumulative=True)


def test_persisted_form_and_trim_point() -> None:
    state = SubscriptionState(0, Cursor(P(0, -1)), max_index_lag=1)
    state.delivered_through = P(0, 10)
    for number in range(3):
        txn = TxnID(0, number)
        ack = state.prepare_ack(txn, [(P(0, number), None, None)])
        assert ack is not None
        state.apply(ack, P(5, 2 * number))
        state.apply(CommitRecord(txn), P(5, 2 * number + 1))
    persisted = state.persisted_form()
    assert decode_persisted(encode_persisted(persisted)) == persisted
    assert persisted.log_position == P(5, 5)
    assert state.trim_point(persisted) == P(5, 4)  # the last ACK record covered by mark-delete <0,2>
    stale = type(persisted)(persisted.cursor, P(5, 3))
    assert state.trim_point(stale) is None  # never past what the persisted form includes


def test_counting_entries_for_the_backlog() -> None:
    ledgers = [(0, 9), (2, 4), (3, 1 << 62)]
    assert count_entries(ledgers, P(0, 5), P(3, 2)) == 5 + 5 + 3
    assert count_entries(ledgers, P(-1, 0), P(2, 1)) == 10 + 2
    state = SubscriptionState(0, Cursor(P(0, 4)))
    state.max_read = P(2, 4)
    state.cursor.ack(P(2, 0))
    assert state.backlog_entries(ledgers) == 5 + 5 - 1


def test_whole_batches_are_acked_as_entries_and_contiguous_entries_as_ranges() -> None:
    acks = [(P(0, 1), 1, 2), (P(0, 2), None, 5), (P(0, 1), 0, 2), (P(0, 3), 0, 3), (P(0, 4), 0, 1),
            (P(1, 0), None, 4)]
    assert coalesce_spans(spans_of(acks)) == ([(0, 1, 2), (0, 4, 4), (1, 0, 0)], [(0, 3, 3, 0, 0)])
    assert coalesce_spans(spans_of(acks[3:4])) == ([], [(0, 3, 3, 0, 0)])
    assert coalesce_spans([]) == ([], [])


def test_a_txn_ack_of_a_message_another_consumer_holds_leaves_it_there_until_the_txn_commits() -> None:
    """A consumer may ack in a txn a message this incarnation handed to another consumer (it
    received it before a restart). Settled at once, an abort of that txn handed it out a third
    time while the other consumer still held it: two consumers held one Key_Shared key
    (simulator seed 66 of key-shared). It stays with its holder until the txn commits."""
    state = SubscriptionState(0, Cursor())
    for consumer in ("a", "b"):
        state.add_consumer(consumer, consumer, ConsumerType.Shared, 0.0)
    entries = [data_entry(i, [b"x"]) for i in range(4)]
    state.on_read(state.read_position, entries, P(0, 4), P(0, 3))
    state.dispatcher.want("a", 2)
    state.dispatch()
    assert [entry for _, entry, *_ in state.take("a")] == [0, 1]
    foreign = state.prepare_ack(T1, [(P(0, 0), None, None)], consumer="b")
    assert foreign is not None and foreign.consumer == "b"
    state.apply(foreign, P(9, 0))
    assert state.dispatcher.outstanding == 2  # entry 0 is still out with "a"
    for end in state.prepare_end(T1, EndAction.ABORT, None):
        state.apply(end, P(9, 1))
    state.on_read(state.read_position, entries, P(0, 4), P(0, 3))  # read again after the abort's rewind
    state.dispatcher.want("b", 10)
    state.dispatch()
    assert [entry for _, entry, *_ in state.take("b")] == [2, 3]  # not entry 0: "a" holds it
    committed = state.prepare_ack(T2, [(P(0, 1), None, None)], consumer="b")
    assert committed is not None
    state.apply(committed, P(9, 2))
    for end in state.prepare_end(T2, EndAction.COMMIT, None):
        state.apply(end, P(9, 3))
    assert state.dispatcher.release("a") == [(P(0, 0), 0)]  # entry 1 is consumed: "a" holds it no more
    own = state.prepare_ack(TxnID(0, 3), [(P(0, 2), None, None)], consumer="b")
    assert own is not None
    state.apply(own, P(9, 4))
    assert state.dispatcher.outstanding == 1  # its own ack settles at once, as before


@pytest.mark.parametrize("consumer_type", [ConsumerType.Shared, ConsumerType.KeyShared])
def test_an_abort_hands_a_message_another_consumer_held_to_that_consumer_once_more(
        consumer_type: ConsumerType) -> None:
    """Chaos seed 11: "b" (holding a message from before a restart) acks entry 0 in T1 while this
    incarnation handed it to "a"; a's own txn ack of it is refused (T1 holds it), and "a" gives
    up on it. When T1 aborts, "a" gets it once more (with its redelivery counted): left with
    "a" and not handed out again, it was never consumed. Nobody else gets it meanwhile."""
    state = SubscriptionState(0, Cursor())
    for consumer in ("a", "b"):
        state.add_consumer(consumer, consumer, consumer_type, 0.0)
    entries = [data_entry(i, [b"x"]) for i in range(3)]
    state.on_read(state.read_position, entries, P(0, 3), P(0, 2))
    holder = state.dispatcher.consumer_of_key(None) if consumer_type is ConsumerType.KeyShared else "a"
    other = "b" if holder == "a" else "a"
    state.dispatcher.want(holder, 10)
    state.dispatch()
    taken = [entry for _, entry, *_ in state.take(holder)]
    assert 0 in taken
    foreign = state.prepare_ack(T1, [(P(0, 0), None, None)], consumer=other)
    assert foreign is not None
    state.apply(foreign, P(9, 0))
    with pytest.raises(TransactionConflict):
        state.prepare_ack(T2, [(P(0, 0), None, None)], consumer=holder)
    for end in state.prepare_end(T1, EndAction.ABORT, None):
        state.apply(end, P(9, 1))
    state.on_read(state.read_position, entries, P(0, 3), P(0, 2))  # read again after the abort's rewind
    state.dispatcher.want(other, 10)
    state.dispatch()
    assert 0 not in [entry for _, entry, *_ in state.take(other)]
    outstanding = state.dispatcher.outstanding
    state.dispatcher.want(holder, 10)
    state.dispatch()
    again = [(entry, redeliveries) for _, entry, _, _, _, redeliveries, _ in state.take(holder)]
    assert again == [(0, 1)]
    assert state.dispatcher.outstanding == outstanding  # the same holding, counted once
    own = state.prepare_ack(TxnID(0, 3), [(P(0, 0), None, None)], consumer=holder)
    assert own is not None
    state.apply(own, P(9, 2))
    for end in state.prepare_end(TxnID(0, 3), EndAction.COMMIT, None):
        state.apply(end, P(9, 3))
    assert (P(0, 0), 0) not in [key for c in ("a", "b") for key in state.dispatcher.release(c)]
    assert not state.dispatcher._resend


def test_the_read_ahead_follows_what_the_consumers_last_fetches_could_take_within_its_bounds() -> None:
    state = state_with_consumer(ConsumerType.Failover)
    assert state.read_ahead(2000, 20_000) == 2000  # nobody fetched yet
    state.dispatcher.want("a", 10_000)
    assert state.read_ahead(2000, 20_000) == 10_000
    state.add_consumer("b", "b", ConsumerType.Failover, 0.0)  # a standby: it asks too
    state.dispatcher.want("b", 15_000)
    assert state.read_ahead(2000, 20_000) == 20_000  # capped
    position, records = data_entry(0, [b"v%d" % i for i in range(6)])
    state.on_read(state.read_position, [(position, records)], P(0, 1), P(0, 1))
    state.dispatch()  # "a" took the entry: its demand fell, but its receive queue did not
    state.take_entries("a")
    state.dispatcher.want("a", 0)  # a ping (its queue is full) says nothing of its size
    assert state.read_ahead(2000, 20_000) == 20_000
    assert state.wants_read(state.read_ahead(2000, 20_000))
    state.remove_consumer("b")
    assert state.read_ahead(2000, 20_000) == 10_000
    state.remove_consumer("a")
    assert state.read_ahead(2000, 20_000) == 2000
