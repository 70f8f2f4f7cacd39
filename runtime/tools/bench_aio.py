"""Benchmark of ``raytxn.aio``: ``bench_aio(short=False, rounds=, messages=, samples=) -> rows``.

* Throughput of the asyncio API as a ratio to the sync API on the same messages, one client,
  interleaved rounds (which goes first alternates): produce (``send_async`` per message then
  ``flush``, against ``await send_nowait`` then ``await flush``, each onto the same topic) and
  consume (``receive`` + plain ``acknowledge`` per message, against their awaited forms, each from
  a new subscription of the same topic, so both read the same messages; and ``batch_receive`` of
  100 + an ack each, sync and awaited). Target: async/sync >= 0.9. Each figure comes with the
  calling thread's CPU per message, which a busy machine disturbs less than the wall's rates.
  Beside produce, its floor in the same rounds: ``send_async`` awaited through a bare coroutine
  (``async def`` that only calls it), the least any awaited call per message costs on CPython.
  And produce in bulk: ``send_batch`` of 1,000 messages a call, against ``await
  send_batch_nowait`` (its checks, encoding and room on a worker thread), then a flush each.
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
OPERATIONS = ("produce", "consume", "batch", "bulk")
WAYS_OF = {"produce": ("sync", "async", "floor"), "consume": ("sync", "async"), "batch": ("sync", "async"),
           "bulk": ("sync", "async")}
WAYS = tuple(f"{operation}-{way}" for operation in OPERATIONS for way in WAYS_OF[operation])
BATCH = 100  # batch_receive's max_messages
BULK = 1_000  # messages a send_batch call
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


class _Timed:
    """A run's clock: msgs/s over the wall, and the calling thread's CPU per message (the API's
    own cost, which a busy machine's scheduling disturbs far less than the wall)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def done(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter() - self.wall, time.thread_time() - self.cpu
        return self.count / wall, cpu / self.count * 1e6


def _bulk_chunks(count: int) -> list[list[bytes]]:
    return [[PAYLOAD] * min(BULK, count - start) for start in range(0, count, BULK)]


def _produce_sync(client: rt.Client, topic: str, count: int, bulk: bool = False) -> tuple[float, float]:
    """``send_async`` per message, or (``bulk``) ``send_batch`` of ``BULK`` a call; then a flush."""
    producer = client.create_producer(topic)
    chunks = _bulk_chunks(count) if bulk else []
    timed = _Timed(count)
    if bulk:
        for chunk in chunks:
            producer.send_batch(chunk)
    else:
        for _ in range(count):
            producer.send_async(PAYLOAD)
    producer.flush()
    figures = timed.done()
    producer.close()
    return figures


async def _bare(send: Callable[[bytes], Any], value: bytes) -> Any:
    """An awaited call that does nothing but the sync one: what an await costs, and no more."""
    return send(value)


async def _produce_async(client: aio.AsyncClient, topic: str, count: int, way: str = "async") -> tuple[float, float]:
    """``way``: "async", ``await send_nowait`` per message; "floor", ``send_async`` per message
    awaited through ``_bare`` (blocking the loop for room, as the sync call does: a floor, not a
    way to use the API); "bulk", ``await send_batch_nowait`` of ``BULK`` a call (its work runs on a
    worker thread, which the caller's CPU leaves out: the figure to read is msgs/s). Then a flush."""
    producer = await client.create_producer(topic)
    chunks = _bulk_chunks(count) if way == "bulk" else []
    send = producer.sync.send_async
    timed = _Timed(count)
    if way == "async":
        for _ in range(count):
            await producer.send_nowait(PAYLOAD)
    elif way == "floor":
        for _ in range(count):
            await _bare(send, PAYLOAD)
    else:
        for chunk in chunks:
            await producer.send_batch_nowait(chunk)
    await producer.flush()
    figures = timed.done()
    await producer.close()
    return figures


def _consume_sync(client: rt.Client, topic: str, subscription: str, count: int) -> tuple[float, float]:
    consumer = client.subscribe(topic, subscription, initial_position="earliest")
    timed = _Timed(count)
    for _ in range(count):
        consumer.acknowledge(consumer.receive(timeout=30))
    figures = timed.done()
    consumer.close()
    return figures


async def _consume_async(client: aio.AsyncClient, topic: str, subscription: str,
                         count: int) -> tuple[float, float]:
    consumer = await client.subscribe(topic, subscription, initial_position="earliest")
    timed = _Timed(count)
    for _ in range(count):
        await consumer.acknowledge(await consumer.receive(timeout=30))
    figures = timed.done()
    await consumer.close()
    return figures


def _batches_sync(client: rt.Client, topic: str, subscription: str, count: int) -> tuple[float, float]:
    consumer = client.subscribe(topic, subscription, initial_position="earliest")
    timed = _Timed(count)
    done = 0
    while done < count:
        for message in consumer.batch_receive(BATCH, timeout=30):
            consumer.acknowledge(message)
            done += 1
    figures = timed.done()
    consumer.close()
    return figures


async def _batches_async(client: aio.AsyncClient, topic: str, subscription: str,
                         count: int) -> tuple[float, float]:
    consumer = await client.subscribe(topic, subscription, initial_position="earliest")
    timed = _Timed(count)
    done = 0
    while done < count:
        for message in await consumer.batch_receive(BATCH, timeout=30):
            consumer.acknowledge(message)  # a plain ack is made at the call
            done += 1
    figures = timed.done()
    await consumer.close()
    return figures


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
    asyncio.run(_batches_async(async_client, consumed, "warm-batches", count))
    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    runs = {"produce-sync": lambda _: _produce_sync(client, produced, count),
            "produce-async": lambda _: asyncio.run(_produce_async(async_client, produced, count)),
            "produce-floor": lambda _: asyncio.run(_produce_async(async_client, produced, count, "floor")),
            "consume-sync": lambda name: _consume_sync(client, consumed, name, count),
            "consume-async": lambda name: asyncio.run(_consume_async(async_client, consumed, name, count)),
            "batch-sync": lambda name: _batches_sync(client, consumed, name, count),
            "batch-async": lambda name: asyncio.run(_batches_async(async_client, consumed, name, count)),
            "bulk-sync": lambda _: _produce_sync(client, produced, count, bulk=True),
            "bulk-async": lambda _: asyncio.run(_produce_async(async_client, produced, count, "bulk"))}
    for round_ in range(rounds):
        for operation in OPERATIONS:
            ways = WAYS_OF[operation]
            for way in (ways if round_ % 2 == 0 else ways[::-1]):
                rate, us = runs[f"{operation}-{way}"](f"{operation}-{way}-{round_}")
                rates[f"{operation}-{way}"].append(rate)
                cpu[f"{operation}-{way}"].append(us)
        progress(f"  round {round_ + 1}: " + "; ".join(
            f"{operation} " + ", ".join(f"{way} {rates[f'{operation}-{way}'][-1]:.0f}" for way in WAYS_OF[operation])
            for operation in OPERATIONS) + " msgs/s")
    async_client.workers.shutdown(wait=False)
    client.delete_topics([produced, consumed])
    rows = throughput_rows(count, rates, cpu)
    for row in rows:
        if "ratio" in row:
            progress(f"  {row['case']}: best rounds {row['ratio']:.2f}, median of rounds "
                     f"{row['median_round_ratio']:.2f}" + (f" (target {row['target']})" if "target" in row else ""))
    return rows


def throughput_rows(count: int, rates: dict[str, list[float]], cpu: dict[str, list[float]]) -> list[dict]:
    """A row per way (its best round; the calling thread's CPU per message, least of the rounds)
    and an async/sync ratio row per operation (of throughput; of the caller's CPU per message).
    ``rates``: msgs/s of every round of each of ``WAYS``; ``cpu``: us a message of each round."""
    cases = {"produce-sync": "produce: send_async per message, then flush",
             "produce-async": "produce: await send_nowait per message, then await flush",
             "produce-floor": "produce floor: await a bare coroutine calling send_async, per message",
             "consume-sync": "consume: receive + acknowledge per message",
             "consume-async": "consume: await receive + await acknowledge per message",
             "batch-sync": f"batch: batch_receive({BATCH}) + acknowledge each",
             "batch-async": f"batch: await batch_receive({BATCH}) + acknowledge each",
             "bulk-sync": f"bulk: send_batch of {BULK} per call, then flush",
             "bulk-async": f"bulk: await send_batch_nowait of {BULK} per call, then await flush"}
    rows: list[dict] = [{"bench": "aio", "case": case, "messages": count, "rounds": len(rates[way]),
                         "msgs_per_s": round(max(rates[way]), 1), "all_rounds": [round(r, 1) for r in rates[way]],
                         "caller_us_per_msg": round(min(cpu[way]), 3)}
                        for way, case in cases.items()]
    for operation in OPERATIONS:
        sync, async_ = rates[f"{operation}-sync"], rates[f"{operation}-async"]
        per_round = [a / s for a, s in zip(async_, sync, strict=True)]
        rows.append({"bench": "aio", "case": f"{operation}: async/sync throughput ratio",
                     "ratio": round(max(async_) / max(sync), 3),
                     "median_round_ratio": round(statistics.median(per_round), 3), "target": ">= 0.9",
                     "caller_cpu_ratio": round(min(cpu[f"{operation}-async"]) / min(cpu[f"{operation}-sync"]), 3)})
    # The floor says how much of produce's gap is the await itself, which no awaited API avoids.
    for case, over, under in (("produce floor: floor/sync throughput ratio", "produce-floor", "produce-sync"),
                              ("produce: async/floor throughput ratio", "produce-async", "produce-floor")):
        per_round = [a / b for a, b in zip(rates[over], rates[under], strict=True)]
        rows.append({"bench": "aio", "case": case, "ratio": round(max(rates[over]) / max(rates[under]), 3),
                     "median_round_ratio": round(statistics.median(per_round), 3),
                     "caller_cpu_ratio": round(min(cpu[over]) / min(cpu[under]), 3)})
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
