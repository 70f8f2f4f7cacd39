"""The pure rules of a subscription's stale-txn check (``raytxn.protocol.stale_txns``): which
pending txns it asks their coordinators about, and which answers prove a txn ended."""

from __future__ import annotations

from raytxn.ids import TxnID
from raytxn.protocol.stale_txns import StaleTxns


def test_a_txn_is_due_once_pending_for_the_interval_oldest_first_and_at_most_a_round_full() -> None:
    stale = StaleTxns(after_s=1.0, max_per_round=2)
    a, b, c = TxnID(0, 5), TxnID(1, 1), TxnID(0, 2)
    assert stale.due([a], now=0.0) == []
    assert stale.due([a, b], now=0.5) == []
    assert stale.due([a, b, c], now=1.0) == [a]
    assert stale.due([a, b, c], now=2.0) == [a, b]  # c is as stale as b but younger: next round
    assert stale.due([b, c], now=2.5) == [b, c]
    assert stale.due([c, a], now=3.0) == [c]  # a left and came back: pending anew


def test_which_answers_prove_a_txn_ended() -> None:
    stale = StaleTxns(after_s=1.0)
    txn = TxnID(0, 7)
    for state in ("COMMITTED", "ABORTED", "ABORTING"):
        assert stale.ended(txn, state, now=0.0)
    for state in ("OPEN", "COMMITTING"):
        assert not stale.ended(txn, state, now=0.0)
    assert stale.ended(txn, None, now=0.0, low_watermark=7)       # unknown below the watermark
    assert not stale.ended(txn, None, now=0.0, low_watermark=6)   # unknown above it: maybe a zombie's answer


def test_an_open_txn_is_not_asked_about_again_before_its_deadline() -> None:
    stale = StaleTxns(after_s=1.0)
    txn = TxnID(0, 1)
    stale.due([txn], now=0.0)
    assert stale.due([txn], now=1.0) == [txn]
    assert not stale.ended(txn, "OPEN", now=1.0, deadline_in_s=5.0)
    assert stale.due([txn], now=5.9) == []
    assert stale.due([txn], now=6.0) == [txn]
