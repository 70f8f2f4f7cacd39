"""The operator's view of a partition (a mixin of ``actors/partition.py``'s ``PartitionBuffer``):
``browse``, a page of its messages with what became of each one's transaction, and
``count_backlog``, a subscription's backlog in messages. Both read the partition's ledger and its
transaction buffer and change neither; the decisions are ``protocol.browse``'s.

Bounds: a page holds at most ``MAX_BROWSE_ROWS`` rows and reads at most one offset-index interval
of entries before its first row; a backlog count reads at most ``max_entries`` entry headers and
says whether it reached the readable end (``exact``) or stopped there (a lower bound).
"""

from __future__ import annotations

from typing import Any

import msgspec

from raytxn.actors.subscription import CURSOR_PROPERTY, pending_ack_stream
from raytxn.auth import Access, guarded
from raytxn.config import PartitionConfig
from raytxn.errors import InvalidArgument
from raytxn.ids import Position, check_name
from raytxn.ledger import ManagedLedger, read_metadata
from raytxn.ledger.storage import Storage
from raytxn.protocol.browse import MAX_BROWSE_ROWS, acked_by, browse_rows, count_backlog
from raytxn.protocol.cursor import Cursor, next_position
from raytxn.protocol.entry_format import decode_header
from raytxn.protocol.offsets import entry_span
from raytxn.protocol.subscription_state import decode_persisted
from raytxn.protocol.txn_buffer import TransactionBuffer

BACKLOG_SCAN_ENTRIES = 20_000  # the most entry headers one backlog count reads


