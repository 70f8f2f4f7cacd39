"""The supervisor actor: owns the catalog and creates every other actor.

It persists the catalog (topics, partitions, subscriptions) in the object store, creates the
coordinators, one ``partition-<topic>-<p>`` per partition and one ``sub-<topic>-<p>-<name>`` per
partition and subscription, and answers admin calls. Actors are created with Ray's restart
machinery (``max_restarts=-1``); every actor recovers from its own ledgers when restarted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from raytxn.actors.shell import ActorRefs, ActorShell, Clock
from raytxn.auth import Access, Authorizer, guarded
from raytxn.config import EngineConfig
from raytxn.ids import (
    NAMESPACE,
    SUPERVISOR_NAME,
    coordinator_actor_name,
    partition_actor_name,
    subscription_actor_name,
)
from raytxn.ledger import ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.catalog import CATALOG_KEY, CATALOG_STREAM, Catalog, decode_catalog, encode_catalog


class Supervisor(ActorShell):
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

    async def _start(self) -> None:
        self._ledger = await ManagedLedger.open(self.storage, CATALOG_STREAM)
        self.catalog = decode_catalog(self._ledger.properties.get(CATALOG_KEY))
        await asyncio.gather(*self._coordinator_refs())
        for topic in self.catalog.topics.values():
            await self._ensure_topic_actors(topic.name)
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
        from raytxn.actors.partition import PartitionActor

        info = self.catalog.topic(topic)
        refs = []
        for p in range(info.partitions):
            handle = PartitionActor.options(
                name=partition_actor_name(topic, p), namespace=NAMESPACE, lifetime="detached",
                get_if_exists=True, resources=self.config.actor_resources,
            ).remote(topic, p, self.config.storage_url, self.config.storage_options, self.config.partition,
                      self.config.auth)
            refs.append(handle.ready.remote())
        for sub in self.catalog.subscriptions.get(topic, {}).values():
            refs += self._subscription_refs(sub.topic, sub.name, info.partitions)
        await asyncio.gather(*refs)

    def _subscription_refs(self, topic: str, name: str, partitions: int) -> list[Any]:
        try:
            from raytxn.actors.subscription import SubscriptionActor
        except ImportError:  # subscriptions arrive with their own actor module
            return []
        sub = self.catalog.subscriptions[topic][name]
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
    async def create_topic(self, name: str, partitions: int = 1) -> dict[str, Any]:
        await self._started()
        async with self._lock:
            await self._save(self.catalog.with_topic(name, partitions, self.clock.now_ms()))
        await self._ensure_topic_actors(name)
        return {"name": name, "partitions": partitions}

    @guarded(Access.SUPERUSER)
    async def delete_topic(self, name: str) -> None:
        """Remove the topic, stop its actors and delete its data."""
        await self._started()
        async with self._lock:
            info = self.catalog.topic(name)
            subs = list(self.catalog.subscriptions.get(name, {}))
            await self._save(self.catalog.without_topic(name))
        for p in range(info.partitions):
            names = [partition_actor_name(name, p)] + [subscription_actor_name(name, p, s) for s in subs]
            for actor_name in names:
                _kill(actor_name)
        paths = await self.storage.list(f"streams/topics/{name}")
        paths += await self.storage.list(f"topics/{name}")
        paths += await self.storage.list(f"streams/subscriptions/{name}")
        await self.storage.delete(paths)

    @guarded(Access.AUTHENTICATED)
    async def list_topics(self) -> list[dict[str, Any]]:
        await self._started()
        return [{"name": t.name, "partitions": t.partitions, "created_ms": t.created_ms,
                 "subscriptions": sorted(self.catalog.subscriptions.get(t.name, {}))}
                for t in sorted(self.catalog.topics.values(), key=lambda t: t.name)]

    @guarded(Access.AUTHENTICATED)
    async def get_topic(self, name: str) -> dict[str, Any]:
        await self._started()
        info = self.catalog.topic(name)
        return {"name": info.name, "partitions": info.partitions, "created_ms": info.created_ms,
                "subscriptions": sorted(self.catalog.subscriptions.get(name, {}))}

    @guarded(Access.AUTHENTICATED)
    async def create_subscription(self, topic: str, name: str, initial_position: str = "latest",
                                  caller: str | None = None) -> dict[str, Any]:
        """Create the subscription unless it exists (needs the topic's consume permission)."""
        await self._started()
        if caller is not None:
            self.authorizer.authorize(caller, Access.CONSUME, self.catalog.topic_permissions(topic),
                                      f"topic {topic!r}")
        async with self._lock:
            catalog = self.catalog.with_subscription(topic, name, initial_position, self.clock.now_ms())
            if catalog is not self.catalog:
                await self._save(catalog)
        info = self.catalog.topic(topic)
        await asyncio.gather(*self._subscription_refs(topic, name, info.partitions))
        return {"topic": topic, "name": name, "partitions": info.partitions}

    @guarded(Access.SUPERUSER)
    async def delete_subscription(self, topic: str, name: str) -> None:
        await self._started()
        async with self._lock:
            info = self.catalog.topic(topic)
            await self._save(self.catalog.without_subscription(topic, name))
        for p in range(info.partitions):
            _kill(subscription_actor_name(topic, p, name))
        paths = await self.storage.list(f"streams/subscriptions/{topic}")
        await self.storage.delete([x for x in paths if f"/{name}/" in x])

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
            if topic is not None and info.name != topic:
                continue
            for p in range(info.partitions):
                names.append((partition_actor_name(info.name, p), "partition"))
                for sub in self.catalog.subscriptions.get(info.name, {}):
                    names.append((subscription_actor_name(info.name, p, sub), "subscription"))
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


def _kill(name: str) -> None:
    try:
        ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        pass


SupervisorActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                             max_concurrency=1000)(Supervisor)
