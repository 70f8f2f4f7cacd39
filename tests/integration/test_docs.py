"""Every code block of the README and the docs site runs (the conventions: tests/docs_blocks.py).

A page's python blocks run as one program in a process of its own, joined to the test session's
Ray (``RAY_ADDRESS``) rather than starting a local one: that start, not the page, was most of
each run. Every page's program ends with ``rt.shutdown()``, which stops the engine it started and
leaves a Ray it joined running. A page's bash blocks run in order in a fresh directory with the
same ``RAY_ADDRESS``: the CLI commands there attach to that Ray and start an engine on the
directory's default storage, which the test stops afterwards. Spark pages run in
tests/spark/test_pipeline.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raytxn.cluster import stop_engine
from tests.docs_blocks import (
    PYTHON_PAGES,
    ROOT,
    SHELL_PAGES,
    page_name,
    program_seconds,
    python_program,
    shell_blocks,
    uses_spark,
)
from tests.engine import joinable_ray_address

pytestmark = pytest.mark.ray


def run_page_program(page: Path, ray_session: object, where: Path) -> None:
    """The page's python program, written beside ``where`` under the page's name, so a traceback
    reads ``docs/guides/x.md.py", line N``: line N of the page."""
    address = joinable_ray_address(ray_session)
    script = where / (page_name(page).replace("/", "__") + ".py")
    script.write_text(python_program(page))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=where, env={**os.environ, "RAY_ADDRESS": address})
    assert proc.returncode == 0, (f"the python blocks of {page_name(page)} failed:\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}")


@pytest.mark.parametrize("page", [pytest.param(p, id=page_name(p), marks=pytest.mark.slow(seconds=program_seconds(p)))
                                  for p in PYTHON_PAGES if not uses_spark(p)])
def test_page_python_runs(page: Path, ray_session: object, tmp_path: Path) -> None:
    run_page_program(page, ray_session, tmp_path)


@pytest.mark.parametrize("page", [pytest.param(p, id=page_name(p)) for p in SHELL_PAGES])
def test_page_commands_run(page: Path, ray_session: object, tmp_path: Path) -> None:
    address = joinable_ray_address(ray_session)
    env = {**os.environ, "RAY_ADDRESS": address,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    try:
        for block in shell_blocks(page):
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], capture_output=True, text=True,
                                  timeout=300, cwd=tmp_path, env=env)
            assert proc.returncode == 0, (f"the bash block at {block.where} failed ({proc.returncode}):\n"
                                          f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    finally:
        stop_engine()  # the engine the CLI commands started on tmp_path's default storage


def test_pages_hold_code_to_run() -> None:
    """The runs above cover pages: none would pass by finding no blocks."""
    assert page_name(ROOT / "README.md") in {page_name(p) for p in PYTHON_PAGES}
    assert len(PYTHON_PAGES) >= 10 and SHELL_PAGES
