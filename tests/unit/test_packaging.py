"""The one import package: `raytxn` built from three folders, lazy at the top, layered inside.

These tests look at the package as a user gets it: the wheel's top level, an editable install
that picks up new modules, `import raytxn.errors` without Ray, and the import contracts of
pyproject.toml (checked with import-linter over the package laid out as the wheel lays it out).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"raytxn": ROOT / "runtime", "raytxn.actors": ROOT / "actors", "raytxn.connectors": ROOT / "connectors"}


def _run(code: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=kw.pop("cwd", ROOT.parent), timeout=120, **kw)  # type: ignore[call-overload]


def _packages_on_disk() -> set[str]:
    found = set()
    for name, folder in FOLDERS.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            if "__pycache__" not in rel:
                found.add(".".join((name, *rel)))
    return found


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(config["packages"]) == _packages_on_disk()
    assert config["package-dir"] == {"raytxn": "runtime", "raytxn.actors": "actors",
                                     "raytxn.connectors": "connectors"}


def test_errors_and_every_protocol_module_import_without_ray() -> None:
    protocol = sorted(p.stem for p in (ROOT / "runtime" / "protocol").glob("*.py") if p.stem != "__init__")
    assert "coordinator_state" in protocol and "txn_buffer" in protocol
    proc = _run(f"""
        import sys
        sys.modules["ray"] = None  # any `import ray` now raises ImportError
        import raytxn, raytxn.errors, raytxn.ids, raytxn.hashing
        for name in {protocol!r}:
            __import__("raytxn.protocol." + name)
        assert "ray" not in [m for m in sys.modules if sys.modules[m] is not None and m.split(".")[0] == "ray"]
        try:
            raytxn.connect
        except ImportError:
            print("CLIENT-NEEDS-RAY")
        print("OK")
    """)
    assert proc.returncode == 0, proc.stderr
    # the client does need Ray, and only loads when asked for: the lazy attribute proves both
    assert proc.stdout.split() == ["CLIENT-NEEDS-RAY", "OK"]


def test_public_names_resolve_lazily_from_the_top() -> None:
    proc = _run("""
        import sys, raytxn
        assert "raytxn.client.client" not in sys.modules
        assert raytxn.Client.__module__ == "raytxn.client.client"
        assert raytxn.errors.TopicNotFound.__module__ == "raytxn.errors"
        assert {"Client", "connect", "Transaction", "ConsumerType"} <= set(dir(raytxn))
        try:
            raytxn.no_such_name
        except AttributeError as e:
            print(e)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "no attribute 'no_such_name'" in proc.stdout


