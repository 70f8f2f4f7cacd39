"""What an operator does in the console, in a real browser against a real engine: shared by the
console's test modules (file:// and S3 storage)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import raytxn as rt
from raytxn.errors import RaytxnError
from tests.browser import WAIT_MS, cell_number, screenshot
from tests.engine import visible_values


@contextmanager
def producing(client: rt.Client, topic: str, max_s: float = 60.0) -> Iterator[list[int]]:
    """A producer sending to ``topic`` in a thread until the block ends (or ``max_s``, a bound);
    yields the list whose length is how many it sent."""
    sent: list[int] = []
    stop = threading.Event()
    producer = client.create_producer(topic)

    def run() -> None:
        deadline = time.monotonic() + max_s
        while not stop.is_set() and time.monotonic() < deadline:
            producer.send(f"tick-{len(sent)}".encode(), key=f"k{len(sent) % 8}")
            sent.append(1)
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(timeout=30)
        producer.flush()


def see_rate_move(page: Any, base: str, client: rt.Client, topic: str, shots: Path) -> float:
    """The topics page, left open, shows ``topic``'s rate in rise above 0 while a producer runs
    (the page refreshes itself: no reload). Returns the rate it showed."""
    page.goto(f"{base}/topics?q={topic}")
    cell = page.locator(f'tr[data-topic="{topic}"] td.rate-in')
    before = cell.inner_text()
    assert cell_number(before) in (None, 0.0), before
    loads = page.evaluate("performance.getEntriesByType('navigation').length")
    with producing(client, topic) as sent:
        page.wait_for_function(
            """([topic]) => {
                const cell = document.querySelector(`tr[data-topic="${topic}"] td.rate-in`);
                const value = cell && parseFloat(cell.textContent.replace(/,/g, ""));
                return value > 0;
            }""", arg=[topic], timeout=WAIT_MS)
        shown = cell_number(cell.inner_text())
        screenshot(page, "topics", shots)
        assert sent, "the producer sent nothing"
    assert page.evaluate("performance.getEntriesByType('navigation').length") == loads  # refreshed in place
    assert int(page.locator("#live").get_attribute("data-refreshes") or 0) >= 1
    assert shown is not None and shown > 0
    return shown


def open_hanging_txn(owner: rt.Client, topic: str, messages: int = 3) -> rt.Transaction:
    """A transaction left open with ``messages`` messages on ``topic`` (its owner went quiet)."""
    txn = owner.new_transaction(timeout=600)
    producer = owner.create_producer(topic)
    for i in range(messages):
        producer.send(f"hanging-{i}".encode(), key=f"h{i}", txn=txn)
    producer.flush()
    return txn


def abort_through_the_console(page: Any, watcher: Any, base: str, txn: rt.Transaction, topic: str,
                              shots: Path | None) -> None:
    """As a superuser: find the open transaction, see its messages pending in the message
    browser (``watcher``, a second page left open there), abort it through the confirmation,
    and see the browser's rows turn aborted by themselves."""
    txn_id = str(txn.id)
    page.goto(f"{base}/transactions")
    row = page.locator(f'#open-txns tr[data-txn="{txn_id}"]')
    row.wait_for()
    assert topic in row.inner_text()
    if shots is not None:
        screenshot(page, "transactions", shots)
    # the participant's link opens the message browser with this txn's rows highlighted
    watcher.goto(base + row.locator(f'a[href*="/topics/{topic}/partitions/0/messages"]').get_attribute("href"))
    mine = watcher.locator(f'#messages tr[data-txn="{txn_id}"][data-kind="data"]')
    mine.first.wait_for()
    assert set(mine.evaluate_all("rows => rows.map(r => r.dataset.state)")) == {"pending"}
    pending_rows = mine.count()
    if shots is not None:
        screenshot(watcher, "messages-pending", shots)
    row.locator("a.button").click()  # abort…: the confirmation page
    page.wait_for_selector("#confirm-abort")
    assert "Abort transaction" in page.inner_text("h1") and txn.id is not None
    if shots is not None:
        screenshot(page, "abort-confirm", shots)
    page.click("#confirm-abort")
    page.wait_for_selector("#outcome")
    assert "ABORTED" in page.inner_text("#outcome")
    # the browser page left open turns them aborted on its next refresh, an ABORT marker after them
    watcher.wait_for_function(
        """([txn]) => {
            const rows = [...document.querySelectorAll(`#messages tr[data-txn="${txn}"]`)];
            return rows.some(r => r.dataset.kind === "abort")
                && rows.filter(r => r.dataset.kind === "data").every(r => r.dataset.state === "aborted");
        }""", arg=[txn_id], timeout=WAIT_MS)
    assert mine.count() == pending_rows
    if shots is not None:
        screenshot(watcher, "messages-aborted", shots)


def check_aborted_in_the_engine(owner: rt.Client, txn: rt.Transaction, topic: str) -> None:
    """The abort was the engine's: the owner's commit fails, and no reader sees its messages."""
    try:
        txn.commit()
    except RaytxnError as error:
        assert "abort" in f"{type(error).__name__} {error}".lower(), error
    else:
        raise AssertionError("the owner's commit of an aborted transaction succeeded")
    assert not [v for v in visible_values(topic, token=owner.token) if v.startswith(b"hanging-")]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
