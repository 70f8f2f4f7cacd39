"""PendingAck: transactional acks kept apart from the cursor until commit; conflicts, abort undo,
the log index that trims the pending-ack log, and replay equal to live operation."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from raytxn.errors import (
    CorruptLedger,
    InvalidArgument,
    InvalidTxnState,
    NotAllowed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionConflict,
)
from raytxn.ids import Position, TxnID
from raytxn.protocol.cursor import Cursor, position_before
from raytxn.protocol.pending_ack import (
    AbortRecord,
    Ack,
    AckKind,
    AckRecord,
    CommitRecord,
    PendingAck,
    PendingAckLogIndex,
    Record,
    Redelivery,
    decode_record,
    encode_record,
)

INDIVIDUAL, CUMULATIVE = AckKind.INDIVIDUAL, AckKind.CUMULATIVE
T1, T2, T3 = TxnID(1, 1), TxnID(1, 2), TxnID(2, 7)
EVERYTHING = Position(1 << 40, 0)  # "delivered" = everything up to here


def P(ledger: int, entry: int) -> Position:
    return Position(ledger, entry)


def ack_set(text: str) -> int:
    """Pulsar's notation, index 0 first: T = still unacked (bit set), F = acked."""
    return sum(1 << index for index, char in enumerate(text) if char == "T")


class Sub:
    """The subscription's side of prepare -> log -> apply, with the log kept in memory. Every ack
    call gets a new request id unless given one, as the consumer's calls do."""

    def __init__(self, cursor: Cursor | None = None) -> None:
        self.cursor = cursor or Cursor(P(0, -1))
        self.start = self.cursor.snapshot()
        self.pending = PendingAck(self.cursor)
        self.log: list[Record] = []
        self._request_ids = itertools.count()
        self.last_call: tuple | None = None  # (txn, kind, acks, delivered, request) of the last call that passed

    def replayed(self) -> PendingAck:
        """A restart: a fresh cursor from the starting snapshot, and the whole log replayed."""
        pending = PendingAck(Cursor.from_snapshot(self.start))
        for record in self.log:
            pending.apply(record)
        pending.check_invariants()
        return pending

    def _log_apply(self, record: Record | None) -> Redelivery | None:
        if record is None:
            return None
        record = decode_record(encode_record(record))  # through the bytes, as the ledger would
        self.log.append(record)
        return self.pending.apply(record)

    def call(self, txn: TxnID, kind: AckKind, acks: list, delivered: object = EVERYTHING,
             request: str | None = None) -> AckRecord | None:
        request = f"r{next(self._request_ids)}" if request is None else request
        record = self.pending.prepare_ack(txn, kind, acks, delivered, request)  # type: ignore[arg-type]
        self.last_call = (txn, kind, acks, delivered, request)
        self._log_apply(record)
        return record

    def ack(self, txn: TxnID, *acks: Ack | tuple, delivered: object = EVERYTHING) -> AckRecord | None:
        return self.call(txn, INDIVIDUAL, list(acks), delivered)

    def cumulative(self, txn: TxnID, position: Position, index: int | None = None, size: int | None = None,
                   delivered: object = EVERYTHING) -> AckRecord | None:
        return self.call(txn, CUMULATIVE, [(position,) if index is None else (position, index, size)], delivered)

    def retry(self) -> AckRecord | None:
        """The last call again, with its request id (a client retry after a lost reply)."""
        assert self.last_call is not None
        txn, kind, acks, delivered, request = self.last_call
        return self.call(txn, kind, acks, delivered, request)

    def commit(self, txn: TxnID) -> CommitRecord | None:
        record = self.pending.prepare_commit(txn)
        self._log_apply(record)
        return record

    def abort(self, txn: TxnID) -> Redelivery | None:
        return self._log_apply(self.pending.prepare_abort(txn))


# --- the seed's worked example -----------------------------------------------------------------


def test_batch_ack_sets_merge_and_abort_restores_exactly() -> None:
    sub = Sub()
    position = P(1, 5)
    for txn, text in ((T1, "TTTF"), (T1, "TTFT"), (T2, "TFTT")):
        (index,) = [i for i, char in enumerate(text) if char == "F"]
        sub.ack(txn, (position, index, 4))
    assert sub.pending.pending_ack_set(position, 4) == ack_set("TFFF")  # the AND of the three
    redelivery = sub.abort(T2)
    assert redelivery == Redelivery(((position, (1,)),))
    assert sub.pending.pending_ack_set(position, 4) == ack_set("TTFF")  # exactly txn1's acks undone
    assert sub.cursor.partial_batch(position) is None  # nothing reached the cursor yet
    sub.commit(T1)
    assert sub.cursor.partial_batch(position) == (4, ack_set("TTFF"))
    assert sub.pending.pending_ack_set(position, 4) == ack_set("TTFF")
    sub.pending.check_invariants()


# --- conflicts ---------------------------------------------------------------------------------


