"""``raytxn bench peers`` runs end to end at small sizes beside a real Kafka broker: every
workload on the three sides (Kafka, the gateway, the native client), every figure a ratio to
Kafka's, and the Spark word count on Kafka, on the gateway and as ExactlyOncePipeline. Skips,
saying why, only when the broker or Spark's Kafka connector cannot be had here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raytxn.tools.bench_peers import CASES, SIDES, TARGETS, running_sides
from raytxn.tools.peers import KafkaBroker, PeerUnavailable, spark_kafka_jars
from tests.unit.test_bench_tables import missing_figures

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    broker = KafkaBroker()
    try:
        broker.start(timeout_s=240)
    except PeerUnavailable as e:
        pytest.skip(f"no real Kafka broker here: {e}")
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.mark.extended
@pytest.mark.slow(seconds=90)
def test_bench_peers_short_measures_every_workload_on_three_sides_as_ratios_to_kafka(kafka: str,
                                                                                    tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, "-m", "raytxn.tools.cli", "bench", "peers", "--short", "--out", str(out),
                           "--size", "spark=false", "--size", f"kafka_bootstrap={kafka}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["results"]
    rates = [r for r in rows if "msgs_per_s" in r]
    cases = {(r["case"], r["partitions"], r["pattern"], r["side"]) for r in rates}
    for _, case, partitions, pattern in CASES:
        sides = ("native",) if pattern == "txn_async" else SIDES
        assert {(case, partitions, pattern or "", side) for side in sides} <= cases, case
    by_case: dict[tuple, dict[str, dict]] = {}
    for row in rates:
        assert row["msgs_per_s"] > 0 and len(row["runs"]) == 1, row
        by_case.setdefault((row["case"], row["partitions"], row["pattern"]), {})[row["side"]] = row
    for (case, _, pattern), sides in by_case.items():
        base = sides.get("kafka") or by_case[(case, 1, "txn_sync")]["kafka"]  # async's base: Kafka's txn loop
        for row in sides.values():  # one round: the ratio is of this round's two runs
            assert row["over_kafka"] == pytest.approx(row["runs"][0] / base["runs"][0], rel=0.01, abs=0.002), row
        if pattern:
            assert all(row["over_plain"] is not None for row in sides.values())
    latencies = [r for r in rows if "p50_ms" in r]
    assert {(r["case"].split(" ")[0], r["side"]) for r in latencies} == {
        (case, side) for case in ("commit", "end-to-end") for side in SIDES}
    kafka_p50 = {r["case"]: r["p50_runs"][0] for r in latencies if r["side"] == "kafka"}
    for row in latencies:
        assert 0 < row["p50_ms"] <= row["p99_ms"] and row["samples"] == 20, row
        assert row["p50_over_kafka"] == pytest.approx(row["p50_runs"][0] / kafka_p50[row["case"]], rel=0.01), row
    assert [r["target"] for r in rows if "target" in r] == [t[0] for t in TARGETS]
    assert missing_figures(rows, proc.stdout) == [], proc.stdout
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_peers_refuses_a_size_it_does_not_have(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "raytxn.tools.cli", "bench", "peers", "--short", "--out",
                           str(tmp_path / "x.json"), "--size", "partitions=9"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "no size 'partitions'" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.extended
@pytest.mark.slow(seconds=150)
def test_bench_peers_spark_word_count_on_kafka_on_the_gateway_and_exactly_once(kafka: str, ray_session: object) -> None:
    from raytxn.tools.bench_peers_spark import bench_spark_peers

    try:
        spark_kafka_jars()
    except PeerUnavailable as e:
        pytest.skip(f"no Spark Kafka connector here: {e}")
    with running_sides(kafka) as sides:
        rows = bench_spark_peers(sides, 3_500, 1_000, 1, print)
    assert [r["side"] for r in rows] == list(SIDES)
    for row in rows:
        assert "error" not in row, row
        # The same batches on every side: 3 of 1,000 (Spark's source rounds down per partition, the
        # pipeline's ranges end at whole entries: a few rows fewer) and the rest in a 4th.
        assert "batches_differ" not in row, row
        assert row["batches"] == 4 and row["batch_rows_max"] <= 1_000, row
        assert row["rows_per_s"] > 0 and row["first_batch_s"] > 0, row
        assert row["steady_batch_s"] > 0 and row["cold_first_batch_s"] > 0, row
    assert rows[0]["over_kafka"] == 1.0
