"""What operators type: durations (``--older-than 30s``), transaction ids (``0,42``), a
subscription's stale-txn check interval, and when coordinators answer commits."""

from __future__ import annotations

import pytest

from raytxn.client.client import _engine_config
from raytxn.config import COMMIT_ANSWERS, CoordinatorConfig, SubscriptionConfig, parse_duration
from raytxn.errors import InvalidArgument
from raytxn.ids import TxnID, parse_txn_id


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("2d", 172800.0), ("250ms", 0.25), (" 1.5s ", 1.5),
    ("0s", 0.0), ("45", 45.0), (10, 10.0), (0.5, 0.5),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "s", "-1s", "1h30m", "1e3s", "thirty", None, True, -1, float("inf"),
                                  float("nan"), [30]])
def test_malformed_durations_are_invalid_argument(text: object) -> None:
    with pytest.raises(InvalidArgument, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["txn(0,42)", "0,42", " 0 , 42 ", "txn( 0, 42 )", TxnID(0, 42)])
def test_txn_ids(text: object) -> None:
    assert parse_txn_id(text) == TxnID(0, 42)


@pytest.mark.parametrize("text", ["", "42", "txn(0,42", "0,42)", "0;42", "-1,2", "a,b", "txn0,42", None, (0, 42)])
def test_malformed_txn_ids_are_invalid_argument(text: object) -> None:
    with pytest.raises(InvalidArgument, match="not a transaction id"):
        parse_txn_id(text)


@pytest.mark.parametrize("seconds", [0, -1, 0.0, float("nan"), float("inf"), None, "5", True])
def test_a_stale_txn_check_interval_that_is_not_a_positive_number_is_invalid_argument(seconds: object) -> None:
    with pytest.raises(InvalidArgument, match="stale_txn_check_s"):
        SubscriptionConfig(stale_txn_check_s=seconds)  # type: ignore[arg-type]
    assert SubscriptionConfig(stale_txn_check_s=0.25).stale_txn_check_s == 0.25


@pytest.mark.parametrize("answer", COMMIT_ANSWERS)
def test_commit_answers_are_taken_by_the_config_and_by_connect(answer: str) -> None:
    assert CoordinatorConfig(commit_answer=answer).commit_answer == answer
    assert _engine_config("file:///tmp/x", {}, {"commit_answer": answer}).coordinator.commit_answer == answer


@pytest.mark.parametrize("answer", ["", "Logged", "decided", "markers", None, 1, True])
def test_an_unknown_commit_answer_is_invalid_argument(answer: object) -> None:
    with pytest.raises(InvalidArgument, match="commit_answer must be one of applied, logged"):
        CoordinatorConfig(commit_answer=answer)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="commit_answer"):
        _engine_config("file:///tmp/x", {}, {"commit_answer": answer})


def test_the_last_records_linger_is_taken_by_connect_and_a_negative_one_refused() -> None:
    assert CoordinatorConfig().complete_linger_ms > 0  # on by default
    assert _engine_config("file:///tmp/x", {}, {"complete_linger_ms": 0}).coordinator.complete_linger_ms == 0
    for linger in (-1, float("nan")):
        with pytest.raises(InvalidArgument, match="complete_linger_ms must be >= 0"):
            CoordinatorConfig(complete_linger_ms=linger)
        with pytest.raises(InvalidArgument, match="complete_linger_ms"):
            _engine_config("file:///tmp/x", {}, {"complete_linger_ms": linger})
