"""``SendFuture``: a ``concurrent.futures.Future`` for every standard use, though it is a view of
its batch's outcome (``raytxn.client.producer``): a batch settles all of its futures in one step,
a future makes its waiter and callback lists only when asked, and only those futures are visited
when the batch settles."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from raytxn.client.message import MessageId
from raytxn.client.producer import SendFuture, _Outcome, _settle

LANDED = (5, 7)  # (ledger, entry) the batches of these tests land at


def _batch(count: int) -> tuple[list[SendFuture], _Outcome]:
    outcome = _Outcome("t", 3)
    return [SendFuture(outcome, index) for index in range(count)], outcome


def _id(index: int) -> MessageId:
    return MessageId("t", 3, *LANDED, index)


def _settle_later(outcome: _Outcome, error: BaseException | None = None, after_s: float = 0.05) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(after_s), _settle(outcome, LANDED, error)))
    thread.start()
    return thread


def test_a_future_nobody_waits_on_makes_no_lists_and_is_not_visited() -> None:
    futures, outcome = _batch(3)
    assert not any(f.done() for f in futures)
    _settle(outcome, LANDED, None)
    assert [f.result() for f in futures] == [_id(0), _id(1), _id(2)]
    assert all(f.exception() is None for f in futures)
    assert all(set(f.__dict__) == {"_outcome", "_index"} for f in futures)
    assert outcome.watched == []
    _settle(outcome, (9, 9), ValueError("late"))  # settled once: a second outcome changes nothing
    assert futures[1].result() == _id(1)


def test_wait_as_completed_and_callbacks_see_the_batch_settle() -> None:
    futures, outcome = _batch(4)
    called: list[MessageId] = []
    futures[2].add_done_callback(lambda f: called.append(f.result()))
    thread = _settle_later(outcome)
    done, not_done = concurrent.futures.wait(futures[:2], timeout=5)
    assert len(done) == 2 and not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=5)) == [_id(i) for i in range(4)]
    thread.join()
    assert called == [_id(2)]
    assert all(not f.__dict__.get("_waiter_list") for f in futures)  # wait() removed its waiters
    late: list[MessageId] = []
    futures[0].add_done_callback(lambda f: late.append(f.result()))  # after the fact: runs at once
    assert late == [_id(0)]


def test_an_error_reaches_every_kind_of_waiter() -> None:
    futures, outcome = _batch(2)
    thread = _settle_later(outcome, ValueError("lost"))
    done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION, timeout=5)
    thread.join()
    assert done
    for future in futures:
        with pytest.raises(ValueError, match="lost"):
            future.result(timeout=0)
        assert isinstance(future.exception(), ValueError)


def test_a_pending_future_times_out_and_the_result_then_comes() -> None:
    futures, outcome = _batch(1)
    with pytest.raises(TimeoutError):
        futures[0].result(timeout=0.01)
    _settle(outcome, LANDED, None)
    assert futures[0].result(timeout=0) == _id(0)


def test_asyncio_wraps_it_and_it_cannot_be_cancelled() -> None:
    futures, outcome = _batch(1)
    assert futures[0].cancel() is False

    async def wrapped() -> MessageId:
        thread = _settle_later(outcome)
        result = await asyncio.wrap_future(futures[0])
        thread.join()
        return result

    assert asyncio.run(wrapped()) == _id(0)


def test_only_the_producer_settles_it() -> None:
    futures, outcome = _batch(1)
    with pytest.raises(AttributeError):
        futures[0].set_result(_id(0))  # an executor's setter: the state is the batch's
    assert not futures[0].done()
    _settle(outcome, LANDED, None)
    assert futures[0].result(timeout=0) == _id(0)
