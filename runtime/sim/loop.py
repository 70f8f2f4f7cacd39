"""A deterministic asyncio event loop on virtual time.

``SimLoop`` is a ``SelectorEventLoop`` whose ``time()`` is a virtual clock and which never polls for
I/O: when nothing is ready, its ``_run_once`` moves the clock to the next timer at once. Ready
callbacks run in FIFO order and timers in (time, insertion) order, so a run is a pure function of
what the code does, which the seeded ``random.Random`` the simulator hands out decides.

Every task is tagged with the *owner* (a simulated process) that was current when it was created
(``OWNER``, a context variable every child task inherits), so ``kill_owner`` can end a process:
cancel all its tasks in creation order, as a crash ends a real one.

The loop's own bookkeeping is trimmed for speed (a run schedules a few hundred thousand callbacks):
handles skip the debug-mode checks (unless the loop is in debug mode), and the timer heap holds
``(when, handle)`` pairs, compared in C. A pair compares as its handle does (by ``when`` alone:
equal times fall through to the handles, and ``TimerHandle.__lt__`` answers False for them), so
the heap orders timers exactly as ``BaseEventLoop``'s heap of handles does, ties included.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import selectors
from asyncio import format_helpers
from asyncio.base_events import _MIN_CANCELLED_TIMER_HANDLES_FRACTION, _MIN_SCHEDULED_TIMER_HANDLES
from collections.abc import Coroutine
from typing import Any

# Which simulated process the running code belongs to (None: the harness itself).
OWNER: contextvars.ContextVar[object | None] = contextvars.ContextVar("raytxn_sim_owner", default=None)

MAX_TASKS_PER_OWNER = 100_000  # a process holding more live tasks than this is a leak: fail loudly
SWEEP_EVERY_TASKS = 512        # task creations between two sweeps of ended tasks (SimLoop._sweep)


class Deadlock(RuntimeError):
    """No ready callback and no timer: the simulation can never make progress."""


def _wake(future: asyncio.Future) -> None:
    """A sleep's timer (asyncio's ``_set_result_unless_cancelled``)."""
    if not future.cancelled():
        future.set_result(None)


class _Handle(asyncio.Handle):
    """A ``Handle`` built without asking the loop for debug mode (the loop checks that once)."""

    __slots__ = ()

    def __init__(self, callback: Any, args: tuple, loop: asyncio.AbstractEventLoop,
                 context: contextvars.Context | None) -> None:
        # What Handle.__init__ sets outside debug mode, set here rather than through a helper:
        # plain handles are two thirds of the 16,000 a seed builds, and a call each was measurable.
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _TimerHandle(asyncio.TimerHandle):
    """A ``TimerHandle`` as ``_Handle`` is a ``Handle``; its ``cancel`` does what the base's does
    outside debug mode, in one call instead of three."""

    __slots__ = ()

    def __init__(self, when: float, callback: Any, args: tuple, loop: SimLoop,
                 context: contextvars.Context | None) -> None:
        _Handle.__init__(self, callback, args, loop, context)  # the same slots: both are Handles
        self._when = when
        self._scheduled = False

    def cancel(self) -> None:
        if not self._cancelled:
            if self._scheduled:
                self._loop._timer_cancelled_count += 1  # as BaseEventLoop._timer_handle_cancelled
            self._cancelled = True
            self._callback = None
            self._args = None


class SimLoop(asyncio.SelectorEventLoop):
    """See the module docstring. ``start_s`` is the virtual time it starts at."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        super().__init__(selectors.SelectSelector())  # built for the base class; never polled
        self._clock_resolution = 1e-9
        self._tasks_by_owner: dict[object, dict[asyncio.Task, None]] = {}
        self._unowned: list[asyncio.Task] = []   # the harness's own tasks, until a sweep looks at them
        self._orphans: list[asyncio.Task] = []   # tasks of a killed owner, cancelled, until a sweep
        self._created_since_sweep = 0
        self._broken: list[str] = []
        self.set_task_factory(self._make_task)

    def time(self) -> float:
        return self._now

    # --- scheduling: BaseEventLoop's, less the checks that only debug mode needs ---------------

    def call_soon(self, callback: Any, *args: Any, context: contextvars.Context | None = None) -> asyncio.Handle:
        if self._debug or self._closed:
            return super().call_soon(callback, *args, context=context)
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Any, *args: Any,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Any, *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        if self._debug:
            self._check_callback(callback, "call_at")
        timer = _TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, timer))
        timer._scheduled = True
        return timer

    def create_task(self, coro: Coroutine[Any, Any, Any], *, name: str | None = None,
                    context: contextvars.Context | None = None) -> asyncio.Task:
        self._check_closed()
        if context is None:  # as BaseEventLoop.create_task calls a task factory
            task = self._task_factory(self, coro)
        else:
            task = self._task_factory(self, coro, context=context)
        if name is not None:
            task.set_name(name)
        return task

    def _run_once(self) -> None:
        """``BaseEventLoop._run_once`` without I/O: when nothing is ready, the clock jumps to the
        next timer instead of waiting for it (and with no timer either, nothing can ever run).

        It goes on to the next round itself until the loop is stopping, which is what
        ``run_forever`` would do after it returns (``while True: _run_once(); if stopping: break``):
        one call per run instead of one per round."""
        ready = self._ready
        popleft = ready.popleft
        heappop = heapq.heappop
        while True:
            scheduled = self._scheduled
            if (len(scheduled) > _MIN_SCHEDULED_TIMER_HANDLES
                    and self._timer_cancelled_count / len(scheduled) > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
                for _, handle in scheduled:  # drop cancelled timers once they are many (as the base does)
                    if handle._cancelled:
                        handle._scheduled = False
                scheduled = self._scheduled = [entry for entry in scheduled if not entry[1]._cancelled]
                heapq.heapify(scheduled)
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0][1]._cancelled:
                    self._timer_cancelled_count -= 1
                    heappop(scheduled)[1]._scheduled = False
            if not ready and not self._stopping:
                if not scheduled:
                    raise Deadlock(f"simulation deadlocked at t={self._now:.3f}s: no task can run")
                self._now = max(self._now, scheduled[0][0])
            end_time = self._now + self._clock_resolution
            while scheduled and scheduled[0][0] < end_time:
                handle = heappop(scheduled)[1]
                handle._scheduled = False
                ready.append(handle)
            for _ in range(len(ready)):
                handle = popleft()
                if handle._cancelled:
                    continue
                try:  # Handle._run, inlined: one Python call less per callback
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:  # noqa: BLE001 - reported as Handle._run reports it
                    callback = format_helpers._format_callback_source(handle._callback, handle._args)
                    self.call_exception_handler({"message": f"Exception in callback {callback}",
                                                 "exception": exc, "handle": handle})
            if self._stopping:
                return

    async def sleep(self, delay: float) -> None:
        """``asyncio.sleep(delay)`` on this loop without looking the running loop up: the same
        future, timer and cancellation, so the same callbacks in the same order (the simulated
        network and storage sleep on every call)."""
        if delay <= 0:
            await asyncio.sleep(delay)  # a bare yield, as asyncio's
            return
        future = self.create_future()
        timer = self.call_at(self._now + delay, _wake, future)
        try:
            await future
        finally:
            timer.cancel()

    # --- tasks and their owners ------------------------------------------------------------------

    def _make_task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                   context: contextvars.Context | None = None) -> asyncio.Task:
        # Without a context the task copies the current one: the creator's owner is current.
        owner = OWNER.get() if context is None else context.get(OWNER)
        task = asyncio.Task(coro, loop=loop, context=context)
        if owner is None:
            self._unowned.append(task)
        else:
            tasks = self._tasks_by_owner.get(owner)
            if tasks is None:
                tasks = self._tasks_by_owner[owner] = {}
            tasks[task] = None  # a dict keeps creation order: kill_owner cancels in that order
            assert len(tasks) <= MAX_TASKS_PER_OWNER, f"{owner} holds {len(tasks)} tasks"
        self._created_since_sweep += 1
        if self._created_since_sweep >= SWEEP_EVERY_TASKS:
            self._sweep()
        return task

    # Ended tasks leave the owners' tables in sweeps, not through a done callback each: a callback
    # per task was a sixth of a run's callbacks. A sweep looks at every task it holds, so it runs
    # once per this many task creations, and its cost per task stays constant.
    def _sweep(self) -> None:
        """Drop ended tasks from the tables, noting those that broke an invariant. Sweeps run at
        points the code alone decides (task creations, ``broken``, ``kill_owner``), so the notes
        never depend on the heap; only the order they are noted in differs from the order the
        tasks ended in."""
        self._created_since_sweep = 0
        for tasks in self._tasks_by_owner.values():
            ended = [task for task in tasks if task.done()]
            for task in ended:
                del tasks[task]
                self._note_broken(task)
        self._unowned = self._without_ended(self._unowned)
        self._orphans = self._without_ended(self._orphans)

    def _without_ended(self, tasks: list[asyncio.Task]) -> list[asyncio.Task]:
        live = []
        for task in tasks:
            if task.done():
                self._note_broken(task)
            else:
                live.append(task)
        return live

    @property
    def broken(self) -> list[str]:
        """What ended tasks broke: an ``AssertionError`` or a non-``Exception`` error, in the order
        sweeps found them."""
        self._sweep()
        return self._broken

    def _note_broken(self, task: asyncio.Task) -> None:
        """A task that died of an ``AssertionError`` (anywhere in its error's chain: the actor
        shell wraps a failed apply in ``ActorUnavailable``) or of a non-``Exception`` error broke
        an invariant."""
        if task.cancelled():
            return
        error: BaseException | None = task.exception()
        if error is None:
            return
        for _ in range(20):  # bounded walk of the cause chain
            if error is None:
                return
            if isinstance(error, AssertionError) or not isinstance(error, Exception | asyncio.CancelledError):
                self._broken.append(f"{task.get_coro().__qualname__}: {error!r}")
                return
            error = error.__cause__ or error.__context__

    def kill_owner(self, owner: object) -> int:
        """Cancel every live task ``owner`` created, in creation order; returns how many."""
        tasks = self._tasks_by_owner.pop(owner, {})
        live = self._without_ended(list(tasks))
        for task in live:
            task.cancel()
        self._orphans.extend(live)  # a cancelled task may still end with an error of its own
        return len(live)

    def spawn(self, owner: object, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` as a task of ``owner`` (its children belong to ``owner`` too)."""
        context = contextvars.copy_context()
        context.run(OWNER.set, owner)
        return self.create_task(coro, context=context)
