"""`raytxn bench` prints every figure of every row a benchmark returns.

The benchmarks themselves take minutes, so the rows here come from each bench's own row builders
fed with made-up measurements: the rows have the shape a real run returns. The ledger bench's real
output is checked the same way by tests/integration/test_bench_smoke.py.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from rich.console import Console

from raytxn.tools import (
    bench,
    bench_aio,
    bench_auth,
    bench_ceiling,
    bench_commit,
    bench_compaction,
    bench_console,
    bench_gateway_memory,
    bench_gateways,
    bench_kafka,
    bench_peers,
    bench_peers_spark,
    bench_produce,
    bench_ray_data,
    bench_s3,
    bench_scale,
    bench_soak,
    bench_spark,
    bench_subscription,
)


def _ledger() -> list[dict]:
    return [bench.ledger_row("file", 100, True, 64, [0.002, 0.003, 0.0041], 0.5, 2),
            bench.ledger_row("s3", 10240, False, 1, [0.012, 0.013], 0.03, 2)]


def _coordinator() -> list[dict]:
    return [bench.coordinator_rate_row("batched", 400, 1234.56),
            bench.coordinator_latency_row("batched", 2, [1.25, 2.5, 7.75])]


def _spark() -> list[dict]:
    runs = {"spark-only": bench_spark.run_figures([1000, 1000, 500], [0.3, 0.4, 0.2], 1.0),
            "at-least-once": bench_spark.run_figures([1000, 1000, 500], [0.8, 1.1, 0.4], 2.5, 0.25),
            "exactly-once": bench_spark.run_figures([1000, 1000, 500], [0.9, 1.3, 0.5], 3.0, 0.5),
            "stateful": bench_spark.run_figures([1000, 1000, 500], [1.2, 1.5, 0.7], 3.6, 0.6)}
    scaling = {p: bench_spark.run_figures([2500], [1.0 + p / 10], 1.5 + p / 10, 0.2) for p in (1, 2)}
    small = bench_spark.run_figures([250] * 10, [0.3] * 10, 3.5, 1.5)
    return bench_spark.spark_rows(2500, 1000, runs, scaling, (250, small))


def _run(rate: float) -> bench_gateways.Run:
    return bench_gateways.Run(rate, 10_000 / rate, 0.05, {"gateways": 1.5, "engine": 0.75, "clients": 0.5,
                                                          "others": 0.25}, 0.875, 2.5)


def _peers() -> list[dict]:
    figures = bench_peers.Figures()
    for side, rate in (("kafka", 50_000.5), ("gateway", 20_000.25), ("native", 120_000.75)):
        for key in ("produce/1", "produce/4", "consume/1", "consume/4", "loop/plain", "loop/txn_sync", "eos"):
            figures.add(key, side, rate)
        figures.add("commit", side, [rate / 10_000, rate / 5_000, rate / 1_000])
        figures.add("e2e", side, [rate / 20_000, rate / 2_000])
    figures.add("loop/txn_async", "native", 99_000.5)
    spark = {side: [bench_peers_spark._figures([2000, 2000, 2000], [1.5 + i, 0.5, 0.75], 4.25 + i)]
             for i, side in enumerate(bench_peers.SIDES)}
    return [*bench_peers.peer_rows(figures, bench_peers.SIZES[True]), *bench_peers.target_rows(figures),
            *bench_peers_spark.spark_peer_rows(6_000, 2_000, spark, {"kafka": 9.5, "gateway": 11.25},
                                               {"native": "not run"})]


def _auth() -> list[dict]:
    return bench_auth.with_ratio_to_auth_off([bench_auth.auth_row(False, 20_000, 41_000.25, 30_500.5, [0.5, 0.75]),
                                              bench_auth.auth_row(True, 20_000, 39_000.75, 29_000.5, [0.6, 0.8])])


def _soak() -> list[dict]:
    processes = {"supervisor": (101, 180.5, 65), "tc-0": (102, 183.25, 56), "driver": (100, 220.75, 49)}
    intervals = [bench_soak.interval_row(i + 1, i + 1.0, 60.25, 600 + i, 60, 2, 6, processes) for i in range(3)]
    series = {(name, pid): [(m, mib + m / 4, fds) for m in (0.0, 1.0, 2.0, 3.0)]
              for name, (pid, mib, fds) in processes.items()}
    rows = bench_soak.process_rows(series)
    return [*intervals, *rows, bench_soak.summary_row(intervals, rows, 3.0, 2400, 2300, 100, 18, "clean")]


ROWS: dict[str, Callable[[], list[dict]]] = {
    "aio": lambda: [*bench_aio.throughput_rows(5_000, {"produce-sync": [200_000.5, 210_000.25],
                                                       "produce-async": [190_000.25, 205_000.75],
                                                       "produce-floor": [195_000.5, 207_000.25],
                                                       "consume-sync": [300_000.5, 290_000.25],
                                                       "consume-async": [280_000.75, 285_000.5],
                                                       "batch-sync": [400_000.5, 410_000.25],
                                                       "batch-async": [395_000.75, 405_000.5],
                                                       "bulk-sync": [900_000.5, 950_000.25],
                                                       "bulk-async": [880_000.75, 940_000.5]},
                                               {"produce-sync": [1.25, 1.5], "produce-async": [1.5, 1.75],
                                                "produce-floor": [1.375, 1.625],
                                                "consume-sync": [2.0, 1.75], "consume-async": [2.25, 2.5],
                                                "batch-sync": [1.5, 1.25], "batch-async": [1.375, 1.5],
                                                "bulk-sync": [0.5, 0.625], "bulk-async": [0.25, 0.375]}),
                    *bench_aio.serve_rows(30, {"idle": [[1.25, 1.5, 2.0], [1.0, 1.75, 3.5]],
                                               "waiting": [[1.5, 1.75, 2.25], [1.25, 2.0, 4.0]],
                                               "sync": [[50.5, 100.25, 199.75]]})],
    "ledger": _ledger,
    "coordinator": _coordinator,
    "console": lambda: [{**bench_console.console_row("topics", 1000, 100, [10.5, 12.25, 40.0], [8.5, 9.75, 9.0],
                                                     22_411, 179.25), "snapshot_calls": 204, "snapshot_s": 0.465},
                        bench_console.console_row("health", 1000, 100, [20.5, 25.75], [18.0, 19.5], 16_259, None)],
    "produce": lambda: [bench_produce.produce_row(4, 50_000, {"plain": [90_000.4, 95_000.6],
                                                             "txn": [80_000.2, 88_000.8],
                                                             "txn_sync": [85_000.5, 86_000.25],
                                                             "batch": [450_000.75, 500_000.5],
                                                             "plain_1p": [91_000.4, 94_000.6],
                                                             "txn_1p": [82_000.2, 87_000.8],
                                                             "txn_sync_1p": [86_000.5, 85_000.25],
                                                             "batch_1p": [460_000.75, 490_000.5],
                                                             "ceiling": [900_000.5, 850_000.25]}),
                        bench_produce.produce_row(1, 50_000, {"plain": [90_000.4], "txn": [80_000.2],
                                                             "ceiling": [900_000.5]}),
                        bench_produce.produce_row(1, 50_000, {"plain": [90_000.4], "txn_sync": [85_000.5],
                                                             "txn_one": [88_000.5], "txn_bg_commit": [86_500.5],
                                                             "floor_sync": [87_500.5],
                                                             "ceiling": [900_000.5]}, "logged")],
    "commit": lambda: [bench_commit.commit_row(3, [3.5, 4.25, 9.0], [1.5, 2.0, 4.0], [2.0, 2.25, 5.0],
                                               [0.75, 0.8, 1.5], [2.5, 2.75, 6.0], 3.0,
                                               parts=bench_commit.FloorParts([0.5, 0.75, 1.0], [0.75, 1.25, 2.0])),
                       bench_commit.commit_row(3, [2.5, 3.25, 7.0], [1.5, 2.0, 4.0], [1.0, 1.25, 3.0],
                                               [0.75, 0.8, 1.5], [2.0, 2.25, 5.0], 3.0, commit_answer="logged",
                                               parts=bench_commit.FloorParts([0.5, 0.75, 1.0], [0.75, 1.25, 2.0]))],
    "s3": lambda: bench_s3.s3_rows({"produce": 1000, "commit": 10, "consume": 500},
                                   {backend: {f: [scale * (i + 1.5) for i in range(2)] for f in bench_s3.FIGURES}
                                    for backend, scale in (("file", 100.25), ("s3", 60.5))}),
    "ceiling": lambda: [bench_ceiling.ceiling_row(100_000, [900_000.5, 850_000.25, 870_000.75])],
    "recovery": lambda: [bench_produce.recovery_row(1000, 812.5, 41.25)],
    "partition-memory": lambda: [bench_produce.partition_memory_row(
        10_000, 100_000, 150 * 2**20, {"rss_bytes": 160 * 2**20, "ongoing_txns": 0, "aborted_txns": 3})],
    "crash-recovery": lambda: [bench_produce.crash_recovery_row("partition", [1500.25, 1700.5, 2200.75])],
    "subscription": lambda: [
        *bench_subscription.throughput_rows(20_000, {"plain": [30_000.25, 31_000.5], "plain-4p": [29_000.5, 28_000.25],
                                                     "txn": [25_000.75, 26_000.5],
                                                     "txn-pipelined": [28_000.25, 29_500.5],
                                                     "batch": [300_000.5, 310_000.25],
                                                     "batch-4p": [280_000.25, 320_000.75],
                                                     "peer": [900_000.5, 850_000.5]}),
        bench_subscription.recovery_row(10_000, 950.25, 1.2345),
        bench_subscription.memory_row(10_000, 180_000_000, 100_000, 190_000_000, 1)],
    "spark": _spark,
    "ray-data": lambda: bench_ray_data.ray_data_rows(50_000, {"read_topic": 400_000.5, "read_parquet": 900_000.25}),
    "auth": _auth,
    "scale": lambda: [*bench_scale.scale_rows(10_000, 2.5, 200, 3.25, [0.5, 0.75], [1.25, 1.5, 2.75], True, 120,
                                              [[0.5, 30], [1.5, 120], [9.0, 3]], 4 * 2**30, 5 * 2**30,
                                              {4: [90_000.5, 95_000.25], 64: [80_000.25, 70_000.5]}, 200_000),
                      bench_scale.hosted_row(10_000, 400.5, [0.5, 0.75], True, [[1.5, 500], [9.0, 4000], [30.0, 0]],
                                             5, 4 * 2**30, 6 * 2**30, 4 * 2**30 + 2**29)],
    "peers": _peers,
    "compaction": lambda: bench_compaction.compaction_rows(100_000, 1_000, [200_000.5, 210_000.25], [500_000.5],
                                                           10_000, [0.75, 0.5], 2_000, [900.5], [1_000.25]),
    "gateways": lambda: bench_gateways.gateway_rows(5_000, {
        "produce": {"one": [_run(40_000.5), _run(42_000.25)], "two": [_run(60_000.75), _run(58_000.5)]},
        "consume": {"one": [_run(90_000.25)], "two": [_run(120_000.5)]}}),
    "gateway-memory": lambda: [bench_gateway_memory.memory_row(
        [{"t_s": t, "rss_mib": 200.5 + t / 100, "uss_mib": 150.25, "fds": 50, "consumed": 1000 * t}
         for t in range(0, 300, 5)],
        60.0, 60.0, 2_000_000, 300.25, 500_000, {"held_bytes": 64 << 20}, "bench-results/gateway-memory")],
    "soak": lambda: _soak(),
    "kafka": lambda: [*bench_kafka.kafka_rows(1, 5_000, {"produce": {"gateway": [20_000.5, 22_000.25],
                                                                     "native": [60_000.75, 58_000.5]},
                                                         "consume": {"gateway": [40_000.25, 41_000.5],
                                                                     "native": [90_000.5, 95_000.25]}},
                                       {"gateway": [1.0125, 0.5], "native": [0.25, 0.0125]}),
                      *bench_kafka.kafka_rows(4, 5_000, {"produce": {"gateway": [30_000.5], "native": [70_000.25]},
                                                         "consume": {"gateway": [50_000.25], "native": [99_000.5]}},
                                       {"gateway": [0.75], "native": [0.125]})],
}


def _tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, column names, rows of cells) of every table in rich's rendering: the header's cells
    are split by "┃", a row's by "│"."""
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    title = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("bench "):
            title = stripped
        elif stripped.startswith("┃"):
            tables.append((title, [c.strip() for c in stripped.strip("┃").split("┃")], []))
        elif stripped.startswith("│") and tables:
            tables[-1][2].append([c.strip() for c in stripped.strip("│").split("│")])
    return tables


