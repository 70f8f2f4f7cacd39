"""This machine's ceiling for the produce path, measured the way the engine would work at best:
one bare Ray actor ingesting prebuilt batches of encoded 100 B messages, appending each batch to
a file and fsyncing it, with a few batches in flight from one driver. No batching, encoding,
routing, dedup or ledger framing: the Ray round trip, the copy and the fsync only. Every produce
throughput is reported as a ratio to it, measured in the same run (single runs on a shared
2-core machine swing 20%)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import ray

MESSAGE_BYTES = 100
BATCH_MESSAGES = 1000
IN_FLIGHT = 4


@ray.remote(num_cpus=0)
class CeilingSink:
    """Appends each batch to one file and fsyncs it before answering."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "ab")

    def ingest(self, batch: list[bytes]) -> int:
        self._file.write(b"".join(batch))
        self._file.flush()
        os.fsync(self._file.fileno())
        return len(batch)


def measure_ceiling(messages: int, batch_messages: int = BATCH_MESSAGES, in_flight: int = IN_FLIGHT) -> float:
    """Messages per second a bare actor ingests (on the running Ray), prebuilt batches of
    ``batch_messages`` with up to ``in_flight`` outstanding calls."""
    batch = [os.urandom(MESSAGE_BYTES) for _ in range(batch_messages)]
    with tempfile.TemporaryDirectory(prefix="raytxn-ceiling-") as directory:
        sink = CeilingSink.remote(os.path.join(directory, "ingest.bin"))
        ray.get(sink.ingest.remote(batch[:1]))  # started and warm
        batch_ref = ray.put(batch)  # prebuilt: the driver does no work per batch but the call
        outstanding: list[ray.ObjectRef] = []
        ingested = 0
        start = time.perf_counter()
        for _ in range(0, messages, batch_messages):
            if len(outstanding) >= in_flight:
                done, outstanding = ray.wait(outstanding, num_returns=1)
                ingested += sum(ray.get(done))
            outstanding.append(sink.ingest.remote(batch_ref))
        ingested += sum(ray.get(outstanding))
        elapsed = time.perf_counter() - start
        ray.kill(sink)
    return ingested / elapsed


def ceiling_row(messages: int, rates: list[float]) -> dict:
    return {"bench": "ceiling", "message_bytes": MESSAGE_BYTES, "batch_messages": BATCH_MESSAGES,
            "in_flight": IN_FLIGHT, "messages_per_run": messages, "msgs_per_s": max(round(r) for r in rates),
            "runs": [round(r) for r in rates]}


def bench_ceiling(short: bool = False, progress: Callable[[str], None] = print) -> list[dict]:
    """The ceiling alone (``raytxn bench ceiling``): the best of three runs."""
    if not ray.is_initialized():
        ray.init(logging_level="ERROR")
    messages = 100_000 if short else 1_000_000
    rates = []
    for _ in range(3):
        rates.append(measure_ceiling(messages))
        progress(f"  ceiling {rates[-1]:12,.0f} msgs/s")
    return [ceiling_row(messages, rates)]
