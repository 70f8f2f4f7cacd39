"""A whole engine (supervisor, coordinators, partition and subscription actors) for a test module,
on the session's Ray, with its own storage directory. Use from a module-scoped fixture:

    @pytest.fixture(scope="module")
    def client(ray_session, tmp_path_factory):
        yield from engine_client(tmp_path_factory)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

import raytxn as rt
from raytxn.client.rpc import ActorRef
from raytxn.cluster import stop_engine
from raytxn.ids import partition_actor_name


def engine_client(tmp_path_factory: pytest.TempPathFactory, token: str | None = None,
                  **config: Any) -> Iterator[rt.Client]:
    """``token``: the client's (a superuser's when the engine has auth on: it also stops it)."""
    stop_engine()  # a previous module's engine, if its teardown did not run
    client = rt.connect(storage=f"file://{tmp_path_factory.mktemp('engine')}", token=token, **config)
    try:
        yield client
    finally:
        client.close()
        stop_engine(token)


def joinable_ray_address(ray_session: Any) -> str:
    """The session Ray's address, for a script run in its own process to join (``RAY_ADDRESS``)
    rather than start a Ray of its own, with no engine left running in it: the script's
    ``rt.connect`` would attach to that engine, and its storage, instead of starting its own."""
    stop_engine()
    return ray_session.get_runtime_context().gcs_address


def partition_ref(topic: str, p: int = 0) -> ActorRef:
    """Calls straight to a partition actor (stats, faults, or an append as a coordinator would)."""
    return ActorRef(partition_actor_name(topic, p))


def restart_actor(name: str, deadline_s: float = 60.0) -> dict[str, Any]:
    """Kill the named actor's process; Ray restarts it and it recovers from storage. Returns the
    new incarnation's ``ready`` facts."""
    import ray

    from raytxn.ids import NAMESPACE

    before = ActorRef(name).call("ready", deadline_s=deadline_s)["incarnation"]
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=False)
    deadline = time.monotonic() + deadline_s
    while True:  # the kill lands asynchronously: the old process may still answer for a moment
        info = ActorRef(name).call("ready", deadline_s=deadline_s)
        if info["incarnation"] > before:
            return info
        assert time.monotonic() < deadline, f"{name} did not restart"
        time.sleep(0.05)


def visible_values(topic: str, partitions: Iterable[int] = (0,), deadline_s: float = 60.0,
                   token: str | None = None) -> list[bytes]:
    """Every readable message value of the given partitions (in order per partition), read through
    the partition actors' dispatch read path: committed, non-aborted, up to max_read_position."""
    from raytxn.client.rpc import ActorRef
    from raytxn.ids import Position, partition_actor_name
    from raytxn.protocol.entry_format import decode_entry

    values: list[bytes] = []
    for p in partitions:
        position = Position(0, 0)
        while True:
            result = ActorRef(partition_actor_name(topic, p), token).call("read", position, 1000, deadline_s=deadline_s)
            for _pos, records in result["entries"]:
                values.extend(m.value for m in decode_entry(records)[1])
            if result["next"] == position:
                break
            position = result["next"]
    return values


def health_row(client: rt.Client, name: str) -> dict[str, Any]:
    """The supervisor's health row of the actor ``name``."""
    return next(r for r in client.health()["actors"] if r["name"] == name)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def new_topic(client: rt.Client, partitions: int = 1, prefix: str = "t") -> str:
    """A fresh topic with a unique name (each test its own, on the module's engine)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions)
    return topic


def activate(topic: str, partitions: int = 1) -> None:
    """Start the topic's partition actors now (they start on first use, which takes a process
    start): for tests whose first send must not spend a short txn timeout on it."""
    for p in range(partitions):
        partition_ref(topic, p).call("ready")


def receive_all(consumer: Any, count: int, timeout: float = 20.0) -> list[Any]:
    """``count`` messages, all within ``timeout`` seconds (else the consumer's ``Timeout``)."""
    deadline = time.monotonic() + timeout
    return [consumer.receive(timeout=max(0.01, deadline - time.monotonic())) for _ in range(count)]


def nothing_more(consumer: Any, wait_s: float = 0.5) -> bool:
    """Whether no further message arrives within ``wait_s``."""
    from raytxn.errors import Timeout

    try:
        consumer.receive(timeout=wait_s)
    except Timeout:
        return True
    return False
