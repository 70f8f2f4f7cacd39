"""A compacted topic's partition: what it does beyond a plain one (``actors/partition.py`` holds
one of these and calls it).

* It refuses a keyless append (``KeylessMessage``, Kafka's INVALID_RECORD): a key map has no
  place for it, and Kafka refuses it on a ``cleanup.policy=compact`` topic.
* It compacts itself, in its own process, once ``compaction_threshold_bytes`` of stored live
  data lie above its published horizon (Pulsar's ``compaction-threshold``; checked with retention,
  every ``retention_check_s``). The compaction is ``ledger.compacted.compact_partition``, the one
  ``Client.compact`` runs, fed the partition's own ``max_read_position`` and aborted spans: so no
  open or aborted transactional data enters it, and a compaction running elsewhere at the same
  time loses the conditional publish (``Fenced``) harmlessly.
* It serves Kafka fetches below its live ledger's start from the compacted ledger, in runs of
  records at their original offsets (``kafka_runs``; the gateway makes each one record batch):
  gaps where older values were, which Kafka's own compaction makes legal, and a Kafka log start
  of 0. The known generation's records are held decoded (one per live key, bounded by the
  compactor's ``max_keys``). A record keeps its key, value and time, not its properties (Kafka
  headers): the compacted ledger holds no more.
* It holds the published horizon it knows in memory: only the retention pass, ``trim`` and its
  own publishes list the horizons again (one list; the object is read only for a generation
  not known, as one a ``Client.compact`` elsewhere published), and a publish of its own keeps
  the records it wrote, unread. A horizon known late is an
  older one, and every use of it is safe then: trims stop lower, a compaction starts sooner,
  and a Kafka fetch serves the older generation, which with the live ledger above it is still
  the latest value of every key. A fetch whose generation's records a newer compaction deleted
  lists again.
* Its retention trims the live ledger only below the published horizon
  (``protocol.retention.compacted_retention_cut``), so the compacted ledger plus the live one
  always hold the latest committed value of every key.

A topic's compaction is fixed at its creation: the supervisor hands the policy to the partition
from its catalog when it starts it; a partition started without one reads the catalog once.
"""

from __future__ import annotations

import logging
from typing import Any

from raytxn import testing_bugs
from raytxn.actors.retention import read_catalog
from raytxn.errors import CorruptLedger, Fenced, KeylessMessage
from raytxn.ids import Position
from raytxn.ledger.compacted import PublishedHorizon, compact_partition, newest_generation, read_kept, read_published
from raytxn.ledger.storage import Storage
from raytxn.protocol.compaction import CompactedEntry, CompactedRun, KeptRecord, compacted_entries, kafka_runs
from raytxn.protocol.cursor import next_position
from raytxn.protocol.retention import StoredObject, compaction_due
from raytxn.protocol.txn_buffer import TransactionBuffer

log = logging.getLogger(__name__)
NOT_COMPACTED: tuple[bool, int | None] = (False, None)  # a plain topic's policy
KAFKA_RUN_RECORDS = 1000     # records in one record batch of a compacted Kafka fetch
KAFKA_RUNS_PER_READ = 10     # record batches in one compacted Kafka fetch of a partition


