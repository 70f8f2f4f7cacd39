"""The client transaction's state machine: every transition the table allows happens, every other
one is refused with a specific error and changes nothing. No Ray: the machine is pure."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator

import pytest

from raytxn.client.loop import BackgroundLoop
from raytxn.client.transaction import (
    UNENDED_STATES,
    VALID_PREVIOUS_STATES,
    Transaction,
    TxnClientState,
    TxnStateMachine,
)
from raytxn.errors import (
    InvalidArgument,
    InvalidTxnState,
    MessageTooLarge,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionConflict,
    TransactionTimedOut,
)
from raytxn.ids import TxnID

S = TxnClientState
TXN = TxnID(0, 7)

# Written out apart from the table: what commit, abort and failures do (see Transaction).
ALLOWED = {
    (S.OPEN, S.ABORT_ONLY),  # a send or ack made with it failed
    (S.COMMITTING, S.ABORT_ONLY),  # ... one the commit was waiting for
    (S.OPEN, S.TIMED_OUT),  # its timeout passed
    (S.OPEN, S.COMMITTING),  # commit
    (S.COMMITTING, S.COMMITTED),  # the coordinator committed it
    (S.COMMITTING, S.ERROR),  # the coordinator refused the commit
    (S.OPEN, S.ABORTING),  # abort
    (S.ABORT_ONLY, S.ABORTING),  # commit or abort of an abort-only txn
    (S.TIMED_OUT, S.ABORTING),  # commit or abort of a timed-out txn
    (S.COMMITTING, S.ABORTING),  # abort while a commit waits, or the coordinator timed it out or aborted it
    (S.ABORTING, S.ABORTING),  # abort again after one interrupted before its answer
    (S.ERROR, S.ABORTING),  # abort after a refused end
    (S.ABORTING, S.ABORTED),
    (S.ABORTING, S.ERROR),  # the coordinator refused the abort
}

# A way to each state from a new machine, through allowed transitions only.
PATHS = {
    S.OPEN: [],
    S.ABORT_ONLY: [S.ABORT_ONLY],
    S.TIMED_OUT: [S.TIMED_OUT],
    S.COMMITTING: [S.COMMITTING],
    S.COMMITTED: [S.COMMITTING, S.COMMITTED],
    S.ABORTING: [S.ABORTING],
    S.ABORTED: [S.ABORTING, S.ABORTED],
    S.ERROR: [S.COMMITTING, S.ERROR],
}
FAILURE = MessageTooLarge("too large")


def move(machine: TxnStateMachine, target: TxnClientState, **options: object) -> bool:
    """``transition_to``, with the cause a move to ABORT_ONLY needs."""
    return machine.transition_to(target, cause=FAILURE if target is S.ABORT_ONLY else None, **options)


def machine_in(state: TxnClientState, deadline: float = math.inf,
               clock: Callable[[], float] = time.monotonic) -> TxnStateMachine:
    machine = TxnStateMachine(TXN, deadline, clock)
    for step in PATHS[state]:
        move(machine, step)
    assert machine.state is state
    return machine


def test_the_table_is_the_written_out_one() -> None:
    assert set(VALID_PREVIOUS_STATES) == set(TxnClientState)
    table = {(previous, target) for target, previous_states in VALID_PREVIOUS_STATES.items()
             for previous in previous_states}
    assert table == ALLOWED


@pytest.mark.parametrize(("current", "target"), sorted(ALLOWED))
def test_every_valid_transition_is_allowed(current: TxnClientState, target: TxnClientState) -> None:
    machine = machine_in(current)
    assert move(machine, target) is True
    assert machine.state is target


@pytest.mark.parametrize(("current", "target"),
                         sorted(set(itertools.product(TxnClientState, repeat=2)) - ALLOWED))
def test_every_invalid_transition_is_refused_and_changes_nothing(current: TxnClientState,
                                                                 target: TxnClientState) -> None:
    machine = machine_in(current)
    expected = {S.COMMITTED: TransactionAlreadyCommitted, S.ABORTED: TransactionAlreadyAborted}.get(
        current, InvalidTxnState)
    with pytest.raises(InvalidTxnState, match=f"{current} -> {target} not allowed") as refused:
        move(machine, target)
    assert type(refused.value) is expected
    assert machine.state is current
    assert move(machine, target, if_allowed=True) is False  # the quiet form: no error, no change
    assert machine.state is current
    onward = sorted(t for c, t in ALLOWED if c is current)
    if onward:  # the refusal left it usable from where it was
        move(machine, onward[0])
        assert machine.state is onward[0]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_open_machine_reads_timed_out_once_its_deadline_passed() -> None:
    clock = FakeClock()
    machine = TxnStateMachine(TXN, deadline=110.0, clock=clock)
    clock.now = 109.999
    assert machine.state is S.OPEN
    clock.now = 110.0
    assert machine.state is S.TIMED_OUT  # read, no call made
    with pytest.raises(InvalidTxnState, match="TIMED_OUT -> COMMITTING"):
        machine.transition_to(S.COMMITTING)
    assert machine.state is S.TIMED_OUT


@pytest.mark.parametrize("state", list(S))
def test_is_open_agrees_with_the_state_before_and_after_the_deadline(state: TxnClientState) -> None:
    """``is_open`` (the send and ack fast path) is ``state is OPEN``, deadline included; it
    compares the clock with ``open_until``, the deadline in OPEN and -inf in every other state."""
    clock = FakeClock()
    machine = machine_in(state, 110.0, clock)
    assert machine.open_until == (110.0 if state is S.OPEN else -math.inf)
    clock.now = 109.999
    assert machine.is_open() == (machine.state is S.OPEN)
    clock.now = 110.0
    assert machine.is_open() is False
    assert machine.is_open() == (machine.state is S.OPEN)
    assert machine.open_until == (110.0 if machine.state is S.OPEN else -math.inf)  # TIMED_OUT now


def test_a_transition_past_the_deadline_finds_the_machine_timed_out_first() -> None:
    clock = FakeClock()
    machine = TxnStateMachine(TXN, deadline=110.0, clock=clock)
    clock.now = 111.0  # nobody read the state since
    assert machine.transition_to(S.COMMITTING, if_allowed=True) is False
    assert machine.state is S.TIMED_OUT
    machine.transition_to(S.ABORTING)
    assert machine.state is S.ABORTING


@pytest.mark.parametrize("state", [S.ABORT_ONLY, S.COMMITTING, S.ABORTING, S.ERROR])
def test_only_an_open_machine_times_out(state: TxnClientState) -> None:
    clock = FakeClock()
    machine = TxnStateMachine(TXN, deadline=110.0, clock=clock)
    for step in PATHS[state]:
        move(machine, step)
    clock.now = 200.0
    assert machine.state is state


def test_abort_only_keeps_its_first_cause_and_needs_one() -> None:
    machine = TxnStateMachine(TXN)
    with pytest.raises(InvalidArgument):
        machine.transition_to(S.ABORT_ONLY)
    with pytest.raises(InvalidArgument):
        machine.transition_to(S.COMMITTING, cause=FAILURE)
    assert machine.state is S.OPEN and machine.cause is None
    first, second = MessageTooLarge("first"), TransactionConflict("second")
    assert machine.transition_to(S.ABORT_ONLY, cause=first) is True
    assert machine.transition_to(S.ABORT_ONLY, cause=second, if_allowed=True) is False
    assert machine.state is S.ABORT_ONLY and machine.cause is first


class LoopOnlyClient:
    """What a transaction uses of its client before it registers or ends: the client's loop (a
    real one), where its timeout timer runs."""

    def __init__(self) -> None:
        self.loop = BackgroundLoop("test-txn")


@pytest.fixture(scope="module")
def loop_client() -> Iterator[LoopOnlyClient]:
    client = LoopOnlyClient()
    yield client
    client.loop.stop()


def test_the_timeout_timer_check_times_out_only_an_open_machine_past_its_deadline() -> None:
    clock = FakeClock()
    machine = TxnStateMachine(TXN, deadline=110.0, clock=clock)
    assert machine.sendable is True
    clock.now = 109.75
    assert machine.time_out_if_due() == pytest.approx(0.25)  # early: armed again for the rest
    assert machine.sendable is True and machine.state is S.OPEN
    clock.now = 110.0
    assert machine.time_out_if_due() is None
    assert machine.sendable is False and machine.state is S.TIMED_OUT
    later = FakeClock()
    ended = machine_in(S.COMMITTED, 110.0, later)
    later.now = 120.0
    assert ended.time_out_if_due() is None and ended.state is S.COMMITTED


@pytest.mark.parametrize("state", list(S))
def test_a_machine_is_sendable_in_open_only(state: TxnClientState) -> None:
    assert machine_in(state, 110.0, FakeClock()).sendable is (state is S.OPEN)


def test_an_untouched_transaction_is_timed_out_by_its_timer(loop_client: LoopOnlyClient) -> None:
    txn = Transaction(loop_client, TXN, 0.2)  # type: ignore[arg-type]
    assert txn.machine.sendable is True
    time.sleep(0.4)
    # Nothing read its state: the timer moved it (open_until and sendable change only in a move).
    assert txn.machine.sendable is False and txn.machine.open_until == -math.inf
    assert txn.state is S.TIMED_OUT
    with pytest.raises(TransactionTimedOut):
        txn.check_open()


def test_a_transactions_state_changes_only_through_its_machine_and_reads_timed_out_by_itself(
        loop_client: LoopOnlyClient) -> None:
    txn = Transaction(loop_client, TXN, 0.2)  # type: ignore[arg-type]
    assert txn.state is S.OPEN
    with pytest.raises(AttributeError):
        txn.state = S.COMMITTED  # type: ignore[misc]
    txn.check_open()
    time.sleep(0.25)
    assert txn.state is S.TIMED_OUT
    with pytest.raises(TransactionTimedOut):
        txn.check_open()
    with pytest.raises(TransactionTimedOut), txn.operation():
        pass  # never entered
    assert txn.state is S.TIMED_OUT  # a refused operation does not poison


def test_a_failure_inside_an_operation_makes_the_transaction_abort_only(loop_client: LoopOnlyClient) -> None:
    txn = Transaction(loop_client, TXN, 60.0)  # type: ignore[arg-type]
    with pytest.raises(MessageTooLarge), txn.operation():
        raise FAILURE
    assert txn.state is S.ABORT_ONLY
    with pytest.raises(InvalidTxnState, match="earlier one failed") as refused, txn.operation():
        pass
    assert refused.value.__cause__ is FAILURE
    txn.fail(TransactionConflict("later"))
    assert txn.state is S.ABORT_ONLY


def test_with_aborts_exactly_the_unended_states() -> None:
    assert UNENDED_STATES == {S.OPEN, S.ABORT_ONLY, S.TIMED_OUT, S.COMMITTING}
    assert all(state in VALID_PREVIOUS_STATES[S.ABORTING] for state in UNENDED_STATES)
