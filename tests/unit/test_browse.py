"""The operator's view of a partition (``protocol.browse``): each message's transaction state in
the message browser, and a subscription's backlog in messages, markers and aborted messages not
counted. Driven on the pure transaction buffer, as the partition actor drives it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import InvalidArgument
from raytxn.ids import EARLIEST, Position, TxnID
from raytxn.protocol.browse import acked_by, browse_rows, count_backlog, value_preview
from raytxn.protocol.entry_format import decode_entry_header
from raytxn.protocol.offsets import entry_span
from raytxn.protocol.txnlog import EndAction
from tests.unit.test_txn_buffer import Partition

COMMIT, ABORT = EndAction.COMMIT, EndAction.ABORT
T1, T2, T3 = TxnID(0, 1), TxnID(0, 2), TxnID(1, 1)


def based(partition: Partition) -> list[tuple[int, Position, list[bytes]]]:
    """The ledger's entries with their Kafka base offsets (a message takes one, a marker one)."""
    out, base = [], 0
    for position, records in partition.ledger.entries:
        out.append((base, position, records))
        base += entry_span(decode_entry_header(records, str(position)))
    return out


def headed(partition: Partition) -> list[tuple[Position, object]]:
    return [(position, decode_entry_header(records, str(position))) for position, records in partition.ledger.entries]


def rows_of(partition: Partition, offset: int = 0, room: int = 100) -> list[tuple[int, str, str, str | None, bool]]:
    return [(r.offset, r.kind, r.state, r.txn, r.readable)
            for r in browse_rows(based(partition), offset, room, partition.buffer)]


def test_every_message_says_what_became_of_its_transaction() -> None:
    p = Partition()
    p.send("plain", 0)                      # offset 0
    p.send("a", 0, T1, count=2)             # 1, 2
    p.end(T1, COMMIT)                       # 3: marker
    p.send("b", 0, T2)                      # 4
    p.end(T2, ABORT)                        # 5: marker
    p.send("c", 0, T3)                      # 6: open
    p.send("plain", 1)                      # 7: plain, behind the open txn
    assert rows_of(p) == [
        (0, "data", "committed", None, True),
        (1, "data", "committed", str(T1), True), (2, "data", "committed", str(T1), True),
        (3, "commit", "marker", str(T1), False),
        (4, "data", "aborted", str(T2), False),
        (5, "abort", "marker", str(T2), False),
        (6, "data", "pending", str(T3), False),
        (7, "data", "committed", None, False),  # committed, but held back by the open txn
    ]
    p.end(T3, ABORT)
    assert rows_of(p, offset=6) == [(6, "data", "aborted", str(T3), False), (7, "data", "committed", None, True),
                                    (8, "abort", "marker", str(T3), False)]


def test_a_page_starts_inside_a_batch_and_holds_at_most_room_rows() -> None:
    p = Partition()
    p.send("a", 0, count=3)   # offsets 0..2
    p.send("a", 3, count=3)   # 3..5
    assert [r[0] for r in rows_of(p, offset=1, room=3)] == [1, 2, 3]
    rows = browse_rows(based(p), 4, 10, p.buffer)
    assert [(r.offset, r.index, r.position) for r in rows] == [(4, 1, "<0,1>"), (5, 2, "<0,1>")]
    assert rows[0].value_preview == "a:4" and rows[0].value_bytes == 3


def test_txn_state_is_for_data_entries() -> None:
    p = Partition()
    p.send("a", 0, T1)
    p.end(T1, COMMIT)
    marker_position, marker_records = p.ledger.entries[-1]
    with pytest.raises(InvalidArgument):
        p.buffer.txn_state(decode_entry_header(marker_records, ""), marker_position)


