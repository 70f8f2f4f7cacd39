"""Quickstart (for now: the durable ledger round trip the rest of raytxn is built on).

On the embedded default storage (file://./.raytxn-data) it appends entries with group commit,
restarts the writer (the new incarnation seals the old ledger and fences the old writer), reads
everything back in order, trims, and shows that a flipped byte is reported, never skipped.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from runtime.errors import CorruptLedger, Fenced
from runtime.ids import Position
from runtime.ledger import ManagedLedger, chunk_path
from runtime.storage import DEFAULT_URL, Storage


async def main() -> None:
    storage = Storage.from_url(DEFAULT_URL)
    stream = f"quickstart/{uuid.uuid4().hex[:8]}"
    print(f"storage {DEFAULT_URL}, stream {stream}")

    writer = await ManagedLedger.open(storage, stream)
    t0 = time.perf_counter()
    positions = await asyncio.gather(*[writer.append([f"order-{i}".encode()]) for i in range(1000)])
    elapsed = time.perf_counter() - t0
    objects = await storage.list(f"streams/{stream}/ledgers")
    print(f"appended 1000 entries in {elapsed * 1000:.0f} ms, {len(objects)} object puts (group commit), "
          f"last position {positions[-1]}")

    successor = await ManagedLedger.open(Storage.from_url(DEFAULT_URL), stream)
    print(f"restarted: incarnation {successor.incarnation}, ledgers "
          f"{[(i.ledger_id, 'closed' if i.closed else 'open', i.last_entry_id) for i in successor.ledgers]}")
    try:
        await writer.append([b"written by the old incarnation"])
    except Fenced as e:
        print(f"old writer fenced: {type(e).__name__}")
    await successor.append([b"after restart"])

    entries = await successor.read(Position(0, 0), max_entries=2000)
    values = [r for e in entries for r in e.records]
    assert values == [f"order-{i}".encode() for i in range(1000)] + [b"after restart"], "round trip failed"
    print(f"read back {len(values)} records in order: {values[0]!r} ... {values[-1]!r}")

    await successor.trim(Position(successor.current_ledger_id, 0))
    print(f"trimmed below {successor.trimmed_below}: ledgers now {[i.ledger_id for i in successor.ledgers]}")

    victim = chunk_path(stream, successor.current_ledger_id, 0)
    data = bytearray(await storage.get(victim))
    data[-1] ^= 0xFF
    await storage.delete([victim])
    await storage.create(victim, bytes(data))
    reader = await ManagedLedger.open(Storage.from_url(DEFAULT_URL), stream, writable=False)
    try:
        await reader.read(Position(successor.current_ledger_id, 0))
    except CorruptLedger as e:
        print(f"flipped one byte: {type(e).__name__}: {e}")
    print("ok")


if __name__ == "__main__":
    asyncio.run(main())
