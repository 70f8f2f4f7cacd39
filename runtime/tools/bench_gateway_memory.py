"""The Kafka gateway's memory over a long consume (issue 57): ``bench_gateway_memory(short=False, **size)``.

One confluent-kafka consumer (assign mode, read_committed) reads ``messages`` messages of 100 B
through one gateway and goes on until ``minutes`` passed (at most ``max_minutes``), while the
gateway actor's memory (RSS, and USS: the pages it alone holds, without the object store's shared
pages that RSS counts) and open file descriptors are sampled every ``sample_s`` seconds (psutil on
the pid the gateway reports). The topic is filled first with ``fill`` messages, natively
(``send_batch``, the fastest producer); the consumer reads it from offset 0 to its end and,
partition by partition, seeks back to 0 and reads it again. Every pass is a real fetch of stored
entries: the gateway's cache of encoded batches (64 MiB) holds a small part of the topic, so each
pass encodes again most of what it serves, as a consumer of a long backlog makes it do.

"Flat" is what the row says: after a warm-up (``warmup_s``, in which the cache of encoded batches
fills), the least-squares slope of RSS over time is under ``FLAT_SLOPE_MIB_PER_MIN`` and the mean
RSS of the last window (``window_s``) is within ``FLAT_LAST_OVER_FIRST`` of the first window's
after the warm-up. The samples are written to ``series`` + ``.json`` with a chart (``.png``) of RSS
and descriptors over time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import ray

import raytxn as rt
from raytxn.errors import InvalidArgument
from raytxn.tools.bench_engine import local_engine_with_gateway

PAYLOAD = b"x" * 100
FILL_CALL = 100_000  # messages per send_batch call while filling
CONSUME_CALL = 1000
STALL_S = 60.0  # a consumer that gets nothing this long fails the bench
FLAT_SLOPE_MIB_PER_MIN = 1.0
FLAT_LAST_OVER_FIRST = 0.10
SIZES: dict[bool, dict[str, Any]] = {
    False: {"messages": 50_000_000, "minutes": 10.0, "fill": 5_000_000, "partitions": 4, "sample_s": 5.0,
            "warmup_s": 60.0, "window_s": 60.0, "max_minutes": 45.0, "series": "bench-results/gateway-memory"},
    True: {"messages": 300_000, "minutes": 0.0, "fill": 30_000, "partitions": 4, "sample_s": 0.25, "warmup_s": 1.0,
           "window_s": 1.0, "max_minutes": 5.0, "series": "bench-results/gateway-memory"},
}


def _fill(client: rt.Client, topic: str, count: int, progress: Callable[[str], None]) -> float:
    """``count`` messages into ``topic`` with ``send_batch``; msgs/s."""
    producer = client.create_producer(topic)
    values = pa.array([PAYLOAD] * min(count, FILL_CALL), type=pa.binary())
    t0, sent = time.perf_counter(), 0
    while sent < count:  # bounded: each turn sends at least one message
        batch = values if count - sent >= len(values) else values.slice(0, count - sent)
        producer.send_batch(batch)
        sent += len(batch)
        if sent % (10 * FILL_CALL) == 0:
            progress(f"  filled {sent:,} of {count:,}")
    producer.flush()
    producer.close()
    return count / (time.perf_counter() - t0)


class Sampler(threading.Thread):
    """Samples a process's RSS and open descriptors every ``every_s`` seconds, with the messages
    consumed so far (``consumed`` is set by the consumer's loop)."""

    def __init__(self, pid: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.process, self.every_s = psutil.Process(pid), every_s
        self.samples: list[dict[str, float]] = []
        self.consumed = 0
        self.t0 = time.monotonic()
        self._done = threading.Event()

    def sample(self) -> None:
        memory = self.process.memory_full_info()  # rss, and uss: the pages only this process holds
        self.samples.append({"t_s": round(time.monotonic() - self.t0, 3), "rss_mib": round(memory.rss / 2**20, 2),
                             "uss_mib": round(memory.uss / 2**20, 2), "fds": self.process.num_fds(),
                             "consumed": self.consumed})

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.sample()


def _consume(bootstrap: str, topic: str, partitions: int, ends: list[int], messages: int, not_before: float,
             deadline: float, sampler: Sampler) -> int:
    """Read ``messages`` messages of ``topic`` (partition p holds offsets 0..ends[p]-1), each
    partition from 0 to its end and again from 0 (a seek), and on until ``not_before``; or until
    ``deadline`` (both monotonic); returns the messages read."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raytxn-bench-unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.list_topics(topic, timeout=STALL_S)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, last_progress = 0, time.monotonic()
    try:
        while (got < messages or time.monotonic() < not_before) and time.monotonic() < deadline:
            batch = consumer.consume(CONSUME_CALL, timeout=0.5)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_S:
                raise RuntimeError(f"the gateway consumer got nothing for {STALL_S:.0f} s ({got:,} read)")
            for message in batch:
                if message.error() is not None:
                    raise RuntimeError(f"confluent-kafka consumer: {message.error()}")
                if message.offset() == ends[message.partition()] - 1:  # this partition's end: again from 0
                    consumer.seek(TopicPartition(topic, message.partition(), 0))
            got += len(batch)
            sampler.consumed = got
    finally:
        consumer.close()
    return got


def slope_per_minute(samples: list[dict[str, float]], key: str) -> float:
    """The least-squares slope of ``key`` over time (per minute) of ``samples``; 0 for fewer than two."""
    if len(samples) < 2:
        return 0.0
    ts = [s["t_s"] / 60 for s in samples]
    ys = [s[key] for s in samples]
    mean_t, mean_y = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mean_t) ** 2 for t in ts)
    return 0.0 if var == 0 else sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, ys, strict=True)) / var


def _mean(samples: list[dict[str, float]], key: str, when: Callable[[float], bool]) -> float:
    picked = [s[key] for s in samples if when(s["t_s"])]
    return sum(picked) / len(picked)


def memory_row(samples: list[dict[str, float]], warmup_s: float, window_s: float, consumed: int, seconds: float,
               fill: int, fetch_cache: dict[str, int], series: str) -> dict[str, Any]:
    """The row of one run: ``samples`` (every sample of the run) judged after ``warmup_s``."""
    steady = [s for s in samples if s["t_s"] >= warmup_s] or samples[-1:]
    end = steady[-1]["t_s"]
    first_mean = _mean(steady, "rss_mib", lambda t: t < steady[0]["t_s"] + window_s)
    last_mean = _mean(steady, "rss_mib", lambda t: t > end - window_s)
    slope = slope_per_minute(steady, "rss_mib")
    return {"bench": "gateway_memory", "messages": consumed, "fill": fill, "warmup_s": warmup_s,
            "seconds": round(seconds, 1),
            "msgs_per_s": round(consumed / seconds, 1), "samples": len(samples),
            "rss_start_mib": samples[0]["rss_mib"], "rss_first_window_mib": round(first_mean, 1),
            "rss_last_window_mib": round(last_mean, 1), "rss_max_mib": max(s["rss_mib"] for s in samples),
            "slope_mib_per_min": round(slope, 3), "last_over_first": round(last_mean / first_mean, 3),
            # USS: without the object store's shared pages a large fetch maps in (RSS counts them)
            "uss_first_window_mib": round(_mean(steady, "uss_mib", lambda t: t < steady[0]["t_s"] + window_s), 1),
            "uss_last_window_mib": round(_mean(steady, "uss_mib", lambda t: t > end - window_s), 1),
            "uss_slope_mib_per_min": round(slope_per_minute(steady, "uss_mib"), 3),
            "fds_start": int(samples[0]["fds"]), "fds_end": int(samples[-1]["fds"]),
            "fds_max": int(max(s["fds"] for s in samples)),
            "fetch_cache_mib": round(fetch_cache.get("held_bytes", 0) / 2**20, 1),
            "flat": abs(slope) < FLAT_SLOPE_MIB_PER_MIN and abs(last_mean / first_mean - 1) <= FLAT_LAST_OVER_FIRST,
            "series": series}


def write_series(samples: list[dict[str, float]], row: dict[str, Any], prefix: Path) -> None:
    """The samples as JSON and a chart of RSS and descriptors over time, at ``prefix`` .json/.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps({"row": row, "samples": samples}, indent=1))
    minutes = [s["t_s"] / 60 for s in samples]
    fig, (ax_rss, ax_fds) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[3, 1])
    ax_rss.plot(minutes, [s["rss_mib"] for s in samples], color="tab:blue", label="RSS")
    ax_rss.plot(minutes, [s["uss_mib"] for s in samples], color="tab:green", label="USS (its own pages)")
    ax_rss.set_ylabel("gateway memory (MiB)")
    ax_rss.set_ylim(bottom=0)
    ax_rss.axvline(row["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    ax_rss.legend(loc="lower right")
    ax_rss.set_title(f"Kafka gateway over a consume of {row['messages']:,} messages: slope "
                     f"{row['slope_mib_per_min']} MiB/min after warm-up, last/first window {row['last_over_first']}")
    ax_fds.plot(minutes, [s["fds"] for s in samples], color="tab:orange")
    ax_fds.set_ylabel("open fds")
    ax_fds.set_xlabel("minutes")
    ax_fds.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(prefix.with_suffix(".png"), dpi=100)
    plt.close(fig)


def bench_gateway_memory(short: bool = False, progress: Callable[[str], None] = print, **size: Any) -> list[dict]:
    """The bench (module docstring); ``size``: any of ``SIZES``' keys, over the defaults of ``short``."""
    unknown = sorted(set(size) - set(SIZES[short]))
    if unknown:
        raise InvalidArgument(f"bench gateway-memory has no size {', '.join(unknown)}; "
                              f"it has {', '.join(SIZES[short])}")
    size = {**SIZES[short], **size}
    messages, fill, partitions = int(size["messages"]), int(size["fill"]), int(size["partitions"])
    if not 0 < fill <= messages or partitions < 1:
        raise InvalidArgument(f"bench gateway-memory needs 0 < fill <= messages and partitions >= 1, got {size}")
    with local_engine_with_gateway("raytxn-bench-gateway-memory-") as (client, gateway):
        topic = f"bench-gateway-memory-{time.monotonic_ns()}"
        client.create_topic(topic, partitions)
        rate = _fill(client, topic, fill, progress)
        progress(f"  filled {fill:,} messages natively at {rate:,.0f} msgs/s")
        ends = _ends(gateway["bootstrap"], topic, partitions)
        if sum(ends) != fill:
            raise RuntimeError(f"the topic holds {sum(ends):,} messages, not the {fill:,} filled")
        sampler = Sampler(gateway["pid"], float(size["sample_s"]))
        sampler.sample()
        sampler.start()
        t0 = time.monotonic()
        try:
            consumed = _consume(gateway["bootstrap"], topic, partitions, ends, messages,
                                t0 + float(size["minutes"]) * 60, t0 + float(size["max_minutes"]) * 60, sampler)
        finally:
            sampler.stop()
        seconds = time.monotonic() - t0
        stats = ray.get(gateway["actor"].stats.remote())
    series = str(size["series"])
    row = memory_row(sampler.samples, float(size["warmup_s"]), float(size["window_s"]), consumed, seconds, fill,
                     stats["batches"].get("fetch_cache", {}), series)
    write_series(sampler.samples, row, Path(series))
    progress(f"  consumed {consumed:,} in {seconds:.0f} s ({row['msgs_per_s']:,.0f} msgs/s): RSS "
             f"{row['rss_first_window_mib']} -> {row['rss_last_window_mib']} MiB, slope {row['slope_mib_per_min']} "
             f"MiB/min, fds {row['fds_start']} -> {row['fds_end']}: {'flat' if row['flat'] else 'NOT flat'}")
    return [row]


def _ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's high watermark, asked of the gateway."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raytxn-bench-unused"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=STALL_S)[1]
                for p in range(partitions)]
    finally:
        consumer.close()
