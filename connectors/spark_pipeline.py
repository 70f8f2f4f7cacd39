"""Exactly-once micro-batches from raytxn topics through Spark (on Ray, via RayDP) to raytxn topics.

``read_batch`` leases the subscription's next committed range of every partition
(``raytxn.connectors.batches.lease_batch``), cuts the ranges into chunks, and returns a DataFrame
whose Spark tasks read the chunks straight from the ledger objects as Arrow (``mapInArrow``), and
the handle that acknowledges exactly those ranges, cumulatively per partition, inside a
transaction. No row passes through the driver: it plans, acknowledges and commits. The read
needs no Ray CPU slot beyond Spark's own executors (the tasks reach storage, not Ray), so Spark
may hold every CPU.

``ExactlyOncePipeline`` runs micro-batches: register ``pipeline_id`` as a transactional id once (a
zombie of the same pipeline, e.g. a driver that was thought dead, is fenced and its open
transaction aborted) and hold its leases under that id's epoch, so the zombie's leases pass to the
new incarnation at once. Per batch: begin a transaction, lease and read a batch, transform it,
write the result from the Spark tasks inside the transaction while the input's acks in it travel
(``BatchHandle.acknowledge_async``), commit. The commit runs while the next batch is leased, read
and written (``overlap_commits``): the next batch's ranges chain behind the committing ones
(``raytxn.protocol.lease``), its acks are held until that commit is done, and it commits only
after it. An exception aborts the transaction and the batch is tried again from the same ranges
(a failed commit fails the batch behind it too, and both ranges go out again); a restarted
pipeline resumes where the last commit left off, because the input's cursors move only when a
batch commits. Batches are sized by rows
(``batch_max_messages``), bytes (``batch_max_bytes``) and time (``trigger_interval``: at most
one batch per interval), or run back to back (``continuous=True``).

Keyed state (``state_topic``, a compacted topic): the transform is called as
``transform(batch_df, state_df)``, where ``state_df`` (columns key string, value binary) holds
every key's latest committed value, read by Spark tasks straight from the topic's compacted
generation and live ledger (``raytxn.client.compaction.CompactedState``), and returns
``(output_df, updates_df)``. The updates (key, value; a null or empty value deletes the key) are
written to the state topic in the batch's transaction, beside the output and the input's acks: a
batch's output, its state change and its input's progress commit together or not at all, the
exactly-once state of Kafka Streams and Flink. A batch tried again after an abort reads the same
state, since its aborted updates were never visible. Batches run one at a time
(``overlap_commits`` is turned off): each one must read the state its predecessor committed.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raytxn.client.transaction import UNENDED_STATES
from raytxn.connectors.batches import BATCH_COLUMNS, BatchHandle, lease_batch, txn_writer_id
from raytxn.connectors.spark import task_slots, write
from raytxn.errors import ConcurrentTransactions, Fenced, InvalidArgument, RaytxnError
from raytxn.extras import missing_extra

try:
    from pyspark.accumulators import AccumulatorParam
except ModuleNotFoundError as e:  # pyspark comes with the `spark` extra: say so
    raise missing_extra("spark", "pyspark") from e

POLL_S = 0.2             # how long a batch waits for input before it counts as none
POLL_CONTINUOUS_S = 0.05
MAX_BEGIN_ATTEMPTS = 500  # the next txn's begin, retried while the last one's commit request travels
BEGIN_RETRY_S = 0.002

__all__ = ["BATCH_SCHEMA", "STATE_SCHEMA", "BatchHandle", "BatchStats", "ExactlyOncePipeline", "read_batch"]

# The Spark DDL of raytxn.connectors.batches.batch_arrow_schema(); `properties` is a JSON string (see there).
BATCH_SCHEMA = ("key string, value binary, properties string, event_time long, "
                "publish_time long, topic string, partition int, message_id string")
# The Spark DDL of a state topic's DataFrame (``ExactlyOncePipeline.state_topic``).
STATE_SCHEMA = "key string, value binary"


def read_batch(spark: Any, client: Any, topic: str, subscription: str, max_messages: int | None = 1000, *,
               max_bytes: int | None = None, holder: str | None = None, epoch: int = 0, wait_s: float = 1.0,
               lease_timeout_s: float = 120.0, chunk_entries: int = 2_000,
               on_leased: Callable[[BatchHandle], None] | None = None) -> tuple[Any, BatchHandle]:
    """A DataFrame (columns: key, value, properties, event_time, publish_time, topic, partition,
    message_id) of the next messages of ``subscription``, read by Spark tasks, and the handle
    acknowledging them (``handle.rows_read()``: the rows the tasks read so far). ``holder`` and
    ``epoch`` hold the leases (default ``batch-<subscription>``, 0); ``wait_s``: how long to wait
    for input (an empty DataFrame and ``handle.count == 0`` when none came); ``on_leased(handle)``:
    called once a non-empty batch is leased, before its DataFrame is planned."""
    handle = lease_batch(client, topic, subscription, holder or f"batch-{subscription}", epoch,
                         max_messages=max_messages, max_bytes=max_bytes, wait_s=wait_s,
                         lease_timeout_s=lease_timeout_s, min_chunks=task_slots(spark),
                         chunk_entries=chunk_entries)
    if on_leased is not None and handle.count:
        on_leased(handle)
    df, rows_read = chunks_to_spark(spark, handle.chunks)
    handle.rows_read = rows_read
    return df, handle


class _RowCounts(AccumulatorParam):
    """Rows read per chunk index: a retried or recomputed task sets its chunk's count again
    instead of adding it twice, so the total is exact."""

    def zero(self, value: dict[int, int]) -> dict[int, int]:
        return {}

    def addInPlace(self, counts: dict[int, int], more: dict[int, int]) -> dict[int, int]:
        counts.update(more)
        return counts


def chunks_to_spark(spark: Any, chunks: list[Any]) -> tuple[Any, Callable[[], int]]:
    """A DataFrame of the chunks' messages (the chunks dealt over one task per slot, each task
    reading its chunks straight from storage, in order), and a function returning how many rows
    the tasks read."""
    if not chunks:
        return spark.createDataFrame([], BATCH_SCHEMA), lambda: 0
    counts = spark.sparkContext.accumulator({}, _RowCounts())
    # One task per slot: a Python task costs Spark a fixed overhead (about 80 ms here) that a
    # chunk's read (milliseconds) does not pay back. The tasks' input is the chunks' indexes from
    # `spark.range`, which the JVM makes; the chunks travel in the read function's closure. A
    # DataFrame of the descriptors themselves (`createDataFrame`, `toDF`) would pass them through
    # a Python worker of its own first (pyspark re-serializes any RDD it makes from Python data).
    slices = max(1, min(len(chunks), task_slots(spark)))

    def read_chunks(batches: Any) -> Any:  # runs in Spark's Python workers
        for batch in batches:
            for index in batch.column(0).to_pylist():
                table = chunks[index].read(BATCH_COLUMNS)
                counts.add({index: table.num_rows})
                yield from table.to_batches()

    df = spark.range(0, len(chunks), 1, slices).mapInArrow(read_chunks, BATCH_SCHEMA)
    return df, lambda: sum(counts.value.values())


def _abandon(begun: concurrent.futures.Future[Any]) -> None:
    """Abort a transaction begun for a batch whose read then failed (else it waits out its
    timeout, holding nothing: it has no participants yet)."""
    try:
        begun.result().abort()
    except Exception:  # noqa: BLE001 - best effort: the read's own error is what the caller gets
        pass  # it never began, or it times out instead


def _persisted(out: Any, updates: Any, cached: list[Any]) -> tuple[Any, Any]:
    """``out`` and ``updates`` persisted (in executor memory, spilling to disk) before their two
    writes. Each write is a Spark job of its own, and the two usually share their plan (a running
    count emits and stores the same totals): unpersisted, the second job would read the batch's
    input and the whole state again and redo the shuffle. A block lost with an executor is
    recomputed from the lineage, which reads the same leased ranges and the same state."""
    from pyspark import StorageLevel

    for frame in (out,) if updates is out else (out, updates):
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
    return out, updates


def _unpersist(cached: list[Any]) -> None:
    while cached:
        cached.pop().unpersist(blocking=False)


@dataclass
class BatchStats:
    batch: int
    rows_in: int
    rows_out: int
    batch_s: float
    commit_s: float
    txn: str
    attempt: int
    state_updates: int = 0  # rows written to the state topic (``state_topic`` only)


def _timed_commit(txn: Any, until_applied: bool = False) -> float:
    txn.commit(until_applied)
    return time.perf_counter()


@dataclass
class _Committing:
    """A batch whose commit was sent; ``future``'s result is when the commit was done
    (``perf_counter``), its error when it failed."""

    stats: BatchStats
    future: concurrent.futures.Future[float]
    started: float  # the batch's start
    sent: float     # when its commit was sent
    settled: bool = False

    @classmethod
    def done(cls, stats: BatchStats, started: float, sent: float, ended: float) -> _Committing:
        future: concurrent.futures.Future[float] = concurrent.futures.Future()
        future.set_result(ended)
        return cls(stats, future, started, sent)

    def settle(self, overlapped: bool) -> None:
        """Wait for the commit (raising its error). The batch's time runs to its commit's end, or,
        when the next batch ran meanwhile (``overlapped``), to its commit's sending: the rest is
        the next batch's time, so the batches' times add up to the time the pipeline ran."""
        try:
            ended = self.future.result()
        finally:
            self.settled = True
        self.stats.commit_s = ended - self.sent
        self.stats.batch_s = (self.sent if overlapped else ended) - self.started


@dataclass
class ExactlyOncePipeline:
    """Exactly-once micro-batches from ``source`` (read through ``subscription``) to ``sink``:
    each batch's output, its input's acks and, with a ``state_topic``, its keyed state's updates
    commit in one transaction of the transactional id ``pipeline_id`` (see the module)."""

    spark: Any
    client: Any
    source: str
    subscription: str
    sink: str
    transform: Callable[..., Any]  # (df) -> df, or with a state_topic (df, state_df) -> (df, updates_df)
    pipeline_id: str
    batch_max_messages: int | None = 1000  # rows per batch, over all partitions (None: no bound)
    batch_max_bytes: int | None = None     # message bytes per batch (None: no bound)
    trigger_interval: float = 0.0          # at most one batch per this many seconds (0: back to back)
    continuous: bool = False               # poll for input every 50 ms instead of every 200 ms when idle
    txn_timeout_s: float = 120.0
    lease_timeout_s: float = 120.0         # a stalled pipeline's input goes to its successor after this
    max_attempts: int = 5
    write_fault: Callable[[int, int, int], None] | None = None  # passed to ``write`` (tests)
    before_commit: Callable[[int], None] | None = None  # called with the batch number (tests, demos)
    exactly_once: bool = True  # False: plain sends and acks, at-least-once (for comparison only)
    # Commit each batch while the next one is leased, read and written (``run`` only; its input
    # chains behind the committing batch's, and it commits after it). False: one at a time.
    overlap_commits: bool = True
    # A compacted topic holding the pipeline's keyed state (see the module's docstring); the
    # transform is then ``transform(batch_df, state_df) -> (output_df, updates_df)``.
    state_topic: str | None = None
    stats: list[BatchStats] = field(default_factory=list)
    # The transactional id's epoch, registered once (fencing every older incarnation) and kept:
    # a retried batch reuses it, as a Kafka producer keeps its epoch after an abortable error.
    # Registering again per batch would let a woken zombie fence its successor in turn. The
    # leases are held under it too.
    epoch: int | None = field(default=None, init=False)
    _workers: concurrent.futures.ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _on_committed: Callable[[BatchStats], None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.state_topic is None:
            return
        if not isinstance(self.state_topic, str) or self.state_topic in (self.source, self.sink):
            raise InvalidArgument(f"state_topic must be a topic of its own, not the source or the sink; "
                                  f"got {self.state_topic!r}")
        if not self.exactly_once:
            raise InvalidArgument("state_topic needs exactly_once=True: at-least-once batches would count "
                                  "a retried batch's state change twice")
        if not self.client.get_topic(self.state_topic).get("compacted"):  # UnknownTopic when absent
            raise InvalidArgument(f"state_topic {self.state_topic!r} is not compacted: create it with "
                                  f"create_topic(..., compacted=True)")
        self.overlap_commits = False  # a batch reads the state its predecessor committed

    def _read(self, epoch: int, on_leased: Callable[[BatchHandle], None] | None = None) -> tuple[Any, BatchHandle]:
        return read_batch(self.spark, self.client, self.source, self.subscription, self.batch_max_messages,
                          max_bytes=self.batch_max_bytes, holder=self.pipeline_id, epoch=epoch,
                          wait_s=POLL_CONTINUOUS_S if self.continuous else POLL_S,
                          lease_timeout_s=self.lease_timeout_s, on_leased=on_leased)

    def run_batch(self, batch: int) -> BatchStats | None:
        """One micro-batch in one transaction, committed; None when there was no input."""
        committing = self._run_batch(batch, None, overlap=False)
        if committing is None:
            return None
        committing.settle(overlapped=False)
        return committing.stats

    def _run_batch(self, batch: int, previous: _Committing | None, overlap: bool) -> _Committing | None:
        """One micro-batch in one transaction, its commit sent (``overlap``: on the pipeline's
        committer thread, else done here); None when there was no input. ``previous``, the last
        batch's commit still under way, is settled here whatever happens (``_settle``): this
        batch's input is leased and read, and its output written, meanwhile (chained leases, see
        ``raytxn.protocol.lease``), and it commits only after ``previous`` committed. A failed
        ``previous`` fails this batch too: its range goes out again first."""
        t0 = time.perf_counter()
        try:
            started = self._start_batch(batch, t0, previous, overlap)
        except BaseException as error:
            if previous is not None and not previous.settled:
                self._settle(previous, behind=error)
            raise
        if previous is not None and not previous.settled:  # no input: nothing waited for it
            self._settle(previous)
        return started

    def _start_batch(self, batch: int, t0: float, previous: _Committing | None, overlap: bool) -> _Committing | None:
        if self.epoch is None:
            self.epoch = self.client.register_transactional_id(self.pipeline_id)  # fences any zombie
        epoch = self.epoch
        if not self.exactly_once:
            if previous is not None:
                self._settle(previous)
            stats = self._run_batch_at_least_once(batch, t0, epoch)
            if stats is None:
                return None
            acked_at = t0 + stats.batch_s  # its plain acks are its commit: done with the batch
            return _Committing.done(stats, t0, acked_at, acked_at)
        # Leases first, so an idle poll begins no transaction; the transaction then begins while
        # the batch's DataFrame is planned (a coordinator round trip off the batch).
        begun: concurrent.futures.Future[Any] | None = None

        def begin(_handle: BatchHandle) -> None:
            nonlocal begun
            if previous is None:
                begun = self.client.new_transaction_async(self.txn_timeout_s, transactional_id=self.pipeline_id,
                                                          epoch=epoch)
            else:  # the transactional id's last txn may not be COMMITTING yet: begin once it is
                assert self._workers is not None
                begun = self._workers.submit(self._begin_after, previous, epoch)

        try:
            df, handle = self._read(epoch, on_leased=begin)
        except BaseException:
            if begun is not None:
                _abandon(begun)
            raise
        if handle.count == 0:
            return None
        assert begun is not None, "a non-empty lease begins the batch's transaction"
        try:
            txn = begun.result()
        except BaseException:
            handle.close()
            raise
        acked: concurrent.futures.Future[None] | None = None
        cached: list[Any] = []  # DataFrames persisted for this batch's writes, unpersisted after them
        try:
            out, updates = self._transformed(df)
            columns = set(out.columns)
            if "value" not in columns:
                raise ValueError("the transform's result needs a `value` column")
            # The input's acks travel while the Spark job writes the output (one round trip off
            # each batch). Sent after the transform is built, not before: a pipeline stalled in
            # its transform still loses its range when the lease times out; from here on, the
            # txn's timeout bounds a stall (an acked lease waits for its txn). A chained range's
            # ack is held by its subscription until ``previous`` ended.
            acked = handle.acknowledge_async(txn)
            if updates is not None:  # two writes of one plan: compute it once (see _persisted)
                out, updates = _persisted(out, updates, cached)
            rows_out = write(out, self.client, self.sink, txn, key_col="key" if "key" in columns else None,
                             properties_col="properties" if "properties" in columns else None,
                             writer_id=txn_writer_id(self.pipeline_id, epoch, txn.id), fault=self.write_fault)
            state_rows = 0 if updates is None else self._write_state(updates, txn, epoch)
            _unpersist(cached)
            if previous is not None:
                self._settle(previous, overlapped=True)  # raises when it failed: this batch aborts
            acked.result()
            if self.before_commit is not None:
                self.before_commit(batch)
            stats = BatchStats(batch, handle.rows_read(), rows_out, 0.0, 0.0, str(txn.id), 0, state_rows)
            sent = time.perf_counter()
            if overlap:
                assert self._workers is not None
                committing = _Committing(stats, self._workers.submit(_timed_commit, txn), t0, sent)
            else:
                # With a state topic, the next batch reads the state this one wrote: its commit
                # returns once applied, also where commits are answered once logged.
                committing = _Committing.done(stats, t0, sent, _timed_commit(txn, self.state_topic is not None))
            handle.close()  # (the acked leases end with the txn; closing releases none of them)
            return committing
        except BaseException:
            _unpersist(cached)
            if acked is not None:  # an ack still under way would reach its subscription after the abort
                concurrent.futures.wait([acked], timeout=self.client.deadline_s)
            if txn.state in UNENDED_STATES:
                try:
                    txn.abort()
                except RaytxnError:
                    pass  # it times out instead
            handle.close()
            raise

    def _transformed(self, df: Any) -> tuple[Any, Any]:
        """The transform's output and, with a state topic, its state updates (else None)."""
        if self.state_topic is None:
            return self.transform(df), None
        result = self.transform(df, self._state_df())
        if not (isinstance(result, tuple) and len(result) == 2):
            raise InvalidArgument("with a state_topic the transform returns (output_df, updates_df)")
        out, updates = result
        if not {"key", "value"} <= set(updates.columns):
            raise InvalidArgument(f"the state updates need `key` and `value` columns, got {updates.columns}")
        return out, updates

    def _state_df(self) -> Any:
        """The state topic's latest committed value of each key, read by one Spark task per
        partition straight from storage. Taken after the batch's txn began, so after the last
        batch's commit returned: its updates are in it (its commit returned once its markers were
        written, ``commit(until_applied=True)``)."""
        from raytxn.client.compaction import compacted_state

        assert self.state_topic is not None
        states = self.client.loop.run(compacted_state(self.client, self.state_topic))

        def read_states(batches: Any) -> Any:  # runs in Spark's Python workers
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from states[index].read().to_batches()

        return self.spark.range(0, len(states), 1, len(states)).mapInArrow(read_states, STATE_SCHEMA)

    def _write_state(self, updates: Any, txn: Any, epoch: int) -> int:
        """The batch's state updates into the state topic, in the batch's txn (a null value is
        written empty: a tombstone, the key's deletion)."""
        from pyspark.sql import functions as F

        rows = updates.select(F.col("key").cast("string").alias("key"), F.col("value").cast("binary").alias("value"))
        assert self.state_topic is not None
        return write(rows, self.client, self.state_topic, txn, key_col="key",
                     writer_id=txn_writer_id(self.pipeline_id, epoch, txn.id) + "-state")

    def _begin_after(self, previous: _Committing, epoch: int) -> Any:
        """The next txn of the transactional id, begun once ``previous`` is no longer OPEN at the
        coordinator (``ConcurrentTransactions`` until its commit request got there)."""
        for _ in range(MAX_BEGIN_ATTEMPTS):
            ended = previous.future.done()
            try:
                return self.client.new_transaction(self.txn_timeout_s, transactional_id=self.pipeline_id, epoch=epoch)
            except ConcurrentTransactions:
                if ended:
                    raise  # the last txn ended before this attempt: another one is open
                time.sleep(BEGIN_RETRY_S)
        raise ConcurrentTransactions(f"{self.pipeline_id}: the last batch's txn still open after "
                                     f"{MAX_BEGIN_ATTEMPTS} attempts to begin the next one")

    def _settle(self, committing: _Committing, behind: BaseException | None = None, overlapped: bool = False) -> None:
        """Wait for ``committing``'s commit (see ``_Committing.settle``); once it committed, count
        its batch. A ``Fenced`` commit raises (this incarnation must stop); any other failure
        raises unless ``behind`` (this batch's own error) is raised instead: either way the batch
        is tried again, from the failed one's range."""
        try:
            committing.settle(overlapped)
        except Fenced:
            raise
        except BaseException:
            if behind is None:
                raise
            return
        committing.stats.batch = len(self.stats)
        self.stats.append(committing.stats)
        if self._on_committed is not None:
            self._on_committed(committing.stats)

    def _run_batch_at_least_once(self, batch: int, t0: float, epoch: int) -> BatchStats | None:
        df, handle = self._read(epoch)
        try:
            if handle.count == 0:
                return None
            out = self.transform(df)
            rows_out = write(out, self.client, self.sink, None, key_col="key" if "key" in out.columns else None,
                             writer_id=f"{self.pipeline_id}-b{batch}")
            handle.acknowledge(None)
            return BatchStats(batch, handle.rows_read(), rows_out, time.perf_counter() - t0, 0.0, "-", 0)
        finally:
            handle.close()

    def run(self, max_batches: int | None = None, until_idle: bool = False,
            progress: bool = True) -> list[BatchStats]:
        """Run micro-batches (forever, ``max_batches`` of them, or until the input is drained);
        returns the committed batches' stats. With ``overlap_commits`` each batch commits while
        the next one runs, and the last commit is waited for before this returns."""
        from rich.progress import Progress

        with Progress(disable=not progress, transient=True) as bar, concurrent.futures.ThreadPoolExecutor(
                2, thread_name_prefix=f"pipeline-{self.pipeline_id}") as workers:
            task = bar.add_task(f"pipeline {self.pipeline_id}", total=max_batches)
            self._workers = workers
            self._on_committed = lambda result: bar.update(task, advance=1, description=(
                f"batch {result.batch}: {result.rows_in} in, {result.rows_out} out, {result.batch_s:.2f}s"))
            try:
                self._run_batches(max_batches, until_idle)
            finally:
                self._workers = self._on_committed = None
        return self.stats

    def _run_batches(self, max_batches: int | None, until_idle: bool) -> None:
        committing: _Committing | None = None  # the last batch, its commit under way
        try:
            while max_batches is None or len(self.stats) + (committing is not None) < max_batches:
                started = time.monotonic()
                committing = self._run_with_retries(len(self.stats) + (committing is not None), committing,
                                                    self.overlap_commits)
                if committing is None and until_idle:
                    break
                time.sleep(max(self.trigger_interval - (time.monotonic() - started), 0.0))
            if committing is not None:
                self._drain(committing)
        except BaseException as error:
            if committing is not None and not committing.settled:
                self._settle(committing, behind=error)
            raise

    def _drain(self, committing: _Committing) -> None:
        """Settle the last batch's commit; when it failed, its range is run again, committed before
        this returns."""
        try:
            self._settle(committing)
        except Fenced:
            raise
        except Exception:  # noqa: BLE001 - any failure but Fenced: its range went out again
            again = self._run_with_retries(len(self.stats), None, overlap=False)
            if again is not None:
                self._settle(again)

    def _run_with_retries(self, batch: int, previous: _Committing | None, overlap: bool) -> _Committing | None:
        """``_run_batch``, tried again (up to ``max_attempts``) after any failure but ``Fenced``
        (``previous`` is settled by the first attempt, whatever happens)."""
        for attempt in range(self.max_attempts):
            try:
                result = self._run_batch(batch, previous, overlap)
            except Fenced:
                raise  # a newer incarnation of this pipeline runs: this one must stop
            except Exception:
                if attempt + 1 >= self.max_attempts:
                    raise
                previous = None
                time.sleep(min(2.0, 0.2 * (attempt + 1)))
                continue
            if result is not None:
                result.stats.attempt = attempt
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")