def test_two_txns_acking_the_same_message_conflict() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1),))
    with pytest.raises(TransactionConflict, match=r"pending in txn\(1,1\)"):
        sub.ack(T2, (P(1, 1),))
    with pytest.raises(TransactionConflict):  # the whole record is refused, nothing applied
        sub.ack(T2, (P(1, 2),), (P(1, 1),))
    assert sub.pending.held_by(P(1, 2)) is None
    sub.ack(T2, (P(1, 2),))


def test_batch_index_conflicts() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1), 0, 3))
    sub.ack(T2, (P(1, 1), 1, 3))  # another index of the same entry: fine
    with pytest.raises(TransactionConflict, match=r"batch index 0, which is pending in txn\(1,1\)"):
        sub.ack(T2, (P(1, 1), 0, 3))
    with pytest.raises(TransactionConflict):  # the whole entry: another txn holds indexes of it
        sub.ack(T2, (P(1, 1),))
    sub.ack(T3, (P(1, 2),))
    with pytest.raises(TransactionConflict, match=r"txn\(2,7\)"):  # an index of an entry held whole
        sub.ack(T1, (P(1, 2), 0, 3))
    with pytest.raises(InvalidArgument):  # batch size disagrees with the one pending
        sub.ack(T1, (P(1, 1), 2, 4))


def test_acking_what_the_cursor_acked_conflicts() -> None:
    sub = Sub()
    sub.cursor.ack(P(1, 1))
    sub.cursor.ack(P(1, 2), 0, 2)
    with pytest.raises(TransactionConflict, match="already acked"):
        sub.ack(T1, (P(1, 1),))
    with pytest.raises(TransactionConflict, match="already acked"):
        sub.ack(T1, (P(1, 2), 0, 2))
    sub.cursor.ack(P(0, 0))  # below the mark-delete position now
    with pytest.raises(TransactionConflict, match="already acked"):
        sub.ack(T1, (P(0, 0),))
    sub.ack(T1, (P(1, 2), 1, 2))  # the other index is free
    sub.ack(T2, (P(1, 3),))


def test_never_delivered_is_not_allowed() -> None:
    sub = Sub()
    with pytest.raises(NotAllowed, match="never delivered"):
        sub.ack(T1, (P(1, 9),), delivered=P(1, 8))  # the highest dispatched position
    with pytest.raises(NotAllowed, match="never delivered"):
        sub.ack(T1, (P(1, 2),), delivered=lambda position: position != P(1, 2))  # a skipped marker
    with pytest.raises(NotAllowed, match="never delivered"):
        sub.cumulative(T1, P(1, 9), delivered=P(1, 8))
    assert sub.pending.pending_txns() == [] and sub.log == []


def test_repeated_acks_in_one_txn_are_idempotent() -> None:
    sub = Sub()
    assert sub.ack(T1, (P(1, 1), 2, 3)) is not None
    assert sub.ack(T1, (P(1, 1), 2, 3)) is None  # nothing to log
    record = sub.ack(T1, (P(1, 1), 2, 3), (P(1, 1), 0, 3), (P(1, 1), 0, 3))
    assert record is not None and record.acks == (Ack(P(1, 1), 0, 3),)
    sub.ack(T1, (P(1, 1),))  # upgrade to the whole entry
    assert sub.ack(T1, (P(1, 1), 1, 3)) is None
    assert sub.pending.pending_of(T1) == ([Ack(P(1, 1))], None)
    sub.ack(T1, (P(1, 4), 0, 2), (P(1, 4), 1, 2))
    assert sub.ack(T1, (P(1, 4),)) is None  # every index held: so is the entry
    assert len(sub.log) == 4


def test_cumulative_acks() -> None:
    sub = Sub()
    sub.ack(T2, (P(1, 8),))
    assert sub.cumulative(T1, P(1, 5)) is not None
    assert sub.pending.held_by(P(1, 3)) == T1
    assert sub.retry() is None  # a retry of that call: done, nothing logged
    with pytest.raises(TransactionConflict, match="at or below its own"):  # a new call at the same position
        sub.cumulative(T1, P(1, 5))
    with pytest.raises(TransactionConflict, match="below its own"):
        sub.cumulative(T1, P(1, 4))
    with pytest.raises(TransactionConflict, match=r"txn\(1,1\) holds a pending cumulative"):
        sub.cumulative(T2, P(1, 9))
    with pytest.raises(TransactionConflict, match=r"over messages pending in txn\(1,2\)"):
        sub.cumulative(T1, P(1, 8))
    with pytest.raises(TransactionConflict, match=r"pending in txn\(1,1\)"):  # under T1's cumulative
        sub.ack(T3, (P(1, 2),))
    assert sub.ack(T1, (P(1, 2),)) is None  # under its own cumulative: nothing new
    sub.cumulative(T1, P(1, 7))  # moving it up
    assert sub.pending.pending_of(T1) == ([], P(1, 7))
    sub.commit(T1)
    assert sub.cursor.mark_delete_position == P(1, 7)
    with pytest.raises(TransactionConflict, match="mark-delete"):
        sub.cumulative(T3, P(1, 7))
    with pytest.raises(TransactionConflict, match=r"txn\(1,2\)"):  # T2's individual ack of (1, 8) is below
        sub.cumulative(T3, P(1, 9))
    sub.commit(T2)
    sub.cumulative(T3, P(1, 9))
    sub.pending.check_invariants()


