"""Compacted ledgers in storage: the I/O of ``raytxn.protocol.compaction``.

Layout, beside a partition stream's own objects (``streams/<stream>/``):

* ``compacted/data/<generation>-<nonce>``: the records a compaction kept, in offset order, in
  frames of ``RECORDS_PER_FRAME`` (each CRC-checked). Written once, with a conditional create.
* ``compacted/horizons/<generation>``: the ``CompactionHorizon`` of that generation and the data
  object it names. **Its conditional create is the publish**: of two compactors racing for one
  generation, one creates it, the other gets ``Fenced`` and its data object is an orphan.

The published state is the newest horizon object. A crash at any step of ``compact_partition``
leaves either the previous generation published, with at most an orphaned data object (deleted
by the compaction that next publishes its generation, ``collectable``), or the new one published. Superseded
generations' objects are deleted after the publish; a reader that listed the old horizon and
finds its data gone reads the published one again (``read_compacted``).

Reading a partition's entries here is read-only and straight from the ledger objects, as the bulk
path reads them (``ledger.ranges``): the caller passes the partition's ``max_read_position`` and
its aborted spans (a ``RangePlan``), which bound and filter what is folded.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import msgspec

from raytxn import testing_bugs
from raytxn.errors import CorruptLedger, Fenced, PositionTrimmed
from raytxn.faults import FaultPoints
from raytxn.ids import EARLIEST, Position, partition_stream
from raytxn.ledger.framing import FrameKind, decode_frames, encode_frame
from raytxn.ledger.managed import READER_CONFIG, ManagedLedger
from raytxn.ledger.metadata import raise_if_trimmed
from raytxn.ledger.storage import ObjectExists, Storage
from raytxn.protocol.compaction import (
    DEFAULT_DELETE_RETENTION_MS,
    DEFAULT_MAX_KEYS,
    CompactionHorizon,
    CompactionResult,
    Compactor,
    KeptRecord,
    collectable,
    read_plan,
)
from raytxn.protocol.cursor import next_position
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, decode_entry
from raytxn.protocol.txn_buffer import AbortedTxn, HiddenSpans

RECORDS_PER_FRAME = 10_000
READ_ATTEMPTS = 3  # a compacted read's, while newer generations keep superseding what it read
ENTRIES_PER_READ = 1000
# Records decoded (and folded) between two turns of the event loop: a partition compacting
# itself runs the fold in its own process, and its appends and reads wait for each turn. A read
# of ENTRIES_PER_READ batch entries can hold a million records, all decoded between two awaits.
YIELD_EVERY_RECORDS = 2000
_encoder = msgspec.msgpack.Encoder()
_records_decoder = msgspec.msgpack.Decoder(list[KeptRecord])


class PublishedHorizon(msgspec.Struct, frozen=True):
    """A horizon object's content: the horizon and the data object holding its records."""

    horizon: CompactionHorizon
    data_path: str


def _random_nonce() -> str:
    return secrets.token_hex(6)


# Names a compaction's data object apart from those of racing compactions of the same generation.
# A seam: the simulator numbers them instead (raytxn.sim.compacted), so a seed replays byte for byte.
data_nonce: Callable[[], str] = _random_nonce


def compacted_prefix(stream: str) -> str:
    return f"streams/{stream}/compacted"


def _horizon_path(stream: str, generation: int) -> str:
    return f"{compacted_prefix(stream)}/horizons/{generation:020d}"


def _generation_of(path: str) -> int:
    return int(path.rsplit("/", 1)[1].split("-", 1)[0])


async def newest_generation(storage: Storage, stream: str) -> int | None:
    """The generation of the newest published horizon of ``stream``, from one listing (None:
    never compacted)."""
    paths = await storage.list(f"{compacted_prefix(stream)}/horizons")
    return _generation_of(paths[-1]) if paths else None


