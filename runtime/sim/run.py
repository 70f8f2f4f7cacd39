"""One seed -> one simulated run of the real actors -> its verdict and trace hash; many seeds.

A run: build the world (coordinators, partitions, subscriptions; ``world.py``), run the workload
(``driver.py``) with the profile's faults on, then stop the faults (the quiet period: every actor
up, no drops, no storage errors) and check liveness and safety:

- every transaction ends (no coordinator lists a live one) and each coordinator's low watermark
  reaches its last sequence;
- every input is transformed by a committed txn or still in the pipeline subscription's final
  drain, and no partition still holds an ongoing txn;
- the history passes the exactly-once checker (docs/design.md §7), and the state machines' own
  ``check_invariants`` pass;
- nothing but raytxn's own errors reached a client, and no actor task died of an unexpected error.

A ``Schedule`` (``schedule.py``) runs a smaller version of the same seed (what ``shrink.py``
searches); an extra check (``module:function`` on the command line) adds a property of the history
to the verdict, e.g. to find and shrink a run where something rare happens.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import multiprocessing
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raytxn.actors.compaction import NOT_COMPACTED
from raytxn.actors.coordinator import TransactionCoordinator
from raytxn.actors.partition import PartitionBuffer
from raytxn.actors.subscription import Subscription
from raytxn.config import CoordinatorConfig, PartitionConfig, SubscriptionConfig
from raytxn.errors import InvalidArgument
from raytxn.ids import SUPERVISOR_NAME, coordinator_actor_name, partition_actor_name, subscription_actor_name
from raytxn.metrics import not_recorded
from raytxn.sim import stateful
from raytxn.sim.compacted import CompactedTopic, add_compacted_topics, numbered_nonces, one_of_each
from raytxn.sim.compaction import KV, SUB_AUDIT, CompactionRun, kv_topic
from raytxn.sim.compaction import uid_of as kv_uid_of
from raytxn.sim.driver import SUB_PIPE, SUB_VERIFY, TOPIC_IN, TOPIC_OUT, Driver, Workload
from raytxn.sim.gate import FaultGate
from raytxn.sim.keyshared import violations as key_shared_violations
from raytxn.sim.leases import LEASE_TIMEOUT_S, SUB_LEASE, lease_holder
from raytxn.sim.leases import unprocessed as lease_unprocessed
from raytxn.sim.leases import violations as lease_violations
from raytxn.sim.loop import Deadlock, SimLoop
from raytxn.sim.pipelined import pipelined_producer
from raytxn.sim.pipelined import violations as pipelined_violations
from raytxn.sim.profiles import PROFILES, Profile, profile_of_seed
from raytxn.sim.schedule import Schedule
from raytxn.sim.supervisor import CatalogStore, SimSupervisor
from raytxn.sim.trace import Trace
from raytxn.sim.workloads import DOOMED_SUB, doomed_topic, doomed_topic_name, exclusive_turns
from raytxn.sim.world import World
from raytxn.testing_bugs import active, reintroduced
from raytxn.tools.checker import COMMITTED, UNDECIDED, Report, check
from raytxn.tools.history import FinalState, History, SendOk, Transformed

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
    chained: int = 0             # txns run in the txn the previous commit began (the chained profile)
    released: int = 0            # chained txns nobody took, aborted unused (release_unused)
    # Commits the coordinators' last incarnations answered once logged, before their participants
    # had them (the early-answer profile; a crashed incarnation's count is lost with it).
    answered_at_log: int = 0
    reintroduced: tuple[str, ...] = ()  # the historical bugs switched on for the run (testing_bugs)
    workload_stats: dict[str, int] = field(default_factory=dict)  # what a workload of its own did

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def fault_total(self) -> int:
        return sum(self.fault_kinds.values())

    def replay_command(self) -> str:
        command = f"raytxn sim --seed {self.seed} --seeds 1 --faults {self.profile}"
        command += "".join(f" --reintroduce {name}" for name in self.reintroduced)
        if self.schedule is not None and str(self.schedule):
            command += f" --schedule '{self.schedule}'"
        if self.check is not None:
            command += f" --check {self.check}"
        return command


def _configs() -> tuple[CoordinatorConfig, PartitionConfig, SubscriptionConfig]:
    """Small thresholds, so compaction, snapshots, trims and dangling checks all happen in a run."""
    coordinator = CoordinatorConfig(compact_after_entries=40)
    partition = PartitionConfig(snapshot_every_txns=8, snapshot_interval_s=1.0, dangling_check_s=0.5)
    # Reads long-poll 0.5 s here, not the default 5 s: more reads per simulated second, more
    # interleavings with crashes and rewinds (and the recorded seeds keep their schedules).
    # No backlog gauge (the simulator records no metrics): its partition reads would change the schedules.
    subscription = SubscriptionConfig(cursor_snapshot_interval_s=0.2, trim_interval_s=0.5, read_wait_s=0.5,
                                      stale_txn_check_s=0.5, backlog_metric_interval_s=None)
    return coordinator, partition, subscription


def build_world(loop: SimLoop, rng: random.Random, trace: Trace, profile: Profile, workload: Workload,
                gate: FaultGate | None = None) -> World:
    world = World(loop, rng, trace, profile.storage, profile.network, profile.crashes, gate)
    coordinator_config, partition_config, subscription_config = _configs()
    coordinator_config.num_coordinators = workload.coordinators
    coordinator_config.commit_answer = workload.commit_answer
    if profile.max_recent_outcomes is not None:
        coordinator_config.max_recent_outcomes = profile.max_recent_outcomes
    for tc_id in range(workload.coordinators):
        world.add(coordinator_actor_name(tc_id),
                  lambda tc_id=tc_id, **seams: TransactionCoordinator(tc_id, config=coordinator_config, **seams))
    for topic in _plain_topics(workload):
        for p in range(workload.partitions):
            world.add(partition_actor_name(topic, p),
                      lambda topic=topic, p=p, **seams: PartitionBuffer(topic, p, config=partition_config,
                                                                        compaction=NOT_COMPACTED, **seams))
    for topic, name in _subscriptions(workload):
        for p in range(workload.partitions):
            world.add(subscription_actor_name(topic, p, name),
                      lambda topic=topic, p=p, name=name, **seams: Subscription(
                          topic, p, name, "earliest", config=subscription_config, **seams))
    if workload.doomed_topics:
        _add_doomed_topics(world, workload, partition_config, subscription_config)
    if compacted := _compacted_topics(workload):
        add_compacted_topics(world, compacted, partition_config, subscription_config)
    return world


def _plain_topics(workload: Workload) -> list[str]:
    return [TOPIC_IN, TOPIC_OUT] * workload.pipeline + [stateful.SRC, stateful.SINK] * workload.stateful


def _compacted_topics(workload: Workload) -> list[CompactedTopic]:
    return ([kv_topic(workload.partitions)] * workload.compaction
            + [stateful.state_topic(workload.partitions)] * workload.stateful)


def _subscriptions(workload: Workload) -> list[tuple[str, str]]:
    """(topic, subscription) of the run's subscriptions on plain topics (the lease holders' own,
    on the output, only when there are some, so other runs keep their traces)."""
    subscriptions = [(TOPIC_IN, SUB_PIPE), (TOPIC_OUT, SUB_VERIFY)] if workload.pipeline else []
    if workload.stateful:
        subscriptions += [(stateful.SRC, stateful.SUB_INPUT), (stateful.SINK, stateful.SUB_OUTPUT)]
    if workload.lease_holders:
        subscriptions.append((TOPIC_OUT, SUB_LEASE))
    return subscriptions


def _add_doomed_topics(world: World, workload: Workload, partition_config: PartitionConfig,
                       subscription_config: SubscriptionConfig) -> None:
    """The topics ``doomed_topic`` deletes (one partition, one subscription each), and the
    supervisor's catalog that deletes them and tells the coordinators they are gone."""
    store = CatalogStore()
    store.add_topic(TOPIC_IN, workload.partitions, [SUB_PIPE])
    store.add_topic(TOPIC_OUT, workload.partitions, [SUB_VERIFY])
    world.add(SUPERVISOR_NAME, lambda **seams: SimSupervisor(store, world.remove, **seams))
    for index in range(workload.doomed_topics):
        topic = doomed_topic_name(index)
        store.add_topic(topic, 1, [DOOMED_SUB])
        world.add(partition_actor_name(topic, 0),
                  lambda topic=topic, **seams: PartitionBuffer(topic, 0, config=partition_config,
                                                               compaction=NOT_COMPACTED, **seams))
        world.add(subscription_actor_name(topic, 0, DOOMED_SUB),
                  lambda topic=topic, **seams: Subscription(topic, 0, DOOMED_SUB, "earliest",
                                                            config=subscription_config, **seams))


