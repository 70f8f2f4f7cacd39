"""A deterministic batch of a subscription on the bulk path, shared by the Spark and Ray Data
connectors (docs/design.md §6, Spark's Kafka-source model).

``lease_batch`` leases the subscription's next committed range of every partition to a holder
(``Client.lease_ranges``: no payload moves) and cuts the ranges into chunks, one per reader task.
The tasks read the chunks straight from the ledger objects as Arrow (``RangeChunk.read``), so no
row passes through the driver. The returned ``BatchHandle`` acknowledges exactly the leased
ranges, cumulatively per partition, inside a transaction: its commit moves the cursors past them,
its abort (or the lease's timeout, or ``close`` before any ack) hands them out again, in order.

Every read of a chunk returns the same rows in the same order (committed data below
``max_read_position`` never changes), so a retried task meets what the failed attempt met.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytxn.errors import NotAllowed

if TYPE_CHECKING:
    import pyarrow as pa

    from raytxn.client.client import Client
    from raytxn.client.leases import LeaseSet, RangeChunk

# The columns of a batch, in order; `properties` is a JSON object in a string column: map columns
# do not survive RayDP's Ray -> Spark conversion with pandas 3 (pyspark's convert_map asserts dict values).
BATCH_COLUMNS = ("key", "value", "properties", "event_time", "publish_time", "topic", "partition", "message_id")
DEFAULT_LEASE_TIMEOUT_S = 120.0
POLL_S = 0.05


def batch_arrow_schema() -> pa.Schema:
    """The batch's Arrow schema (``raytxn.ledger.ranges``' columns ``BATCH_COLUMNS``)."""
    from raytxn.ledger.ranges import range_schema

    return range_schema(BATCH_COLUMNS)


@dataclass
class BatchHandle:
    """The leased ranges of one batch, their chunks, and how to acknowledge exactly them."""

    leases: LeaseSet | None
    chunks: list[RangeChunk] = field(default_factory=list)
    acknowledged: bool = False
    # The rows the chunks' readers read so far (set by the connector that reads them).
    rows_read: Callable[[], int] = lambda: 0

    @property
    def count(self) -> int:
        """Entries leased (0: the batch is empty). Rows are known once the chunks are read."""
        return 0 if self.leases is None else self.leases.entries

    def acknowledge(self, txn: Any) -> None:
        """Acknowledge the batch's ranges inside ``txn`` (``None``: plain cumulative acks, at
        once: at-least-once)."""
        if self.leases:
            if txn is None:
                self.leases.acknowledge_plain()
            else:
                self.leases.acknowledge(txn)
        self.acknowledged = True

    def acknowledge_async(self, txn: Any) -> concurrent.futures.Future[None]:
        """``acknowledge(txn)`` without waiting (see ``LeaseSet.acknowledge_async``); the handle
        counts as acknowledged once the future succeeded. Wait for it before ending ``txn``."""
        if not self.leases:
            self.acknowledged = True
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return done
        future = self.leases.acknowledge_async(txn)

        def settled(future: concurrent.futures.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                self.acknowledged = True

        future.add_done_callback(settled)
        return future

    def close(self) -> None:
        """Give the ranges back if they were never acknowledged (a failed batch: the next one
        starts at them at once instead of after the lease's timeout)."""
        if self.leases and not self.acknowledged:
            try:
                self.leases.release()
            except NotAllowed:
                pass  # expired or taken over meanwhile: it went out again anyway

    def read_all(self, columns: tuple[str, ...] = BATCH_COLUMNS) -> pa.Table:
        """Every chunk read here, in the driver (tests, small batches)."""
        import pyarrow as pa

        tables = [chunk.read(columns) for chunk in self.chunks]
        return pa.concat_tables(tables) if tables else batch_arrow_schema().empty_table()


def lease_batch(client: Client, topic: str, subscription: str, holder: str, epoch: int = 0, *,
                max_messages: int | None = None, max_bytes: int | None = None, max_entries: int = 100_000,
                wait_s: float = 0.0, lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S, min_chunks: int = 1,
                chunk_entries: int = 2_000) -> BatchHandle:
    """The next batch of ``subscription`` leased to ``holder``: bounded by ``max_messages`` and
    ``max_bytes`` over all partitions and ``max_entries`` per partition, cut into at least
    ``min_chunks`` chunks (of at most ``chunk_entries`` entries). Waits up to ``wait_s`` for
    something to read; an empty handle (``count == 0``) when nothing came."""
    deadline = time.monotonic() + wait_s
    while True:
        leases = client.lease_ranges(topic, subscription, holder, epoch, max_entries=max_entries,
                                     max_messages=max_messages, max_bytes=max_bytes, timeout_s=lease_timeout_s)
        if leases or time.monotonic() >= deadline:
            break
        time.sleep(min(POLL_S * 4, max(0.0, deadline - time.monotonic())))
    if not leases:
        return BatchHandle(None)
    return BatchHandle(leases, leases.chunks(chunk_entries, min_chunks))


def txn_writer_id(pipeline_id: str, epoch: int, txn_id: Any) -> str:
    """The names of a batch's write producers: one set per txn. A retried Spark or Ray task of
    the txn re-sends under the same names, so the partitions drop its replays; a batch tried again
    after an abort writes in a new txn under new names, since its rows' sequence ids would
    otherwise be taken as replays of the aborted attempt's and dropped (the dedup rule holds after
    a txn ended)."""
    return f"{pipeline_id}-e{epoch}-t{txn_id.tc_id}-{txn_id.sequence}"
