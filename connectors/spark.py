"""Spark on Ray (RayDP) reading from and writing to raytxn topics exactly once.

- ``init_spark`` / ``stop_spark``: Spark on the Ray cluster the client is connected to, with the
  JDK 17 ``--add-opens`` flags RayDP's Spark->Ray path needs and ``PYSPARK_PYTHON`` set to this
  environment's Python, so nobody has to know either.
- ``write``: every row of a DataFrame produced inside a transaction, in parallel from the Spark
  tasks themselves (each task reaches the partition actors; nothing funnels through the driver).
  Each task is one producer named ``<writer_id>-s<spark partition>`` whose sequence ids count the
  rows it sent to each topic partition, in the partition's deterministic row order. A retried task
  (or a zombie attempt) re-sends the same (producer, sequence ids) and the partition's dedup drops
  the replay.
- ``read_batch`` and ``ExactlyOncePipeline`` (with ``BatchHandle``, ``BatchStats``,
  ``BATCH_SCHEMA``): defined in ``raytxn.connectors.spark_pipeline``, exported here too, so one
  import serves a Spark job: ``from raytxn.connectors import spark as sc``.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from raytxn.extras import import_extra

if TYPE_CHECKING:
    from raytxn.connectors.spark_pipeline import BATCH_SCHEMA, BatchHandle, BatchStats, ExactlyOncePipeline, read_batch

__all__ = ["BATCH_SCHEMA", "BatchHandle", "BatchStats", "ExactlyOncePipeline", "init_spark", "read_batch",
           "stop_spark", "task_slots", "write"]
# spark_pipeline imports this module (for ``write``), so its names load on first use (PEP 562),
# whichever of the two modules is imported first.
_PIPELINE_NAMES = frozenset({"BATCH_SCHEMA", "BatchHandle", "BatchStats", "ExactlyOncePipeline", "read_batch"})


def __getattr__(name: str) -> Any:
    if name in _PIPELINE_NAMES:
        return getattr(importlib.import_module("raytxn.connectors.spark_pipeline"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PIPELINE_NAMES})

JDK17_OPENS = " ".join(
    f"--add-opens={module}=ALL-UNNAMED" for module in (
        "java.base/java.lang", "java.base/java.math", "java.base/java.net", "java.base/java.text",
        "java.base/java.util", "java.base/java.util.concurrent", "java.base/java.nio", "java.base/sun.nio.ch",
        "java.sql/java.sql"))
_JAVA_OPTION_KEYS = ("spark.ray.raydp_app_master.extraJavaOptions", "spark.driver.extraJavaOptions",
                     "spark.executor.extraJavaOptions")

_session: Any = None


def init_spark(app_name: str = "raytxn", num_executors: int = 1, executor_cores: int = 1,
               executor_memory: str = "1g", **configs: str) -> Any:
    """Start Spark on Ray (once; later calls return the same session). ``configs`` are Spark
    settings, e.g. ``**{"spark.sql.shuffle.partitions": "4"}``.

    ``spark.sql.shuffle.partitions`` defaults to twice the executors' cores, not Spark's 200: a
    micro-batch's shuffle (a word count's groupBy) otherwise runs 200 tasks on a core or two,
    which made the README's 200-line pipeline take a minute."""
    global _session
    if _session is not None:
        return _session
    raydp = import_extra("raydp", "spark")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    merged = dict(configs)
    for key in _JAVA_OPTION_KEYS:
        merged[key] = f"{merged[key]} {JDK17_OPENS}" if key in merged else JDK17_OPENS
    merged.setdefault("spark.task.maxFailures", "4")
    merged.setdefault("spark.speculation", "false")  # one attempt at a time per task
    merged.setdefault("spark.sql.shuffle.partitions", str(2 * num_executors * executor_cores))
    # The console progress bar redraws with carriage returns, which Ray forwards to the driver as
    # endless "(pid=...)" fragments.
    merged.setdefault("spark.ui.showConsoleProgress", "false")
    if not ray.is_initialized():
        from raytxn.ids import NAMESPACE

        ray.init(namespace=NAMESPACE, logging_level=logging.WARNING)
    _session = raydp.init_spark(app_name, num_executors, executor_cores, executor_memory, configs=merged)
    _session.sparkContext.setLogLevel("ERROR")
    return _session


