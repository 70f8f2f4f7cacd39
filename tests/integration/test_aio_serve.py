"""``raytxn.aio`` in a Ray Serve deployment: its replica starts a consume-transform-produce loop
(transactions, ``raytxn.aio``) in its constructor and serves HTTP and handle requests meanwhile,
while a subscription, a partition and a coordinator of the engine are killed one after the
other. Every input shows exactly once in the output (read committed), and every request is
answered within ``REQUEST_BOUND_S`` (tests/aio_workload.py; tests/integration/test_aio_actor.py
shows that bound failing a loop held by a sync receive). Serve runs on the session's Ray with its
HTTP proxy on a free loopback port, and is shut down at the module's end."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from ray import serve

import raytxn as rt
from raytxn.ids import coordinator_actor_name, partition_actor_name, subscription_actor_name
from tests.aio_workload import Transformer, check_answered, check_exactly_once, run_under_kills
from tests.engine import activate, engine_client, new_topic, restart_actor, visible_values

pytestmark = pytest.mark.ray

INPUTS = 120
APP = "aio-transformer"


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
class ServeTransformer(Transformer):
    """The service as a Serve deployment: its loop starts with the replica."""

    async def __init__(self, storage_url: str, source: str, sink: str, subscription: str) -> None:  # type: ignore[misc]
        super().__init__(storage_url, source, sink, subscription)
        await self.start()

    async def __call__(self, request: Any) -> dict[str, Any]:
        return await self.status()


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_port(client: rt.Client) -> Iterator[int]:
    """Serve on the session's Ray, its HTTP proxy on a free loopback port; shut down at the end."""
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()


@pytest.mark.slow(seconds=60)
def test_a_serve_replica_is_exactly_once_and_answers_requests_while_engine_actors_are_killed(
        client: rt.Client, serve_port: int) -> None:
    source, sink = new_topic(client, 2, "in"), new_topic(client, 1, "out")
    activate(sink)
    handle = serve.run(ServeTransformer.bind(client.config.storage_url, source, sink, "transform"), name=APP,
                       route_prefix="/transformer")
    url = f"http://127.0.0.1:{serve_port}/transformer"
    ways = itertools.cycle(["http", "handle"])
    lock = threading.Lock()

    def by_handle() -> dict[str, Any]:
        return handle.status.remote().result(timeout_s=60)

    def request() -> dict[str, Any]:  # every other one over HTTP, through Serve's proxy
        with lock:
            way = next(ways)
        if way == "handle":
            return by_handle()
        answer = requests.get(url, timeout=60)
        answer.raise_for_status()
        return answer.json()

    try:
        victims = [subscription_actor_name(source, 0, "transform"), partition_actor_name(sink, 0),
                   coordinator_actor_name(0)]
        run = run_under_kills(client, request, by_handle, source, INPUTS, victims, restart_actor)
        print(run.summary())
        assert run.status["workers_alive"] == 3, run.summary()
        handle.stop.remote().result(timeout_s=120)
    finally:
        serve.delete(APP)
    check_answered(run)
    check_exactly_once(visible_values(sink), INPUTS, run)