@dataclass
class _Extras:
    """The state of the workloads of their own a run has (None: not in this run)."""

    compaction: CompactionRun | None = None
    keyed_state: stateful.StatefulRun | None = None

    def jobs(self) -> list[Any]:
        return [*(self.compaction.jobs() if self.compaction else []),
                *(self.keyed_state.jobs() if self.keyed_state else [])]

    def stats(self) -> dict[str, int]:
        return {**(self.compaction.stats() if self.compaction else {}),
                **(self.keyed_state.stats() if self.keyed_state else {})}


async def _scenario(world: World, driver: Driver, profile: Profile, workload: Workload, extras: _Extras) -> None:
    loop = world.loop
    crashable = [name for name in world.names() if profile.crashes.mean_interval_s > 0]
    nemesis = loop.create_task(world.nemesis(crashable, profile.fault_window_s))
    jobs = []
    if workload.pipeline:
        jobs += [loop.create_task(driver.seed_inputs())]
        jobs += [loop.create_task(driver.tid_producer(i)) for i in range(workload.tid_producers)]
        if workload.exclusive_turns:
            jobs += [loop.create_task(exclusive_turns(driver, p)) for p in range(workload.partitions)]
        else:
            jobs += [loop.create_task(driver.worker(i)) for i in range(workload.workers)]
    jobs += [loop.create_task(job) for job in extras.jobs()]
    doomed = [loop.create_task(doomed_topic(driver, i)) for i in range(workload.doomed_topics)]
    jobs += [loop.create_task(pipelined_producer(driver, i, TOPIC_OUT, workload.pipelined_messages))
             for i in range(workload.pipelined_producers)]
    jobs += [loop.create_task(lease_holder(driver, i, TOPIC_OUT)) for i in range(workload.lease_holders)]

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
    if doomed:  # an end that never returns (its txn never ends) is reported as a live txn below
        done, _ = await asyncio.wait(doomed, timeout=max(0.0, deadline - loop.time()))
        for task in done:
            task.result()  # an error the workload met is the verdict, as for the other jobs
    while live := await driver.live_txns():
        if loop.time() > deadline:
            raise Failure(f"liveness: {len(live)} txns still live {QUIET_WAIT_S}s into the quiet period: {live[:5]}")
        await asyncio.sleep(0.5)
    for tc_id, (low, next_sequence) in enumerate(await driver.low_watermarks()):
        if low != next_sequence - 1:
            raise Failure(f"liveness: coordinator {tc_id} low watermark {low}, next sequence {next_sequence}")
    if workload.pipeline:
        await driver.drain(TOPIC_OUT, SUB_VERIFY)
        await driver.drain(TOPIC_IN, SUB_PIPE)
    if extras.compaction is not None:
        await driver.drain(KV, SUB_AUDIT, uid_of=kv_uid_of)
        await extras.compaction.finish()
    if extras.keyed_state is not None:
        await asyncio.sleep(2 * stateful.LEASE_TIMEOUT_S)  # a lease a crashed incarnation left standing expires
        await driver.drain(stateful.SINK, stateful.SUB_OUTPUT)
        await driver.drain(stateful.SRC, stateful.SUB_INPUT)
        await extras.keyed_state.finish()
    if workload.lease_holders:
        await asyncio.sleep(2 * LEASE_TIMEOUT_S)  # a lease the holders left standing expires
        await driver.drain(TOPIC_OUT, SUB_LEASE)
    _check_actor_invariants(world, workload)


