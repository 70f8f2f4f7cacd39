"""A host: one Ray worker process serving many partition and subscription actors, as one Kafka or
Pulsar broker process serves many partitions.

Why: a partition or subscription actor of its own is a process, 65-71 MiB and a 0.44 s start.
Passivation stops the idle ones, but a workload that touches every one of 10,000 topics now and
then would start a process for each touch. With ``EngineConfig.actor_hosts`` > 0 the supervisor
activates partitions and subscriptions inside hosts instead: an activation is the actor's own
start (open its ledgers, restore, replay), with no process start, and a passivation frees its
memory without ending a process. A name lives in one host, ``host_for(name, hosts)``.

What stays the same: each hosted actor is the same class as a dedicated one, with its own
ledgers, faults and state; it recovers the same way, and it is fenced the same way (opening its
ledger fences every older incarnation, hosted or not). Callers reach it through the same
``ActorRef``, which learns from the supervisor's activation answer that the name is hosted and
sends its calls through ``call`` here (``raytxn.client.rpc``).

What a host adds: an actor that stops (fenced, diverged, passivated) cannot end its process as a
dedicated one does, so ``exit_process`` drops it from the host instead and cancels every task it
created. Tasks are told apart by a context variable that the call sets and that every child task
inherits (the simulator's loop tells processes apart the same way). A crash of the process ends
every actor it hosts, as a broker crash does; Ray restarts the host empty and the next call to
each name activates it again.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
from typing import Any

import ray

from raytxn.actors.shell import (
    ActorShell,
    engine_actor_classes_imported,
    import_engine_actor_classes,
    ray_actor_options,
)
from raytxn.auth import Access, AuthConfig, Authorizer, AuthTarget, guarded
from raytxn.config import PartitionConfig, SubscriptionConfig
from raytxn.errors import ActorUnavailable, CannotPlaceActor, InvalidArgument
from raytxn.ledger.storage import Storage

log = logging.getLogger(__name__)

# The hosted actor a task works for: set by ``call`` and ``start``, inherited by every task they create.
HOSTED: contextvars.ContextVar[ActorShell | None] = contextvars.ContextVar("raytxn_hosted", default=None)
MAX_TASKS_PER_ACTOR = 10_000  # a bound, far above any actor's timers, writers and waiters


class ActorHost(AuthTarget):
    """Hosted partition and subscription actors by name; see the module docstring."""

    def __init__(self, name: str, storage_url: str, storage_options: dict[str, Any],
                 partition_config: PartitionConfig, subscription_config: SubscriptionConfig,
                 auth: AuthConfig, max_hosted: int) -> None:
        import_engine_actor_classes()  # its first activation (and its actors' calls) would import them
        self.name = name
        self.authorizer = Authorizer(auth)
        self._auth = auth
        self._configs = {"partition": partition_config, "subscription": subscription_config}
        self._storage_url, self._storage_options = storage_url, storage_options
        self.storage = Storage.from_url(storage_url, **storage_options)  # one client for every hosted actor
        self.max_hosted = max_hosted
        self._hosted: dict[str, ActorShell] = {}
        self._tasks: dict[int, set[asyncio.Task]] = {}  # id(hosted actor) -> its live tasks
        self._factory_loop: asyncio.AbstractEventLoop | None = None
        self.started = self.dropped = 0

    # --- task ownership ----------------------------------------------------------------------

    def _own_tasks(self) -> None:
        """Tag every task created on this loop with the hosted actor it works for."""
        loop = asyncio.get_running_loop()
        if self._factory_loop is loop:
            return
        previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future:
            task = previous(loop, coro, **kwargs) if previous else asyncio.Task(coro, loop=loop, **kwargs)
            owner = kwargs["context"].get(HOSTED) if kwargs.get("context") is not None else HOSTED.get()
            if owner is not None and id(owner) in self._tasks:
                tasks = self._tasks[id(owner)]
                assert len(tasks) < MAX_TASKS_PER_ACTOR, f"{owner.actor_name} holds {len(tasks)} tasks"
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            return task

        loop.set_task_factory(factory)
        self._factory_loop = loop

    # --- the supervisor's calls --------------------------------------------------------------

    @guarded(Access.SUPERUSER)
    async def start(self, kind: str, name: str, args: list[Any],
                    kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Host the actor ``name``, built as ``kind(*args)`` (unless it is hosted here and not
        stopped), and return its ``ready`` answer once it has started, with ``hosted_now``:
        whether this call began hosting it."""
        from raytxn.actors.partition import PartitionBuffer
        from raytxn.actors.subscription import Subscription

        self._own_tasks()
        actor = self._hosted.get(name)
        hosted_now = actor is None or actor._stopped is not None
        if hosted_now:
            if actor is not None:
                self._drop(actor)
            cls = {"partition": PartitionBuffer, "subscription": Subscription}.get(kind)
            if cls is None:
                raise InvalidArgument(f"a host serves partitions and subscriptions, not {kind!r}")
            if len(self._hosted) >= self.max_hosted:
                raise CannotPlaceActor(f"{self.name} hosts {len(self._hosted)} actors, its most "
                                       "(max_hosted_actors): passivate idle ones or add hosts")
            actor = cls(*args, self._storage_url, self._storage_options, self._configs[kind], self._auth,
                        storage=self.storage, **(kwargs or {}))
            if actor.actor_name != name:
                raise InvalidArgument(f"{kind}{tuple(args)} is the actor {actor.actor_name!r}, not {name!r}")
            actor.exit_process = lambda _code, actor=actor: self._drop(actor)
            self._hosted[name] = actor
            self._tasks[id(actor)] = set()
            self.started += 1
        HOSTED.set(actor)
        return {**await actor.ready(auth=self.authorizer.engine_token()), "hosted_now": hosted_now}

    @guarded(Access.SUPERUSER)
    async def drop(self, name: str) -> bool:
        """Stop hosting ``name`` now (passivated, or its topic deleted); False if it was not hosted."""
        actor = self._hosted.get(name)
        if actor is None:
            return False
        self._drop(actor)
        return True

    @guarded(Access.SUPERUSER)
    async def hosted(self) -> dict[str, dict[str, Any]]:
        """Every hosted actor's incarnation, idleness and what holds it up (the supervisor's
        probe of them all at once, without a call to each)."""
        return {name: {"incarnation": actor.info.get("incarnation"), "serving": actor._serving,
                       "stopped": actor._stopped is not None, "idle_s": round(actor.idle_s(), 3),
                       "passivation_blockers": actor._passivation_blockers(),
                       "started_ms": actor.info.get("started_ms"), "recovery_ms": actor.info.get("recovery_ms"),
                       "tasks": len(self._tasks.get(id(actor), ()))}
                for name, actor in self._hosted.items()}

    @guarded(Access.PUBLIC)
    async def ready(self) -> dict[str, Any]:
        return {"host": self.name, "pid": os.getpid(), "hosted": len(self._hosted), "started": self.started,
                "dropped": self.dropped,
                "owned_tasks": sum(map(len, self._tasks.values())),
                "actor_classes_imported": engine_actor_classes_imported()}

    def _drop(self, actor: ActorShell) -> None:
        """Forget ``actor`` and cancel its tasks (the process end of a dedicated actor)."""
        if self._hosted.get(actor.actor_name) is actor:
            del self._hosted[actor.actor_name]
            self.dropped += 1
        if actor._stopped is None:  # calls still holding it get what a stopped actor's callers get
            actor._stopped = ActorUnavailable(f"{actor.actor_name}: no longer hosted by {self.name}; retry")
            actor._serving = False
        current = asyncio.current_task()
        for task in self._tasks.pop(id(actor), ()):
            if task is not current:
                task.cancel()

    # --- callers' calls ----------------------------------------------------------------------

    async def call(self, name: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``method(*args, **kwargs)`` of the hosted actor ``name``. Its own guard checks the
        caller (``auth`` in ``kwargs``), as on a dedicated actor. ``ActorUnavailable`` (the
        caller asks the supervisor again) when ``name`` is not hosted here."""
        actor = self._hosted.get(name)
        if actor is None:
            raise ActorUnavailable(f"{name} is not hosted by {self.name} (dormant, or moved); retry")
        function = getattr(type(actor), method, None)
        if getattr(function, "access", None) is None:  # only what a dedicated actor serves to callers
            raise InvalidArgument(f"{name} has no method {method!r}")
        try:
            inspect.signature(function).bind(actor, *args, **kwargs)
        except TypeError as e:
            raise InvalidArgument(f"{name}.{method}: {e}") from None
        HOSTED.set(actor)
        try:
            return await getattr(actor, method)(*args, **kwargs)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._hosted.get(name) is actor or (task is not None and task.cancelling()):
                raise
            # What it awaited was cancelled by its drop: the caller retries and finds it anew.
            raise ActorUnavailable(f"{name}: dropped by {self.name} during the call; retry") from None


ActorHostActor = ray.remote(**ray_actor_options(max_concurrency=100_000))(ActorHost)