def missing_figures(rows: list[dict], text: str) -> list[str]:
    """The rows of which ``text`` lacks a table titled by the row's bench whose columns are the
    row's other fields and which has a line of exactly the row's values under them."""
    tables = _tables(text)
    missing = []
    for row in rows:
        keys = [key for key in row if key != "bench"]
        cells = [bench.cell(row[key]) for key in keys]
        if not any(title == f"bench {row['bench']}" and columns == keys and cells in lines
                   for title, columns, lines in tables):
            missing.append(str(row))
    return missing


def test_every_bench_has_rows_here() -> None:
    assert set(ROWS) == set(bench.BENCHMARKS)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_table_shows_every_figure_of_every_row(name: str) -> None:
    rows = ROWS[name]()
    text = bench.render_results(rows)
    assert missing_figures(rows, text) == [], text


def test_all_benches_at_once_show_every_figure() -> None:
    rows = [row for make in ROWS.values() for row in make()]
    text = bench.render_results(rows)
    assert missing_figures(rows, text) == [], text


def test_a_table_taking_its_columns_from_the_first_row_is_caught() -> None:
    """The check fails on the old rendering: the subscription rows after the throughputs had no
    columns for their ratio, recovery and memory figures."""
    rows = ROWS["subscription"]()
    table = bench.result_tables(rows[:1])[0]
    for row in rows[1:]:
        table.add_row(*(bench.cell(row.get(key)) for key in rows[0] if key != "bench"))
    out = io.StringIO()
    console = Console(file=out, width=10_000, color_system=None)
    console.print(table, width=console.measure(table).maximum)
    throughputs, others = rows[:7], rows[7:]  # the first kind, and the ratios, recovery, memory
    assert missing_figures(rows, out.getvalue()) == [str(row) for row in others]
    assert missing_figures(throughputs, out.getvalue()) == []


