"""Exactly-once micro-batches from raytxn topics through Spark (on Ray, via RayDP) to raytxn topics.

``read_batch`` takes the next batch of the subscription (``raytxn.connectors.batches.read_messages``: per
partition a contiguous range from the subscription's cursor) and returns it as a Spark DataFrame
(moved Ray -> Spark with ``Dataset.to_spark``) and a handle that acknowledges exactly that range,
cumulatively per partition, inside a transaction. The consumer is closed after the batch ends, so
an aborted batch is read again, in order, from the same cursor.

``ExactlyOncePipeline`` runs micro-batches: register ``pipeline_id`` as a transactional id (a
zombie of the same pipeline, e.g. a driver that was thought dead, is fenced and its open
transaction aborted), begin a transaction, read a batch, transform it, write the result from the
Spark tasks inside the transaction, acknowledge the input in it, commit. An exception aborts the
transaction and the batch is tried again; a restarted pipeline resumes where the last commit left
off, because the input's cursor only moves when a batch commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raytxn.client.transaction import UNENDED_STATES
from raytxn.connectors.batches import BatchHandle, read_messages, to_arrow
from raytxn.connectors.spark import write
from raytxn.errors import Fenced, RaytxnError

__all__ = ["BATCH_SCHEMA", "BatchHandle", "BatchStats", "ExactlyOncePipeline", "read_batch"]

# The Spark DDL of raytxn.connectors.batches.batch_arrow_schema(); `properties` is a JSON string (see there).
BATCH_SCHEMA = ("key string, value binary, properties string, event_time long, "
                "publish_time long, topic string, partition int, message_id string")


def read_batch(spark: Any, client: Any, topic: str, subscription: str, max_messages: int | None = 1000,
               until_caught_up: bool = False, idle_timeout_s: float = 1.0, consumer_name: str | None = None,
               attach_deadline_s: float = 120.0) -> tuple[Any, BatchHandle]:
    """A DataFrame (columns: key, value, properties, event_time, publish_time, topic, partition,
    message_id) of the next messages of ``subscription`` and the handle acknowledging them."""
    rows, handle = read_messages(client, topic, subscription, max_messages, until_caught_up, idle_timeout_s,
                                 consumer_name, attach_deadline_s)
    return _to_spark(spark, rows), handle


def _to_spark(spark: Any, rows: list[dict[str, Any]]) -> Any:
    """Ray -> Spark: the batch becomes a Ray Dataset (one Arrow block) and then a DataFrame."""
    import ray

    if not rows:
        return spark.createDataFrame([], BATCH_SCHEMA)
    return ray.data.from_arrow(to_arrow(rows)).to_spark(spark)


@dataclass
class BatchStats:
    batch: int
    rows_in: int
    rows_out: int
    batch_s: float
    commit_s: float
    txn: str
    attempt: int


@dataclass
class ExactlyOncePipeline:
    spark: Any
    client: Any
    source: str
    subscription: str
    sink: str
    transform: Callable[[Any], Any]
    pipeline_id: str
    batch_max_messages: int = 1000
    trigger_interval: float = 0.0
    txn_timeout_s: float = 120.0
    max_attempts: int = 5
    write_fault: Callable[[int, int, int], None] | None = None  # passed to ``write`` (tests)
    before_commit: Callable[[int], None] | None = None  # called with the batch number (tests, demos)
    exactly_once: bool = True  # False: plain sends and acks, at-least-once (for comparison only)
    stats: list[BatchStats] = field(default_factory=list)
    # The transactional id's epoch, registered once (fencing every older incarnation) and kept:
    # a retried batch reuses it, as a Kafka producer keeps its epoch after an abortable error.
    # Registering again per batch would let a woken zombie fence its successor in turn.
    epoch: int | None = field(default=None, init=False)

    def run_batch(self, batch: int) -> BatchStats | None:
        """One micro-batch in one transaction; None when there was no input."""
        t0 = time.perf_counter()
        if not self.exactly_once:
            return self._run_batch_at_least_once(batch, t0)
        if self.epoch is None:
            self.epoch = self.client.register_transactional_id(self.pipeline_id)  # fences any zombie
        epoch = self.epoch
        txn = self.client.new_transaction(self.txn_timeout_s, transactional_id=self.pipeline_id, epoch=epoch)
        handle = None
        try:
            df, handle = read_batch(self.spark, self.client, self.source, self.subscription,
                                    self.batch_max_messages, consumer_name=f"{self.pipeline_id}")
            if handle.count == 0:
                txn.abort()
                return None
            out = self.transform(df)
            columns = set(out.columns)
            if "value" not in columns:
                raise ValueError("the transform's result needs a `value` column")
            rows_out = write(out, self.client, self.sink, txn, key_col="key" if "key" in columns else None,
                             properties_col="properties" if "properties" in columns else None,
                             writer_id=f"{self.pipeline_id}-e{epoch}-b{batch}", fault=self.write_fault)
            handle.acknowledge(txn)
            if self.before_commit is not None:
                self.before_commit(batch)
            t_commit = time.perf_counter()
            txn.commit()
            commit_s = time.perf_counter() - t_commit
            return BatchStats(batch, handle.count, rows_out, time.perf_counter() - t0, commit_s, str(txn.id), 0)
        except BaseException:
            if txn.state in UNENDED_STATES:
                try:
                    txn.abort()
                except RaytxnError:
                    pass  # it times out instead
            raise
        finally:
            if handle is not None:
                handle.close()

    def _run_batch_at_least_once(self, batch: int, t0: float) -> BatchStats | None:
        df, handle = read_batch(self.spark, self.client, self.source, self.subscription, self.batch_max_messages,
                                consumer_name=f"{self.pipeline_id}")
        try:
            if handle.count == 0:
                return None
            out = self.transform(df)
            rows_out = write(out, self.client, self.sink, None, key_col="key" if "key" in out.columns else None,
                             writer_id=f"{self.pipeline_id}-b{batch}")
            handle.acknowledge(None)
            return BatchStats(batch, handle.count, rows_out, time.perf_counter() - t0, 0.0, "-", 0)
        finally:
            handle.close()

    def run(self, max_batches: int | None = None, until_idle: bool = False,
            progress: bool = True) -> list[BatchStats]:
        """Run micro-batches (forever, ``max_batches`` of them, or until the input is drained)."""
        from rich.progress import Progress

        batch = len(self.stats)
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task(f"pipeline {self.pipeline_id}", total=max_batches)
            while max_batches is None or batch < max_batches:
                attempt = 0
                while True:
                    try:
                        result = self.run_batch(batch)
                        break
                    except Fenced:
                        raise  # a newer incarnation of this pipeline runs: this one must stop
                    except Exception:
                        attempt += 1
                        if attempt >= self.max_attempts:
                            raise
                        time.sleep(min(2.0, 0.2 * attempt))
                if result is None:
                    if until_idle:
                        break
                    time.sleep(max(self.trigger_interval, 0.2))
                    continue
                result.attempt = attempt
                self.stats.append(result)
                bar.update(task, advance=1, description=(
                    f"batch {batch}: {result.rows_in} in, {result.rows_out} out, {result.batch_s:.2f}s"))
                batch += 1
                if self.trigger_interval:
                    time.sleep(self.trigger_interval)
        return self.stats
