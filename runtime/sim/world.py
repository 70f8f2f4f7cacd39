"""The simulated cluster: named actor processes built from the real actor classes, their crashes
and restarts, and the nemesis that schedules them.

A ``Process`` is one incarnation of a named actor: the actor object and every task it created
(the loop tags them, see ``loop.py``). ``crash`` ends it: its tasks are cancelled and its memory is
gone; after a restart delay a fresh object of the same class is built, which recovers from the
simulated storage on its first call, exactly as a Ray restart does. A crash may instead leave a
*zombie*: the old process keeps running (its timers, its calls in flight, and calls from
references that still point at it) beside its successor, until it is killed later or stops itself
(a write found the stream fenced: the shell's ``exit_process``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raytxn.actors.shell import ActorShell, Clock
from raytxn.errors import RaytxnError
from raytxn.sim.gate import FaultGate
from raytxn.sim.loop import SimLoop
from raytxn.sim.network import Network, NetworkFaults
from raytxn.sim.storage import SimStorage, StorageFaults
from raytxn.sim.trace import Trace

EPOCH_MS = 1_700_000_000_000  # the wall clock's reading at virtual time 0
PASSIVATED_KINDS = ("partition-", "sub-")  # the actors the supervisor passivates (``raytxn.ids`` names)


class SimClock(Clock):
    """The actors' clock on the loop's virtual time."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def now_ms(self) -> int:
        return EPOCH_MS + int(self._loop.time() * 1000)

    def monotonic(self) -> float:
        return self._loop.time()


@dataclass(frozen=True)
class CrashFaults:
    """The nemesis: a crash every ``mean_interval_s`` on average (0: never)."""

    mean_interval_s: float = 0.0
    zombie: float = 0.0                          # probability that a crash leaves a zombie
    restart_delay_s: tuple[float, float] = (0.01, 0.5)
    zombie_lifetime_s: tuple[float, float] = (0.05, 2.0)
    # Probability that a nemesis event on a partition or subscription is a passivation instead:
    # the supervisor's ``passivate`` call (refused while something holds the actor), then its
    # kill a moment later, and an activation after the restart delay (no calls reach it between).
    passivate: float = 0.0
    passivation_kill_delay_s: tuple[float, float] = (0.0, 0.05)


