"""The evidence a failed chaos run carries (``raytxn.tools.chaos_evidence``): the client's events
and errors of the anomalous txns and messages, and the entry headers and snapshots of the ledgers
those messages are on, read from real file:// storage."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raytxn.client.message import MessageId
from raytxn.ids import TxnID
from raytxn.ledger.managed import ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_message, entry_records, marker_header
from raytxn.protocol.txnlog import EndAction
from raytxn.tools.chaos_evidence import client_story, partitions_of, stored_story
from raytxn.tools.checker import Anomaly
from raytxn.tools.history import History

TORN, OTHER = TxnID(1, 0), TxnID(0, 3)


def test_the_client_story_names_the_anomalous_txn_and_message_and_nothing_else() -> None:
    history = History()
    history.txn_begin(TORN, 0.1)
    history.txn_begin(OTHER, 0.1)
    history.send("a-in-6", "out-a", None, TORN, "w1-a", 0.2)
    history.send_ok("a-in-6", MessageId("out-a", 1, 1, 1, 0), 0.3)
    history.send("a-in-7", "out-a", None, OTHER, "w0-a", 0.2)
    history.send_ok("a-in-7", MessageId("out-a", 0, 1, 0, 0), 0.3)
    history.receive("w1", "chaos", "in", 2, MessageId("in", 2, 0, 5, 0), "in-6", 0, 0.15)
    history.ack("w1", "chaos", MessageId("in", 2, 0, 5, 0), TORN, 0.35)
    history.txn_abort(TORN, "aborted", 0.5)
    history.final_state("verify", "out-a", [(1, MessageId("out-a", 1, 1, 1, 0), "a-in-6")], t=1.0)
    torn = Anomaly("torn", "txn", "aborted, yet a-in-6 is there", msg_uid="a-in-6", txn=TORN)
    notes = [(0.4, "w1", TORN, "send or ack for in-6", "TransactionConflict('...')"),
             (0.4, "w0", OTHER, "commit", "Timeout('...')")]
    story = client_story(history, [torn], notes)
    assert any(line.startswith("Sent ") and "a-in-6" in line for line in story)
    assert any(line.startswith("TxnEnded ") and "aborted" in line for line in story)
    assert any("TransactionConflict" in line for line in story)
    assert not any("a-in-7" in line or "Timeout" in line for line in story)
    assert partitions_of(history, [torn]) == [("out-a", 1)]
    never = Anomaly("lost", "order in-6", "never committed", msg_uid="in-6")
    order_story = client_story(history, [never], notes)
    assert any(line.startswith("Acked ") for line in order_story)  # by the input's message id
    assert any(line.startswith("Sent ") and "a-in-6" in line for line in order_story)  # its txn's sends


def test_the_stored_story_lists_entry_headers_and_snapshots(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"

    async def write() -> None:
        storage = Storage.from_url(url)
        ledger = await ManagedLedger.open(storage, "topics/out-a/1")
        data = EntryHeader("data", TORN, "w1-a", 0, 0, 1, 1000)
        await ledger.append(entry_records(data, [encode_message(MessageRecord(b"a-in-6"))]))
        await ledger.append(entry_records(marker_header(EndAction.ABORT, TORN, 1001, -1), []))
        await ledger.close()
        await storage.create("topics/out-a/1/snapshots/00000000000000000001/000000-of-000001", b"damaged")

    asyncio.run(write())
    story = stored_story(url, None, "out-a", 1)
    assert story[0] == "ledger of out-a-1:"
    assert "  0:0 data txn(1,0) w1-a 0..0 lwm=None" in story
    assert "  0:1 abort txn(1,0)  -1..-1 lwm=-1" in story
    assert any(line.startswith("  snapshot 00000000000000000001: CorruptLedger") for line in story)
