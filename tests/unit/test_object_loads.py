"""A ledger read's object loads: in order, several at once, errors where they belong."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.ledger.loads import ObjectLoads


class Loads:
    """Loads that take a while, recording how many run at once and which started."""

    def __init__(self, failing: set[int] = frozenset()) -> None:
        self.running = 0
        self.most_running = 0
        self.started: list[int] = []
        self.failing = failing

    async def load(self, first: int) -> str:
        self.started.append(first)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(0.001 * (first % 3))  # later ones may finish first
            if first in self.failing:
                raise ValueError(f"object {first}")
            return f"object {first}"
        finally:
            self.running -= 1


@settings(max_examples=60, deadline=None)
@given(count=st.integers(1, 12), needed=st.integers(1, 12), in_flight=st.integers(1, 5), asked=st.integers(0, 12))
def test_loads_come_in_order_with_at_most_in_flight_running_and_none_started_past_the_needed(
        count: int, needed: int, in_flight: int, asked: int) -> None:
    needed, asked = min(needed, count), min(asked, count)
    firsts = [10 * i for i in range(count)]
    loads = Loads()

    async def run() -> list[str]:
        async with ObjectLoads(loads.load, firsts, needed, in_flight) as objects:
            return [await objects.next() for _ in range(asked)]

    assert asyncio.run(run()) == [f"object {first}" for first in firsts[:asked]]
    assert loads.most_running <= in_flight
    # The needed ones may all have started; one past them only once asked for.
    assert loads.started == firsts[:len(loads.started)]
    assert len(loads.started) <= max(needed, asked)
    if asked >= 2 and needed >= 2 and in_flight >= 2:
        assert loads.most_running >= 2  # they did overlap


def test_an_error_surfaces_at_its_object_and_a_later_failure_is_not_reported() -> None:
    loads = Loads(failing={20, 30})
    got: list[str] = []

    async def run() -> None:
        async with ObjectLoads(loads.load, [0, 10, 20, 30, 40], 5, 4) as objects:
            for _ in range(5):
                got.append(await objects.next())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="object 20"):
            asyncio.run(run())
        gc.collect()
    assert got == ["object 0", "object 10"]
    assert not [w for w in caught if "never retrieved" in str(w.message)]


def test_asking_past_the_objects_is_an_error() -> None:
    async def run() -> None:
        async with ObjectLoads(Loads().load, [0], 1, 1) as objects:
            await objects.next()
            await objects.next()

    with pytest.raises(IndexError):
        asyncio.run(run())