def test_receive_batch_on_4_partitions_is_a_ratio_to_receive_batch_on_1_and_the_txn_modes_to_plain() -> None:
    rows = {row["case"]: row for row in ROWS["subscription"]() if "ratio" in row}
    four = rows["batch-4p/batch throughput ratio"]
    assert four["ratio"] == round(320_000.75 / 310_000.25, 3) and four["target"] == ">= 0.9"
    assert four["median_round_ratio"] == round((280_000.25 / 300_000.5 + 320_000.75 / 310_000.25) / 2, 3)
    assert rows["txn/plain throughput ratio"]["ratio"] == round(26_000.5 / 31_000.5, 3)


def test_kafka_rows_take_the_best_round_of_each_side_and_their_ratio() -> None:
    produce, consume = bench_kafka.kafka_rows(1, 5_000, {"produce": {"gateway": [20_000.0, 25_000.0],
                                                                     "native": [50_000.0, 40_000.0]},
                                                         "consume": {"gateway": [30_000.0, 10_000.0],
                                                                     "native": [60_000.0, 61_000.0]}},
                                                        {"gateway": [1.0, 0.5], "native": [0.25, 0.5]})
    assert (produce["op"], produce["gateway_msgs_per_s"], produce["native_msgs_per_s"]) == ("produce", 25_000, 50_000)
    assert produce["gateway_over_native"] == 0.5 and produce["gateway_runs"] == [20_000, 25_000]
    assert (consume["op"], consume["gateway_over_native"], consume["rounds"]) == ("consume", round(30 / 61, 3), 2)
    assert (consume["gateway_first_message_ms"], consume["native_first_message_ms"]) == (500.0, 250.0)
    assert produce["gateway_first_message_ms"] is None