def test_cumulative_over_another_txns_individual_ack_conflicts() -> None:
    sub = Sub()
    sub.ack(T2, (P(1, 3), 1, 2))
    with pytest.raises(TransactionConflict, match=r"txn\(1,2\)"):
        sub.cumulative(T1, P(1, 3))
    sub.cumulative(T1, P(1, 2))
    sub.ack(T1, (P(1, 3), 0, 2))  # T1's own individual ack above its cumulative
    sub.pending.check_invariants()


def test_a_retried_call_is_done_and_a_new_call_at_the_same_cumulative_ack_conflicts_after_replay_too() -> None:
    """Pulsar refuses a cumulative ack at or below the txn's own pending one; a retry of the very
    call that logged it (its reply lost) must still succeed: the request id tells them apart."""
    sub = Sub()
    sub.cumulative(T1, P(1, 4))
    first_call = sub.last_call
    sub.ack(T1, (P(1, 6),))
    for pending in (sub.pending, sub.replayed()):  # live, and rebuilt from the log after a restart
        txn, kind, acks, delivered, request = first_call  # type: ignore[misc]
        assert pending.prepare_ack(txn, kind, acks, delivered, request) is None
        with pytest.raises(TransactionConflict, match="at or below its own"):
            pending.prepare_ack(T1, CUMULATIVE, [(P(1, 4),)], EVERYTHING, "a-new-call")
        with pytest.raises(TransactionConflict, match="at or below its own"):
            pending.prepare_ack(T1, CUMULATIVE, [(P(1, 3),)], EVERYTHING, "another-call")
        with pytest.raises(TransactionConflict, match="at or below its own"):  # no request id: a new call
            pending.prepare_ack(T1, CUMULATIVE, [(P(1, 4),)], EVERYTHING)
        assert pending.prepare_ack(T1, CUMULATIVE, [(P(1, 5),)], EVERYTHING, "up") is not None
        with pytest.raises(TransactionConflict, match=r"txn\(1,1\) holds a pending cumulative ack up to <1,4>"):
            pending.prepare_ack(T2, CUMULATIVE, [(P(1, 9),)], EVERYTHING, "r-t2")
    sub.commit(T1)
    with pytest.raises(TransactionAlreadyCommitted):  # a retry after the end is not a success
        sub.retry()


def test_a_retry_of_a_logged_individual_call_logs_nothing() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1),), (P(1, 2), 0, 2))
    assert sub.retry() is None and sub.replayed().prepare_ack(*sub.last_call) is None  # type: ignore[misc]
    assert len(sub.log) == 1


def test_cumulative_acks_of_batch_indexes_order_by_index() -> None:
    """Pulsar compares a cumulative ack inside a batch with the pending one by its ack set: up to
    index 2 then up to index 1 of the same entry is a conflict; up to index 3 is progress."""
    sub = Sub()
    entry = P(1, 5)
    record = sub.cumulative(T1, entry, 1, 4)  # everything before the entry, and its indexes 0 and 1
    assert record == AckRecord(T1, CUMULATIVE, (Ack(entry, 1, 4),), record.request if record else None)
    assert [sub.pending.held_by(entry, index) for index in range(4)] == [T1, T1, None, None]
    assert sub.pending.held_by(P(1, 4)) == T1
    with pytest.raises(TransactionConflict, match="batch index 1, at or below its own"):
        sub.cumulative(T1, entry, 1, 4)
    with pytest.raises(TransactionConflict, match="at or below its own"):
        sub.cumulative(T1, entry, 0, 4)
    with pytest.raises(TransactionConflict, match="at or below its own"):
        sub.cumulative(T1, P(1, 4))  # the entry before: below index 1 of this one
    with pytest.raises(TransactionConflict, match=r"pending in txn\(1,1\)"):
        sub.ack(T2, (entry, 0, 4))
    sub.ack(T2, (entry, 2, 4))
    with pytest.raises(TransactionConflict, match=r"pending in txn\(1,2\)"):  # over T2's index 2
        sub.cumulative(T1, entry, 2, 4)
    sub.abort(T2)
    sub.cumulative(T1, entry, 2, 4)
    assert sub.pending.stats().cumulative == (T1, P(1, 4))
    sub.cumulative(T1, entry, 3, 4)  # the last index: the whole entry
    with pytest.raises(TransactionConflict, match="at or below its own"):
        sub.cumulative(T1, entry)  # ... which it holds already
    assert sub.pending.pending_of(T1) == ([Ack(entry, index, 4) for index in range(3)], entry)
    assert sub.abort(T1) == Redelivery(((entry, (0, 1, 2)),), entry)
    sub.cumulative(T3, entry, 0, 4)
    sub.commit(T3)
    assert sub.cursor.mark_delete_position == P(1, 4) and sub.cursor.partial_batch(entry) == (4, ack_set("FTTT"))
    sub.pending.check_invariants()


