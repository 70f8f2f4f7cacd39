"""The floor of a commit's path on this machine (``raytxn bench commit``): bare Ray actors making
the engine's calls and durable puts in the engine's order, and nothing else.

A chained transaction (begin taken from the last commit, one send, commit) is three durable steps,
one after another, over four Ray calls:

1. the send: driver -> partition, which puts the entry;
2. the commit: driver -> coordinator, which puts COMMITTING, then
3. coordinator -> partition, which puts the commit marker; both answers go back.

With ``answer_at_log`` the coordinator answers once COMMITTING is put and sends the partition's
end after the answer (``CoordinatorConfig.commit_answer="logged"``): two durable steps on the
caller's path, the marker's put overlapping the next txn.

A lazy floor (``lazy``) begins each txn as the engine does when no chained txn is at hand: a
driver -> coordinator call that puts the txn's begin (NewTxn with its partition) before the send
may go out, so four durable steps over five Ray calls.

The floor makes exactly those calls, with arguments of the engine's shapes, and each put is
``Storage.create`` on file:// (write, fsync, link, fsync the directory, in one worker thread),
as the engine's ledgers do. It has no state machine, no ledger framing, no sequence checks, no
watermark and no locks. The actors get the engine's Ray options (but no restarts). So the engine's latency over
the floor's, measured in the same run, is what its own code costs, and the floor's own p50 is the
least that this design's three durable steps can take on this machine.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from typing import Any

import ray

from raytxn.actors.shell import ray_actor_options
from raytxn.ids import TxnID
from raytxn.ledger.storage import Storage
from raytxn.protocol.txnlog import EndAction

RECORD = b"\x01" * 110  # an encoded 100 B message
MAX_CONCURRENCY = 1000


def call_latencies(call: Callable[[], object], calls: int) -> list[float]:
    """Latencies (ms, in order) of ``calls`` sequential runs of ``call`` (a Ray call and its wait)."""
    latencies = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies


class FloorPartition:
    """Answers an append and an end the way a partition must at the least: after one put."""

    def __init__(self, storage_url: str) -> None:
        self._storage = Storage.from_url(storage_url)
        self._puts = 0

    async def append(self, producer: str, first_sequence: int, records: list[bytes], txn: TxnID | None,
                     previous_sequence: int, producer_epoch: int) -> tuple[int, int]:
        self._puts += 1
        await self._storage.create(f"partition/{self._puts:08d}", b"".join(records))
        return self._puts, len(records)

    async def end_txn(self, txn: TxnID, action: EndAction, low_watermark: int) -> None:
        self._puts += 1
        await self._storage.create(f"partition/{self._puts:08d}", f"{action} {txn}".encode())

    async def puts(self) -> int:
        return self._puts


class FloorCoordinator:
    """Answers a commit the way the coordinator must at the least: one put, then the partition's
    end, then the answer (with ``answer_at_log``: the answer, then the partition's end)."""

    def __init__(self, storage_url: str, partition: Any, answer_at_log: bool = False) -> None:
        self._storage = Storage.from_url(storage_url)
        self._partition = partition
        self._answer_at_log = answer_at_log
        self._ends_after_answer: list[Any] = []  # the partition's ends still on their way
        self._puts = 0

    async def begin_txn(self, timeout_ms: int, owner: str, partitions: list[tuple[str, int]],
                        subscriptions: list[tuple[str, int, str]]) -> TxnID:
        """A lazy begin at the least: one put (the engine's NewTxn and registrations are one
        entry), then the txn's id."""
        self._puts += 1
        txn = TxnID(0, self._puts)
        await self._storage.create(f"coordinator/{self._puts:08d}", f"BEGIN {txn} {owner} {partitions}".encode())
        return txn

    async def commit_and_begin(self, txn: TxnID, owner: str, timeout_ms: int, partitions: list[tuple[str, int]],
                               subscriptions: list[tuple[str, int, str]]) -> tuple[str, TxnID]:
        self._puts += 1
        await self._storage.create(f"coordinator/{self._puts:08d}", f"COMMITTING {txn} {owner}".encode())
        end = self._partition.end_txn.remote(txn, EndAction.COMMIT, txn.sequence)
        if self._answer_at_log:
            self._ends_after_answer = [task for task in self._ends_after_answer if not task.done()]
            self._ends_after_answer.append(asyncio.ensure_future(end))
        else:
            await end
        return "COMMITTED", TxnID(txn.tc_id, txn.sequence + 1)

    async def puts(self) -> int:
        await asyncio.gather(*self._ends_after_answer)  # every end put before the partition counts
        self._ends_after_answer = []
        return self._puts


class CommitFloor:
    """The two floor actors on the running Ray, over a fresh file:// root; ``close`` removes both.
    ``lazy``: each txn of ``run`` is begun by a call of its own (module docstring)."""

    def __init__(self, answer_at_log: bool = False, lazy: bool = False) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="raytxn-commit-floor-")
        url = f"file://{self._directory.name}"
        # The engine's options, but not restarted: a floor actor that died would be a failed run
        # (and the coordinator's constructor argument, the partition's handle, is not kept for
        # a restart).
        options = {**ray_actor_options(max_concurrency=MAX_CONCURRENCY), "max_restarts": 0}
        self.partition = ray.remote(**options)(FloorPartition).remote(url)
        self.coordinator = ray.remote(**options)(FloorCoordinator).remote(url, self.partition, answer_at_log)
        self.lazy = lazy
        self.txns = 0
        self.lone_commits = 0  # ``commit`` calls

    def run(self, txns: int) -> tuple[list[float], list[float], list[float]]:
        """Latencies (ms, in run order) of ``txns`` sends-then-commits: whole, send (with a lazy
        floor's begin, as the engine's first send of a txn begun lazily waits for it), commit."""
        whole, sends, commits = [], [], []
        for sequence in range(self.txns + 1, self.txns + txns + 1):
            t0 = time.perf_counter()
            if self.lazy:
                txn = ray.get(self.coordinator.begin_txn.remote(60_000, "floor-owner", [("bench-floor", 0)], []))
            else:
                txn = TxnID(0, sequence)
            ray.get(self.partition.append.remote("floor-producer", sequence, [RECORD], txn, sequence - 1, 1))
            t1 = time.perf_counter()
            self._commit(txn)  # a lazy txn's too: the engine's end_txn makes the same put and end
            t2 = time.perf_counter()
            whole.append((t2 - t0) * 1000)
            sends.append((t1 - t0) * 1000)
            commits.append((t2 - t1) * 1000)
        self.txns += txns
        return whole, sends, commits

    def commit(self) -> None:
        """One commit with no send before it, as the produce bench's ``floor_sync`` mode waits for
        one after each window's flush: COMMITTING's put, the partition's marker (after the answer
        with ``answer_at_log``), two Ray calls. A floor serves these or ``run``, not both: its
        ``puts_per_txn`` is of ``run``'s txns."""
        self.lone_commits += 1
        self._commit(TxnID(0, self.lone_commits))

    def _commit(self, txn: TxnID) -> None:
        ray.get(self.coordinator.commit_and_begin.remote(txn, "floor-owner", 60_000, [("bench-floor", 0)], []))

    def bare_call_latencies(self, calls: int) -> list[float]:
        """Latencies (ms) of ``calls`` calls to the floor's partition that do nothing (no put):
        what an async actor call costs here by itself."""
        return call_latencies(lambda: ray.get(self.partition.puts.remote()), calls)

    def puts_per_txn(self) -> float:
        """Durable puts made per txn run so far, by both actors (3: the send's, COMMITTING's and
        the marker's; 4 for a lazy floor: its begin's too)."""
        assert self.lone_commits == 0, "puts_per_txn is of run's txns: this floor also made lone commits"
        coordinator_puts = ray.get(self.coordinator.puts.remote())  # first: its ends still on their way land
        return (coordinator_puts + ray.get(self.partition.puts.remote())) / self.txns

    def close(self) -> None:
        ray.kill(self.coordinator)
        ray.kill(self.partition)
        self._directory.cleanup()