async def read_published(storage: Storage, stream: str) -> PublishedHorizon | None:
    """The newest published horizon of ``stream`` (None: never compacted)."""
    for _ in range(READ_ATTEMPTS):
        paths = await storage.list(f"{compacted_prefix(stream)}/horizons")
        if not paths:
            return None
        data = await storage.get(paths[-1])
        if data is not None:
            return decode_published(data, paths[-1])
        # Gone since the listing: a newer generation's compaction deleted it (it deletes the older
        # horizons once it published), unless no newer one is listed now.
        newest = await storage.list(f"{compacted_prefix(stream)}/horizons")
        if not newest or _generation_of(newest[-1]) <= _generation_of(paths[-1]):
            break
    raise CorruptLedger(f"compaction horizon {paths[-1]} vanished after its listing", paths[-1])


def decode_published(data: bytes, path: str) -> PublishedHorizon:
    """The horizon object at ``path`` holding ``data``."""
    frames = decode_frames(data, path)
    if len(frames) != 1 or frames[0][0] != FrameKind.HORIZON:
        raise CorruptLedger(f"not a compaction horizon: {path}", path)
    try:
        published = msgspec.msgpack.decode(frames[0][2], type=PublishedHorizon)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise CorruptLedger(f"undecodable compaction horizon {path}: {e}", path) from e
    if published.horizon.generation != _generation_of(path):
        raise CorruptLedger(f"compaction horizon {path} claims generation {published.horizon.generation}", path)
    return published


async def read_kept(storage: Storage, published: PublishedHorizon | None) -> list[KeptRecord]:
    """The records of a published generation, in offset order."""
    if published is None:
        return []
    data = await storage.get(published.data_path)
    if data is None:
        raise CorruptLedger(f"compacted ledger {published.data_path} is missing", published.data_path)
    return decode_kept(data, published)


def decode_kept(data: bytes, published: PublishedHorizon) -> list[KeptRecord]:
    """The records of ``published``'s data object, which holds ``data``."""
    records: list[KeptRecord] = []
    for kind, _, payload in decode_frames(data, published.data_path):
        if kind != FrameKind.COMPACTED:
            raise CorruptLedger(f"not a compacted ledger: {published.data_path}", published.data_path)
        try:
            records.extend(_records_decoder.decode(payload))
        except msgspec.DecodeError as e:
            raise CorruptLedger(f"undecodable compacted ledger {published.data_path}: {e}",
                                published.data_path) from e
    if len(records) != published.horizon.records:
        raise CorruptLedger(f"compacted ledger {published.data_path} holds {len(records)} records, its horizon "
                            f"says {published.horizon.records}", published.data_path)
    return records


async def iter_entries(storage: Storage, stream: str, start: Position,
                       end: Position) -> AsyncGenerator[tuple[EntryHeader, Position, list[MessageRecord]], None]:
    """Every entry of ``stream`` in ``start..end`` (markers too), decoded, in ledger order.
    ``PositionTrimmed`` when retention trimmed what it reads, also while it reads (an object
    listed, then deleted before its get)."""
    if end < start:
        return
    ledger = await ManagedLedger.open(storage, stream, READER_CONFIG, writable=False)
    position = start
    since_yield = 0
    while True:
        try:
            entries = await ledger.read(position, max_entries=ENTRIES_PER_READ, end=end)
        except CorruptLedger:
            await raise_if_trimmed(storage, stream, position)  # a trim overtook this read: not corruption
            raise
        if not entries:
            return
        for entry in entries:
            header, messages = decode_entry(entry.records, f"{stream}@{entry.position}")
            yield header, entry.position, messages
            since_yield += len(messages) + 1
            if since_yield >= YIELD_EVERY_RECORDS:  # a compaction in a partition's process shares its loop
                since_yield = 0
                await asyncio.sleep(0)
        if entries[-1].position >= end:
            return
        position = next_position(entries[-1].position)


def _start_after(horizon: Position | None) -> Position:
    return Position(0, 0) if horizon is None else next_position(horizon)