def test_txn_acks_of_messages_a_committed_txn_acked_conflict_after_replay_too() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 3),), (P(1, 5), 0, 3))
    sub.commit(T1)  # (1, 3) and index 0 of (1, 5) acked; (1, 0..2) and (1, 4) not
    for pending in (sub.pending, sub.replayed()):
        for call in ([(P(1, 3),)], [(P(1, 5), 0, 3)]):
            with pytest.raises(TransactionConflict, match="already acked"):
                pending.prepare_ack(T2, INDIVIDUAL, call, EVERYTHING, "i")
            with pytest.raises(TransactionConflict, match="already acked"):
                pending.prepare_ack(T2, CUMULATIVE, call, EVERYTHING, "c")
        # Past them is fine: a cumulative ack covers acked messages on its way.
        assert pending.prepare_ack(T2, CUMULATIVE, [(P(1, 4),)], EVERYTHING, "c") is not None
        assert pending.prepare_ack(T2, CUMULATIVE, [(P(1, 5), 1, 3)], EVERYTHING, "c") is not None
    sub.cumulative(T2, P(1, 5), 1, 3)
    assert sub.pending.held_by(P(1, 5), 1) == T2 and sub.pending.held_by(P(1, 5), 0) is None
    sub.commit(T2)
    with pytest.raises(TransactionConflict, match="mark-delete"):
        sub.cumulative(T3, P(1, 4))


# --- commit and abort --------------------------------------------------------------------------


def test_commit_makes_acks_permanent() -> None:
    sub = Sub()
    sub.ack(T1, (P(0, 1),), (P(0, 2), 1, 3))
    sub.ack(T2, (P(0, 0),))
    assert not sub.cursor.is_acked(P(0, 1))
    sub.commit(T1)
    assert sub.cursor.is_acked(P(0, 1)) and sub.cursor.is_acked(P(0, 2), 1) and not sub.cursor.is_acked(P(0, 2))
    assert sub.pending.pending_txns() == [T2] and sub.pending.held_by(P(0, 1)) is None
    assert sub.commit(T1) is None  # a second commit: nothing to log, success
    sub.pending.apply(CommitRecord(T1))  # and applying it again is harmless
    sub.commit(T2)
    assert sub.cursor.mark_delete_position == P(0, 1)
    assert sub.commit(T3) is None and sub.abort(TxnID(3, 3)) is None  # no acks here: no-op successes
    with pytest.raises(TransactionAlreadyCommitted):  # but remembered: a late ack is refused
        sub.ack(T3, (P(1, 1),))


def test_abort_returns_what_to_redeliver() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1),), (P(1, 2), 0, 3), (P(1, 2), 2, 3), (P(1, 3),), (P(1, 4),))
    sub.cursor.ack(P(1, 3), 1, 2)  # acked meanwhile (not through held_by, as an actor should): not redelivered
    redelivery = sub.abort(T1)
    assert redelivery == Redelivery(((P(1, 1), None), (P(1, 2), (0, 2)), (P(1, 3), (0,)), (P(1, 4), None)))
    assert sub.pending.pending_txns() == [] and sub.pending.stats().pending_positions == 0
    sub.ack(T2, (P(1, 1),))  # free again
    sub.cumulative(T3, P(1, 0))
    assert sub.abort(T3) == Redelivery((), P(1, 0))


def test_ended_txns_refuse_late_acks() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1),))
    sub.commit(T1)
    with pytest.raises(TransactionAlreadyCommitted):
        sub.ack(T1, (P(1, 2),))
    with pytest.raises(TransactionAlreadyCommitted):
        sub.pending.prepare_abort(T1)
    sub.ack(T2, (P(1, 2),))
    sub.abort(T2)
    with pytest.raises(TransactionAlreadyAborted):
        sub.ack(T2, (P(1, 2),))
    with pytest.raises(TransactionAlreadyAborted):
        sub.pending.prepare_commit(T2)


def test_low_watermark_finds_dangling_txns() -> None:
    sub = Sub()
    for sequence, entry in ((1, 1), (5, 2), (9, 3)):
        sub.ack(TxnID(1, sequence), (P(1, entry),))
    sub.ack(TxnID(2, 1), (P(1, 4),))
    assert sub.pending.pending_at_or_below(1, 5) == [TxnID(1, 1), TxnID(1, 5)]
    assert sub.pending.pending_at_or_below(2, 0) == []


