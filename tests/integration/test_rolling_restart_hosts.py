"""The rolling restart and the kill of everything under load (test_rolling_restart.py) on an
engine whose partitions and subscriptions live in hosts (``actor_hosts``): the hosts are
restarted, each with every actor it serves drained first. Two partitions per topic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import raytxn as rt
from tests.engine import engine_client
from tests.integration.test_rolling_restart import check_workload, restart_everything_under_load

pytestmark = [pytest.mark.ray, pytest.mark.extended]


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, deadline_s=120, actor_hosts=2)


@pytest.mark.timeout(900)  # a live workload for minutes on a loaded machine
@pytest.mark.slow(seconds=150)
def test_rolling_restart_of_hosts_and_a_kill_of_everything_under_load(client: rt.Client) -> None:
    workload, rows = restart_everything_under_load(client, partitions=2)
    print("\n".join(f"{r['name']}: {r.get('restarted')} {r['seconds']}s {r.get('actors', '')}" for r in rows))
    assert [row["kind"] for row in rows] == ["coordinator", "coordinator", "host", "host", "supervisor"], rows
    assert sum(row["actors"] for row in rows if row["kind"] == "host") >= 2 + 1 + 3 * 2, rows  # every active one
    assert all(row["restarted"] for row in rows)
    check_workload(workload)