def _check_actor_invariants(world: World, workload: Workload) -> None:
    for tc_id in range(workload.coordinators):
        world.actor(coordinator_actor_name(tc_id)).state.check_invariants()
    compacted = _compacted_topics(workload)
    for topic in [*_plain_topics(workload), *(t.name for t in compacted)]:
        for p in range(workload.partitions):
            ongoing = world.actor(partition_actor_name(topic, p)).buffer.ongoing_coordinators()
            if ongoing:
                raise Failure(f"liveness: partition {topic}-{p} still has ongoing txns of coordinators {ongoing}")
    for topic, name in [*_subscriptions(workload),
                        *((t.name, sub) for t in compacted for sub in (*t.subscriptions, *t.uncatalogued))]:
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
    base_profile = PROFILES[profile_name]
    profile, workload = schedule.apply(base_profile, workload or base_profile.workload)
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
    extras = _Extras(CompactionRun(driver) if workload.compaction else None,
                     stateful.StatefulRun(driver) if workload.stateful else None)
    failure: str | None = None
    with _quiet_logs(), _fewer_collections(), not_recorded(), numbered_nonces():
        try:
            loop.run_until_complete(asyncio.wait_for(_scenario(world, driver, profile, workload, extras),
                                                     MAX_VIRTUAL_S))
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
        report = check(history, txn_timeout_s=workload.txn_timeout_ms / 1000, stuck_slack_s=STUCK_SLACK_S,
                       key_shared=[SUB_PIPE] if workload.key_shared else [])
        if not report.clean:
            failure = f"checker found {', '.join(sorted(report.kinds()))}: {report.summary(3)}"
        elif untransformed := _untransformed_inputs(history, report):
            failure = (f"lost: {len(untransformed)} inputs consumed but neither transformed by a committed txn "
                       f"nor left in the drain of {SUB_PIPE}: {untransformed[:5]}")
        elif workload.key_shared and (broken_keys := key_shared_violations(driver.key_log, {
                p: world.started_at.get(subscription_actor_name(TOPIC_IN, p, SUB_PIPE), [])
                for p in range(workload.partitions)})):
            failure = f"Key_Shared: {'; '.join(broken_keys)}"
        elif workload.lease_holders and (missed := lease_unprocessed(history, report.txn_outcomes, TOPIC_OUT)):
            failure = (f"lost: {len(missed)} messages of {TOPIC_OUT} neither consumed by a committed txn of a lease "
                       f"holder nor left in the drain of {SUB_LEASE}: {missed[:5]}")
        elif workload.lease_holders and (broken_leases := lease_violations(
                driver.lease_acks, report.txn_outcomes, driver.lease_read_errors)):
            failure = f"leases: {'; '.join(broken_leases)}"
        elif extras.compaction is not None and (broken_compaction := extras.compaction.violations(
                history, report.txn_outcomes)):
            failure = f"compaction: {'; '.join(one_of_each(broken_compaction))}"
        elif extras.keyed_state is not None and (broken_state := extras.keyed_state.violations(
                history, report.txn_outcomes)):
            failure = f"stateful: {'; '.join(one_of_each(broken_state))}"
    if failure is None and workload.pipelined_producers and (
            broken_pipeline := pipelined_violations(history, TOPIC_OUT, SUB_VERIFY, driver.pipelined_acked,
                                                   driver.pipelined_failed)):
        failure = f"pipelined producers: {'; '.join(broken_pipeline)}"
    if failure is None and extra_check is not None and (broken_property := extra_check(history)) is not None:
        failure = f"extra check: {broken_property}"
    for event in history.events:  # what the workload saw is part of the trace too
        trace.add("history", repr(event))
    counts = driver.counts
    trace.add("end", failure or "ok", counts.txns, counts.committed, counts.aborted)
    return SeedResult(seed, profile_name, failure, trace.digest(), counts.txns, counts.committed, counts.aborted,
                      {"storage": world.storage.injected, "network": world.network.injected,
                       "crashes": world.crashes, "zombies": world.zombies,
                       "passivations": world.passivations},
                      loop.time(), time.perf_counter() - began, trace.kept, schedule=schedule,
                      check=None if extra_check is None else check_spec(extra_check), chained=counts.chained,
                      released=counts.released, answered_at_log=_answered_at_log(world, workload),
                      txns_started=driver.txns_started, fault_kinds=dict(sorted(world.gate.counts.items())),
                      reintroduced=active(), workload_stats=extras.stats())


