"""A deterministic asyncio event loop on virtual time.

``SimLoop`` is a ``SelectorEventLoop`` whose ``time()`` is a virtual clock and which never polls for
I/O: when nothing is ready, its ``_run_once`` moves the clock to the next timer at once. Ready
callbacks run in FIFO order and timers in (time, insertion) order, so a run is a pure function of
what the code does, which the seeded ``random.Random`` the simulator hands out decides.

Every task is tagged with the *owner* (a simulated process) that was current when it was created
(``OWNER``, a context variable every child task inherits), so ``kill_owner`` can end a process:
cancel all its tasks in creation order, as a crash ends a real one.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import selectors
from asyncio.base_events import _MIN_CANCELLED_TIMER_HANDLES_FRACTION, _MIN_SCHEDULED_TIMER_HANDLES
from collections.abc import Coroutine
from typing import Any

# Which simulated process the running code belongs to (None: the harness itself).
OWNER: contextvars.ContextVar[object | None] = contextvars.ContextVar("raytxn_sim_owner", default=None)

MAX_TASKS_PER_OWNER = 100_000  # a process holding more live tasks than this is a leak: fail loudly


class Deadlock(RuntimeError):
    """No ready callback and no timer: the simulation can never make progress."""


class SimLoop(asyncio.SelectorEventLoop):
    """See the module docstring. ``start_s`` is the virtual time it starts at."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        super().__init__(selectors.SelectSelector())  # built for the base class; never polled
        self._clock_resolution = 1e-9
        self._tasks_by_owner: dict[object, dict[int, asyncio.Task]] = {}
        self._task_serial = 0
        self.broken: list[str] = []  # tasks that ended with a broken assertion (or worse), in order
        self.set_task_factory(self._make_task)

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        """``BaseEventLoop._run_once`` without I/O: when nothing is ready, the clock jumps to the
        next timer instead of waiting for it (and with no timer either, nothing can ever run)."""
        scheduled = self._scheduled
        if (len(scheduled) > _MIN_SCHEDULED_TIMER_HANDLES
                and self._timer_cancelled_count / len(scheduled) > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            for handle in scheduled:  # drop cancelled timers once they are many (as the base does)
                if handle._cancelled:
                    handle._scheduled = False
            scheduled = self._scheduled = [handle for handle in scheduled if not handle._cancelled]
            heapq.heapify(scheduled)
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False
        ready = self._ready
        if not ready and not self._stopping:
            if not scheduled:
                raise Deadlock(f"simulation deadlocked at t={self._now:.3f}s: no task can run")
            self._now = max(self._now, scheduled[0]._when)
        end_time = self._now + self._clock_resolution
        while scheduled and scheduled[0]._when < end_time:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _make_task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                   context: contextvars.Context | None = None) -> asyncio.Task:
        # Without a context the task copies the current one: the creator's owner is current.
        owner = OWNER.get() if context is None else context.get(OWNER)
        task = asyncio.Task(coro, loop=loop, context=context)
        if owner is None:
            task.add_done_callback(self._note_broken)
            return task
        tasks = self._tasks_by_owner.setdefault(owner, {})
        self._task_serial += 1
        serial = self._task_serial
        tasks[serial] = task
        assert len(tasks) <= MAX_TASKS_PER_OWNER, f"{owner} holds {len(tasks)} tasks"

        def done(finished: asyncio.Task) -> None:
            tasks.pop(serial, None)
            self._note_broken(finished)

        task.add_done_callback(done)
        return task

    def _note_broken(self, task: asyncio.Task) -> None:
        """A task that died of an ``AssertionError`` (anywhere in its error's chain: the actor
        shell wraps a failed apply in ``ActorUnavailable``) or of a non-``Exception`` error broke
        an invariant. Noted when the task ends, not when the collector frees it, so the verdict
        never depends on the heap."""
        if task.cancelled() or task.exception() is None:
            return
        error: BaseException | None = task.exception()
        for _ in range(20):  # bounded walk of the cause chain
            if error is None:
                return
            if isinstance(error, AssertionError) or not isinstance(error, Exception | asyncio.CancelledError):
                self.broken.append(f"{task.get_coro().__qualname__}: {error!r}")
                return
            error = error.__cause__ or error.__context__

    def kill_owner(self, owner: object) -> int:
        """Cancel every live task ``owner`` created, in creation order; returns how many."""
        tasks = self._tasks_by_owner.pop(owner, {})
        for task in list(tasks.values()):
            task.cancel()
        return len(tasks)

    def spawn(self, owner: object, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` as a task of ``owner`` (its children belong to ``owner`` too)."""
        context = contextvars.copy_context()
        context.run(OWNER.set, owner)
        return self.create_task(coro, context=context)
