"""The chaos workload with passivation (issue 17): an engine that passivates actors idle for
0.5 s, over an 8-partition input topic (so partitions and subscriptions go idle, are passivated and
activated again while transactions run), with a fault schedule in which part of the partition and
subscription kills are for good (dormant until a call activates them). The exactly-once checker
must find nothing, and passivations must really have happened during the run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import raytxn as rt
from raytxn.tools.chaos import run_chaos
from tests.engine import engine_client

pytestmark = [pytest.mark.ray, pytest.mark.extended, pytest.mark.slow(seconds=55)]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.3, passivate_idle_s=0.5)


@pytest.mark.timeout(900)
def test_chaos_with_passivation_on_many_partitions_is_exactly_once(client: rt.Client) -> None:
    # seed 7: of its 5 faults, two partition/subscription kills are for good
    result = run_chaos(client, txns=40, seed=7, workers=3, txn_timeout_s=8.0, fault_interval_s=1.0,
                       partitions=(8, 2, 2), dormant_ratio=0.5)
    print(result.summary(), result.errors)
    rows = client.health()["actors"]
    passivations = sum(r.get("passivations", 0) for r in rows)
    activations = sum(r.get("activations", 0) for r in rows)
    print(f"passivations {passivations}, activations {activations}")
    assert any(e["do"] == "kill_for_good" for e in result.schedule)
    assert result.faults_fired >= len(result.schedule) // 2, "the faults did not happen"
    assert passivations > 0 and activations > passivations // 2, (passivations, activations)
    evidence = "\n".join(result.evidence)
    assert result.committed >= 40, f"schedule {result.schedule}\n{result.report.summary()}\n{evidence}"
    assert result.clean, f"schedule {result.schedule}\n{result.report.summary()}\n{evidence}"