def test_apply_refuses_records_that_break_the_rules() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1),))
    with pytest.raises(InvalidTxnState):  # two prepares raced: the second must not be applied
        sub.pending.apply(AckRecord(T2, INDIVIDUAL, (Ack(P(1, 2)), Ack(P(1, 1)))))
    assert sub.pending.held_by(P(1, 2)) is None
    sub.pending.check_invariants()


# --- plain acks next to pending ones -----------------------------------------------------------


def test_plain_cursor_moves_respect_pending_acks() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 3), 1, 2))
    assert sub.pending.held_by(P(1, 3)) == T1 and sub.pending.held_by(P(1, 3), 0) is None
    sub.pending.check_plain_cumulative(P(1, 2))
    with pytest.raises(TransactionConflict):
        sub.pending.check_plain_cumulative(P(1, 3))
    sub.pending.check_seek(P(1, 3))  # (1, 3) stays unacked
    with pytest.raises(TransactionConflict):
        sub.pending.check_seek(P(1, 4))
    sub.abort(T1)
    sub.cumulative(T2, P(1, 0))
    with pytest.raises(TransactionConflict):
        sub.pending.check_plain_cumulative(P(0, 0))


def test_stats() -> None:
    sub = Sub()
    sub.ack(T1, (P(1, 1),), (P(1, 2), 0, 3), (P(1, 2), 1, 3))
    sub.ack(T2, (P(1, 2), 2, 3))
    sub.cumulative(T3, P(1, 0))
    stats = sub.pending.stats()
    assert (stats.pending_txns, stats.pending_positions, stats.pending_batch_indexes) == (3, 2, 3)
    assert stats.cumulative == (T3, P(1, 0))
    assert [(s.txn, s.entries, s.batch_indexes, s.cumulative) for s in stats.per_txn] == [
        (T1, 1, 2, None), (T2, 0, 1, None), (T3, 0, 0, P(1, 0))]


# --- records -----------------------------------------------------------------------------------


def test_records_round_trip_and_corruption() -> None:
    records = [AckRecord(T1, INDIVIDUAL, (Ack(P(1, 2)), Ack(P(1, 3), 1, 4))),
               AckRecord(T1, CUMULATIVE, (Ack(P(1, 9)),)), AckRecord(T1, CUMULATIVE, (Ack(P(1, 9), 2, 4),), "r7"),
               CommitRecord(T2), AbortRecord(T3)]
    for record in records:
        assert decode_record(encode_record(record)) == record
    # A record logged before request ids existed still decodes (its request is None).
    old = msgspec.msgpack.encode({"type": "ack", "txn": [1, 1], "kind": "cumulative", "acks": [[[1, 2], None, None]]})
    assert decode_record(old) == AckRecord(T1, CUMULATIVE, (Ack(P(1, 2)),))
    with pytest.raises(CorruptLedger, match="subs/pa/7"):
        decode_record(b"\xc1", "subs/pa/7")
    bad_cumulative = msgspec.msgpack.encode(
        {"type": "ack", "txn": [1, 1], "kind": "cumulative", "acks": [[[1, 2], None, None], [[1, 3], None, None]]})
    with pytest.raises(CorruptLedger):
        decode_record(bad_cumulative)
    bad_index = msgspec.msgpack.encode({"type": "ack", "txn": [1, 1], "kind": "individual", "acks": [[[1, 2], 5, 4]]})
    with pytest.raises(CorruptLedger):
        decode_record(bad_index)
    with pytest.raises(InvalidArgument):
        encode_record("commit")  # type: ignore[arg-type]


def test_invalid_acks() -> None:
    sub = Sub()
    with pytest.raises(InvalidArgument):
        sub.ack(T1)
    with pytest.raises(InvalidArgument):
        sub.ack(T1, ((1, 2),))
    with pytest.raises(InvalidArgument):
        sub.ack(T1, (P(1, 2), 3, 3))
    sub.ack(T2, (P(1, 2), 0, 3))
    with pytest.raises(InvalidArgument, match="holds 3 messages"):
        sub.pending.prepare_ack(T1, CUMULATIVE, [(P(1, 2), 1, 4)], EVERYTHING)
    with pytest.raises(InvalidArgument):
        sub.pending.prepare_ack(T1, CUMULATIVE, [(P(1, 2),), (P(1, 3),)], EVERYTHING)
    for request in ("", 7, "x" * 129):
        with pytest.raises(InvalidArgument, match="request id"):
            sub.pending.prepare_ack(T1, INDIVIDUAL, [(P(1, 3),)], EVERYTHING, request)  # type: ignore[arg-type]
    assert sub.pending.pending_txns() == [T2]
    with pytest.raises(InvalidArgument):
        sub.pending.prepare_ack(T1, "sideways", [(P(1, 2),)], EVERYTHING)  # type: ignore[arg-type]


# --- log index ---------------------------------------------------------------------------------


