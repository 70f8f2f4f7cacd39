"""Compacted topics in a simulated run (the compaction and stateful profiles: ``compaction.py``,
``stateful.py``).

- ``add_compacted_topic``: a compacted topic's partition actors, built with the policy as the
  supervisor hands it (compacted, a small threshold) and a retention pass every
  ``RETENTION_CHECK_S``, so each partition compacts itself several times a run and trims its live
  ledger below the horizon; its subscriptions; and the catalog in the simulated storage, where the
  retention pass reads the topic's policy and the names of the subscriptions whose persisted
  cursors hold data back (``actors/retention.py``).
- ``SimTable``: the real table view's core (``raytxn.client.table_view.TableState``: load the
  compacted view, then tail the committed data, reload after a trim) over the simulated network
  and storage: what ``Client.table_view`` and ``StatefulPipeline`` read state with.
- ``Generations``: every compacted generation of a topic that was published in the run, as the
  storage saw its horizon object created (also generations deleted by later compactions, and
  those a zombie or a crashed compactor published), with its records, when it was published, and
  the ``max_read_position`` of the partition's serving incarnation at that moment.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import msgspec

from raytxn.actors.compaction import PartitionCompaction
from raytxn.actors.partition import PartitionBuffer
from raytxn.actors.subscription import Subscription
from raytxn.client.table_view import TableState
from raytxn.config import PartitionConfig, SubscriptionConfig
from raytxn.ids import Position, partition_actor_name, partition_stream, subscription_actor_name
from raytxn.ledger import compacted as compacted_ledger
from raytxn.ledger.compacted import PublishedHorizon, compacted_prefix, decode_kept, decode_published
from raytxn.ledger.formats import DEFAULT_WRITE_FORMAT
from raytxn.ledger.framing import FrameKind, encode_frame
from raytxn.ledger.metadata import StreamMetadata, meta_path
from raytxn.protocol.catalog import CATALOG_KEY, CATALOG_STREAM, Catalog, encode_catalog
from raytxn.protocol.compaction import KeptRecord
from raytxn.protocol.lease import RangePlan
from raytxn.protocol.retention import RetentionPolicy
from raytxn.sim.world import World

RETENTION_CHECK_S = 0.25   # the compacted partitions' retention pass (and self-compaction check)
PLAN_DEADLINE_S = 30.0


@dataclass(frozen=True)
class CompactedTopic:
    name: str
    partitions: int
    subscriptions: tuple[str, ...]
    threshold_bytes: int
    # Subscriptions the catalog does not name, so they hold no retention back: ``read_compacted``
    # ones, which read the compacted view below the horizon, and nothing above it is trimmed.
    uncatalogued: tuple[str, ...] = ()


def add_compacted_topics(world: World, topics: list[CompactedTopic], partition_config: PartitionConfig,
                         subscription_config: SubscriptionConfig) -> None:
    """The topics' actors, and the catalog naming them (with their subscriptions) in storage."""
    config = dataclasses.replace(partition_config, retention_check_s=RETENTION_CHECK_S)
    catalog = Catalog()
    for topic in topics:
        policy = (True, topic.threshold_bytes)
        for p in range(topic.partitions):
            world.add(partition_actor_name(topic.name, p),
                      lambda name=topic.name, p=p, policy=policy, **seams: PartitionBuffer(
                          name, p, config=config, compaction=policy, **seams))
            for sub in (*topic.subscriptions, *topic.uncatalogued):
                world.add(subscription_actor_name(topic.name, p, sub),
                          lambda name=topic.name, p=p, sub=sub, **seams: Subscription(
                              name, p, sub, "earliest", config=subscription_config, **seams))
        catalog = catalog.with_topics([topic.name], topic.partitions, 0,
                                      RetentionPolicy(compacted=True, compaction_threshold_bytes=topic.threshold_bytes),
                                      subscriptions=list(topic.subscriptions)).with_topics_active([topic.name])
    meta = StreamMetadata(version=1, incarnation=1, properties={CATALOG_KEY: encode_catalog(catalog)})
    world.storage.place(meta_path(CATALOG_STREAM, 1),
                        encode_frame(FrameKind.META, 1, msgspec.msgpack.encode(meta), DEFAULT_WRITE_FORMAT))


