"""mkdocs hook: lay the package out as the wheel lays it out, for mkdocstrings.

raytxn is one import package built from three folders (pyproject's package-dir: runtime/ is
``raytxn``, actors/ is ``raytxn.actors``, connectors/ is ``raytxn.connectors``). griffe, which
reads the sources for the API reference, follows one folder per package, so this hook copies the
three folders into ``build/docs-api/raytxn`` (the ``paths`` of the mkdocstrings handler in
mkdocs.yml) before any page is rendered, as tests/unit/test_packaging.py lays it out for
import-linter. A copy, not links, so a stale tree never survives a rename.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"": "runtime", "actors": "actors", "connectors": "connectors"}


def on_startup(**_: Any) -> None:
    # At the very start, before any plugin's on_config: mkdocstrings takes its search paths then,
    # and a path that did not exist yet sent griffe to the editable install's finder, which does
    # not see the package's modules (a fresh clone's first build failed: raytxn.config not found).
    lay_out()


def on_config(config: Any, **_: Any) -> Any:
    lay_out()  # again per build, so `mkdocs serve` rebuilds see renamed modules
    return config


def lay_out() -> None:
    top = ROOT / "build" / "docs-api" / "raytxn"
    shutil.rmtree(top, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for sub, folder in FOLDERS.items():
        shutil.copytree(ROOT / folder, top / sub if sub else top, ignore=ignore, dirs_exist_ok=True)
