"""Benchmark of Ray Data's ``read_topic`` on the bulk path beside its ceiling from the same run:
``ray.data.read_parquet`` of the same rows (same columns, same number of files as chunks).
Both read into Arrow blocks and count the rows (``materialize``); each keeps its best of
interleaved rounds, since other load on a 2-core machine swings single runs by 20%."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable

import ray

import raytxn as rt
from raytxn.cluster import stop_engine

PARTITIONS = 4
VALUE_BYTES = 100


def ray_data_rows(rows_total: int, best: dict[str, float]) -> list[dict]:
    """A row per reader (its best rows/s) and the ratio ``read_topic`` / ``read_parquet``."""
    rows = [{"bench": "ray_data", "reader": reader, "partitions": PARTITIONS, "rows": rows_total,
             "rows_per_s": round(rate, 1)} for reader, rate in best.items()]
    ratio = best["read_topic"] / best["read_parquet"]
    return [*rows, {"bench": "ray_data", "reader": "ratio", "topic_over_parquet": round(ratio, 3)}]


def bench_ray_data(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    from raytxn.connectors.ray_data import read_topic

    if ray.is_initialized():
        stop_engine()
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-ray-data-')}")
    rows_total = 50_000 if short else 1_000_000
    topic = f"bench-rd-{uuid.uuid4().hex[:6]}"
    best: dict[str, float] = {}
    try:
        client.create_topic(topic, PARTITIONS)
        producer = client.create_producer(topic)
        payload = b"x" * (VALUE_BYTES - 12)
        for i in range(rows_total):
            producer.send_async(b"%012d" % i + payload, key=str(i))
        producer.flush()
        with tempfile.TemporaryDirectory(prefix="raytxn-bench-parquet-") as parquet_dir:
            ds, handle = read_topic(client, topic, "copy", holder="bench-copy")
            ds.write_parquet(parquet_dir)  # the same rows and columns, for the ceiling
            handle.close()

            def timed(reader: str, read: Callable[[], int]) -> None:
                start = time.perf_counter()
                count = read()
                rate = count / (time.perf_counter() - start)
                assert count == rows_total, f"{reader} read {count} of {rows_total} rows"
                progress(f"  {reader:13} {rate:,.0f} rows/s")
                best[reader] = max(best.get(reader, 0.0), rate)

            def from_topic() -> int:
                ds, handle = read_topic(client, topic, "bench", holder="bench")
                try:
                    return ds.materialize().count()
                finally:
                    handle.close()  # never acknowledged: the next round reads the same rows

            for _ in range(2 if short else 3):
                timed("read_topic", from_topic)
                timed("read_parquet", lambda: ray.data.read_parquet(parquet_dir).materialize().count())
    finally:
        client.close()
        stop_engine()
    return ray_data_rows(rows_total, best)
