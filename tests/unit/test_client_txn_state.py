"""The client transaction's state machine: every transition the table allows happens, every other
one is refused with a specific error and changes nothing. No Ray: the machine is pure."""

from __future__ import annotations

import itertools

import pytest

from raytxn.client.transaction import (
    VALID_PREVIOUS_STATES,
    Transaction,
    TxnClientState,
    TxnStateMachine,
)
from raytxn.errors import InvalidTxnState, TransactionAlreadyAborted, TransactionAlreadyCommitted
from raytxn.ids import TxnID

S = TxnClientState
TXN = TxnID(0, 7)

# Written out apart from the table: what commit and abort do (see Transaction.commit/abort).
ALLOWED = {
    (S.OPEN, S.COMMITTING),  # commit
    (S.COMMITTING, S.COMMITTED),  # the coordinator committed it
    (S.COMMITTING, S.ERROR),  # the coordinator refused the commit
    (S.OPEN, S.ABORTING),  # abort
    (S.COMMITTING, S.ABORTING),  # a send or ack of the committing txn failed
    (S.ABORTING, S.ABORTING),  # abort again after one interrupted before its answer
    (S.ERROR, S.ABORTING),  # abort after a refused end
    (S.ABORTING, S.ABORTED),
    (S.ABORTING, S.ERROR),  # the coordinator refused the abort
}

# A way to each state from a new machine, through allowed transitions only.
PATHS = {
    S.OPEN: [],
    S.COMMITTING: [S.COMMITTING],
    S.COMMITTED: [S.COMMITTING, S.COMMITTED],
    S.ABORTING: [S.ABORTING],
    S.ABORTED: [S.ABORTING, S.ABORTED],
    S.ERROR: [S.COMMITTING, S.ERROR],
}


def machine_in(state: TxnClientState) -> TxnStateMachine:
    machine = TxnStateMachine(TXN)
    for step in PATHS[state]:
        machine.transition_to(step)
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
    machine.transition_to(target)
    assert machine.state is target


@pytest.mark.parametrize(("current", "target"),
                         sorted(set(itertools.product(TxnClientState, repeat=2)) - ALLOWED))
def test_every_invalid_transition_is_refused_and_changes_nothing(current: TxnClientState,
                                                                 target: TxnClientState) -> None:
    machine = machine_in(current)
    expected = {S.COMMITTED: TransactionAlreadyCommitted, S.ABORTED: TransactionAlreadyAborted}.get(
        current, InvalidTxnState)
    with pytest.raises(InvalidTxnState, match=f"{current} -> {target} not allowed") as refused:
        machine.transition_to(target)
    assert type(refused.value) is expected
    assert machine.state is current
    onward = sorted(t for c, t in ALLOWED if c is current)
    if onward:  # the refusal left it usable from where it was
        machine.transition_to(onward[0])
        assert machine.state is onward[0]


def test_a_transactions_state_changes_only_through_its_machine() -> None:
    txn = Transaction(None, TXN, 1.0)  # type: ignore[arg-type]  # the client is only used to register and end
    assert txn.state is S.OPEN
    with pytest.raises(AttributeError):
        txn.state = S.COMMITTED  # type: ignore[misc]
    assert txn.state is S.OPEN
    txn.check_open()
