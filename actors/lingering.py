"""Records that wait to ride with the coordinator's next log entry, at most a linger.

A txn's last record (COMMITTED or ABORTED) is written after every participant has its end and its
caller has been answered. Nothing waits for it but the bookkeeping: the outcome is durable from
COMMITTING/ABORTING on, and a coordinator that recovers without the last record drives the end to
the participants again, which they take as a repeat. So it need not cost a put of its own: it
lingers here and goes into the entry of the next record logged (the next txn's COMMITTING, in a
client committing one txn after another), or on its own once ``linger_s`` has passed. That saves
the coordinator one put per txn under a steady load, and a coordinator's put is most of its CPU
per commit (a worker thread's write and two fsyncs).

Whoever needs the records logged now (a read that must see its own end) calls ``flush_now``.
Each record's future is done once its entry is durable and applied, or fails with the error its
entry's write failed with.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

from raytxn.protocol.txnlog import Record

MAX_LINGERING = 1000  # records lingering at once (about 90 KB); more are flushed at once rather than queued


class LingeringRecords:
    """The lingering records of one coordinator incarnation, in the order they were prepared.

    ``write_alone`` logs whatever lingers in an entry of its own (it takes the records with
    ``take``); it runs as a task, at most one at a time."""

    def __init__(self, linger_s: float, write_alone: Callable[[], Awaitable[object]]) -> None:
        assert linger_s > 0, "a linger of 0 logs each record at once: do not linger at all"
        self._linger_s = linger_s
        self._write_alone = write_alone
        self._records: list[tuple[Record, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task | None = None
        self._needed = 0  # callers waiting for records to be logged: none lingers meanwhile

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: Record) -> asyncio.Future:
        """Queue ``record`` (prepared just now, with no await since): the future is done once it
        is logged and applied."""
        loop = asyncio.get_running_loop()
        logged = loop.create_future()
        self._records.append((record, logged))
        if self._needed or len(self._records) >= MAX_LINGERING:
            self.flush_now()
        elif self._timer is None and self._writing is None:
            self._timer = loop.call_later(self._linger_s, self.flush_now)
        return logged

    def take(self) -> list[tuple[Record, asyncio.Future]]:
        """Every lingering record, for the entry being prepared; they linger no more."""
        taken, self._records = self._records, []
        self._cancel_timer()
        return taken

    def put_back(self, taken: list[tuple[Record, asyncio.Future]]) -> None:
        """Records ``take`` handed to an entry that was refused before it was queued: they linger
        again, ahead of any added since (they were prepared first)."""
        if taken:
            self._records[:0] = taken
            self.flush_now()

    @contextlib.contextmanager
    def needed(self) -> Iterator[None]:
        """Meanwhile someone waits for records to be logged (a read that must see its own end):
        what lingers goes now, and what is added goes at once."""
        self._needed += 1
        self.flush_now()
        try:
            yield
        finally:
            self._needed -= 1

    def flush_now(self) -> None:
        """Log the lingering records now, in an entry of their own (unless one is being written:
        it takes whatever lingers when it starts, so a second one follows it)."""
        self._cancel_timer()
        if self._records and self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(self._write())

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _write(self) -> None:
        try:
            while self._records:  # records added while an entry was being written go next
                await self._write_alone()
        finally:
            self._writing = None

    def fail(self, error: BaseException) -> None:
        """Fail every lingering record with ``error`` (the incarnation stopped: they will never be
        logged by it)."""
        settle(self.take(), error)


def logged(taken: list[tuple[Record, asyncio.Future]]) -> None:
    """Their entry is durable and applied."""
    for _, future in taken:
        if not future.done():
            future.set_result(None)


def settle(taken: list[tuple[Record, asyncio.Future]], error: BaseException) -> None:
    """Their entry's write failed with ``error`` (unless it was applied already)."""
    for _, future in taken:
        if not future.done():
            future.set_exception(error)
            future.exception()  # retrieved: the driver waiting on it re-raises it through await
