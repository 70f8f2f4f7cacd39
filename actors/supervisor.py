"""The supervisor actor: owns the catalog and creates every other actor.

It persists the catalog (topics, partitions, subscriptions) in the object store, creates the
coordinators, one ``partition-<topic>-<p>`` per partition and one ``sub-<topic>-<p>-<name>`` per
partition and subscription, and answers admin calls. Actors are created with Ray's restart
machinery (``max_restarts=-1``); every actor recovers from its own ledgers when restarted.

Creating and deleting topics and subscriptions go through durable catalog states (CREATING,
DELETING; see raytxn.protocol.catalog): recovery, and the watcher after a failure, finish what an
earlier incarnation began, so a crash at any step leaves the whole topic or nothing of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec
import ray

from raytxn.actors.restarts import SupervisorRestarts
from raytxn.actors.shell import ActorRefs, ActorShell, Clock
from raytxn.auth import Access, Authorizer, guarded
from raytxn.config import EngineConfig
from raytxn.errors import ActorUnavailable, CannotPlaceActor, InvalidArgument, NotAllowed, TopicNotFound
from raytxn.faults import FaultPoints, FaultTarget
from raytxn.ids import (
    CONSUME,
    NAMESPACE,
    PRODUCE,
    SUPERVISOR_NAME,
    coordinator_actor_name,
    host_actor_name,
    host_for,
    partition_actor_name,
    subscription_actor_name,
)
from raytxn.ledger import ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.metrics import activated, actor_states, passivated, restarted
from raytxn.protocol.catalog import (
    CATALOG_KEY,
    CATALOG_STREAM,
    Catalog,
    EntryState,
    decode_catalog,
    encode_catalog,
)
from raytxn.protocol.retention import check_retention

# Each step of creating or deleting a topic or subscription (the context names ``kind``,
# ``topic`` and, for subscriptions, ``subscription``).
FAULT_POINTS = (
    "supervisor.after_save_creating",     # the CREATING entry is durable, no actor made yet
    "supervisor.after_create_actors",     # every actor is up, the entry still CREATING
    "supervisor.after_activate",          # ACTIVE is durable, before the reply
    "supervisor.after_mark_deleting",     # DELETING is durable, the actors still run
    "supervisor.after_stop_actors",       # the actors are gone, their objects not deleted yet
    "supervisor.after_delete_objects",    # the objects are deleted, the entry still DELETING
    "supervisor.after_remove_entry",      # the entry is gone, before the reply
)
_LIVE = (EntryState.CREATING, EntryState.ACTIVE)  # entries whose actors should run
MIB = 1 << 20
MAX_TOPIC_ACTIONS = 10_000  # topics one topic_actions call may ask about
PLACEMENT_CHECK_S = 1.0   # a starting actor not ready this long: is there room for it at all?
MAX_PASSIVATIONS = 16     # passivations under way at once
# With hosts a passivation is a snapshot and a drop, no process to kill: many more at once, so
# that passivation keeps up with a workload that touches thousands of topics a minute.
MAX_HOSTED_PASSIVATIONS = 256
BULK_DELETE_CONCURRENCY = 16  # topics a bulk delete clears at once
# How long a delete waits for Ray to release the names of the actors it killed.
STOP_ACTORS_TIMEOUT_S = 60.0

log = logging.getLogger(__name__)


class ActorSpec(NamedTuple):
    """A partition or subscription actor the catalog implies."""

    kind: str                  # "partition" | "subscription"
    name: str
    topic: str
    partition: int
    subscription: str | None   # for a subscription actor


class Supervisor(SupervisorRestarts, ActorShell, FaultTarget):
    actor_kind = "supervisor"

    def __init__(self, config: EngineConfig, *, clock: Clock | None = None,
                 actor_refs: ActorRefs | None = None) -> None:
        super().__init__(SUPERVISOR_NAME, clock, actor_refs)
        self.config = config
        self.authorizer = Authorizer(config.auth)
        self.storage = Storage.from_url(config.storage_url, **config.storage_options)
        self.catalog = Catalog()
        self._ledger: ManagedLedger | None = None
        self._lock = asyncio.Lock()
        self._health: dict[str, dict[str, Any]] = {}
        self._probed_at: dict[str, float] = {}  # live actor -> when the watcher last probed it
        self._watch_task: asyncio.Task | None = None
        # Set by ``shutdown_actors``: from then on nothing creates an actor. A watch round already
        # under way could otherwise find the coordinators just killed and create them again
        # (CI once saw tc-0 and tc-1 registered 30 s after a teardown's kills).
        self._shut_down = False
        self.info: dict[str, Any] = {}
        self.faults = FaultPoints()
        self._deletions: dict[tuple[str, ...], asyncio.Task] = {}  # ("topic", t) / ("subscription", t, s)
        self._activations: dict[str, asyncio.Task] = {}   # actor name -> the task starting it
        self._free_resources: tuple[float, dict[str, float]] | None = None  # (when asked, what was free)
        self._passivations: dict[str, asyncio.Task] = {}  # actor name -> the task passivating it
        self._restarts: dict[str, asyncio.Task] = {}      # actor name -> the task restarting it (restarts.py)
        self._implied_cache: dict[str, ActorSpec] = {}
        self._hosts: dict[str, Any] = {}  # host name -> handle (EngineConfig.actor_hosts > 0)
        # Actor name -> its handle, resolved once: ``ray.get_actor`` per probe (a GCS call and a
        # new ActorHandle each) was 70% of this actor's busy samples while the gateway worked.
        # Dropped when the actor is killed, replaced or found dead, then resolved again.
        self._handles: dict[str, Any] = {}
        self._handle_lookups = 0  # how often a handle was resolved by name (health reports it)
        self._implied_for: Catalog | None = None

    async def _start(self) -> None:
        self._ledger = await ManagedLedger.open(self.storage, CATALOG_STREAM)
        self.catalog = decode_catalog(self._ledger.properties.get(CATALOG_KEY))
        await self._start_coordinators()
        await self._finish_interrupted_admin()
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())

    @guarded(Access.PUBLIC)
    async def ready(self) -> dict[str, Any]:
        await self._started()
        return {"config": self.config.public(), "topics": len(self.catalog.topics), "pid": os.getpid()}

    @guarded(Access.PUBLIC)
    async def engine_config(self) -> EngineConfig:
        await self._started()
        return self.config.public()

    @guarded(Access.AUTHENTICATED)
    async def whoami(self, caller: str | None = None) -> dict[str, Any]:
        """The caller's principal and whether it is a superuser (auth off: nobody, everything allowed)."""
        return {"auth": self.authorizer.enabled, "principal": caller,
                "superuser": caller is None or self.authorizer.is_superuser(caller)}

    # --- actors ------------------------------------------------------------------------------

    def _actor_options(self, name: str) -> dict[str, Any]:
        options: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "lifetime": "detached",
                                   "get_if_exists": True, "resources": self.config.actor_resources,
                                   "scheduling_strategy": self.config.actor_placement}
        if self.config.actor_memory_mib:
            options["memory"] = self.config.actor_memory_mib * MIB
        return options

    def _create_coordinator(self, tc_id: int) -> Any:
        from raytxn.actors.coordinator import CoordinatorActor

        name = coordinator_actor_name(tc_id)
        handle = CoordinatorActor.options(**self._actor_options(name)).remote(
            tc_id, self.config.storage_url, self.config.storage_options, self.config.coordinator,
            auth=self.config.auth)
        self._handles[name] = handle
        return handle

    def _handle(self, name: str) -> Any:
        """The live actor ``name`` (cached), or None."""
        handle = self._handles.get(name)
        if handle is None:
            self._handle_lookups += 1
            if (handle := _handle(name)) is not None:
                self._handles[name] = handle
        return handle

    def _kill(self, name: str) -> bool:
        self._handles.pop(name, None)
        return _kill(name)

    def _create(self, spec: ActorSpec) -> Any:
        """Create (unless it runs) the actor of ``spec`` and return its handle. Synchronous: the
        caller checked the catalog with no await since, so a delete's kill finds it."""
        from raytxn.actors.partition import PartitionActor
        from raytxn.actors.subscription import SubscriptionActor

        config = self.config
        if spec.kind == "partition":
            handle = PartitionActor.options(**self._actor_options(spec.name)).remote(
                spec.topic, spec.partition, config.storage_url, config.storage_options, config.partition, config.auth,
                compaction=self._compaction_of(spec.topic))
        else:
            sub = self.catalog.subscriptions[spec.topic][spec.subscription]
            handle = SubscriptionActor.options(**self._actor_options(spec.name)).remote(
                spec.topic, spec.partition, spec.subscription, sub.initial_position, config.storage_url,
                config.storage_options, config.subscription, config.auth)
        self._handles[spec.name] = handle
        return handle

    def _host_of(self, name: str) -> str | None:
        """The host serving the partition or subscription ``name`` (None: a process of its own)."""
        return host_for(name, self.config.actor_hosts) if self.config.actor_hosts > 0 else None

    def _host(self, host: str) -> Any:
        handle = self._hosts.get(host)
        if handle is None:
            from raytxn.actors.host import ActorHostActor

            config = self.config
            options = {**self._actor_options(host), "memory": config.host_memory_mib * MIB}
            handle = self._hosts[host] = ActorHostActor.options(**options).remote(
                host, config.storage_url, config.storage_options, config.partition, config.subscription,
                config.auth, config.max_hosted_actors)
        return handle

    async def _host_call(self, host: str, method: str, *args: Any) -> Any:
        """A call to a host (``call``: to an actor it hosts, whose own guard wants the token in
        its kwargs); ``ActorUnavailable`` (retriable) while it is restarting."""
        kwargs = {} if method == "call" else {"auth": self.authorizer.engine_token()}
        try:
            return await asyncio.wrap_future(getattr(self._host(host), method).remote(*args, **kwargs).future())
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            self._hosts.pop(host, None)  # looked up (or created) again next time
            raise ActorUnavailable(f"{host} is restarting ({type(e).__name__}); retry") from e

    def _compaction_of(self, topic: str) -> tuple[bool, int | None]:
        """A partition's compaction policy, handed to it at start (so it reads no catalog)."""
        info = self.catalog.topics.get(topic)
        return (False, None) if info is None else (info.compacted, info.compaction_threshold_bytes)

    async def _start_hosted(self, spec: ActorSpec, host: str) -> dict[str, Any]:
        args: list[Any] = [spec.topic, spec.partition]
        kwargs: dict[str, Any] = {}
        if spec.kind == "subscription":
            args += [spec.subscription, self.catalog.subscriptions[spec.topic][spec.subscription].initial_position]
        else:
            kwargs["compaction"] = self._compaction_of(spec.topic)
        return await self._host_call(host, "start", spec.kind, spec.name, args, kwargs)

    async def _start_actor(self, spec: ActorSpec) -> bool:
        """Start the actor of ``spec`` (unless it serves) in its host, or in a process of its
        own, and return once it serves; True if it was not running."""
        if self._shut_down:
            raise ActorUnavailable(f"{spec.name}: the engine is shutting down")
        host = self._host_of(spec.name)
        if host is not None:
            return bool((await self._start_hosted(spec, host))["hosted_now"])
        self._handles.pop(spec.name, None)  # a cached handle may be of a dead incarnation
        was_dormant = self._handle(spec.name) is None
        await self._placed(spec.name, self._create(spec))
        return was_dormant

    async def _placed(self, name: str, handle: Any) -> dict[str, Any]:
        """Wait for the new actor's ``ready``. ``CannotPlaceActor`` (and the pending actor
        removed) when Ray cannot place it, i.e. the resources it asks for are not free anywhere,
        instead of waiting forever; ``ActorUnavailable`` (retriable) when it is only slow."""
        ready = asyncio.ensure_future(asyncio.wrap_future(handle.ready.remote().future()))
        deadline = self.clock.monotonic() + self.config.actor_start_timeout_s
        while True:
            done, _ = await asyncio.wait([ready], timeout=PLACEMENT_CHECK_S)
            if done:
                return ready.result()
            if short := self._short_resources():
                ready.cancel()
                self._kill(name)
                raise CannotPlaceActor(
                    f"cannot start actor {name!r}: the cluster has {short} free; passivate idle actors "
                    "(passivate_idle_s), lower actor_memory_mib, or add a node")
            if self.clock.monotonic() > deadline:
                raise ActorUnavailable(f"actor {name!r} not started after {self.config.actor_start_timeout_s}s")

    def _short_resources(self) -> str | None:
        """What an engine actor asks for that no node has free now (None: it fits)."""
        wanted = dict(self.config.actor_resources)
        if self.config.actor_memory_mib:
            wanted["memory"] = self.config.actor_memory_mib * MIB
        free = self._free_resources_now()
        for resource, amount in wanted.items():
            if free.get(resource, 0.0) < amount:
                have = free.get(resource, 0.0)
                return (f"{have / MIB:.0f} MiB of Ray memory (an actor reserves {amount / MIB:.0f} MiB)"
                        if resource == "memory" else f"{have} of resource {resource!r} (an actor needs {amount})")
        return None

    def _free_resources_now(self) -> dict[str, float]:
        """Ray's free resources, asked at most once per ``PLACEMENT_CHECK_S``: every actor still
        starting asks each second, and ``ray.available_resources()`` is a synchronous GCS call.
        With the 64 subscription actors of one subscribe starting at once, those calls took 41%
        of this actor's loop, which was 82% busy, and the actors came up at 1.3 a second."""
        now = self.clock.monotonic()
        if self._free_resources is None or now - self._free_resources[0] >= PLACEMENT_CHECK_S:
            self._free_resources = (now, ray.available_resources())
        return self._free_resources[1]

    async def _start_coordinators(self) -> None:
        if self._shut_down:
            return
        handles = [(coordinator_actor_name(i), self._create_coordinator(i))
                   for i in range(self.config.coordinator.num_coordinators)]
        await asyncio.gather(*(self._placed(name, handle) for name, handle in handles))

    async def _start_actors(self, specs: list[ActorSpec]) -> None:
        """Start the actors of ``specs`` now (not on first use) unless their entry is being deleted."""
        live = self._implied()
        await asyncio.gather(*(self._start_actor(spec) for spec in specs if spec.name in live))

    def _implied(self) -> dict[str, ActorSpec]:
        """Every partition and subscription actor the catalog implies (entries being deleted have
        none: their actors are being stopped, never probed nor created), by name. Cached per
        catalog: the catalog is replaced, never changed in place."""
        if self._implied_for is not self.catalog:
            specs: dict[str, ActorSpec] = {}
            for info in self.catalog.topics.values():
                if info.state is EntryState.DELETING:
                    continue
                subs = self.catalog.subscription_names(info.name, _LIVE)
                for p in range(info.partitions):
                    spec = ActorSpec("partition", partition_actor_name(info.name, p), info.name, p, None)
                    specs[spec.name] = spec
                    for sub in subs:
                        spec = ActorSpec("subscription", subscription_actor_name(info.name, p, sub), info.name, p, sub)
                        specs[spec.name] = spec
            self._implied_cache, self._implied_for = specs, self.catalog
        return self._implied_cache

    async def _save(self, catalog: Catalog) -> None:
        assert self._ledger is not None
        await self._write(self._ledger.set_properties({CATALOG_KEY: encode_catalog(catalog)}))
        self.catalog = catalog

    # --- admin -------------------------------------------------------------------------------

    @guarded(Access.SUPERUSER)
    async def create_topic(self, name: str, partitions: int = 1, retention_bytes: int | None = None,
                           retention_s: float | None = None, compacted: bool = False,
                           compaction_threshold_bytes: int | None = None) -> dict[str, Any]:
        """Save the topic ACTIVE, in one catalog write: its partition actors start on first use, so
        there is no step between CREATING and ACTIVE for a crash to interrupt. A retried create of
        a topic still CREATING (left by an earlier version's two-step create) with the same
        partitions and retention finishes it. ``retention_bytes`` / ``retention_s``: keep acked
        data that long; ``compacted``: keep the latest value of each key (protocol/retention.py)."""
        await self._started()
        retention = check_retention(retention_bytes, retention_s, compacted, compaction_threshold_bytes)
        context = {"kind": "topic", "topic": name}
        async with self._lock:
            entry = self.catalog.topics.get(name)
            if (entry is None or entry.state is not EntryState.CREATING or entry.partitions != partitions
                    or entry.retention != retention):
                created = self.catalog.with_topic(name, partitions, self.clock.now_ms(), retention)
                await self._save(created.with_topic_state(name, EntryState.ACTIVE))
        await self.faults.hit("supervisor.after_save_creating", **context)
        await self.faults.hit("supervisor.after_create_actors", **context)  # none: they start on first use
        await self._activate_topic(name)
        await self.faults.hit("supervisor.after_activate", **context)
        return {"name": name, "partitions": partitions, **msgspec.structs.asdict(retention)}

    @guarded(Access.SUPERUSER)
    async def create_topics(self, names: list[str], partitions: int = 1, subscriptions: list[str] | None = None,
                            initial_position: str = "earliest", retention_bytes: int | None = None,
                            retention_s: float | None = None, compacted: bool = False,
                            compaction_threshold_bytes: int | None = None) -> list[dict[str, Any]]:
        """Create many topics, each with ``subscriptions``, in one catalog write whatever their
        number (two with "latest" subscriptions: CREATING, their actors started, see
        ``create_subscription``, then ACTIVE); no other actor starts until used. All or none: one
        invalid or existing name fails the call before anything is written. A retry finishes
        topics still CREATING from a crashed try."""
        await self._started()
        retention = check_retention(retention_bytes, retention_s, compacted, compaction_threshold_bytes)
        subscriptions = list(subscriptions or [])
        async with self._lock:
            unfinished = {name for name in names if (entry := self.catalog.topics.get(name)) is not None
                          and entry.state is EntryState.CREATING and entry.partitions == partitions
                          and entry.retention == retention}
            fresh = [name for name in names if name not in unfinished]
            if fresh:
                created = self.catalog.with_topics(fresh, partitions, self.clock.now_ms(), retention,
                                                   subscriptions, initial_position)
                await self._save(created if initial_position == "latest" else created.with_topics_active(fresh))
        context = {"kind": "topics", "topic": names[0] if names else ""}
        await self.faults.hit("supervisor.after_save_creating", **context)
        if initial_position == "latest":
            for name in names:
                for sub in subscriptions:
                    await self._start_fixing_latest(name, sub)
        async with self._lock:
            if any(self.catalog.topic_entry(name).state is EntryState.CREATING for name in names):
                await self._save(self.catalog.with_topics_active(names))
        await self.faults.hit("supervisor.after_activate", **context)
        return [{"name": name, "partitions": partitions, "subscriptions": sorted(subscriptions)} for name in names]

    @guarded(Access.SUPERUSER)
    async def delete_topics(self, names: list[str]) -> None:
        """Delete many topics: one catalog write marks them all DELETING, their actors are
        stopped and objects deleted (``BULK_DELETE_CONCURRENCY`` topics at a time), and one
        write removes them. A crash is finished per topic by recovery, as for ``delete_topic``."""
        await self._started()
        async with self._lock:
            await self._save(self.catalog.with_topics_deleting(names))
        context = {"kind": "topics", "topic": names[0] if names else ""}
        await self.faults.hit("supervisor.after_mark_deleting", **context)
        gate = asyncio.Semaphore(BULK_DELETE_CONCURRENCY)

        async def clear(name: str) -> None:
            async with gate:
                await self._clear_topic(name)

        await asyncio.gather(*(clear(name) for name in names))
        async with self._lock:
            await self._save(self.catalog.without_topics(names))
        await self.faults.hit("supervisor.after_remove_entry", **context)

    async def _activate_topic(self, name: str) -> None:
        async with self._lock:
            entry = self.catalog.topics.get(name)
            if entry is None or entry.state is EntryState.DELETING:
                raise TopicNotFound(f"topic {name!r} was deleted while being created")
            if entry.state is EntryState.CREATING:
                await self._save(self.catalog.with_topic_state(name, EntryState.ACTIVE))

    @guarded(Access.SUPERUSER)
    async def delete_topic(self, name: str) -> None:
        """Save the topic DELETING, stop its actors, delete its objects, remove the entry. A
        crash at any step is finished by recovery (or the watcher) from the DELETING entry."""
        await self._started()
        async with self._lock:
            if self.catalog.topic_entry(name).state is not EntryState.DELETING:
                await self._save(self.catalog.with_topic_state(name, EntryState.DELETING))
        await self.faults.hit("supervisor.after_mark_deleting", kind="topic", topic=name)
        await asyncio.shield(self._drive_deletion(("topic", name)))

    @guarded(Access.AUTHENTICATED)
    async def list_topics(self) -> list[dict[str, Any]]:
        await self._started()
        return [self._topic_row(name) for name in sorted(t.name for t in self.catalog.topics_in(EntryState.ACTIVE))]

    @guarded(Access.AUTHENTICATED)
    async def get_topic(self, name: str) -> dict[str, Any]:
        await self._started()
        return self._topic_row(name)

    def _topic_row(self, name: str) -> dict[str, Any]:
        info = self.catalog.topic(name)
        return {"name": info.name, "partitions": info.partitions, "created_ms": info.created_ms,
                "subscriptions": self.catalog.subscription_names(name), **msgspec.structs.asdict(info.retention)}

    @guarded(Access.AUTHENTICATED)
    async def create_subscription(self, topic: str, name: str, initial_position: str = "latest",
                                  caller: str | None = None) -> dict[str, Any]:
        """Create the subscription unless it exists (needs the topic's consume permission): saved
        CREATING, then ACTIVE, as a topic. Its actors start on first use, except that a "latest"
        one starts them at once: "latest" is where the partition ends now, and the first start
        fixes it for every later incarnation."""
        await self._started()
        if caller is not None:
            self.authorizer.authorize(caller, Access.CONSUME, self.catalog.topic_permissions(topic),
                                      f"topic {topic!r}")
        context = {"kind": "subscription", "topic": topic, "subscription": name}
        async with self._lock:
            catalog = self.catalog.with_subscription(topic, name, initial_position, self.clock.now_ms())
            if catalog is not self.catalog:
                await self._save(catalog)
        await self.faults.hit("supervisor.after_save_creating", **context)
        info = self.catalog.topic(topic)
        await self._start_fixing_latest(topic, name)
        await self.faults.hit("supervisor.after_create_actors", **context)
        await self._activate_subscription(topic, name)
        await self.faults.hit("supervisor.after_activate", **context)
        return {"topic": topic, "name": name, "partitions": info.partitions}

    async def _start_fixing_latest(self, topic: str, name: str) -> None:
        """Start a "latest" subscription's actors (each persists the partition's end as its
        start), after the partitions they read: a subscription finding its partition dormant
        would ask this supervisor to activate it, and during recovery the supervisor answers
        nobody until its start is done, which waits for these actors."""
        sub = self.catalog.subscriptions.get(topic, {}).get(name)
        if sub is not None and sub.initial_position == "latest":
            implied, partitions = self._implied(), self.catalog.topic_entry(topic).partitions
            await self._start_actors([implied[partition_actor_name(topic, p)] for p in range(partitions)])
            await self._start_actors([implied[subscription_actor_name(topic, p, name)] for p in range(partitions)])

    async def _activate_subscription(self, topic: str, name: str) -> None:
        async with self._lock:
            sub = self.catalog.subscriptions.get(topic, {}).get(name)
            if sub is None or sub.state is EntryState.DELETING:
                raise NotAllowed(f"subscription {name!r} of {topic!r} was deleted while being created")
            if sub.state is EntryState.CREATING:
                await self._save(self.catalog.with_subscription_state(topic, name, EntryState.ACTIVE))

    @guarded(Access.SUPERUSER)
    async def delete_subscription(self, topic: str, name: str) -> None:
        """As ``delete_topic``, for one subscription; nothing to do when it does not exist."""
        await self._started()
        async with self._lock:
            self.catalog.topic(topic)
            sub = self.catalog.subscriptions.get(topic, {}).get(name)
            if sub is None:
                return
            if sub.state is not EntryState.DELETING:
                await self._save(self.catalog.with_subscription_state(topic, name, EntryState.DELETING))
        await self.faults.hit("supervisor.after_mark_deleting", kind="subscription", topic=topic, subscription=name)
        await asyncio.shield(self._drive_deletion(("subscription", topic, name)))

    # --- deleting ----------------------------------------------------------------------------

    def _drive_deletion(self, key: tuple[str, ...]) -> asyncio.Task:
        """The one task finishing the deletion of ``key`` (a topic or a subscription)."""
        task = self._deletions.get(key)
        if task is None:
            work = self._delete_topic_now(key[1]) if key[0] == "topic" else self._delete_subscription_now(*key[1:])
            task = self._deletions[key] = asyncio.get_running_loop().create_task(work)
            task.add_done_callback(lambda done: self._deletion_done(key, done))
        return task

    def _deletion_done(self, key: tuple[str, ...], task: asyncio.Task) -> None:
        self._deletions.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("deleting %s failed; the watcher tries again: %r", key, task.exception())

    def _resume_deletions(self) -> list[asyncio.Task]:
        """A deletion task for every DELETING entry (one that failed is tried again)."""
        keys = [("topic", t.name) for t in self.catalog.topics_in(EntryState.DELETING)]
        keys += [("subscription", s.topic, s.name) for s in self.catalog.subscriptions_in(EntryState.DELETING)]
        return [self._drive_deletion(key) for key in keys]

    async def _delete_topic_now(self, name: str) -> None:
        if name not in self.catalog.topics:
            return
        await self._clear_topic(name)
        async with self._lock:
            if name in self.catalog.topics:
                await self._save(self.catalog.without_topic(name))
        await self.faults.hit("supervisor.after_remove_entry", kind="topic", topic=name)

    async def _clear_topic(self, name: str) -> None:
        """Stop the actors of the DELETING topic ``name`` and delete its objects."""
        info = self.catalog.topics.get(name)
        if info is None:
            return
        subs = self.catalog.subscription_names(name, tuple(EntryState))
        await self._stop_actors([actor for p in range(info.partitions) for actor in
                                 [partition_actor_name(name, p)] + [subscription_actor_name(name, p, s) for s in subs]])
        context = {"kind": "topic", "topic": name}
        await self.faults.hit("supervisor.after_stop_actors", **context)
        await self._delete_objects(topic_object_folders(name))
        await self.faults.hit("supervisor.after_delete_objects", **context)

    async def _delete_subscription_now(self, topic: str, name: str) -> None:
        info = self.catalog.topics.get(topic)
        if info is None:  # the topic's deletion took the subscription with it
            return
        await self._stop_actors([subscription_actor_name(topic, p, name) for p in range(info.partitions)])
        context = {"kind": "subscription", "topic": topic, "subscription": name}
        await self.faults.hit("supervisor.after_stop_actors", **context)
        await self._delete_objects(subscription_object_folders(topic, info.partitions, name))
        await self.faults.hit("supervisor.after_delete_objects", **context)
        async with self._lock:
            catalog = self.catalog.without_subscription(topic, name)
            if catalog is not self.catalog:
                await self._save(catalog)
        await self.faults.hit("supervisor.after_remove_entry", **context)

    async def _stop_actors(self, names: list[str]) -> None:
        """Kill the actors for good and wait until Ray has released their names: until then a
        create of the same name would get the dying actor back, and it could still write."""
        for name in names:
            if (host := self._host_of(name)) is not None:
                await self._host_call(host, "drop", name)
        await self._kill_for_good(names)

    async def _kill_for_good(self, names: list[str]) -> None:
        """Kill the actors (not restarted) and wait until Ray released their names."""
        deadline = self.clock.monotonic() + STOP_ACTORS_TIMEOUT_S  # dedicated ones of an earlier config too
        while alive := [name for name in names if self._kill(name)]:
            if self.clock.monotonic() > deadline:
                raise ActorUnavailable(f"{len(alive)} actors still registered {STOP_ACTORS_TIMEOUT_S}s after "
                                       f"being killed, e.g. {alive[0]!r}")
            await asyncio.sleep(0.05)

    async def _delete_objects(self, folders: list[str]) -> None:
        for folder in folders:
            await self.storage.delete_folder(folder)

    async def _finish_interrupted_admin(self) -> None:
        """Recovery: finish what a crashed incarnation left half done. Entries being deleted are
        deleted (a failure is left to the watcher), and CREATING entries become ACTIVE (a "latest"
        subscription's actors started first). Other actors start on first use."""
        await asyncio.gather(*self._resume_deletions(), return_exceptions=True)
        for topic in self.catalog.topics_in(EntryState.CREATING):
            await self._activate_topic(topic.name)
        for sub in self.catalog.subscriptions_in(EntryState.CREATING):
            await self._start_fixing_latest(sub.topic, sub.name)
            await self._activate_subscription(sub.topic, sub.name)

    # --- permissions -------------------------------------------------------------------------

    @guarded(Access.SUPERUSER)
    async def grant_permission(self, topic: str, principal: str, actions: list[str]) -> dict[str, list[str]]:
        """``principal`` may do exactly ``actions`` (produce, consume) on ``topic``. Returns once
        every actor of the topic enforces it."""
        return await self._change_permissions(lambda c: c.with_grant(topic, principal, actions), topic)

    @guarded(Access.SUPERUSER)
    async def revoke_permission(self, topic: str, principal: str) -> dict[str, list[str]]:
        """Take every permission on ``topic`` from ``principal``; no actor of the topic accepts its
        requests once this returns."""
        return await self._change_permissions(lambda c: c.without_grant(topic, principal), topic)

    @guarded(Access.SUPERUSER)
    async def topic_permissions(self, topic: str) -> dict[str, Any]:
        await self._started()
        return {"version": self.catalog.permissions_version, "permissions": self.catalog.topic_permissions(topic)}

    async def _change_permissions(self, change: Any, topic: str) -> dict[str, list[str]]:
        await self._started()
        async with self._lock:
            await self._save(change(self.catalog))
            version, permissions = self.catalog.permissions_version, self.catalog.topic_permissions(topic)
        names = [name for name, kind in self.actor_names(topic=topic) if kind != "coordinator"]
        await asyncio.gather(*(self._actor_ref(name).call_async("set_topic_permissions", version, permissions)
                               for name in names))
        return permissions

    @guarded(Access.AUTHENTICATED)
    async def topic_actions(self, topics: list[str], caller: str | None = None) -> dict[str, list[str]]:
        """What the caller may do (``produce``, ``consume``) on each of ``topics`` that exists, as
        the topics' own actors decide it. For a Kafka gateway authorizing, as its client's
        principal, a request no single actor sees whole before it changes something (a group's
        subscribed topics at JoinGroup, a transaction's partitions, a transactional offset
        commit). Auth off, or a superuser: both actions on every topic."""
        await self._started()
        if not isinstance(topics, list) or len(topics) > MAX_TOPIC_ACTIONS or not all(
                isinstance(t, str) for t in topics):
            raise InvalidArgument(f"topics must be a list of at most {MAX_TOPIC_ACTIONS} names")
        everything = caller is None or self.authorizer.is_superuser(caller)
        actions: dict[str, list[str]] = {}
        for name in dict.fromkeys(topics):
            try:
                granted = self.catalog.topic_permissions(name)
            except (TopicNotFound, InvalidArgument):
                continue  # no such topic: the request's own handler says so
            actions[name] = sorted([PRODUCE, CONSUME] if everything else granted.get(caller, ()))
        return actions

    # --- watching ----------------------------------------------------------------------------

    def actor_names(self, kind: str | None = None, topic: str | None = None) -> list[tuple[str, str]]:
        """(name, kind) of every actor the catalog implies: coordinators, partitions, subscriptions."""
        names = [(coordinator_actor_name(i), "coordinator") for i in range(self.config.coordinator.num_coordinators)]
        names += [(name, spec.kind) for name, spec in self._implied().items() if topic is None or spec.topic == topic]
        return [(n, k) for n, k in names if kind is None or k == kind]

    @guarded(Access.AUTHENTICATED)
    async def list_actors(self, kind: str | None = None, topic: str | None = None) -> list[tuple[str, str]]:
        await self._started()
        return self.actor_names(kind, topic)

    async def _watch(self) -> None:
        """Probe every live actor (a restarted one is driven through recovery at once: actors
        recover lazily, and nothing should wait for a first call), create a dead coordinator
        again, and passivate partitions and subscriptions idle for ``passivate_idle_s``."""
        while True:
            await asyncio.sleep(self.config.watch_interval_s)
            self._resume_deletions()
            await self._probe_all()
            self._passivate_idle()

    async def _hosted_rows(self) -> dict[str, dict[str, Any]]:
        """What every host says of the actors it serves, by actor name (one call per host; a
        host that is restarting serves nothing)."""
        rows: dict[str, dict[str, Any]] = {}
        for index in range(self.config.actor_hosts):
            host = host_actor_name(index)
            try:
                hosted = await asyncio.wait_for(self._host_call(host, "hosted"), self.config.watch_timeout_s)
            except Exception as e:  # noqa: BLE001 - restarting or slow: its actors show as dormant
                log.info("listing %s failed: %r", host, e)
                continue
            rows.update({name: {**row, "host": host} for name, row in hosted.items()})
        return rows

    def _hosted_row(self, name: str, kind: str, hosted: dict[str, Any]) -> None:
        row = self._row(name, kind)
        if row["incarnation"] is not None and (hosted["incarnation"] or 0) > row["incarnation"]:
            row["restarts"] += 1
            restarted(kind)
        state = "STOPPING" if hosted["stopped"] else "ALIVE" if hosted["serving"] else "RECOVERING"
        row.update(state=state, host=hosted["host"], incarnation=hosted["incarnation"],
                   last_recovery_ms=hosted["started_ms"], recovery_ms=hosted["recovery_ms"],
                   checked_ms=self.clock.now_ms(), idle_s=hosted["idle_s"],
                   passivation_blockers=hosted["passivation_blockers"])

    async def _probe_all(self) -> None:
        live = _live_actor_names()
        names = self.actor_names()
        hosted = await self._hosted_rows() if self.config.actor_hosts > 0 else {}
        probes = []
        alive: dict[str, str] = {}  # name -> kind of the live partitions and subscriptions known ALIVE
        for name, kind in names:
            if name in self._passivations and self._health[name]["state"] == "DORMANT":
                continue  # passivated, being killed: a probe would find it refusing calls, not restarting
            if name in hosted:
                self._hosted_row(name, kind, hosted[name])
            elif name in live and kind != "coordinator" and self._health.get(name, {}).get("state") == "ALIVE":
                alive[name] = kind
            elif name in live or kind == "coordinator":
                probes.append(self._probe(name, kind, name in live))
            else:  # most actors of a large catalog: no process, no call, no coroutine
                self._row(name, kind)["state"] = "DORMANT"
                self._probed_at.pop(name, None)
        if len(self._probed_at) > len(live):  # forget actors gone since (deleted topics)
            self._probed_at = {name: at for name, at in self._probed_at.items() if name in live}
        if len(self._handles) > len(live):
            self._handles = {name: handle for name, handle in self._handles.items() if name in live}
        for name in probes_due(alive, self._probed_at, self.config.max_probes_per_watch):
            probes.append(self._probe(name, alive[name], True))
        await asyncio.gather(*probes, return_exceptions=True)
        counts: dict[tuple[str, str], int] = {}
        for name, kind in names:
            if kind != "coordinator":
                key = (kind, "dormant" if self._health[name]["state"] == "DORMANT" else "active")
                counts[key] = counts.get(key, 0) + 1
        actor_states(counts)

    def _row(self, name: str, kind: str) -> dict[str, Any]:
        return self._health.setdefault(name, {"name": name, "kind": kind, "state": "UNKNOWN", "incarnation": None,
                                              "restarts": 0, "last_recovery_ms": None, "recovery_ms": None,
                                              "recreated": 0, "activations": 0, "passivations": 0})

    async def _probe(self, name: str, kind: str, live: bool) -> None:
        row = self._row(name, kind)
        self._probed_at[name] = self.clock.monotonic()
        if not live:
            self._handles.pop(name, None)
        cached = name in self._handles
        if not live or (handle := self._handle(name)) is None:
            await self._not_running(name, kind, row)
            return
        try:
            info = await asyncio.wait_for(asyncio.wrap_future(handle.ready.remote().future()),
                                          self.config.watch_timeout_s)
        except TimeoutError:
            row["state"] = "RECOVERING"
            return
        except ray.exceptions.ActorDiedError:
            self._handles.pop(name, None)
            if cached:  # the cached handle was of a killed incarnation: the name may have a new one
                await self._probe(name, kind, live)
            else:
                await self._not_running(name, kind, row)
            return
        except Exception as e:  # noqa: BLE001 - restarting, passivated or failing recovery: report it
            self._handles.pop(name, None)  # resolved again next probe, in case it was replaced
            row["state"] = f"RESTARTING ({type(e).__name__})"
            return
        incarnation = info.get("incarnation")
        if row["incarnation"] is not None and incarnation is not None and incarnation > row["incarnation"]:
            row["restarts"] += 1
            restarted(kind)
        row.update(state="ALIVE", incarnation=incarnation, last_recovery_ms=info.get("started_ms"),
                   recovery_ms=info.get("recovery_ms"), checked_ms=self.clock.now_ms(), idle_s=info.get("idle_s"),
                   passivation_blockers=info.get("passivation_blockers"))

    async def _not_running(self, name: str, kind: str, row: dict[str, Any]) -> None:
        """No process: a coordinator is created again at once; a partition or subscription is
        dormant (passivated, never used, or killed) until a call activates it."""
        if kind == "coordinator":
            row["state"] = "DEAD"
            row["recreated"] += 1
            restarted(kind)
            await self._start_coordinators()
        else:
            row["state"] = "DORMANT"

    # --- activation and passivation ----------------------------------------------------------

    @guarded(Access.AUTHENTICATED)
    async def activate(self, name: str) -> dict[str, Any]:
        """Start the partition or subscription actor ``name`` (a caller's ``ActorRef`` asks when
        it finds none) and return once it serves. ``activated`` False when the catalog implies no
        such actor (its topic or subscription is gone or being deleted: callers find that out
        from the catalog). ``CannotPlaceActor`` when the cluster has no room for it."""
        await self._started()
        task = self._activations.get(name)
        if task is None:
            task = self._activations[name] = asyncio.get_running_loop().create_task(self._activate_now(name))
            task.add_done_callback(lambda _: self._activations.pop(name, None))
        return await asyncio.shield(task)

    async def _activate_now(self, name: str) -> dict[str, Any]:
        for stopping in (self._passivations.get(name), self._restarts.get(name)):
            if stopping is not None:  # its kill first: until then get_if_exists finds the stopped one
                await asyncio.gather(stopping, return_exceptions=True)
        spec = self._implied().get(name)
        if spec is None:
            return {"activated": False, "why": f"no topic or subscription has the actor {name!r}"}
        began = self.clock.monotonic()
        was_dormant = await self._start_actor(spec)
        row = self._row(name, spec.kind)
        if was_dormant:
            row["activations"] += 1
            activated(spec.kind)
        row.update(state="ALIVE", idle_s=0.0)  # the last probe's idleness was the dead incarnation's
        return {"activated": True, "seconds": round(self.clock.monotonic() - began, 3), "host": self._host_of(name)}

    def _passivate_idle(self) -> None:
        """Start passivating (at most ``MAX_PASSIVATIONS`` at a time) the actors that the last
        probes found idle long enough with nothing holding them."""
        idle_s = self.config.passivate_idle_s
        if idle_s is None:
            return
        most = MAX_HOSTED_PASSIVATIONS if self.config.actor_hosts > 0 else MAX_PASSIVATIONS
        for name, spec in self._implied().items():
            if len(self._passivations) >= most:
                return
            row = self._health.get(name)
            if (row is not None and row["state"] == "ALIVE" and not row.get("passivation_blockers")
                    and (row.get("idle_s") or 0.0) >= idle_s and name not in self._passivations
                    and name not in self._activations and name not in self._restarts):
                task = self._passivations[name] = asyncio.get_running_loop().create_task(
                    self._passivate_now(spec, idle_s))
                task.add_done_callback(lambda done, name=name: self._passivation_done(name, done))

    async def _passivate_now(self, spec: ActorSpec, idle_s: float) -> bool:
        """Ask the actor to passivate (it refuses if a call came in since the probe), then kill
        it for good, or drop it from its host; it stays dormant until a call activates it."""
        token = self.authorizer.engine_token()
        if (host := self._host_of(spec.name)) is not None:
            answer = await self._host_call(host, "call", spec.name, "passivate", (idle_s,), {"auth": token})
        elif (handle := self._handle(spec.name)) is not None:
            answer = await asyncio.wrap_future(handle.passivate.remote(idle_s, auth=token).future())
        else:
            return False
        if not answer["passivated"]:
            return False
        # Counted once it agreed: it has stopped serving for good, so it is dormant from here, and
        # a health call made once Ray released its name (below) already shows the passivation.
        row = self._row(spec.name, spec.kind)
        row.update(state="DORMANT", passivations=row["passivations"] + 1, idle_s=None, passivation_blockers=None)
        passivated(spec.kind)
        await self._stop_actors([spec.name])
        return True

    def _passivation_done(self, name: str, task: asyncio.Task) -> None:
        self._passivations.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("passivating %s failed: %r", name, task.exception())

    @guarded(Access.AUTHENTICATED)
    async def health(self) -> dict[str, Any]:
        """Every actor: state (ALIVE, DORMANT, RECOVERING, ...), incarnation (its epoch: each
        incarnation fences the last), restarts seen, activations and passivations, when and how
        long its last recovery took; and how many actors are active and dormant."""
        await self._started()
        await self._probe_all()
        rows = [self._health[n] for n, _ in self.actor_names() if n in self._health]
        dormant = sum(r["state"] == "DORMANT" for r in rows)
        return {"actors": rows, "healthy": all(r["state"] in ("ALIVE", "DORMANT") for r in rows),
                "active": len(rows) - dormant, "dormant": dormant, "storage": self.config.storage_url,
                "handle_lookups": self._handle_lookups}

    @guarded(Access.SUPERUSER)
    async def shutdown_actors(self) -> list[str]:
        """Stop every actor this supervisor created (the cluster is being shut down); returns the
        names killed, which Ray releases asynchronously (callers wait, see ``cluster.stop_engine``)."""
        await self._started()
        self._shut_down = True
        if self._watch_task is not None:
            self._watch_task.cancel()
        names = [name for name, _ in self.actor_names()]
        names += [host_actor_name(index) for index in range(self.config.actor_hosts)]
        for name in names:
            self._kill(name)
        return names