def test_log_index_trim_point_seed_example() -> None:
    """The cursor's mark-delete at <1,3>: everything in the log up to the record that covered <1,3>
    may go; the record of <1,5> (still pending) stays."""
    sub = Sub(Cursor(P(1, -1)))
    index = PendingAckLogIndex(max_index_lag=1)
    for entry in (0, 1, 2, 3, 5):
        sub.ack(T1 if entry < 5 else T2, (P(1, entry),))
        index.on_logged(sub.log[-1], P(9, len(sub.log) - 1))
    sub.commit(T1)
    index.on_logged(sub.log[-1], P(9, len(sub.log) - 1))
    assert sub.cursor.mark_delete_position == P(1, 3)
    assert index.trim_point(sub.cursor.mark_delete_position) == P(9, 3)  # the record of <1,3>
    assert index.trim_point(P(1, 2)) == P(9, 2) and index.trim_point(P(0, 9)) is None
    index.on_trimmed(P(9, 3))
    assert len(index) == 1 and index.trim_point(P(1, 3)) is None


def test_log_index_with_lag() -> None:
    index = PendingAckLogIndex(max_index_lag=2)
    for number, entry in enumerate((4, 1, 6, 2, 3)):
        index.on_logged(AckRecord(T1, INDIVIDUAL, (Ack(P(1, entry)),)), P(9, number))
        index.on_logged(CommitRecord(T1), P(9, 100 + number))  # not counted
    # entries: max <1,4> -> log <9,1>; max <1,6> -> log <9,3>
    assert index.trim_point(P(1, 3)) is None
    assert index.trim_point(P(1, 5)) == P(9, 1)
    assert index.trim_point(P(1, 6)) == P(9, 3)
    with pytest.raises(InvalidArgument):
        PendingAckLogIndex(0)


# --- property test against a naive model -------------------------------------------------------

# The stream: ledger 0 and ledger 2 (ledger 1 was never used), markers at <0,2> and <2,3>.
REAL = [P(0, entry) for entry in range(5)] + [P(2, entry) for entry in range(5)]
SKIPPED = {P(0, 2), P(2, 3)}
DELIVERED = [position for position in REAL if position not in SKIPPED]
TXNS = [TxnID(1, sequence) for sequence in range(10)]


def size_of(position: Position) -> int:
    return 3 if (position.ledger_id + position.entry_id) % 2 == 0 else 1


def all_indexes(position: Position) -> set[tuple[Position, int]]:
    return {(position, index) for index in range(size_of(position))}


WHOLE = 1 << 62


class Model:
    """Sets of (entry, index). A cumulative ack of batch index i of an entry holds the entries
    before it whole (``cumulative``: txn, last entry covered, how far its ack reaches) and indexes
    0..i one by one (in ``held``)."""

    def __init__(self) -> None:
        self.acked: set[tuple[Position, int]] = set()
        self.held: dict[tuple[Position, int], TxnID] = {}
        self.cumulative: tuple[TxnID, Position, tuple[Position, int]] | None = None
        self.ended: dict[TxnID, bool] = {}

    def holder(self, item: tuple[Position, int]) -> TxnID | None:
        if item in self.acked:
            return None
        if self.cumulative is not None and item[0] <= self.cumulative[1]:
            return self.cumulative[0]
        return self.held.get(item)

    def all_acked_through(self, position: Position) -> bool:
        return all(item in self.acked for q in DELIVERED if q <= position for item in all_indexes(q))

    def pending(self) -> set[TxnID]:
        return set(self.held.values()) | ({self.cumulative[0]} if self.cumulative else set())

    def acks_of(self, txn: TxnID) -> set[tuple[Position, int]]:
        items = {item for item, holder in self.held.items() if holder == txn}
        if self.cumulative is not None and self.cumulative[0] == txn:
            items |= {item for q in DELIVERED if q <= self.cumulative[1] for item in all_indexes(q)}
        return items - self.acked

    def end(self, txn: TxnID, committed: bool) -> None:
        if committed:
            self.acked |= self.acks_of(txn)
        self.held = {item: holder for item, holder in self.held.items() if holder != txn}
        if self.cumulative is not None and self.cumulative[0] == txn:
            self.cumulative = None
        self.ended[txn] = committed


def expect_ack(model: Model, txn: TxnID, position: Position, index: int | None) -> type | None:
    """The error the model predicts (None: success), applying the ack to the model on success."""
    if model.ended.get(txn) is not None:
        return TransactionAlreadyCommitted if model.ended[txn] else TransactionAlreadyAborted
    if position not in DELIVERED:
        return NotAllowed
    targets = all_indexes(position) if index is None else {(position, index)}
    if targets <= model.acked:
        return TransactionConflict
    if any(model.holder(item) not in (None, txn) for item in targets):
        return TransactionConflict
    for item in targets:
        if model.holder(item) is None:
            model.held[item] = txn
    return None