class Process:
    """One incarnation of a named actor."""

    def __init__(self, world: World, name: str, incarnation: int, actor: ActorShell) -> None:
        self.world = world
        self.name = name
        self.incarnation = incarnation
        self.label = f"{name}#{incarnation}"
        self.actor = actor
        self.alive = True
        actor.exit_process = self._exit

    def invoke(self, method: str, args: tuple, kwargs: dict[str, Any]) -> asyncio.Task:
        """Run one call of ``method`` as a task of this process."""
        # The actor's methods are coroutine functions (the ``guarded`` wrapper is one): the call
        # builds the coroutine the task runs, and runs nothing of it yet (a wrapper coroutine
        # around it was one more frame on every step of every call).
        try:
            call = getattr(self.actor, method)(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - arguments that do not bind: the call's task fails with it
            call = _raise(error)
        return self.world.loop.spawn(self, call)

    def _exit(self, code: int) -> None:
        """The actor ended its own process (the shell's stop rule); a no-op once it is dead (the
        shell's timer outlives a crash)."""
        if self.alive:
            self.world.trace.add("exit", self.label, code)
            self.world.kill(self, restart=True)


async def _raise(error: Exception) -> None:
    raise error


class World:
    def __init__(self, loop: SimLoop, rng: random.Random, trace: Trace, storage_faults: StorageFaults,
                 network_faults: NetworkFaults, crash_faults: CrashFaults, gate: FaultGate | None = None) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.gate = FaultGate(trace) if gate is None else gate  # shared by storage, network and nemesis
        self.clock = SimClock(loop)
        self.storage = SimStorage(rng, storage_faults, trace, self.clock.now_ms, self.gate, loop)
        self.network = Network(self, rng, network_faults, trace)
        self.crash_faults = crash_faults
        self._factories: dict[str, Callable[[], ActorShell]] = {}
        self._current: dict[str, Process] = {}
        self._incarnations: dict[str, int] = {}
        self.started_at: dict[str, list[float]] = {}  # name -> when each incarnation started
        self.crashes = 0
        self.zombies = 0
        self.passivations = 0

    # --- actors ----------------------------------------------------------------------------

    def add(self, name: str, build: Callable[..., ActorShell]) -> None:
        """Register the actor ``name``; ``build(clock=, actor_refs=, storage=)`` makes one
        incarnation of it (the real class's constructor)."""
        self._factories[name] = lambda: build(clock=self.clock, actor_refs=self.network.ref, storage=self.storage)
        self._start(name)

    def _start(self, name: str) -> Process:
        incarnation = self._incarnations.get(name, 0) + 1
        self._incarnations[name] = incarnation
        process = Process(self, name, incarnation, self._factories[name]())
        self._current[name] = process
        self.started_at.setdefault(name, []).append(self.loop.time())
        self.trace.add("start", process.label)
        return process

    def current(self, name: str) -> Process | None:
        return self._current.get(name)

    def names(self) -> list[str]:
        return sorted(self._factories)

    def actor(self, name: str) -> Any:
        return self._current[name].actor

    def is_up(self, name: str) -> bool:
        process = self._current.get(name)
        return process is not None and process.alive

    # --- crashes ---------------------------------------------------------------------------

    def kill(self, process: Process, restart: bool) -> None:
        """End ``process`` now; when it is still the current incarnation and ``restart``, start
        its successor after a restart delay."""
        if not process.alive:
            return
        process.alive = False
        cancelled = self.loop.kill_owner(process)
        self.trace.add("kill", process.label, cancelled)
        if restart and self._current.get(process.name) is process:
            delay = self.rng.uniform(*self.crash_faults.restart_delay_s)
            self.loop.call_later(delay, self._restart, process)

    def _restart(self, dead: Process) -> None:
        if self._current.get(dead.name) is dead:
            self._start(dead.name)

    def crash(self, name: str, zombie: bool) -> None:
        """Crash the current incarnation of ``name``; a zombie keeps running beside its successor
        for a while. The gate may turn the crash into a plain one (zombies masked) or suppress it."""
        process = self._current.get(name)
        if process is None or not process.alive:  # (None: removed, its topic deleted)
            return
        if zombie and self.gate.is_masked("zombie") and not self.gate.is_masked("crash"):
            zombie = False  # zombies masked, crashes not: the crash is a plain one
        if not self.gate.allow("zombie" if zombie else "crash"):
            return
        self.crashes += 1
        if not zombie:
            self.kill(process, restart=True)
            return
        self.zombies += 1
        self.trace.add("zombie", process.label)
        self._start(name)
        lifetime = self.rng.uniform(*self.crash_faults.zombie_lifetime_s)
        self.loop.call_later(lifetime, self.kill, process, False)

    def remove(self, names: list[str]) -> None:
        """End the actors ``names`` for good, as a deletion kills them: calls find no actor of
        that name from now on (``ActorNotFound``), and neither the nemesis nor the quiet period
        brings them back. A zombie incarnation lives out its time."""
        for name in names:
            self._factories.pop(name, None)
            process = self._current.pop(name, None)
            if process is not None:
                self.trace.add("removed", process.label)
                self.kill(process, restart=False)

    def restart_all_down(self) -> None:
        """Bring every crashed actor back now (the quiet period starts with all of them up)."""
        for name in self.names():
            if not self._current[name].alive:
                self._start(name)

    async def nemesis(self, names: list[str], until_s: float) -> None:
        """Crash (or passivate) random actors of ``names`` until virtual time ``until_s``."""
        faults = self.crash_faults
        if faults.mean_interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.rng.expovariate(1.0 / faults.mean_interval_s))
            if self.loop.time() >= until_s:
                return
            name = names[self.rng.randrange(len(names))]
            # (no draw without passivations: the other profiles keep their recorded schedules)
            if faults.passivate > 0 and name.startswith(PASSIVATED_KINDS) and self.rng.random() < faults.passivate:
                self.passivate(name)
            else:
                self.crash(name, zombie=self.rng.random() < faults.zombie)

    def passivate(self, name: str) -> None:
        """As the supervisor passivates an idle actor: ask the current incarnation to stop (it
        refuses while open txns, consumers, ... hold it) and, when it did, kill it a moment later
        (Ray's kill is not instant: calls still reach the stopped incarnation, and are refused)."""
        process = self._current.get(name)
        if process is None or not process.alive or not self.gate.allow("crash"):
            return

        async def passivate() -> None:
            try:
                reply = await process.actor.passivate(0.0)
            except RaytxnError as error:  # stopped or not started: as Ray's call failing
                self.trace.add("passivate", process.label, repr(error))
                return
            self.trace.add("passivate", process.label, reply["passivated"])
            if reply["passivated"]:
                self.passivations += 1
                delay = self.rng.uniform(*self.crash_faults.passivation_kill_delay_s)
                self.loop.call_later(delay, self.kill, process, True)

        self.loop.spawn(process, passivate())
