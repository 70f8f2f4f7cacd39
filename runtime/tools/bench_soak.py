"""``raytxn bench soak --minutes 30``: the chaos workload (``raytxn.tools.chaos``) at a steady
load with faults for a long time, watched for what only time shows: memory or file handles that
grow, throughput that sinks, and, at the end, the exactly-once checker's verdict on everything.

Orders are fed at ``feed_per_s`` a second (a steady load, not as fast as possible: a falling
throughput then means the engine fell behind, and ``max_backlog``, the orders fed but not done
at an interval's end, says by how much; choose a rate the machine keeps up with, or the first
intervals fall behind and the last catch up, and throughput is not flat for that reason) after
a warm-up that is not measured; faults fire
from a seeded schedule over the whole run (``fault_interval_s`` apart). Every ``interval_s``
(a minute) a row records what committed in it (transactions, messages: an order's input and its
two outputs), the backlog, and for every engine actor (the supervisor's ``restart_plan``) and
the driver its process's RSS and open files (psutil on the pid its ``ready`` names).

At the end, slope tests (least squares, per minute, from the second sample of each process on;
chaos kills restart processes, so each process is a series of its own, and only those that lived
half the run are judged, sampled at least ``JUDGED_SAMPLES`` times and half the intervals: a
process a fault restarted a few minutes ago is still warming up, and its few minutes' slope says
more of its warm-up than of a leak; a run too short to judge any says None). So that every kind
of engine actor has such a process, the faults spare one of each the workload runs through
(``run_chaos``'s ``spare_last``: the last coordinator, the last partition of each topic, the
input's last subscription); the others are killed and armed as the chaos test's are:

- memory flat: every engine process's RSS grows less than ``MAX_RSS_SLOPE_MIB`` a minute. A
  leak of 2 KiB per transaction at 10 transactions a second is 1.2 MiB a minute; the allocator's
  settling after warm-up is well below it over minutes.
- files flat: the line fitted through every engine process's open files gains fewer than
  ``MAX_FDS_GROWTH`` over its judged samples (its slope times their span), which is 0 a minute
  but for one socket of Ray's or obstore's connection pools, opened once and kept. A leak per
  call, per transaction or per restart gains tens a minute; a bound on the slope alone would
  take one socket opened in a 3-minute run (0.2 a minute) for a leak.
- throughput flat: the last interval's committed transactions within ``THROUGHPUT_TOLERANCE`` of
  the first's.

The driver keeps the whole history for the checker, so its memory grows by design: it is shown,
not judged.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from typing import Any

FEED_PER_S = 5.0  # orders a second by default: within what 2 busy cores keep up with (a quiet machine: more)
MAX_RSS_SLOPE_MIB = 1.0
MAX_FDS_GROWTH = 2.0
THROUGHPUT_TOLERANCE = 0.10
SHOWN_SAMPLES = 3   # a process sampled this often gets a row, its slopes shown
JUDGED_SAMPLES = 5  # ... and this often, judged: fewer are its warm-up (a process a fault restarted late)
MIB = 1 << 20


def bench_soak(short: bool = False, progress: Callable[[str], None] = print, minutes: float | None = None,
               feed_per_s: float | None = None, fault_interval_s: float | None = None, seed: int = 1,
               warmup_s: float | None = None, interval_s: float | None = None,
               storage: str | None = None) -> list[dict]:
    """See the module docstring. ``short``: one minute of a tiny load, sampled every 15 s."""
    import raytxn as rt
    from raytxn.tools.chaos import run_chaos

    minutes = minutes if minutes is not None else (1.0 if short else 30.0)
    feed_per_s = feed_per_s or (3.0 if short else FEED_PER_S)
    fault_interval_s = fault_interval_s or (5.0 if short else 10.0)
    warmup_s = warmup_s if warmup_s is not None else (10.0 if short else 60.0)
    interval_s = interval_s or (15.0 if short else 60.0)
    if not minutes > 0 or not feed_per_s > 0 or not interval_s > 0 or warmup_s < 0:
        raise ValueError("minutes, feed_per_s and interval_s must be > 0 and warmup_s >= 0")
    client = rt.connect(storage=storage or f"file://{tempfile.mkdtemp(prefix='raytxn-soak-')}")
    sampler = _Sampler(client, warmup_s, interval_s, progress)
    try:
        sampler.sample_processes()  # (the actors that run before the workload: supervisor, coordinators)
        # Fed half an interval longer than measured: the last interval ends while the load is on.
        feed_s = warmup_s + minutes * 60 + interval_s / 2
        result = run_chaos(client, txns=int(feed_per_s * feed_s), seed=seed,
                           fault_interval_s=fault_interval_s, feed_per_s=feed_per_s, observe=sampler.observe,
                           time_limit_s=warmup_s + minutes * 60 + 600, spare_last=True)
    finally:
        client.close()
        rt.shutdown()
    checker = "clean" if result.clean else result.report.summary(max_per_kind=3)
    progress(f"  checker: {checker}")
    processes = process_rows(sampler.series, judged_samples(len(sampler.rows)), set(result.spared))
    return [*sampler.rows, *processes, summary_row(sampler.rows, processes, minutes, result.txns, result.committed,
                                                   result.aborted, result.faults_fired, checker)]


class _Sampler:
    """Takes a row every ``interval_s`` after ``warmup_s``, from the counts ``run_chaos`` reports."""

    def __init__(self, client: Any, warmup_s: float, interval_s: float, progress: Callable[[str], None]) -> None:
        self.client, self.warmup_s, self.interval_s, self.progress = client, warmup_s, interval_s, progress
        self.rows: list[dict] = []
        self.series: dict[tuple[str, int], list[tuple[float, float, int]]] = {}  # (name, pid) -> (min, MiB, fds)
        self._last: dict[str, Any] | None = None  # the counts at the last row's end
        self._stopped = False
        self._began = time.monotonic()  # the processes' series are in minutes from here

    def observe(self, counts: dict[str, Any]) -> None:
        if self._stopped:
            return
        if self._last is None:
            if counts["t"] >= self.warmup_s:
                self._last = counts
            return
        if counts["t"] - self._last["t"] < self.interval_s:
            return
        if counts["fed"] == self._last["fed"]:  # the feed has ended: what follows is the drain
            self._stopped = True
            return
        processes = self.sample_processes()
        last = self._last
        row = interval_row(len(self.rows) + 1, (counts["t"] - self.warmup_s) / 60, counts["t"] - last["t"],
                           counts["committed"] - last["committed"], counts["aborted"] - last["aborted"],
                           counts["fed"] - counts["done"], counts["fired"] - last["fired"], processes)
        self.rows.append(row)
        self._last = counts
        self.progress(f"  minute {row['minute']}: {row['committed_txns']} txns ({row['txns_per_s']}/s), "
                      f"backlog {row['backlog']}, "
                      f"{row['faults']} faults, engine RSS {sum(row['rss_mib'].values()):.0f} MiB in {len(processes)} "
                      f"processes")

    def sample_processes(self) -> dict[str, tuple[int, float, int]]:
        """name -> (pid, RSS MiB, open files) of every engine actor serving now, and the driver."""
        import os

        import psutil

        from raytxn.client.rpc import ActorRef

        found = {"driver": os.getpid()}
        try:
            plan = self.client.supervisor.call("restart_plan", deadline_s=10)
        except Exception:  # noqa: BLE001 - the supervisor restarting: this sample has the others
            plan = [{"name": "supervisor"}, *({"name": f"tc-{i}"} for i in range(2))]
        for step in plan:
            try:
                found[step["name"]] = ActorRef(step["name"], self.client.token).call("ready", deadline_s=5)["pid"]
            except Exception:  # noqa: BLE001 - restarting (a fault): missing from this sample
                continue
        sampled = {}
        minute = (time.monotonic() - self._began) / 60
        for name, pid in found.items():
            try:
                process = psutil.Process(pid)
                mib, fds = process.memory_info().rss / MIB, process.num_fds()
            except (psutil.Error, OSError):
                continue  # ended meanwhile
            sampled[name] = (pid, round(mib, 1), fds)
            self.series.setdefault((name, pid), []).append((minute, mib, fds))
        return sampled


def interval_row(index: int, minute: float, seconds: float, committed: int, aborted: int, backlog: int,
                 faults: int, processes: dict[str, tuple[int, float, int]]) -> dict:
    """One interval: what committed in it (an order's txn holds 3 messages: its input acked, its
    two outputs), the backlog at its end, and each process's (pid, RSS MiB, open files)."""
    return {"bench": "soak", "interval": index, "minute": round(minute, 2), "seconds": round(seconds, 1),
            "committed_txns": committed, "aborted_txns": aborted, "messages": 3 * committed,
            "txns_per_s": round(committed / seconds, 2) if seconds > 0 else 0.0, "backlog": backlog,
            "faults": faults, "rss_mib": {name: mib for name, (_pid, mib, _fds) in processes.items()},
            "open_files": {name: fds for name, (_pid, _mib, fds) in processes.items()}}


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(minute, value)`` points (None: fewer than two minutes apart)."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread <= 0 or not math.isfinite(spread):
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def judged_samples(intervals: int) -> int:
    """How often a process must have been sampled to be judged: ``JUDGED_SAMPLES``, and half of
    the run's ``intervals`` (it lived half the run)."""
    return max(JUDGED_SAMPLES, math.ceil(intervals / 2))


