"""Benchmarks, one function per subject, each returning rows (dicts) that end up in one JSON file.

Run them with ``raytxn bench <name>`` or ``python examples/benchmark.py <name>``. ``short=True``
sizes a run for a CI smoke test; the full size is for the numbers quoted in issue notes.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from raytxn.ledger import LedgerConfig, ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.txnlog import EndAction


async def _ledger_case(url: str, options: dict, record_size: int, group_commit: bool, appends: int,
                       concurrency: int) -> tuple[list[float], float, int]:
    """(latency of every append in s, seconds of the whole run, object puts it made)."""
    storage = Storage.from_url(url, **options)
    stream = f"bench/{record_size}-{'gc' if group_commit else 'single'}-{time.monotonic_ns()}"
    ml = await ManagedLedger.open(storage, stream, LedgerConfig(group_commit=group_commit))
    record = os.urandom(record_size)
    latencies: list[float] = []
    per_worker = appends // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            t0 = time.perf_counter()
            await ml.append([record])
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    elapsed = time.perf_counter() - start
    puts = 0
    for info in ml.ledgers:
        puts += len(await storage.list(f"streams/{stream}/ledgers/{info.ledger_id:012d}"))
    return latencies, elapsed, puts


def ledger_row(backend: str, record_size: int, group_commit: bool, concurrency: int, latencies_s: list[float],
               elapsed_s: float, puts: int) -> dict:
    done = len(latencies_s)
    latencies = sorted(latencies_s)
    return {
        "bench": "ledger", "backend": backend, "record_bytes": record_size,
        "mode": "group-commit" if group_commit else "put-per-append",
        "appends": done, "concurrency": concurrency, "seconds": round(elapsed_s, 3),
        "appends_per_s": round(done / elapsed_s, 1),
        "mb_per_s": round(done * record_size / elapsed_s / 1e6, 3),
        "puts": puts, "entries_per_put": round(done / max(puts, 1), 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
    }


def bench_ledger(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """Appends/s and MB/s for 100 B and 10 KiB records on file:// and SeaweedFS S3, with group
    commit (64 concurrent appenders) and with one put per append."""
    from raytxn.tools.seaweedfs import start_seaweedfs

    rows: list[dict] = []
    server = start_seaweedfs()
    try:
        server.create_bucket("raytxn-bench")
        targets = {
            "file": (f"file://{tempfile.mkdtemp(prefix='raytxn-bench-')}", {}),
            "s3": (server.url("raytxn-bench", f"run-{time.time_ns()}"), server.storage_options()),
        }
        scale = 0.1 if short else 1.0
        for backend, (url, options) in targets.items():
            for record_size in (100, 10 * 1024):
                for group_commit in (True, False):
                    base = 20_000 if record_size == 100 else 5_000
                    appends = int((base if group_commit else base // 10) * scale)
                    concurrency = 64 if group_commit else 1
                    measured = asyncio.run(_ledger_case(url, options, record_size, group_commit,
                                                        max(appends, concurrency), concurrency))
                    row = ledger_row(backend, record_size, group_commit, concurrency, *measured)
                    progress(f"  {backend:4} {record_size:>6} B {row['mode']:15} "
                             f"{row['appends_per_s']:>10.0f} appends/s {row['mb_per_s']:>8.2f} MB/s")
                    rows.append(row)
    finally:
        server.stop()
    return rows


def _ensure_ray() -> None:
    import ray

    from raytxn.ids import NAMESPACE

    if not ray.is_initialized():
        ray.init(namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


async def _txn_throughput(handle: object, txns: int, concurrency: int) -> float:
    async def loop(n: int) -> None:
        for _ in range(n):
            txn = await handle.new_txn.remote(60_000, "bench")
            await handle.end_txn.remote(txn, EndAction.COMMIT, "bench", None)

    start = time.perf_counter()
    await asyncio.gather(*[loop(txns // concurrency) for _ in range(concurrency)])
    return (txns // concurrency) * concurrency / (time.perf_counter() - start)


async def _commit_latencies(handle: object, txns: int, partitions: list[tuple[str, int]]) -> list[float]:
    latencies = []
    for _ in range(txns):
        txn = await handle.new_txn.remote(60_000, "bench")
        if partitions:
            await handle.add_partitions.remote(txn, partitions, "bench", None)
        t0 = time.perf_counter()
        await handle.end_txn.remote(txn, EndAction.COMMIT, "bench", None)
        latencies.append((time.perf_counter() - t0) * 1000)
    return sorted(latencies)


def bench_coordinator(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """new_txn + commit per second with the batched log writer on and off (64 concurrent
    clients), and commit latency p50/p99 with no participants and with 2 participants."""
    import ray

    from raytxn.cluster import start_coordinators, stop_actor
    from raytxn.config import CoordinatorConfig, EngineConfig
    from raytxn.ids import coordinator_actor_name, partition_actor_name
    from raytxn.tools.testing import start_participant

    _ensure_ray()
    rows: list[dict] = []
    txns = 400 if short else 5000
    samples = 50 if short else 500
    for batched in (True, False):
        config = EngineConfig(storage_url=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-tc-')}",
                              coordinator=CoordinatorConfig(num_coordinators=1, batched_log=batched))
        (handle,) = start_coordinators(config)
        names = [partition_actor_name("bench", p) for p in range(2)]
        participants = [start_participant(n) for n in names]
        try:
            ray.get([p.calls.remote() for p in participants])
            rate = asyncio.run(_txn_throughput(handle, txns, 64))
            mode = "batched" if batched else "unbatched"
            rows.append(coordinator_rate_row(mode, txns, rate))
            progress(f"  {mode:9} new_txn+commit: {rate:8.0f} txns/s")
            for parts in (0, 2):
                lat = asyncio.run(_commit_latencies(handle, samples, [("bench", p) for p in range(parts)]))
                row = coordinator_latency_row(mode, parts, lat)
                progress(f"  {mode:9} commit with {parts} participants: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
                rows.append(row)
        finally:
            stop_actor(coordinator_actor_name(0))
            for name in names:
                stop_actor(name)
    return rows


def coordinator_rate_row(log_writer: str, txns: int, txns_per_s: float) -> dict:
    return {"bench": "coordinator", "log_writer": log_writer, "case": "new_txn+commit, 64 clients",
            "txns": txns, "txns_per_s": round(txns_per_s, 1)}


def coordinator_latency_row(log_writer: str, participants: int, sorted_latencies_ms: list[float]) -> dict:
    return {"bench": "coordinator", "log_writer": log_writer, "case": f"commit latency, {participants} participants",
            "txns": len(sorted_latencies_ms), "p50_ms": round(_percentile(sorted_latencies_ms, 0.5), 3),
            "p99_ms": round(_percentile(sorted_latencies_ms, 0.99), 3)}


def _lazy(module: str, name: str) -> Callable[..., list[dict]]:
    def run(**kwargs: object) -> list[dict]:
        import importlib

        return getattr(importlib.import_module(module), name)(**kwargs)
    run.__doc__ = f"{module}.{name}"
    return run


BENCHMARKS: dict[str, Callable[..., list[dict]]] = {
    "ledger": bench_ledger,
    "coordinator": bench_coordinator,
    "ceiling": _lazy("raytxn.tools.bench_ceiling", "bench_ceiling"),
    "produce": _lazy("raytxn.tools.bench_produce", "bench_produce"),
    "commit": _lazy("raytxn.tools.bench_commit", "bench_commit"),
    "recovery": _lazy("raytxn.tools.bench_produce", "bench_recovery"),
    "partition-memory": _lazy("raytxn.tools.bench_produce", "bench_partition_memory"),
    "crash-recovery": _lazy("raytxn.tools.bench_produce", "bench_crash_recovery"),
    "subscription": _lazy("raytxn.tools.bench_subscription", "bench_subscription"),
    "spark": _lazy("raytxn.tools.bench_spark", "bench_spark_pipeline"),
    "ray-data": _lazy("raytxn.tools.bench_ray_data", "bench_ray_data"),
    "auth": _lazy("raytxn.tools.bench_auth", "bench_auth"),
    "scale": _lazy("raytxn.tools.bench_scale", "bench_scale"),
    "kafka": _lazy("raytxn.tools.bench_kafka", "bench_kafka"),
    "gateways": _lazy("raytxn.tools.bench_gateways", "bench_gateways"),
    "gateway-memory": _lazy("raytxn.tools.bench_gateway_memory", "bench_gateway_memory"),
    "compaction": _lazy("raytxn.tools.bench_compaction", "bench_compaction"),
    "s3": _lazy("raytxn.tools.bench_s3", "bench_s3"),
    "soak": _lazy("raytxn.tools.bench_soak", "bench_soak"),
    "peers": _lazy("raytxn.tools.bench_peers", "bench_peers"),
    "aio": _lazy("raytxn.tools.bench_aio", "bench_aio"),
    "console": _lazy("raytxn.tools.bench_console", "bench_console"),
}


# The extras a benchmark needs beyond `bench` (which every run needs, for the chart): `raytxn bench`
# checks them before it starts, so a missing one is named at once, not after minutes of others.
BENCH_EXTRAS: dict[str, tuple[str, ...]] = {"spark": ("spark",), "kafka": ("kafka",), "gateways": ("kafka",),
                                            "gateway-memory": ("kafka",),
                                            "peers": ("kafka", "spark"), "aio": ("serve",),
                                            "console": ("console",)}


def required_extras(names: list[str]) -> list[str]:
    """The extras the benchmarks ``names`` need, `bench` first."""
    return list(dict.fromkeys(["bench", *(extra for name in names for extra in BENCH_EXTRAS.get(name, ()))]))


# The size options (``raytxn bench NAME --size KEY=VALUE``) of the benchmarks that take some.
SIZE_OPTIONS: dict[str, tuple[str, ...]] = {
    "gateways": ("rounds", "messages"),
    "gateway-memory": ("messages", "minutes", "fill", "partitions", "sample_s", "warmup_s", "window_s",
                       "max_minutes", "series"),
    "soak": ("minutes", "feed_per_s", "fault_interval_s", "seed", "warmup_s", "interval_s", "storage"),
    "peers": ("rounds", "messages", "seconds", "samples", "eos_messages", "spark", "spark_rows", "spark_batch",
              "kafka_bootstrap"),
    "aio": ("rounds", "messages", "samples"),
    "console": ("topics", "txns", "rounds"),
}


def parse_sizes(pairs: list[str], names: list[str]) -> dict[str, object]:
    """``["rounds=3", "spark=false", "kafka_bootstrap=127.0.0.1:9092"]`` -> their values: ints,
    floats, booleans, else strings. ``ValueError`` names a pair without ``=``, a key that the
    benchmark (one of ``names``, the only one run) has no size option for."""
    if pairs and len(names) != 1:
        raise ValueError("--size is for one benchmark at a time")
    known = SIZE_OPTIONS.get(names[0], ()) if names else ()
    sizes: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--size takes KEY=VALUE, got {pair!r}")
        if key not in known:
            raise ValueError(f"bench {names[0]} has no size {key!r}"
                             + (f"; it has {', '.join(known)}" if known else ""))
        value: object = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    continue
        sizes[key] = value
    return sizes


def write_results(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    write_chart(rows, out.with_suffix(".png"))


# --- tables ------------------------------------------------------------------------------------


def cell(value: object) -> str:
    """How a figure reads in a table: lists and dicts as JSON, as in the results file."""
    if isinstance(value, list | dict):
        return json.dumps(value)
    return "" if value is None else str(value)


def result_tables(rows: list[dict]) -> list[Table]:
    """One table per kind of row: a bench's rows that have the same fields. A bench may return
    rows of several kinds (the subscription bench: throughputs, their ratios, a recovery time, a
    memory ratio), and a table whose columns came from one kind would leave the others' figures
    out. The ``bench`` field is the title."""
    kinds: dict[tuple[object, ...], list[dict]] = {}
    for row in rows:
        kinds.setdefault((row.get("bench"), *row), []).append(row)
    tables = []
    for members in kinds.values():
        table = Table(title=f"bench {members[0].get('bench', '?')}", title_justify="left")
        columns = [key for key in members[0] if key != "bench"]
        for key in columns:
            numeric = all(isinstance(r[key], int | float) and not isinstance(r[key], bool) for r in members)
            table.add_column(key, justify="right" if numeric else "left", no_wrap=True)
        for row in members:
            table.add_row(*(cell(row[key]) for key in columns))
        tables.append(table)
    return tables


def render_results(rows: list[dict]) -> str:
    """The result tables as plain text, each as wide as its widest row needs: a figure is never
    wrapped or cut (a narrower terminal wraps the line instead, and a copy keeps every figure)."""
    out = io.StringIO()
    console = Console(file=out, width=10_000, color_system=None)
    for table in result_tables(rows):
        console.print(table, width=console.measure(table).maximum)
    return out.getvalue()


# --- chart -------------------------------------------------------------------------------------

_LATENCY_PAIRS = (("p50_ms", "p99_ms", "ms"), ("p50_batch_s", "p99_batch_s", "s"))


def _is_measurement(key: str, value: object) -> bool:
    return (key.endswith(("_per_s", "_ms", "_s", "_mb")) or isinstance(value, float | list | dict)
            or isinstance(value, bool))


def _labels(rows: list[dict]) -> list[str]:
    """``bench`` plus the fields that tell a bench's rows apart: its descriptive fields (those
    before the first measurement) that vary, minus any not needed to keep the labels unique
    (e.g. ledger's ``concurrency`` follows from its ``mode``)."""
    labels = [""] * len(rows)
    by_bench: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_bench.setdefault(str(row.get("bench", "?")), []).append(i)
    for bench, indexes in by_bench.items():
        keys: list[str] = []
        for i in indexes:
            for key, value in rows[i].items():
                if _is_measurement(key, value):
                    break
                if key != "bench" and key not in keys:
                    keys.append(key)
        keys = [k for k in keys if len({repr(rows[i].get(k)) for i in indexes}) > 1]

        def unique(candidate: list[str], indexes: list[int] = indexes) -> bool:
            return len({tuple(repr(rows[i].get(k)) for k in candidate) for i in indexes}) == len(indexes)

        for key in reversed(list(keys)):
            if unique([k for k in keys if k != key]):
                keys.remove(key)
        for i in indexes:
            parts = [str(v) if isinstance(v := rows[i].get(k), str) else f"{k}={v}" for k in keys if k in rows[i]]
            labels[i] = " ".join([bench, *parts])
    return labels


def chart_series(rows: list[dict]) -> tuple[list[tuple[str, float]], list[tuple[str, float, float, str]]]:
    """(throughput bars: label, value) and (latency bars: label, p50, p99, unit) of the rows. A
    row's throughput is each of its ``*_per_s`` fields, except MB/s when it has an item rate."""
    labels = _labels(rows)
    throughput: list[tuple[str, float]] = []
    latency: list[tuple[str, float, float, str]] = []
    for label, row in zip(labels, rows, strict=True):
        rates = [k for k, v in row.items() if k.endswith("_per_s") and isinstance(v, int | float)]
        if len(rates) > 1:
            rates = [k for k in rates if k != "mb_per_s"]
        for key in rates:
            throughput.append((f"{label} [{key}]", float(row[key])))
        for p50, p99, unit in _LATENCY_PAIRS:
            if isinstance(row.get(p50), int | float) and isinstance(row.get(p99), int | float):
                latency.append((label, float(row[p50]), float(row[p99]), unit))
    return throughput, latency


def write_chart(rows: list[dict], out: Path) -> None:
    """A PNG with a throughput panel (one bar per row and rate) and a latency panel (p50 and p99
    per row); log scales, since the benchmarks' rates and latencies span orders of magnitude."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or a cluster node
    import matplotlib.pyplot as plt

    throughput, latency = chart_series(rows)
    # Latencies in seconds are drawn in ms, so that both units share one axis.
    latency_ms = [(f"{label} (per batch)" if unit == "s" else label, p50 * (1000 if unit == "s" else 1),
                   p99 * (1000 if unit == "s" else 1)) for label, p50, p99, unit in latency]
    heights = [max(1.5, 0.28 * len(throughput) + 1), max(1.5, 0.4 * len(latency_ms) + 1)]
    fig, (ax_t, ax_l) = plt.subplots(2, 1, figsize=(12, sum(heights) + 1), height_ratios=heights)
    if throughput:
        names, values = zip(*throughput, strict=True)
        ax_t.barh(range(len(values)), values, color="tab:blue")
        ax_t.set_yticks(range(len(values)), names, fontsize=7)
        ax_t.set_xscale("log")
        ax_t.invert_yaxis()
    else:
        ax_t.text(0.5, 0.5, "no throughput rows", ha="center", va="center", transform=ax_t.transAxes)
    ax_t.set_title("Throughput (per second, log scale)")
    if latency_ms:
        names, p50s, p99s = zip(*latency_ms, strict=True)
        ys = range(len(names))
        ax_l.barh([y - 0.2 for y in ys], p50s, height=0.4, label="p50", color="tab:green")
        ax_l.barh([y + 0.2 for y in ys], p99s, height=0.4, label="p99", color="tab:red")
        ax_l.set_yticks(list(ys), names, fontsize=7)
        ax_l.set_xscale("log")
        ax_l.invert_yaxis()
        ax_l.legend(fontsize=7)
    else:
        ax_l.text(0.5, 0.5, "no latency rows", ha="center", va="center", transform=ax_l.transAxes)
    ax_l.set_title("Latency (ms, log scale)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
