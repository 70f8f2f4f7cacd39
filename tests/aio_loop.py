"""``run_checked``: run an asyncio body in debug mode and fail on any step that held its loop.

asyncio's debug mode logs every callback (a task's step) that ran longer than the loop's
``slow_callback_duration``; a raytxn call that blocked the loop (a thread waiting on a lock, an
actor, a timer, a thread's start) or computed on it shows up as one. On a machine shared with
other work (this one: 2 cores, a load average of 20 at times) a step can also be slow because the
process got no CPU: the loop thread, runnable, waited for a core or for the GIL its neighbours'
threads held while they waited for one. Such a step says nothing about the code.

So a second loop, the canary, runs in a thread of its own beside the body's, doing nothing but
waking every 5 ms; it runs no raytxn code and cannot be blocked by it. While the body's loop is
blocked (its thread waits, the GIL released) or computing (the GIL taken back every 5 ms), the
canary keeps its time; while the whole process is starved, it is as late as the body's loop. A
slow step fails the run unless the canary was stalled for most of it too (``STARVED_SHARE``);
each one is reported with the canary's stall, and with where every task waits right after the
step (the await that ended it, which says what the step was). ``tests/integration/test_aio.py``
shows the checker failing a body that blocks its loop in a sync receive."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

# A blocked loop shows as a callback this slow; a Python step that does not block takes well under
# it, on any machine that gives the process CPU.
SLOW_CALLBACK_S = 0.1
CANARY_TICK_S = 0.005
CANARY_LATE_S = 0.02  # a canary wake this late counts as a stall (the scheduler's jitter is below it)
STARVED_SHARE = 0.5  # a slow step the canary was stalled for this share of is the machine's
MAX_CANARY_STALLS = 10_000  # bounded: a body of minutes on a starved machine keeps the latest
# A body still awaiting after this long is hung: it fails with where each task waits, which
# pytest-timeout's thread dump (at 300 s) cannot say (the loop thread just sits in select).
HUNG_AFTER_S = 240.0


class _Canary:
    """A loop in a thread of its own that wakes every ``CANARY_TICK_S`` and records when it woke
    late: ``stalls`` holds ``(from, to)`` monotonic intervals it could not run in."""

    def __init__(self) -> None:
        self.stalls: collections.deque[tuple[float, float]] = collections.deque(maxlen=MAX_CANARY_STALLS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._tick()), name="aio-canary", daemon=True)

    def __enter__(self) -> _Canary:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    async def _tick(self) -> None:
        while not self._stop.is_set():
            due = time.monotonic() + CANARY_TICK_S
            await asyncio.sleep(CANARY_TICK_S)
            woke = time.monotonic()
            if woke - due >= CANARY_LATE_S:
                self.stalls.append((due, woke))

    def stalled_within(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` the canary was stalled in."""
        return sum(max(0.0, min(end, to) - max(start, since)) for since, to in list(self.stalls))


class _SlowSteps(logging.Handler):
    """Collects asyncio's slow-callback reports: ``(start, end, report)`` each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: list[tuple[float, float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not (message.startswith("Executing") and "took" in message):
            return
        end = time.monotonic()  # logged right after the step, from the loop
        took = float(message.rsplit(" ", 2)[-2])
        self.found.append((end - took, end, f"a step took {took:.3f}s; tasks then waited at {_where_tasks_wait()}"))


def _where_tasks_wait(depth: int = 4) -> list[str]:
    """Each task's innermost ``depth`` coroutine frames (following its awaits) as file:line."""
    found = []
    for task in asyncio.all_tasks():
        frames, coroutine = [], task.get_coro()
        while coroutine is not None and len(frames) < 20:
            frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "ag_frame", None)
            if frame is not None:
                frames.append(f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}")
            coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "ag_await", None)
        found.append(" > ".join(frames[-depth:]))
    return found


def run_checked(body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``body()`` in a debug-mode loop; fail on any step that held the loop (see the module
    docstring), print the slow steps put down to a starved machine."""
    slow = _SlowSteps()
    logger = logging.getLogger("asyncio")
    logger.addHandler(slow)

    async def main() -> Any:
        asyncio.get_running_loop().slow_callback_duration = SLOW_CALLBACK_S
        task = asyncio.ensure_future(body())
        done, _ = await asyncio.wait({task}, timeout=HUNG_AFTER_S)
        if not done:
            waits = _where_tasks_wait(depth=20)
            task.cancel()
            raise AssertionError(f"the body still awaited after {HUNG_AFTER_S:g}s; tasks wait at {waits}")
        return task.result()

    try:
        with _Canary() as canary:
            result = asyncio.run(main(), debug=True)
    finally:
        logger.removeHandler(slow)
    held, starved = [], []
    for start, end, report in slow.found:
        stalled = canary.stalled_within(start, end)
        (starved if stalled >= STARVED_SHARE * (end - start) else held).append(
            f"{report}; the canary loop was stalled {stalled:.3f}s of it")
    if starved:
        print(f"{len(starved)} slow steps while the process got no CPU (the canary stalled too): {starved}")
    assert held == [], held
    return result
