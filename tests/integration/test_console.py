"""The operations console in a real browser (Playwright driving Debian's chromium) against a real
engine on file:// storage with authentication on: logins, a topic's rate moving while a producer
runs, a hanging transaction found and aborted by a superuser through the confirmation (its
messages turning aborted in the message browser), a non-superuser's refusals, a backlog counted
in messages (markers and aborted messages not), the health page, and 4xx pages for bad input.

``RAYTXN_DOCS_SCREENSHOTS=1`` also writes the screenshots the console guide shows."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.auth import create_token, new_secret
from raytxn.console.app import start_console
from raytxn.ids import NAMESPACE, partition_actor_name
from tests.browser import WAIT_MS, cell_number, chromium, login, new_page, screenshot
from tests.console_flows import (
    abort_through_the_console,
    check_aborted_in_the_engine,
    open_hanging_txn,
    see_rate_move,
    unique,
)
from tests.engine import engine_client, restart_actor

pytestmark = [pytest.mark.ray, pytest.mark.slow(seconds=8)]  # 8 tests, about 65 s with the engine's start

SECRET = new_secret()
ADMIN = create_token(SECRET, "admin")
ALICE = create_token(SECRET, "alice")


@pytest.fixture(scope="module")
def admin(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, token=ADMIN, auth_secret=SECRET)


@pytest.fixture(scope="module")
def alice(admin: rt.Client) -> Iterator[rt.Client]:
    client = rt.connect(token=ALICE)
    yield client
    client.close()


@pytest.fixture(scope="module")
def base(admin: rt.Client) -> Iterator[str]:
    served = start_console(0, refresh_s=1.0)
    try:
        yield served["url"].rstrip("/")
    finally:
        ray.kill(served["actor"], no_restart=True)


@pytest.fixture(scope="module")
def browser(base: str) -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return tmp_path


def test_login_takes_a_genuine_token_only(browser: Any, base: str) -> None:
    page = new_page(browser)
    response = page.goto(base + "/topics")
    assert page.url.startswith(base + "/login") and response.status == 200  # sent to the login first
    page.fill("#token", create_token(new_secret(), "admin"))  # signed with another secret
    page.click("#login")
    assert "AuthenticationFailed" in page.inner_text("#error-message")
    login(page, base, ADMIN)
    assert page.url == base + "/topics"  # back where it was going
    assert page.inner_text("#principal") == "admin" and page.locator(".badge.super").count() == 1


def test_a_topics_rate_moves_while_a_producer_runs(browser: Any, base: str, admin: rt.Client,
                                                   shots: Path) -> None:
    topic = unique("rate")
    admin.create_topic(topic, partitions=2)
    page = new_page(browser)
    login(page, base, ADMIN)
    assert see_rate_move(page, base, admin, topic, shots) > 0


def test_a_superuser_aborts_a_hanging_transaction(browser: Any, base: str, admin: rt.Client, alice: rt.Client,
                                                  shots: Path) -> None:
    topic = unique("orders")
    admin.create_topic(topic, partitions=1)
    admin.grant_permission(topic, "alice", ["produce", "consume"])
    txn = open_hanging_txn(alice, topic)  # alice's client went quiet with it open
    page, watcher = new_page(browser), new_page(browser)
    login(page, base, ADMIN)
    login(watcher, base, ADMIN)
    abort_through_the_console(page, watcher, base, txn, topic, shots)
    check_aborted_in_the_engine(alice, txn, topic)


def test_a_non_superuser_sees_refusals(browser: Any, base: str, admin: rt.Client, alice: rt.Client,
                                       shots: Path) -> None:
    topic = unique("theirs")
    admin.create_topic(topic, partitions=1)
    admin.grant_permission(topic, "alice", ["produce"])  # produce only: no consume
    txn = open_hanging_txn(admin, topic, messages=1)
    page = new_page(browser)
    login(page, base, ALICE)
    assert page.locator(".badge.super").count() == 0
    response = page.goto(base + "/transactions")  # listing every txn is a superuser's
    assert response.status == 403
    assert "'alice' is not a superuser" in page.inner_text("#error-message")
    screenshot(page, "refused", shots)
    response = page.goto(f"{base}/topics/{topic}/partitions/0/messages")  # browsing needs consume
    assert response.status == 403 and "no consume permission" in page.inner_text("#error-message")
    # The abort's confirmation shows; the abort is refused by the engine, and changes nothing.
    page.goto(f"{base}/transactions/{txn.id}/abort")
    page.click("#confirm-abort")
    assert "NotAuthorized" in page.inner_text("#error-message")
    assert admin.describe_transaction(txn.id)["state"] == "OPEN"
    page.goto(base + "/topics")  # reading metadata is every authenticated principal's
    assert page.locator("#topics").count() == 1
    txn.abort()


def test_backlog_counts_messages_not_markers(browser: Any, base: str, admin: rt.Client, shots: Path) -> None:
    """Three committed transactions of two messages, an aborted one, a plain message: 7 to
    consume, though the partition holds 13 offsets. Consumed and acked: 0, not the 4 markers."""
    topic = unique("eos")
    admin.create_topic(topic, partitions=1)
    producer = admin.create_producer(topic)
    for i in range(4):
        txn = admin.new_transaction()
        producer.send(f"m{i}a".encode(), txn=txn)
        producer.send(f"m{i}b".encode(), txn=txn)
        txn.commit() if i < 3 else txn.abort()
    producer.send(b"plain")
    producer.flush()
    consumer = admin.subscribe(topic, "billing", initial_position="earliest")  # attached: a live subscription
    page = new_page(browser)
    login(page, base, ADMIN)
    page.goto(f"{base}/topics/{topic}/subscriptions/billing")
    backlog = page.locator('#partitions tr[data-partition="0"] td.backlog')
    page.wait_for_function("() => document.querySelector('#partitions tr td.backlog')?.textContent.trim() === '7'")
    assert admin.subscription_stats(topic, "billing")[0]["backlog_messages"] == 7
    with admin.transaction() as txn:
        for _ in range(7):
            consumer.acknowledge(consumer.receive(timeout=10), txn=txn)
    page.wait_for_function("() => document.querySelector('#partitions tr td.backlog')?.textContent.trim() === '0'",
                           timeout=WAIT_MS)
    assert cell_number(backlog.inner_text()) == 0
    stats = admin.subscription_stats(topic, "billing")[0]
    assert stats["backlog_messages"] == 0 and stats["backlog_exact"]
    page.goto(f"{base}/groups/billing")  # a Kafka group's lag is the same count
    page.wait_for_selector(f'#group-offsets tr[data-partition="{topic}/0"]')
    assert cell_number(page.inner_text(f'#group-offsets tr[data-partition="{topic}/0"] td.lag')) == 0
    screenshot(page, "group", shots)
    consumer.close()


def test_health_shows_a_restart(browser: Any, base: str, admin: rt.Client, shots: Path) -> None:
    topic = unique("health")
    admin.create_topic(topic, partitions=1)
    admin.create_producer(topic).send(b"wake")  # its partition actor starts
    page = new_page(browser)
    login(page, base, ADMIN)
    page.goto(base + "/health")
    assert "Healthy" in page.inner_text("#healthy")
    assert page.locator("#coordinators tr", has_text="ALIVE").count() == 2
    restart_actor(partition_actor_name(topic, 0))
    page.goto(f"{base}/health?kind=partition&state=ALIVE")
    row = page.locator("#actors tr", has_text=partition_actor_name(topic, 0))
    page.wait_for_function(
        """([name]) => [...document.querySelectorAll('#actors tr')].some(
            r => r.textContent.includes(name) && r.children[5].textContent.trim() === '1')""",
        arg=[partition_actor_name(topic, 0)], timeout=WAIT_MS)
    assert row.locator("td").nth(5).inner_text() == "1"  # restarts
    screenshot(page, "health", shots)
    assert ray.get_actor(partition_actor_name(topic, 0), namespace=NAMESPACE) is not None


BAD_INPUT = [
    ("/topics/no-such-topic", 404, "does not exist"),
    ("/topics/bad..name", 400, "invalid topic name"),
    ("/transactions/garbage", 400, "not a transaction id"),
    ("/transactions/txn(7,1)", 404, "no coordinator 7"),
    ("/topics?page=abc", 400, "page must be a whole number"),
    ("/topics?page=0", 400, "page must be in 1.."),
    ("/topics?page=999", 400, "past the last page"),
    ("/health?page=-3", 400, "page must be in 1.."),
    ("/nowhere", 404, "no such page"),
]


def test_bad_input_gets_a_clear_4xx_page(browser: Any, base: str) -> None:
    page = new_page(browser)
    login(page, base, ADMIN)
    for path, status, says in BAD_INPUT:
        response = page.goto(base + path)
        assert (response.status, says in page.inner_text("main")) == (status, True), path
        assert "Traceback" not in page.content()


def test_bad_partition_offset_and_forms(browser: Any, base: str, admin: rt.Client) -> None:
    topic = unique("bad")
    admin.create_topic(topic, partitions=2)
    page = new_page(browser)
    login(page, base, ADMIN)
    for path, status, says in [(f"/topics/{topic}/partitions/5/messages", 404, "partitions 0..1"),
                               (f"/topics/{topic}/partitions/x/messages", 400, "whole number"),
                               (f"/topics/{topic}/partitions/0/messages?offset=99", 400, "outside this partition"),
                               (f"/topics/{topic}/partitions/0/messages?size=100000", 400, "size must be in"),
                               (f"/topics/{topic}/subscriptions/none", 404, "no subscription")]:
        response = page.goto(base + path)
        assert (response.status, says in page.inner_text("main")) == (status, True), path
    # a form posted with the session's cookie but not from its pages (no CSRF token): refused
    txn = open_hanging_txn(admin, topic, messages=1)
    cookie = next(c["value"] for c in page.context.cookies() if c["name"] == "raytxn_console")
    request = urllib.request.Request(f"{base}/transactions/{txn.id}/abort", data=b"csrf=forged", method="POST",
                                     headers={"Cookie": f"raytxn_console={cookie}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403 and "not from your session" in refused.value.read().decode()
    assert admin.describe_transaction(txn.id)["state"] == "OPEN"
    txn.abort()
