"""The coordinator's pure state machine and its log records: every transition, every error,
fencing, timeouts, the low watermark, checkpoints and replay."""

from __future__ import annotations

import msgspec
import pytest

from raytxn.errors import (
    ConcurrentTransactions,
    CorruptLedger,
    Fenced,
    InvalidArgument,
    InvalidTopicName,
    InvalidTxnState,
    NotAllowed,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionNotFound,
    TransactionTimedOut,
)
from raytxn.ids import TxnID
from raytxn.protocol.coordinator_state import (
    VALID_PREVIOUS_STATES,
    CoordinatorState,
    EndResult,
    TxnMeta,
    describe_txn,
)
from raytxn.protocol.txnlog import (
    AbortReason,
    AddPartitions,
    AddSubscriptions,
    Checkpoint,
    EndAction,
    NewTxn,
    Outcome,
    Record,
    RegisterTransactionalId,
    TxnState,
    UpdateState,
    decode_batch,
    decode_record,
    encode_batch,
    encode_record,
)

TC = 0
T0 = 1_000_000  # "now" of most tests, in ms
COMMIT, ABORT = EndAction.COMMIT, EndAction.ABORT


class Harness:
    """Drives a CoordinatorState as the actor would: prepare, encode to the log, decode, apply."""

    def __init__(self, **config: int) -> None:
        self.config = config
        self.state = CoordinatorState(TC, **config)
        self.log: list[bytes] = []

    def log_apply(self, *records: Record | None) -> None:
        for record in records:
            if record is not None:
                data = encode_record(record)
                self.log.append(data)
                self.state.apply(decode_record(data))

    def new(self, now: int = T0, timeout: int = 1000, owner: str = "alice", tid: str | None = None,
            epoch: int | None = None) -> TxnID:
        record = self.state.prepare_new_txn(now, timeout, owner, tid, epoch)
        self.log_apply(record)
        return record.txn

    def add(self, txn: TxnID, partitions: list, now: int = T0, owner: str = "alice",
            epoch: int | None = None) -> AddPartitions | None:
        record = self.state.prepare_add_partitions(txn, partitions, owner, now, epoch)
        self.log_apply(record)
        return record

    def ack(self, txn: TxnID, subscriptions: list, now: int = T0, owner: str = "alice",
            epoch: int | None = None) -> AddSubscriptions | None:
        record = self.state.prepare_add_subscriptions(txn, subscriptions, owner, now, epoch)
        self.log_apply(record)
        return record

    def end(self, txn: TxnID, action: EndAction, now: int = T0, owner: str = "alice",
            epoch: int | None = None) -> EndResult:
        result = self.state.prepare_end(txn, action, owner, now, epoch)
        self.log_apply(result.record)
        return result

    def complete(self, txn: TxnID, now: int = T0) -> UpdateState | None:
        record = self.state.prepare_complete(txn, now)
        self.log_apply(record)
        return record

    def finish(self, txn: TxnID, action: EndAction, now: int = T0, **kwargs) -> None:
        self.end(txn, action, now, **kwargs)
        self.complete(txn, now)

    def register(self, tid: str, now: int = T0) -> int:
        records = self.state.prepare_register_transactional_id(tid, now)
        decoded = decode_batch(encode_batch(records))
        self.log_apply(*decoded)
        return records[-1].epoch

    def fire_timeouts(self, now: int) -> list[TxnID]:
        due = self.state.expired(now)
        for txn in due:
            self.log_apply(self.state.prepare_timeout(txn, now))
        return due

    def replayed(self, log: list[bytes] | None = None) -> CoordinatorState:
        fresh = CoordinatorState(TC, **self.config)
        fresh.replay(decode_record(data) for data in (self.log if log is None else log))
        fresh.check_invariants()
        return fresh


def snapshot(state: CoordinatorState) -> tuple:
    return (state.live_txns(), state.next_sequence, state.transactional_ids(), state.recent_outcomes(),
            state.low_watermark, state.next_deadline_ms())


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- records and their encoding ------------------------------------------------------------


ALL_RECORDS: list[Record] = [
    NewTxn(TxnID(0, 1), "alice", 500, T0),
    NewTxn(TxnID(1, 2), "bob", 500, T0, "pipeline-1", 3),
    AddPartitions(TxnID(0, 1), (("orders", 0), ("orders", 3)), T0),
    AddSubscriptions(TxnID(0, 1), (("orders", 0, "billing"),), T0),
    UpdateState(TxnID(0, 1), TxnState.COMMITTING, T0),
    UpdateState(TxnID(0, 1), TxnState.ABORTING, T0, AbortReason.TIMEOUT),
    RegisterTransactionalId("pipeline-1", 4, T0),
    Checkpoint(7, {"pipeline-1": 4}, [(1, Outcome.COMMITTED), (2, Outcome.FENCED)]),
]


