"""Removing the node that hosts a coordinator and partition actors mid-run: everything recovers
on the other node and the exactly-once checker is clean. Runs in its own process with its own
3-node ray.cluster_utils.Cluster (the rest of the suite shares one local Ray)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_node_loss_recovers_on_other_nodes() -> None:
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("multinode_run.py"))],
                          capture_output=True, text=True, timeout=540, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1])
    assert result["victim_hosted"], "the removed node hosted no engine actor"
    assert all(node and node != result["victim_node"] for node in result["moved_to"].values()), result
    assert result["committed_total"] > result["committed_before_removal"], "no progress after the node loss"
    assert result["healthy"], result
    assert result["clean"], result["summary"]
