"""`make demo` twice: the second run of examples/quickstart.py on the same storage starts the same
actors as the first (each run deletes the topics it created, so none piles up).

The runs join the test session's Ray (``RAY_ADDRESS``), as the README's snippets do, rather than
each starting a local one: under the other pytest worker's load, two Ray starts and stops made this
test take 170 s here and time out (300 s) in CI, for a demo that runs in 15 s alone. The demo's
``rt.shutdown()`` stops the engine it started and leaves a Ray it joined running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import joinable_ray_address

pytestmark = [pytest.mark.ray, pytest.mark.slow(seconds=20)]

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def _run_demo(cwd: Path, ray_address: str) -> str:
    """One run in its own process, storing in ``cwd``/.raytxn-data as `make demo` stores in the
    clone. A run that hangs is stopped with what it printed so far, which says where it stuck."""
    try:
        proc = subprocess.run([sys.executable, str(QUICKSTART)], cwd=cwd, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "RAY_ADDRESS": ray_address})
    except subprocess.TimeoutExpired as hung:
        printed = [out if isinstance(out, str) else (out or b"").decode(errors="replace")
                   for out in (hung.stdout, hung.stderr)]
        raise AssertionError("the demo did not end in 120 s; it printed:\n" + "\n".join(printed)) from None
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_a_second_demo_run_starts_the_same_actors(tmp_path: Path, ray_session) -> None:
    address = joinable_ray_address(ray_session)
    first, second = _run_demo(tmp_path, address), _run_demo(tmp_path, address)
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