@pytest.mark.parametrize("first", ["raytxn.connectors.spark", "raytxn.connectors.spark_pipeline"])
def test_spark_connector_is_one_import_whichever_module_loads_first(first: str) -> None:
    """``raytxn.connectors.spark`` serves a Spark job alone; spark_pipeline imports spark, so the
    pipeline's names load on first use, and must do so whichever module a program imports first."""
    proc = _run(f"""
        import {first}
        from raytxn.connectors.spark import (BATCH_SCHEMA, BatchHandle, BatchStats, ExactlyOncePipeline,
                                             init_spark, read_batch, stop_spark, write)
        from raytxn.connectors import spark, spark_pipeline
        assert ExactlyOncePipeline is spark_pipeline.ExactlyOncePipeline and read_batch is spark_pipeline.read_batch
        assert BatchStats is spark_pipeline.BatchStats and BatchHandle is spark_pipeline.BatchHandle
        assert BATCH_SCHEMA is spark_pipeline.BATCH_SCHEMA and write is spark_pipeline.write
        namespace = {{}}
        exec("from raytxn.connectors.spark import *", namespace)
        assert set(spark.__all__) <= set(namespace) and set(spark.__all__) <= set(dir(spark))
        try:
            spark.no_such_name
        except AttributeError as e:
            print(e)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has no attribute 'no_such_name'" in proc.stdout


def test_editable_install_finds_a_new_module_and_the_three_folders() -> None:
    name = f"_probe_{uuid.uuid4().hex[:8]}"
    probe = ROOT / "actors" / f"{name}.py"
    probe.write_text("VALUE = 42\n")
    try:
        proc = _run(f"""
            import raytxn, raytxn.actors, raytxn.connectors
            from raytxn.actors.{name} import VALUE
            print(VALUE, raytxn.__path__[0], raytxn.actors.__path__[0], raytxn.connectors.__path__[0])
        """)
    finally:
        probe.unlink()
    if proc.returncode != 0 and "site-packages" in proc.stderr:
        pytest.skip(f"raytxn is installed from a wheel here, not editable: {proc.stderr[-200:]}")
    assert proc.returncode == 0, proc.stderr
    value, top, actors, connectors = proc.stdout.split()
    assert value == "42"
    assert (top, actors, connectors) == (str(ROOT / "runtime"), str(ROOT / "actors"), str(ROOT / "connectors"))


PYTHON_WARNING = re.compile(r"\b\w*Warning: ")  # how Python prints a warning: "<Category>Warning: <message>"


def _editable_metadata_build(root: Path) -> subprocess.CompletedProcess[str]:
    """What `make env` runs (``pip install -e``), up to the project's metadata: pip's isolated
    build environment with the setuptools that pyproject.toml asks for, its output shown (-v)."""
    return subprocess.run([sys.executable, "-m", "pip", "install", "-v", "--dry-run", "--no-deps", "--ignore-installed",
                           "-e", str(root)], capture_output=True, text=True, timeout=300)


def test_building_the_metadata_warns_of_nothing() -> None:
    """A fresh `make demo` shows no warning of the build backend (e.g. setuptools deprecating a
    license table, or license classifiers beside an SPDX license)."""
    proc = _editable_metadata_build(ROOT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Preparing editable metadata" in output and "Would install raytxn-" in output, output[-3000:]
    assert not PYTHON_WARNING.findall(output), output[-5000:]


@pytest.mark.slow(seconds=3)
def test_the_wheel_holds_raytxn_only(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-qq", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("raytxn-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"raytxn", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in ("raytxn/actors/partition.py", "raytxn/connectors/spark.py", "raytxn/protocol/txn_buffer.py",
                   "raytxn/client/producer.py", "raytxn/ledger/managed.py", "raytxn/tools/cli.py",
                   "raytxn/py.typed"):  # PEP 561: type checkers read raytxn's hints
        assert module in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "raytxn = raytxn.tools.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()


# --- the import contracts ---------------------------------------------------------------------

def _laid_out(tmp_path: Path) -> Path:
    """The package as the wheel lays it out (grimp reads one folder per package)."""
    top = tmp_path / "raytxn"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(FOLDERS["raytxn"], top, ignore=ignore)
    shutil.copytree(FOLDERS["raytxn.actors"], top / "actors", ignore=ignore)
    shutil.copytree(FOLDERS["raytxn.connectors"], top / "connectors", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint_imports(where: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin"})


def test_import_contracts_hold(tmp_path: Path) -> None:
    proc = _lint_imports(_laid_out(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "9 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("protocol/cursor.py", "import time", "protocol is pure"),
    ("protocol/retention.py", "from raytxn.ledger import storage", "protocol is pure"),
    ("ledger/managed.py", "from raytxn.client import rpc", "ledger does not import"),
    ("client/consumer.py", "from raytxn.actors import partition", "the client imports actors only"),
    ("cluster.py", "from raytxn.connectors import spark", "the engine does not import connectors"),
    ("kafka/groups.py", "import time", "the Kafka groups and peer view are pure"),
    ("kafka/peers.py", "import ray", "the Kafka groups and peer view are pure"),
])
def test_a_violating_import_breaks_its_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    where = _laid_out(tmp_path)
    target = where / "raytxn" / module
    target.write_text(target.read_text() + f"\n{line}  # injected by the test\n")
    proc = _lint_imports(where)
    assert proc.returncode != 0
    broken = [ln for ln in proc.stdout.splitlines() if " BROKEN" in ln]
    assert len(broken) == 1 and broken[0].startswith(contract), proc.stdout[-3000:]


def test_every_module_imports() -> None:
    """A moved module that still names an old path fails here, not in the first test that uses it."""
    names = []
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" not in rel:
                names.append(".".join((package, *rel)).removesuffix(".__init__"))
    assert len(names) > 60
    proc = _run(f"""
        import importlib
        for name in {sorted(names)!r}:
            importlib.import_module(name)
        print("OK")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
