"""Where users run ``raytxn.aio``: a service whose event loop consumes, transforms and produces in
transactions while it answers requests, run as an async Ray actor (tests/integration/
test_aio_actor.py) and as a Ray Serve replica (test_aio_serve.py), while engine actors are killed.

``Transformer`` is the service: ``start`` connects and starts its worker tasks, ``status`` is
the request the tests send it meanwhile (its latency is what a blocked loop would spoil).
``run_under_kills`` is the driver's side: it feeds the input, sends requests from threads of its
own, kills engine actors one after the other, waits until every input is done, and returns what
it saw; ``check_exactly_once`` and ``check_answered`` judge it.

``blocking=True`` makes the service receive with the sync API on its loop, what ``raytxn.aio``
exists to avoid; the tests show ``check_answered`` failing it.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raytxn import aio
from raytxn.client.transaction import TxnClientState
from raytxn.errors import RaytxnError, Timeout

RECEIVE_TIMEOUT_S = 5.0  # a worker's receive waits this long on an empty topic
TXN_TIMEOUT_S = 30.0
# No request may wait longer than this. Generous for a loaded 2-core machine (a request is a Ray
# call to the service and back, tens of ms when the machine is idle) and below what a loop held
# by one receive would make it wait (RECEIVE_TIMEOUT_S).
REQUEST_BOUND_S = 3.0
REQUEST_INTERVAL_S = 0.05
ENDED = (TxnClientState.COMMITTED, TxnClientState.ABORTED)


def transform(value: bytes) -> bytes:
    return b"out-" + value


class Transformer:
    """Consume ``source``, produce ``transform(value)`` on ``sink`` and ack, one transaction per
    message, in ``workers`` tasks sharing one consumer; answer ``status`` meanwhile."""

    def __init__(self, storage_url: str, source: str, sink: str, subscription: str, workers: int = 3,
                 blocking: bool = False) -> None:
        self._args = (storage_url, source, sink, subscription)
        self._workers = workers
        self._blocking = blocking
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.committed = 0
        self.aborted = 0
        self.errors: dict[str, int] = {}

    async def start(self) -> None:
        storage_url, source, sink, subscription = self._args
        self._client = await aio.connect(storage=storage_url)
        self._consumer = await self._client.subscribe(source, subscription, initial_position="earliest",
                                                      consumer_type="Shared")
        self._producer = await self._client.create_producer(sink, send_timeout_s=120)
        self._tasks = [asyncio.ensure_future(self._work()) for _ in range(self._workers)]

    async def status(self) -> dict[str, Any]:
        """The request: what the workers did, answered at once by a loop that is free."""
        return {"committed": self.committed, "aborted": self.aborted, "errors": dict(self.errors),
                "workers_alive": sum(not t.done() for t in self._tasks)}

    async def stop(self) -> dict[str, Any]:
        self._stopping = True
        await asyncio.gather(*self._tasks, return_exceptions=True)
        status = await self.status()
        await self._client.close()
        return status

    def _note(self, error: BaseException) -> None:
        name = type(error).__name__
        self.errors[name] = self.errors.get(name, 0) + 1

    async def _receive(self) -> Any:
        if self._blocking:  # the sync API on the loop: it holds the loop while it waits
            return self._consumer.sync.receive(timeout=RECEIVE_TIMEOUT_S)
        return await self._consumer.receive(timeout=RECEIVE_TIMEOUT_S)

    async def _work(self) -> None:
        while not self._stopping:
            try:
                message = await self._receive()
            except Timeout:
                await asyncio.sleep(0)  # (a sync receive yields here alone: requests wait for its timeout)
                continue
            except RaytxnError as e:  # the subscription restarting: its consumer reattaches
                self._note(e)
                await asyncio.sleep(0.1)
                continue
            txn = await self._client.new_transaction(timeout=TXN_TIMEOUT_S)
            try:
                await self._producer.send(transform(message.value()), key=message.key(), txn=txn)
                await self._consumer.acknowledge(message, txn=txn)
                await txn.commit()
                self.committed += 1
            except RaytxnError as e:
                # Not committed (a failed send, a conflicting ack: a duplicate delivery whose
                # first one holds the ack): aborted, so its output never shows, and the message
                # goes back (its ack is undone; a nack for one that failed before its ack).
                self._note(e)
                if txn.state not in ENDED:
                    try:
                        await txn.abort()
                    except RaytxnError as abort_error:
                        self._note(abort_error)
                self.aborted += 1
                self._consumer.negative_acknowledge(message)


@dataclass
class Run:
    """What ``run_under_kills`` saw: each request's (sent at, latency) on the driver's
    ``time.monotonic``, each kill's (actor, from, to: serving again), the service's last status."""

    requests: list[tuple[float, float]] = field(default_factory=list)
    kills: list[tuple[str, float, float]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    request_errors: list[str] = field(default_factory=list)

    def kill_window(self) -> tuple[float, float]:
        return self.kills[0][1], self.kills[-1][2]

    def latencies_within(self, start: float, end: float) -> list[float]:
        return [latency for sent, latency in self.requests if start <= sent <= end]

    def summary(self) -> str:
        overall = [latency for _, latency in self.requests]
        said = f"{len(overall)} requests, max {max(overall, default=0):.3f}s"
        if self.kills:
            start, end = self.kill_window()
            during = self.latencies_within(start, end)
            said += (f"; during the kills ({end - start:.1f}s, {[k[0] for k in self.kills]}): {len(during)} "
                     f"requests, p50 {statistics.median(during) if during else 0:.3f}s, "
                     f"max {max(during, default=0):.3f}s")
        return f"{said}; status {self.status}; request errors {self.request_errors[:3]}"


class Requests:
    """Threads sending ``request()`` one after another every ``REQUEST_INTERVAL_S`` until stopped,
    recording each one's latency."""

    def __init__(self, request: Callable[[], Any], run: Run, threads: int = 2) -> None:
        self._request = request
        self._run = run
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Requests:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _send(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                self._request()
            except Exception as e:  # noqa: BLE001 - a failed request is recorded and judged
                self._run.request_errors.append(repr(e)[:200])
            self._run.requests.append((sent, time.monotonic() - sent))
            self._stop.wait(REQUEST_INTERVAL_S)


def run_under_kills(client: Any, request: Callable[[], Any], status: Callable[[], dict[str, Any]],
                    source: str, count: int, victims: list[str], restart: Callable[[str], Any],
                    feed_s: float = 6.0, deadline_s: float = 60.0) -> Run:
    """Feed ``count`` inputs to ``source`` over ``feed_s`` seconds while ``request()`` is sent from
    two threads and each of ``victims`` is killed in turn (``restart(name)`` kills it and returns
    once it serves again; the first a second into the feed), then wait until the service
    committed every input."""
    run = Run()
    producer = client.create_producer(source, batching_max_messages=1)

    def feed() -> None:
        for i in range(count):
            producer.send_async(f"m{i}".encode(), key=f"k{i}")
            time.sleep(feed_s / count)
        producer.flush()

    feeder = threading.Thread(target=feed, daemon=True)
    with Requests(request, run):
        time.sleep(1.0)  # requests while the workers wait on the empty topic
        feeder.start()
        time.sleep(1.0)
        for name in victims:
            started = time.monotonic()
            restart(name)
            run.kills.append((name, started, time.monotonic()))
        feeder.join(timeout=deadline_s)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            run.status = status()
            if run.status["committed"] >= count:
                break
            time.sleep(0.2)
        time.sleep(0.5)  # and requests a moment after, while the workers wait on the empty topic again
    producer.close()
    return run


def check_answered(run: Run) -> None:
    """Every request answered, none later than ``REQUEST_BOUND_S``, some during the kills."""
    assert run.requests and not run.request_errors, run.summary()
    if run.kills:
        start, end = run.kill_window()
        assert len(run.latencies_within(start, end)) >= 5, f"too few requests during the kills: {run.summary()}"
    slowest = max(latency for _, latency in run.requests)
    assert slowest <= REQUEST_BOUND_S, f"a request waited {slowest:.3f}s: {run.summary()}"


def check_exactly_once(outputs: list[bytes], count: int, run: Run) -> None:
    expected = sorted(transform(f"m{i}".encode()) for i in range(count))
    missing = sorted(set(expected) - set(outputs))
    repeated = sorted({v for v in outputs if outputs.count(v) > 1})
    assert sorted(outputs) == expected, f"missing {missing[:5]}, repeated {repeated[:5]}; {run.summary()}"
    assert run.status["committed"] == count, run.summary()  # one commit per input, no more
