"""The producers a partition knows (a mixin of ``PartitionBuffer``), for Kafka's DescribeProducers
(KIP-664): each recent producer's last sequence and last append time, and the open transaction
it has here with the offset it began at. The hanging-transaction tools of Kafka (and Flink's
abort strategies) start from this answer: a producer whose transaction stays open here, unknown
to its coordinator or older than the coordinator's timeout, is hanging."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from raytxn.auth import Access, guarded
from raytxn.errors import RaytxnError
from raytxn.ids import Position
from raytxn.protocol.entry_format import decode_header

if TYPE_CHECKING:
    from raytxn.ledger import ManagedLedger
    from raytxn.protocol.txn_buffer import TransactionBuffer

MAX_PRODUCERS_DESCRIBED = 200  # the most recent producers (and oldest open txns) of one answer


class ProducerStates:
    buffer: TransactionBuffer
    _ledger: ManagedLedger | None

    @guarded(Access.CONSUME)
    async def producer_states(self) -> list[dict[str, Any]]:
        """One row per producer: ``producer`` (its raytxn name), ``last_sequence``,
        ``last_timestamp_ms`` (-1: its entry was trimmed), and of its open transaction here
        ``txn``, ``txn_start_offset`` and ``txn_start_ms`` (None when it has none). A transaction
        whose producer is not among the recent ones gets a row of its own (its first entry's
        producer, sequence -1). At most ``MAX_PRODUCERS_DESCRIBED`` of each, latest first."""
        await self._started()
        recent = self.buffer.recent_producers(MAX_PRODUCERS_DESCRIBED)
        ongoing = self.buffer.ongoing(MAX_PRODUCERS_DESCRIBED)
        headers = await asyncio.gather(*(self._header_at(d.position) for d in recent),
                                       *(self._header_at(t.first_position) for t in ongoing))
        rows: dict[str, dict[str, Any]] = {}
        for entry, header in zip(recent, headers[:len(recent)], strict=True):
            rows[entry.producer] = {"producer": entry.producer, "last_sequence": entry.last_sequence,
                                    "last_timestamp_ms": header.publish_time_ms if header else -1,
                                    "txn": None, "txn_start_offset": None, "txn_start_ms": None}
        for txn, header in zip(ongoing, headers[len(recent):], strict=True):
            producer = header.producer if header is not None else f"txn-{txn.txn}"
            row = rows.setdefault(producer, {"producer": producer, "last_sequence": -1,
                                             "last_timestamp_ms": txn.start_ms})
            row.update(txn=txn.txn, txn_start_offset=txn.first_offset, txn_start_ms=txn.start_ms)
        return list(rows.values())

    async def _header_at(self, position: Position) -> Any:
        """The header of the entry at ``position``; None once it is trimmed or unreadable."""
        assert self._ledger is not None
        try:
            entries = await self._ledger.read(position, max_entries=1, end=position)
        except RaytxnError:
            return None
        if not entries or entries[0].position != position:
            return None
        return decode_header(entries[0].records[0], f"{self.stream}@{position}")