def topic_object_folders(topic: str) -> list[str]:
    """The object-store folders holding ``topic``'s data: its partitions' ledgers
    (``partition_stream``) and snapshots, and its subscriptions' pending-ack ledgers with their
    cursors (``pending_ack_stream``)."""
    return [f"streams/topics/{topic}", f"topics/{topic}", f"streams/subscriptions/{topic}"]


def subscription_object_folders(topic: str, partitions: int, subscription: str) -> list[str]:
    """The folders of one subscription's pending-ack ledgers, one per partition."""
    return [f"streams/subscriptions/{topic}/{p}/{subscription}" for p in range(partitions)]


def _handle(name: str) -> Any:
    """The live actor ``name``, or None."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def probes_due(candidates: Iterable[str], probed_at: dict[str, float], budget: int) -> list[str]:
    """The ``budget`` candidates probed longest ago (never probed first): over consecutive watch
    rounds every candidate comes up, once every ``ceil(len / budget)`` rounds."""
    return sorted(candidates, key=lambda name: probed_at.get(name, float("-inf")))[:budget]


def _live_actor_names() -> set[str]:
    """The engine's actors that have a process now (running or restarting), in one call."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}


def _kill(name: str) -> bool:
    """Kill the actor ``name`` for good; False when no actor has that name (any more)."""
    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        return False
    return True


SupervisorActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                             max_concurrency=1000)(Supervisor)
