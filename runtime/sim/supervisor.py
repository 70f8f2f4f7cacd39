"""The supervisor's part in a simulated run: the catalog's answers and topic deletion.

The real ``Supervisor`` creates and kills actors through Ray, so it cannot run in the simulator.
What the engine under test needs of it here is small: the coordinator asks ``get_topic`` whether a
participant it cannot find was deleted (``actors/coordinator.py``), and a workload deletes topics.
``SimSupervisor`` does both over the real ``Catalog`` rules (a DELETING topic is gone for
clients), with the real supervisor's deletion steps: save the topic DELETING, stop its actors,
delete its objects, remove the entry. Its catalog lives in ``CatalogStore``, outside any one
incarnation, as the real one lives in storage: a crash loses no step already taken, and the
deleting client's retry finishes the rest (every step is idempotent).

Only the runs whose workload deletes topics have one (other runs keep their traces).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raytxn.actors.shell import ActorRefs, Clock
from raytxn.actors.supervisor import topic_object_folders
from raytxn.ids import partition_actor_name, subscription_actor_name
from raytxn.ledger.storage import Storage
from raytxn.protocol.catalog import Catalog, EntryState


@dataclass
class CatalogStore:
    """The durable catalog of a simulated run (what the real supervisor keeps in its stream)."""

    catalog: Catalog = field(default_factory=Catalog)

    def add_topic(self, name: str, partitions: int, subscriptions: list[str]) -> None:
        """An ACTIVE topic with ``subscriptions``, as a finished create leaves it."""
        self.catalog = self.catalog.with_topics([name], partitions, 0, subscriptions=subscriptions) \
            .with_topics_active([name])


class SimSupervisor:
    """See the module docstring. ``stop_actors(names)`` ends those actors for good (the world's)."""

    def __init__(self, store: CatalogStore, stop_actors: Callable[[list[str]], None], *,
                 clock: Clock, actor_refs: ActorRefs, storage: Storage) -> None:
        self._store = store
        self._stop_actors = stop_actors
        self._storage = storage
        self.exit_process: Callable[[int], object] = lambda code: None  # the world replaces it

    async def get_topic(self, name: str, auth: str | None = None) -> dict[str, Any]:
        """As ``Supervisor.get_topic``: ``TopicNotFound`` once the topic is DELETING or gone."""
        catalog = self._store.catalog
        info = catalog.topic(name)
        return {"name": info.name, "partitions": info.partitions, "subscriptions": catalog.subscription_names(name)}

    async def delete_topic(self, name: str, auth: str | None = None) -> None:
        """As ``Supervisor.delete_topic``; ``TopicNotFound`` when it is gone already."""
        store = self._store
        info = store.catalog.topic_entry(name)
        if info.state is not EntryState.DELETING:
            store.catalog = store.catalog.with_topic_state(name, EntryState.DELETING)
        await asyncio.sleep(0)  # another call may come in between, as between two durable writes
        subscriptions = store.catalog.subscription_names(name, tuple(EntryState))
        self._stop_actors([actor for p in range(info.partitions) for actor in
                           [partition_actor_name(name, p), *(subscription_actor_name(name, p, s)
                                                              for s in subscriptions)]])
        for folder in topic_object_folders(name):
            await self._storage.delete_folder(folder)
        if name in store.catalog.topics:
            store.catalog = store.catalog.without_topic(name)
