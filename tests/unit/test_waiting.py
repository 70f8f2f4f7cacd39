"""Signal and Flag (raytxn.waiting): woken by notify/set, or False at the timeout, and a cancelled
or timed-out waiter leaves nothing behind; ``yield_to_woken_tasks`` lets the tasks a future woke
run first. On the simulator's loop, so timeouts take no real time."""

from __future__ import annotations

import asyncio

import pytest

from raytxn.sim.loop import SimLoop
from raytxn.waiting import Flag, Signal, yield_to_woken_tasks


def run(coro: object) -> object:
    loop = SimLoop()
    try:
        return loop.run_until_complete(coro)  # type: ignore[arg-type]
    finally:
        loop.close()


def test_signal_wakes_every_waiter_now_and_times_out_the_others() -> None:
    async def scenario() -> tuple[list[bool], bool, float, int]:
        signal = Signal()
        loop = asyncio.get_running_loop()
        waiting = [asyncio.ensure_future(signal.wait(5.0)) for _ in range(3)]
        await asyncio.sleep(1.0)
        signal.notify_all()
        woken = list(await asyncio.gather(*waiting))
        began = loop.time()
        late = await signal.wait(2.0)  # notified before it waited: it times out
        return woken, late, loop.time() - began, len(signal._waiters)

    woken, late, waited, left = run(scenario())
    assert woken == [True, True, True]
    assert late is False and waited == pytest.approx(2.0)
    assert left == 0


def test_a_cancelled_signal_wait_leaves_no_waiter() -> None:
    async def scenario() -> int:
        signal = Signal()
        waiting = asyncio.ensure_future(signal.wait(5.0))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return len(signal._waiters)

    assert run(scenario()) == 0


def test_flag_is_an_event_with_a_timeout() -> None:
    async def scenario() -> tuple[bool, bool, bool, bool, int]:
        flag = Flag()
        timed_out = await flag.wait(0.5)
        waiting = asyncio.ensure_future(flag.wait(5.0))
        await asyncio.sleep(0.1)
        flag.set()
        woken = await waiting
        already = await flag.wait(0.0)  # set: at once, also with no time to wait
        flag.clear()
        cleared = await flag.wait(0.2)
        return timed_out, woken, already, cleared, len(flag._waiters)

    timed_out, woken, already, cleared, left = run(scenario())
    assert (timed_out, woken, already, cleared) == (False, True, True, False)
    assert left == 0


def test_flag_future_races_another_and_given_up_ones_are_dropped() -> None:
    async def scenario() -> tuple[bool, int, bool]:
        flag = Flag()
        for _ in range(100):  # a reader that gives its wake-up future up each time
            flag.future().cancel()
        waiter = flag.future()
        listed = len(flag._waiters)
        other = asyncio.ensure_future(asyncio.sleep(1.0))
        done, _ = await asyncio.wait({waiter, other}, return_when=asyncio.FIRST_COMPLETED)
        flag.set()
        return waiter in done, listed, await waiter

    first, listed, result = run(scenario())
    assert first is False  # the sleep ended first; the flag was set after
    assert listed == 1     # the hundred cancelled ones were dropped when the next was made
    assert result is True


@pytest.mark.parametrize(("iterations", "direct_first", "shielded_first"), [(1, True, False), (2, True, True)])
def test_yield_to_woken_tasks_lets_a_waiter_go_first(iterations: int, direct_first: bool,
                                                     shielded_first: bool) -> None:
    """After a future is set, a task awaiting it resumes one loop iteration later, and one awaiting
    it through ``asyncio.shield`` two: the setter goes on after them only if it yields that often."""

    async def scenario() -> list[str]:
        order: list[str] = []
        decided = asyncio.get_running_loop().create_future()

        async def direct() -> None:
            await decided
            order.append("direct")

        async def shielded() -> None:
            await asyncio.shield(decided)
            order.append("shielded")

        waiters = [asyncio.ensure_future(direct()), asyncio.ensure_future(shielded())]
        await asyncio.sleep(0)  # both are waiting
        decided.set_result(None)
        await yield_to_woken_tasks(iterations)
        order.append("setter")
        await asyncio.gather(*waiters)
        return order

    order = run(scenario())
    assert (order.index("direct") < order.index("setter")) is direct_first
    assert (order.index("shielded") < order.index("setter")) is shielded_first
