"""mypy over raytxn's public API, as a user's type checker sees the installed package.

`raytxn` is built from three folders (runtime/, actors/, connectors/), which mypy cannot map onto
one package, and the editable install's import hook is invisible to it. So this lays the package
out as the wheel does, under .mypy_layout/ (files linked, not copied, so the layout costs nothing
and stays current), runs mypy there with pyproject.toml's [tool.mypy] settings, and prints the
errors with the repository's own paths. ``make typecheck`` (and ``make test``) run it; it exits
with mypy's code.

    python tests/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / ".mypy_layout"
# wheel path prefix -> repository folder (longest prefix first when mapping back)
FOLDERS = {"raytxn/actors": "actors", "raytxn/connectors": "connectors", "raytxn": "runtime"}


def lay_out(where: Path = LAYOUT) -> Path:
    """``where``/raytxn as the wheel lays it out, every .py and py.typed a hard or symbolic link."""
    shutil.rmtree(where, ignore_errors=True)
    for prefix, folder in FOLDERS.items():
        source = ROOT / folder
        for path in source.rglob("*"):
            if "__pycache__" in path.parts or not (path.suffix == ".py" or path.name == "py.typed"):
                continue
            target = where / prefix / path.relative_to(source)
            if target.exists():  # runtime/actors would shadow actors/: there is none, but never overwrite
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(path, target)
    return where


def repo_path(line: str) -> str:
    """An error line's path in the layout -> the repository file it links to."""
    for prefix, folder in FOLDERS.items():
        if line.startswith(prefix + "/"):
            return folder + line[len(prefix):]
    return line


def main(argv: list[str]) -> int:
    where = lay_out()
    config = ROOT / "pyproject.toml"
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config),
                           "--cache-dir", str(ROOT / ".mypy_cache"), *argv], cwd=where,
                          capture_output=True, text=True)
    for line in (proc.stdout + proc.stderr).splitlines():
        print(repo_path(line))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
