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
from typing import Any

import msgspec
import ray

from raytxn.actors.shell import ActorRefs, ActorShell, Clock
from raytxn.auth import Access, Authorizer, guarded
from raytxn.config import EngineConfig
from raytxn.errors import ActorUnavailable, NotAllowed, TopicNotFound
from raytxn.faults import FaultPoints, FaultTarget
from raytxn.ids import (
    NAMESPACE,
    SUPERVISOR_NAME,
    coordinator_actor_name,
    partition_actor_name,
    subscription_actor_name,
)
from raytxn.ledger import ManagedLedger
from raytxn.ledger.storage import Storage
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
# How long a delete waits for Ray to release the names of the actors it killed.
STOP_ACTORS_TIMEOUT_S = 60.0

log = logging.getLogger(__name__)


class Supervisor(ActorShell, FaultTarget):
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
        self._watch_task: asyncio.Task | None = None
        self.info: dict[str, Any] = {}
        self.faults = FaultPoints()
        self._deletions: dict[tuple[str, ...], asyncio.Task] = {}  # ("topic", t) / ("subscription", t, s)

    async def _start(self) -> None:
        self._ledger = await ManagedLedger.open(self.storage, CATALOG_STREAM)
        self.catalog = decode_catalog(self._ledger.properties.get(CATALOG_KEY))
        await asyncio.gather(*self._coordinator_refs())
        await self._finish_interrupted_admin()
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())

    @guarded(Access.PUBLIC)
    async def ready(self) -> dict[str, Any]:
        await self._started()
        return {"config": self.config.public(), "topics": len(self.catalog.topics)}

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

    def _coordinator_refs(self) -> list[Any]:
        from raytxn.actors.coordinator import CoordinatorActor

        refs = []
        for tc_id in range(self.config.coordinator.num_coordinators):
            handle = CoordinatorActor.options(
                name=coordinator_actor_name(tc_id), namespace=NAMESPACE, lifetime="detached",
                get_if_exists=True, resources=self.config.actor_resources,
            ).remote(tc_id, self.config.storage_url, self.config.storage_options, self.config.coordinator,
                      auth=self.config.auth)
            refs.append(handle.ready.remote())
        return refs

    async def _ensure_topic_actors(self, topic: str) -> None:
        """Create (unless they run) the actors of ``topic`` and of its subscriptions, and wait for
        them. Nothing is created for an entry being deleted: the state is read and the actors
        created with no await in between, so a delete's kill finds every actor made before."""
        from raytxn.actors.partition import PartitionActor

        info = self.catalog.topics.get(topic)
        if info is None or info.state is EntryState.DELETING:
            return
        refs = []
        for p in range(info.partitions):
            handle = PartitionActor.options(
                name=partition_actor_name(topic, p), namespace=NAMESPACE, lifetime="detached",
                get_if_exists=True, resources=self.config.actor_resources,
            ).remote(topic, p, self.config.storage_url, self.config.storage_options, self.config.partition,
                      self.config.auth)
            refs.append(handle.ready.remote())
        for name in self.catalog.subscription_names(topic, _LIVE):
            refs += self._subscription_refs(topic, name, info.partitions)
        await asyncio.gather(*refs)

    def _subscription_refs(self, topic: str, name: str, partitions: int) -> list[Any]:
        try:
            from raytxn.actors.subscription import SubscriptionActor
        except ImportError:  # subscriptions arrive with their own actor module
            return []
        sub = self.catalog.subscriptions.get(topic, {}).get(name)
        if sub is None or sub.state is EntryState.DELETING:
            return []
        refs = []
        for p in range(partitions):
            handle = SubscriptionActor.options(
                name=subscription_actor_name(topic, p, name), namespace=NAMESPACE, lifetime="detached",
                get_if_exists=True, resources=self.config.actor_resources,
            ).remote(topic, p, name, sub.initial_position, self.config.storage_url, self.config.storage_options,
                     self.config.subscription, self.config.auth)
            refs.append(handle.ready.remote())
        return refs

    async def _save(self, catalog: Catalog) -> None:
        assert self._ledger is not None
        await self._write(self._ledger.set_properties({CATALOG_KEY: encode_catalog(catalog)}))
        self.catalog = catalog

    # --- admin -------------------------------------------------------------------------------

    @guarded(Access.SUPERUSER)
    async def create_topic(self, name: str, partitions: int = 1, retention_bytes: int | None = None,
                           retention_s: float | None = None) -> dict[str, Any]:
        """Save the topic CREATING, start its actors, save it ACTIVE. A retried create of a topic
        still CREATING with the same partitions and retention finishes it. ``retention_bytes`` /
        ``retention_s``: keep acked data that long (protocol/retention.py)."""
        await self._started()
        retention = check_retention(retention_bytes, retention_s)
        context = {"kind": "topic", "topic": name}
        async with self._lock:
            entry = self.catalog.topics.get(name)
            if (entry is None or entry.state is not EntryState.CREATING or entry.partitions != partitions
                    or entry.retention != retention):
                await self._save(self.catalog.with_topic(name, partitions, self.clock.now_ms(), retention))
        await self.faults.hit("supervisor.after_save_creating", **context)
        await self._ensure_topic_actors(name)
        await self.faults.hit("supervisor.after_create_actors", **context)
        await self._activate_topic(name)
        await self.faults.hit("supervisor.after_activate", **context)
        return {"name": name, "partitions": partitions, **msgspec.structs.asdict(retention)}

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
        CREATING, its actors started, saved ACTIVE, as a topic."""
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
        await asyncio.gather(*self._subscription_refs(topic, name, info.partitions))
        await self.faults.hit("supervisor.after_create_actors", **context)
        await self._activate_subscription(topic, name)
        await self.faults.hit("supervisor.after_activate", **context)
        return {"topic": topic, "name": name, "partitions": info.partitions}

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
        async with self._lock:
            if name in self.catalog.topics:
                await self._save(self.catalog.without_topic(name))
        await self.faults.hit("supervisor.after_remove_entry", **context)

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
        deadline = self.clock.monotonic() + STOP_ACTORS_TIMEOUT_S
        while alive := [name for name in names if _kill(name)]:
            if self.clock.monotonic() > deadline:
                raise ActorUnavailable(f"{len(alive)} actors still registered {STOP_ACTORS_TIMEOUT_S}s after "
                                       f"being killed, e.g. {alive[0]!r}")
            await asyncio.sleep(0.05)

    async def _delete_objects(self, folders: list[str]) -> None:
        for folder in folders:
            await self.storage.delete(await self.storage.list(folder))

    async def _finish_interrupted_admin(self) -> None:
        """Recovery: finish what a crashed incarnation left half done. Entries being deleted are
        deleted (a failure is left to the watcher), the actors of every other entry are started,
        and CREATING entries become ACTIVE."""
        await asyncio.gather(*self._resume_deletions(), return_exceptions=True)
        for topic in list(self.catalog.topics.values()):
            await self._ensure_topic_actors(topic.name)
            if topic.state is EntryState.CREATING:
                await self._activate_topic(topic.name)
        for sub in self.catalog.subscriptions_in(EntryState.CREATING):
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

    # --- watching ----------------------------------------------------------------------------

    def actor_names(self, kind: str | None = None, topic: str | None = None) -> list[tuple[str, str]]:
        """(name, kind) of every actor the catalog implies: coordinators, partitions, subscriptions."""
        names = [(coordinator_actor_name(i), "coordinator") for i in range(self.config.coordinator.num_coordinators)]
        for info in self.catalog.topics.values():
            if (topic is not None and info.name != topic) or info.state is EntryState.DELETING:
                continue  # a deleting topic's actors are being stopped: never probed nor re-created
            subs = self.catalog.subscription_names(info.name, _LIVE)
            for p in range(info.partitions):
                names.append((partition_actor_name(info.name, p), "partition"))
                names += [(subscription_actor_name(info.name, p, sub), "subscription") for sub in subs]
        return [(n, k) for n, k in names if kind is None or k == kind]

    @guarded(Access.AUTHENTICATED)
    async def list_actors(self, kind: str | None = None, topic: str | None = None) -> list[tuple[str, str]]:
        await self._started()
        return self.actor_names(kind, topic)

    async def _watch(self) -> None:
        """Probe every actor; a restarted one is driven through recovery at once (actors recover
        lazily), a dead one is created again. Nothing stays stuck waiting for a first call."""
        while True:
            await asyncio.sleep(self.config.watch_interval_s)
            self._resume_deletions()
            await asyncio.gather(*(self._probe(name, kind) for name, kind in self.actor_names()),
                                 return_exceptions=True)

    async def _probe(self, name: str, kind: str) -> None:
        row = self._health.setdefault(name, {"name": name, "kind": kind, "state": "UNKNOWN", "incarnation": None,
                                             "restarts": 0, "last_recovery_ms": None, "recovery_ms": None,
                                             "recreated": 0})
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            handle = None
        if handle is None:
            row["state"] = "DEAD"
            row["recreated"] += 1
            await self._recreate(name, kind)
            return
        try:
            info = await asyncio.wait_for(asyncio.wrap_future(handle.ready.remote().future()),
                                          self.config.watch_timeout_s)
        except TimeoutError:
            row["state"] = "RECOVERING"
            return
        except ray.exceptions.ActorDiedError:
            row["state"] = "DEAD"
            row["recreated"] += 1
            await self._recreate(name, kind)
            return
        except Exception as e:  # noqa: BLE001 - restarting or failing recovery: report it
            row["state"] = f"RESTARTING ({type(e).__name__})"
            return
        incarnation = info.get("incarnation")
        if row["incarnation"] is not None and incarnation is not None and incarnation > row["incarnation"]:
            row["restarts"] += 1
        row.update(state="ALIVE", incarnation=incarnation, last_recovery_ms=info.get("started_ms"),
                   recovery_ms=info.get("recovery_ms"), checked_ms=self.clock.now_ms())

    async def _recreate(self, name: str, kind: str) -> None:
        if kind == "coordinator":
            await asyncio.gather(*self._coordinator_refs())
            return
        for topic in self.catalog.topics.values():
            if any(n == name for n, _ in self.actor_names(topic=topic.name)):
                await self._ensure_topic_actors(topic.name)
                return

    @guarded(Access.AUTHENTICATED)
    async def health(self) -> dict[str, Any]:
        """Every actor: state, incarnation (its epoch: each incarnation fences the last),
        restarts seen, when and how long its last recovery took."""
        await self._started()
        await asyncio.gather(*(self._probe(n, k) for n, k in self.actor_names()), return_exceptions=True)
        rows = [self._health[n] for n, _ in self.actor_names() if n in self._health]
        return {"actors": rows, "healthy": all(r["state"] == "ALIVE" for r in rows),
                "storage": self.config.storage_url}

    @guarded(Access.SUPERUSER)
    async def shutdown_actors(self) -> list[str]:
        """Stop every actor this supervisor created (the cluster is being shut down); returns the
        names killed, which Ray releases asynchronously (callers wait, see ``cluster.stop_engine``)."""
        await self._started()
        if self._watch_task is not None:
            self._watch_task.cancel()
        names = [name for name, _ in self.actor_names()]
        for name in names:
            _kill(name)
        return names


def topic_object_folders(topic: str) -> list[str]:
    """The object-store folders holding ``topic``'s data: its partitions' ledgers
    (``partition_stream``) and snapshots, and its subscriptions' pending-ack ledgers with their
    cursors (``pending_ack_stream``)."""
    return [f"streams/topics/{topic}", f"topics/{topic}", f"streams/subscriptions/{topic}"]


def subscription_object_folders(topic: str, partitions: int, subscription: str) -> list[str]:
    """The folders of one subscription's pending-ack ledgers, one per partition."""
    return [f"streams/subscriptions/{topic}/{p}/{subscription}" for p in range(partitions)]


def _kill(name: str) -> bool:
    """Kill the actor ``name`` for good; False when no actor has that name (any more)."""
    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        return False
    return True


SupervisorActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                             max_concurrency=1000)(Supervisor)
