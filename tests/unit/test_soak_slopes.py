"""The soak's judgement (``raytxn.tools.bench_soak``): least-squares slopes per process, from its
second sample on, the verdict's flat tests, and the actors its faults spare."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.ids import partition_actor_name, subscription_actor_name
from raytxn.tools.bench_soak import (
    JUDGED_SAMPLES,
    MAX_FDS_GROWTH,
    MAX_RSS_SLOPE_MIB,
    interval_row,
    judged_samples,
    process_rows,
    slope_per_minute,
    summary_row,
)
from raytxn.tools.chaos import fault_targets, make_schedule


@given(st.floats(-100, 100), st.floats(-1000, 1000), st.integers(2, 40))
def test_the_slope_of_a_line_is_its_slope(slope: float, start: float, count: int) -> None:
    points = [(m * 0.5, start + slope * m * 0.5) for m in range(count)]
    assert slope_per_minute(points) == pytest.approx(slope, abs=1e-6)


def test_no_slope_from_one_point_or_one_minute() -> None:
    assert slope_per_minute([(1.0, 5.0)]) is None
    assert slope_per_minute([(1.0, 5.0), (1.0, 7.0)]) is None


def verdict(rss_growth_per_min: float, fds_growth_per_min: float, committed: list[int]) -> dict:
    series = {("tc-0", 7): [(m, 180.0 + rss_growth_per_min * m, 50 + round(fds_growth_per_min * m))
                            for m in range(6)],
              ("tc-1", 8): [(m, 180.0 + 50 * m, 50) for m in range(4)],  # restarted late: shown, not judged
              ("driver", 1): [(m, 200.0 + 50 * m, 40) for m in range(6)]}  # grows by design: not judged
    intervals = [interval_row(i + 1, i + 1.0, 60.0, c, 0, 0, 1, {"tc-0": (7, 180.0, 50)})
                 for i, c in enumerate(committed)]
    processes = process_rows(series)
    assert [p["process"] for p in processes] == ["driver", "tc-0", "tc-1"]
    assert [p["process"] for p in processes if p["judged"]] == ["tc-0"]
    return summary_row(intervals, processes, 5.0, 3000, sum(committed), 0, 30, "clean")


def test_a_flat_run_passes() -> None:
    row = verdict(0.0, 0.0, [600, 590, 610, 605, 595])
    assert row["memory_flat"] and row["files_flat"] and row["throughput_flat"]
    assert row["throughput_last_over_first"] == pytest.approx(595 / 600, abs=1e-3)


def test_growth_or_a_sinking_throughput_fails() -> None:
    assert not verdict(MAX_RSS_SLOPE_MIB * 1.5, 0.0, [600] * 5)["memory_flat"]
    assert not verdict(0.0, MAX_FDS_GROWTH / 3, [600] * 5)["files_flat"]  # (4 judged minutes: 2.7 gained)
    assert verdict(0.0, 0.2, [600] * 5)["files_flat"]  # one socket kept (0.8 gained)
    assert not verdict(0.0, 0.0, [600, 580, 560, 540, 520])["throughput_flat"]  # -13%
    assert verdict(0.0, 0.0, [600, 600, 600, 600, 545])["throughput_flat"]  # -9%


def test_a_run_too_short_to_judge_says_so() -> None:
    series = {("tc-0", 7): [(m * 0.25, 180.0 + m, 50) for m in range(4)]}
    processes = process_rows(series)
    assert [p["judged"] for p in processes] == [False]
    row = summary_row([], processes, 1.0, 10, 10, 0, 1, "clean")
    assert row["memory_flat"] is None and row["files_flat"] is None and row["processes_judged"] == 0


def test_only_processes_that_lived_half_the_run_are_judged() -> None:
    """In 30 intervals a process sampled 8 times (a fault restarted it 7 minutes before the end)
    is warming up: shown, not judged; one sampled 15 times is. A short run keeps the floor of 5."""
    assert judged_samples(30) == 15 and judged_samples(31) == 16 and judged_samples(4) == JUDGED_SAMPLES
    series = {("tc-0", 7): [(m, 150.0 + 1.5 * m, 50) for m in range(8)],  # young, and warming up
              ("tc-1", 8): [(m, 150.0, 50) for m in range(31)]}  # spared: lived the whole run
    processes = process_rows(series, judged_samples(30), {"tc-1"})
    assert [(p["process"], p["spared"], p["judged"]) for p in processes] == [("tc-0", False, False),
                                                                             ("tc-1", True, True)]
    row = summary_row([], processes, 30.0, 10, 10, 0, 1, "clean")
    assert row["memory_flat"] and row["processes_judged"] == 1 and row["spared_judged"] == 1
    grown = process_rows({("tc-1", 8): [(m, 150.0 + 1.5 * m, 50) for m in range(31)]}, judged_samples(30))
    assert not summary_row([], grown, 30.0, 10, 10, 0, 1, "clean")["memory_flat"]


def test_the_soak_spares_one_actor_of_each_kind_it_runs_through() -> None:
    sizes = {"r-in": 3, "r-out-a": 2, "r-out-b": 2}
    everything, none = fault_targets(2, sizes, "r-in")
    targets, spared = fault_targets(2, sizes, "r-in", spare_last=True)
    assert none == [] and len(everything["partition"]) == 7
    assert spared == ["tc-1", partition_actor_name("r-in", 2), partition_actor_name("r-out-a", 1),
                      partition_actor_name("r-out-b", 1), subscription_actor_name("r-in", 2, "chaos")]
    for kind, names in targets.items():  # each kind keeps the rest, and nothing spared is drawn
        assert names == [name for name in everything[kind] if name not in spared] and names
    drawn = {event["actor"] for event in make_schedule(3, targets, 300, 1.0)}
    assert drawn == {name for names in targets.values() for name in names}
    # A kind of one (a single coordinator) is faulted still: sparing it would leave it untested.
    targets, spared = fault_targets(1, sizes, "r-in", spare_last=True)
    assert targets["coordinator"] == ["tc-0"] and "tc-0" not in spared
