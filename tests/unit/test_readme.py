"""Every ```python block of the README runs, each in its own process, and the README keeps exactly
two set-up commands. The processes join the test session's Ray (``RAY_ADDRESS``) rather than each
starting a local one: that start, not the snippet, was most of each run. Every snippet ends with
``rt.shutdown()``, which stops the engine it started and leaves a Ray it joined running."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import joinable_ray_address

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)




# The Spark block runs in tests/spark/test_pipeline.py, first in that module (before its own
# Spark starts: RayDP keeps one Spark per Ray namespace), so it never shares the machine's two
# cores with another Spark's start: beside the driver tests' Spark processes, it took 124 s
# instead of about 45.
SPARK_BLOCKS = [i for i, block in enumerate(BLOCKS) if "init_spark" in block]


def snippet_seconds(block: str) -> int:
    """A snippet's time alone, for the test order (tests/conftest.py): each starts an engine; the
    Spark one starts Spark on Ray, the Ray Data one runs Ray tasks."""
    return 45 if "init_spark" in block else 30 if "connectors.ray_data" in block else 8


def run_readme_block(index: int, ray_session: object) -> None:
    """README python block ``index``, in a process of its own joined to the test session's Ray."""
    address = joinable_ray_address(ray_session)
    proc = subprocess.run([sys.executable, "-c", BLOCKS[index]], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "RAY_ADDRESS": address})
    assert proc.returncode == 0, f"README python block {index} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("index", [pytest.param(i, marks=pytest.mark.slow(seconds=snippet_seconds(block)))
                                   for i, block in enumerate(BLOCKS) if i not in SPARK_BLOCKS])
def test_readme_snippet_runs(index: int, ray_session) -> None:
    run_readme_block(index, ray_session)


def test_readme_keeps_exactly_two_setup_commands() -> None:
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make \w+", setup, flags=re.M)
    assert commands == ["make demo", "make test"]
