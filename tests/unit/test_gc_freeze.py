"""``raytxn.gc_freeze``: once per process, and off with ``RAYTXN_GC_FREEZE=0``. Each case runs in
a fresh interpreter: a freeze cannot be undone for the objects it froze."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
import gc
from raytxn.gc_freeze import freeze_startup_objects
assert gc.get_freeze_count() == 0
first = freeze_startup_objects()
frozen = gc.get_freeze_count()
kept = [[] for _ in range(1000)]  # new tracked objects: the second call must not freeze them
second = freeze_startup_objects()
print(first, second, frozen, gc.get_freeze_count())
"""


def _run(**env: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROGRAM], env={**os.environ, **env}, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return out.split()


def test_freezes_once_per_process() -> None:
    first, second, frozen, after = _run(RAYTXN_GC_FREEZE="1")
    assert (first, second) == ("True", "False")
    assert int(frozen) > 1000  # the interpreter's and raytxn's modules
    assert int(after) == int(frozen)  # the second call froze nothing more


def test_turned_off_by_the_environment() -> None:
    assert _run(RAYTXN_GC_FREEZE="0") == ["False", "False", "0", "0"]
