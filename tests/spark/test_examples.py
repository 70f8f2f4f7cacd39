"""``examples/spark_eos_failures.py`` run as a user runs it, for each of its jobs: the stateless
word count, the running word count kept as state and the per-key dedup window, each under the
example's faults (a task failing midway, an executor killed, a driver killed mid-batch and
restarted), each checked against the same computation in plain Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_eos_failures.py"


@pytest.mark.extended  # three runs of two Spark sessions and three drivers each
@pytest.mark.slow(seconds=130)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("job", ["wordcount", "running", "dedup"])
def test_the_failures_example_is_exact_for_each_job(job: str, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(EXAMPLE), "--job", job], cwd=tmp_path, capture_output=True,
                         text=True, timeout=540)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-5000:]
    print("\n".join(lines))
    assert any(line.startswith("killed Spark executor") for line in lines), "no executor was killed"
    assert "killed the driver process mid-batch (its transaction is open)" in lines
    assert lines[-1].count(": True") == (2 if job == "running" else 1) and "False" not in lines[-1], lines[-1]
