"""`make demo` twice: the second run of examples/quickstart.py on the same storage starts the same
actors as the first (each run deletes the topics it created, so none piles up)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow(seconds=28)

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def _run_demo(cwd: Path) -> str:
    """One run in its own process and its own local Ray (never a cluster someone else started),
    storing in ``cwd``/.raytxn-data as `make demo` stores in the clone."""
    proc = subprocess.run([sys.executable, str(QUICKSTART)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": "local"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_a_second_demo_run_starts_the_same_actors(tmp_path: Path) -> None:
    first, second = _run_demo(tmp_path), _run_demo(tmp_path)
    counts = []
    for out in (first, second):
        assert "exactly once per order: True" in out, out
        assert re.search(r"deleted the demo's topics orders-\w+ and invoices-\w+", out), out
        alive, total, dormant = map(int, re.search(r"health: (\d+)/(\d+) actors alive, (\d+) dormant", out).groups())
        assert alive + dormant == total
        counts.append(total)
    assert counts[0] == counts[1], (first, second)
    assert "topics of earlier runs" not in second, second
    assert (tmp_path / ".raytxn-data").is_dir()  # both runs used the one storage
