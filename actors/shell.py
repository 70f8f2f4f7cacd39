"""The one shell every raytxn actor is built on: lazy start, stop on divergence, ledger replay and
the clock. The rules are here once; an actor only says how it starts (``_start``).

**Start.** An actor starts (opens its ledgers, restores, replays) on its first call; concurrent
callers share that one start. A start that fails with a retriable error (storage briefly away, an
actor it reads from restarting) is forgotten: the next call starts again, from scratch (``_start``
builds its state anew, and opening a ledger again fences what the failed attempt opened). A start
that fails with any other error is final for the incarnation: every call fails with that error,
and the process ends after ``FAILED_START_EXIT_S`` so that Ray starts a fresh incarnation.

Why end it: what failed lies outside the process (another incarnation took the stream, an object
is corrupt or missing), and only a fresh incarnation gets past it: it wins the stream, or it
recovers once the object is repaired, without anyone having to find and kill the failed one. A
half-started incarnation never serves. Why wait first: a failure that persists (a corruption until
someone repairs it) then costs one restart (a process, a sealed empty ledger) per hold-off rather
than a hot restart loop, and callers meanwhile get the error itself, which names what is wrong. A
``Fenced`` start is the exception to both: the caller is not the zombie, this incarnation is, so
callers get ``ActorUnavailable`` (they retry and reach the next incarnation) and it ends at once.

**Stop.** An incarnation whose ledger write failed with ``Fenced`` (a newer incarnation took the
stream) or any other non-retriable error (its memory and its ledger diverged, e.g. an apply refused
a record that is durable now) must never serve again. ``_write`` applies the rule: it marks the
incarnation stopped (every later call fails at once), ends the process shortly (Ray starts a
fresh incarnation, which recovers from the ledger), and raises ``ActorUnavailable`` to the caller,
retriable and chained from the cause. ``MessageTooLarge`` is the caller's fault, refused before
anything was queued: it changes nothing and goes to the caller as it is, as do retriable errors
(``StorageUnavailable``: the append may still land; a retry is idempotent).

**Passivation.** An actor counts the calls it serves (every guarded method but the probes in
``UNCOUNTED_CALLS``), so it knows how long it has been idle. ``passivate`` (the supervisor's call)
stops an incarnation that has been idle long enough and that nothing holds up (the actor's
``_passivation_blockers``: open txns, attached consumers, ...), after ``_before_passivate`` made
recovery cheap (a final snapshot, a cursor persist). A passivated incarnation is stopped as above:
callers get ``ActorUnavailable``, retry, find no actor once the supervisor killed it, and their
``ActorRef`` asks the supervisor to activate it again. Nothing is lost by it: passivation is a
crash chosen at a quiet moment, and every actor recovers from a crash. Should the supervisor die
before its kill, the incarnation ends its process itself after ``PASSIVATED_EXIT_S`` (Ray then
starts a fresh one), so no actor stays stopped for good.

**Drain.** ``drain`` (the supervisor's, for a restart: a rolling restart, an upgrade) stops an
incarnation gracefully whatever holds it: new calls are refused with ``ActorUnavailable`` from
the guard itself (``_call_began``), long polls are answered (``_end_long_polls``), the calls in
flight and the work they started (``_drain_pending``) get up to its timeout to finish, then
``_before_passivate`` and a stop as a passivation's. The supervisor kills the process and starts
the actor again at once (actors/restarts.py).

**Replay.** ``replay`` reads a ledger from a position in bounded chunks and applies each entry.

**Clock and seams.** Actor code takes time only from ``self.clock`` (wall ``now_ms`` for stored and
shown times, ``monotonic`` for durations and deadlines) and reaches other actors through
``self._actor_ref``; both are constructor arguments, and ``exit_process`` an attribute, so a
deterministic simulator (or a unit test) can run the real actor classes without Ray.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import ray

from raytxn.auth import Access, AuthTarget, guarded
from raytxn.client.rpc import ActorRef, retriable, unwrap
from raytxn.errors import ActorUnavailable, Fenced, MessageTooLarge
from raytxn.gc_freeze import freeze_startup_objects
from raytxn.ids import Position
from raytxn.ledger import Entry, ManagedLedger
from raytxn.metrics import recovered

T = TypeVar("T")
log = logging.getLogger(__name__)

EXIT_CODE = 3                 # a stopped incarnation's process ends with this code
REPLAY_CHUNK_ENTRIES = 5000   # entries a replay holds in memory at once
FIRST = Position(0, 0)
# Calls that are not traffic: the supervisor's probes and passivation, process facts, and the
# observations an operator's console refreshes (stats, a subscription's backlog count): watching
# an idle actor must not keep it from passivating.
UNCOUNTED_CALLS = frozenset({"ready", "passivate", "process_info", "stats", "count_backlog", "stored_backlog"})
PASSIVATED_EXIT_S = 30.0  # a passivated incarnation nobody killed ends this long after

# A drain (a restart's) is not traffic either, nor refused by itself; a drained incarnation nobody
# killed ends PASSIVATED_EXIT_S after, as a passivated one does.
DRAIN_CALL = "drain"
DRAIN_S = 10.0       # how long a drain waits for the calls in flight, by default
DRAIN_POLL_S = 0.01  # how often it looks


def ray_actor_options(max_concurrency: int) -> dict[str, Any]:
    """The Ray options of an engine actor: restarted by Ray forever; calls not retried by Ray
    (clients retry, and every call is idempotent or harmless to repeat); no CPU slot held.

    No task events: Ray records every call's state changes and ships them to the GCS for the
    dashboard's task list, which cost 7% of an actor-to-actor round trip here (0.86 vs 0.80 ms).
    The engine's calls are its data path, thousands a second, and ``raytxn`` reports them in its
    own stats. ``RAYTXN_TASK_EVENTS=1`` in the actors' environment (the driver's, for a local Ray)
    turns them on again, to see the engine's calls in Ray's dashboard."""
    return {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": max_concurrency,
            "enable_task_events": os.environ.get("RAYTXN_TASK_EVENTS", "0") == "1"}


# The engine's actor classes. A process's first handle to an actor of a class it has not loaded
# has Ray fetch the class from the GCS and unpickle it, which imports its module (and all that
# module imports): in the txn-loop profile 54% of a coordinator's busy samples, inside the timed
# first commit (468 ms vs 16 ms for the next).
ENGINE_ACTOR_MODULES = ("raytxn.actors.partition", "raytxn.actors.subscription", "raytxn.actors.coordinator")


def import_engine_actor_classes() -> None:
    """Import the engine's actor modules now, where a process starts, so that its first call to
    a partition, subscription or coordinator does not pay for it."""
    for module in ENGINE_ACTOR_MODULES:
        importlib.import_module(module)


def engine_actor_classes_imported() -> bool:
    """Whether this process has imported every engine actor module (``ready`` reports it)."""
    return all(module in sys.modules for module in ENGINE_ACTOR_MODULES)


class Clock:
    """Where actors take time from. A simulator passes its own."""

    def now_ms(self) -> int:
        """Wall time in ms: for times that are stored, compared across processes or shown."""
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for durations and deadlines in one process."""
        return time.monotonic()