def task_slots(spark: Any) -> int:
    """How many tasks the executors run at once: instances x cores / cpus per task, from the
    session's settings (RayDP sets them), else ``defaultParallelism`` (which is at least 2, even
    on one core). A Python task costs Spark about 80 ms here before its code runs, so a Python
    stage with more tasks than slots only queues them: one task per slot reads the same rows
    sooner."""
    conf = spark.sparkContext.getConf()
    instances = conf.get("spark.executor.instances")
    if instances is None:  # dynamic allocation, or a local master: Spark's own guess
        return max(1, int(spark.sparkContext.defaultParallelism))
    cores = int(conf.get("spark.executor.cores", "1"))
    per_task = max(1, int(conf.get("spark.task.cpus", "1")))
    return max(1, int(instances) * cores // per_task)


def stop_spark() -> None:
    """Stop Spark on Ray (a no-op when it is not running)."""
    global _session
    if _session is None:
        return
    raydp = import_extra("raydp", "spark")

    raydp.stop_spark()
    _session = None


# --- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteSpec:
    """Everything a Spark task needs to produce into the txn (it pickles to the executors)."""

    topic: str
    partitions: int
    txn: Any                    # TxnID
    owner: str
    epoch: int | None
    num_coordinators: int
    writer_id: str
    key_col: str | None
    value_col: str
    properties_col: str | None
    event_time_col: str | None
    batch_rows: int
    send_timeout_s: float
    ray_address: str            # the driver's cluster: workers join exactly that one
    token: str | None = None    # the driver's client token (auth on): tasks produce as its principal


def write_spec(client: Any, topic: str, txn: Any, key_col: str | None, value_col: str, properties_col: str | None,
               event_time_col: str | None, writer_id: str | None, batch_rows: int) -> WriteSpec:
    """The spec of one write into ``txn`` (``None``: plain sends), which must still be open."""
    if txn is not None:
        txn.check_open()
    info = client.get_topic(topic)
    return WriteSpec(topic, info["partitions"], txn.id if txn is not None else None, client.owner,
                     txn.epoch if txn is not None else None,
                     client.config.coordinator.num_coordinators, writer_id or f"w-{uuid.uuid4().hex[:12]}",
                     key_col, value_col, properties_col, event_time_col, batch_rows, client.deadline_s,
                     ray.get_runtime_context().gcs_address, client.token)


def write(df: Any, client: Any, topic: str, txn: Any, key_col: str | None = None, value_col: str = "value",
          properties_col: str | None = None, event_time_col: str | None = None, writer_id: str | None = None,
          batch_rows: int = 1000, fault: Callable[[int, int, int], None] | None = None) -> int:
    """Produce every row of ``df`` to ``topic`` inside ``txn`` (``None``: plain sends, still
    deduplicated per task), from the Spark tasks; returns the
    number of rows. ``value_col`` holds bytes or str; ``key_col`` routes (murmur2, as a Kafka
    producer would); ``writer_id`` names the producers (default: unique per call; pipelines pass
    one per txn). A ``writer_id`` must not outlive its txn: a write in another txn under it would
    have its rows taken for replays of the first one's and dropped, also after an abort.
    ``fault(spark_partition, attempt, rows_sent)`` is called after each
    batch a task sent: tests raise from it to fail a task midway."""
    spec = write_spec(client, topic, txn, key_col, value_col, properties_col, event_time_col, writer_id, batch_rows)
    columns = [c for c in (key_col, value_col, properties_col, event_time_col) if c is not None]
    # A retried task must meet its rows in the same order (sequence ids are row counts): rows
    # after a shuffle arrive in fetch order, so sort within each partition first. The set of rows
    # in a partition is deterministic (hash partitioning); the sort makes their order so too.
    sortable = [c for c in (key_col, value_col, event_time_col) if c is not None]
    counts = df.select(*columns).sortWithinPartitions(*sortable).rdd.mapPartitionsWithIndex(
        lambda index, rows: _write_partition(spec, index, rows, fault)).collect()
    return sum(counts)


def _properties(value: Any) -> dict[str, Any]:
    """A properties column holds a map or a JSON object string (see spark_pipeline.BATCH_SCHEMA)."""
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        return dict(json.loads(value)) if value else {}
    return dict(value)


def _worker_connect(address: str) -> None:
    """Spark's Python workers join the driver's Ray cluster, once per worker process."""
    if not ray.is_initialized():
        from raytxn.ids import NAMESPACE

        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)


