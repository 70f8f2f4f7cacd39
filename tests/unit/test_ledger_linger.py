"""Lingering entries of a managed ledger (``ManagedLedger.enqueue(..., linger_s=...)``), on memory
storage: each is an entry of its own, in queue order, but shares the put of the next ordinary
append, or goes alone once its linger passes, the queue is full, or someone flushes."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from raytxn.errors import Fenced
from raytxn.ids import Position
from raytxn.ledger import LedgerConfig, ManagedLedger
from raytxn.ledger.storage import Storage

LINGER_S = 0.05
LONG_S = 60.0  # a linger that never passes in a test: only company, a flush or the bound puts it


async def opened(config: LedgerConfig | None = None) -> ManagedLedger:
    return await ManagedLedger.open(Storage.from_url(f"memory://linger-{uuid.uuid4().hex}"), "t/linger", config)


async def puts(ml: ManagedLedger) -> list[list[bytes]]:
    """The records of each object written, one list per put (the entries' first records)."""
    entries = {e.position: e.records[0] for e in await ml.read(Position(0, 0), max_entries=10_000)}
    return [[entries[Position(c.start.ledger_id, i)] for i in range(c.start.entry_id, c.end.entry_id)]
            for c in await ml.stored_objects() if c.end > c.start]


def test_a_lingering_entry_shares_the_next_appends_put_as_an_entry_of_its_own() -> None:
    async def run() -> None:
        ml = await opened()
        applied: list[bytes] = []
        lingering = ml.enqueue([b"last"], on_durable=lambda _: applied.append(b"last"), linger_s=LINGER_S)
        await asyncio.sleep(LINGER_S / 5)
        assert not lingering.done() and ml.lingering_entries == 1 and await puts(ml) == []
        position = await ml.append([b"next"], on_durable=lambda _: applied.append(b"next"))
        assert await ml.durable(lingering) < position  # queue order is log order
        assert applied == [b"last", b"next"]
        await asyncio.sleep(LINGER_S * 3)
        assert await puts(ml) == [[b"last", b"next"]]  # one put; the linger's timer went with it
        assert ml.lingering_entries == 0

    asyncio.run(run())


def test_lingering_entries_go_alone_once_the_linger_passes_in_queue_order() -> None:
    async def run() -> None:
        ml = await opened()
        queued = [ml.enqueue([f"r{n}".encode()], linger_s=LINGER_S) for n in range(3)]
        await asyncio.sleep(LINGER_S * 4)
        assert all(future.done() for future in queued)
        assert await puts(ml) == [[b"r0", b"r1", b"r2"]]
        later = ml.enqueue([b"r3"], linger_s=LINGER_S)  # a fresh linger
        await asyncio.wait_for(ml.durable(later), 1.0)
        assert await puts(ml) == [[b"r0", b"r1", b"r2"], [b"r3"]]

    asyncio.run(run())


def test_flush_lingering_flush_and_close_put_them_now() -> None:
    async def run() -> None:
        ml = await opened()
        first = ml.enqueue([b"a"], linger_s=LONG_S)
        ml.flush_lingering()
        await asyncio.wait_for(ml.durable(first), 1.0)
        second = ml.enqueue([b"b"], linger_s=LONG_S)
        await asyncio.wait_for(ml.flush(), 1.0)
        assert second.done()
        third = ml.enqueue([b"c"], linger_s=LONG_S)
        await asyncio.wait_for(ml.close(), 1.0)
        assert third.done() and await puts(ml) == [[b"a"], [b"b"], [b"c"]]

    asyncio.run(run())


def test_the_lingering_queue_is_bounded_by_one_put() -> None:
    async def run() -> None:
        ml = await opened(LedgerConfig(max_batch_entries=10))
        queued = [ml.enqueue([f"r{n}".encode()], linger_s=LONG_S) for n in range(10)]
        await asyncio.wait_for(asyncio.gather(*queued), 1.0)
        assert [len(put) for put in await puts(ml)] == [10]
        assert ml.enqueue([b"more"], linger_s=LONG_S) is not None and ml.lingering_entries == 1

    asyncio.run(run())


def test_an_append_too_large_to_share_a_put_goes_after_the_lingering_ones() -> None:
    """The lingering entry must not make the next append's put too large: it goes alone first."""

    async def run() -> None:
        ml = await opened(LedgerConfig(max_batch_bytes=1000))
        lingering = ml.enqueue([b"last"], linger_s=LONG_S)
        big = b"x" * 995
        position = await asyncio.wait_for(ml.append([big]), 1.0)
        assert lingering.done() and lingering.result() < position
        assert await puts(ml) == [[b"last"], [big]]

    asyncio.run(run())


def test_a_fenced_writers_lingering_entry_fails_fenced_and_is_never_read() -> None:
    async def run() -> None:
        url = f"memory://linger-{uuid.uuid4().hex}"
        zombie = await ManagedLedger.open(Storage.from_url(url), "t/linger")
        await zombie.append([b"before"])
        lingering = zombie.enqueue([b"zombie"], linger_s=LINGER_S)
        successor = await ManagedLedger.open(Storage.from_url(url), "t/linger")
        with pytest.raises(Fenced):
            await asyncio.wait_for(zombie.durable(lingering), 1.0)
        with pytest.raises(Fenced):  # and the zombie takes nothing more
            zombie.enqueue([b"again"], linger_s=LINGER_S)
        assert zombie.lingering_entries == 0
        assert [e.records for e in await successor.read(Position(0, 0))] == [[b"before"]]

    asyncio.run(run())
