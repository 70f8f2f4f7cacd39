"""The dispatcher and the subscription state, driven directly (no Ray, no I/O): routing by
subscription type, outstanding messages and redelivery, reading with gaps, rewinds, plain and
transactional acks, persistence forms, backlog counting, and the client's ack coalescing."""

from __future__ import annotations

import pytest

from raytxn.client.consumer import _whole_entries
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

T1, T2 = TxnID(0, 1), TxnID(0, 2)


def P(ledger: int, entry: int) -> Position:
    return Position(ledger, entry)


def record(value: bytes, key: str | None = None) -> bytes:
    return encode_entry(EntryHeader("data", None, "p", 0, 0, 1, 1), [MessageRecord(value, key)])[1]


def queued(entry: int, index: int = 0, size: int = 1, key: str | None = None) -> QueuedMessage:
    return QueuedMessage(P(0, entry), index, size, 1000 + entry, record(b"v%d" % entry, key))


def never_settled(position: Position, index: int, size: int) -> bool:
    return False


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
    assert state.prepare_end(T1, "COMMIT", 0) == [CommitRecord(T1)]
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
    records = state.prepare_end(T2, "ABORT", low_watermark=1)
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


def test_whole_batches_are_acked_as_entries() -> None:
    acks = [(P(0, 1), 1, 2), (P(0, 2), None, None), (P(0, 1), 0, 2), (P(0, 3), 0, 3)]
    assert _whole_entries(acks) == [(P(0, 2), None, None), (P(0, 3), 0, 3), (P(0, 1), None, 2)]
    assert _whole_entries(acks[1:]) == acks[1:]
