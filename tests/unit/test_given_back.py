"""A cumulative ack in a txn may not cover messages that were given back (an abort, a closed
consumer) and not handed out again since (bug 5 of the simulator, consumer-swap profile): in the
pure subscription state, through a consumer swap, an abort, a persisted form and a restart."""

from __future__ import annotations

import pytest

from raytxn.errors import NotAllowed
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor
from raytxn.protocol.dispatch import ConsumerType
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_entry
from raytxn.protocol.subscription_state import SubscriptionState
from raytxn.protocol.txnlog import EndAction

T1, T2 = TxnID(0, 1), TxnID(0, 2)
ENTRIES = 6


def P(entry_id: int) -> Position:
    return Position(0, entry_id)


def entries(first: int, last: int) -> list[tuple[Position, list[bytes]]]:
    out = []
    for entry_id in range(first, last + 1):
        header = EntryHeader("data", None, "p", entry_id, entry_id, 1, 1000)
        out.append((P(entry_id), encode_entry(header, [MessageRecord(b"m%d" % entry_id)])))
    return out


def read_and_take(state: SubscriptionState, consumer: str) -> list[int]:
    """The actor's read loop and a fetch: read from ``read_position`` to the end, hand out."""
    state.on_read(state.read_position, entries(state.read_position.entry_id, ENTRIES - 1), P(ENTRIES),
                  P(ENTRIES - 1))
    state.dispatcher.want(consumer, ENTRIES)
    state.dispatch()
    return [message[1] for message in state.take(consumer)]


class Log:
    def __init__(self) -> None:
        self.next = 0

    def apply(self, state: SubscriptionState, record: object) -> None:
        state.apply(record, Position(9, self.next))
        self.next += 1


def view(state: SubscriptionState) -> tuple:
    return (state.cursor.snapshot(), state.pending.stats(), state.dispatcher.outstanding, state.dispatcher.queued)


def swapped_after_abort() -> tuple[SubscriptionState, Log]:
    """Consumer a takes 0..5 and acks through 2 in T1 (pending); a closes (3..5 go back); b takes
    3..5; T1 aborts (0..2 go back, and nobody has them)."""
    state, log = SubscriptionState(0, Cursor()), Log()
    state.add_consumer("a", "a", ConsumerType.Exclusive, 0.0)
    assert read_and_take(state, "a") == [0, 1, 2, 3, 4, 5]
    log.apply(state, state.prepare_ack(T1, [(P(2), 0, 1)], cumulative=True))
    state.remove_consumer("a")
    state.add_consumer("b", "b", ConsumerType.Exclusive, 0.0)
    assert read_and_take(state, "b") == [3, 4, 5]
    for record in state.prepare_end(T1, EndAction.ABORT, None):
        log.apply(state, record)
    assert state.given_back is not None
    return state, log


def test_a_cumulative_ack_over_given_back_messages_is_refused_until_they_are_handed_out_again() -> None:
    state, log = swapped_after_abort()
    before = view(state)
    with pytest.raises(NotAllowed, match="given back"):
        state.prepare_ack(T2, [(P(5), 0, 1)], cumulative=True)
    assert view(state) == before  # refused: nothing changed
    assert read_and_take(state, "b") == [0, 1, 2]  # the given-back ones, again, to b
    assert state.given_back is None
    log.apply(state, state.prepare_ack(T2, [(P(5), 0, 1)], cumulative=True))
    for record in state.prepare_end(T2, EndAction.COMMIT, None):
        log.apply(state, record)
    assert state.cursor.acked_below == P(6)


def test_the_give_back_survives_a_restart_in_the_persisted_form() -> None:
    state, _ = swapped_after_abort()
    persisted = state.persisted_form()
    assert persisted.given_back == state.given_back
    restarted = SubscriptionState(0, Cursor.from_snapshot(persisted.cursor))
    restarted.given_back = persisted.given_back  # as the actor's recovery does
    restarted.delivered_through = P(ENTRIES - 1)  # anything readable may have been delivered
    with pytest.raises(NotAllowed, match="given back"):
        restarted.prepare_ack(T2, [(P(5), 0, 1)], cumulative=True)
    restarted.add_consumer("b", "b", ConsumerType.Exclusive, 0.0)
    assert read_and_take(restarted, "b") == [0, 1, 2, 3, 4, 5]
    assert restarted.prepare_ack(T2, [(P(5), 0, 1)], cumulative=True) is not None


def test_a_retry_of_a_logged_ack_call_is_not_refused() -> None:
    """The consumer's retry of a call whose reply was lost repeats its request id: it is done
    already, whatever was given back since."""
    state, log = SubscriptionState(0, Cursor()), Log()
    state.add_consumer("a", "a", ConsumerType.Exclusive, 0.0)
    assert read_and_take(state, "a") == [0, 1, 2, 3, 4, 5]
    log.apply(state, state.prepare_ack(T1, [(P(4), 0, 1)], cumulative=True, request="call-1"))
    state.remove_consumer("a")  # gives back 5
    assert state.given_back is not None
    assert state.prepare_ack(T1, [(P(4), 0, 1)], cumulative=True, request="call-1") is None