def expect_cumulative(model: Model, txn: TxnID, position: Position, index: int | None) -> type | None:
    """As ``expect_ack``, for a cumulative ack up to the entry, or up to a batch index of it (the
    last index: the whole entry)."""
    if model.ended.get(txn) is not None:
        return TransactionAlreadyCommitted if model.ended[txn] else TransactionAlreadyAborted
    if position not in DELIVERED:
        return NotAllowed
    if index == size_of(position) - 1:
        index = None
    named = all_indexes(position) if index is None else {(position, index)}
    if named <= model.acked:  # (at or below mark-delete, or acked on its own)
        return TransactionConflict
    point = (position, WHOLE if index is None else index)
    if model.cumulative is not None and (model.cumulative[0] != txn or point <= model.cumulative[2]):
        return TransactionConflict
    cover = position if index is None else position_before(position)
    in_entry = set() if index is None else {(position, i) for i in range(index + 1)} - model.acked
    if any(holder != txn and (item[0] <= cover or item in in_entry) for item, holder in model.held.items()):
        return TransactionConflict
    if model.cumulative is not None:
        cover = max(cover, model.cumulative[1])
    model.cumulative = (txn, cover, point)
    for item in in_entry:
        model.held.setdefault(item, txn)
    return None


def compare(sub: Sub, model: Model) -> None:
    sub.cursor.check_invariants()
    sub.pending.check_invariants()
    for position in REAL:
        for item in all_indexes(position):
            acked = item in model.acked or position in SKIPPED
            assert sub.cursor.is_acked(*item) == acked, item
            if not acked:
                assert sub.pending.held_by(*item) == model.holder(item), item
    assert set(sub.pending.pending_txns()) == model.pending()


def pending_state(pending: PendingAck) -> object:
    return [(txn, pending.pending_of(txn)) for txn in pending.pending_txns()], pending.stats()


ack_op = st.tuples(st.just("ack"), st.sampled_from(TXNS), st.sampled_from(DELIVERED), st.none() | st.integers(0, 2))
operation = st.one_of(
    ack_op, ack_op, ack_op,
    st.tuples(st.just("ack"), st.sampled_from(TXNS), st.sampled_from(sorted(SKIPPED)), st.none()),
    st.tuples(st.just("cumulative"), st.sampled_from(TXNS), st.sampled_from(REAL), st.none() | st.integers(0, 2)),
    st.tuples(st.just("retry")),
    st.tuples(st.just("commit"), st.sampled_from(TXNS)),
    st.tuples(st.just("commit"), st.sampled_from(TXNS)),
    st.tuples(st.just("abort"), st.sampled_from(TXNS)),
    st.tuples(st.just("plain"), st.sampled_from(DELIVERED), st.none() | st.integers(0, 2)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("drain")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, min_size=10, max_size=60))
