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
# Every line the demo prints itself starts with one of these; Ray's report of the injected crash
# is the one other line allowed, at most once, after the demo's note that explains it.
DEMO_LINES = re.compile(r"(connected in |note: |produced 10 orders |txn\(\d+,\d+\): |invoices-\w+ holds |health: "
                        r"|deleted the demo's topics |ok \()")
RAY_CRASH_LINE = re.compile(r"\(raylet\) A worker died or was killed")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


@pytest.mark.extended  # the suite's budget (34 s): the first demo run stays in the suite
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
        _assert_only_its_own_lines(out)
    assert counts[0] == counts[1], (first, second)
    assert "topics of earlier runs" not in second, second
    assert (tmp_path / ".raytxn-data").is_dir()  # both runs used the one storage


def _assert_only_its_own_lines(out: str) -> None:
    lines = [ANSI.sub("", line) for line in out.splitlines() if line.strip()]
    foreign = [line for line in lines if not DEMO_LINES.match(line) and not RAY_CRASH_LINE.match(line)]
    assert not foreign, out
    notes = [i for i, line in enumerate(lines) if line.startswith("note: the next crash is injected")]
    ray_lines = [i for i, line in enumerate(lines) if RAY_CRASH_LINE.match(line)]
    assert len(notes) == 1 and len(ray_lines) <= 1, out
    assert all(i > notes[0] for i in ray_lines), out  # said before Ray says it
