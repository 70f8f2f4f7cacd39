"""Ray Data reading from and writing to raytxn topics exactly once.

- ``read_topic``: the next messages of a subscription (per partition a contiguous range from the
  subscription's cursor, see ``raytxn.connectors.batches``) as a ``ray.data.Dataset``, plus the
  ``BatchHandle`` that acknowledges exactly that range, cumulatively per partition, in a
  transaction. Until the handle is closed its Exclusive consumer holds the subscription; an
  aborted transaction leaves the range to be read again from the same cursor.
- ``write_topic``: every row of a Dataset produced inside a transaction from Ray tasks (nothing
  goes through the driver). The dataset is materialized and each of its blocks is one slice,
  written by one retryable task as the producer ``<writer_id>-s<block index>`` whose sequence ids
  count the rows it sent to each topic partition. A block behind an object ref is immutable, so a
  retried task meets the same rows in the same order and the partitions' dedup drops the replay.
  (``map_batches`` batch boundaries are not stable across re-execution, so they are not used.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from raytxn.connectors.batches import BatchHandle, read_messages, to_arrow
from raytxn.connectors.spark import WriteSpec, produce_slice, write_spec

__all__ = ["BatchHandle", "read_topic", "write_topic"]


def read_topic(client: Any, topic: str, subscription: str, max_messages: int | None = None,
               until_caught_up: bool = True, idle_timeout_s: float = 1.0, consumer_name: str | None = None,
               attach_deadline_s: float = 120.0) -> tuple[ray.data.Dataset, BatchHandle]:
    """A Dataset (columns: key, value, properties (a JSON object string), event_time,
    publish_time, topic, partition, message_id) of the next messages of ``subscription``, in
    delivery order, and the handle that acknowledges exactly them: ``handle.acknowledge(txn)``,
    then ``handle.close()`` once the txn ended. By default everything available is read
    (``until_caught_up``); ``max_messages`` caps the batch."""
    if max_messages is not None and until_caught_up:
        until_caught_up = False  # a cap was asked for: stop there
    rows, handle = read_messages(client, topic, subscription, max_messages, until_caught_up, idle_timeout_s,
                                 consumer_name or f"ray-data-{subscription}", attach_deadline_s)
    return ray.data.from_arrow(to_arrow(rows)), handle


def write_topic(ds: ray.data.Dataset, client: Any, topic: str, txn: Any, key_col: str | None = None,
                value_col: str = "value", properties_col: str | None = None, event_time_col: str | None = None,
                writer_id: str | None = None, batch_rows: int = 1000,
                fault: Callable[[int, int, int], None] | None = None) -> int:
    """Produce every row of ``ds`` to ``topic`` inside ``txn`` (``None``: plain sends, still
    deduplicated per task) from Ray tasks; returns the number of rows. ``value_col`` holds bytes
    or str; ``key_col`` routes (murmur2, as a Kafka producer would; rows without a key are spread
    deterministically); ``properties_col`` holds a dict or a JSON object string; ``writer_id``
    names the producers (default: unique per call; give a stable one to make a re-run of the
    same write deduplicate too). ``fault(block_index, attempt, rows_sent)`` is called after each
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
        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number())
    except Exception:  # noqa: BLE001 - a private API: without it every attempt reports 0
        return 0
