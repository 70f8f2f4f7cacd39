"""Starting and finding the engine's actors on a Ray cluster."""

from __future__ import annotations

import time
from typing import Any

import ray

from raytxn.config import EngineConfig
from raytxn.errors import NotAuthorized, RaytxnError
from raytxn.ids import NAMESPACE, SUPERVISOR_NAME, coordinator_actor_name


def start_coordinators(config: EngineConfig, wait: bool = True) -> list[Any]:
    """Create the coordinators ``tc-0..N-1`` unless they run already; wait for their recovery."""
    from raytxn.actors.coordinator import CoordinatorActor

    handles = [
        CoordinatorActor.options(name=coordinator_actor_name(tc_id), namespace=NAMESPACE, lifetime="detached",
                                 get_if_exists=True).remote(
            tc_id, config.storage_url, config.storage_options, config.coordinator, auth=config.auth)
        for tc_id in range(config.coordinator.num_coordinators)
    ]
    if wait:
        ray.get([h.ready.remote() for h in handles])
    return handles


def stop_actor(name: str) -> None:
    """Kill a named actor for good (no restart), if it exists, and wait until its name is free."""
    try:
        handle = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return
    ray.kill(handle, no_restart=True)
    wait_names_released([name])


def stop_engine(token: str | None = None) -> None:
    """Stop the engine's actors (supervisor and everything it created), leaving Ray running.
    Returns once every name is free, so a new engine started right after gets fresh actors.
    With auth on, ``token`` must be a superuser's."""
    try:
        supervisor = ray.get_actor(SUPERVISOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return
    try:
        names = ray.get(supervisor.shutdown_actors.remote(auth=token))
    except RaytxnError as error:
        if isinstance(error, NotAuthorized):
            raise
        # A supervisor whose start failed for good (e.g. CannotPlaceActor) cannot list its
        # actors: every named actor of the engine's namespace is the engine's.
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == NAMESPACE and a["name"] != SUPERVISOR_NAME]
        for name in names:
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            except ValueError:
                pass  # gone meanwhile
    ray.kill(supervisor, no_restart=True)
    wait_names_released([*names, SUPERVISOR_NAME])


def wait_names_released(names: list[str], timeout_s: float = 30.0) -> None:
    """Wait until none of ``names`` resolves to an actor.

    ``ray.kill`` returns before the GCS marks the actor dead and frees its name; until then
    ``get_if_exists=True`` hands back the dying actor, whose first call fails with ActorDiedError
    (the failure CI saw when one test module's teardown raced the next module's setup)."""
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending:
        still = []
        for name in pending:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
                still.append(name)
            except ValueError:
                pass
        if not still:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"actors still registered {timeout_s}s after being killed: {still}")
        pending = still
        time.sleep(0.05)