class PartitionCompaction:
    """The compaction side of one partition: its policy, its known horizon, its self-compaction."""

    def __init__(self, storage: Storage, topic: str, partition: int, stream: str,
                 policy: tuple[bool, int | None] | None = None) -> None:
        self.storage, self.topic, self.partition, self.stream = storage, topic, partition, stream
        self._given = policy is not None
        self.compacted, self.threshold_bytes = policy if policy is not None else (False, None)
        self.info: dict[str, Any] = {"compactions": 0, "compactions_lost": 0, "last_compaction": None,
                                     "horizon_reads": 0}
        self._published: PublishedHorizon | None = None
        self._listed = False  # whether _published was ever read (or set by a publish of this partition)
        self._kept_generation = -1
        self._kept: list[KeptRecord] = []
        self._kept_offsets: list[int] = []

    async def load(self) -> None:
        """The topic's compaction policy, from the catalog (a topic not in it: not compacted),
        unless it was given."""
        if self._given:
            return
        info = (await read_catalog(self.storage)).topics.get(self.topic)
        self.compacted = info is not None and info.compacted
        self.threshold_bytes = info.compaction_threshold_bytes if info is not None else None

    def check_append(self, first_keyless: int | None) -> None:
        """``KeylessMessage`` for a batch whose record ``first_keyless`` has no key
        (``entry_format.decode_submitted_batch``) on a compacted topic; nothing is written then."""
        if self.compacted and first_keyless is not None:
            raise KeylessMessage(f"record {first_keyless} of the batch has no key, and {self.topic} is compacted")

    async def refresh(self) -> Position | None:
        """The newest published horizon (None: never compacted), listed now; its object is read
        only when its generation is not the one known."""
        generation = await newest_generation(self.storage, self.stream)
        known = None if self._published is None else self._published.horizon.generation
        if not self._listed or generation != known:
            self._published = await read_published(self.storage, self.stream)
            self.info["horizon_reads"] += 1
        self._listed = True
        return self.horizon()

    def horizon(self) -> Position | None:
        """The published horizon known (None: none known)."""
        return None if self._published is None else self._published.horizon.horizon

    async def compact_if_due(self, objects: list[StoredObject], buffer: TransactionBuffer,
                             now_ms: int) -> Position | None:
        """Compact when ``protocol.retention.compaction_due`` says so; the horizon after."""
        horizon = await self.refresh()
        if not compaction_due(objects, horizon, self.threshold_bytes, buffer.max_read_position):
            return horizon
        return await self.compact(buffer, now_ms)

    async def compact(self, buffer: TransactionBuffer, now_ms: int) -> Position | None:
        """One compaction up to the partition's ``max_read_position`` now; the horizon after."""
        max_read = buffer.max_read_position
        if testing_bugs.REINTRODUCED["compaction_past_max_read"]:  # test only: open txns' data folded in
            max_read = buffer.last_position
        aborted = buffer.aborted_between(Position(0, 0), max_read)
        try:
            result = await compact_partition(self.storage, self.topic, self.partition, max_read, aborted, now_ms)
        except Fenced:  # a compaction elsewhere published this generation first: its horizon stands
            self.info["compactions_lost"] += 1
            return await self.refresh()
        await self.refresh()  # this publish (or one after it): one list and one read, once a compaction
        if self._published is not None and self._published.horizon == result.horizon:
            self._kept_generation, self._kept = result.horizon.generation, result.records  # no read of them
            self._kept_offsets = [record.offset for record in result.records]
        self.info["compactions"] += 1
        self.info["last_compaction"] = {"generation": result.horizon.generation,
                                        "horizon": str(result.horizon.horizon),
                                        "records": result.horizon.records, "time_ms": now_ms}
        log.debug("compacted %s to %s", self.stream, result.horizon.horizon)
        return result.horizon.horizon

    async def kafka_runs(self, offset: int, below: int) -> list[CompactedRun]:
        """The compacted records at offsets ``offset`` to ``below - 1``, in runs of at most
        ``KAFKA_RUN_RECORDS`` (at most ``KAFKA_RUNS_PER_READ`` of them), for a Kafka fetch under
        the live ledger's start."""
        if not await self._load_kept():
            return []
        return kafka_runs(self._kept, self._kept_offsets, offset, below, KAFKA_RUN_RECORDS,
                          KAFKA_RUN_RECORDS * KAFKA_RUNS_PER_READ)

    async def entries(self, start: Position, max_entries: int) -> tuple[list[CompactedEntry], Position] | None:
        """A ``read_compacted`` subscription's read from ``start``: the kept records of up to
        ``max_entries`` entries at or after it, and where its next read goes (past the horizon
        once these are the last: the live ledger from there). None when no published horizon
        covers ``start``: the live ledger is then where it reads."""
        if not await self._load_kept():
            return None
        assert self._published is not None
        horizon = self._published.horizon.horizon
        if start > horizon:
            return None
        found = compacted_entries(self._kept, start, max_entries)
        last_of_view = not found or found[-1].position >= self._kept[-1].position
        return found, next_position(horizon) if last_of_view else next_position(found[-1].position)

    async def _load_kept(self) -> bool:
        """The published generation's records held decoded (False: never compacted)."""
        if not self._listed:
            await self.refresh()
        for _ in range(2):  # again once: a newer compaction deleted the known generation's records
            if self._published is None:
                return False
            if self._published.horizon.generation != self._kept_generation:
                try:
                    self._kept = await read_kept(self.storage, self._published)
                except CorruptLedger:
                    if await newest_generation(self.storage, self.stream) == self._published.horizon.generation:
                        raise  # the generation still stands: its records are truly gone
                    await self.refresh()
                    continue
                self._kept_offsets = [record.offset for record in self._kept]
                self._kept_generation = self._published.horizon.generation
            return True
        raise CorruptLedger(f"{self.stream}: the compacted records vanished under two reads", self.stream)