class PartitionBrowse:
    """``browse`` and ``count_backlog``; ``PartitionBuffer`` provides the state."""

    buffer: TransactionBuffer
    _ledger: ManagedLedger | None
    config: PartitionConfig
    stream: str
    storage: Storage
    topic: str
    partition: int

    @guarded(Access.CONSUME)
    async def browse(self, offset: int | None = None, max_messages: int = 50) -> dict[str, Any]:
        """A page of this partition's live log from Kafka offset ``offset`` (None: the last
        ``max_messages`` offsets): ``rows`` (``protocol.browse.BrowsedMessage`` as dicts: every
        message committed, aborted or pending with its txn id, markers as markers, open
        transactions' messages included), the log start offset and high watermark to page
        within, ``next_offset`` (after the last row; None at the end) and ``out_of_range`` when
        ``offset`` lies outside [log start, high watermark] (then no rows)."""
        await self._started()  # type: ignore[attr-defined]
        assert self._ledger is not None
        if type(max_messages) is not int or not 1 <= max_messages <= MAX_BROWSE_ROWS:
            raise InvalidArgument(f"max_messages must be an int in 1..{MAX_BROWSE_ROWS}, got {max_messages!r}")
        if offset is not None and type(offset) is not int:
            raise InvalidArgument(f"an offset is an int, got {offset!r}")
        offsets = self.buffer.offsets
        log_start, end = offsets.start_offset(self._ledger.trimmed_below), offsets.next_offset
        if offset is None:
            offset = max(log_start, end - max_messages)
        out: dict[str, Any] = {"offset": offset, "log_start": log_start, "high_watermark": end,
                               "last_stable": self.buffer.last_stable_offset,
                               "max_read_position": str(self.buffer.max_read_position),
                               "rows": [], "next_offset": None, "out_of_range": False}
        if not log_start <= offset <= end:
            return {**out, "out_of_range": True}
        point = offsets.locate(offset, self._ledger.trimmed_below)
        if point is None:  # the high watermark: nothing after it yet
            return out
        rows = await self._browse_from(point.position, point.offset, offset, max_messages)
        out["rows"] = [msgspec.structs.asdict(row) for row in rows]
        last = rows[-1].offset if rows else None
        out["next_offset"] = None if last is None or last + 1 >= end else last + 1
        return out

    async def _browse_from(self, position: Position, base: int, offset: int, room: int) -> list[Any]:
        assert self._ledger is not None
        rows: list[Any] = []
        last = self.buffer.last_position
        while len(rows) < room and position <= last:
            read_from, entries = await self._read_retained(  # type: ignore[attr-defined]
                position, self.config.max_read_entries, last)
            if not entries or read_from != position:  # trimmed under the read: the page shows what it had
                break
            based: list[tuple[int, Position, list[bytes]]] = []
            for entry in entries:
                header = decode_header(entry.records[0], f"{self.stream}@{entry.position}")
                span = entry_span(header)
                if base + span > offset:
                    based.append((base, entry.position, entry.records))
                base += span
            rows += browse_rows(based, offset, room - len(rows), self.buffer, self.stream)
            position = next_position(entries[-1].position)
        return rows

    @guarded(Access.CONSUME)
    async def count_backlog(self, acked_below: Position, acked_ranges: list[tuple[Position, Position]],
                            unacked_in_batch: list[tuple[Position, int]],
                            max_entries: int = BACKLOG_SCAN_ENTRIES) -> dict[str, Any]:
        """The messages a subscription whose cursor is given (its mark-delete bound, individually
        acked ranges and partially acked entries with how many indexes are unacked) has still to
        consume, up to the readable end: markers and aborted messages not counted. ``exact``
        False when the count stopped after ``max_entries`` entries (``messages`` is then a lower
        bound) and ``max_read_position``, the readable end it counted to. Not traffic: it keeps
        no idle partition from passivating (``shell.UNCOUNTED_CALLS``)."""
        await self._started()  # type: ignore[attr-defined]
        if type(max_entries) is not int or not 1 <= max_entries <= BACKLOG_SCAN_ENTRIES:
            raise InvalidArgument(f"max_entries must be an int in 1..{BACKLOG_SCAN_ENTRIES}, got {max_entries!r}")
        return await self._count_backlog(acked_below, [tuple(r) for r in acked_ranges],  # type: ignore[misc]
                                         dict(unacked_in_batch), max_entries)

    @guarded(Access.AUTHENTICATED)
    async def stored_backlog(self, subscription: str) -> dict[str, Any] | None:
        """``count_backlog`` of ``subscription`` from its cursor as stored (what it recovers to;
        where a dormant subscription is, since it persisted its cursor before it passivated), so
        an operator sees the backlog of a subscription nobody reads without starting it. None
        when it has stored no cursor yet (never started). A count, like ``stats``: any
        authenticated caller; not traffic (``shell.UNCOUNTED_CALLS``)."""
        await self._started()  # type: ignore[attr-defined]
        stream = pending_ack_stream(self.topic, self.partition, check_name(subscription, "subscription"))
        meta = await read_metadata(self.storage, stream)
        raw = None if meta is None else meta.properties.get(CURSOR_PROPERTY)
        if raw is None:
            return None
        cursor = Cursor.from_snapshot(decode_persisted(raw, stream).cursor)
        return await self._count_backlog(cursor.acked_below, cursor.acked_ranges(), dict(cursor.partially_acked()),
                                         BACKLOG_SCAN_ENTRIES)

    async def _count_backlog(self, acked_below: Position, acked_ranges: list[tuple[Position, Position]],
                             partial: dict[Position, int], max_entries: int) -> dict[str, Any]:
        assert self._ledger is not None
        acked = acked_by(acked_below, acked_ranges)
        end = self.buffer.max_read_position
        position = max(acked_below, self._ledger.trimmed_below, Position(0, 0))
        messages = scanned = 0
        exact = True
        while position <= end:
            if scanned >= max_entries:
                exact = False
                break
            _, entries = await self._read_retained(  # type: ignore[attr-defined]
                position, min(self.config.max_read_entries, max_entries - scanned), end)
            if not entries:
                break
            headed = [(entry.position, decode_header(entry.records[0], f"{self.stream}@{entry.position}"))
                      for entry in entries]
            messages += count_backlog(headed, self.buffer.is_visible, acked, partial)
            scanned += len(entries)
            position = next_position(entries[-1].position)
        return {"messages": messages, "exact": exact, "entries_scanned": scanned, "max_read_position": end}

