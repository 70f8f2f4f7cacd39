"""Starting and finding the engine's actors on a Ray cluster."""

from __future__ import annotations

from typing import Any

import ray

from runtime.config import EngineConfig
from runtime.ids import NAMESPACE, coordinator_actor_name


def start_coordinators(config: EngineConfig, wait: bool = True) -> list[Any]:
    """Create the coordinators ``tc-0..N-1`` unless they run already; wait for their recovery."""
    from actors.coordinator import CoordinatorActor

    handles = [
        CoordinatorActor.options(name=coordinator_actor_name(tc_id), namespace=NAMESPACE, lifetime="detached",
                                 get_if_exists=True).remote(
            tc_id, config.storage_url, config.storage_options, config.coordinator)
        for tc_id in range(config.coordinator.num_coordinators)
    ]
    if wait:
        ray.get([h.ready.remote() for h in handles])
    return handles


def stop_actor(name: str) -> None:
    """Kill a named actor for good (no restart), if it exists."""
    try:
        handle = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return
    ray.kill(handle, no_restart=True)


def stop_engine() -> None:
    """Stop the engine's actors (supervisor and everything it created), leaving Ray running."""
    from runtime.client import SUPERVISOR_NAME

    try:
        supervisor = ray.get_actor(SUPERVISOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return
    ray.get(supervisor.shutdown_actors.remote())
    ray.kill(supervisor, no_restart=True)
