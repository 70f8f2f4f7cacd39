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
import ray

import runtime as rt
from runtime.client import SUPERVISOR_NAME
from runtime.ids import NAMESPACE


def stop_engine() -> None:
    """Stop the engine's actors but leave the session's Ray running."""
    try:
        supervisor = ray.get_actor(SUPERVISOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return
    ray.get(supervisor.shutdown_actors.remote())
    ray.kill(supervisor, no_restart=True)


def engine_client(tmp_path_factory: pytest.TempPathFactory, **config: Any) -> Iterator[rt.Client]:
    stop_engine()  # a previous module's engine, if its teardown did not run
    client = rt.connect(storage=f"file://{tmp_path_factory.mktemp('engine')}", **config)
    try:
        yield client
    finally:
        client.close()
        stop_engine()
