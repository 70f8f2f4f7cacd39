"""Ray Data reading from and writing to raytxn topics exactly once.

- ``read_topic``: the next messages of a subscription as a lazy, streaming ``ray.data.Dataset``
  over a real ``Datasource`` (``TopicRanges``), and the ``BatchHandle`` that acknowledges exactly
  them. The driver leases each partition's next committed range (no payload moves) and cuts the
  ranges into chunks; the Dataset has one read task per chunk, which reads it straight from the
  ledger objects as Arrow. A retried read task meets the same rows (committed data below the
  partition's ``max_read_position`` never changes). ``handle.acknowledge(txn)`` acks the ranges
  cumulatively in a transaction, so its commit moves the cursors past them and an abort hands
  them out again; ``handle.close()`` gives back ranges never acknowledged.
- ``write_topic``: every row of a Dataset produced inside a transaction from Ray tasks (nothing
  goes through the driver). The dataset is materialized and each of its blocks is one slice,
  written by one retryable task as the producer ``<writer_id>-s<block index>`` whose sequence ids
  count the rows it sent to each topic partition. A block behind an object ref is immutable, so a
  retried task meets the same rows in the same order and the partitions' dedup drops the replay.
  (``map_batches`` batch boundaries are not stable across re-execution, so they are not used.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from raytxn.connectors.batches import BATCH_COLUMNS, BatchHandle, batch_arrow_schema, lease_batch
from raytxn.connectors.spark import WriteSpec, produce_slice, write_spec

__all__ = ["BatchHandle", "TopicRanges", "read_topic", "write_topic"]


class TopicRanges(Datasource):
    """The chunks of leased ranges as a Datasource: one read task per chunk (fewer when Ray asks
    for less parallelism: then a task reads several chunks in order)."""

    def __init__(self, chunks: Sequence[Any], columns: Sequence[str] = BATCH_COLUMNS) -> None:
        self._chunks = list(chunks)
        self._columns = tuple(columns)

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # entries are known, their sizes are not (without reading them)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        if not self._chunks:
            return []
        groups = max(1, min(parallelism, len(self._chunks))) if parallelism > 0 else len(self._chunks)
        size = -(-len(self._chunks) // groups)
        schema = batch_arrow_schema() if self._columns == BATCH_COLUMNS else None
        tasks = []
        for first in range(0, len(self._chunks), size):
            group = self._chunks[first:first + size]
            metadata = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
            tasks.append(ReadTask(_reader(group, self._columns), metadata, schema=schema,
                                  per_task_row_limit=per_task_row_limit))
        return tasks

    def get_name(self) -> str:
        return "RaytxnTopic"


def _reader(chunks: list[Any], columns: tuple[str, ...]) -> Callable[[], Iterable[Any]]:
    def read() -> Iterable[Any]:
        for chunk in chunks:
            yield chunk.read(columns)
    return read


def read_topic(client: Any, topic: str, subscription: str, max_messages: int | None = None, *,
               max_bytes: int | None = None, holder: str | None = None, epoch: int = 0, wait_s: float = 1.0,
               lease_timeout_s: float = 120.0, chunk_entries: int = 2_000, min_chunks: int = 1,
               columns: Sequence[str] = BATCH_COLUMNS) -> tuple[ray.data.Dataset, BatchHandle]:
    """A Dataset (columns: key, value, properties (a JSON object string), event_time,
    publish_time, topic, partition, message_id, or ``columns``) of the next messages of
    ``subscription``, per partition in append order, and the handle that acknowledges exactly
    them: ``handle.acknowledge(txn)``, then ``handle.close()``. Everything readable is leased
    unless ``max_messages``/``max_bytes`` bound it; ``wait_s``: how long to wait for input."""
    handle = lease_batch(client, topic, subscription, holder or f"ray-data-{subscription}", epoch,
                         max_messages=max_messages, max_bytes=max_bytes, wait_s=wait_s,
                         lease_timeout_s=lease_timeout_s, min_chunks=min_chunks, chunk_entries=chunk_entries)
    if not handle.chunks:
        return ray.data.from_arrow(batch_arrow_schema().empty_table()), handle
    return ray.data.read_datasource(TopicRanges(handle.chunks, columns)), handle


def write_topic(ds: ray.data.Dataset, client: Any, topic: str, txn: Any, key_col: str | None = None,
                value_col: str = "value", properties_col: str | None = None, event_time_col: str | None = None,
                writer_id: str | None = None, batch_rows: int = 1000,
                fault: Callable[[int, int, int], None] | None = None) -> int:
    """Produce every row of ``ds`` to ``topic`` inside ``txn`` (``None``: plain sends, still
    deduplicated per task) from Ray tasks; returns the number of rows. ``value_col`` holds bytes
    or str; ``key_col`` routes (murmur2, as a Kafka producer would; rows without a key are spread
    deterministically); ``properties_col`` holds a dict or a JSON object string; ``writer_id``
    names the producers (default: unique per call; give a stable one to make a re-run of the
    same write in the same txn deduplicate too; under another txn, even after an abort, its rows
    would be taken for replays and dropped). ``fault(block_index, attempt, rows_sent)`` is called after each
    append a task made: tests raise from it to fail a task midway."""
    spec = write_spec(client, topic, txn, key_col, value_col, properties_col, event_time_col, writer_id, batch_rows)
    # Materialize first: the slices must be fixed before any task sends, and a block's content
    # never changes, so slice i means the same rows in the same order on every attempt.
    refs = ds.materialize().to_arrow_refs()
    counts = ray.get([_write_block.remote(spec, index, block, fault) for index, block in enumerate(refs)])
    return int(sum(counts))


# retry_exceptions: an attempt that failed midway (a Timeout, an injected fault) is safe to run
# again, the partitions drop what it already sent.
@ray.remote(max_retries=3, retry_exceptions=True)
def _write_block(spec: WriteSpec, index: int, block: Any, fault: Callable[[int, int, int], None] | None) -> int:
    return produce_slice(spec, index, _attempt(), block.to_pylist(), fault)


def _attempt() -> int:
    """This task's attempt number (0 first), for the fault hook only; Ray has no public API for it."""
    try:
        worker = ray._private.worker.global_worker
        return int(worker.core_worker.get_current_task_attempt_number())  # type: ignore[attr-defined]  # private
    except Exception:  # noqa: BLE001 - a private API: without it every attempt reports 0
        return 0