def test_pending_ack_matches_a_set_model_and_replay_equals_live(ops: list[tuple]) -> None:
    sub = Sub(Cursor(P(0, -1)))
    for start, end in [(P(0, 2), P(0, 3)), (P(0, 5), P(2, 0)), (P(2, 3), P(2, 4))]:
        sub.cursor.ack_range(start, end)  # what the subscription does for markers and ledger ends
    model = Model()
    index = PendingAckLogIndex(max_index_lag=2)
    log_positions: list[Position] = []
    # Cursor snapshots with the log length they include; plain acks are not in the pending-ack
    # log, so each one is followed by a snapshot (as the actor persists the cursor).
    snapshots = [(sub.cursor.snapshot(), 0)]

    def logged() -> None:
        while len(log_positions) < len(sub.log):
            log_positions.append(P(50, len(log_positions)))
            index.on_logged(sub.log[len(log_positions) - 1], log_positions[-1])

    for op in ops:
        kind = op[0]
        if kind == "ack":
            _, txn, position, index_ = op
            batch = None if index_ is None else (index_ % size_of(position), size_of(position))
            expected = expect_ack(model, txn, position, None if batch is None else batch[0])
            ack = (position,) if batch is None else (position, *batch)
            event(f"ack: {expected.__name__ if expected else 'ok'}")
            if expected is None:
                sub.ack(txn, ack, delivered=lambda q: q in DELIVERED)
            else:
                with pytest.raises(expected):
                    sub.ack(txn, ack, delivered=lambda q: q in DELIVERED)
        elif kind == "cumulative":
            _, txn, position, index_ = op
            batch = (None, None) if index_ is None else (index_ % size_of(position), size_of(position))
            expected = expect_cumulative(model, txn, position, batch[0])
            event(f"cumulative: {expected.__name__ if expected else 'ok'}")
            if expected is None:
                assert sub.cumulative(txn, position, *batch, delivered=lambda q: q in DELIVERED) is not None
            else:
                with pytest.raises(expected):
                    sub.cumulative(txn, position, *batch, delivered=lambda q: q in DELIVERED)
        elif kind == "retry":  # the last call that passed, again: done (nothing to log) while its txn is open
            if sub.last_call is None:
                continue
            ended = model.ended.get(sub.last_call[0])
            event(f"retry: {ended}")
            if ended is None:
                assert sub.retry() is None
            else:
                with pytest.raises(TransactionAlreadyCommitted if ended else TransactionAlreadyAborted):
                    sub.retry()
        elif kind in ("commit", "abort"):
            txn, committed = op[1], kind == "commit"
            if model.ended.get(txn) is (not committed):
                with pytest.raises(TransactionAlreadyAborted if committed else TransactionAlreadyCommitted):
                    sub.commit(txn) if committed else sub.abort(txn)
                continue
            individual = {item for item, holder in model.held.items() if holder == txn} - model.acked
            cumulative = model.cumulative[1] if model.cumulative and model.cumulative[0] == txn else None
            model.end(txn, committed)
            result = sub.commit(txn) if committed else sub.abort(txn)
            event(f"{kind}: {'no-op' if result is None and committed else 'done'}")
            if not committed and result is not None:
                redelivered = set()
                for position, indexes in result.messages:
                    redelivered |= all_indexes(position) if indexes is None else {(position, i) for i in indexes}
                assert redelivered == individual
                still_unacked = cumulative is not None and not model.all_acked_through(cumulative)
                assert result.cumulative_through == (cumulative if still_unacked else None)
        elif kind == "drain":  # consumption caught up: every pending txn commits
            for txn in sorted(model.pending()):
                model.end(txn, committed=True)
                assert sub.commit(txn) is not None
            event(f"drain: mark-delete {sub.cursor.mark_delete_position}")
        elif kind == "plain":
            _, position, index_ = op
            targets = all_indexes(position) if index_ is None else {(position, index_ % size_of(position))}
            holder = sub.pending.held_by(position, None if index_ is None else index_ % size_of(position))
            assert (holder is not None) == any(model.holder(item) is not None for item in targets)
            if holder is None:  # Pulsar ignores a plain ack of a message held by a transaction
                if index_ is None:
                    sub.cursor.ack(position)
                else:
                    sub.cursor.ack(position, index_ % size_of(position), size_of(position))
                model.acked |= targets
            # Plain acks are not in the pending-ack log: older snapshots cannot be replayed to now.
            snapshots = [(sub.cursor.snapshot(), len(sub.log))]
        else:
            snapshots.append((sub.cursor.snapshot(), len(sub.log)))
        logged()
        compare(sub, model)
        # The log index never lets a record of a pending transaction be trimmed.
        trim = index.trim_point(sub.cursor.mark_delete_position)
        for log_position, record in zip(log_positions, sub.log, strict=True):
            if isinstance(record, AckRecord) and record.txn in model.pending():
                assert trim is None or log_position > trim

    # Replay: a cursor restored from a snapshot plus the log trimmed as of that snapshot gives the
    # live state; with the snapshot flag and without (no seeks here, so re-applied commits are no-ops).
    live = (sub.cursor.snapshot(), pending_state(sub.pending))
    for snapshot, included in snapshots:
        prefix_index = PendingAckLogIndex(max_index_lag=2)
        for log_position, record in zip(log_positions[:included], sub.log[:included], strict=True):
            prefix_index.on_logged(record, log_position)
        trim = prefix_index.trim_point(Cursor.from_snapshot(snapshot).mark_delete_position)
        event(f"replay: trimmed log {trim is not None}")
        for use_flag in (True, False):
            cursor = Cursor.from_snapshot(snapshot)
            replayed = PendingAck(cursor)
            for number, (log_position, record) in enumerate(zip(log_positions, sub.log, strict=True)):
                if trim is None or log_position > trim:
                    replayed.apply(record, in_cursor_snapshot=use_flag and number < included)
            replayed.check_invariants()
            assert (cursor.snapshot(), pending_state(replayed)) == live
            for record in sub.log:  # a retry of any logged call of an open txn is still recognised
                if isinstance(record, AckRecord) and record.txn in model.pending():
                    retry = (record.txn, record.kind, record.acks, EVERYTHING, record.request)
                    assert replayed.prepare_ack(*retry) is None


def test_replay_after_a_backward_seek_needs_the_snapshot_flag() -> None:
    sub = Sub()
    sub.ack(T1, (P(0, 0),), (P(0, 1),))
    sub.commit(T1)
    sub.pending.check_seek(P(0, 0))
    sub.cursor.seek(P(0, 0))  # redeliver everything
    snapshot, included = sub.cursor.snapshot(), len(sub.log)
    sub.ack(T2, (P(0, 1),))
    cursor = Cursor.from_snapshot(snapshot)
    replayed = PendingAck(cursor)
    for number, record in enumerate(sub.log):
        replayed.apply(record, in_cursor_snapshot=number < included)
    assert cursor.snapshot() == sub.cursor.snapshot() and not cursor.is_acked(P(0, 0))
    assert pending_state(replayed) == pending_state(sub.pending)
