"""SeaweedFS S3 in place of file:// (``raytxn bench s3``): the client hot paths' figures on an
engine over S3, each as a ratio to the same figure on an engine over file://, measured in
alternating rounds of one run (target: S3 / file >= 0.5 for every figure).

The figures are those of the produce, commit and subscription benches, on one partition:
- produce throughput in the ``plain``, ``txn`` and ``batch`` modes (``bench_produce._produce``);
- (begin, 1 send, commit) latency p50, chained (``bench_commit``); its ratio is file over S3, so
  that above 1 is better there too;
- consume + individual ack, plain (``bench_subscription._consume``).

SeaweedFS runs on this machine (``raytxn.tools.seaweedfs``), sharing its two cores with the
engine: an S3 put costs a local HTTP request and SeaweedFS's own write, not a network's latency.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.tools.bench import _percentile
from raytxn.tools.bench_commit import _time_txns, warm_txn_producer
from raytxn.tools.bench_produce import _engine, _produce
from raytxn.tools.bench_subscription import consume_rate
from raytxn.tools.seaweedfs import start_seaweedfs

PRODUCE_MODES = ("plain", "txn", "batch")
FIGURES = (*(f"produce {mode}" for mode in PRODUCE_MODES), "commit p50", "consume plain")
TARGET = 0.5


def bench_s3(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    sizes = {"produce": 30_000 if short else 200_000, "commit": 60 if short else 400,
             "consume": 20_000 if short else 100_000}
    rounds = 1 if short else 2
    measured: dict[str, dict[str, list[float]]] = {b: {f: [] for f in FIGURES} for b in ("file", "s3")}
    server = start_seaweedfs()
    try:
        server.create_bucket("raytxn-bench")
        for round_ in range(rounds):
            order = ("file", "s3") if round_ % 2 == 0 else ("s3", "file")
            for backend in order:
                if backend == "file":
                    client = _engine()
                else:
                    stop_engine()
                    client = rt.connect(storage=server.url("raytxn-bench", f"run-{time.time_ns()}"),
                                        storage_options=server.storage_options())
                try:
                    figures = _figures(client, sizes)
                finally:
                    client.close()
                    stop_engine()
                for figure, value in figures.items():
                    measured[backend][figure].append(value)
                progress(f"  {backend:4} " + ", ".join(f"{f} {v:,.1f}" for f, v in figures.items()))
    finally:
        server.stop()
    rows = s3_rows(sizes, measured)
    for row in rows:
        progress(f"  {row['figure']}: S3/file {row['s3_over_file']} (target >= {TARGET})")
    return rows


def _figures(client: rt.Client, sizes: dict[str, int]) -> dict[str, float]:
    """One round on one engine: msgs/s of each produce mode and of plain consume, and the
    chained commit latency p50 in ms."""
    figures = {}
    for mode in PRODUCE_MODES:
        topic = f"bench-s3-{mode}-{time.monotonic_ns()}"
        client.create_topic(topic, 1)
        figures[f"produce {mode}"] = _produce(client, topic, sizes["produce"], mode=mode)
        client.delete_topic(topic)
    topic = f"bench-s3-commit-{time.monotonic_ns()}"
    producer = warm_txn_producer(client, topic, 10)
    whole: list[float] = []
    _time_txns(client, producer, sizes["commit"], whole, [], [])
    figures["commit p50"] = _percentile(sorted(whole), 0.5)
    client.delete_topic(topic)
    figures["consume plain"] = consume_rate(client, "plain", sizes["consume"])
    return figures


def s3_rows(sizes: dict[str, int], measured: dict[str, dict[str, list[float]]]) -> list[dict]:
    """A row per figure: every round's value on each backend, the best of each (the least
    disturbed round: highest rate, lowest latency), and S3's best over file's (file's over S3's
    for the latency)."""
    rows = []
    for figure in FIGURES:
        latency = figure.endswith("p50")
        pick = min if latency else max
        best_file, best_s3 = pick(measured["file"][figure]), pick(measured["s3"][figure])
        rows.append({"bench": "s3", "figure": figure, "unit": "ms" if latency else "msgs/s",
                     "size": sizes[figure.split()[0]],
                     "file": round(best_file, 3), "s3": round(best_s3, 3),
                     "s3_over_file": round(best_file / best_s3 if latency else best_s3 / best_file, 3),
                     "target": f">= {TARGET}",
                     "file_rounds": [round(v, 3) for v in measured["file"][figure]],
                     "s3_rounds": [round(v, 3) for v in measured["s3"][figure]]})
    return rows
