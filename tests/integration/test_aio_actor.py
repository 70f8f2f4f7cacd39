"""``raytxn.aio`` in an async Ray actor: the actor consumes, transforms and produces in
transactions while its other async methods are called, and while a subscription, a partition and
a coordinator of the engine are killed one after the other. Every input shows exactly once in the
output (read committed), and the actor answers every request meanwhile within
``REQUEST_BOUND_S``; the same actor receiving with the sync API on its loop fails that bound
(tests/aio_workload.py holds the service and the driver)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import ray

import raytxn as rt
from raytxn.ids import coordinator_actor_name, partition_actor_name, subscription_actor_name
from tests.aio_workload import (
    RECEIVE_TIMEOUT_S,
    Requests,
    Run,
    Transformer,
    check_answered,
    check_exactly_once,
    run_under_kills,
)
from tests.engine import activate, engine_client, new_topic, restart_actor, visible_values

pytestmark = pytest.mark.ray

TransformerActor = ray.remote(num_cpus=0, max_restarts=0)(Transformer)
INPUTS = 120


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


@pytest.mark.slow(seconds=45)
def test_an_async_actor_is_exactly_once_and_answers_requests_while_engine_actors_are_killed(
        client: rt.Client) -> None:
    source, sink = new_topic(client, 2, "in"), new_topic(client, 1, "out")
    activate(sink)
    actor = TransformerActor.remote(client.config.storage_url, source, sink, "transform")
    try:
        ray.get(actor.start.remote(), timeout=120)
        victims = [subscription_actor_name(source, 0, "transform"), partition_actor_name(sink, 0),
                   coordinator_actor_name(0)]

        def status() -> dict:
            return ray.get(actor.status.remote(), timeout=60)

        run = run_under_kills(client, status, status, source, INPUTS, victims, restart_actor)
        print(run.summary())
        assert run.status["workers_alive"] == 3, run.summary()
        ray.get(actor.stop.remote(), timeout=120)
    finally:
        ray.kill(actor)
    check_answered(run)
    check_exactly_once(visible_values(sink), INPUTS, run)


@pytest.mark.extended  # the suite's budget (25 s): the async actor's exactly-once test stays
@pytest.mark.slow(seconds=15)
def test_the_same_actor_receiving_with_the_sync_api_fails_the_request_bound(client: rt.Client) -> None:
    """The check above can fail: with a sync receive on its loop, a request waits for it."""
    source, sink = new_topic(client, 1, "in"), new_topic(client, 1, "out")
    actor = TransformerActor.remote(client.config.storage_url, source, sink, "transform", workers=1, blocking=True)
    try:
        ray.get(actor.start.remote(), timeout=120)
        run = Run()
        with Requests(lambda: ray.get(actor.status.remote(), timeout=60), run):
            time.sleep(RECEIVE_TIMEOUT_S + 1)  # the worker's receive waits on the empty topic, holding the loop
        print(run.summary())
    finally:
        ray.kill(actor)
    with pytest.raises(AssertionError, match="a request waited"):
        check_answered(run)
