"""``SendFuture``: a ``concurrent.futures.Future`` for every standard use, though it makes its
waiter and callback lists only when asked (``raytxn.client.producer``), and a batch settles all of
its futures at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from raytxn.client.producer import SendFuture, _settle


def _batch(count: int) -> tuple[list[SendFuture], threading.Condition]:
    condition = threading.Condition()
    return [SendFuture(condition) for _ in range(count)], condition


def _settle_later(futures: list[SendFuture], condition: threading.Condition, results: list | None,
                  error: BaseException | None = None, after_s: float = 0.05) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after_s), _settle(futures, condition, results, error)))
    thread.start()
    return thread


def test_a_future_nobody_waits_on_makes_no_lists() -> None:
    futures, condition = _batch(3)
    _settle(futures, condition, ["a", "b", "c"], None)
    assert [f.result() for f in futures] == ["a", "b", "c"]
    assert all(set(f.__dict__) == {"_condition", "_state", "_result", "_exception"} for f in futures)


def test_wait_as_completed_and_callbacks_see_the_batch_settle() -> None:
    futures, condition = _batch(4)
    called: list[str] = []
    futures[2].add_done_callback(lambda f: called.append(f.result()))
    thread = _settle_later(futures, condition, ["a", "b", "c", "d"])
    done, not_done = concurrent.futures.wait(futures[:2], timeout=5)
    assert len(done) == 2 and not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=5)) == ["a", "b", "c", "d"]
    thread.join()
    assert called == ["c"]
    assert all(not f.__dict__.get("_waiter_list") for f in futures)  # wait() removed its waiters
    late: list[str] = []
    futures[0].add_done_callback(lambda f: late.append(f.result()))  # after the fact: runs at once
    assert late == ["a"]


def test_an_error_reaches_every_kind_of_waiter() -> None:
    futures, condition = _batch(2)
    thread = _settle_later(futures, condition, None, ValueError("lost"))
    done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION, timeout=5)
    thread.join()
    assert done
    for future in futures:
        with pytest.raises(ValueError, match="lost"):
            future.result(timeout=0)


def test_asyncio_wraps_it_and_it_cannot_be_cancelled() -> None:
    futures, condition = _batch(1)
    assert futures[0].cancel() is False

    async def wrapped() -> str:
        thread = _settle_later(futures, condition, ["z"])
        result = await asyncio.wrap_future(futures[0])
        thread.join()
        return result

    assert asyncio.run(wrapped()) == "z"
