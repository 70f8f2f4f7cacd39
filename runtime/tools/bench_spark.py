"""Benchmark of the Spark-on-Ray pipeline: rows/s exactly-once (a transaction per micro-batch)
vs the same pipeline with plain sends and acks (at-least-once) on the same data, and batch
latency p50/p99."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable

import ray

import raytxn as rt
from raytxn.cluster import stop_engine


def _passthrough(df):
    return df.select("key", "value")


def bench_spark_pipeline(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    from raytxn.connectors import spark as sc

    if ray.is_initialized():
        stop_engine()
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-spark-')}")
    spark = sc.init_spark("raytxn-bench", **{"spark.sql.shuffle.partitions": "2"})
    rows_total = 6_000 if short else 40_000
    batch = 1_000 if short else 5_000
    results = {}
    try:
        for mode in ("warm-up", "at-least-once", "exactly-once", "at-least-once", "exactly-once"):
            run = uuid.uuid4().hex[:6]
            source, sink = f"bench-in-{run}", f"bench-out-{run}"
            client.create_topic(source, 2)
            client.create_topic(sink, 2)
            producer = client.create_producer(source)
            for i in range(batch if mode == "warm-up" else rows_total):
                producer.send_async(f"row-{i}".encode(), key=str(i))
            producer.flush()
            pipeline = sc.ExactlyOncePipeline(spark, client, source, "bench", sink, _passthrough, f"bench-{run}",
                                              batch_max_messages=batch, exactly_once=mode == "exactly-once")
            start = time.perf_counter()
            stats = pipeline.run(until_idle=True, progress=False)
            elapsed = time.perf_counter() - start
            if mode == "warm-up":  # Spark's first jobs are slow: measure on a warm session
                continue
            row = run_figures([s.rows_in for s in stats], [s.batch_s for s in stats], elapsed)
            # two interleaved rounds per mode: keep the better one (other load on 2 cores swings runs)
            if mode not in results or row["rows_per_s"] > results[mode]["rows_per_s"]:
                results[mode] = row
            progress(f"  {mode:14} {row}")
    finally:
        sc.stop_spark()
        client.close()
        stop_engine()
    return spark_rows(rows_total, batch, results)


def run_figures(rows_in: list[int], batch_seconds: list[float], elapsed_s: float) -> dict:
    """A run's figures from its batches' input rows and durations."""
    latencies = sorted(batch_seconds)
    return {"rows_per_s": round(sum(rows_in) / elapsed_s, 1), "batches": len(latencies),
            "p50_batch_s": round(latencies[len(latencies) // 2], 3),
            "p99_batch_s": round(latencies[int(len(latencies) * 0.99)], 3)}


def spark_rows(rows_total: int, batch: int, results: dict[str, dict]) -> list[dict]:
    """A row per mode ("at-least-once", "exactly-once": its best run's figures) and their ratio."""
    ratio = results["exactly-once"]["rows_per_s"] / results["at-least-once"]["rows_per_s"]
    return [{"bench": "spark_pipeline", "mode": mode, "rows": rows_total, "batch_max_messages": batch, **row}
            for mode, row in results.items()] + [{"bench": "spark_pipeline", "mode": "ratio",
                                                  "eo_over_alo": round(ratio, 3)}]