@pytest.mark.parametrize("record", ALL_RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips(record: Record) -> None:
    data = encode_record(record)
    assert isinstance(data, bytes)
    assert decode_record(data) == record


def test_batch_round_trips() -> None:
    assert decode_batch(encode_batch(ALL_RECORDS)) == ALL_RECORDS


@pytest.mark.parametrize("data", [b"", b"\xc1", b"garbage!", msgspec.msgpack.encode({"type": "nope"}),
                                  msgspec.msgpack.encode({"type": "new_txn", "txn": [0, 1]})])
def test_undecodable_record_is_corrupt_ledger(data: bytes) -> None:
    with pytest.raises(CorruptLedger, match="undecodable") as info:
        decode_record(data, path="tc-0/log/00001")
    assert info.value.path == "tc-0/log/00001"
    with pytest.raises(CorruptLedger):
        decode_batch(data)


def test_encoding_a_non_record_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        encode_record({"type": "new_txn"})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        encode_batch([ALL_RECORDS[0], "x"])  # type: ignore[list-item]


# --- new transactions --------------------------------------------------------------------------


def test_new_txn_gets_increasing_sequences_and_a_deadline(h: Harness) -> None:
    txns = [h.new(now=T0 + i, timeout=100 * (i + 1)) for i in range(3)]
    assert txns == [TxnID(TC, 0), TxnID(TC, 1), TxnID(TC, 2)]
    meta = h.state.get(txns[2])
    assert meta == TxnMeta(txn=TxnID(TC, 2), state=TxnState.OPEN, owner="alice", timeout_ms=300,
                           start_ms=T0 + 2, deadline_ms=T0 + 302, last_modified_ms=T0 + 2)
    assert h.state.next_sequence == 3
    h.state.check_invariants()


def test_prepare_changes_no_durable_state_but_never_hands_out_a_sequence_twice(h: Harness) -> None:
    h.new()
    before = snapshot(h.state)
    first = h.state.prepare_new_txn(T0, 100, "alice")
    second = h.state.prepare_new_txn(T0, 100, "bob")
    assert snapshot(h.state) == before
    assert first.txn.sequence == 1 and second.txn.sequence == 2
    h.log_apply(second)  # the first one never got logged: a gap, never a reuse
    assert h.new().sequence == 3
    with pytest.raises(InvalidTxnState, match="sequence already used"):
        h.state.apply(first)


@pytest.mark.parametrize("timeout", [0, -5, 15 * 60 * 1000 + 1, True, 1.5, "10"])
def test_bad_timeout_is_invalid_argument(h: Harness, timeout: object) -> None:
    with pytest.raises(InvalidArgument):
        h.state.prepare_new_txn(T0, timeout, "alice")  # type: ignore[arg-type]


def test_max_timeout_is_configurable() -> None:
    state = CoordinatorState(TC, max_timeout_ms=50)
    assert state.prepare_new_txn(T0, 50, "alice").timeout_ms == 50
    with pytest.raises(InvalidArgument, match=r"1\.\.50"):
        state.prepare_new_txn(T0, 51, "alice")


@pytest.mark.parametrize("kwargs", [{"owner": ""}, {"owner": None}, {"now_ms": -1}, {"epoch": 0}])
def test_bad_new_txn_arguments(h: Harness, kwargs: dict) -> None:
    args = {"now_ms": T0, "timeout_ms": 100, "owner": "alice", **kwargs}
    with pytest.raises(InvalidArgument):
        h.state.prepare_new_txn(**args)


# --- adding participants -------------------------------------------------------------------


def test_add_partitions_keeps_order_and_drops_duplicates(h: Harness) -> None:
    txn = h.new()
    record = h.add(txn, [("b", 1), ("a", 0), ("b", 1)], now=T0 + 5)
    assert record == AddPartitions(txn, (("b", 1), ("a", 0)), T0 + 5)
    h.add(txn, [["a", 0], ("c", 2)], now=T0 + 7)
    meta = h.state.get(txn)
    assert meta.partitions == (("b", 1), ("a", 0), ("c", 2))
    assert meta.last_modified_ms == T0 + 7


def test_add_of_registered_participants_logs_nothing(h: Harness) -> None:
    txn = h.new()
    h.add(txn, [("a", 0)])
    h.ack(txn, [("a", 0, "sub")])
    logged = len(h.log)
    assert h.add(txn, [("a", 0)], now=T0 + 9) is None
    assert h.add(txn, []) is None
    assert h.ack(txn, [("a", 0, "sub"), ["a", 0, "sub"]]) is None
    assert len(h.log) == logged
    assert h.state.get(txn).last_modified_ms == T0


def test_add_subscriptions(h: Harness) -> None:
    txn = h.new()
    record = h.ack(txn, [("t", 0, "s1"), ("t", 1, "s1"), ("t", 0, "s1")])
    assert record.subscriptions == (("t", 0, "s1"), ("t", 1, "s1"))
    h.ack(txn, [("t", 0, "s2")])
    assert h.state.get(txn).subscriptions == (("t", 0, "s1"), ("t", 1, "s1"), ("t", 0, "s2"))


def test_begin_logs_the_new_txn_and_its_first_participants_in_one_entry(h: Harness) -> None:
    """A lazy client's begin: NewTxn, AddPartitions, AddSubscriptions, applied in that order,
    replayed alike, participants deduplicated as ``add_*`` does."""
    records = h.state.prepare_begin(T0, 500, "alice", [("b", 1), ("a", 0), ("b", 1)], [("a", 0, "s")])
    assert [type(r) for r in records] == [NewTxn, AddPartitions, AddSubscriptions]
    txn = records[0].txn
    assert records[1] == AddPartitions(txn, (("b", 1), ("a", 0)), T0)
    assert h.state.get(txn) is None  # prepared, not applied
    h.log_apply(*decode_batch(encode_batch(records)))
    meta = h.state.get(txn)
    assert (meta.state, meta.partitions, meta.subscriptions) == (TxnState.OPEN, (("b", 1), ("a", 0)), (("a", 0, "s"),))
    assert h.state.prepare_begin(T0, 500, "alice", [], [])[1:] == []  # nothing to register: a NewTxn alone
    assert snapshot(h.replayed()) == snapshot(h.state)


def test_a_commit_begins_the_next_txn_in_its_entry_and_an_abort_begins_none(h: Harness) -> None:
    """commit_and_begin: COMMITTING, NewTxn and its registrations as one entry, replayed alike."""
    first, other = h.new(), h.new()
    end = h.state.prepare_end(first, EndAction.COMMIT, "alice", T0).record
    begun = h.state.prepare_chained_begin(end, T0, 500, "alice", [("a", 0)], [("a", 0, "s")])
    assert [type(r) for r in begun] == [NewTxn, AddPartitions, AddSubscriptions]
    h.log_apply(*decode_batch(encode_batch([end, *begun])))
    assert h.state.get(first).state is TxnState.COMMITTING
    assert h.state.get(begun[0].txn).partitions == (("a", 0),)
    abort = h.state.prepare_end(other, EndAction.ABORT, "alice", T0).record
    assert h.state.prepare_chained_begin(abort, T0, 500, "alice", [("a", 0)], []) == []
    with pytest.raises(InvalidArgument):
        h.state.prepare_chained_begin(end, T0, 500, "alice", [("a",)], [])
    assert snapshot(h.replayed()) == snapshot(h.state)


def test_an_unused_txn_is_released_straight_to_aborted_and_anything_else_is_refused(h: Harness) -> None:
    """release_unused: ABORTING then ABORTED in one entry, no participant to reach; retried, it
    prepares nothing; a committing or committed txn, a transactional id or another owner is
    refused and changes nothing."""
    unused = h.new()
    h.add(unused, [("a", 0)])
    h.ack(unused, [("a", 0, "s")])
    released = h.state.prepare_release_unused(unused, "alice", T0 + 1)
    assert [(r.new_state, r.reason) for r in released] == [(TxnState.ABORTING, AbortReason.CLIENT),
                                                            (TxnState.ABORTED, AbortReason.CLIENT)]
    with pytest.raises(NotAllowed):
        h.state.prepare_release_unused(unused, "mallory", T0 + 1)
    h.log_apply(*released)
    assert h.state.get(unused) is None and h.state.outcome(unused) is Outcome.ABORTED
    assert h.state.prepare_release_unused(unused, "alice", T0 + 2) == []  # a retry
    epoch = h.register("app-1")
    committing, committed, tid_txn, aborting = h.new(), h.new(), h.new(tid="app-1", epoch=epoch), h.new()
    h.end(committing, EndAction.COMMIT)
    h.end(committed, EndAction.COMMIT)
    h.complete(committed)
    h.end(aborting, EndAction.ABORT)
    before = snapshot(h.state)
    with pytest.raises(TransactionAlreadyCommitted):
        h.state.prepare_release_unused(committing, "alice", T0)
    with pytest.raises(TransactionAlreadyCommitted):
        h.state.prepare_release_unused(committed, "alice", T0)
    with pytest.raises(InvalidArgument, match="transactional id"):
        h.state.prepare_release_unused(tid_txn, "alice", T0)
    with pytest.raises(TransactionNotFound):
        h.state.prepare_release_unused(TxnID(TC, 999), "alice", T0)
    assert h.state.prepare_release_unused(aborting, "alice", T0) == []  # its abort is under way
    assert snapshot(h.state) == before
    h.state.check_invariants()
    assert snapshot(h.replayed()) == snapshot(h.state)


@pytest.mark.parametrize("partitions, subscriptions", [("orders", []), ([("orders", -1)], []), ([], [("t", 0)]),
                                                       ([], [("t", 0, "bad name")])])
def test_a_bad_begin_reserves_no_sequence(h: Harness, partitions: object, subscriptions: object) -> None:
    before = h.state.prepare_new_txn(T0, 500, "alice").txn.sequence
    with pytest.raises(InvalidArgument):
        h.state.prepare_begin(T0, 500, "alice", partitions, subscriptions)  # type: ignore[arg-type]
    assert h.state.prepare_new_txn(T0, 500, "alice").txn.sequence == before + 1


@pytest.mark.parametrize("partitions", ["orders", [("orders",)], [("orders", -1)], [("orders", "0")],
                                        [("orders", True)], [(5, 0)], 42])
def test_bad_partitions_are_invalid_argument(h: Harness, partitions: object) -> None:
    txn = h.new()
    with pytest.raises(InvalidArgument):
        h.state.prepare_add_partitions(txn, partitions, "alice", T0)  # type: ignore[arg-type]


def test_bad_names_are_invalid_topic_name(h: Harness) -> None:
    txn = h.new()
    with pytest.raises(InvalidTopicName):
        h.state.prepare_add_partitions(txn, [("a/b", 0)], "alice", T0)
    with pytest.raises(InvalidTopicName):
        h.state.prepare_add_subscriptions(txn, [("a", 0, "bad name")], "alice", T0)


def test_add_errors(h: Harness) -> None:
    txn = h.new(timeout=100)
    with pytest.raises(TransactionNotFound):
        h.state.prepare_add_partitions(TxnID(TC, 99), [("a", 0)], "alice", T0)
    with pytest.raises(TransactionNotFound, match="coordinator 1"):
        h.state.prepare_add_partitions(TxnID(1, 0), [("a", 0)], "alice", T0)
    with pytest.raises(NotAllowed, match="owned by 'alice'"):
        h.state.prepare_add_partitions(txn, [("a", 0)], "mallory", T0)
    with pytest.raises(InvalidArgument, match="no transactional id"):
        h.state.prepare_add_partitions(txn, [("a", 0)], "alice", T0, epoch=0)
    with pytest.raises(TransactionTimedOut):  # deadline passed, the timer has not fired yet
        h.state.prepare_add_partitions(txn, [("a", 0)], "alice", T0 + 100)
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_add_subscriptions(txn, [("a", 0, "s")], "alice", T0 + 100)


@pytest.mark.parametrize(("action", "complete", "error"), [
    (COMMIT, False, TransactionAlreadyCommitted),
    (COMMIT, True, TransactionAlreadyCommitted),
    (ABORT, False, TransactionAlreadyAborted),
    (ABORT, True, TransactionAlreadyAborted),
])
def test_add_to_an_ending_or_ended_txn(h: Harness, action: EndAction, complete: bool, error: type) -> None:
    txn = h.new()
    h.end(txn, action)
    if complete:
        h.complete(txn)
    with pytest.raises(error):
        h.state.prepare_add_partitions(txn, [("a", 0)], "alice", T0)
    with pytest.raises(error):
        h.state.prepare_add_subscriptions(txn, [("a", 0, "s")], "alice", T0)


# --- ending ----------------------------------------------------------------------------------


def test_commit_path(h: Harness) -> None:
    txn = h.new()
    h.add(txn, [("a", 0)])
    result = h.end(txn, COMMIT, now=T0 + 1)
    assert result == EndResult(UpdateState(txn, TxnState.COMMITTING, T0 + 1), TxnState.COMMITTING)
    assert not result.finished
    assert h.state.get(txn).state is TxnState.COMMITTING
    assert h.state.txns_in(TxnState.COMMITTING) == [h.state.get(txn)]
    assert h.complete(txn, now=T0 + 2) == UpdateState(txn, TxnState.COMMITTED, T0 + 2)
    assert h.state.get(txn) is None
    assert h.state.outcome(txn) is Outcome.COMMITTED
    assert h.state.txns_in(TxnState.COMMITTED) == []
    h.state.check_invariants()


def test_abort_path(h: Harness) -> None:
    txn = h.new()
    result = h.end(txn, ABORT)
    assert result.record == UpdateState(txn, TxnState.ABORTING, T0, AbortReason.CLIENT)
    assert h.state.get(txn).abort_reason is AbortReason.CLIENT
    assert h.complete(txn) == UpdateState(txn, TxnState.ABORTED, T0, AbortReason.CLIENT)
    assert h.state.outcome(txn) is Outcome.ABORTED


@pytest.mark.parametrize("action", [COMMIT, ABORT])
def test_repeated_end_is_idempotent_while_ending_and_after(h: Harness, action: EndAction) -> None:
    txn = h.new()
    h.end(txn, action)
    ending = TxnState.COMMITTING if action == COMMIT else TxnState.ABORTING
    logged = len(h.log)
    assert h.end(txn, action) == EndResult(None, ending)
    h.complete(txn)
    final = TxnState.COMMITTED if action == COMMIT else TxnState.ABORTED
    result = h.end(txn, action, now=T0 + 10**9)  # long after: the outcome is remembered
    assert result == EndResult(None, final) and result.finished
    assert len(h.log) == logged + 1  # only the completion was logged


@pytest.mark.parametrize(("first", "second", "error"), [
    (COMMIT, ABORT, TransactionAlreadyCommitted),
    (ABORT, COMMIT, TransactionAlreadyAborted),
])
@pytest.mark.parametrize("complete", [False, True])
def test_opposite_end_is_refused(h: Harness, first: str, second: str, error: type, complete: bool) -> None:
    txn = h.new()
    h.end(txn, first)
    if complete:
        h.complete(txn)
    with pytest.raises(error):
        h.state.prepare_end(txn, second, "alice", T0)


def test_end_errors(h: Harness) -> None:
    txn = h.new()
    with pytest.raises(TransactionNotFound):
        h.state.prepare_end(TxnID(TC, 5), COMMIT, "alice", T0)
    with pytest.raises(NotAllowed):
        h.state.prepare_end(txn, COMMIT, "mallory", T0)
    with pytest.raises(InvalidArgument, match="COMMIT or ABORT"):
        h.state.prepare_end(txn, "ROLLBACK", "alice", T0)
    with pytest.raises(InvalidArgument):
        h.state.prepare_end("txn(0,0)", COMMIT, "alice", T0)  # type: ignore[arg-type]


def test_commit_after_the_deadline_is_timed_out_even_before_the_timer(h: Harness) -> None:
    txn = h.new(timeout=100)
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_end(txn, COMMIT, "alice", T0 + 100)
    assert h.state.get(txn).state is TxnState.OPEN  # the timer will abort it
    assert h.state.expired(T0 + 100) == [txn]
    # An abort asked for after the deadline is the timeout abort.
    assert h.end(txn, ABORT, now=T0 + 100).record.reason is AbortReason.TIMEOUT
    h.complete(txn)
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_end(txn, COMMIT, "alice", T0 + 200)


def test_complete(h: Harness) -> None:
    txn = h.new()
    with pytest.raises(InvalidTxnState, match="OPEN"):
        h.state.prepare_complete(txn, T0)
    with pytest.raises(TransactionNotFound):
        h.state.prepare_complete(TxnID(TC, 9), T0)
    h.end(txn, COMMIT)
    h.complete(txn)
    assert h.state.prepare_complete(txn, T0) is None  # a second driver finishing: nothing to do


def test_outcomes_are_bounded_and_forgotten_ones_are_not_found() -> None:
    h = Harness(max_recent_outcomes=2)
    txns = [h.new() for _ in range(3)]
    for txn in txns:
        h.finish(txn, COMMIT)
    assert [seq for seq, _ in h.state.recent_outcomes()] == [1, 2]
    with pytest.raises(TransactionNotFound, match="no longer remembered"):
        h.state.prepare_end(txns[0], COMMIT, "alice", T0)
    assert h.end(txns[1], COMMIT) == EndResult(None, TxnState.COMMITTED)
    with pytest.raises(TransactionNotFound, match="unknown"):
        h.state.prepare_end(TxnID(TC, 3), COMMIT, "alice", T0)


# --- apply guards every transition ------------------------------------------------------------


def test_illegal_transition_names_both_states(h: Harness) -> None:
    for _ in range(5):
        h.finish(h.new(), ABORT)
    txn = h.new()
    h.finish(txn, COMMIT)
    with pytest.raises(InvalidTxnState, match=r"^txn\(0,5\): COMMITTED -> ABORTING not allowed$"):
        h.state.apply(UpdateState(txn, TxnState.ABORTING, T0, AbortReason.CLIENT))


@pytest.mark.parametrize("current", [TxnState.OPEN, TxnState.COMMITTING, TxnState.ABORTING])
@pytest.mark.parametrize("new", list(TxnState))
def test_transition_table(h: Harness, current: TxnState, new: TxnState) -> None:
    txn = h.new()
    if current is not TxnState.OPEN:
        h.end(txn, COMMIT if current is TxnState.COMMITTING else ABORT)
    reason = {TxnState.ABORTING: AbortReason.CLIENT, TxnState.ABORTED: h.state.get(txn).abort_reason}.get(new)
    record = UpdateState(txn, new, T0, reason)
    before = snapshot(h.state)
    if current in VALID_PREVIOUS_STATES[new]:
        h.state.apply(record)
    else:
        with pytest.raises(InvalidTxnState, match=f"{current} -> {new} not allowed"):
            h.state.apply(record)
        assert snapshot(h.state) == before  # apply is atomic


@pytest.mark.parametrize(("setup", "record"), [
    (None, UpdateState(TxnID(TC, 0), TxnState.ABORTING, T0)),  # ABORTING needs a reason
    (None, UpdateState(TxnID(TC, 0), TxnState.COMMITTING, T0, AbortReason.CLIENT)),
    (ABORT, UpdateState(TxnID(TC, 0), TxnState.ABORTED, T0, AbortReason.TIMEOUT)),  # not its reason
    (COMMIT, AddPartitions(TxnID(TC, 0), (("a", 0),), T0)),
    (ABORT, AddSubscriptions(TxnID(TC, 0), (("a", 0, "s"),), T0)),
    (None, AddPartitions(TxnID(TC, 7), (("a", 0),), T0)),
    (None, UpdateState(TxnID(TC, 7), TxnState.COMMITTING, T0)),
    (None, NewTxn(TxnID(1, 5), "alice", 100, T0)),
    (None, NewTxn(TxnID(TC, 0), "bob", 100, T0)),
])
def test_apply_rejects_records_that_do_not_fit(h: Harness, setup: str | None, record: Record) -> None:
    txn = h.new()
    if setup:
        h.end(txn, setup)
    before = snapshot(h.state)
    with pytest.raises(InvalidTxnState):
        h.state.apply(record)
    assert snapshot(h.state) == before


def test_apply_refuses_what_is_not_a_record(h: Harness) -> None:
    with pytest.raises(InvalidArgument):
        h.state.apply("NewTxn")  # type: ignore[arg-type]


# --- timeouts --------------------------------------------------------------------------------


def test_expired_lists_open_txns_past_their_deadline_in_deadline_order(h: Harness) -> None:
    slow = h.new(timeout=300)
    fast = h.new(timeout=100)
    committed = h.new(timeout=50)
    h.end(committed, COMMIT)
    assert h.state.next_deadline_ms() == T0 + 100
    assert h.state.expired(T0 + 99) == []
    assert h.state.expired(T0 + 300) == [fast, slow]
    assert h.state.expired(T0 + 300) == [fast, slow]  # still armed until the abort is logged
    assert h.fire_timeouts(T0 + 150) == [fast]
    assert h.state.get(fast).state is TxnState.ABORTING
    assert h.state.get(fast).abort_reason is AbortReason.TIMEOUT
    assert h.state.expired(T0 + 300) == [slow]
    assert h.state.next_deadline_ms() == T0 + 300
    h.state.check_invariants()


def test_next_deadline_skips_the_txns_whose_timeout_is_under_way(h: Harness) -> None:
    """The timer leaves out txns it is already timing out (their deadline has passed, and they
    stay OPEN until the abort is logged); the next deadline is then the earliest of the rest."""
    slow = h.new(timeout=300)
    fast = h.new(timeout=100)
    middle = h.new(timeout=200)
    assert h.state.next_deadline_ms(skip={fast.sequence}) == T0 + 200
    assert h.state.next_deadline_ms(skip={slow.sequence}) == T0 + 100  # not the head: as without skip
    assert h.state.next_deadline_ms(skip={fast.sequence, middle.sequence}) == T0 + 300
    assert h.state.next_deadline_ms(skip={fast.sequence, middle.sequence, slow.sequence}) is None
    h.end(middle, COMMIT)  # an ended txn's deadline does not count either
    assert h.state.next_deadline_ms(skip={fast.sequence}) == T0 + 300
    assert h.state.next_deadline_ms() == T0 + 100
    h.state.check_invariants()


def test_prepare_timeout_only_for_due_open_txns(h: Harness) -> None:
    txn = h.new(timeout=100)
    assert h.state.prepare_timeout(txn, T0 + 99) is None
    assert h.state.prepare_timeout(TxnID(TC, 42), T0 + 100) is None
    assert h.state.prepare_timeout(txn, T0 + 100) == UpdateState(txn, TxnState.ABORTING, T0 + 100,
                                                                  AbortReason.TIMEOUT)
    h.end(txn, ABORT, now=T0 + 50)  # the owner aborted first: the timer finds nothing to do
    assert h.state.prepare_timeout(txn, T0 + 100) is None
    assert h.state.expired(T0 + 100) == [] and h.state.next_deadline_ms() is None


def test_a_timed_out_txn_answers_timed_out(h: Harness) -> None:
    txn = h.new(timeout=100)
    h.fire_timeouts(T0 + 100)
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_add_partitions(txn, [("a", 0)], "alice", T0 + 100)
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_end(txn, COMMIT, "alice", T0 + 100)
    assert h.end(txn, ABORT) == EndResult(None, TxnState.ABORTING)
    h.complete(txn)
    assert h.state.outcome(txn) is Outcome.TIMED_OUT
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_add_subscriptions(txn, [("a", 0, "s")], "alice", T0 + 100)
    with pytest.raises(TransactionTimedOut):
        h.state.prepare_end(txn, COMMIT, "alice", T0 + 100)
    assert h.end(txn, ABORT) == EndResult(None, TxnState.ABORTED)
    assert h.state.stats(T0)["timed_out_total"] == 1


# --- low watermark -----------------------------------------------------------------------------


def test_low_watermark(h: Harness) -> None:
    assert h.state.low_watermark == -1 and h.state.min_live_sequence() is None
    t0, t1, t2 = h.new(), h.new(), h.new()
    assert h.state.low_watermark == -1
    h.finish(t1, COMMIT)  # ending a later txn does not move it
    assert h.state.low_watermark == -1
    h.end(t0, COMMIT)  # committing is not ended yet
    assert h.state.low_watermark == -1
    h.complete(t0)
    assert h.state.low_watermark == 1 and h.state.min_live_sequence() == 2
    h.finish(t2, ABORT)
    assert h.state.low_watermark == 2 and h.state.min_live_sequence() is None
    h.new()
    assert h.state.low_watermark == 2
    h.state.check_invariants()


# --- transactional ids (zombie fencing) -------------------------------------------------------


def test_register_bumps_the_epoch(h: Harness) -> None:
    assert h.register("p1") == 0
    assert h.register("p1") == 1
    assert h.register("p2") == 0
    assert h.state.transactional_ids() == {"p1": 1, "p2": 0}


def test_new_txn_under_a_transactional_id(h: Harness) -> None:
    with pytest.raises(Fenced, match="not registered"):
        h.state.prepare_new_txn(T0, 100, "alice", "p1", 0)
    h.register("p1")
    h.register("p1")
    with pytest.raises(Fenced, match="fenced by 1"):
        h.state.prepare_new_txn(T0, 100, "alice", "p1", 0)
    with pytest.raises(InvalidArgument, match="needs its epoch"):
        h.state.prepare_new_txn(T0, 100, "alice", "p1")
    with pytest.raises(InvalidArgument):
        h.state.prepare_new_txn(T0, 100, "alice", "", 1)
    txn = h.new(tid="p1", epoch=1)
    assert (h.state.get(txn).transactional_id, h.state.get(txn).epoch) == ("p1", 1)
    with pytest.raises(NotAllowed, match="already has an open transaction"):
        h.state.prepare_new_txn(T0, 100, "alice", "p1", 1)
    h.end(txn, COMMIT, epoch=1)  # committing is not OPEN: the next one may start
    second = h.new(tid="p1", epoch=1)
    h.complete(txn)
    assert h.state.get(second).state is TxnState.OPEN


def test_a_repeated_new_txn_finds_the_txn_it_began_until_that_txn_has_a_participant(h: Harness) -> None:
    """A new_txn whose NewTxn was logged but whose answer was lost is asked again: the id's OPEN
    txn under the same epoch and owner, with no participant, is that call's txn. Any other
    caller, epoch or a txn with a participant gets nothing from it, and prepare still refuses."""
    h.register("p1")
    assert h.state.repeated_new_txn("p1", 0, "alice") is None  # nothing open
    txn = h.new(tid="p1", epoch=0)
    assert h.state.repeated_new_txn("p1", 0, "alice") == txn
    assert h.state.repeated_new_txn("p1", 0, "bob") is None
    assert h.state.repeated_new_txn("p1", 1, "alice") is None
    assert h.state.repeated_new_txn("p2", 0, "alice") is None
    h.add(txn, [("a", 0)], epoch=0)
    assert h.state.repeated_new_txn("p1", 0, "alice") is None  # it holds data now: the caller knew it
    with pytest.raises(ConcurrentTransactions):
        h.state.prepare_new_txn(T0, 100, "alice", "p1", 0)
    h.end(txn, COMMIT, epoch=0)
    assert h.state.repeated_new_txn("p1", 0, "alice") is None  # ending is not OPEN
    h.state.check_invariants()


def test_a_transactional_id_is_described_with_its_epoch_and_open_txn(h: Harness) -> None:
    """What a restarted Kafka gateway takes up: the id's epoch, and its OPEN txn while there is
    one (an ending txn is not open: its end was asked for already)."""
    assert h.state.transactional_id_txn("p1") is None  # never registered
    h.register("p1")
    assert h.state.transactional_id_txn("p1") == (0, None)
    txn = h.new(tid="p1", epoch=0)
    h.add(txn, [("a", 0)], epoch=0)
    epoch, meta = h.state.transactional_id_txn("p1")
    assert (epoch, meta.txn, meta.partitions) == (0, txn, (("a", 0),))
    h.end(txn, COMMIT, epoch=0)
    assert h.state.transactional_id_txn("p1") == (0, None)
    h.log_apply(*h.state.prepare_register_transactional_id("p1", T0 + 1))
    assert h.state.transactional_id_txn("p1") == (1, None)
    h.state.check_invariants()


def test_registering_again_aborts_the_open_txn_and_fences_the_zombie(h: Harness) -> None:
    h.register("p1")
    zombie = h.new(tid="p1", epoch=0, owner="worker-1")
    h.add(zombie, [("a", 0)], owner="worker-1", epoch=0)
    records = h.state.prepare_register_transactional_id("p1", T0 + 1)
    assert records == [UpdateState(zombie, TxnState.ABORTING, T0 + 1, AbortReason.FENCED),
                       RegisterTransactionalId("p1", 1, T0 + 1)]
    h.log_apply(*records)
    assert h.state.get(zombie).state is TxnState.ABORTING
    assert h.state.get(zombie).abort_reason is AbortReason.FENCED
    # The zombie, with its epoch given or implied, can do nothing more.
    for epoch in (0, None):
        with pytest.raises(Fenced):
            h.state.prepare_add_partitions(zombie, [("b", 0)], "worker-1", T0 + 2, epoch)
        with pytest.raises(Fenced):
            h.state.prepare_add_subscriptions(zombie, [("b", 0, "s")], "worker-1", T0 + 2, epoch)
        with pytest.raises(Fenced):
            h.state.prepare_end(zombie, COMMIT, "worker-1", T0 + 2, epoch)
        with pytest.raises(Fenced):
            h.state.prepare_new_txn(T0 + 2, 100, "worker-1", "p1", 0)
    # The new incarnation works; the fenced txn is driven to its end like any abort.
    fresh = h.new(tid="p1", epoch=1, owner="worker-2")
    h.add(fresh, [("a", 0)], owner="worker-2", epoch=1)
    h.complete(zombie)
    assert h.state.outcome(zombie) is Outcome.FENCED
    with pytest.raises(Fenced):
        h.state.prepare_end(zombie, COMMIT, "worker-1", T0 + 3)
    with pytest.raises(Fenced):
        h.state.prepare_add_partitions(zombie, [("a", 0)], "worker-1", T0 + 3)
    with pytest.raises(Fenced):  # even an abort: the zombie must learn it is one (Kafka's EndTxn)
        h.state.prepare_end(zombie, ABORT, "worker-1", T0 + 3)
    assert h.state.stats(T0)["fenced_total"] == 1
    h.state.check_invariants()


def test_registering_leaves_a_committing_txn_to_finish(h: Harness) -> None:
    h.register("p1")
    txn = h.new(tid="p1", epoch=0)
    h.end(txn, COMMIT, epoch=0)
    records = h.state.prepare_register_transactional_id("p1", T0)
    assert records == [RegisterTransactionalId("p1", 1, T0)]
    h.log_apply(*records)
    assert h.state.get(txn).state is TxnState.COMMITTING
    with pytest.raises(Fenced):  # the zombie's retry is told to stop; the commit still completes
        h.state.prepare_end(txn, COMMIT, "alice", T0, epoch=0)
    h.complete(txn)
    assert h.state.outcome(txn) is Outcome.COMMITTED


def test_apply_guards_epochs(h: Harness) -> None:
    h.register("p1")
    h.register("p1")
    with pytest.raises(InvalidTxnState, match="not above 1"):
        h.state.apply(RegisterTransactionalId("p1", 1, T0))
    with pytest.raises(InvalidTxnState, match="fenced"):  # opened under an epoch fenced meanwhile
        h.state.apply(NewTxn(TxnID(TC, 0), "alice", 100, T0, "p1", 0))
    txn = h.new(tid="p1", epoch=1)
    with pytest.raises(InvalidTxnState, match="still OPEN"):  # registered without fencing txn
        h.state.apply(RegisterTransactionalId("p1", 2, T0))
    assert h.state.get(txn).state is TxnState.OPEN


def test_bad_transactional_id_on_register(h: Harness) -> None:
    with pytest.raises(InvalidArgument):
        h.state.prepare_register_transactional_id("", T0)
    with pytest.raises(InvalidArgument):
        h.state.prepare_register_transactional_id(None, T0)  # type: ignore[arg-type]


# --- checkpoints, replay and recovery ---------------------------------------------------------


def build_history(h: Harness) -> dict[str, TxnID]:
    """A log with txns in every state, transactional ids and a timeout."""
    h.register("p1")
    txns = {
        "committed": h.new(now=T0, owner="a"),
        "aborted": h.new(now=T0 + 1, owner="b"),
        "timed_out": h.new(now=T0 + 2, timeout=10),
        "open": h.new(now=T0 + 3, timeout=5000, tid="p1", epoch=0),
        "committing": h.new(now=T0 + 4, owner="c"),
        "aborting": h.new(now=T0 + 5),
    }
    h.add(txns["committed"], [("t", 0), ("t", 1)], now=T0 + 6, owner="a")
    h.ack(txns["committed"], [("t", 0, "s")], now=T0 + 6, owner="a")
    h.add(txns["open"], [("t", 2)], now=T0 + 7, epoch=0)
    h.add(txns["committing"], [("u", 0)], now=T0 + 8, owner="c")
    h.finish(txns["committed"], COMMIT, now=T0 + 9, owner="a")
    h.finish(txns["aborted"], ABORT, now=T0 + 9, owner="b")
    h.fire_timeouts(T0 + 20)
    h.complete(txns["timed_out"], now=T0 + 21)
    h.end(txns["committing"], COMMIT, now=T0 + 22, owner="c")
    h.end(txns["aborting"], ABORT, now=T0 + 23)
    h.register("p2")
    return txns


def test_replay_of_the_log_gives_the_identical_state(h: Harness) -> None:
    build_history(h)
    replayed = h.replayed()
    assert snapshot(replayed) == snapshot(h.state)
    assert replayed.stats(T0 + 30) == h.state.stats(T0 + 30)


def test_recover_tracker(h: Harness) -> None:
    txns = build_history(h)
    state = h.replayed()
    # OPEN ones are back with their deadlines armed.
    assert [m.txn for m in state.txns_in(TxnState.OPEN)] == [txns["open"]]
    assert state.next_deadline_ms() == T0 + 3 + 5000
    assert state.expired(T0 + 5003) == [txns["open"]]
    assert state.get(txns["open"]).partitions == (("t", 2),)
    # COMMITTING / ABORTING ones are listed for re-drive, with their participants.
    assert [m.txn for m in state.txns_in(TxnState.COMMITTING)] == [txns["committing"]]
    assert state.get(txns["committing"]).partitions == (("u", 0),)
    assert [m.txn for m in state.txns_in(TxnState.ABORTING)] == [txns["aborting"]]
    assert state.prepare_complete(txns["committing"], T0 + 40).new_state is TxnState.COMMITTED
    # Ended ones are gone from the table but their outcomes answer.
    for name in ("committed", "aborted", "timed_out"):
        assert state.get(txns[name]) is None
    assert state.prepare_end(txns["committed"], COMMIT, "a", T0 + 40) == EndResult(None, TxnState.COMMITTED)
    with pytest.raises(TransactionAlreadyCommitted):
        state.prepare_end(txns["committed"], ABORT, "a", T0 + 40)
    with pytest.raises(TransactionAlreadyAborted):
        state.prepare_end(txns["aborted"], COMMIT, "b", T0 + 40)
    with pytest.raises(TransactionTimedOut):
        state.prepare_end(txns["timed_out"], COMMIT, "alice", T0 + 40)
    # Fencing survives: the epochs are back, and no sequence is handed out again.
    assert state.transactional_ids() == {"p1": 0, "p2": 0}
    with pytest.raises(NotAllowed):
        state.prepare_new_txn(T0 + 40, 100, "alice", "p1", 0)
    assert state.prepare_new_txn(T0 + 40, 100, "alice").txn == TxnID(TC, 6)
    assert state.low_watermark == txns["open"].sequence - 1


def test_checkpoint_lets_the_ended_txns_records_go(h: Harness) -> None:
    txns = build_history(h)
    checkpoint = h.state.prepare_checkpoint()
    assert checkpoint.next_sequence == 6
    assert checkpoint.transactional_ids == {"p1": 0, "p2": 0}
    assert checkpoint.recent_outcomes == [(0, Outcome.COMMITTED), (1, Outcome.ABORTED), (2, Outcome.TIMED_OUT)]
    h.log_apply(checkpoint)
    # Trim: keep only the records of txns still live, and the checkpoint.
    live = {meta.txn for meta in h.state.live_txns()}
    kept = [data for data in h.log
            if isinstance(rec := decode_record(data), Checkpoint) or getattr(rec, "txn", None) in live]
    assert len(kept) < len(h.log)
    replayed = h.replayed(kept)
    assert snapshot(replayed) == snapshot(h.state)
    assert replayed.prepare_new_txn(T0, 100, "x").txn.sequence == 6
    assert replayed.prepare_end(txns["aborted"], ABORT, "b", T0) == EndResult(None, TxnState.ABORTED)


def test_trimmed_replay_forgets_the_same_outcomes_as_the_live_state() -> None:
    """With a bounded outcome map, outcomes the replay meets before the checkpoint but the live
    state had already forgotten must be forgotten again, not kept instead of newer ones."""
    h = Harness(max_recent_outcomes=2)
    early, long_lived, b, c = h.new(timeout=5000), h.new(timeout=5000), h.new(), h.new()
    h.finish(b, COMMIT)
    h.finish(c, COMMIT)
    h.finish(early, ABORT)  # ended last but below the lowest live sequence: its records go
    checkpoint = h.state.prepare_checkpoint()
    assert checkpoint.recent_outcomes == [(c.sequence, Outcome.COMMITTED), (early.sequence, Outcome.ABORTED)]
    h.log_apply(checkpoint)
    keep_from = h.state.min_live_sequence()
    assert keep_from == long_lived.sequence
    kept = [data for data in h.log[:-1]
            if getattr(rec := decode_record(data), "txn", None) is None or rec.txn.sequence >= keep_from]
    replayed = h.replayed([*kept, h.log[-1]])
    assert replayed.recent_outcomes() == h.state.recent_outcomes()
    assert snapshot(replayed) == snapshot(h.state)


def test_checkpoint_alone_never_reuses_a_sequence() -> None:
    h = Harness()
    for _ in range(4):
        h.finish(h.new(), ABORT)
    h.state.prepare_new_txn(T0, 100, "reserved-but-not-logged")
    checkpoint = h.state.prepare_checkpoint()
    assert checkpoint.next_sequence == 5  # covers the reservation too
    state = CoordinatorState(TC)
    state.apply(decode_record(encode_record(checkpoint)))
    assert state.next_sequence == 5 and state.low_watermark == 4
    assert state.prepare_new_txn(T0, 100, "alice").txn.sequence == 5
    with pytest.raises(InvalidTxnState, match="sequence already used"):
        state.apply(NewTxn(TxnID(TC, 3), "alice", 100, T0))
    state.apply(Checkpoint(2, {}, []))  # an older checkpoint never lowers the counter
    assert state.next_sequence == 5


def test_checkpoint_merges_epochs_upwards_and_rejects_contradictions(h: Harness) -> None:
    h.register("p1")
    h.register("p1")
    txn = h.new()
    h.state.apply(Checkpoint(1, {"p1": 0, "p2": 3}, []))
    assert h.state.transactional_ids() == {"p1": 1, "p2": 3}
    before = snapshot(h.state)
    for bad in (Checkpoint(5, {}, [(txn.sequence, Outcome.COMMITTED)]),  # it is live
                Checkpoint(0, {}, [(3, Outcome.COMMITTED)])):  # outcome above its own counter
        with pytest.raises(InvalidTxnState, match="contradicts"):
            h.state.apply(bad)
    assert snapshot(h.state) == before


def test_compacted_records_replay_into_the_same_state(h: Harness) -> None:
    build_history(h)
    h.ack(h.state.txns_in(TxnState.OPEN)[0].txn, [("t", 2, "s")], now=T0 + 25, epoch=0)
    records = h.state.compacted_records()
    assert isinstance(records[-1], Checkpoint)
    fresh = CoordinatorState(TC)
    fresh.replay(decode_batch(encode_batch(records)))
    fresh.check_invariants()
    assert snapshot(fresh) == snapshot(h.state)


# --- stats -------------------------------------------------------------------------------------


def test_stats(h: Harness) -> None:
    txns = build_history(h)
    stats = h.state.stats(T0 + 100, slowest=2)
    assert stats["states"] == {"OPEN": 1, "COMMITTING": 1, "ABORTING": 1, "COMMITTED": 1, "ABORTED": 2}
    assert (stats["committed_total"], stats["aborted_total"], stats["timed_out_total"]) == (1, 2, 1)
    assert stats["live"] == 3 and stats["next_sequence"] == 6
    assert stats["low_watermark"] == txns["open"].sequence - 1
    assert stats["transactional_ids"] == 2 and stats["recent_outcomes"] == 3
    assert stats["next_deadline_ms"] == T0 + 5003
    assert stats["slowest_txns"] == [
        {"txn": "txn(0,3)", "tc_id": 0, "sequence": 3, "state": "OPEN", "owner": "alice", "start_ms": T0 + 3,
         "age_ms": 97, "deadline_ms": T0 + 5003, "deadline_in_ms": 4903, "last_modified_ms": T0 + 7,
         "partitions": [["t", 2]], "subscriptions": [], "transactional_id": "p1", "epoch": 0, "abort_reason": None},
        {"txn": "txn(0,4)", "tc_id": 0, "sequence": 4, "state": "COMMITTING", "owner": "c", "start_ms": T0 + 4,
         "age_ms": 96, "deadline_ms": T0 + 1004, "deadline_in_ms": 904, "last_modified_ms": T0 + 22,
         "partitions": [["u", 0]], "subscriptions": [], "transactional_id": None, "epoch": None,
         "abort_reason": None},
    ]
    assert msgspec.json.decode(msgspec.json.encode(stats)) == stats  # plain JSON-able data


def test_older_than_finds_the_hanging_transactions_oldest_first(h: Harness) -> None:
    txns = build_history(h)  # live: open (begun T0+3), committing (T0+4), aborting (T0+5)
    live = [txns["open"], txns["committing"], txns["aborting"]]
    assert [m.txn for m in h.state.older_than(T0 + 100)] == live
    assert [m.txn for m in h.state.older_than(T0 + 100, 96)] == live[:2]  # ages 97, 96, 95
    assert [m.txn for m in h.state.older_than(T0 + 100, 96, limit=1)] == live[:1]
    assert h.state.older_than(T0 + 100, 98) == []
    assert [h.state.count_older_than(T0 + 100, age) for age in (0, 95, 96, 97, 98)] == [3, 3, 2, 1, 0]
    aborting = describe_txn(h.state.get(txns["aborting"]), T0 + 100)
    assert (aborting["state"], aborting["age_ms"], aborting["abort_reason"]) == ("ABORTING", 95, "CLIENT")
    for bad in ({"min_age_ms": -1}, {"min_age_ms": 1.5}, {"limit": 0}, {"limit": "3"}):
        with pytest.raises(InvalidArgument):
            h.state.older_than(T0, **bad)


def test_invalid_configuration() -> None:
    with pytest.raises(InvalidArgument):
        CoordinatorState(TC, max_timeout_ms=0)
    with pytest.raises(InvalidArgument):
        CoordinatorState(TC, max_recent_outcomes=-1)


def test_a_zombie_ending_its_forgotten_txn_is_fenced(h: Harness) -> None:
    """The zombie's txn timed out and ended before its id was registered again, so only its
    outcome is left: its end, given the id and its stale epoch, is Fenced, while the same end
    from the current epoch (a retried abort) is the usual success."""
    epoch = h.register("p1")
    txn = h.new(tid="p1", epoch=epoch, timeout=100)
    assert h.fire_timeouts(T0 + 100) == [txn]
    h.complete(txn, now=T0 + 101)
    assert h.state.outcome(txn) is Outcome.TIMED_OUT
    retried = h.state.prepare_end(txn, ABORT, "alice", T0 + 102, epoch, "p1")
    assert retried == EndResult(None, TxnState.ABORTED)
    h.register("p1")
    for action in (ABORT, COMMIT):
        with pytest.raises(Fenced, match="fenced by 1"):
            h.state.prepare_end(txn, action, "alice", T0 + 103, epoch, "p1")
    with pytest.raises(InvalidArgument):
        h.state.prepare_end(txn, ABORT, "alice", T0 + 103, epoch, "")
    h.state.check_invariants()


# --- each transactional id's last transaction (Kafka's EndTxn without an open txn, ListTransactions)


def test_the_last_txn_of_an_id_outlives_its_end_a_checkpoint_and_compaction() -> None:
    """``last_txn_of``: the id's last transaction, live (its entry) or ended (its outcome), kept
    by NewTxn records and by checkpoints, so a log trimmed to a checkpoint or compacted answers
    the same; None for an id that never began one."""
    h = Harness()
    epoch = h.register("p1")
    h.register("p2")
    assert h.state.last_txn_of("p1") is None and h.state.last_txn_of("nobody") is None
    first = h.new(tid="p1", epoch=epoch)
    found = h.state.last_txn_of("p1")
    assert found is not None and found[0] == first and isinstance(found[1], TxnMeta)
    h.finish(first, COMMIT, epoch=epoch)
    assert h.state.last_txn_of("p1") == (first, Outcome.COMMITTED)
    second = h.new(tid="p1", epoch=epoch)
    h.end(second, ABORT, epoch=epoch)
    assert h.state.last_txn_of("p1")[1].state is TxnState.ABORTING
    h.complete(second)
    h.state.check_invariants()
    checkpoint = h.state.prepare_checkpoint()
    assert checkpoint.last_txns == {"p1": second.sequence}
    h.log_apply(checkpoint)
    trimmed = h.replayed([data for data in h.log if isinstance(decode_record(data), Checkpoint)])
    assert trimmed.last_txn_of("p1") == (second, Outcome.ABORTED) and trimmed.last_txn_of("p2") is None
    compacted = CoordinatorState(TC)
    compacted.replay(decode_batch(encode_batch(h.state.compacted_records())))
    compacted.check_invariants()
    assert compacted.last_txn_of("p1") == (second, Outcome.ABORTED)
    # An older checkpoint (logged before, applied late) never moves an id's last txn back.
    h.state.apply(Checkpoint(1, {"p1": 0}, [], last_txns={"p1": first.sequence}))
    assert h.state.last_txn_of("p1")[0] == second
    assert h.replayed().last_txn_of("p1") == (second, Outcome.ABORTED)