def _write_partition(spec: WriteSpec, index: int, rows: Iterable[Any],
                     fault: Callable[[int, int, int], None] | None) -> Iterator[int]:
    from pyspark import TaskContext

    _worker_connect(spec.ray_address)
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    yield produce_slice(spec, index, attempt, rows, fault)


def produce_slice(spec: WriteSpec, index: int, attempt: int, rows: Iterable[Any],
                  fault: Callable[[int, int, int], None] | None) -> int:
    """Produce one slice of the rows (``row[column]`` lookups: Spark Rows or dicts) as the producer
    ``<writer_id>-s<index>``; returns the number of rows sent. The caller guarantees that every
    attempt at slice ``index`` meets the same rows in the same order: the sequence ids count rows
    per topic partition, so a retried attempt re-sends the same (producer, sequence ids) and the
    partition drops what it already has. ``fault(index, attempt, rows_sent)`` runs after each append."""
    from raytxn.client.coordinator_client import CoordinatorClient
    from raytxn.client.rpc import ActorRef
    from raytxn.hashing import partition_for
    from raytxn.ids import partition_actor_name
    from raytxn.protocol.entry_format import MessageRecord, encode_message

    producer = f"{spec.writer_id}-s{index}"
    coordinators = CoordinatorClient(spec.num_coordinators, spec.owner, spec.send_timeout_s, spec.token)
    registered: set[int] = set()
    next_sequence = [0] * spec.partitions
    pending: dict[int, list[bytes]] = {}  # encoded MessageRecords
    sent = 0

    def register(partitions: list[int]) -> None:
        """The coordinator must know a partition before data of the txn lands on it; one call
        (one txn-log write) registers every partition given."""
        new = [p for p in partitions if p not in registered]
        if spec.txn is not None and new:
            coordinators.add_partitions(spec.txn, [(spec.topic, p) for p in new], spec.epoch)
            registered.update(new)

    def flush(p: int) -> None:
        nonlocal sent
        batch = pending.pop(p, [])
        if not batch:
            return
        register([p])
        first = next_sequence[p]
        next_sequence[p] += len(batch)
        ActorRef(partition_actor_name(spec.topic, p), spec.token).call(
            "append", producer, first, batch, spec.txn, deadline_s=spec.send_timeout_s)
        sent += len(batch)
        if fault is not None:
            fault(index, attempt, sent)

    for row_index, row in enumerate(rows):
        value = row[spec.value_col]  # None: empty, Kafka's null value (a tombstone on a compacted topic)
        value = b"" if value is None else value.encode() if isinstance(value, str) else bytes(value)
        key = row[spec.key_col] if spec.key_col else None
        key = None if key is None else str(key)
        properties = _properties(row[spec.properties_col]) if spec.properties_col else {}
        event_time = row[spec.event_time_col] if spec.event_time_col else None
        p = partition_for(key, spec.partitions) if key is not None else (index + row_index) % spec.partitions
        record = MessageRecord(value, key, {str(k): str(v) for k, v in properties.items()},
                               None if event_time is None else int(event_time))
        pending.setdefault(p, []).append(encode_message(record))
        if len(pending[p]) >= spec.batch_rows:
            flush(p)
    register(sorted(pending))  # what is left goes out now: register it in one call, not one each
    for p in sorted(pending):
        flush(p)
    return sent