async def compact_partition(storage: Storage, topic: str, partition: int, max_read_position: Position,
                            aborted: Sequence[AbortedTxn], now_ms: int, *,
                            delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS, max_keys: int = DEFAULT_MAX_KEYS,
                            faults: FaultPoints | None = None) -> CompactionResult:
    """One compaction of ``topic``/``partition`` up to ``max_read_position`` (the partition's,
    read just before with its ``aborted`` spans): fold, write the data object, publish the
    horizon, then delete what it superseded and orphans of crashed compactions. ``Fenced`` if
    another compaction published this generation first, or a newer one while this one read
    (whose compaction deleted the records this one started from, or whose retention trimmed
    what it was reading), or one past ``max_read_position`` (read before that publish): nothing
    of this one is then visible.
    When the fold changed nothing (``CompactionResult.publishes``), nothing is written, and the
    published generation's leftovers are cleaned up."""
    faults = faults or FaultPoints()
    stream = partition_stream(topic, partition)
    published = await read_published(storage, stream)
    if published is not None and published.horizon.horizon > max_read_position:
        # The partition's max_read_position was read before another compaction (its own, or one
        # from a newer plan) published past it: nothing this one could fold is new.
        raise Fenced(f"{stream}: another compaction published generation {published.horizon.generation} up to "
                     f"{published.horizon.horizon}, past this one's max_read_position {max_read_position}: this one "
                     "lost the race")
    try:
        kept = await read_kept(storage, published)
    except CorruptLedger as missing:  # its records deleted by the compaction that superseded it?
        await _raise_if_superseded(storage, stream, published, "it deleted the records this one started from",
                                   missing)
        raise
    compactor = Compactor(None if published is None else published.horizon, kept,
                          max_read_position=max_read_position, aborted=aborted, max_keys=max_keys)
    try:
        async for header, position, messages in iter_entries(
                storage, stream, _start_after(None if published is None else published.horizon.horizon),
                max_read_position):
            compactor.add(header, position, messages)
    except PositionTrimmed as trimmed:  # retention trims only below a published horizon: a newer one?
        await _raise_if_superseded(storage, stream, published, "retention trimmed below it while this one read",
                                   trimmed)
        raise
    result = compactor.finish(now_ms, delete_retention_ms)
    if not result.publishes:  # nothing new: the published generation stands; clean up after it
        assert published is not None
        await _delete_unreferenced(storage, stream, published.horizon, published.data_path)
        return result
    generation = result.horizon.generation
    data_path = f"{compacted_prefix(stream)}/data/{generation:020d}-{data_nonce()}"
    frames = [encode_frame(FrameKind.COMPACTED, i, _encoder.encode(result.records[start:start + RECORDS_PER_FRAME]),
                           version=storage.write_format)
              for i, start in enumerate(range(0, max(1, len(result.records)), RECORDS_PER_FRAME))]
    await faults.hit("compaction.before_data", generation=generation)
    await storage.create(data_path, b"".join(frames))
    await faults.hit("compaction.after_data", generation=generation)
    horizon = encode_frame(FrameKind.HORIZON, generation, _encoder.encode(PublishedHorizon(result.horizon, data_path)),
                           version=storage.write_format)
    try:
        await storage.create(_horizon_path(stream, generation), horizon)
    except ObjectExists as e:
        await storage.delete([data_path])
        raise Fenced(f"{stream}: compaction generation {generation} was published by another compaction") from e
    await faults.hit("compaction.after_publish", generation=generation)
    await _delete_unreferenced(storage, stream, result.horizon, data_path)
    return result


async def _raise_if_superseded(storage: Storage, stream: str, published: PublishedHorizon | None, what: str,
                                error: Exception) -> None:
    """``Fenced`` when a generation newer than ``published`` (the one a compaction started from)
    was published since: the compaction lost the race, and ``error`` (``what`` the newer one's
    compaction or the retention after it did under it) is no corruption."""
    newer = await read_published(storage, stream)
    if newer is not None and (published is None or newer.horizon.generation > published.horizon.generation):
        raise Fenced(f"{stream}: another compaction published generation {newer.horizon.generation} meanwhile "
                     f"({what}): this one lost the race") from error