def test_the_parts_of_txn_syncs_cost_are_each_a_ratio_to_plain_in_the_same_round() -> None:
    row = bench_produce.produce_row(1, 10, {"plain": [100.0, 200.0], "txn_sync": [80.0, 170.0],
                                            "txn_one": [95.0, 190.0], "txn_bg_commit": [90.0, 180.0],
                                            "ceiling": [1000.0, 800.0]}, "logged")
    assert row["commit_answer"] == "logged"
    parts = (row["txn_one_over_plain"], row["txn_bg_commit_over_plain"], row["txn_sync_over_plain"])
    assert parts == (0.95, 0.9, 0.825)
    assert "txn_over_plain" not in row and "batch_msgs_per_s" not in row  # modes not run are not reported
    assert row["txn_one_over_ceiling"] == round((0.095 + 0.2375) / 2, 3)
    assert "txn_sync_over_floor_sync" not in row  # no floor run


def test_the_synchronous_patterns_floor_is_a_ratio_to_plain_and_txn_sync_a_ratio_to_it_in_the_same_round() -> None:
    row = bench_produce.produce_row(1, 10, {"plain": [100.0, 200.0, 150.0], "txn_sync": [80.0, 170.0, 120.0],
                                            "floor_sync": [90.0, 180.0, 125.0], "ceiling": [1000.0, 800.0, 900.0]})
    assert row["floor_sync_over_plain"] == 0.9  # the rounds' 0.9, 0.9 and 0.833
    # the rounds' 0.889, 0.944 and 0.96: their median, not the ratio of the modes' medians (120 / 125 = 0.96)
    assert row["txn_sync_over_floor_sync"] == round(170.0 / 180.0, 3)
    assert row["floor_sync_runs"] == [90, 180, 125] and row["floor_sync_over_ceiling"] == round(125 / 900, 3)