def _answered_at_log(world: World, workload: Workload) -> int:
    return sum(world.actor(coordinator_actor_name(tc_id)).info["commits_answered_at_log"]
               for tc_id in range(workload.coordinators) if world.is_up(coordinator_actor_name(tc_id)))


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


def _untransformed_inputs(history: History, report: Report, subscription: str = SUB_PIPE) -> list[str]:
    """The pipeline's stored inputs that no committed (or undecided) txn transformed and that
    the final drain of its subscription does not show either: consumed without being processed.
    The checker cannot see this: a cumulative ack covers every message up to it, received or not."""
    stored: dict[str, None] = {}
    done: set[str] = set()
    for event in history.events:
        if isinstance(event, SendOk) and event.message_id.topic == TOPIC_IN:
            stored[event.msg_uid] = None
        elif (isinstance(event, Transformed) and event.subscription == subscription
              and report.txn_outcomes.get(event.txn) in (COMMITTED, UNDECIDED)):
            done.add(event.input_msg_uid)
        elif isinstance(event, FinalState) and event.subscription == subscription:
            done.update(message.msg_uid for message in event.messages)
    return [uid for uid in stored if uid not in done]


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
    """The actors log every retried failure; thousands per run cost time and say nothing here.

    A level is only set when it changes: each ``setLevel`` clears every logger's cache, which cost
    half a percent of a seed. ``run_many`` quiets a whole batch once, and its seeds change nothing."""

    LOGGERS = ("raytxn", "asyncio")

    def __enter__(self) -> None:
        self._levels = {}
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            if logger.level != logging.CRITICAL:
                self._levels[name] = logger.level
                logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: object) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)