class SimTable(TableState):
    """A table view's core over the simulated network (``range_plan`` of the partition actors)
    and storage."""

    def __init__(self, world: World, topic: str, partitions: int) -> None:
        async def plan(partition: int, start: Position) -> RangePlan:
            ref = world.network.ref(partition_actor_name(topic, partition))
            return await ref.call_async("range_plan", start, deadline_s=PLAN_DEADLINE_S)

        super().__init__(topic, partitions, world.storage, plan)
        self.loads = 0  # partition loads from the compacted view: the first ones, and those after a trim

    async def _load(self, partition: int) -> None:
        self.loads += 1
        await super()._load(partition)


@dataclass(frozen=True)
class Generation:
    partition: int
    published: PublishedHorizon
    t: float                           # when its horizon object was created: the publish
    max_read: Position | None          # the serving incarnation's max_read_position then (None: none served)

    @property
    def number(self) -> int:
        return self.published.horizon.generation

    @property
    def horizon(self) -> Position:
        return self.published.horizon.horizon


class Generations:
    """See the module docstring: installed on the world's storage, for ``topic``."""

    def __init__(self, world: World, topic: str, partitions: int) -> None:
        self._world = world
        self._prefixes = {compacted_prefix(partition_stream(topic, p)): p for p in range(partitions)}
        self._topic = topic
        self.published: list[Generation] = []
        self._data: dict[str, bytes] = {}  # every compacted data object created, by path
        world.storage.on_create.append(self._created)

    def _created(self, path: str, data: bytes) -> None:
        prefix, _, rest = path.partition("/compacted/")
        partition = self._prefixes.get(f"{prefix}/compacted")
        if partition is None:
            return
        if rest.startswith("data/"):
            self._data[path] = data
        elif rest.startswith("horizons/"):
            self.published.append(Generation(partition, decode_published(data, path), self._world.loop.time(),
                                             self._max_read(partition)))

    def _max_read(self, partition: int) -> Position | None:
        process = self._world.current(partition_actor_name(self._topic, partition))
        if process is None or not process.alive or not process.actor._serving:
            return None
        return process.actor.buffer.max_read_position

    def records(self, generation: Generation) -> list[KeptRecord] | None:
        """The generation's records (None: its data object was not created in this run)."""
        data = self._data.get(generation.published.data_path)
        return None if data is None else decode_kept(data, generation.published)


def compactions(world: World, topic: str, partitions: int) -> dict[str, int]:
    """What the partitions' serving incarnations did: self-compactions published and lost."""
    totals = {"compactions": 0, "compactions_lost": 0}
    for p in range(partitions):
        process = world.current(partition_actor_name(topic, p))
        if process is not None and process.alive:
            compaction: PartitionCompaction = process.actor.compaction
            for name in totals:
                totals[name] += compaction.info[name]
    return totals


@contextmanager
def numbered_nonces() -> Iterator[None]:
    """Compactions name their data objects 000000000000, 000000000001, ... in the block, not by
    random numbers (``raytxn.ledger.compacted.data_nonce``): the paths reach the trace."""
    numbers = itertools.count()
    saved = compacted_ledger.data_nonce
    compacted_ledger.data_nonce = lambda: f"{next(numbers):012x}"
    try:
        yield
    finally:
        compacted_ledger.data_nonce = saved


def one_of_each(found: list[str], limit: int = 5) -> list[str]:
    """At most ``limit`` of the violations ``found`` ("kind: what"), the first of each kind
    first: a run's verdict names every kind of check that failed."""
    firsts: dict[str, str] = {}
    for violation in found:
        firsts.setdefault(violation.split(":", 1)[0], violation)
    rest = [violation for violation in found if violation not in firsts.values()]
    return [*firsts.values(), *rest][:limit]
