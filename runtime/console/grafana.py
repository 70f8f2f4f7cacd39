"""Grafana dashboards of the engine's metrics, generated from code (as Ray generates its own from
``ray/dashboard/modules/metrics/dashboards/``): panels are data here, ``dashboard_json`` lays
them out as Grafana's JSON model, and ``raytxn console grafana --out DIR`` writes them.

Every query names metrics as Prometheus scrapes them from Ray's metrics endpoint (``raytxn.metrics``:
Ray prefixes ``ray_``, counters end in ``_total``, histograms export ``_bucket``/``_count``/``_sum``).
``metric_names`` lists what the panels query; tests/integration/test_grafana.py checks each name
against the real endpoint after real traffic, so a renamed metric cannot leave a panel empty.

Pure: no Ray, no I/O but ``write_dashboards``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TOPICS = 'topic=~"$topic"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str  # a Grafana unit: short, ops, Bps, ms
    targets: tuple[Target, ...]
    stack: bool = False


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]


def _rate(metric: str, by: str, labels: str = TOPICS) -> str:
    return f"sum by ({by}) (rate({metric}{{{labels}}}{RATE}))"


def _quantile(q: float, metric: str, by: str = "") -> str:
    keys = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({keys}) (rate({metric}{RATE})))"


THROUGHPUT = Row("Throughput", (
    Panel("Messages appended", "Messages stored per second by the topic's partitions (duplicates of retried sends "
          "not counted; a transaction's messages count when appended, whatever its outcome).", "ops",
          (Target(_rate("ray_raytxn_append_messages_total", "topic"), "{{topic}}"),), stack=True),
    Panel("Bytes appended", "Encoded message bytes stored per second.", "Bps",
          (Target(_rate("ray_raytxn_append_bytes_total", "topic"), "{{topic}}"),), stack=True),
    Panel("Messages delivered", "Messages handed to consumers per second, by subscription (redeliveries too).",
          "ops", (Target(_rate("ray_raytxn_dispatch_messages_total", "topic, subscription"),
                         "{{topic}} / {{subscription}}"),), stack=True),
    Panel("Bytes delivered", "Encoded message bytes handed to consumers per second.", "Bps",
          (Target(_rate("ray_raytxn_dispatch_bytes_total", "topic, subscription"), "{{topic}} / {{subscription}}"),),
          stack=True),
))

BACKLOG = Row("Backlog and lag", (
    Panel("Subscription backlog", "Messages a subscription has still to consume up to the readable end: unacked, "
          "transaction markers and aborted messages not counted (so it reaches 0 under exactly-once). Counted "
          "while the subscription has consumers or a lease.", "short",
          (Target(f"sum by (topic, subscription) (ray_raytxn_subscription_backlog_messages{{{TOPICS}}})",
                  "{{topic}} / {{subscription}}"),)),
    Panel("Held back by open transactions", "Partition entries after the readable end (max read position): what "
          "the oldest open transaction holds back from every reader.", "short",
          (Target(f"max by (topic, partition) (ray_raytxn_max_read_lag_entries{{{TOPICS}}})",
                  "{{topic}}-{{partition}}"),)),
    Panel("Acks pending in transactions", "Entries acknowledged inside transactions not ended yet, and those "
          "transactions, per subscription.", "short",
          (Target(f"sum by (topic, subscription) (ray_raytxn_pending_ack_positions{{{TOPICS}}})",
                  "entries {{topic}} / {{subscription}}"),
           Target(f"sum by (topic, subscription) (ray_raytxn_pending_ack_txns{{{TOPICS}}})",
                  "txns {{topic}} / {{subscription}}"))),
))

TRANSACTIONS = Row("Transactions", (
    Panel("Transactions per second", "Begun, committed, aborted (by their owner, a timeout, fencing or an operator) "
          "and timed out, over every coordinator.", "ops",
          (Target(f"sum(rate(ray_raytxn_txns_begun_total{RATE}))", "begun"),
           Target(f"sum(rate(ray_raytxn_txns_committed_total{RATE}))", "committed"),
           Target(f"sum(rate(ray_raytxn_txns_aborted_total{RATE}))", "aborted"),
           Target(f"sum(rate(ray_raytxn_txns_timed_out_total{RATE}))", "timed out"))),
    Panel("Open and slow transactions", "Live transactions per coordinator, and those older than its "
          "slow_txn_threshold_ms: hanging ones (abort them from the console's transactions page).", "short",
          (Target("sum by (tc_id) (ray_raytxn_open_txns)", "open tc-{{tc_id}}"),
           Target("sum by (tc_id) (ray_raytxn_slow_txns)", "slow tc-{{tc_id}}"))),
    Panel("Ends refused by participants", "Ends a partition or subscription refused with a non-retriable error, by "
          "the error: the transaction stays committing or aborting until driven again.", "ops",
          (Target(f"sum by (error) (rate(ray_raytxn_txn_end_failures_total{RATE}))", "{{error}}"),)),
))

LATENCY = Row("Latency", (
    Panel("Commit latency", "From an end_txn(COMMIT) request to the committed state, percentiles over every "
          "coordinator.", "ms",
          (Target(_quantile(0.5, "ray_raytxn_commit_latency_ms_bucket"), "p50"),
           Target(_quantile(0.99, "ray_raytxn_commit_latency_ms_bucket"), "p99"))),
    Panel("Storage put latency", "One ledger object put until durable (retries included), p99 by kind of stream.",
          "ms", (Target(_quantile(0.99, "ray_raytxn_ledger_put_latency_ms_bucket", "stream_kind"),
                        "p99 {{stream_kind}}"),)),
))

ACTORS = Row("Actors", (
    Panel("Actors by state", "Partition and subscription actors live (a process) or dormant (passivated or never "
          "started: the next call activates them).", "short",
          (Target("sum by (actor_kind, state) (ray_raytxn_actors)", "{{actor_kind}} {{state}}"),), stack=True),
    Panel("Restarts", "New incarnations of live actors the supervisor saw: crashes Ray restarted, coordinators "
          "created again.", "short",
          (Target(f"sum by (actor_kind) (increase(ray_raytxn_actor_restarts_total{RATE}))", "{{actor_kind}}"),)),
    Panel("Activations and passivations", "Dormant actors started by a call, and idle ones passivated, per second.",
          "ops", (Target(f"sum by (actor_kind) (rate(ray_raytxn_activations_total{RATE}))", "activated {{actor_kind}}"),
                  Target(f"sum by (actor_kind) (rate(ray_raytxn_passivations_total{RATE}))",
                         "passivated {{actor_kind}}"))),
    Panel("Recoveries", "Incarnations started (every start recovers from storage) and the p99 of their recovery.",
          "short", (Target(f"sum by (actor_kind) (increase(ray_raytxn_recoveries_total{RATE}))", "{{actor_kind}}"),
                    Target(_quantile(0.99, "ray_raytxn_recovery_duration_ms_bucket", "actor_kind"),
                           "p99 ms {{actor_kind}}"))),
))

OVERVIEW = Dashboard("raytxn-overview", "raytxn", "Throughput, backlog, transactions, latency and actors of a raytxn "
                     "engine, from Ray's Prometheus metrics.", (THROUGHPUT, BACKLOG, TRANSACTIONS, LATENCY, ACTORS))
DASHBOARDS: tuple[Dashboard, ...] = (OVERVIEW,)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id, "type": "timeseries", "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
        "fieldConfig": {"defaults": {"unit": panel.unit, "min": 0, "custom": {
            "fillOpacity": 10, "lineWidth": 1, "stacking": {"mode": "normal" if panel.stack else "none"}}},
            "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"datasource": DATASOURCE, "expr": target.expr, "legendFormat": target.legend,
                     "refId": chr(ord("A") + i), "range": True} for i, target in enumerate(panel.targets)],
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana's JSON model of ``dashboard``: a row panel per row, two panels across, a data
    source variable (any Prometheus scraping Ray's metrics) and a topic filter."""
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row in dashboard.rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}})
        next_id += 1
        y += 1
        for i, panel in enumerate(row.panels):
            panels.append(_panel_json(panel, next_id, 12 * (i % 2), y + 8 * (i // 2)))
            next_id += 1
        y += 8 * -(-len(row.panels) // 2)
    topic_query = "label_values(ray_raytxn_append_messages_total, topic)"
    return {
        "uid": dashboard.uid, "title": dashboard.title, "description": dashboard.description,
        "tags": ["raytxn"], "timezone": "browser", "schemaVersion": 39, "version": 1, "editable": True,
        "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1},
            {"name": "topic", "label": "Topic", "type": "query", "datasource": DATASOURCE,
             "query": {"query": topic_query, "refId": "topic"}, "definition": topic_query, "includeAll": True,
             "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "refresh": 2,
             "hide": 0, "sort": 1},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


_METRIC = re.compile(r"\bray_raytxn_[a-z0-9_]+")


def metric_names(dashboard: Dashboard) -> set[str]:
    """Every metric (as scraped: ``ray_raytxn_...``) the dashboard's queries name."""
    return {name for row in dashboard.rows for panel in row.panels for target in panel.targets
            for name in _METRIC.findall(target.expr)}


def write_dashboards(out: Path) -> list[Path]:
    """Write each dashboard as ``<uid>.json`` into ``out`` (made if missing); returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for dashboard in DASHBOARDS:
        path = out / f"{dashboard.uid}.json"
        path.write_text(json.dumps(dashboard_json(dashboard), indent=2) + "\n")
        written.append(path)
    return written
