"""The pure key compaction of one partition (Pulsar's two-phase compactor, Kafka's cleaner rules).

Ledger objects are immutable, so compaction never rewrites the live ledger. A compactor reads the
partition's entries from the previous horizon up to a new horizon H, folds them with the records
the previous compaction kept into the latest committed value of each key (``Compactor``), writes
those records to a new compacted ledger (generation g + 1), and publishes ``(g + 1, H)`` with one
conditional write (``check_publish``). A reader below H reads the compacted ledger, above it the
live one (``read_plan``). Until the publish, the previous generation stays the truth, so a crash at
any step loses nothing: the unpublished ledger is an orphan (``unpublished_generations``), deleted
by the next compactor, and the superseded one is deleted once readers moved on.

The rules, each checked here rather than trusted to the caller:

* H never passes the partition's ``max_read_position``: below it every transaction has ended, so
  what the fold sees is final, and no open transactional data can enter a compacted ledger.
* Aborted writes never enter the key map, whatever their keys (Kafka's cleaner rule; KAFKA-13727,
  KAFKA-8351 and Pulsar #21464 are what happens otherwise): an entry of a transaction whose
  aborted span covers it is skipped (``HiddenSpans``), as ``TransactionBuffer.is_visible`` skips it
  for readers.
  Markers take an offset but hold no records. The txn buffer's aborted set still covers (H, head].
* Records keep their original offsets and positions: a Kafka client reading a compacted topic sees
  gaps where older values were, which Kafka's own compaction makes legal.
* A record whose value is empty (or None) is a tombstone. A compaction keeps it, stamped with the
  time of the first compaction that kept it, and drops it once ``delete_retention_ms`` passed since
  then (Kafka's ``delete.retention.ms``, counted as Kafka's cleaner counts it). A reader that resumes
  at or below the highest dropped tombstone's offset, holding state from before it, would miss that
  delete: it gets ``CompactionReset`` (a ``PositionTrimmed``: restart from the earliest offset),
  never a silently stale key. A reader from offset 0 holds nothing and is always served.
* Keyless records have no place in a key map: Pulsar's compactor drops them and Kafka refuses them
  on a compacted topic. The fold drops and counts them (the partition refuses them on append).
* Producer dedup state and transactional-id epochs live in the txn buffer's snapshots, not in the
  compacted data, so fencing and dedup survive compaction untouched.

Memory: the fold holds one record per live key (the key map); ``Compactor`` refuses more than
``max_keys`` distinct keys, so a compaction is bounded, not a surprise out-of-memory.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from raytxn import testing_bugs
from raytxn.errors import CompactionReset, CorruptLedger, InvalidArgument
from raytxn.ids import EARLIEST, Position
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_header, encode_message
from raytxn.protocol.txn_buffer import AbortedTxn, HiddenSpans

DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000  # Kafka's delete.retention.ms default
DEFAULT_MAX_KEYS = 10_000_000
COMPACTED_PRODUCER = "(compacted)"  # the producer a compacted read's entry headers name


class KeptRecord(msgspec.Struct, frozen=True, array_like=True):
    """The latest committed record of one key at or below a horizon, as the compacted ledger
    holds it: its original ``offset`` and entry ``position``, ``value`` None for a tombstone, and
    for a tombstone ``tombstone_since_ms``, when the first compaction that kept it ran."""

    offset: int
    position: Position
    key: str
    value: bytes | None
    publish_time_ms: int
    tombstone_since_ms: int | None = None
    # Its index in its entry and the entry's message count: a ``read_compacted`` subscription
    # acks by (position, index, count), as it would the live message. -1 and 0 in records folded
    # before they were kept (``compacted_entries`` then numbers an entry's kept records itself).
    batch_index: int = -1
    batch_size: int = 0

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


class CompactedRun(msgspec.Struct, frozen=True, array_like=True):
    """Kept records in offset order, as a Kafka fetch below a compacted topic's live ledger
    serves them: one record batch whose offset deltas leave gaps where older values were (legal
    in Kafka, whose own compaction leaves them). A tombstone's value is empty, as the gateway
    stores a null one."""

    offsets: list[int]
    keys: list[bytes]
    values: list[bytes]
    times_ms: list[int]


def kafka_runs(kept: Sequence[KeptRecord], kept_offsets: Sequence[int], offset: int, below: int,
               run_records: int, max_records: int) -> list[CompactedRun]:
    """The kept records at offsets ``offset`` to ``below - 1`` (``kept_offsets``: their offsets,
    ascending), at most ``max_records``, in runs of at most ``run_records``."""
    assert run_records >= 1 and max_records >= 1
    first = bisect.bisect_left(kept_offsets, offset)
    last = min(bisect.bisect_left(kept_offsets, below), first + max_records)
    runs = []
    for start in range(first, last, run_records):
        chunk = kept[start:min(start + run_records, last)]
        runs.append(CompactedRun([r.offset for r in chunk], [r.key.encode() for r in chunk],
                                 [r.value or b"" for r in chunk], [r.publish_time_ms for r in chunk]))
    return runs


class CompactedEntry(msgspec.Struct, frozen=True, array_like=True):
    """The kept records of one original entry, as a ``read_compacted`` subscription reads them:
    at the entry's ``position``, with its message ``count`` and the ``indexes`` of the records
    kept (ascending); every other index of the entry was folded away, so the subscription takes
    it as consumed."""

    position: Position
    count: int
    indexes: list[int]
    records: list[KeptRecord]


def compacted_entries(kept: Sequence[KeptRecord], start: Position, max_entries: int) -> list[CompactedEntry]:
    """The kept records (``kept``: one generation's, in offset order, which is position order) at
    or after ``start``, grouped by entry, at most ``max_entries`` entries."""
    assert max_entries >= 1
    first = bisect.bisect_left(kept, start, key=lambda r: r.position)
    entries: list[CompactedEntry] = []
    i = first
    while i < len(kept) and len(entries) < max_entries:
        position = kept[i].position
        j = i
        while j < len(kept) and kept[j].position == position:
            j += 1
        group = list(kept[i:j])
        if all(r.batch_index >= 0 and r.batch_size > r.batch_index for r in group):
            entries.append(CompactedEntry(position, group[0].batch_size, [r.batch_index for r in group], group))
        else:  # folded before records kept their index: the kept ones are the entry
            entries.append(CompactedEntry(position, len(group), list(range(len(group))), group))
        i = j
    return entries


def compacted_entry_records(entry: CompactedEntry) -> list[bytes]:
    """``entry`` as a partition read sends it: a DATA header of the kept messages, then those
    (the read's ``kept`` says the entry's count and where each one was in it). A tombstone is an
    empty value; properties are not kept by a compaction."""
    first, kept = entry.records[0], len(entry.records)
    header = EntryHeader("data", None, COMPACTED_PRODUCER, 0, kept - 1, kept, first.publish_time_ms,
                         base_offset=first.offset)
    return [encode_header(header), *(encode_message(MessageRecord(r.value or b"", r.key)) for r in entry.records)]


class CompactionHorizon(msgspec.Struct, frozen=True):
    """What a compaction publishes, with one conditional write: compacted ledger ``generation``
    covers every entry at or before ``horizon``; ``next_offset`` is the first offset after it
    (where a reader switches to the live ledger); ``dropped_tombstones_through``: the highest offset
    of a tombstone any compaction dropped (-1: none), below which resuming readers are reset."""

    generation: int
    horizon: Position
    next_offset: int
    records: int
    tombstones: int
    dropped_tombstones_through: int = -1
    # (v0.1.0 also wrote ``format_version: 1`` here, which decoding ignores: the horizon object's
    # frame says its format, as every stored object's does: ``raytxn.ledger.formats``.)


class CompactionResult(msgspec.Struct, frozen=True):
    """A finished fold: the horizon to publish and the records of its compacted ledger, in
    offset order (one per key), with what the fold left out and why."""

    horizon: CompactionHorizon
    records: list[KeptRecord]
    skipped_aborted: int
    skipped_keyless: int
    dropped_tombstones: int
    # False: the fold changed nothing of the published generation (no entry past its horizon up
    # to max_read_position, no tombstone expired), so there is nothing to publish, and
    # ``horizon`` is the published one.
    publishes: bool = True


def is_tombstone_value(value: bytes | None) -> bool:
    return value is None or len(value) == 0


class Compactor:
    """Phase one of a compaction: the fold of ``previous`` (the published horizon, None for the
    first compaction) and its ``kept`` records with the entries after its horizon, given in ledger
    order through ``add`` (every entry, markers too, up to the new horizon). ``max_read_position``
    and ``aborted`` (the txn buffer's ``aborted_between`` the previous horizon and the head) are
    read from the partition when the compaction starts."""

    def __init__(self, previous: CompactionHorizon | None, kept: Iterable[KeptRecord], *,
                 max_read_position: Position, aborted: Sequence[AbortedTxn],
                 max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if previous is not None and previous.horizon > max_read_position:
            raise CorruptLedger(f"published horizon {previous.horizon} is past max_read_position "
                                f"{max_read_position}")
        self.previous = previous
        self.max_read_position = max_read_position
        self.max_keys = max_keys
        self._hidden = HiddenSpans(aborted)
        self._latest: dict[str, KeptRecord] = {}
        for record in kept:
            if record.key in self._latest:
                raise CorruptLedger(f"compacted ledger holds key {record.key!r} twice")
            self._latest[record.key] = record
        self._last_position = EARLIEST if previous is None else previous.horizon
        self._next_offset = 0 if previous is None else previous.next_offset
        self.skipped_aborted = 0
        self.skipped_keyless = 0

    def add(self, header: EntryHeader, position: Position, messages: Sequence[MessageRecord]) -> None:
        """Fold the entry at ``position`` (the next one in ledger order). A marker only moves the
        offsets on; an aborted entry and keyless records are skipped."""
        if position <= self._last_position:
            raise CorruptLedger(f"compaction read {position} after {self._last_position}: out of ledger order")
        if position > self.max_read_position:
            raise InvalidArgument(f"compaction past max_read_position {self.max_read_position}: {position} "
                                  "may hold data of an open transaction")
        if header.base_offset is None or header.base_offset < self._next_offset:
            raise CorruptLedger(f"entry {position} has base offset {header.base_offset}, expected at least "
                                f"{self._next_offset}")
        if header.is_marker:
            self._last_position, self._next_offset = position, header.base_offset + 1
            return
        if len(messages) != header.count:
            raise CorruptLedger(f"entry {position} says {header.count} messages, read {len(messages)}")
        aborted = self._hidden.hides(header.txn, position) and not testing_bugs.REINTRODUCED["compaction_keeps_aborted"]
        kept = [] if aborted else [
            KeptRecord(header.base_offset + index, position, message.key,
                       None if is_tombstone_value(message.value) else message.value, header.publish_time_ms,
                       batch_index=index, batch_size=header.count)
            for index, message in enumerate(messages) if message.key is not None]
        new_keys = {record.key for record in kept} - self._latest.keys()
        if len(self._latest) + len(new_keys) > self.max_keys:
            raise InvalidArgument(f"compaction would hold more than {self.max_keys} keys (max_keys): raise "
                                  "it, or partition the topic further")
        # checked: from here on nothing fails, so a refused entry changed nothing
        self._last_position, self._next_offset = position, header.base_offset + header.count
        if aborted:
            self.skipped_aborted += header.count
            return
        self.skipped_keyless += header.count - len(kept)
        for record in kept:
            self._latest[record.key] = record

    def finish(self, now_ms: int, delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS) -> CompactionResult:
        """Phase two's input: the records to write (tombstones stamped or dropped) and the
        horizon to publish once they are durable: the last entry added (the previous horizon
        when none was, so a compaction that only expires tombstones is one too). Nothing to
        publish (``publishes`` False) when nothing changed: a partition whose data past its
        horizon is all in an open transaction would otherwise publish an empty generation at
        every check."""
        if delete_retention_ms < 0:
            raise InvalidArgument(f"delete_retention_ms must be >= 0, got {delete_retention_ms}")
        records, dropped = [], 0
        dropped_through = -1 if self.previous is None else self.previous.dropped_tombstones_through
        for record in self._latest.values():
            if record.is_tombstone:
                since = now_ms if record.tombstone_since_ms is None else record.tombstone_since_ms
                if now_ms - since >= delete_retention_ms:
                    dropped += 1
                    dropped_through = max(dropped_through, record.offset)
                    continue
                record = msgspec.structs.replace(record, tombstone_since_ms=since)
            records.append(record)
        records.sort(key=lambda r: r.offset)
        if self.previous is not None and self._last_position == self.previous.horizon and dropped == 0:
            return CompactionResult(self.previous, records, self.skipped_aborted, self.skipped_keyless, 0,
                                    publishes=False)
        generation = 1 if self.previous is None else self.previous.generation + 1
        horizon = CompactionHorizon(generation, self._last_position, self._next_offset, len(records),
                                    sum(1 for r in records if r.is_tombstone), dropped_through)
        return CompactionResult(horizon, records, self.skipped_aborted, self.skipped_keyless, dropped)


def check_publish(current: CompactionHorizon | None, candidate: CompactionHorizon) -> None:
    """The conditional write's rule: the candidate is the next generation after the published
    one and moves nothing backwards. Else ``InvalidArgument`` (a compactor raced another, or
    started from a stale horizon), and the published one stays."""
    expected = 1 if current is None else current.generation + 1
    if candidate.generation != expected:
        raise InvalidArgument(f"compaction generation {candidate.generation} published where {expected} "
                              "was due: another compaction published first")
    if current is not None and (candidate.horizon < current.horizon or candidate.next_offset < current.next_offset
                                or candidate.dropped_tombstones_through < current.dropped_tombstones_through):
        raise InvalidArgument(f"compaction horizon {candidate.horizon} would move back from {current.horizon}")


def collectable(published: CompactionHorizon | None, published_path: str,
                data: Mapping[int, Sequence[str]]) -> list[str]:
    """The data objects (``data``: by generation) a compactor may delete after publishing
    ``published`` (its object ``published_path``): every one of an older generation, and of the
    published generation every other one (a racing compactor's that lost the publish, or one that
    crashed before it). Never one of a newer generation: that is a compaction in flight, which
    read ``published`` and will publish (or lose) the next generation with it."""
    current = 0 if published is None else published.generation
    return sorted(path for generation, paths in data.items() if generation <= current
                  for path in paths if generation < current or path != published_path)


class ReadPlan(msgspec.Struct, frozen=True):
    """Where a compacted read from ``from_offset`` goes: compacted records with an offset at or
    after it, from index ``compacted_from`` of the compacted ledger, then the live ledger from
    ``live_from_offset`` on."""

    compacted_from: int
    live_from_offset: int


def read_plan(published: CompactionHorizon | None, records: Sequence[KeptRecord], from_offset: int) -> ReadPlan:
    """The plan of a ``read_compacted`` reader resuming at ``from_offset`` (``records``: the
    published generation's, in offset order). ``CompactionReset`` when a tombstone it had not
    seen yet was dropped (see the module docstring); a reader from offset 0 holds no state."""
    if from_offset < 0:
        raise InvalidArgument(f"offset must be >= 0, got {from_offset}")
    if published is None:
        return ReadPlan(0, from_offset)
    if 0 < from_offset <= published.dropped_tombstones_through:
        raise CompactionReset(f"offset {from_offset}: compaction dropped tombstones up to offset "
                              f"{published.dropped_tombstones_through} after their delete retention; "
                              "read again from the earliest offset")
    if from_offset >= published.next_offset:
        return ReadPlan(len(records), from_offset)
    return ReadPlan(bisect.bisect_left(records, from_offset, key=lambda r: r.offset), published.next_offset)
