"""pyproject.toml declares ranges, constraints.txt pins them, and the two agree.

Every dependency (core and extras) has a floor and a cap and no pin; constraints.txt pins every
one of them inside its range (so `make` and CI install exactly those), and holds no pin outside
what the project resolves to; py.typed ships in the wheel's package data."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements() -> list[Requirement]:
    project = PROJECT["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        found += [Requirement(r) for r in extra]
    return [r for r in found if r.name != "raytxn"]  # `all` and `test` name other extras


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_every_dependency_is_a_range_with_a_floor_and_a_cap() -> None:
    requirements = _requirements()
    assert len(requirements) > 15
    for requirement in requirements:
        operators = {spec.operator for spec in requirement.specifier}
        assert ">=" in operators and operators & {"<", "<="}, requirement
        assert not operators & {"==", "~=", "==="}, requirement


def test_constraints_pin_every_dependency_inside_its_range() -> None:
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not pinned in constraints.txt: make constraints"
        assert requirement.specifier.contains(pins[name], prereleases=True), (requirement, pins[name])


def test_extras_and_the_typed_marker() -> None:
    extras = PROJECT["project"]["optional-dependencies"]
    assert {"spark", "kafka", "bench", "all", "test"} <= set(extras)
    spark = {Requirement(r).name for r in extras["spark"]}
    kafka = {Requirement(r).name for r in extras["kafka"]}
    assert spark == {"pyspark", "raydp"} and kafka == {"kafka-python", "cramjam"}
    core = {Requirement(r).name for r in PROJECT["project"]["dependencies"]}
    assert not core & (spark | kafka | {"matplotlib", "confluent-kafka"})
    assert PROJECT["tool"]["setuptools"]["package-data"]["raytxn"] == ["py.typed"]
    assert (ROOT / "runtime" / "py.typed").exists()