def test_a_row_on_more_partitions_has_each_modes_ratio_to_its_1_partition_runs_in_the_same_round() -> None:
    row = bench_produce.produce_row(4, 10, {"plain": [100.0, 90.0, 120.0], "batch": [400.0, 300.0, 330.0],
                                            "plain_1p": [110.0, 80.0, 100.0], "batch_1p": [500.0, 290.0, 300.0],
                                            "ceiling": [1000.0, 800.0, 900.0]})
    # batch's rounds: 0.8, 1.034 and 1.1: their median, not the ratio of the medians (330 / 300 = 1.1)
    assert row["batch_over_1p"] == round(300.0 / 290.0, 3)
    assert row["plain_over_1p"] == 1.125  # rounds 0.909, 1.125 and 1.2
    assert row["batch_1p_runs"] == [500, 290, 300] and row["plain_1p_runs"] == [110, 80, 100]
    assert "txn_over_1p" not in row and "batch_1p_msgs_per_s" not in row
    one = bench_produce.produce_row(1, 10, {"plain": [100.0], "ceiling": [1000.0]})
    assert not [key for key in one if "_1p" in key]  # a 1-partition row has none


def test_the_commit_floors_parts_are_ratios_to_the_anchor_and_the_floor_a_count_of_steps() -> None:
    """One durable step of the floor (a call whose async actor puts one object) over the anchor (a
    threaded actor appending to an open file), and the floor's p50 in such steps."""
    parts = bench_commit.FloorParts([0.5, 0.75, 1.0], [1.0, 1.25, 2.0])
    row = bench_commit.commit_row(3, [3.5, 4.25, 9.0], [1.5, 2.0, 4.0], [2.0, 2.25, 5.0], [0.5, 0.8, 1.5],
                                  [3.0, 3.75, 6.0], 3.0, parts=parts)
    assert row["async_call_p50_ms"] == 0.75 and row["floor_step_p50_ms"] == 1.25
    assert row["floor_step_over_anchor"] == round(1.25 / 0.8, 2)
    assert row["floor_over_step"] == 3.0
    assert "floor_step_p50_ms" not in bench_commit.commit_row(3, [3.5], [1.5], [2.0], [0.8], [3.75], 3.0)


def test_spark_peer_rows_carry_each_sides_batches_and_say_when_the_sides_batch_counts_differ() -> None:
    same = {side: [bench_peers_spark._figures([2000, 2000, 1000], [1.0, 0.5, 0.3], 2.0)]
            for side in bench_peers.SIDES}
    rows = bench_peers_spark.spark_peer_rows(5_000, 2_000, same, {}, {})
    assert all(r["batches"] == 3 and r["batches_runs"] == [3] and r["batch_rows_max"] == 2000 for r in rows)
    assert not any("batches_differ" in r for r in rows)
    fewer = {**same, "native": [bench_peers_spark._figures([3000, 2000], [1.0, 0.5], 2.0)]}
    rows = bench_peers_spark.spark_peer_rows(5_000, 2_000, fewer, {}, {})
    assert all(r["batches_differ"] == "batches per round differ: kafka [3], gateway [3], native [2]"
               for r in rows), rows
    assert rows[2]["batch_rows_max"] == 3000
