"""Benchmark of ``raytxn.aio``: ``bench_aio(short=False, rounds=, messages=, samples=) -> rows``.

* Throughput of the asyncio API as a ratio to the sync API on the same messages, one client,
  interleaved rounds (which goes first alternates): produce (``send_async`` per message then
  ``flush``, against ``await send_nowait`` then ``await flush``, each onto the same topic) and
  consume (``receive`` + plain ``acknowledge`` per message, against their awaited forms, each from
  a new subscription of the same topic, so both read the same messages). Target: async/sync >= 0.9.
* A Ray Serve replica's latency for a trivial request (a handle call of a method returning at
  once) while its consumer waits on an empty topic (``await receive(timeout=5)`` in a loop), as a
  ratio to the same replica's latency with no consumer running, in interleaved rounds. Target:
  <= 2. Beside it, for reference, the same replica while a sync ``receive`` with a short timeout
  holds its loop: what the target guards against.

A ratio is given over the best rounds and as the median of the rounds' own ratios. Runs a whole
engine on a file:// store in a temporary directory, on the Ray this process is connected to, or
on a fresh local one that it stops at the end; Serve runs there without its HTTP proxy and is
shut down at the end.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray

import raytxn as rt
from raytxn import aio
from raytxn.cluster import stop_engine
from raytxn.errors import Timeout
from raytxn.ids import NAMESPACE

PAYLOAD = b"x" * 100
WAIT_RECEIVE_S = 5.0  # the waiting consumer's receive timeout
SYNC_RECEIVE_S = 0.2  # the reference's sync receive: short, so the run stays short
QUIET = {"log_level": "WARNING", "enable_access_log": False}  # not a line per request on the driver's output
SIZES = {True: {"rounds": 2, "messages": 5_000, "samples": 30},
         False: {"rounds": 5, "messages": 200_000, "samples": 300}}


def bench_aio(short: bool = False, progress: Callable[[str], None] = print, rounds: int | None = None,
              messages: int | None = None, samples: int | None = None) -> list[dict]:
    size = SIZES[short]
    rounds = size["rounds"] if rounds is None else rounds
    messages = size["messages"] if messages is None else messages
    samples = size["samples"] if samples is None else samples
    started_ray = not ray.is_initialized()
    if started_ray:  # a fresh local Ray of our own (never someone else's cluster)
        ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, logging_level="ERROR")
    client = rt.connect(storage=f"file://{tempfile.mkdtemp(prefix='raytxn-bench-aio-')}")
    try:
        rows = _throughput(client, messages, rounds, progress)
        rows += _serve_latency(client, samples, rounds, progress)
    finally:
        client.close()
        stop_engine()
        if started_ray:
            ray.shutdown()
    return rows


# --- throughput --------------------------------------------------------------------------------


def _produce_sync(client: rt.Client, topic: str, count: int) -> float:
    producer = client.create_producer(topic)
    started = time.perf_counter()
    for _ in range(count):
        producer.send_async(PAYLOAD)
    producer.flush()
    seconds = time.perf_counter() - started
    producer.close()
    return count / seconds


async def _produce_async(client: aio.AsyncClient, topic: str, count: int) -> float:
    producer = await client.create_producer(topic)
    started = time.perf_counter()
    for _ in range(count):
        await producer.send_nowait(PAYLOAD)
    await producer.flush()
    seconds = time.perf_counter() - started
    await producer.close()
    return count / seconds


def _consume_sync(client: rt.Client, topic: str, subscription: str, count: int) -> float:
    consumer = client.subscribe(topic, subscription, initial_position="earliest")
    started = time.perf_counter()
    for _ in range(count):
        consumer.acknowledge(consumer.receive(timeout=30))
    seconds = time.perf_counter() - started
    consumer.close()
    return count / seconds


async def _consume_async(client: aio.AsyncClient, topic: str, subscription: str, count: int) -> float:
    consumer = await client.subscribe(topic, subscription, initial_position="earliest")
    started = time.perf_counter()
    for _ in range(count):
        await consumer.acknowledge(await consumer.receive(timeout=30))
    seconds = time.perf_counter() - started
    await consumer.close()
    return count / seconds


def _throughput(client: rt.Client, count: int, rounds: int, progress: Callable[[str], None]) -> list[dict]:
    produced, consumed = f"bench-aio-produce-{time.monotonic_ns()}", f"bench-aio-consume-{time.monotonic_ns()}"
    client.create_topic(produced)
    client.create_topic(consumed)
    _produce_sync(client, consumed, count)  # what every round's consumers read
    async_client = aio.AsyncClient(client)  # the same client: its machinery, awaited
    # A round of each way first, not counted: the partition actor's first appends and the
    # subscription's start are no way's cost.
    _produce_sync(client, produced, count)
    asyncio.run(_produce_async(async_client, produced, count))
    _consume_sync(client, consumed, "warm-sync", count)
    asyncio.run(_consume_async(async_client, consumed, "warm-async", count))
    rates: dict[str, list[float]] = {"produce-sync": [], "produce-async": [], "consume-sync": [],
                                     "consume-async": []}
    for round_ in range(rounds):
        ways = ("sync", "async") if round_ % 2 == 0 else ("async", "sync")
        for way in ways:
            rates[f"produce-{way}"].append(_produce_sync(client, produced, count) if way == "sync" else
                                           asyncio.run(_produce_async(async_client, produced, count)))
        for way in ways:
            subscription = f"{way}-{round_}"
            rates[f"consume-{way}"].append(
                _consume_sync(client, consumed, subscription, count) if way == "sync" else
                asyncio.run(_consume_async(async_client, consumed, subscription, count)))
        progress("  round {}: produce sync {:.0f}, async {:.0f}; consume sync {:.0f}, async {:.0f} msgs/s".format(
            round_ + 1, *(rates[k][-1] for k in ("produce-sync", "produce-async", "consume-sync", "consume-async"))))
    async_client.workers.shutdown(wait=False)
    client.delete_topics([produced, consumed])
    rows = throughput_rows(count, rates)
    for row in rows:
        if "ratio" in row:
            progress(f"  {row['case']}: best rounds {row['ratio']:.2f}, median of rounds "
                     f"{row['median_round_ratio']:.2f} (target {row['target']})")
    return rows


def throughput_rows(count: int, rates: dict[str, list[float]]) -> list[dict]:
    """A row per way (its best round) and an async/sync ratio row per operation. ``rates``: msgs/s
    of every round of "produce-sync", "produce-async", "consume-sync", "consume-async"."""
    cases = {"produce-sync": "produce: send_async per message, then flush",
             "produce-async": "produce: await send_nowait per message, then await flush",
             "consume-sync": "consume: receive + acknowledge per message",
             "consume-async": "consume: await receive + await acknowledge per message"}
    rows: list[dict] = [{"bench": "aio", "case": case, "messages": count, "rounds": len(rates[way]),
                         "msgs_per_s": round(max(rates[way]), 1), "all_rounds": [round(r, 1) for r in rates[way]]}
                        for way, case in cases.items()]
    for operation in ("produce", "consume"):
        sync, async_ = rates[f"{operation}-sync"], rates[f"{operation}-async"]
        per_round = [a / s for a, s in zip(async_, sync, strict=True)]
        rows.append({"bench": "aio", "case": f"{operation}: async/sync throughput ratio",
                     "ratio": round(max(async_) / max(sync), 3),
                     "median_round_ratio": round(statistics.median(per_round), 3), "target": ">= 0.9"})
    return rows


# --- a Serve replica's latency ------------------------------------------------------------------


class WaitingConsumer:
    """The replica: ``ping`` is the trivial request; ``start_waiting`` starts a consumer loop on an
    empty topic (awaited, or with the sync API holding the loop), ``stop_waiting`` ends it."""

    async def __init__(self, storage_url: str, topic: str) -> None:  # type: ignore[misc]
        self._client = await aio.connect(storage=storage_url)
        self._topic = topic
        self._subscriptions = 0
        self._waiting: tuple[aio.AsyncConsumer, asyncio.Task] | None = None

    async def ping(self) -> int:
        return 0

    async def start_waiting(self, sync: bool) -> None:
        assert self._waiting is None
        self._subscriptions += 1
        consumer = await self._client.subscribe(self._topic, f"wait-{self._subscriptions}")
        self._waiting = consumer, asyncio.ensure_future(self._wait(consumer, sync))

    async def _wait(self, consumer: aio.AsyncConsumer, sync: bool) -> None:
        while True:
            try:
                if sync:
                    consumer.sync.receive(timeout=SYNC_RECEIVE_S)
                else:
                    await consumer.receive(timeout=WAIT_RECEIVE_S)
            except Timeout:
                await asyncio.sleep(0)

    async def stop_waiting(self) -> None:
        assert self._waiting is not None
        consumer, task = self._waiting
        self._waiting = None
        task.cancel()
        await asyncio.wait([task])
        await consumer.close()


def _latencies_ms(handle: Any, samples: int) -> list[float]:
    handle.ping.remote().result(timeout_s=60)  # (a first call after a change of state is not measured)
    latencies = []
    for _ in range(samples):
        started = time.perf_counter()
        handle.ping.remote().result(timeout_s=60)
        latencies.append((time.perf_counter() - started) * 1000)
    return sorted(latencies)


def _serve_latency(client: rt.Client, samples: int, rounds: int, progress: Callable[[str], None]) -> list[dict]:
    from ray import serve

    topic = f"bench-aio-empty-{time.monotonic_ns()}"
    client.create_topic(topic)
    serve.start(proxy_location="Disabled", logging_config=QUIET)
    latencies: dict[str, list[list[float]]] = {"idle": [], "waiting": [], "sync": []}
    try:
        deployment = serve.deployment(WaitingConsumer, ray_actor_options={"num_cpus": 0})
        handle = serve.run(deployment.bind(client.config.storage_url, topic), name="bench-aio", route_prefix=None,
                           logging_config=QUIET)
        for round_ in range(rounds):
            for state in (("idle", "waiting") if round_ % 2 == 0 else ("waiting", "idle")):
                if state == "waiting":
                    handle.start_waiting.remote(False).result(timeout_s=120)
                latencies[state].append(_latencies_ms(handle, samples))
                if state == "waiting":
                    handle.stop_waiting.remote().result(timeout_s=120)
            progress(f"  round {round_ + 1}: Serve request p50 idle {statistics.median(latencies['idle'][-1]):.2f} ms, "
                     f"consumer waiting {statistics.median(latencies['waiting'][-1]):.2f} ms")
        handle.start_waiting.remote(True).result(timeout_s=120)
        latencies["sync"].append(_latencies_ms(handle, max(5, samples // 10)))
        handle.stop_waiting.remote().result(timeout_s=120)
    finally:
        serve.shutdown()
        client.delete_topic(topic)
    rows = serve_rows(samples, latencies)
    progress(f"  {rows[-1]['case']}: {rows[-1]['p50_ratio']:.2f} (target {rows[-1]['target']})")
    return rows


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def serve_rows(samples: int, latencies: dict[str, list[list[float]]]) -> list[dict]:
    """A latency row per state of the replica (its best round by p50; all rounds pooled for the
    p99) and the ratio row: waiting/idle p50 over the best rounds, and the median of the rounds'
    own ratios. ``latencies``: per state ("idle", "waiting", "sync"), each round's sorted ms."""
    cases = {"idle": "Serve request, no consumer in the replica",
             "waiting": "Serve request, the replica's consumer awaiting receive on an empty topic",
             "sync": f"Serve request, a sync receive ({SYNC_RECEIVE_S}s) holding the replica's loop (reference)"}
    rows: list[dict] = []
    for state, case in cases.items():
        rounds = latencies[state]
        pooled = sorted(v for r in rounds for v in r)
        rows.append({"bench": "aio", "case": case, "samples": sum(map(len, rounds)), "rounds": len(rounds),
                     "p50_ms": round(min(statistics.median(r) for r in rounds), 3),
                     "p99_ms": round(_percentile(pooled, 0.99), 3)})
    idle, waiting = latencies["idle"], latencies["waiting"]
    per_round = [statistics.median(w) / statistics.median(i) for w, i in zip(waiting, idle, strict=True)]
    rows.append({"bench": "aio", "case": "Serve request p50: consumer waiting/idle latency ratio",
                 "samples": samples, "p50_ratio": round(rows[1]["p50_ms"] / rows[0]["p50_ms"], 3),
                 "median_round_ratio": round(statistics.median(per_round), 3),
                 "sync_reference_ratio": round(rows[2]["p50_ms"] / rows[0]["p50_ms"], 3), "target": "<= 2"})
    return rows