SYSTEM_CLOCK = Clock()


def in_ray_actor_process() -> bool:
    """Whether this process is a Ray actor's (not a driver, a test or a simulator running the
    actor classes in their own process)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


ActorRefs = Callable[[str, "str | None"], ActorRef]  # (actor name, token) -> a reference to call it by


class ActorShell(AuthTarget):
    """The rules of the module docstring. Subclasses set ``actor_kind``, implement ``_start`` and
    have an ``info`` dict (this incarnation's facts, which ``ready`` returns)."""

    actor_kind: ClassVar[str]          # "coordinator", "partition", ...: logs and metrics
    STOP_EXIT_S: ClassVar[float] = 0.5           # long enough for the stopping call's reply to go out, under load too
    FAILED_START_EXIT_S: ClassVar[float] = 5.0   # a start that keeps failing restarts at most this often
    info: dict[str, Any]

    def __init__(self, actor_name: str, clock: Clock | None = None, actor_refs: ActorRefs | None = None) -> None:
        self.actor_name = actor_name
        self.clock = clock or SYSTEM_CLOCK
        self._actor_refs: ActorRefs = actor_refs or ActorRef
        self.exit_process: Callable[[int], object] = os._exit  # tests and a simulator replace it
        self._start_task: asyncio.Task | None = None
        self._serving = False
        self._stopped: BaseException | None = None  # what every call raises once stopped
        self._calls_in_flight = 0
        self._last_call_ended = self.clock.monotonic()
        self._draining: ActorUnavailable | None = None  # set by ``drain``: what new calls get

    # Each actor defines it: open the ledgers and rebuild the state from them, from scratch (it
    # may run again after a retriable failure). Declared, not defined, so an actor that forgot it
    # fails at its first call with AttributeError naming it, not with a placeholder's error.
    _start: Callable[[], Awaitable[None]]

    # --- start -----------------------------------------------------------------------------

    async def _started(self) -> None:
        """Return once this incarnation has started; raise if it cannot serve."""
        if self._serving:
            return
        if self._stopped is not None:
            raise self._stopped.with_traceback(None)
        task = self._start_task
        if task is None or task.done():  # never started, or the last start failed retriably
            task = self._start_task = asyncio.get_running_loop().create_task(self._run_start())
        await asyncio.shield(task)

    async def _run_start(self) -> None:
        began = self.clock.monotonic()
        try:
            await self._start()
        except Exception as raw:
            error = unwrap(raw)
            if self._stopped is not None or retriable(error):
                raise  # stopped meanwhile (a write failed), or retriable: the next call starts again
            if isinstance(error, Fenced):
                raise self._stop(error, self._unavailable(error), self.STOP_EXIT_S) from error
            self._stop(error, error, self.FAILED_START_EXIT_S)
            raise error  # noqa: B904 - the error itself (unwrapped from Ray's), as later calls get it
        if self._stopped is not None:
            raise self._stopped.with_traceback(None)
        self.info["recovery_ms"] = round((self.clock.monotonic() - began) * 1000, 3)
        self.info["started_ms"] = self.clock.now_ms()
        recovered(self.actor_kind, self.info["recovery_ms"])
        self._serving = True
        if in_ray_actor_process():
            freeze_startup_objects()  # the imports and the recovered state: out of the collector's walks
            self.info["gc_frozen_objects"] = gc.get_freeze_count()

    # --- stop ------------------------------------------------------------------------------

    async def _write(self, write: Awaitable[T]) -> T:
        """Await a write to one of this incarnation's ledgers under the stop rule."""
        try:
            return await write
        except MessageTooLarge:
            raise
        except Exception as error:
            if retriable(error) and not isinstance(error, Fenced):
                raise
            raise self._stop(error, self._unavailable(error), self.STOP_EXIT_S) from error

    def _unavailable(self, cause: BaseException) -> ActorUnavailable:
        reply = ActorUnavailable(f"{self.actor_name}: this incarnation stopped ({cause!r}); retry")
        reply.__cause__ = cause
        return reply

    def _stop(self, cause: BaseException, reply: BaseException, exit_after_s: float,
              level: int = logging.ERROR) -> BaseException:
        """Stop serving: every call from now on raises ``reply``, and the process ends in
        ``exit_after_s`` (the first stop decides). Returns what to raise."""
        if self._stopped is None:
            self._stopped = reply
            self._serving = False
            log.log(level, "%s: this incarnation stops, its process ends in %.2fs: %r",
                    self.actor_name, exit_after_s, cause)
            asyncio.get_running_loop().call_later(exit_after_s, self.exit_process, EXIT_CODE)
        return self._stopped.with_traceback(None)

    def _background(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task:
        """A loop of this incarnation (its reads, its timers). One that ends with an error stops
        the incarnation, so Ray restarts the actor and it recovers from its ledgers: it never
        serves on without the loop (a subscription whose read loop died answered every call and
        delivered nothing). Loops catch what they retry themselves (a storage hiccup); what
        reaches here is a bug or corrupt data."""
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(lambda done: self._background_ended(done, what))
        return task

    def _background_ended(self, task: asyncio.Task, what: str) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        assert error is not None
        self.info.setdefault("failed_loops", []).append(f"{what}: {error!r}")
        self._stop(error, self._unavailable(error), self.STOP_EXIT_S)

    # --- idleness and passivation ----------------------------------------------------------

    def _call_began(self, method: str) -> bool:
        if method in UNCOUNTED_CALLS or method == DRAIN_CALL:
            return False
        if self._draining is not None:  # (raised before the guard's try: no ``_call_ended``)
            raise self._draining.with_traceback(None)
        self._calls_in_flight += 1
        return True

    def _call_ended(self) -> None:
        self._calls_in_flight -= 1
        self._last_call_ended = self.clock.monotonic()

    def idle_s(self) -> float:
        """Seconds since the last counted call ended; 0 while one is being served."""
        return 0.0 if self._calls_in_flight else self.clock.monotonic() - self._last_call_ended

    def _passivation_blockers(self) -> list[str]:
        """Why this incarnation may not be passivated now (empty: it may). Partitions and
        subscriptions say what holds them; every other actor stays up."""
        return [f"a {self.actor_kind} is never passivated"]

    async def _before_passivate(self) -> None:
        """Make the next incarnation's recovery cheap (a snapshot, a persisted cursor)."""

    def _ready_info(self) -> dict[str, Any]:
        """What ``ready`` answers: the incarnation's facts, its idleness and what holds it up."""
        return {**self.info, "idle_s": round(self.idle_s(), 3),
                "passivation_blockers": self._passivation_blockers(),
                "actor_classes_imported": engine_actor_classes_imported(), "pid": os.getpid()}

    def _why_not_passivated(self, min_idle_s: float) -> list[str]:
        why = self._passivation_blockers()
        if self.idle_s() < min_idle_s:
            why.append(f"idle {self.idle_s():.1f}s < {min_idle_s}s")
        return why

    @guarded(Access.SUPERUSER)
    async def passivate(self, min_idle_s: float) -> dict[str, Any]:
        """Stop this incarnation when it has been idle ``min_idle_s`` and nothing holds it (see
        the module docstring); the supervisor kills it once this returns ``passivated``."""
        await self._started()
        if why := self._why_not_passivated(min_idle_s):
            return {"passivated": False, "why": why}
        last_call = self._last_call_ended
        await self._before_passivate()
        why = self._why_not_passivated(min_idle_s)
        if self._last_call_ended != last_call:
            why.append("a call came in meanwhile")
        if why:
            return {"passivated": False, "why": why}
        # No await since the last check: no call can slip in between it and the stop.
        reply = ActorUnavailable(f"{self.actor_name}: passivated while idle; the next call activates it again")
        self._stop(reply, reply, PASSIVATED_EXIT_S, logging.INFO)
        return {"passivated": True, "why": []}

    # --- drain (a graceful restart) ---------------------------------------------------------

    def _end_long_polls(self) -> None:
        """Answer the calls that wait for something to happen (a consumer's fetch, a read of the
        partition's end): a drain waits for the calls in flight, and those would wait seconds."""

    def _drain_pending(self) -> int:
        """Work the calls in flight started that a drain lets finish too (a coordinator's ends
        still reaching their participants); 0: none."""
        return 0

    @guarded(Access.SUPERUSER)
    async def drain(self, timeout_s: float = DRAIN_S, exit_after_s: float = PASSIVATED_EXIT_S) -> dict[str, Any]:
        """Stop this incarnation gracefully for a restart (a rolling restart, as an upgrade does):
        refuse new calls (callers get ``ActorUnavailable``, retry, and reach the next
        incarnation), answer long polls, wait up to ``timeout_s`` for the calls in flight and
        the work they started, make the next start cheap (``_before_passivate``), then stop as a
        passivation does. The supervisor kills the process once this returns; else it ends
        itself ``exit_after_s`` later and Ray starts it again (the supervisor's own restart).

        Nothing rests on the wait: what is still in flight at its end is cut as a crash cuts
        it, and every actor recovers from a crash. It spares callers the errors and retries of
        a kill, and the next incarnation a replay."""
        await self._started()
        began = self.clock.monotonic()
        if self._draining is None:
            self._draining = ActorUnavailable(f"{self.actor_name}: restarting (drained); retry")
        self._end_long_polls()
        deadline = began + timeout_s
        while (self._calls_in_flight or self._drain_pending()) and self.clock.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        cut_calls, cut_work = self._calls_in_flight, self._drain_pending()
        prepared = True
        try:
            await self._before_passivate()
        except Exception:  # only a cheaper start rested on it
            prepared = False
            log.warning("%s: preparing the next start failed during a drain", self.actor_name, exc_info=True)
        self._stop(self._draining, self._draining, exit_after_s, logging.INFO)
        return {"name": self.actor_name, "incarnation": self.info.get("incarnation"),
                "drained": cut_calls == 0 and cut_work == 0, "calls_cut": cut_calls, "work_cut": cut_work,
                "prepared": prepared, "seconds": round(self.clock.monotonic() - began, 3)}

    # --- other actors ----------------------------------------------------------------------

    def _actor_ref(self, name: str) -> ActorRef:
        """How this actor calls the actor ``name`` (with the engine's own token when auth is on)."""
        return self._actor_refs(name, self.authorizer.engine_token())


async def replay(ledger: ManagedLedger, apply: Callable[[Entry], None], start: Position = FIRST,
                 chunk_entries: int = REPLAY_CHUNK_ENTRIES) -> int:
    """Apply every entry of ``ledger`` from ``start`` (or its trim point, if later) in order,
    reading ``chunk_entries`` at a time, so memory holds one chunk however long the ledger is.
    Returns how many entries were applied."""
    position = max(start, ledger.trimmed_below)
    applied = 0
    while entries := await ledger.read(position, max_entries=chunk_entries):
        for entry in entries:
            apply(entry)
        applied += len(entries)
        last = entries[-1].position
        position = Position(last.ledger_id, last.entry_id + 1)
    return applied
