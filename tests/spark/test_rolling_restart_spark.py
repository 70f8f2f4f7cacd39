"""The rolling restart and the kill of everything (tests/integration/test_rolling_restart.py) with
a Spark pipeline running beside the live workload: ``ExactlyOncePipeline`` (real Spark on Ray
through RayDP) reads the workload's input through its own subscription and writes ``s-<value>``
for each message to its sink, micro-batch after micro-batch, while every engine actor is
restarted one at a time and then killed at once. At the end its sink holds exactly one output
per input message (none lost, none twice), and the workload's checker is clean."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import raytxn as rt
from raytxn.config import SubscriptionConfig
from raytxn.connectors.spark import ExactlyOncePipeline
from tests.engine import engine_client, visible_values
from tests.integration.test_rolling_restart import TXN_TIMEOUT_S, check_workload, restart_everything
from tests.restart_workload import LiveWorkload

pytestmark = [pytest.mark.ray, pytest.mark.spark, pytest.mark.extended]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, deadline_s=120,
                             subscription=SubscriptionConfig(consumer_timeout_s=3.0))


def prefixed(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(F.col("key"), F.concat(F.lit("s-"), F.col("value").cast("string")).alias("value"))


@pytest.mark.timeout(900)  # a live workload for minutes on a loaded machine
@pytest.mark.slow(seconds=240)
def test_a_spark_pipeline_through_a_rolling_restart_and_a_kill_of_everything(client: rt.Client, spark) -> None:
    workload = LiveWorkload(client, partitions=2, txn_timeout_s=TXN_TIMEOUT_S)
    sink = f"{workload.run}-spark"
    client.create_topic(sink, 2)
    pipeline = ExactlyOncePipeline(spark, client, workload.source, "spark", sink, prefixed,
                                   f"pipe-{uuid.uuid4().hex[:6]}", batch_max_messages=200, max_attempts=30,
                                   txn_timeout_s=60)
    # Retention follows the subscriptions: a range every subscription acked may be trimmed, and the
    # inputs read back at the end would miss it (one run read 408 inputs for 428 exact outputs, another
    # 153 for 301). A subscription that never acks keeps every input readable.
    client.subscribe(workload.source, "held", initial_position="earliest").close()
    stop = threading.Event()
    failures: list[BaseException] = []

    def run_pipeline() -> None:
        while not stop.is_set():
            try:
                # max_batches counts every batch the pipeline committed, over all its runs: a few
                # more each call (a constant 1 ran one batch, then returned at once, in a busy loop)
                pipeline.run(max_batches=len(pipeline.stats) + 5, until_idle=True, progress=False)
            except Exception as e:  # noqa: BLE001 - the test fails on it below
                failures.append(e)
                return

    workload.start()
    runner = threading.Thread(target=run_pipeline, daemon=True)
    runner.start()
    try:
        rows = restart_everything(client, workload)
    finally:
        workload.stop()
        stop.set()
        runner.join(timeout=300)
    assert not runner.is_alive() and not failures, failures
    pipeline.run(until_idle=True, progress=False)  # what the producers sent last
    assert {row["kind"] for row in rows} >= {"partition", "subscription", "coordinator", "supervisor"}
    check_workload(workload)
    inputs = visible_values(workload.source, [0, 1], deadline_s=120)
    outputs = visible_values(sink, [0, 1], deadline_s=120)
    twice = sorted(value for value, count in Counter(outputs).items() if count > 1)
    assert sorted(outputs) == sorted(b"s-" + value for value in inputs), (
        f"{len(outputs)} outputs for {len(inputs)} inputs; batches {len(pipeline.stats)}; "
        f"{len(twice)} outputs more than once: {twice[:40]}; phases {workload._phases}")
    print(f"{len(inputs)} inputs, {len(pipeline.stats)} batches, outputs exact")