def test_backlog_counts_messages_never_markers_or_aborted_ones() -> None:
    """kafbat kafka-ui #1039: a lag counted in offsets counts the markers, so under exactly-once it
    never reaches 0. Three committed txns of two messages, an aborted one, a plain message: 7."""
    p = Partition()
    for i, txn in enumerate((TxnID(0, 1), TxnID(0, 2), TxnID(0, 3))):
        p.send("p", 2 * i, txn, count=2)
        p.end(txn, COMMIT)
    p.send("p", 6, TxnID(0, 4), count=2)
    p.end(TxnID(0, 4), ABORT)
    p.send("p", 8)
    entries = headed(p)
    nothing_acked = acked_by(EARLIEST, [])
    assert count_backlog(entries, p.buffer.is_visible, nothing_acked, {}) == 7
    assert len(entries) == 9 and sum(entry_span(h) for _, h in entries) == 13  # what offsets would say
    # the first txn's entry acked, and one index of the second's (its other one unacked)
    first, second = entries[0][0], entries[2][0]
    acked = acked_by(Position(first.ledger_id, first.entry_id + 1), [])
    assert count_backlog(entries, p.buffer.is_visible, acked, {second: 1}) == 4
    # everything acked up to the end, markers included: 0
    assert count_backlog(entries, p.buffer.is_visible, acked_by(Position(0, 9), []), {}) == 0


def test_acked_by_ranges() -> None:
    acked = acked_by(Position(1, 5), [(Position(1, 8), Position(1, 10)), (Position(2, 0), Position(3, 0))])
    assert [acked(Position(1, e)) for e in (4, 5, 7, 8, 9, 10)] == [True, False, False, True, True, False]
    assert acked(Position(2, 7)) and not acked(Position(3, 0))


def test_value_preview_text_binary_and_cut() -> None:
    assert value_preview(b"hello") == "hello"
    assert value_preview("é".encode() * 200, 10) == "é" * 10 + "…"
    assert value_preview(b"\xff\x00\x01", 10) == "0xff0001"
    assert value_preview(b"\xff" * 40, 10) == "0x" + "ff" * 5 + "…"


# Sends (plain, or in one of 4 txns) and ends, in any order.
HISTORIES = st.lists(st.tuples(st.sampled_from(["plain", "send", "commit", "abort"]), st.integers(0, 3)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(HISTORIES)
def test_browser_and_backlog_agree_with_what_readers_see(steps: list[tuple[str, int]]) -> None:
    """For any history: a message is readable exactly when a reader sees it (``is_visible``), a
    readable message is committed, and the backlog of a subscription that acked nothing is the
    number of readable messages."""
    p = Partition()
    sequence = 0
    outcome: dict[str, str] = {}  # txn -> how it ended
    for kind, n in steps:
        txn = TxnID(0, n + 1)
        if kind == "plain":
            p.send("plain", sequence)
        elif kind == "send" and str(txn) not in outcome:
            p.send(f"t{n}", sequence, txn)
        elif kind in ("commit", "abort") and str(txn) not in outcome:
            p.end(txn, COMMIT if kind == "commit" else ABORT)
            outcome[str(txn)] = "committed" if kind == "commit" else "aborted"
        sequence += 1
    rows = browse_rows(based(p), 0, 10_000, p.buffer)
    visible = {(position, index) for position, records in p.ledger.entries
               for index in range(len(records) - 1)
               if p.buffer.is_visible(decode_entry_header(records, ""), position)}
    assert {(r.position, r.index) for r in rows if r.readable} == {(str(pos), i) for pos, i in visible}
    assert all(r.state == "committed" for r in rows if r.readable)
    assert all(r.state == outcome.get(r.txn, "pending") for r in rows if r.txn is not None and r.kind == "data")
    assert count_backlog(headed(p), p.buffer.is_visible, acked_by(EARLIEST, []), {}) == len(visible)
    assert len(rows) == sum(entry_span(h) for _, h in headed(p))  # one row per offset


def test_cursor_tells_the_unacked_indexes_of_partially_acked_batches() -> None:
    from raytxn.protocol.cursor import Cursor

    cursor = Cursor()
    cursor.ack(Position(0, 3), 1, 4)
    cursor.ack(Position(0, 3), 2, 4)
    cursor.ack(Position(0, 5), 0, 2)
    assert cursor.partially_acked() == [(Position(0, 3), 2), (Position(0, 5), 1)]
    cursor.ack(Position(0, 5), 1, 2)
    assert cursor.partially_acked() == [(Position(0, 3), 2)]
