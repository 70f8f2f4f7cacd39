"""The simulator's stateful profile (``raytxn.sim.stateful``): a transactional-id pipeline keeping
per-key counts in a compacted state topic, committing outputs, state updates and input acks in one
txn (``StatefulPipeline``'s rule), crashing at every point of a batch and left as a zombie, under
default's faults. It runs, it is deterministic, it does what it says (crashes, zombies fenced,
aborted batches, the state topic compacting itself), and each of its checks catches the bug it is
there for: brought back with ``raytxn.testing_bugs``, or patched into the engine here."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from raytxn import testing_bugs
from raytxn.client.message import MessageId
from raytxn.client.table_view import TableState
from raytxn.ids import TxnID
from raytxn.sim import stateful
from raytxn.sim.run import SeedResult, run_seed
from raytxn.testing_bugs import reintroduced
from raytxn.tools.history import History

SEEDS = range(2)


@pytest.fixture(autouse=True)
def _switches_off() -> None:
    assert testing_bugs.active() == ()


def _first_failure(seeds: range = range(3)) -> SeedResult | None:
    for seed in seeds:
        result = run_seed(seed, "stateful")
        if not result.ok:
            return result
    return None


def test_the_profile_runs_batches_through_crashes_and_zombies_and_every_check_passes() -> None:
    results = [run_seed(seed, "stateful") for seed in SEEDS]
    assert [r.failure for r in results] == [None] * len(results)
    done: Counter[str] = Counter()
    for result in results:
        done.update(result.workload_stats)
        assert result.committed > 0 and result.aborted > 0 and result.faults["crashes"] > 0
    assert done["crashes"] > 0 and done["zombies"] > 0, done      # the pipeline's own
    assert done["incarnations"] > done["crashes"]                  # each crash and zombie got a successor
    assert done["generations"] > 0, done                           # the state topic compacted itself
    assert done["batches"] >= 150, done
    assert run_seed(0, "stateful").digest == results[0].digest


def test_a_table_reading_aborted_state_applies_updates_twice() -> None:
    """An aborted batch's state update reaches the next batch, which builds on it."""
    with reintroduced("table_view_reads_aborted"):
        found = _first_failure()
    assert found is not None and found.failure is not None, found
    assert "version: " in found.failure and "ahead of" in found.failure, found.failure
    assert "state: " in found.failure and "(applied twice)" in found.failure, found.failure


def test_a_zombie_that_is_not_fenced_commits() -> None:
    with reintroduced("no_tid_fencing"):
        found = _first_failure(range(5))
    assert found is not None and found.failure is not None and "fencing: batch " in found.failure, found


def test_a_table_that_stops_refreshing_loses_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state read behind the committed input (KAFKA-20685's lesson: state trusted past its
    committed position): the table as its incarnation loaded it, never refreshed."""
    async def no_refresh(self: TableState) -> dict[int, int]:
        return self.position

    monkeypatch.setattr(TableState, "refresh_async", no_refresh)
    found = _first_failure()
    assert found is not None and found.failure is not None, found
    assert "version: " in found.failure and "behind" in found.failure, found.failure
    assert "state: " in found.failure and "(lost)" in found.failure, found.failure


def test_a_range_read_missing_its_last_input_loses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's end is acked in the txn, so an input the read missed is consumed unprocessed."""
    read = stateful.read_range_async

    async def missing_the_last(*args: object, **kwargs: object) -> list[pa.RecordBatch]:
        batches = await read(*args, **kwargs)  # type: ignore[arg-type]
        return [*batches[:-1], batches[-1].slice(0, batches[-1].num_rows - 1)] if batches else batches

    monkeypatch.setattr(stateful, "read_range_async", missing_the_last)
    found = _first_failure()
    assert found is not None and found.failure is not None and "lost: " in found.failure, found


def test_the_output_check_counts_each_committed_input_once() -> None:
    def batch(txn: TxnID, *uids: str) -> stateful.Batch:
        return stateful.Batch(txn, 0, [(uid, "k0", MessageId("src", 0, 0, n, 0)) for n, uid in enumerate(uids)], {})

    history = History()
    for n, uid in enumerate(("s-0", "s-1", "s-2", "s-3")):
        history.send(uid, "src", 0, None, "seeder", 0.0)
        history.send_ok(uid, MessageId("src", 0, 0, n, 0), 0.0)
    history.final_state("check", "sink", [(0, MessageId("sink", 0, 0, n, 0), f"o:{uid}")
                                           for n, uid in enumerate(("s-0", "s-1", "s-1", "s-9"))])
    history.final_state("sp", "src", [(0, MessageId("src", 0, 0, 3, 0), "s-3")])
    found = stateful.output_violations(history, [batch(TxnID(0, 1), "s-0", "s-1")])
    # s-1 twice, s-9 of no committed batch; s-2 neither consumed nor left in the drain
    assert found == ["output: inputs whose outputs the sink holds a wrong number of times: [('s-1', 2), ('s-9', 1)]",
                     "lost: 1 inputs neither consumed by a committed batch nor left in the drain of sp: ['s-2']"]
    # s-2 consumed by a committed batch whose output is missing
    assert stateful.output_violations(history, [batch(TxnID(0, 1), "s-0", "s-1", "s-2", "s-9")]) == [
        "output: inputs whose outputs the sink holds a wrong number of times: [('s-1', 2), ('s-2', 0)]"]
