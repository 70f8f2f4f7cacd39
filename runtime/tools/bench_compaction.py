"""Benchmark of compaction, table views and keyed state (issue 58): ``bench_compaction(short=False)``.

In one run, on one engine, each figure beside its floor:

* **compact**: the first compaction of a partition of N records over K keys (``compact_partition``,
  everything below ``max_read_position``), as records per second, beside a plain sequential read
  of the same ledger through the bulk path (``read_range_async``, Arrow columns key and value),
  after an untimed read that puts the ledger's objects in the page cache for both. Target: at
  least 0.5 of it.
* **table view ready**: ``Client.table_view`` of a compacted topic of T keys, from the call to a
  view holding every key. Target: at most 2 s here.
* **stateful word count**: ``StatefulPipeline`` with the running word count (state read and
  written per batch) beside the same pipeline with a stateless transform (each batch's counts
  only, no state updates) on the same rows. Target: at least 0.7 of it.

Each is the best of ``rounds`` runs: single runs on this shared machine swing 20%.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import ray

import raytxn as rt
from raytxn.cluster import stop_engine
from raytxn.ids import NAMESPACE, Position

PAYLOAD = b"v" * 100


def _produce(client: rt.Client, topic: str, count: int, keys: int) -> None:
    producer = client.create_producer(topic, batching_max_messages=1000)
    for i in range(count):
        producer.send_async(PAYLOAD, key=f"k{i % keys}")
    producer.flush()


def _compact_once(client: rt.Client, count: int, keys: int) -> tuple[float, float]:
    """(compacted records/s, sequentially read records/s) of one fresh partition."""
    from raytxn.client.compaction import partition_plan, storage_of
    from raytxn.ledger.compacted import compact_partition
    from raytxn.ledger.ranges import read_range_async

    topic = f"bench-compact-{time.monotonic_ns()}"
    client.create_topic(topic)
    _produce(client, topic, count, keys)
    plan = client.loop.run(partition_plan(client, topic, 0))
    storage = storage_of(client)

    async def read() -> list[Any]:
        return await read_range_async(storage, topic, 0, Position(0, 0), plan.max_read, plan.aborted,
                                      columns=["key", "value"])

    asyncio.run(read())  # a warm-up: both timed reads below then meet the objects in the page cache
    t0 = time.perf_counter()
    batches = asyncio.run(read())
    read_s = time.perf_counter() - t0
    assert sum(b.num_rows for b in batches) == count
    t0 = time.perf_counter()
    result = asyncio.run(compact_partition(storage, topic, 0, plan.max_read, plan.aborted, int(time.time() * 1000)))
    compact_s = time.perf_counter() - t0
    assert result.horizon.records == keys
    client.delete_topic(topic)
    return count / compact_s, count / read_s


def _table_view_ready_s(client: rt.Client, keys: int) -> float:
    topic = f"bench-table-{time.monotonic_ns()}"
    client.create_topic(topic)
    _produce(client, topic, keys, keys)
    client.compact(topic)
    t0 = time.perf_counter()
    with client.table_view(topic) as view:
        ready_s = time.perf_counter() - t0
        assert len(view) == keys
    client.delete_topic(topic)
    return ready_s


def _stateless_wordcount(rows: list[dict[str, Any]], state: Mapping[str, bytes]) -> tuple[list, dict]:
    counts = Counter(word for row in rows for word in row["value"].decode().split(" "))
    return [(word, str(n).encode()) for word, n in counts.items()], {}


def _wordcount_rate(client: rt.Client, lines: list[str], transform: Callable[..., Any], batch: int) -> float:
    from raytxn.connectors.stateful import POLL_S, StatefulPipeline

    stamp = time.monotonic_ns()
    source, sink, state = (f"bench-wc-{name}-{stamp}" for name in ("src", "sink", "state"))
    for topic in (source, sink, state):
        client.create_topic(topic)
    producer = client.create_producer(source, batching_max_messages=100)
    for line in lines:
        producer.send_async(line.encode())
    producer.flush()
    pipeline = StatefulPipeline(client, source, "wc", sink, state, transform, f"bench-wc-{stamp}",
                                batch_max_messages=batch)
    t0 = time.perf_counter()
    try:
        stats = pipeline.run(until_idle=True)
    finally:
        pipeline.close()
    elapsed = time.perf_counter() - t0 - POLL_S  # the last, empty poll is not work
    assert sum(s.rows_in for s in stats) == len(lines)
    client.delete_topics([source, sink, state])
    return len(lines) / elapsed


def bench_compaction(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    from raytxn.connectors.wordcount import running_wordcount, sample_lines

    records, keys, table_keys, line_count, rounds = ((100_000, 1_000, 10_000, 2_000, 2) if short
                                                     else (1_000_000, 10_000, 100_000, 20_000, 2))
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-compaction-')}")
    compact: list[float] = []
    read: list[float] = []
    ready: list[float] = []
    stateful: list[float] = []
    stateless: list[float] = []
    lines = sample_lines(line_count)
    try:
        for round_ in range(rounds):
            rate, floor = _compact_once(client, records, keys)
            compact.append(rate)
            read.append(floor)
            ready.append(_table_view_ready_s(client, table_keys))
            # alternate which goes first, so neither always meets a warmer engine
            order = [("stateful", running_wordcount), ("stateless", _stateless_wordcount)]
            for name, transform in order if round_ % 2 == 0 else order[::-1]:
                (stateful if name == "stateful" else stateless).append(
                    _wordcount_rate(client, lines, transform, batch=max(1, line_count // 20)))
            progress(f"  round {round_ + 1}/{rounds}: compact {compact[-1]:.0f} vs read {read[-1]:.0f} records/s, "
                     f"table view of {table_keys} keys ready in {ready[-1]:.2f} s, word count stateful "
                     f"{stateful[-1]:.0f} vs stateless {stateless[-1]:.0f} lines/s")
    finally:
        client.close()
        stop_engine()
        if started_ray:
            ray.shutdown()
    return compaction_rows(records, keys, compact, read, table_keys, ready, line_count, stateful, stateless)


def compaction_rows(records: int, keys: int, compact: list[float], read: list[float], table_keys: int,
                    ready_s: list[float], lines: int, stateful: list[float], stateless: list[float]) -> list[dict]:
    """The bench's rows: each figure (the best round) beside its floor or target."""
    best_compact, best_read = max(compact), max(read)
    return [
        {"bench": "compaction", "case": "compact", "records": records, "keys": keys,
         "records_per_s": round(best_compact, 1), "sequential_read_records_per_s": round(best_read, 1),
         "ratio": round(best_compact / best_read, 3), "target": ">= 0.5",
         "runs": [round(r) for r in compact]},
        {"bench": "compaction", "case": "table view ready", "records": table_keys, "keys": table_keys,
         "seconds": round(min(ready_s), 3), "target": "<= 2 s", "runs": [round(s, 3) for s in ready_s]},
        {"bench": "compaction", "case": "stateful word count", "records": lines, "keys": 8,
         "records_per_s": round(max(stateful), 1), "stateless_records_per_s": round(max(stateless), 1),
         "ratio": round(max(stateful) / max(stateless), 3), "target": ">= 0.7",
         "runs": [round(r) for r in stateful]},
    ]
