"""The Grafana dashboards (``raytxn.console.grafana``) query only what the engine really exports:
real traffic on a real engine (appends, deliveries, commits, aborts, a timeout, a refused end, a
backlog, a restart, an activation, a passivation), then Ray's Prometheus endpoint is scraped until
every metric a panel names has shown. A panel naming a metric the engine does not export (a
typo, a rename) fails here instead of staying empty in Grafana."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

import raytxn as rt
from raytxn.cluster import stop_actor
from raytxn.config import SubscriptionConfig
from raytxn.console.grafana import DASHBOARDS, OVERVIEW, dashboard_json, metric_names
from raytxn.errors import ParticipantEndFailed
from raytxn.ids import partition_actor_name
from raytxn.tools.cli import app
from raytxn.tools.testing import start_participant
from tests.engine import engine_client, health_row, restart_actor, wait_for
from tests.prometheus import Scrape, select, wait_for_metrics

pytestmark = [pytest.mark.ray, pytest.mark.slow(seconds=25)]  # 2 tests, about 50 s with the engine's start

IDLE_S = 2.0


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory, watch_interval_s=0.3, passivate_idle_s=IDLE_S,
                             slow_txn_threshold_ms=500,
                             subscription=SubscriptionConfig(backlog_metric_interval_s=0.5))


def exported(samples: Scrape) -> set[str]:
    return {name for name, _labels in samples}


def dashboard_text(metric: str) -> str:
    """The queries naming ``metric``, joined (to see whether they filter it by topic)."""
    return " ".join(target.expr for row in OVERVIEW.rows for panel in row.panels for target in panel.targets
                    if metric in target.expr)


def test_every_panel_queries_a_metric_the_engine_exports(client: rt.Client) -> None:
    topic, idle = f"graf-{uuid.uuid4().hex[:6]}", f"graf-idle-{uuid.uuid4().hex[:6]}"
    client.create_topics([topic, idle], partitions=1)  # dormant until used: the first send activates
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(f"plain-{i}".encode())
    with client.transaction() as txn:
        producer.send(b"committed", txn=txn)
    aborted = client.new_transaction()
    producer.send(b"aborted", txn=aborted)
    aborted.abort()
    doomed = client.new_transaction(timeout=0.3)  # the coordinator times it out
    producer.send(b"timed-out", txn=doomed)
    client.create_producer(idle).send(b"then idle")  # passivated IDLE_S after
    consumer = client.subscribe(topic, "graf", initial_position="earliest")  # attached: its backlog is counted
    consumer.receive(timeout=10)
    hanging = client.new_transaction(timeout=120)  # open (and slow after 0.5 s), holding an ack
    consumer.acknowledge(consumer.receive(timeout=10), txn=hanging)
    restart_actor(partition_actor_name(topic, 0))  # the supervisor sees the new incarnation
    refusing_topic = f"graf-refusing-{uuid.uuid4().hex[:6]}"  # no such topic: a stand-in under its partition's name
    refusing_name = partition_actor_name(refusing_topic, 0)
    refusing = start_participant(refusing_name)
    try:  # a participant refusing an end: the end-failure counter
        ray.get(refusing.fail_next.remote(1, refuse=True))
        refused = client.new_transaction(timeout=60)
        client.coordinators.add_partitions(refused.id, [(refusing_topic, 0)])
        with pytest.raises(ParticipantEndFailed):
            refused.commit()
        wait_for(lambda: health_row(client, partition_actor_name(idle, 0))["passivations"] >= 1, 60,
                 "the idle topic's partition passivated")
        wanted = metric_names(OVERVIEW)
        # (the session's Ray is shared: the topic-tagged series must be this module's own topic's)
        per_topic = {name for name in wanted if "{topic" in dashboard_text(name)}

        def shown(samples: Scrape) -> bool:
            return wanted <= exported(samples) and all(select(samples, name, topic=topic) for name in per_topic)

        samples = wait_for_metrics(shown, "every metric the dashboards query")
        assert wanted <= exported(samples) and len(per_topic) >= 7
        assert len(wanted) >= 18  # throughput, backlog, transactions, latency, actors
    finally:
        stop_actor(refusing_name)
        hanging.abort()
        consumer.close()


def test_dashboard_json_is_grafanas_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["console", "grafana", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for dashboard in DASHBOARDS:
        written = json.loads((tmp_path / f"{dashboard.uid}.json").read_text())
        assert written == dashboard_json(dashboard)
        panels = written["panels"]
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids))
        rows = [p for p in panels if p["type"] == "row"]
        graphs = [p for p in panels if p["type"] == "timeseries"]
        assert [r["title"] for r in rows] == [r.title for r in dashboard.rows]
        assert graphs and all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in graphs)
        for panel in graphs:
            for target in panel["targets"]:
                assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
        # no two panels overlap on the grid
        cells = set()
        for panel in panels:
            grid = panel["gridPos"]
            mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                    for y in range(grid["y"], grid["y"] + grid["h"])}
            assert not cells & mine, panel["title"]
            cells |= mine
