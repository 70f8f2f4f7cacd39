"""One seed -> one simulated run of the real actors -> its verdict and trace hash; many seeds.

A run: build the world (coordinators, partitions, subscriptions; ``world.py``), run the workload
(``driver.py``) with the profile's faults on, then stop the faults (the quiet period: every actor
up, no drops, no storage errors) and check liveness and safety:

- every transaction ends (no coordinator lists a live one) and each coordinator's low watermark
  reaches its last sequence;
- every input is transformed by a committed txn, and no partition still holds an ongoing txn;
- the history passes the exactly-once checker (DESIGN §7), and the state machines' own
  ``check_invariants`` pass;
- nothing but raytxn's own errors reached a client, and no actor task died of an unexpected error.

A ``Schedule`` (``schedule.py``) runs a smaller version of the same seed (what ``shrink.py``
searches); an extra check (``module:function`` on the command line) adds a property of the history
to the verdict, e.g. to find and shrink a run where something rare happens.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from raytxn.actors.coordinator import TransactionCoordinator
from raytxn.actors.partition import PartitionBuffer
from raytxn.actors.subscription import Subscription
from raytxn.config import CoordinatorConfig, PartitionConfig, SubscriptionConfig
from raytxn.errors import InvalidArgument
from raytxn.ids import coordinator_actor_name, partition_actor_name, subscription_actor_name
from raytxn.sim.driver import SUB_PIPE, SUB_VERIFY, TOPIC_IN, TOPIC_OUT, Driver, Workload
from raytxn.sim.gate import FaultGate
from raytxn.sim.loop import Deadlock, SimLoop
from raytxn.sim.profiles import PROFILES, Profile
from raytxn.sim.schedule import Schedule
from raytxn.sim.trace import Trace
from raytxn.sim.world import World
from raytxn.tools.checker import check
from raytxn.tools.history import History

MAX_VIRTUAL_S = 600.0       # a run not done by then (virtual time) fails as stuck
QUIET_WAIT_S = 60.0         # after the faults stop, the time every txn has to end
STUCK_SLACK_S = 10.0        # the checker's slack on "no consumer stays blocked past the txn timeout"

# An extra property of a run's history: a message when it does not hold (the run fails), else None.
ExtraCheck = Callable[[History], "str | None"]


@dataclass
class SeedResult:
    seed: int
    profile: str
    failure: str | None          # None: every check passed
    digest: str                  # the trace's hash: the same seed gives the same one
    txns: int = 0
    committed: int = 0
    aborted: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    virtual_s: float = 0.0
    wall_s: float = 0.0
    trace_lines: list[str] | None = None
    schedule: Schedule | None = None
    check: str | None = None     # the extra check's module:function
    txns_started: int = 0        # txns the clients set out to begin (what a schedule's max_txns caps)
    # Faults that took effect per gated kind (gate.py), slow operations included.
    fault_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def fault_total(self) -> int:
        return sum(self.fault_kinds.values())

    def replay_command(self) -> str:
        command = f"raytxn sim --seed {self.seed} --seeds 1 --faults {self.profile}"
        if self.schedule is not None and str(self.schedule):
            command += f" --schedule '{self.schedule}'"
        if self.check is not None:
            command += f" --check {self.check}"
        return command


def _configs() -> tuple[CoordinatorConfig, PartitionConfig, SubscriptionConfig]:
    """Small thresholds, so compaction, snapshots, trims and dangling checks all happen in a run."""
    coordinator = CoordinatorConfig(compact_after_entries=40)
    partition = PartitionConfig(snapshot_every_txns=8, snapshot_interval_s=1.0, dangling_check_s=0.5)
    subscription = SubscriptionConfig(cursor_snapshot_interval_s=0.2, trim_interval_s=0.5)
    return coordinator, partition, subscription


def build_world(loop: SimLoop, rng: random.Random, trace: Trace, profile: Profile, workload: Workload,
                gate: FaultGate | None = None) -> World:
    world = World(loop, rng, trace, profile.storage, profile.network, profile.crashes, gate)
    coordinator_config, partition_config, subscription_config = _configs()
    coordinator_config.num_coordinators = workload.coordinators
    for tc_id in range(workload.coordinators):
        world.add(coordinator_actor_name(tc_id),
                  lambda tc_id=tc_id, **seams: TransactionCoordinator(tc_id, config=coordinator_config, **seams))
    for topic in (TOPIC_IN, TOPIC_OUT):
        for p in range(workload.partitions):
            world.add(partition_actor_name(topic, p),
                      lambda topic=topic, p=p, **seams: PartitionBuffer(topic, p, config=partition_config, **seams))
    for topic, name in ((TOPIC_IN, SUB_PIPE), (TOPIC_OUT, SUB_VERIFY)):
        for p in range(workload.partitions):
            world.add(subscription_actor_name(topic, p, name),
                      lambda topic=topic, p=p, name=name, **seams: Subscription(
                          topic, p, name, "earliest", config=subscription_config, **seams))
    return world


async def _scenario(world: World, driver: Driver, profile: Profile, workload: Workload) -> None:
    loop = world.loop
    crashable = [name for name in world.names() if profile.crashes.mean_interval_s > 0]
    nemesis = loop.create_task(world.nemesis(crashable, profile.fault_window_s))
    jobs = [loop.create_task(driver.seed_inputs())]
    jobs += [loop.create_task(driver.tid_producer(i)) for i in range(workload.tid_producers)]
    jobs += [loop.create_task(driver.worker(i)) for i in range(workload.workers)]

    # Faults run for the profile's window; then the quiet period: every actor up, no faults.
    await asyncio.sleep(profile.fault_window_s)
    world.storage.faults_on = False
    world.network.faults_on = False
    await nemesis
    world.restart_all_down()
    world.trace.add("quiet")
    quiet_began = driver.quiet_since = loop.time()

    await asyncio.gather(*jobs)
    deadline = quiet_began + QUIET_WAIT_S
    while live := await driver.live_txns():
        if loop.time() > deadline:
            raise Failure(f"liveness: {len(live)} txns still live {QUIET_WAIT_S}s into the quiet period: {live[:5]}")
        await asyncio.sleep(0.5)
    for tc_id, (low, next_sequence) in enumerate(await driver.low_watermarks()):
        if low != next_sequence - 1:
            raise Failure(f"liveness: coordinator {tc_id} low watermark {low}, next sequence {next_sequence}")
    await driver.drain(TOPIC_OUT, SUB_VERIFY)
    await driver.drain(TOPIC_IN, SUB_PIPE)
    _check_actor_invariants(world, workload)


def _check_actor_invariants(world: World, workload: Workload) -> None:
    for tc_id in range(workload.coordinators):
        world.actor(coordinator_actor_name(tc_id)).state.check_invariants()
    for topic in (TOPIC_IN, TOPIC_OUT):
        for p in range(workload.partitions):
            ongoing = world.actor(partition_actor_name(topic, p)).buffer.ongoing_coordinators()
            if ongoing:
                raise Failure(f"liveness: partition {topic}-{p} still has ongoing txns of coordinators {ongoing}")
    for topic, name in ((TOPIC_IN, SUB_PIPE), (TOPIC_OUT, SUB_VERIFY)):
        for p in range(workload.partitions):
            state = world.actor(subscription_actor_name(topic, p, name)).state
            state.pending.check_invariants()
            state.cursor.check_invariants()


class Failure(Exception):
    """A broken invariant found by the harness (not by the actors)."""


def run_seed(seed: int, profile_name: str = "default", workload: Workload | None = None,
             keep_trace: bool = False, schedule: Schedule | None = None,
             extra_check: ExtraCheck | None = None) -> SeedResult:
    """Simulate one seed; never raises for what the run found (it is in ``failure``).
    ``schedule`` overrides parts of the profile and workload; ``extra_check`` must be a module-level
    function (its ``module:function`` is part of the replay command)."""
    schedule = schedule or Schedule()
    profile, workload = schedule.apply(PROFILES[profile_name], workload or Workload())
    began = time.perf_counter()
    loop = SimLoop()
    rng = random.Random(seed)
    trace = Trace(loop.time, keep=keep_trace)
    history = History()
    # Unretrieved errors are reported when the collector frees their future: at a moment that
    # depends on the whole heap, so they touch neither the trace nor the verdict (tasks' broken
    # invariants are noted when they end, see SimLoop._note_broken).
    loop.set_exception_handler(lambda _loop, _context: None)
    world = build_world(loop, rng, trace, profile, workload, schedule.gate(trace))
    driver = Driver(world, rng, workload, history)
    failure: str | None = None
    with _quiet_logs():
        try:
            loop.run_until_complete(asyncio.wait_for(_scenario(world, driver, profile, workload), MAX_VIRTUAL_S))
        except Failure as found:
            failure = str(found)
        except TimeoutError:
            failure = f"liveness: the run did not finish within {MAX_VIRTUAL_S}s of simulated time"
        except Deadlock as found:
            failure = str(found)
        except AssertionError as found:
            failure = f"invariant: {found!r}"
        except Exception as error:  # noqa: BLE001 - a client met an error it cannot go past: the verdict
            failure = f"error reached the workload: {error!r}"
        finally:
            broken = list(loop.broken)  # before the shutdown cancels what still runs
            _shut_down(loop)
    if failure is None and driver.unexpected:
        failure = f"unexpected client errors: {driver.unexpected[:3]}"
    if failure is None and broken:
        failure = f"invariant broken in a task: {broken[:3]}"
    if failure is None:
        report = check(history, txn_timeout_s=workload.txn_timeout_ms / 1000, stuck_slack_s=STUCK_SLACK_S)
        if not report.clean:
            failure = f"checker found {', '.join(sorted(report.kinds()))}: {report.summary(3)}"
    if failure is None and extra_check is not None and (broken_property := extra_check(history)) is not None:
        failure = f"extra check: {broken_property}"
    for event in history.events:  # what the workload saw is part of the trace too
        trace.add("history", repr(event))
    counts = driver.counts
    trace.add("end", failure or "ok", counts.txns, counts.committed, counts.aborted)
    return SeedResult(seed, profile_name, failure, trace.digest(), counts.txns, counts.committed, counts.aborted,
                      {"storage": world.storage.injected, "network": world.network.injected,
                       "crashes": world.crashes, "zombies": world.zombies},
                      loop.time(), time.perf_counter() - began, trace.kept, schedule=schedule,
                      check=None if extra_check is None else check_spec(extra_check),
                      txns_started=driver.txns_started, fault_kinds=dict(sorted(world.gate.counts.items())))


def check_spec(check: ExtraCheck) -> str:
    """``module:function``, as ``load_check`` finds it again."""
    return f"{check.__module__}:{check.__qualname__}"


def load_check(spec: str) -> ExtraCheck:
    """The function ``module:function`` names (the module is looked for in the current directory
    too, so a check in a repository's tests replays from its root as printed)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name.isidentifier():
        raise InvalidArgument(f"--check takes module:function, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as missing:
        if not missing.name or not (module_name + ".").startswith(missing.name + "."):
            raise  # the check's module is there but imports something that is not
        if os.getcwd() in sys.path:
            raise InvalidArgument(f"--check {spec}: no module {module_name!r}") from None
        sys.path.append(os.getcwd())
        return load_check(spec)
    check = getattr(module, name, None)
    if not callable(check):
        raise InvalidArgument(f"--check {spec}: {module_name} has no function {name!r}")
    return check


def _shut_down(loop: SimLoop) -> None:
    """Cancel whatever still runs (background timers, zombies) and close the loop."""
    for _ in range(10):
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        if not pending:
            break
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


class _quiet_logs:
    """The actors log every retried failure; thousands per run cost time and say nothing here."""

    def __enter__(self) -> None:
        self._level = logging.getLogger("raytxn").level
        logging.getLogger("raytxn").setLevel(logging.CRITICAL)
        self._asyncio = logging.getLogger("asyncio").level
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("raytxn").setLevel(self._level)
        logging.getLogger("asyncio").setLevel(self._asyncio)


def _run_one(job: tuple[int, str, bool, Schedule | None, ExtraCheck | None]) -> SeedResult:
    seed, profile_name, keep_trace, schedule, extra_check = job
    result = run_seed(seed, profile_name, keep_trace=keep_trace, schedule=schedule, extra_check=extra_check)
    if result.ok:
        result.trace_lines = None  # only failing seeds' traces travel back
    return result


def run_many(seeds: Iterable[int], profile_name: str = "default", jobs: int = 1,
             keep_trace: bool = False, schedule: Schedule | None = None,
             extra_check: ExtraCheck | None = None) -> Iterator[SeedResult]:
    """``run_seed`` for each seed, in seed order; ``jobs`` > 1 runs them in that many processes
    (each seed is deterministic on its own, so parallelism changes no result)."""
    work = [(seed, profile_name, keep_trace, schedule, extra_check) for seed in seeds]
    if jobs <= 1:
        yield from map(_run_one, work)
        return
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        yield from pool.imap(_run_one, work, chunksize=4)
