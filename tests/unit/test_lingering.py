"""The coordinator's lingering last records (actors/lingering.py), on a real asyncio loop: they go
with the next entry taken, on their own once the linger passes or someone needs them, in the order
they were added, and their futures say when (or why not) they were logged."""

from __future__ import annotations

import asyncio

import pytest

from raytxn.actors import lingering
from raytxn.actors.lingering import LingeringRecords
from raytxn.ids import TxnID
from raytxn.protocol.txnlog import TxnState, UpdateState

LINGER_S = 0.05


def completed(sequence: int) -> UpdateState:
    return UpdateState(TxnID(0, sequence), TxnState.COMMITTED, 1_000 + sequence)


class Log:
    """Stands for the coordinator's log: ``write_alone`` takes what lingers as one entry."""

    def __init__(self) -> None:
        self.entries: list[list[UpdateState]] = []
        self.records: LingeringRecords | None = None
        self.fail_with: BaseException | None = None

    async def write_alone(self) -> None:
        assert self.records is not None
        taken = self.records.take()
        await asyncio.sleep(0)  # a put
        if self.fail_with is not None:
            lingering.settle(taken, self.fail_with)
            return
        self.entries.append([record for record, _ in taken])
        lingering.logged(taken)


def lingering_log(linger_s: float = LINGER_S) -> Log:
    log = Log()
    log.records = LingeringRecords(linger_s, log.write_alone)
    return log


def test_records_taken_by_the_next_entry_are_not_written_alone() -> None:
    async def run() -> None:
        log = lingering_log()
        assert log.records is not None
        first, second = log.records.add(completed(1)), log.records.add(completed(2))
        await asyncio.sleep(LINGER_S / 5)
        assert not log.entries and not first.done() and len(log.records) == 2
        taken = log.records.take()  # the next entry, prepared after both
        assert [record for record, _ in taken] == [completed(1), completed(2)]
        assert len(log.records) == 0
        lingering.logged(taken)
        assert first.done() and second.done()
        await asyncio.sleep(LINGER_S * 3)
        assert not log.entries  # the linger's timer went with them

    asyncio.run(run())


def test_records_go_alone_once_the_linger_passes_in_the_order_added() -> None:
    async def run() -> None:
        log = lingering_log()
        assert log.records is not None
        futures = [log.records.add(completed(n)) for n in range(3)]
        await asyncio.sleep(LINGER_S * 4)
        assert log.entries == [[completed(0), completed(1), completed(2)]]
        assert all(future.done() and future.exception() is None for future in futures)
        later = log.records.add(completed(3))  # a fresh linger
        await asyncio.sleep(LINGER_S * 4)
        assert log.entries[1:] == [[completed(3)]] and later.done()

    asyncio.run(run())


def test_a_waiting_reader_flushes_what_lingers_and_what_is_added_meanwhile() -> None:
    async def run() -> None:
        log = lingering_log(linger_s=60.0)  # the linger alone would never flush in this test
        assert log.records is not None
        before = log.records.add(completed(1))
        with log.records.needed():
            await asyncio.wait_for(before, 1.0)
            during = log.records.add(completed(2))
            await asyncio.wait_for(during, 1.0)
        after = log.records.add(completed(3))
        await asyncio.sleep(0.02)
        assert log.entries == [[completed(1)], [completed(2)]] and not after.done()

    asyncio.run(run())


def test_records_put_back_go_ahead_of_newer_ones() -> None:
    async def run() -> None:
        log = lingering_log(linger_s=60.0)
        assert log.records is not None
        log.records.add(completed(1))
        taken = log.records.take()  # an entry that is then refused before it is queued
        newer = log.records.add(completed(2))
        log.records.put_back(taken)
        await asyncio.wait_for(newer, 1.0)
        assert log.entries == [[completed(1), completed(2)]]

    asyncio.run(run())


def test_a_failed_write_or_a_stop_fails_the_records_with_its_error() -> None:
    async def run() -> None:
        log = lingering_log()
        assert log.records is not None
        log.fail_with = OSError("put failed")
        failed = log.records.add(completed(1))
        with pytest.raises(OSError, match="put failed"):
            await asyncio.wait_for(failed, 1.0)
        stopped = log.records.add(completed(2))
        log.records.fail(RuntimeError("stopped"))
        with pytest.raises(RuntimeError, match="stopped"):
            await stopped
        taken = [(completed(3), asyncio.get_running_loop().create_future())]
        lingering.logged(taken)
        lingering.settle(taken, OSError("late"))  # applied already: the late error changes nothing
        assert taken[0][1].exception() is None
        assert not log.entries

    asyncio.run(run())


def test_the_records_lingering_at_once_are_bounded() -> None:
    async def run() -> None:
        log = lingering_log(linger_s=60.0)
        assert log.records is not None
        futures = [log.records.add(completed(n)) for n in range(lingering.MAX_LINGERING)]
        await asyncio.wait_for(asyncio.gather(*futures), 5.0)
        assert [len(entry) for entry in log.entries] == [lingering.MAX_LINGERING]

    asyncio.run(run())


def test_no_linger_is_refused() -> None:
    with pytest.raises(AssertionError):
        LingeringRecords(0.0, lingering_log().write_alone)
