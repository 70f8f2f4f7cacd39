"""Exactly-once on a 64-partition topic (issue 17): the chaos workload reads its orders from a
64-partition input topic (64 partition actors and 64 subscription actors beside the
coordinators and outputs), under its seeded fault schedule, and the exactly-once checker must
find nothing. Sized small (60 orders): the point is the partition count, and the engine's
~130 actor processes take about 10 GiB of this machine's 24 while they live."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.tools.chaos import run_chaos
from tests.engine import engine_client

pytestmark = [pytest.mark.ray, pytest.mark.slow(seconds=130)]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.5)


@pytest.mark.timeout(900)
def test_chaos_on_a_64_partition_input_topic_is_exactly_once(client: rt.Client) -> None:
    result = run_chaos(client, txns=60, seed=5, workers=3, txn_timeout_s=15.0, fault_interval_s=2.0,
                       partitions=(64, 2, 2))
    print(result.summary(), result.errors)
    inputs = [row for row in client.health()["actors"] if re.fullmatch(r"partition-c5-\w+-in-\d+", row["name"])]
    print(f"{len(inputs)} input partition actors")
    assert len(inputs) == 64
    assert result.faults_fired >= len(result.schedule) // 2, "the faults did not happen"
    evidence = "\n".join(result.evidence)
    assert result.committed >= 60, f"schedule {result.schedule}\n{result.report.summary()}\n{evidence}"
    assert result.clean, f"schedule {result.schedule}\n{result.report.summary()}\n{evidence}"
