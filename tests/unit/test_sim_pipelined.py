"""The simulator's pipelined profile (``raytxn.sim.pipelined``): the real client ``Producer`` with
appends in flight (``max_in_flight`` 5) under default's faults, its client processes crashing and a
same-name successor continuing. What the simulator found there, and the pure rule it needed."""

from __future__ import annotations

import pytest

from raytxn.errors import Fenced
from raytxn.ids import Position
from raytxn.protocol.entry_format import EntryHeader
from raytxn.protocol.txn_buffer import TransactionBuffer
from raytxn.sim.pipelined import violations
from raytxn.sim.run import run_seed
from raytxn.testing_bugs import reintroduced
from raytxn.tools.history import History


def test_the_profile_runs_the_real_producer_with_appends_in_flight_and_client_crashes() -> None:
    result = run_seed(8, "pipelined", keep_trace=True)
    assert result.ok, result.failure
    lines = result.trace_lines or []
    appends = [line for line in lines if " call 'pp" in line and "'append'" in line]
    # batches naming the batch they follow (previous_sequence >= 0): several in flight at once
    assert any(not line.rstrip().endswith("None, -1)") for line in appends)
    assert sum(" client_crash " in line for line in lines) >= 2  # crashed client processes ...
    assert sum(" producer_start 'pp" in line for line in lines) >= 4  # ... and their successors
    assert run_seed(8, "pipelined").digest == result.digest


def test_zombie_appends_reach_partitions_after_the_successor_began_and_are_fenced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The zombie-appends profile: a crashed client's requests still arrive (as Ray actor calls
    already sent do), some slowly, and its successor starts at once. Producer epochs must fence the
    dead incarnation's late appends: they happen (counted by a spy that changes nothing), and every
    seed is clean. Without epochs the same seeds lose acknowledged sends (test_sim_bugs.py)."""
    refused: list[str] = []
    prepare = TransactionBuffer.prepare_append

    def counting(buffer: TransactionBuffer, header: EntryHeader, previous_sequence: int = -1) -> object:
        try:
            return prepare(buffer, header, previous_sequence)
        except Fenced:
            refused.append(header.producer)
            raise

    monkeypatch.setattr(TransactionBuffer, "prepare_append", counting)
    results = [run_seed(seed, "zombie-appends") for seed in range(12)]
    assert [r.failure for r in results if not r.ok] == []
    assert refused and set(refused) <= {"pp0", "pp1"}
    assert sum(r.faults["crashes"] for r in results) > 0


def test_regression_seed_an_epoch_a_dead_partition_incarnation_handed_out_is_not_handed_out_again() -> None:
    """Found by the 1-hour run (seed 2002810 of ``raytxn sim --minutes 60 --faults all``): a
    partition handed epoch 2 to a producer incarnation and crashed; its successor, which knew only
    epoch 1, handed 2 again to the next incarnation after that one crashed too, and a late append
    of the dead one in the same epoch made the successor's first batch fail for good as an overlap
    (test_txn_buffer.py has the rule: epochs start above the partition's incarnation floor)."""
    result = run_seed(2002810, "zombie-appends")
    assert result.ok, result.failure


def test_violations_judge_failed_lost_duplicated_and_reordered_sends() -> None:
    history = History()
    history.final_state("verify", "out", [(0, ("out", 0, 0, 0, 0), "pp0-0"), (0, ("out", 0, 0, 1, 0), "pp0-2"),
                                          (1, ("out", 1, 0, 0, 0), "pp0-1"), (1, ("out", 1, 0, 1, 0), "x")])
    assert violations(history, "out", "verify", ["pp0-0", "pp0-1", "pp0-2"], []) == []
    found = violations(history, "out", "verify", ["pp0-0", "pp0-3"], ["pp0-4: Fenced()"])
    assert [v.split(":")[0] for v in found] == ["failed", "lost"]
    reordered = History()
    reordered.final_state("verify", "out", [(0, ("out", 0, 0, 0, 0), "pp1-5"), (0, ("out", 0, 0, 1, 0), "pp1-3"),
                                            (0, ("out", 0, 0, 2, 0), "pp1-5")])
    found = violations(reordered, "out", "verify", [], [])
    assert [v.split(":")[0] for v in found] == ["duplicate", "order"]


def test_the_last_sequence_of_a_producer_counts_an_append_being_stored() -> None:
    """Where a producer re-created with the same name continues: above an append of its dead
    predecessor that is prepared but not durable yet, else its first batch collides with it."""
    buffer = TransactionBuffer()
    first = EntryHeader("data", None, "p", 0, 2, 3, 0)
    assert buffer.highest_sequence("p") == -1
    assert buffer.prepare_append(first, -1).status == "ok"
    assert buffer.highest_sequence("p") == 2 and buffer.dedup_position("p") is None  # being stored
    buffer.apply(first, Position(0, 0))
    assert buffer.highest_sequence("p") == 2
    second = EntryHeader("data", None, "p", 3, 4, 2, 0)
    assert buffer.prepare_append(second, 2).status == "ok"
    assert buffer.highest_sequence("p") == 4
    buffer.cancel_append(second)  # never handed to the ledger
    assert buffer.highest_sequence("p") == 2 and buffer.highest_sequence("q") == -1


# Regression seeds of a bug the pipelined profile found (fixed: a partition's last_sequence counts
# the appends being stored, not only the durable ones). A producer's client process crashed while
# an append of it was being written (a slow put); its successor, re-created with the same name,
# asked each partition for the last sequence, got the one before that append, and numbered its
# first batch from there: the batch overlapped the dead client's append (refused for good:
# InvalidArgument, seeds 61, 170, 181) or had the very same range (acknowledged as its duplicate,
# with the dead client's position: acknowledged messages never stored, seeds 50, 138, 160).
# 8 of seeds 0-199 failed without the fix. The schedules of every seed changed since (producer
# epochs, a workload sized to 100 txns, cheaper waits in the simulator, subscriptions asking about
# stale txns, the coordinator's last records lingering for its next entry, then sharing its next
# put as entries of their own, then a commit answered before its last record is prepared): the
# seeds kept are ones whose schedule today still collides with the bug brought back (6 of 0-199:
# 110, 113, 121, 179, 188, 196; 6 of 200-399, the first 206), and the test shows both.
@pytest.mark.parametrize("seed", [110, 113, 206])
def test_regression_seed_a_restarted_producer_collides_with_its_predecessors_append(seed: int) -> None:
    result = run_seed(seed, "pipelined")
    assert result.ok, result.failure
    with reintroduced("restarted_producer_collision"):
        broken = run_seed(seed, "pipelined")
    assert broken.failure is not None, f"seed {seed} no longer meets the collision"


# Regression seed of a bug the simulator found (pipelined seed 657, in a 1,000-seed run of 400-1399
# after producer epochs changed the traces). A partition's first incarnation wrote snapshot 28 (the
# reply was lost) and went on as a zombie beside its successor. While the successor started, the
# zombie completed a newer snapshot and deleted 28 as obsolete, between the successor's listing and
# its read of 28's segment: the start failed with CorruptLedger ("vanished"), and every call waiting
# for it failed for good. The start now lists again when the newest snapshot vanishes under it.
def test_regression_seed_a_snapshot_deleted_by_a_zombie_under_its_successors_start() -> None:
    result = run_seed(657, "pipelined")
    assert result.ok, result.failure
