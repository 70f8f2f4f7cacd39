"""The operations console against an engine on S3 (SeaweedFS), in a real browser: the same
operator's work as on file:// (tests/integration/test_console.py), where every page's data
comes from actors whose state lives in the bucket: a topic's rate and stored bytes, a hanging
transaction aborted through the confirmation and its messages turning aborted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import raytxn as rt
from raytxn.auth import create_token, new_secret
from raytxn.cluster import stop_engine
from raytxn.console.app import start_console
from raytxn.tools.seaweedfs import SeaweedFS
from tests.browser import cell_number, chromium, login, new_page
from tests.conftest import TEST_BUCKET
from tests.console_flows import (
    abort_through_the_console,
    check_aborted_in_the_engine,
    open_hanging_txn,
    see_rate_move,
    unique,
)

pytestmark = [pytest.mark.ray, pytest.mark.s3, pytest.mark.slow(seconds=45)]

SECRET = new_secret()
ADMIN = create_token(SECRET, "admin")


@pytest.fixture(scope="module")
def admin(ray_session: object, seaweedfs: SeaweedFS) -> Iterator[rt.Client]:
    stop_engine()
    url = seaweedfs.url(TEST_BUCKET, f"console-{uuid.uuid4().hex[:8]}")
    client = rt.connect(storage=url, storage_options=seaweedfs.storage_options(), deadline_s=120,
                        auth_secret=SECRET, token=ADMIN)
    try:
        yield client
    finally:
        client.close()
        stop_engine(ADMIN)


@pytest.fixture(scope="module")
def base(admin: rt.Client) -> Iterator[str]:
    served = start_console(0, refresh_s=1.0)
    try:
        yield served["url"].rstrip("/")
    finally:
        ray.kill(served["actor"], no_restart=True)


def test_the_console_on_s3(admin: rt.Client, base: str, tmp_path: Path) -> None:
    assert admin.config.storage_url.startswith("s3://")
    topic = unique("s3-orders")
    admin.create_topic(topic, partitions=1)
    with chromium() as browser:
        page: Any = new_page(browser)
        watcher: Any = new_page(browser)
        login(page, base, ADMIN)
        login(watcher, base, ADMIN)
        assert see_rate_move(page, base, admin, topic, tmp_path) > 0
        stored = page.locator(f'tr[data-topic="{topic}"] td.stored')
        page.wait_for_function(f"""() => parseFloat(document.querySelector('tr[data-topic="{topic}"] td.stored')
                                   ?.textContent) > 0""")
        assert (cell_number(stored.inner_text()) or 0) > 0  # the partition's objects in the bucket
        txn = open_hanging_txn(admin, topic)
        abort_through_the_console(page, watcher, base, txn, topic, None)
    check_aborted_in_the_engine(admin, txn, topic)