class _fewer_collections:
    """A run allocates millions of short-lived objects (futures, handles, coroutines) and keeps
    the world's state for its whole length: with the default threshold (700 allocations) the
    collector runs hundreds of times a run, rescanning that state; 10,000 takes about 5% off a
    run's time. Only when garbage is freed changes, which neither the trace nor the verdict sees
    (run_seed's exception handler; ``SimLoop._note_broken``)."""

    GEN0_THRESHOLD = 10_000

    def __enter__(self) -> None:
        self._thresholds = gc.get_threshold()
        gc.set_threshold(max(self.GEN0_THRESHOLD, self._thresholds[0]), *self._thresholds[1:])

    def __exit__(self, *exc: object) -> None:
        gc.set_threshold(*self._thresholds)


def _quiet_worker() -> None:
    """A pool's worker runs nothing but seeds: its logs stay quiet for good (``_quiet_logs``)."""
    _quiet_logs().__enter__()


def _run_one(job: tuple[int, str, bool, Schedule | None, ExtraCheck | None, tuple[str, ...]]) -> SeedResult:
    seed, profile_name, keep_trace, schedule, extra_check, bugs = job
    with reintroduced(*bugs):  # set here: a worker process does not share the caller's switches
        result = run_seed(seed, profile_name, keep_trace=keep_trace, schedule=schedule, extra_check=extra_check)
    if result.ok:
        result.trace_lines = None  # only failing seeds' traces travel back
    return result


def run_many(seeds: Iterable[int], profile_name: str = "default", jobs: int = 1,
             keep_trace: bool = False, schedule: Schedule | None = None,
             extra_check: ExtraCheck | None = None, reintroduce: Iterable[str] = ()) -> Iterator[SeedResult]:
    """``run_seed`` for each seed, in seed order (``profile_name`` "all": each seed's profile in turn,
    ``profiles.profile_of_seed``); ``jobs`` > 1 runs them in that many processes
    (each seed is deterministic on its own, so parallelism changes no result). ``reintroduce``:
    test-only bug switches (``raytxn.testing_bugs``) on for these runs, besides those already on."""
    bugs = tuple(sorted({*active(), *reintroduce}))
    # Lazy: a time-limited run passes a range far longer than it runs (Pool.imap pulls as it goes).
    work = ((seed, profile_of_seed(profile_name, seed), keep_trace, schedule, extra_check, bugs) for seed in seeds)
    if jobs <= 1:
        with _quiet_logs():
            yield from map(_run_one, work)
        return
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_quiet_worker) as pool:
        yield from pool.imap(_run_one, work, chunksize=4)
