"""A whole engine (supervisor, coordinators, partition and subscription actors) for a test module,
on the session's Ray, with its own storage directory. Use from a module-scoped fixture:

    @pytest.fixture(scope="module")
    def client(ray_session, tmp_path_factory):
        yield from engine_client(tmp_path_factory)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import runtime as rt
from runtime.cluster import stop_engine


def engine_client(tmp_path_factory: pytest.TempPathFactory, **config: Any) -> Iterator[rt.Client]:
    stop_engine()  # a previous module's engine, if its teardown did not run
    client = rt.connect(storage=f"file://{tmp_path_factory.mktemp('engine')}", **config)
    try:
        yield client
    finally:
        client.close()
        stop_engine()
