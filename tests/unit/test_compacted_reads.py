"""Compactions and compacted reads overtaken by another compaction (found by the simulator's
compaction profile, ``raytxn.sim.compaction``).

Retention trims a compacted partition's live ledger below its published horizon, and a reader
of the live ledger (``read_live``: a table view's tail, a compacted reader, a compaction's fold)
lists the ledger's objects before it gets them. A trim between the two deletes an object the
reader then misses: that is the trim overtaking the read (``PositionTrimmed``, on which a table
view reloads from the compacted view), not corruption. And when a newer generation was published
meanwhile (a trim never passes the horizon), a compaction lost the race (``Fenced``), and a
``read_compacted`` reads again from that generation. A newer generation also deletes the older
one's horizon object: a reader that listed it reads the newer one. A compaction from a plan
older than the published horizon lost the race, as does one whose starting
generation's records the compaction of a newer one deleted before it read them: both raised
``CorruptLedger`` to ``Client.compact``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest

from raytxn.errors import Fenced, PositionTrimmed
from raytxn.ids import Position, partition_stream
from raytxn.ledger.compacted import compact_partition, read_compacted, read_live, read_published
from raytxn.ledger.managed import ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_entry

ENTRIES = 6


async def _partition(storage: Storage) -> ManagedLedger:
    """A partition's ledger of ``ENTRIES`` entries, one object each: ``k<n % 3>`` = ``v<n>``."""
    ledger = await ManagedLedger.open(storage, partition_stream("t", 0))
    for n in range(ENTRIES):
        entry = ledger.enqueue(encode_entry(EntryHeader("data", None, "p", n, n, 1, 0, base_offset=n),
                                            [MessageRecord(f"v{n}".encode(), f"k{n % 3}")]))
        await ledger.durable(entry)
    assert len(await ledger.stored_objects()) == ENTRIES
    return ledger


def _before_first_entry_read(storage: Storage, hook: Callable[[], Awaitable[None]], objects: str = "/ledgers/") -> None:
    """Run ``hook`` once, when a reader first gets a ledger object (after it listed them), or
    another object whose path holds ``objects``."""
    get = storage.get
    armed = True

    async def hooked(path: str) -> bytes | None:
        nonlocal armed
        if armed and objects in path:
            armed = False
            await hook()
        return await get(path)

    storage.get = hooked  # type: ignore[method-assign]


def _run(test: Callable[[Storage], Awaitable[None]]) -> None:
    asyncio.run(test(Storage.from_url(f"memory://compacted-reads-{uuid.uuid4().hex}")))


def test_a_trim_overtaking_a_live_read_is_a_trim_not_corruption() -> None:
    async def test(storage: Storage) -> None:
        ledger = await _partition(storage)
        _before_first_entry_read(storage, lambda: ledger.trim(Position(0, 4)))
        with pytest.raises(PositionTrimmed, match="trimmed while reading"):
            await read_live(storage, partition_stream("t", 0), Position(0, 0), Position(0, ENTRIES - 1), [])

    _run(test)


def test_a_compaction_overtaken_by_a_newer_generation_and_its_trim_lost_the_race() -> None:
    async def test(storage: Storage) -> None:
        ledger = await _partition(storage)

        async def publish_and_trim() -> None:
            await compact_partition(storage, "t", 0, Position(0, ENTRIES - 1), [], 0)
            await ledger.trim(Position(0, ENTRIES))

        _before_first_entry_read(storage, publish_and_trim)
        with pytest.raises(Fenced, match="published generation 1"):
            await compact_partition(storage, "t", 0, Position(0, ENTRIES - 1), [], 0)

    _run(test)


def test_a_compaction_whose_generation_a_newer_one_deleted_under_it_lost_the_race() -> None:
    async def test(storage: Storage) -> None:
        await _partition(storage)
        await compact_partition(storage, "t", 0, Position(0, 2), [], 0)  # generation 1
        _before_first_entry_read(storage, lambda: compact_partition(storage, "t", 0, Position(0, 4), [], 0),
                                 objects="/compacted/data/")  # generation 2, which deletes 1's records
        with pytest.raises(Fenced, match="published generation 2"):
            await compact_partition(storage, "t", 0, Position(0, ENTRIES - 1), [], 0)

    _run(test)


def test_a_compaction_from_a_plan_older_than_the_published_horizon_lost_the_race() -> None:
    """Its partition's max_read_position, read before another compaction published a horizon past
    it (the partition's own, or one run from another plan)."""
    async def test(storage: Storage) -> None:
        await _partition(storage)
        await compact_partition(storage, "t", 0, Position(0, 4), [], 0)
        with pytest.raises(Fenced, match="past this one's max_read_position"):
            await compact_partition(storage, "t", 0, Position(0, 2), [], 0)

    _run(test)


def test_a_horizon_deleted_between_its_listing_and_its_read_is_a_newer_generation_to_read() -> None:
    async def test(storage: Storage) -> None:
        await _partition(storage)
        await compact_partition(storage, "t", 0, Position(0, 2), [], 0)  # generation 1
        _before_first_entry_read(storage, lambda: compact_partition(storage, "t", 0, Position(0, 4), [], 0),
                                 objects="/compacted/horizons/")  # generation 2, which deletes 1's horizon
        published = await read_published(storage, partition_stream("t", 0))
        assert published is not None and published.horizon.generation == 2

    _run(test)


def test_a_compacted_read_overtaken_by_a_newer_generation_and_its_trim_reads_again() -> None:
    async def test(storage: Storage) -> None:
        ledger = await _partition(storage)

        async def publish_and_trim() -> None:
            await compact_partition(storage, "t", 0, Position(0, 3), [], 0)
            await ledger.trim(Position(0, 4))

        _before_first_entry_read(storage, publish_and_trim)
        read = await read_compacted(storage, "t", 0, Position(0, ENTRIES - 1), [])
        latest = {record["key"]: record["value"] for record in read.records}
        assert latest == {"k0": b"v3", "k1": b"v4", "k2": b"v5"}
        assert read.next_position == Position(0, ENTRIES)

    _run(test)
