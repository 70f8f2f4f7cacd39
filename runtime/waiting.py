"""Waiting with a timeout, without a task per wait.

``asyncio.wait_for(event.wait(), timeout)`` wraps the wait in a task of its own, and a
``Condition`` adds a lock to take and take again around it: about five callbacks per long-polling
read or fetch. These wait on one future with one timer, and wake in the same order (a waiter's
future is resolved by ``set``/``notify_all``, its task resumes on the next round). The actors
long-poll on every read and fetch, and the simulator runs them hundreds of times a seed.

Both hold at most one future per waiting call: the actors' calls are bounded by their
``max_concurrency``, so the lists are too.
"""

from __future__ import annotations

import asyncio
from functools import partial


def _expire(waiter: asyncio.Future, _settled: object = None) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Signal:
    """``notify_all`` wakes every caller waiting now (``Condition.notify_all`` without the lock:
    the actors' loops run one step at a time, so nothing can slip between a check and a wait)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []

    def notify_all(self) -> None:
        _wake(self._waiters)
        self._waiters = []

    async def wait(self, timeout_s: float) -> bool:
        """True when notified, False when ``timeout_s`` passed first."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await _wait_listed(self._waiters, waiter, timeout_s)


class Flag:
    """``asyncio.Event`` whose ``wait`` takes a timeout and returns whether it was set, and whose
    ``future`` is a plain future to race against another (``asyncio.wait``)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        _wake(self._waiters)
        self._waiters = []

    def clear(self) -> None:
        self._set = False

    def future(self) -> asyncio.Future:
        """Done (True) once set; cancelling it just stops the wait."""
        waiter = asyncio.get_running_loop().create_future()
        if self._set:
            waiter.set_result(True)
        else:
            self._waiters = [w for w in self._waiters if not w.done()]  # earlier ones given up on
            self._waiters.append(waiter)
        return waiter

    async def wait(self, timeout_s: float) -> bool:
        """True once set (at once if it is), False when ``timeout_s`` passed first."""
        if self._set:
            return True
        waiter = self.future()  # first: it may replace the list
        return await _wait_listed(self._waiters, waiter, timeout_s)


async def settled_within(future: asyncio.Future, timeout_s: float) -> bool:
    """Whether ``future`` is done within ``timeout_s``; cancelling the caller cancels only its
    wait, never ``future`` (``wait_for(shield(...))`` without its task and extra futures)."""
    if future.done():
        return True
    waiter = asyncio.get_running_loop().create_future()
    release = partial(_expire, waiter)
    future.add_done_callback(release)
    try:
        await _timed(waiter, timeout_s)
    finally:
        future.remove_done_callback(release)
    return future.done()


async def yield_to_woken_tasks(iterations: int) -> None:
    """Let tasks that a future just set wakes run before this one goes on: a task awaiting the
    future itself resumes one loop iteration later, one awaiting it through ``asyncio.shield``
    (or ``settled_within``) two. For work that must not delay an answer already decided."""
    assert 0 < iterations <= 4, iterations  # a bound: more would be waiting on something else
    for _ in range(iterations):
        await asyncio.sleep(0)


def _wake(waiters: list[asyncio.Future]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(True)


async def _timed(waiter: asyncio.Future, timeout_s: float) -> bool:
    """``waiter``'s result, or False once ``timeout_s`` passed (one timer, no task)."""
    timer = asyncio.get_running_loop().call_later(max(0.0, timeout_s), _expire, waiter)
    try:
        return await waiter
    finally:
        timer.cancel()


async def _wait_listed(waiters: list[asyncio.Future], waiter: asyncio.Future, timeout_s: float) -> bool:
    """Wait for ``waiter``, listed in ``waiters``; unlisted again unless it was woken."""
    try:
        return await _timed(waiter, timeout_s)
    finally:
        if not (waiter.done() and not waiter.cancelled() and waiter.result()):  # timed out or cancelled
            try:
                waiters.remove(waiter)
            except ValueError:
                pass
