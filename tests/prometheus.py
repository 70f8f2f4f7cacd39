"""Ray's Prometheus endpoint as the tests read it: a scrape of the raytxn series of the local
node, and waits for what a test did to show (Ray exports on a timer, every 2 s in the test
session). Counters are compared as deltas per series against an earlier scrape: other modules
share the session's Ray, and a dead worker's series may vanish from the export at any time."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

EXPORT_DEADLINE_S = 90.0  # a few of Ray's report intervals

# (sample name, sorted label items) -> value
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_url() -> str:
    """The Prometheus endpoint of the node this driver runs on."""
    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    return f"http://127.0.0.1:{node['MetricsExportPort']}/metrics"


def scrape() -> Scrape:
    with urllib.request.urlopen(metrics_url(), timeout=10) as response:
        text = response.read().decode()
    samples: Scrape = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("ray_raytxn_"):
            continue
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def select(samples: Scrape, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The series of sample ``name`` whose labels include ``labels``."""
    return {key: value for (sample, key), value in samples.items()
            if sample == name and all(dict(key).get(k) == v for k, v in labels.items())}


def total(samples: Scrape, name: str, **labels: str) -> float:
    return sum(select(samples, name, **labels).values())


def delta(now: Scrape, before: Scrape, name: str, **labels: str) -> float:
    """How much the matching series grew since ``before`` (series that vanished count as 0)."""
    earlier = select(before, name, **labels)
    return sum(value - earlier.get(key, 0.0) for key, value in select(now, name, **labels).items())


def wait_for_metrics(check: Callable[[Scrape], bool], what: str) -> Scrape:
    """Scrape until ``check`` holds; fails with the last raytxn series after the deadline."""
    deadline = time.monotonic() + EXPORT_DEADLINE_S
    while True:
        samples = scrape()
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            shown = "\n".join(f"{name} {dict(key)} {value}" for (name, key), value in sorted(samples.items()))
            pytest.fail(f"metrics never showed {what} within {EXPORT_DEADLINE_S}s; raytxn series:\n{shown}")
        time.sleep(0.5)
