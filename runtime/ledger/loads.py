"""The object loads of one ledger read, in order, several gets in flight at once.

A read knows up front which objects it will need (entry ids are contiguous in a ledger, so the
objects starting at or below the last entry it can return), but it checks them one by one, in
order: contiguity, seals, the entries' positions. ``ObjectLoads`` starts the needed loads ahead,
at most ``in_flight`` at once, and hands the results out in order, so an error (a missing or
corrupted object, storage down) surfaces at the object that has it, exactly as loading one after
the other would. An object past the needed ones (a read can look one further, to find a hole) is
loaded only when asked for. Loads still going when the read ends are cancelled.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")


def _retrieve(task: asyncio.Task) -> None:
    """A load the read never awaited (it stopped earlier) may have failed: not an error to log."""
    if not task.cancelled():
        task.exception()


class ObjectLoads(Generic[T]):
    """``load(first)`` for each of ``firsts`` in order; the first ``needed`` start ahead."""

    def __init__(self, load: Callable[[int], Awaitable[T]], firsts: Sequence[int], needed: int,
                 in_flight: int) -> None:
        assert in_flight >= 1 and 1 <= needed <= len(firsts), (in_flight, needed, len(firsts))
        self._load = load
        self._firsts = firsts
        self._needed = needed
        self._in_flight = in_flight
        self._started = 0  # loads started, in order of firsts
        self._running: deque[asyncio.Future[T]] = deque()

    def _start(self) -> None:
        self._running.append(asyncio.ensure_future(self._load(self._firsts[self._started])))
        self._started += 1

    def _top_up(self) -> None:
        while len(self._running) < self._in_flight and self._started < self._needed:
            self._start()

    async def next(self) -> T:
        """The next object's load, in the order of ``firsts``."""
        if not self._running:
            if self._started >= len(self._firsts):
                raise IndexError("no object left to load")
            self._start()
        result = await self._running.popleft()
        self._top_up()  # not before the await: the load awaited is one of the ``in_flight``
        return result

    async def __aenter__(self) -> ObjectLoads[T]:
        self._top_up()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        while self._running:
            load = self._running.popleft()
            load.cancel()
            load.add_done_callback(_retrieve)
