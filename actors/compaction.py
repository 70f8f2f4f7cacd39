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
* It serves Kafka fetches below its live ledger's start from the compacted ledger, each record
  as a one-record batch at its original offset (``kafka_entries``): gaps where older values
  were, which Kafka's own compaction makes legal, and a Kafka log start of 0. The newest
  generation's records are held decoded (one per live key, bounded by the compactor's
  ``max_keys``) while its horizon stands. A record keeps its key, value and time, not its
  properties (Kafka headers): the compacted ledger holds no more.
* Its retention trims the live ledger only below the published horizon
  (``protocol.retention.compacted_retention_cut``), so the compacted ledger plus the live one
  always hold the latest committed value of every key.

A topic's compaction is fixed at its creation: the supervisor hands the policy to the partition
from its catalog when it starts it; a partition started without one reads the catalog once.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

from raytxn.actors.retention import read_catalog
from raytxn.errors import Fenced, KeylessMessage
from raytxn.ids import Position
from raytxn.ledger.compacted import compact_partition, read_kept, read_published
from raytxn.ledger.storage import Storage
from raytxn.protocol.compaction import KeptRecord
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_header, encode_message, first_keyless
from raytxn.protocol.retention import StoredObject, bytes_above
from raytxn.protocol.txn_buffer import TransactionBuffer

log = logging.getLogger(__name__)
NOT_COMPACTED: tuple[bool, int | None] = (False, None)  # a plain topic's policy
COMPACTED_PRODUCER = "raytxn-compacted"  # the producer of a compacted record's one-record batch


class PartitionCompaction:
    """The compaction side of one partition: its policy, and its self-compaction."""

    def __init__(self, storage: Storage, topic: str, partition: int, stream: str,
                 policy: tuple[bool, int | None] | None = None) -> None:
        self.storage, self.topic, self.partition, self.stream = storage, topic, partition, stream
        self._given = policy is not None
        self.compacted, self.threshold_bytes = policy if policy is not None else (False, None)
        self.info: dict[str, Any] = {"compactions": 0, "compactions_lost": 0, "last_compaction": None}
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

    def check_append(self, messages: list[bytes]) -> None:
        """``KeylessMessage`` for a keyless record on a compacted topic; nothing is written then."""
        if self.compacted and (index := first_keyless(messages)) is not None:
            raise KeylessMessage(f"record {index} of the batch has no key, and {self.topic} is compacted")

    async def horizon(self) -> Position | None:
        """The newest published horizon (None: never compacted)."""
        published = await read_published(self.storage, self.stream)
        return None if published is None else published.horizon.horizon

    async def compact_if_due(self, objects: list[StoredObject], buffer: TransactionBuffer,
                             now_ms: int) -> Position | None:
        """Compact when the live bytes above the horizon reached the threshold; the horizon after."""
        horizon = await self.horizon()
        if self.threshold_bytes is None or bytes_above(objects, horizon) < self.threshold_bytes:
            return horizon
        max_read = buffer.max_read_position
        if max_read.ledger_id < 0 or (horizon is not None and max_read <= horizon):
            return horizon  # nothing readable past it yet: a compaction would publish nothing new
        return await self.compact(buffer, now_ms)

    async def compact(self, buffer: TransactionBuffer, now_ms: int) -> Position | None:
        """One compaction up to the partition's ``max_read_position`` now; the horizon after."""
        max_read = buffer.max_read_position
        aborted = buffer.aborted_between(Position(0, 0), max_read)
        try:
            result = await compact_partition(self.storage, self.topic, self.partition, max_read, aborted, now_ms)
        except Fenced:  # a compaction elsewhere published this generation first: its horizon stands
            self.info["compactions_lost"] += 1
            return await self.horizon()
        horizon = result.horizon
        self.info["compactions"] += 1
        self.info["last_compaction"] = {"generation": horizon.generation, "horizon": str(horizon.horizon),
                                        "records": horizon.records, "time_ms": now_ms}
        log.debug("compacted %s to %s", self.stream, horizon.horizon)
        return horizon.horizon

    async def kafka_entries(self, offset: int, below: int, max_entries: int) -> list[tuple[int, list[bytes]]]:
        """The compacted records at offsets ``offset`` to ``below - 1`` (at most ``max_entries``),
        each as the records of a one-record entry at its original offset, for a Kafka fetch under
        the live ledger's start. A tombstone's value is empty, as the gateway stores a null one."""
        published = await read_published(self.storage, self.stream)
        if published is None:
            return []
        if published.horizon.generation != self._kept_generation:
            self._kept = await read_kept(self.storage, published)
            self._kept_offsets = [record.offset for record in self._kept]
            self._kept_generation = published.horizon.generation
        first = bisect.bisect_left(self._kept_offsets, offset)
        entries = []
        for record in self._kept[first:first + max_entries]:
            if record.offset >= below:
                break
            header = EntryHeader("data", None, COMPACTED_PRODUCER, record.offset, record.offset, 1,
                                 record.publish_time_ms)
            message = MessageRecord(record.value or b"", record.key)
            entries.append((record.offset, [encode_header(header), encode_message(message)]))
        return entries
