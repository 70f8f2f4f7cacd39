"""The gateway-memory bench's verdict from its samples (``bench_gateway_memory.memory_row``):
the least-squares slope after the warm-up and the first and last windows' means."""

from __future__ import annotations

import pytest

from raytxn.tools.bench_gateway_memory import memory_row, slope_per_minute


def _samples(rss: object, minutes: int = 10, every_s: int = 5) -> list[dict[str, float]]:
    return [{"t_s": t, "rss_mib": rss(t), "uss_mib": rss(t) - 100, "fds": 50,  # type: ignore[operator]
             "consumed": 1000 * t}
            for t in range(0, minutes * 60 + 1, every_s)]


def _row(samples: list[dict[str, float]]) -> dict:
    return memory_row(samples, 60.0, 60.0, 50_000_000, 600.0, 5_000_000, {"held_bytes": 64 << 20}, "s")


def test_the_slope_is_the_least_squares_line_per_minute() -> None:
    assert slope_per_minute(_samples(lambda t: 100 + 3 * t / 60), "rss_mib") == pytest.approx(3.0)
    assert slope_per_minute(_samples(lambda t: 250.0)[:1], "rss_mib") == 0.0


def test_memory_that_fills_its_cache_in_the_warm_up_then_holds_is_flat() -> None:
    row = _row(_samples(lambda t: 180 + min(t, 40) * 2 + (t % 10) / 10))  # +80 MiB in 40 s, then noise
    assert row["flat"] is True and abs(row["slope_mib_per_min"]) < 0.1
    assert row["rss_first_window_mib"] == pytest.approx(row["rss_last_window_mib"], abs=0.2)
    assert row["rss_start_mib"] == 180 and row["rss_max_mib"] == pytest.approx(260.5)


def test_a_leak_of_two_mib_a_minute_is_not_flat() -> None:
    row = _row(_samples(lambda t: 250 + 2 * t / 60))
    assert row["flat"] is False and row["slope_mib_per_min"] == pytest.approx(2.0)
    assert row["uss_slope_mib_per_min"] == pytest.approx(2.0)
    assert row["uss_last_window_mib"] - row["uss_first_window_mib"] == pytest.approx(16.0, abs=0.2)


def test_a_step_within_the_slope_but_past_ten_percent_is_not_flat() -> None:
    row = _row(_samples(lambda t: 250.0 if t < 540 else 290.0))  # the last minute 16% up
    assert row["last_over_first"] == pytest.approx(1.16, abs=0.001) and row["flat"] is False
