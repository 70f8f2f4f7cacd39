"""Shrinking a failing seed: the smallest schedule (``schedule.py``) found that still fails the same way.

A run is a pure function of (seed, profile, workload, schedule), so shrinking is a search over
schedules with the seed fixed, in the spirit of TigerBeetle's VOPR and of property-based testing:
try a reduction, keep it when the run still fails with the same *kind* of failure and is smaller
(fewer txns + faults; at equal count, fewer kinds of fault or workload behaviour in play), and
repeat until a whole pass keeps nothing or the run budget is spent.

The reductions, in the order each pass tries them:

1. ``max_faults`` and ``max_txns``, bisected. These are the reductions that keep the run's prefix:
   every fault is still drawn, so a run capped at K faults is the original up to the (K+1)-th fault
   (likewise for txns), and a bug whose damage is done by then still shows at the end.
2. One fault kind at a time (``no=``), then the workload's sizes (fewer transactional producers,
   workers, partitions, coordinators, tid txns, inputs), then a shorter fault window. These draw a
   different random sequence from the first changed decision on (the simulator has one random
   stream, and default traces must not change), so they are close to re-rolls and succeed less
   often; a success can let the caps shrink further in the next pass.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from raytxn.errors import InvalidArgument
from raytxn.sim.driver import Workload
from raytxn.sim.gate import GATED_KINDS
from raytxn.sim.profiles import PROFILES
from raytxn.sim.run import ExtraCheck, SeedResult, run_seed
from raytxn.sim.schedule import KINDS, SIZES, WORKLOAD_KINDS, Schedule

MAX_RUNS = 200
MAX_SECONDS = 300.0
# The sizes tried, in order: fewer moving parts first, then the amounts of work.
SIZE_ORDER: tuple[str, ...] = ("tid_producers", "workers", "partitions", "coordinators", "tid_txns", "inputs")


def failure_kind(failure: str) -> str:
    """What "the same failure" means: the text before the first ':', numbers blanked. For the
    checker that is its anomaly kinds ("checker found duplicate, lost"); otherwise the harness's
    category ("liveness", "invariant", "extra check", "simulation deadlocked at t=N.Ns")."""
    return re.sub(r"\d+(\.\d+)?", "N", failure.split(":", 1)[0]).strip()


def size(result: SeedResult) -> int:
    """How big a run is, as the shrinker reports it: txns plus faults that took effect."""
    return result.txns + result.fault_total


def _measure(result: SeedResult, profile: str, workload: Workload) -> tuple[int, int]:
    """What the shrinker minimises: the size, then how many kinds are in play (faults that took
    effect, stale handles, the workload's aborts, forgets and refences), so a kind turned off
    counts as progress even when the run is no shorter."""
    schedule = result.schedule or Schedule()
    profile_run, workload_run = schedule.apply(PROFILES[profile], workload)
    kinds = len(result.fault_kinds) + profile_run.network.stale_handles
    kinds += sum(getattr(workload_run, kind) > 0 for kind in WORKLOAD_KINDS)
    return size(result), kinds


@dataclass
class ShrinkResult:
    original: SeedResult
    shrunk: SeedResult
    runs: int            # runs made while shrinking (the original's not counted)
    seconds: float
    kept: list[str] = field(default_factory=list)   # the reductions kept, in order
    workload: Workload = field(default_factory=Workload)

    @property
    def smaller(self) -> bool:
        return size(self.shrunk) < size(self.original)

    def summary(self) -> str:
        """One line: how much smaller, and what the shrunk schedule removed."""
        before, after = self.original, self.shrunk
        faults = ", ".join(f"{kind} {count}" for kind, count in after.fault_kinds.items()) or "none"
        gone = removed(after.schedule or Schedule(), before.schedule or Schedule(), after.profile, self.workload)
        return (f"shrunk in {self.runs} runs, {self.seconds:.1f}s: {before.txns} -> {after.txns} txns, "
                f"faults {before.fault_total} -> {after.fault_total} ({faults}); removed: {gone}")


def removed(shrunk: Schedule, original: Schedule, profile: str, workload: Workload | None = None) -> str:
    """What ``shrunk`` takes away from ``original``, in words."""
    base = PROFILES[profile]
    was_profile, was = original.apply(base, workload or Workload())
    now_profile, now = shrunk.apply(base, workload or Workload())
    parts = [f"{name} {getattr(was, name)} -> {getattr(now, name)}" for name in SIZES if name != "max_txns"
             and getattr(now, name) != getattr(was, name)]
    if now_profile.fault_window_s != was_profile.fault_window_s:
        parts.append(f"fault window {was_profile.fault_window_s}s -> {now_profile.fault_window_s}s")
    if shrunk.no - original.no:
        parts.append("no " + ", ".join(kind for kind in KINDS if kind in shrunk.no - original.no))
    if shrunk.max_faults != original.max_faults and shrunk.max_faults is not None:
        parts.append(f"faults after the first {shrunk.max_faults}")
    if now.max_txns != was.max_txns and now.max_txns is not None:
        parts.append(f"txns after the first {now.max_txns} attempts to begin one")
    return "; ".join(parts) or "nothing"


class _Search:
    def __init__(self, seed: int, profile: str, workload: Workload, extra_check: ExtraCheck | None,
                 original: SeedResult, max_runs: int, max_seconds: float) -> None:
        self.seed, self.profile, self.workload, self.extra_check = seed, profile, workload, extra_check
        assert original.failure is not None, "only a failing run shrinks"
        self.kind = failure_kind(original.failure)
        self.best = original
        self.runs = 0
        self.deadline = time.perf_counter() + max_seconds
        self.max_runs = max_runs
        self.kept: list[str] = []
        self._tried = {str(self.schedule)}  # schedules run already (the same string is the same run)

    @property
    def schedule(self) -> Schedule:
        return self.best.schedule or Schedule()

    def spent(self) -> bool:
        return self.runs >= self.max_runs or time.perf_counter() >= self.deadline

    def attempt(self, candidate: Schedule, what: str) -> bool:
        """Run ``candidate``; keep it (True) when it fails the same way and is smaller."""
        key = str(candidate)
        if key in self._tried or self.spent():
            return False
        self._tried.add(key)
        self.runs += 1
        result = run_seed(self.seed, self.profile, self.workload, schedule=candidate, extra_check=self.extra_check)
        if (result.failure is None or failure_kind(result.failure) != self.kind
                or _measure(result, self.profile, self.workload) >= _measure(self.best, self.profile, self.workload)):
            return False
        if candidate.max_faults is not None and candidate.max_faults > result.fault_total:
            # A cap above the faults the run had never suppressed one (else it would have had more),
            # and the tight cap suppresses none either: the same run, with a replay line that says
            # how many faults it has (gate.py; tests/unit/test_sim_shrink.py checks the claim).
            result.schedule = replace(candidate, max_faults=result.fault_total)
        self.best = result
        self.kept.append(what)
        return True

    def bisect(self, knob: str, known_failing: int) -> bool:
        """The least cap on ``knob`` that still fails, between 0 and ``known_failing`` (a cap the
        current run does not reach, so it fails). Failing is not monotone in the cap, but near
        enough: a run is its capped prefix, then a quiet end."""
        low, high, kept = 0, known_failing, False
        while low < high and not self.spent():
            middle = (low + high) // 2
            if self.attempt(replace(self.schedule, **{knob: middle}), f"{knob}={middle}"):
                high, kept = middle, True
            else:
                low = middle + 1
        return kept

    def masks(self) -> Iterator[str]:
        """Kinds worth turning off: those that happen in the current run."""
        profile, workload = self.schedule.apply(PROFILES[self.profile], self.workload)
        for kind in KINDS:
            if kind in self.schedule.no:
                continue
            if ((kind in GATED_KINDS and self.best.fault_kinds.get(kind, 0) > 0)
                    or (kind == "stale_handles" and profile.network.stale_handles)
                    or (kind in WORKLOAD_KINDS and getattr(workload, kind) > 0)):
                yield kind

    def one_pass(self) -> bool:
        kept = self.bisect("max_faults", self.best.fault_total)
        kept |= self.bisect("max_txns", self.best.txns_started)
        for kind in list(self.masks()):
            kept |= self.attempt(replace(self.schedule, no=self.schedule.no | {kind}), f"no {kind}")
        _, workload = self.schedule.apply(PROFILES[self.profile], self.workload)
        for name in SIZE_ORDER:
            current, least = getattr(workload, name), SIZES[name]
            for value in sorted({least, (least + current) // 2, max(least, current - 1)}):
                if value < current and self.attempt(replace(self.schedule, **{name: value}), f"{name}={value}"):
                    kept = True
                    break
        window = self.schedule.window if self.schedule.window is not None else PROFILES[self.profile].fault_window_s
        for shorter in (round(window / 2, 3), round(window * 3 / 4, 3)):
            if shorter < window and self.attempt(replace(self.schedule, window=shorter), f"window={shorter}"):
                kept = True
                break
        return kept


def shrink(seed: int, profile: str, *, workload: Workload | None = None, schedule: Schedule | None = None,
           extra_check: ExtraCheck | None = None, original: SeedResult | None = None,
           max_runs: int = MAX_RUNS, max_seconds: float = MAX_SECONDS) -> ShrinkResult:
    """Shrink the failing run of ``seed`` (``original``, when already run) within ``max_runs`` runs
    and ``max_seconds``; the result's ``shrunk.replay_command()`` replays the smallest run found
    (the command line runs the default ``Workload``: with another, replay through ``run_seed``)."""
    began = time.perf_counter()
    workload = workload or PROFILES[profile].workload  # (a profile made for one workload runs that one)
    if original is None:
        original = run_seed(seed, profile, workload, schedule=schedule, extra_check=extra_check)
    if original.failure is None:
        raise InvalidArgument(f"seed {seed} ({profile}) passes: nothing to shrink")
    search = _Search(seed, profile, workload, extra_check, original, max_runs, max_seconds)
    while not search.spent() and search.one_pass():
        pass
    return ShrinkResult(original, search.best, search.runs, time.perf_counter() - began, search.kept, workload)
