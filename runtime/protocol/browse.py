"""What an operator sees of a partition's log: each message with what became of its transaction,
and a subscription's backlog in messages.

Pure (no Ray, no I/O, no clock): the partition actor reads the entries and hands them here with its
``TransactionBuffer``, which alone knows which transactions committed, aborted or are still open.

* ``browse_rows``: one row per message of the entries given, from a Kafka offset on (a partition's
  dense offsets: a message takes one, a COMMIT or ABORT marker one), at most ``room`` rows. A data
  message is ``committed``, ``aborted`` or ``pending`` (its txn open here), with its txn id; a
  marker is a row of its own, ``kind`` commit or abort, shown as what it is rather than counted as
  a message. ``readable`` says whether a consumer may read it now (committed and at or below
  ``max_read_position``; a committed message behind an older open txn waits).
* ``count_backlog``: the messages a subscription has still to consume, markers and aborted
  messages not counted (a Kafka console that counts offsets counts markers, so its lag under
  exactly-once never reaches 0: kafbat kafka-ui #1039), and what its cursor acked individually
  or batch index by batch index subtracted.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import msgspec

from raytxn.ids import Position
from raytxn.protocol.entry_format import EntryHeader, decode_header, decode_message
from raytxn.protocol.txn_buffer import TransactionBuffer

PREVIEW_CHARS = 120  # a value longer than this is cut in a row (the browser shows the start)
MAX_BROWSE_ROWS = 500  # one page of the message browser holds at most this many rows
MARKER_KINDS = ("commit", "abort")


class BrowsedMessage(msgspec.Struct, frozen=True):
    """One row of the message browser: a message, or a transaction marker."""

    offset: int
    position: str           # the entry's "<ledger,entry>"
    index: int              # the message's batch index in its entry (0 for a marker)
    kind: str               # "data", or the marker's "commit" / "abort"
    state: str              # committed | aborted | pending, or "marker"
    txn: str | None
    key: str | None
    value_preview: str      # UTF-8 text, else hex; cut at PREVIEW_CHARS
    value_bytes: int
    publish_time_ms: int
    producer: str
    readable: bool


def value_preview(value: bytes, limit: int = PREVIEW_CHARS) -> str:
    """The start of ``value`` as text when it is UTF-8, else as hex (``0x...``); an ellipsis
    says it was cut."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + value[: limit // 2].hex()
        return text + ("…" if len(value) > limit // 2 else "")
    return text[:limit] + ("…" if len(text) > limit else "")


def browse_rows(entries: Sequence[tuple[int, Position, Sequence[bytes]]], offset: int, room: int,
                buffer: TransactionBuffer, where: str = "") -> list[BrowsedMessage]:
    """Rows for the messages and markers of ``entries`` (``(base offset, position, records)``,
    records[0] the header, in ledger order) at or after ``offset``, at most ``room``."""
    rows: list[BrowsedMessage] = []
    max_read = buffer.max_read_position
    for base, position, records in entries:
        if len(rows) >= room:
            break
        header = decode_header(records[0], f"{where}@{position}")
        txn = None if header.txn is None else str(header.txn)
        if header.is_marker:
            if base >= offset:
                rows.append(BrowsedMessage(base, str(position), 0, header.kind, "marker", txn, None, "", 0,
                                           header.publish_time_ms, header.producer, False))
            continue
        state = buffer.txn_state(header, position)
        readable = state == "committed" and position <= max_read
        for index, record in enumerate(records[1:]):
            if base + index < offset:
                continue
            if len(rows) >= room:
                break
            message = decode_message(record, f"{where}@{position}#{index}")
            rows.append(BrowsedMessage(base + index, str(position), index, "data", state, txn, message.key,
                                       value_preview(message.value), len(message.value), header.publish_time_ms,
                                       header.producer, readable))
    return rows


def count_backlog(entries: Sequence[tuple[Position, EntryHeader]], visible: Callable[[EntryHeader, Position], bool],
                  acked: Callable[[Position], bool], unacked_in_batch: dict[Position, int]) -> int:
    """Messages of ``entries`` a subscription has still to consume: those of visible data
    entries (``visible``: committed and readable; markers and aborted entries never count) that
    its cursor has not ``acked`` whole; of a partially acked entry, only the indexes still unacked
    (``unacked_in_batch``: position -> how many)."""
    total = 0
    for position, header in entries:
        if header.is_marker or acked(position) or not visible(header, position):
            continue
        total += unacked_in_batch.get(position, header.count)
    return total


def acked_by(acked_below: Position, acked_ranges: Sequence[tuple[Position, Position]]) -> Callable[[Position], bool]:
    """Whether a cursor whose mark-delete bound is ``acked_below`` and whose individually acked
    ranges are ``acked_ranges`` (``[start, end)``, ascending, disjoint) has acked a position."""
    starts = [start for start, _ in acked_ranges]

    def acked(position: Position) -> bool:
        if position < acked_below:
            return True
        at = bisect.bisect_right(starts, position) - 1
        return at >= 0 and position < acked_ranges[at][1]

    return acked
