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
- ``read_state``: a compacted topic's latest committed value per key as a Dataset (key, value),
  one read task per partition reading straight from storage (``CompactedStates``).
- ``StatefulDataPipeline``: exactly-once micro-batches with keyed state, the Ray Data form of
  ``ExactlyOncePipeline(state_topic=)``: per batch, in one transaction of the transactional id
  ``pipeline_id``, ``transform(batch_ds, state_ds)`` returns the output and the state updates,
  written beside the input's acks. Batches run one at a time, each reading the state its
  predecessor committed; a failed batch is aborted and tried again on the same state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from raytxn.client.compaction import CompactedState, compacted_state
from raytxn.client.transaction import UNENDED_STATES
from raytxn.connectors.batches import BATCH_COLUMNS, BatchHandle, batch_arrow_schema, lease_batch, txn_writer_id
from raytxn.connectors.spark import WriteSpec, produce_slice, write_spec
from raytxn.errors import Fenced, InvalidArgument, RaytxnError

__all__ = ["BatchHandle", "CompactedStates", "StatefulDataPipeline", "TopicRanges", "read_state", "read_topic",
           "write_topic"]
POLL_S = 0.2  # how long a batch waits for input before it counts as none


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


# --- keyed state ---------------------------------------------------------------------------------


class CompactedStates(Datasource):
    """A compacted topic's partitions as a Datasource: one read task per partition, each reading
    its latest committed values straight from storage (``CompactedState.read``)."""

    def __init__(self, states: Sequence[CompactedState]) -> None:
        self._states = list(states)

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        import pyarrow as pa

        schema = pa.schema([("key", pa.string()), ("value", pa.binary())])
        metadata = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
        return [ReadTask(_state_reader(state), metadata, schema=schema, per_task_row_limit=per_task_row_limit)
                for state in self._states]

    def get_name(self) -> str:
        return "RaytxnState"


def _state_reader(state: CompactedState) -> Callable[[], Iterable[Any]]:
    def read() -> Iterable[Any]:
        yield state.read()
    return read


def read_state(client: Any, topic: str) -> ray.data.Dataset:
    """``topic``'s latest committed value of each key (deleted keys left out) as a Dataset (key
    string, value binary), as of now: everything committed before this call is in it."""
    if not client.get_topic(topic).get("compacted"):
        raise InvalidArgument(f"{topic!r} is not a compacted topic: its keys' latest values are not kept")
    return ray.data.read_datasource(CompactedStates(client.loop.run(compacted_state(client, topic))))


@dataclass
class DataBatchStats:
    batch: int
    rows_in: int
    rows_out: int
    state_updates: int
    txn: str
    attempt: int
    batch_s: float


@dataclass
class StatefulDataPipeline:
    """Exactly-once micro-batches of Ray Datasets with keyed state in the compacted
    ``state_topic`` (see the module): ``transform(batch_ds, state_ds) -> (output_ds,
    updates_ds)``; the output's ``value`` column (and ``key``, if any) goes to ``sink``, the
    updates' ``key`` and ``value`` to the state topic (a null or empty value deletes the key)."""

    client: Any
    source: str
    subscription: str
    sink: str
    state_topic: str
    transform: Callable[[ray.data.Dataset, ray.data.Dataset], tuple[ray.data.Dataset, ray.data.Dataset]]
    pipeline_id: str
    batch_max_messages: int | None = 1000
    txn_timeout_s: float = 120.0
    lease_timeout_s: float = 120.0
    max_attempts: int = 5
    before_commit: Callable[[int], None] | None = None  # called with the batch number (tests, demos)
    stats: list[DataBatchStats] = field(default_factory=list)
    epoch: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.state_topic in (self.source, self.sink):
            raise InvalidArgument("the state topic must be a topic of its own, not the source or the sink")
        for topic in (self.source, self.sink):
            self.client.get_topic(topic)  # TopicNotFound now, not at the first batch
        if not self.client.get_topic(self.state_topic).get("compacted"):
            raise InvalidArgument(f"state_topic {self.state_topic!r} is not compacted: create it with "
                                  f"create_topic(..., compacted=True)")

    def run_batch(self, attempt: int = 0) -> DataBatchStats | None:
        """One micro-batch in one transaction, committed; None when there was no input."""
        t0, batch = time.perf_counter(), len(self.stats)
        if self.epoch is None:
            self.epoch = self.client.register_transactional_id(self.pipeline_id)  # fences any zombie
        ds, handle = read_topic(self.client, self.source, self.subscription, self.batch_max_messages,
                                holder=self.pipeline_id, epoch=self.epoch, wait_s=POLL_S,
                                lease_timeout_s=self.lease_timeout_s)
        if handle.count == 0:
            handle.close()
            return None
        txn = None
        try:
            ds = ds.materialize()  # read once: the transform may use it more than once, and its rows are counted
            rows_in = ds.count()
            txn = self.client.new_transaction(self.txn_timeout_s, transactional_id=self.pipeline_id, epoch=self.epoch)
            # After the begin, so after the last batch's commit returned: its updates are in it.
            out, updates = self._transformed(ds, read_state(self.client, self.state_topic))
            writer = txn_writer_id(self.pipeline_id, self.epoch, txn.id)
            rows_out = write_topic(out, self.client, self.sink, txn,
                                   key_col="key" if "key" in out.columns() else None, writer_id=writer)
            changed = write_topic(updates.select_columns(["key", "value"]), self.client, self.state_topic, txn,
                                  key_col="key", writer_id=f"{writer}-state")
            handle.acknowledge(txn)
            if self.before_commit is not None:
                self.before_commit(batch)
            txn.commit(until_applied=True)  # the next batch reads the state it wrote
        except BaseException:
            if txn is not None and txn.state in UNENDED_STATES:
                try:
                    txn.abort()
                except RaytxnError:
                    pass  # it times out instead
            handle.close()
            raise
        handle.close()
        stats = DataBatchStats(batch, rows_in, rows_out, changed, str(txn.id), attempt,
                               time.perf_counter() - t0)
        self.stats.append(stats)
        return stats

    def _transformed(self, ds: ray.data.Dataset, state: ray.data.Dataset) -> tuple[Any, Any]:
        result = self.transform(ds, state)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise InvalidArgument("the transform returns (output_ds, updates_ds)")
        out, updates = result
        if "value" not in out.columns() or not {"key", "value"} <= set(updates.columns()):
            raise InvalidArgument(f"the output needs a `value` column and the updates `key` and `value`; got "
                                  f"{out.columns()} and {updates.columns()}")
        return out, updates

    def run(self, max_batches: int | None = None, until_idle: bool = False) -> list[DataBatchStats]:
        """Run micro-batches (forever, ``max_batches`` of them, or until the input is drained),
        each tried up to ``max_attempts`` times; ``Fenced`` stops it (a newer incarnation runs)."""
        while max_batches is None or len(self.stats) < max_batches:
            for attempt in range(self.max_attempts):
                try:
                    result = self.run_batch(attempt)
                    break
                except Fenced:
                    raise
                except Exception:
                    if attempt + 1 >= self.max_attempts:
                        raise
                    time.sleep(min(2.0, 0.2 * (attempt + 1)))
            if result is None and until_idle:
                break
        return self.stats
