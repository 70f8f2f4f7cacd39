"""The console's parts that need no engine: sessions and tokens' expiry, paging, rates, cell
formats, the error statuses, and the Grafana panels' reference page (the browser tests drive the
whole console: tests/integration/test_console.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from raytxn.auth import create_token, new_secret
from raytxn.console.app import Sessions, token_expiry
from raytxn.console.data import Rate, page_of
from raytxn.console.grafana import DASHBOARDS
from raytxn.console.pages import fmt_age, fmt_bytes, fmt_rate, status_of
from raytxn.errors import (
    ActorUnavailable,
    AuthenticationFailed,
    InvalidArgument,
    NotAuthorized,
    TopicNotFound,
    TransactionAlreadyCommitted,
    TransactionNotFound,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_session_ends_with_its_token_and_sessions_are_bounded() -> None:
    secret = new_secret()
    soon = create_token(secret, "alice", expires_at_s=time.time() + 2)
    assert token_expiry(soon) == pytest.approx(time.time() + 2, abs=1.5)
    assert token_expiry(create_token(secret, "admin")) is None
    assert token_expiry("not.a-jwt.!!") is None and token_expiry(None) is None
    sessions = Sessions(most=3)
    session = sessions.new(soon, {"principal": "alice", "superuser": False, "auth": True})
    assert sessions.get(session.session_id) is session and session.principal == "alice"
    time.sleep(2.1)  # (exp has a second's grain)
    assert sessions.get(session.session_id) is None  # its token expired: logged out
    made = [sessions.new(None, {"auth": False}) for _ in range(5)]
    assert [sessions.get(s.session_id) is not None for s in made] == [False, False, True, True, True]
    assert sessions.get(None) is None and sessions.get("forged") is None
    assert made[3].csrf != made[4].csrf and len(made[4].session_id) >= 40


def test_page_of_pages_and_refuses_pages_past_the_last() -> None:
    rows = list(range(120))
    assert page_of(rows, 1, 50) == (rows[:50], 3)
    assert page_of(rows, 3, 50) == (rows[100:], 3)
    assert page_of([], 1, 50) == ([], 1)
    with pytest.raises(InvalidArgument, match="past the last page"):
        page_of(rows, 4, 50)


def test_rates_start_over_with_a_new_incarnation() -> None:
    rate = Rate()
    assert rate.per_s("in/p", 1, 100, 10.0) is None  # a first reading: no rate yet
    assert rate.per_s("in/p", 1, 150, 12.0) == 25.0
    assert rate.per_s("in/p", 2, 5, 14.0) is None  # restarted: its counters start again
    assert rate.per_s("in/p", 2, 25, 16.0) == 10.0
    rate.forget_except(set())
    assert rate.per_s("in/p", 2, 30, 18.0) is None


def test_cells_and_statuses() -> None:
    assert (fmt_bytes(None), fmt_bytes(512), fmt_bytes(3 * 1024 * 1024)) == ("—", "512 B", "3.0 MiB")
    assert (fmt_rate(None), fmt_rate(1234.56)) == ("—", "1,234.6/s")
    assert (fmt_age(1500), fmt_age(90_000), fmt_age(7_200_000)) == ("1.5 s", "1.5 min", "2.0 h")
    assert [status_of(e) for e in (AuthenticationFailed("x"), NotAuthorized("x"), TopicNotFound("x"),
                                   TransactionNotFound("x"), InvalidArgument("x"), TransactionAlreadyCommitted("x"),
                                   ActorUnavailable("x"), RuntimeError("x"))] == [401, 403, 404, 404, 400, 409, 503,
                                                                                  500]


def test_the_reference_lists_every_grafana_panel() -> None:
    reference = (ROOT / "docs" / "reference" / "console.md").read_text()
    for dashboard in DASHBOARDS:
        for row in dashboard.rows:
            assert f"**{row.title}**" in reference, row.title
            for panel in row.panels:
                assert f"| {panel.title} |" in reference, panel.title
