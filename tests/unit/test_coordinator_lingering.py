"""The coordinator's lingering last records (lingering entries of its log, see the coordinator's
docstring) in the real coordinator class, in this process on memory storage: what they share a put
with, and what a refused record beside them changes (nothing)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from raytxn.actors.coordinator import TransactionCoordinator, log_stream
from raytxn.config import CoordinatorConfig
from raytxn.errors import MessageTooLarge
from raytxn.ids import Position, TxnID
from raytxn.ledger import ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.txnlog import EndAction, decode_record

LONG_LINGER = CoordinatorConfig(complete_linger_ms=60_000)  # only company or a reader puts them here


def memory_url() -> str:
    return f"memory://lingering-{uuid.uuid4().hex}"


async def logged_puts(url: str) -> list[list[list[str]]]:
    """Coordinator 0's log, put by put: each put's entries, each as the kinds of its records
    (``UpdateState:COMMITTED``)."""
    ledger = await ManagedLedger.open(Storage.from_url(url), log_stream(0), writable=False)
    entries = {entry.position: [decode_record(raw, "test") for raw in entry.records]
               for entry in await ledger.read(max(Position(0, 0), ledger.trimmed_below), max_entries=1000)}
    kinds = {position: [type(r).__name__ + (f":{r.new_state}" if hasattr(r, "new_state") else "") for r in records]
             for position, records in entries.items()}
    # (The last object's end is unknown to a reader while the writer has the ledger open.)
    return [[kinds[position] for position in sorted(kinds) if chunk.start <= position < chunk.end]
            for chunk in await ledger.stored_objects() if chunk.start in kinds]


async def one_committed(url: str) -> tuple[TransactionCoordinator, TxnID]:
    """A coordinator that committed one txn, whose COMMITTED record now lingers."""
    tc = TransactionCoordinator(0, url, config=LONG_LINGER)
    ended = await tc.new_txn(60_000, "alice")
    assert await tc.end_txn(ended, EndAction.COMMIT, "alice") == "COMMITTED"
    await asyncio.sleep(0.05)
    assert tc._ledger is not None and tc._ledger.lingering_entries == 1  # it waits for company
    return tc, ended


def test_a_commit_is_answered_before_its_last_record_is_prepared() -> None:
    """The end's driver lets the answer go before it prepares and queues COMMITTED: that work is
    not on the caller's path. (Done the other way round, the record lingers by the answer.)"""

    async def main() -> None:
        tc = TransactionCoordinator(0, memory_url(), config=LONG_LINGER)
        txn = await tc.new_txn(60_000, "alice")
        assert await tc.end_txn(txn, EndAction.COMMIT, "alice") == "COMMITTED"
        assert tc._ledger is not None and tc._ledger.lingering_entries == 0  # not queued yet
        await asyncio.sleep(0.01)
        assert tc._ledger.lingering_entries == 1
        assert (await tc.get_txn(txn))["state"] == "COMMITTED"

    asyncio.run(main())


def test_a_last_record_shares_the_next_entrys_put_and_a_reader_flushes_it() -> None:
    async def main() -> None:
        url = memory_url()
        tc, _ended = await one_committed(url)
        await tc.new_txn(60_000, "bob")
        assert (await logged_puts(url))[-1] == [["UpdateState:COMMITTED"], ["NewTxn"]]
        aborted = await tc.new_txn(60_000, "carol")
        assert await tc.end_txn(aborted, EndAction.ABORT, "carol") == "ABORTED"
        assert (await tc.get_txn(aborted))["state"] == "ABORTED"  # logged for the reader, not after 60 s
        assert (await logged_puts(url))[-1] == [["UpdateState:ABORTED"]]

    asyncio.run(main())


def test_a_record_refused_beside_a_lingering_one_changes_nothing() -> None:
    """A caller's record too large for the log is refused before it is queued: the lingering
    record is still logged, the coordinator still compacts (nothing counts as unapplied), and a
    fresh incarnation replays what was logged."""

    async def main() -> None:
        url = memory_url()
        tc, ended = await one_committed(url)
        assert tc._ledger is not None
        tc._ledger.config.max_entry_bytes = 2000
        with pytest.raises(MessageTooLarge):
            await tc.new_txn(60_000, "o" * 2000)
        assert tc._ledger.lingering_entries == 1
        await asyncio.wait_for(tc.compact(), 5.0)
        assert (await tc.get_txn(ended))["state"] == "COMMITTED"
        fresh = TransactionCoordinator(0, url, config=LONG_LINGER)
        assert (await fresh.get_txn(ended))["state"] == "COMMITTED"
        assert (await fresh.list_txns()) == []

    asyncio.run(main())
