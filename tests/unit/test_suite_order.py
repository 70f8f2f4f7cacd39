"""The suite's module order (tests/conftest.py): xdist hands modules out in collection order
(`make test` turns its own reorder off), so the heaviest declared modules must come first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import pytest_collection_modifyitems


def item(nodeid: str, seconds: float | None = None) -> SimpleNamespace:
    marker = None if seconds is None else pytest.mark.slow(seconds=seconds).mark
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: marker if name == "slow" else None)


def test_heavy_modules_go_first_longest_first_then_the_rest_by_test_count() -> None:
    items = [item("a.py::one"), item("a.py::two"), item("a.py::three"),
             item("b.py::x", 30), item("b.py::y"),
             item("c.py::long", 100),
             item("d.py::p", 60), item("d.py::q", 60),
             item("e.py::only")]
    pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["d.py::p", "d.py::q", "c.py::long",  # 120 s, 100 s
                                         "a.py::one", "a.py::two", "a.py::three",  # then 3, 2, 1 tests
                                         "b.py::x", "b.py::y", "e.py::only"]


def test_make_test_keeps_the_collection_order() -> None:
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in makefile
