"""raytxn installed as a user installs it, in fresh virtual environments (pip, with the pip cache).

- The core install (``pip install .``, no extra) runs the quickstart (the native client and
  engine: connect, produce, consume, transactions, a coordinator crash) without pyspark, RayDP,
  kafka-python or cramjam, and the parts that need an extra say which (``MissingExtra``), in
  Python and in the CLI, without a traceback.
  Then ``pip install '.[spark]'`` adds pyspark and RayDP to it, and the Spark connector's entry
  points load.
- An environment holding the oldest pyspark the spark extra allows keeps it through ``pip install
  '.[spark]'`` and ``'.[test]'``, and Spark tests (transactional writes, the exactly-once word
  count, a coordinator crash mid-commit) pass on it.
- An environment that already holds the oldest Ray pyproject.toml allows keeps it through
  ``pip install .`` and ``pip install '.[test]'``, and the unit tests (tests/unit, but the
  simulator's seed ranges, which the suite runs) and the quickstart test pass on it: that is the
  run the floor of the Ray range stands for.

Both install from constraints.txt, as `make` does, except Ray in the second (the one version the
test is about). Minutes of pip each, so they are not in `make test`'s suite: `make test-install`
runs them, and CI (.ci/run) runs it after the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"


def _ray_requirement() -> tuple[str, str]:
    """The Ray requirement of pyproject.toml and its floor, e.g. ('ray[default,data]', '2.55.0')."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray,) = [d for d in deps if re.match(r"ray\[", d)]
    name, floor = re.match(r"(ray\[[^]]+\])>=([\w.]+)", ray).groups()
    return name, floor


def _spark_floor() -> str:
    """The floor of pyproject.toml's pyspark range (the spark extra), e.g. '3.5.0'."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pyspark,) = [d for d in extras["spark"] if d.startswith("pyspark")]
    return re.match(r"pyspark>=([\w.]+)", pyspark).group(1)


def _constraints_but(tmp_path: Path, name: str) -> Path:
    """constraints.txt without ``name``'s pin: the environment's version of it is under test."""
    others = tmp_path / f"constraints-but-{name}.txt"
    others.write_text("".join(line for line in CONSTRAINTS.read_text().splitlines(keepends=True)
                              if not line.startswith(f"{name}==")))
    return others


def _clean_env() -> dict[str, str]:
    """This machine's environment without this suite's Ray and paths: a user's shell."""
    drop = {"RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}


def _run(argv: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_clean_env())
    return proc


# What a copy of the source leaves out: this checkout's own environment, caches and build output.
# setuptools builds in the source tree (build/, *.egg-info), so two installs from one tree at once
# (pytest -n 2) collide there ("File exists: build/bdist.../raytxn-0.1.0.dist-info", seen in CI):
# each test installs from its own copy.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".raytxn-data",
                                     ".pytest_cache", ".ruff_cache", ".mypy_cache", ".mypy_layout",
                                     ".hypothesis", "bench-results", "site")


def _source(tmp_path: Path) -> Path:
    """A private copy of the project to ``pip install`` from, as a user installs an unpacked sdist."""
    where = tmp_path / "src"
    shutil.copytree(ROOT, where, ignore=_NOT_SOURCE)
    return where


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin"


def _pip(bin_dir: Path, *args: str, constraints: Path = CONSTRAINTS) -> None:
    proc = _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "-c", str(constraints), *args], cwd=bin_dir.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _version(bin_dir: Path, module: str) -> str:
    proc = _run([str(bin_dir / "python"), "-c", f"import {module}; print({module}.__version__)"], cwd=bin_dir.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


EDITABLE_TEST = "test_editable_install_finds_a_new_module_and_the_three_folders"
SPARK_EXTRA = """
import importlib.metadata as md
import raytxn.connectors.spark as sc
from raytxn.connectors.spark_pipeline import ExactlyOncePipeline
print(md.version("pyspark"), md.version("raydp"), callable(sc.read_batch), callable(sc.init_spark),
      ExactlyOncePipeline.__name__)
"""

MISSING_EXTRAS = """
import importlib.util, sys
absent = [m for m in ("pyspark", "raydp", "kafka", "cramjam") if importlib.util.find_spec(m) is not None]
assert not absent, f"the core install pulled {absent}"
from raytxn.errors import MissingExtra, RaytxnError
import raytxn.connectors.spark as sc  # write() and ray_data's helpers need no Spark to import
import raytxn.connectors.ray_data
for load in (lambda: __import__("raytxn.kafka.gateway"), lambda: sc.read_batch, lambda: sc.init_spark()):
    try:
        load()
    except MissingExtra as e:
        assert isinstance(e, RaytxnError) and isinstance(e, ImportError)
        print(f"{e.extra}: {e}")
    else:
        sys.exit("no MissingExtra")
"""


@pytest.mark.timeout(900)
@pytest.mark.slow(seconds=220)
def test_the_core_install_runs_the_quickstart_and_names_the_missing_extras(tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "venv")
    src = _source(tmp_path)
    _pip(bin_dir, str(src))

    proc = _run([str(bin_dir / "python"), "-c", MISSING_EXTRAS], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["kafka", "spark", "spark"], proc.stdout
    assert "'kafka'" in lines[0] and "pip install 'raytxn[kafka]'" in lines[0]
    assert "'pyspark'" in lines[1] and "'raydp'" in lines[2] and "pip install 'raytxn[spark]'" in lines[2]

    # the CLI's commands that need an extra: its error, exit code 2, no traceback, nothing started
    for argv, extra in ((["kafka", "--port", "0"], "kafka"), (["bench", "kafka", "--short"], "bench"),
                        (["console", "--port", "0"], "console")):
        cli = _run([str(bin_dir / "raytxn"), *argv], cwd=tmp_path, timeout=120)
        output = cli.stdout + cli.stderr
        assert cli.returncode == 2, output
        assert f"pip install 'raytxn[{extra}]'" in " ".join(output.split()), output
        assert "Traceback" not in output, output

    # the quickstart on the core install: its own local Ray, the default file storage in tmp_path
    demo = _run([str(bin_dir / "python"), str(ROOT / "examples" / "quickstart.py")], cwd=tmp_path, timeout=300)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "exactly once per order: True" in demo.stdout, demo.stdout

    # the spark extra adds Spark on Ray to the same environment, at the pinned versions
    _pip(bin_dir, f"{src}[spark]")
    spark = _run([str(bin_dir / "python"), "-c", SPARK_EXTRA], cwd=tmp_path)
    assert spark.returncode == 0, spark.stdout + spark.stderr[-3000:]
    pins = dict(line.strip().split("==") for line in CONSTRAINTS.read_text().splitlines() if "==" in line)
    assert spark.stdout.split() == [pins["pyspark"], pins["raydp"], "True", "True", "ExactlyOncePipeline"], spark.stdout


@pytest.mark.timeout(1500)
@pytest.mark.slow(seconds=400)
def test_an_environment_with_the_oldest_ray_keeps_it_and_passes_the_unit_tests_and_quickstart(tmp_path: Path) -> None:
    ray_requirement, floor = _ray_requirement()
    assert f"\nray=={floor}\n" not in CONSTRAINTS.read_text(), "the floor is the pinned Ray: pick an older one"
    others = _constraints_but(tmp_path, "ray")  # the environment's Ray is the one under test
    bin_dir = _venv(tmp_path / "venv")
    _pip(bin_dir, f"{ray_requirement}=={floor}", constraints=others)
    assert _version(bin_dir, "ray") == floor

    src = _source(tmp_path)
    _pip(bin_dir, str(src), constraints=others)
    assert _version(bin_dir, "ray") == floor, "pip install . replaced the environment's Ray"
    _pip(bin_dir, f"{src}[test]", constraints=others)
    assert _version(bin_dir, "ray") == floor, "pip install '.[test]' replaced the environment's Ray"

    # the unit tests and the quickstart test, on that Ray, importing the installed raytxn. The
    # simulator's seed ranges (minutes, pure Python that no Ray version reaches) stay the suite's;
    # the editable install's own test needs the editable install `make` makes (this one is not).
    tests = _run([str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5",
                  "-n", "2", "tests/unit", "tests/integration/test_quickstart.py",
                  "--deselect", "tests/unit/test_sim.py::test_seed_range_is_clean",
                  "--deselect", "tests/unit/test_sim.py::test_capped_seed_range_is_clean",
                  "--deselect", f"tests/unit/test_packaging.py::{EDITABLE_TEST}"],
                 cwd=ROOT, timeout=1200)
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else ""
    print(f"on ray {floor}: {summary}")
    assert tests.returncode == 0, tests.stdout[-5000:] + tests.stderr[-3000:]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary, summary


# Named one by one (not by -k) so a new test whose name happens to match does not change the count.
SPARK_FLOOR_TESTS = (
    "tests/spark/test_spark_write.py::test_write_in_txn_visible_at_commit_only",
    "tests/spark/test_spark_write.py::test_task_failing_midway_is_retried_without_duplicates",
    "tests/spark/test_pipeline.py::test_read_batch_columns_and_ack_handle",
    "tests/spark/test_pipeline.py::test_wordcount_exactly_once",
    "tests/spark/test_pipeline.py::test_partition_crash_during_write_and_coordinator_crash_during_commit",
)


@pytest.mark.timeout(1500)
@pytest.mark.slow(seconds=330)
def test_an_environment_with_the_oldest_pyspark_keeps_it_and_runs_spark_on_ray(tmp_path: Path) -> None:
    """The floor of the pyspark range: a user's Spark that old stays through ``pip install
    '.[spark]'`` and ``'.[test]'``, and RayDP runs raytxn's Spark writes and pipeline on it."""
    floor = _spark_floor()
    assert f"\npyspark=={floor}\n" not in CONSTRAINTS.read_text(), "the floor is the pinned pyspark: pick an older one"
    others = _constraints_but(tmp_path, "pyspark")
    bin_dir = _venv(tmp_path / "venv")
    _pip(bin_dir, f"pyspark=={floor}", constraints=others)
    src = _source(tmp_path)
    _pip(bin_dir, f"{src}[spark]", constraints=others)
    assert _version(bin_dir, "pyspark") == floor, "pip install '.[spark]' replaced the environment's pyspark"
    _pip(bin_dir, f"{src}[test]", constraints=others)
    assert _version(bin_dir, "pyspark") == floor, "pip install '.[test]' replaced the environment's pyspark"

    tests = _run([str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5",
                  *SPARK_FLOOR_TESTS], cwd=ROOT, timeout=1200)
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else ""
    print(f"on pyspark {floor}: {summary}")
    assert tests.returncode == 0, tests.stdout[-5000:] + tests.stderr[-3000:]
    assert re.search(rf"\b{len(SPARK_FLOOR_TESTS)} passed", summary) and "failed" not in summary, summary