async def _delete_unreferenced(storage: Storage, stream: str, published: CompactionHorizon, data_path: str) -> None:
    """After a publish: older horizons, and the data objects ``collectable`` names."""
    prefix = compacted_prefix(stream)
    doomed = [p for p in await storage.list(f"{prefix}/horizons") if _generation_of(p) < published.generation]
    data: dict[int, list[str]] = {}
    for path in await storage.list(f"{prefix}/data"):
        data.setdefault(_generation_of(path), []).append(path)
    doomed += collectable(published, data_path, data)
    if doomed:
        await storage.delete(doomed)


class CompactedRead(msgspec.Struct):
    """A compacted read: its records (``{"offset", "key", "value"}``, ``value`` None for a
    tombstone, in offset order) and the live entry to go on from (``read_live``)."""

    records: list[dict[str, Any]]
    next_position: Position
    next_offset: int  # the offset of the entry at next_position


async def read_live(storage: Storage, stream: str, start: Position, max_read_position: Position,
                    aborted: Sequence[AbortedTxn], from_offset: int = 0, start_offset: int = 0,
                    max_records: int | None = None) -> CompactedRead:
    """The visible keyed messages of ``stream``'s entries in ``start..max_read_position``
    (markers, aborted data and keyless messages skipped) at or after ``from_offset``;
    ``start_offset``: the offset of the entry at ``start``, if known. ``max_records``: stop after
    the entry that reaches it (a tailing reader's bound; ``next_position`` goes on from there)."""
    records: list[dict[str, Any]] = []
    hidden = HiddenSpans([] if testing_bugs.REINTRODUCED["table_view_reads_aborted"] else aborted)
    after, next_offset = start, start_offset
    entries = iter_entries(storage, stream, start, max_read_position)
    try:
        async for header, position, messages in entries:
            base = header.base_offset if header.base_offset is not None else -1
            after, next_offset = next_position(position), base + max(1, header.count)
            if header.is_marker or hidden.hides(header.txn, position):
                continue
            records.extend({"offset": base + i, "key": m.key, "value": m.value or None}
                           for i, m in enumerate(messages) if m.key is not None and base + i >= from_offset)
            if max_records is not None and len(records) >= max_records:
                break
    finally:
        await entries.aclose()
    return CompactedRead(records, after, next_offset)


async def read_compacted(storage: Storage, topic: str, partition: int, max_read_position: Position,
                         aborted: Sequence[AbortedTxn], from_offset: int = 0,
                         first_readable: Position = EARLIEST, max_live_records: int | None = None) -> CompactedRead:
    """What a ``read_compacted`` reader from ``from_offset`` reads up to ``max_read_position``:
    the published generation's records at or after it, then the live ledger's visible keyed
    messages after the horizon (from ``first_readable``, the trim point, when the partition was
    never compacted). ``CompactionReset`` below a dropped tombstone (``read_plan``)."""
    stream = partition_stream(topic, partition)
    # Again when a newer generation superseded the one read: between reading its horizon and its
    # data (which the newer one's compaction deleted), or its live tail (which retention trimmed).
    for _ in range(READ_ATTEMPTS):
        published = await read_published(storage, stream)
        try:
            kept = await read_kept(storage, published)
        except CorruptLedger:
            if published is None or published == await read_published(storage, stream):
                raise
            continue
        horizon = None if published is None else published.horizon
        plan = read_plan(horizon, kept, from_offset)
        compacted = [{"offset": r.offset, "key": r.key, "value": r.value} for r in kept[plan.compacted_from:]]
        start = max(first_readable, Position(0, 0)) if horizon is None else _start_after(horizon.horizon)
        try:
            live = await read_live(storage, stream, start, max_read_position, aborted, plan.live_from_offset,
                                   0 if horizon is None else horizon.next_offset, max_live_records)
        except PositionTrimmed:
            if published == await read_published(storage, stream):
                raise
            continue
        return CompactedRead(compacted + live.records, live.next_position, live.next_offset)
    raise CorruptLedger(f"{stream}: compaction generations kept changing under a reader")
