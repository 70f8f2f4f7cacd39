"""How fast the console's pages load at scale (``raytxn bench console``): an engine with 1,000
topics (each with a subscription; catalog entries, dormant until used) and 100 open transactions
(each on its own topic, so 100 partitions are live, in actor hosts), authentication on, and the
console serving it. Each page is fetched over HTTP as a logged-in superuser; beside it, in
interleaved rounds, its floor: the engine calls that page makes, made from this driver with the
same token (the catalog, the coordinators' open transactions and recent outcomes, the health
rows, a partition's page of messages). A page's figure is its p50 over its floor's p50, and
``under_1s`` says whether its p50 is within the issue's 1 s. With Debian's chromium and
Playwright at hand, a real browser's load of the heaviest pages (navigation to the load event)
is measured too.

The pages' shared stats snapshot is refreshed in the background (``raytxn.console.data``): its
cost (calls, seconds) is reported with the topics page, not added to any page's time.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import ray

import raytxn as rt
from raytxn.auth import create_token, new_secret
from raytxn.client.rpc import ActorRef
from raytxn.cluster import stop_engine
from raytxn.console.pages import PAGE_SIZE
from raytxn.ids import partition_actor_name

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _opener(base: str, token: str) -> Any:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/login", data=urllib.parse.urlencode({"token": token}).encode(), timeout=60) as r:
        assert r.status == 200, r.status
    return opener


def _timed_get(opener: Any, url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with opener.open(url, timeout=60) as response:
        body = response.read().decode()
        assert response.status == 200, (url, response.status)
    return (time.perf_counter() - started) * 1000, body


def _timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _pages(client: rt.Client, first_topic: str, topics: int) -> list[tuple[str, str, Callable[[], Any]]]:
    """(page, path, its floor: the engine calls it makes, through refs looked up once, as the
    console's are)."""
    partition = ActorRef(partition_actor_name(first_topic, 0), client.token)
    return [
        ("topics", "/topics", client.list_topics),
        ("topics, last page", f"/topics?page={-(-topics // PAGE_SIZE)}", client.list_topics),
        ("subscriptions", "/subscriptions", client.list_topics),
        ("kafka groups", "/groups", client.list_topics),
        ("transactions", "/transactions", lambda: (client.list_transactions(0, 1000), client.recent_transactions(20))),
        ("health", "/health", client.health),
        ("topic", f"/topics/{first_topic}", lambda: client.get_topic(first_topic)),
        ("message browser", f"/topics/{first_topic}/partitions/0/messages",
         lambda: (client.get_topic(first_topic), partition.call("browse", None, 50))),
    ]


def _browser_loads(base: str, token: str, paths: list[str], rounds: int) -> dict[str, float]:
    """p50 ms of a real browser's navigation to each path (to its load event), if chromium and
    Playwright are here; else nothing."""
    if not os.access(CHROMIUM, os.X_OK):
        return {}
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {}
    loads: dict[str, list[float]] = {path: [] for path in paths}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{base}/login")
            page.fill("#token", token)
            page.click("#login")
            page.wait_for_selector("#principal")
            for _ in range(rounds):
                for path in paths:
                    page.goto(base + path, wait_until="load")
                    timing = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
                    entry = json.loads(timing)
                    loads[path].append(entry["loadEventEnd"] - entry["startTime"])
        finally:
            browser.close()
    return {path: statistics.median(values) for path, values in loads.items()}


def bench_console(short: bool = False, progress: Callable[[str], None] = print, topics: int | None = None,
                  txns: int | None = None, rounds: int | None = None) -> list[dict]:
    """Page loads with ``topics`` topics and ``txns`` open transactions, as ratios to the calls
    each page makes."""
    from raytxn.console.app import start_console

    topics = topics or (200 if short else 1000)
    txns = txns or (20 if short else 100)
    rounds = rounds or (5 if short else 20)
    if not ray.is_initialized():
        ray.init(namespace="raytxn", include_dashboard=False, logging_level="ERROR")
    stop_engine()
    secret = new_secret()
    admin = create_token(secret, "admin")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-console-')}", auth_secret=secret,
                        token=admin, actor_hosts=2)
    served = None
    open_txns: list[rt.Transaction] = []
    try:
        names = [f"console-{i:04d}" for i in range(topics)]
        client.create_topics(names, partitions=1, subscriptions=["billing"])
        progress(f"  {topics} topics made; opening {txns} transactions")
        for name in names[:txns]:
            txn = client.new_transaction(timeout=900)  # the longest allowed: open through the run
            client.create_producer(name).send(b"held open", key="k", txn=txn)
            open_txns.append(txn)
        served = start_console(0, refresh_s=2.0)
        base = served["url"].rstrip("/")
        opener = _opener(base, admin)
        pages = _pages(client, names[0], topics)
        for _, path, floor in pages:  # warm: the first load waits for the first snapshot
            _timed_get(opener, base + path)
            floor()
        page_ms: dict[str, list[float]] = {name: [] for name, _, _ in pages}
        floor_ms: dict[str, list[float]] = {name: [] for name, _, _ in pages}
        sizes: dict[str, int] = {}
        for _ in range(rounds):  # interleaved: a page, then its floor
            for name, path, floor in pages:
                elapsed, body = _timed_get(opener, base + path)
                page_ms[name].append(elapsed)
                sizes[name] = len(body)
                floor_ms[name].append(_timed(floor))
        _, body = _timed_get(opener, f"{base}/topics?fragment=1")
        refresh = re.search(r"\((\d+) calls in\s+([\d.]+) s", body)
        browser = _browser_loads(base, admin, ["/topics", "/transactions", "/health"], max(3, rounds // 4))
        rows = []
        for name, path, _ in pages:
            row = console_row(name, topics, txns, page_ms[name], floor_ms[name], sizes[name], browser.get(path))
            if name == "topics" and refresh is not None:
                row["snapshot_calls"], row["snapshot_s"] = int(refresh.group(1)), float(refresh.group(2))
            shown = "" if row["browser_p50_ms"] is None else f", in a browser {row['browser_p50_ms']:.0f} ms"
            progress(f"  {name:18} p50 {row['p50_ms']:7.1f} ms (floor {row['floor_p50_ms']:6.1f} ms, "
                     f"{row['vs_floor']}x){shown}")
            rows.append(row)
        return rows
    finally:
        for txn in open_txns:
            txn.abort()
        if served is not None:
            ray.kill(served["actor"], no_restart=True)
        client.close()
        stop_engine(admin)


def console_row(page: str, topics: int, txns: int, page_ms: list[float], floor_ms: list[float], size: int,
                browser_ms: float | None) -> dict[str, Any]:
    ordered = sorted(page_ms)
    p50, floor = statistics.median(page_ms), statistics.median(floor_ms)
    return {"bench": "console", "page": page, "topics": topics, "open_txns": txns, "loads": len(page_ms),
            "bytes": size, "p50_ms": round(p50, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
            "floor_p50_ms": round(floor, 1), "vs_floor": round(p50 / floor, 2) if floor > 0 else None,
            "browser_p50_ms": None if browser_ms is None else round(browser_ms, 1), "under_1s": p50 <= 1000}