def process_rows(series: dict[tuple[str, int], list[tuple[float, float, int]]],
                 judged_after: int = JUDGED_SAMPLES, spared: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """One row per process sampled ``SHOWN_SAMPLES`` times: its slopes from its second sample on,
    whether the faults spared its actor (``spared``), and whether the verdict judges them (an
    engine process sampled ``judged_after`` times)."""
    rows = []
    for (name, pid), samples in sorted(series.items()):
        judged = samples[1:]
        if len(judged) < SHOWN_SAMPLES - 1:
            continue
        rss = slope_per_minute([(m, mib) for m, mib, _ in judged])
        fds = slope_per_minute([(m, float(n)) for m, _, n in judged])
        span = judged[-1][0] - judged[0][0]
        rows.append({"bench": "soak", "process": name, "pid": pid, "samples": len(samples),
                     "rss_first_mib": round(samples[0][1], 1), "rss_last_mib": round(samples[-1][1], 1),
                     "rss_slope_mib_per_min": None if rss is None else round(rss, 3),
                     "fds_first": samples[0][2], "fds_last": samples[-1][2],
                     "fds_slope_per_min": None if fds is None else round(fds, 3),
                     "fds_growth": None if fds is None else round(fds * span, 2),
                     "spared": name in spared,
                     "judged": name != "driver" and len(samples) >= judged_after})
    return rows


def summary_row(rows: list[dict], processes: list[dict], minutes: float, txns: int, committed: int, aborted: int,
                faults_fired: int, checker: str) -> dict:
    """The verdict: the flat tests over ``rows`` (intervals) and ``processes`` (``process_rows``),
    and the checker's (``checker``: "clean" or its summary)."""
    judged = [row for row in processes if row["judged"]]
    rss = [row["rss_slope_mib_per_min"] for row in judged if row["rss_slope_mib_per_min"] is not None]
    fds = [row["fds_growth"] for row in judged if row["fds_growth"] is not None]
    first, last = (rows[0]["committed_txns"], rows[-1]["committed_txns"]) if rows else (0, 0)
    ratio = last / first if first else None
    return {"bench": "soak", "case": "verdict", "minutes": minutes, "intervals": len(rows), "txns": txns,
            "committed": committed, "aborted": aborted, "faults_fired": faults_fired,
            "max_backlog": max((row["backlog"] for row in rows), default=0),
            "first_interval_txns": first, "last_interval_txns": last,
            "throughput_last_over_first": None if ratio is None else round(ratio, 3),
            "throughput_flat": ratio is not None and abs(ratio - 1) <= THROUGHPUT_TOLERANCE,
            "processes_judged": len(judged), "spared_judged": sum(1 for row in judged if row["spared"]),
            "max_rss_slope_mib_per_min": max(rss, default=None),
            "memory_flat": max(rss) < MAX_RSS_SLOPE_MIB if rss else None,  # None: nothing to judge
            "max_fds_growth": max(fds, default=None),
            "files_flat": max(fds) < MAX_FDS_GROWTH if fds else None, "checker": checker}
