"""The coordinator's lingering last records (actors/lingering.py) in the real coordinator class,
in this process on memory storage: what they share an entry with, and what happens when they do
not fit in it."""

from __future__ import annotations

import asyncio
import uuid

from raytxn.actors.coordinator import TransactionCoordinator, log_stream
from raytxn.config import CoordinatorConfig
from raytxn.ids import Position, TxnID
from raytxn.ledger import ManagedLedger
from raytxn.ledger.framing import encode_records
from raytxn.ledger.storage import Storage
from raytxn.protocol.txnlog import EndAction, NewTxn, decode_record, encode_record

LONG_LINGER = CoordinatorConfig(complete_linger_ms=60_000)  # only a carrier or a reader logs them here


def memory_url() -> str:
    return f"memory://lingering-{uuid.uuid4().hex}"


async def logged_entries(url: str) -> list[list[str]]:
    """Every entry of coordinator 0's log, as the kinds of its records (``update_state:COMMITTED``)."""
    ledger = await ManagedLedger.open(Storage.from_url(url), log_stream(0), writable=False)
    entries = await ledger.read(max(Position(0, 0), ledger.trimmed_below), max_entries=1000)
    kinds = []
    for entry in entries:
        records = [decode_record(raw, "test") for raw in entry.records]
        kinds.append([type(r).__name__ + (f":{r.new_state}" if hasattr(r, "new_state") else "") for r in records])
    return kinds


async def one_committed(url: str) -> tuple[TransactionCoordinator, TxnID]:
    """A coordinator that committed one txn, whose COMMITTED record now lingers."""
    tc = TransactionCoordinator(0, url, config=LONG_LINGER)
    ended = await tc.new_txn(60_000, "alice")
    assert await tc.end_txn(ended, EndAction.COMMIT, "alice") == "COMMITTED"
    await asyncio.sleep(0.05)
    assert tc._lingering is not None and len(tc._lingering) == 1  # it waits for the next entry
    return tc, ended


def test_a_last_record_goes_into_the_next_entry_and_a_reader_flushes_it() -> None:
    async def main() -> None:
        url = memory_url()
        tc, _ended = await one_committed(url)
        await tc.new_txn(60_000, "bob")
        assert (await logged_entries(url))[-1] == ["UpdateState:COMMITTED", "NewTxn"]
        aborted = await tc.new_txn(60_000, "carol")
        assert await tc.end_txn(aborted, EndAction.ABORT, "carol") == "ABORTED"
        assert (await tc.get_txn(aborted))["state"] == "ABORTED"  # logged for the reader, not after 60 s
        assert (await logged_entries(url))[-1] == ["UpdateState:ABORTED"]

    asyncio.run(main())


def test_a_record_too_large_with_the_lingering_ones_is_logged_without_them() -> None:
    """The lingering records must not make a caller's record too large: it goes alone, and they in
    an entry of their own; a fresh incarnation replays both."""

    async def main() -> None:
        url = memory_url()
        tc, ended = await one_committed(url)
        owner = "o" * 2000
        alone = NewTxn(TxnID(0, 3), owner, 60_000, tc.clock.now_ms())  # the record new_txn logs, as large
        assert tc._ledger is not None
        tc._ledger.config.max_entry_bytes = len(encode_records([encode_record(alone)])) + 8  # the rider does not fit
        txn = await tc.new_txn(60_000, owner)
        assert (await tc.get_txn(ended))["state"] == "COMMITTED"
        assert (await logged_entries(url))[-2:] == [["NewTxn"], ["UpdateState:COMMITTED"]]
        fresh = TransactionCoordinator(0, url, config=LONG_LINGER)
        assert (await fresh.get_txn(ended))["state"] == "COMMITTED"
        assert (await fresh.get_txn(txn))["state"] == "OPEN"

    asyncio.run(main())
