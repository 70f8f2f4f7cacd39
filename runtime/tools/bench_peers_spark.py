"""The Spark rows of ``raytxn bench peers``: the same word count (``connectors/wordcount.py``) at
the same micro-batch size three ways, in one Spark-on-Ray session:

* **kafka**: Spark Structured Streaming's own Kafka source (``maxOffsetsPerTrigger`` = the batch
  size, ``availableNow``) on the real Kafka broker, each micro-batch's counts written back to
  Kafka by Spark's Kafka sink in ``foreachBatch`` (at-least-once: that sink has no transactions);
* **gateway**: the same query on raytxn topics through raytxn's Kafka gateway;
* **native**: ``ExactlyOncePipeline`` on raytxn (a transaction per micro-batch, exactly-once).

Same batches: Spark's Kafka source cuts ``maxOffsetsPerTrigger`` over the partitions at offset
granularity (each partition's share of the limit prorated by what it has left, rounded down);
``ExactlyOncePipeline`` cuts ``batch_max_messages`` at entry granularity (a range holds whole
entries: producer batches). So the pipeline's source is written in entries of a tenth of a
partition's share (``entry_messages``), and a batch then fills within an entry per partition of
the bound, as Spark's do. Each side's rows carry its ``batches`` and rows per batch, and a row
gets ``batches_differ`` when the sides did not run the same number of batches in a round (a
ratio of rows/s between sides is only fair at the same batch size).

Figures: rows/s over the batches' durations (Spark's ``triggerExecution`` of each micro-batch;
the pipeline's ``batch_s``, as ``bench spark`` takes them), the first micro-batch's latency and
the steady ones' median, and their ratio (the issue's target: first <= 2x steady). Each way runs
once unmeasured first (Spark's first jobs of a session compile code and load classes; its
first batch is kept as ``cold_first_batch_s``), then in rounds with the order rotated.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from raytxn.connectors.wordcount import sample_lines, wordcount
from raytxn.tools.bench_peers import SIDES, Sides, _rotated
from raytxn.tools.bench_spark import PARTITIONS, _Runner

CLIENTS = {"kafka": "Structured Streaming, Kafka source + sink in foreachBatch -> Kafka 4 broker",
           "gateway": "Structured Streaming, Kafka source + sink in foreachBatch -> raytxn gateway",
           "native": "ExactlyOncePipeline on raytxn"}
SINK_PARTITIONS = 2


def _fill(sides: Sides, side: str, lines: list[str]) -> tuple[str, str]:
    """A source topic of ``PARTITIONS`` holding ``lines`` (keyed by line number) and a sink."""
    from confluent_kafka import Producer

    source, sink = sides.topic(side, "spark-in", PARTITIONS), sides.topic(side, "spark-out", SINK_PARTITIONS)
    producer = Producer({"bootstrap.servers": sides.bootstrap(side), "enable.idempotence": True, "linger.ms": 5})
    for i, line in enumerate(lines):
        while True:
            try:
                producer.produce(source, line.encode(), key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(60):
        raise RuntimeError(f"filling {source}: messages left undelivered")
    return source, sink


def streaming_wordcount(spark: Any, bootstrap: str, source: str, sink: str, batch: int,
                        expected_rows: int) -> dict:
    """The word count as a Structured Streaming query on ``source`` until it has read everything
    there (``availableNow``), ``batch`` rows a micro-batch; its figures (module docstring)."""
    frame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", batch).load())

    def write(batch_frame: Any, _epoch: int) -> None:
        (wordcount(batch_frame).write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", sink).save())

    with tempfile.TemporaryDirectory(prefix="raytxn-bench-ss-") as checkpoint:
        start = time.perf_counter()
        query = (frame.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(600)
        wall = time.perf_counter() - start
        if query.isActive:
            query.stop()
            raise RuntimeError(f"Structured Streaming on {bootstrap}: not done in 600 s")
        if query.exception() is not None:
            raise RuntimeError(f"Structured Streaming on {bootstrap}: {query.exception()}")
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows_in = [p["numInputRows"] for p in batches]
    if sum(rows_in) != expected_rows:
        raise RuntimeError(f"Structured Streaming read {sum(rows_in)} rows of {expected_rows}")
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in batches]
    return _figures(rows_in, seconds, wall)


def entry_messages(batch: int) -> int:
    """The pipeline's source entries: a tenth of a partition's share of ``batch`` (module docstring)."""
    return max(1, batch // (PARTITIONS * 10))


def _figures(rows_in: list[int], batch_seconds: list[float], wall_s: float) -> dict:
    steady = statistics.median(batch_seconds[1:]) if len(batch_seconds) > 1 else None
    return {"rows_per_s": round(sum(rows_in) / sum(batch_seconds), 1),
            "wall_rows_per_s": round(sum(rows_in) / wall_s, 1),
            "batches": len(batch_seconds), "batch_rows": list(rows_in), "first_batch_s": round(batch_seconds[0], 3),
            "steady_batch_s": None if steady is None else round(steady, 3),
            "first_over_steady": None if steady is None else round(batch_seconds[0] / steady, 2)}


def pipeline_wordcount(runner: _Runner, batch: int) -> dict:
    """``ExactlyOncePipeline`` on fresh raytxn topics (``bench spark``'s runner), its figures."""
    from raytxn.connectors import spark as sc

    source, sink = runner.topics(PARTITIONS, entry_messages(batch))
    pipeline = sc.ExactlyOncePipeline(runner.spark, runner.client, source, "bench", sink, wordcount,
                                      f"bench-{source}", batch_max_messages=batch)
    start = time.perf_counter()
    stats = pipeline.run(until_idle=True, progress=False)
    wall = time.perf_counter() - start
    for topic in (source, sink):
        runner.client.delete_topic(topic)
    if sum(s.rows_in for s in stats) != len(runner.lines):
        raise RuntimeError("ExactlyOncePipeline lost or repeated rows")
    if max(s.rows_in for s in stats) > batch:
        raise RuntimeError(f"ExactlyOncePipeline passed batch_max_messages={batch}: {[s.rows_in for s in stats]}")
    return _figures([s.rows_in for s in stats], [s.batch_s for s in stats], wall)


def _run(side: str, sides: Sides, spark: Any, runner: _Runner, batch: int) -> dict:
    if side == "native":
        return pipeline_wordcount(runner, batch)
    source, sink = _fill(sides, side, runner.lines)
    try:
        return streaming_wordcount(spark, sides.bootstrap(side), source, sink, batch, len(runner.lines))
    finally:
        sides.drop_topics()


def bench_spark_peers(sides: Sides, rows_total: int, batch: int, rounds: int,
                      progress: Callable[[str], None]) -> list[dict]:
    """Rows per side (module docstring); a side that fails gets a row saying why, the others
    still run."""
    from raytxn.connectors import spark as sc
    from raytxn.tools.peers import spark_kafka_jars

    spark = sc.init_spark("raytxn-bench-peers", **{"spark.sql.shuffle.partitions": "2",
                                                   "spark.jars": ",".join(spark_kafka_jars())})
    runner = _Runner(sides.client, spark, sample_lines(rows_total))
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    cold: dict[str, float] = {}
    errors: dict[str, str] = {}
    try:
        for side in SIDES:  # Spark's first query of each kind compiles and loads classes
            try:
                cold[side] = _run(side, sides, spark, runner, batch)["first_batch_s"]
                progress(f"  spark warm-up {side}: first batch {cold[side]} s")
            except Exception as e:  # noqa: BLE001 - the row says why; the other sides still run
                errors[side] = f"{type(e).__name__}: {str(e)[:300]}"
                progress(f"  spark {side} failed: {errors[side]}")
        for round_ in range(rounds):
            for side in _rotated(round_):
                if side in errors:
                    continue
                runs[side].append(_run(side, sides, spark, runner, batch))
                progress(f"  spark round {round_ + 1} {side}: {runs[side][-1]}")
    finally:
        sc.stop_spark()
    if batches_differ(runs):
        progress(f"  spark: {batches_differ(runs)} (the rows say so: batches_differ)")
    return spark_peer_rows(rows_total, batch, runs, cold, errors)


def spark_peer_rows(rows_total: int, batch: int, runs: dict[str, list[dict]], cold: dict[str, float],
                    errors: dict[str, str]) -> list[dict]:
    """A row per side: medians over its rounds, ``over_kafka`` the median of the rounds' own
    ratios of rows/s to Kafka's (rounds are run side by side)."""
    rows = []
    for side in SIDES:
        row: dict = {"bench": "peers", "case": "spark word count", "side": side, "client": CLIENTS[side],
                     "rows": rows_total, "batch_rows": batch}
        mine = runs.get(side) or []
        if not mine:
            rows.append({**row, "error": errors.get(side, "not run")})
            continue
        for key in ("rows_per_s", "wall_rows_per_s", "batches", "first_batch_s", "steady_batch_s", "first_over_steady"):
            values = [r[key] for r in mine if r[key] is not None]
            row[key] = round(statistics.median(values), 3) if values else None
        base = runs.get("kafka") or []
        row["over_kafka"] = (round(statistics.median(a["rows_per_s"] / b["rows_per_s"]
                                                     for a, b in zip(mine, base, strict=False)), 3) if base else None)
        row["cold_first_batch_s"] = cold.get(side)
        row["rows_per_s_runs"] = [r["rows_per_s"] for r in mine]
        row["batches_runs"] = [r["batches"] for r in mine]
        row["batch_rows_max"] = max(max(r["batch_rows"]) for r in mine)
        rows.append(row)
    differ = batches_differ(runs)
    if differ:
        for row in rows:
            row["batches_differ"] = differ
    return rows


def batches_differ(runs: dict[str, list[dict]]) -> str | None:
    """Why the sides' rows/s do not compare at the same batch size (their batch counts differ in
    a round), or None when every side that ran ran as many batches as the others, round by round."""
    counts = {side: [r["batches"] for r in mine] for side, mine in runs.items() if mine}
    if len({tuple(c) for c in counts.values()}) <= 1:
        return None
    return "batches per round differ: " + ", ".join(f"{side} {c}" for side, c in counts.items())

