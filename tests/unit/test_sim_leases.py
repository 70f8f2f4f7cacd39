"""The simulator's leases profile (``raytxn.sim.leases``): holders of range leases consume the
output (where the txns write) on a subscription of their own through the real subscription actor's
lease calls and the real range reader, under default's faults. It runs, it is deterministic, and
its checks catch a broken bulk path: range reads that show aborted data, leases past the readable
end (bugs injected here by patching the engine for the test), and two leases committing one range."""

from __future__ import annotations

import pytest

from raytxn.ids import Position, TxnID
from raytxn.protocol.txn_buffer import TransactionBuffer
from raytxn.sim.leases import LeaseAck, violations
from raytxn.sim.run import run_seed

SEEDS = range(3)


def _moves(lines: list[str]) -> dict[str, int]:
    moves = {"lease": 0, "ack_lease": 0, "release_lease": 0, "renew_lease": 0, "grow_lease": 0, "takeover": 0,
             "chained": 0, "refused NotAllowed": 0, "refused Fenced": 0}
    for line in lines:
        kind = line.split()[1]
        if kind == "call":
            for method in ("lease", "ack_lease", "release_lease", "renew_lease", "grow_lease"):
                if f" '{method}' " in line:
                    moves[method] += 1
        elif kind == "driver" and "'lease_takeover'" in line:
            moves["takeover"] += 1
        elif kind == "driver" and "'lease_chained'" in line:  # the next range, leased while a txn ends
            moves["chained"] += 1
        elif kind == "driver" and "'lease_ack_refused'" in line:
            for why in ("NotAllowed", "Fenced"):  # the lease expired, or the holder's newer epoch took it
                moves[f"refused {why}"] += f"'{why}'" in line
    return moves


def test_the_profile_grants_grows_chains_acks_releases_renews_expires_and_fences_leases() -> None:
    results = [run_seed(seed, "leases", keep_trace=True) for seed in SEEDS]
    assert [r.failure for r in results] == [None] * len(results)
    moves = {name: sum(_moves(r.trace_lines or [])[name] for r in results) for name in _moves([])}
    assert all(count > 0 for count in moves.values()), moves
    assert run_seed(0, "leases").digest == results[0].digest


def _first_failure(seeds: range) -> str | None:
    for seed in seeds:
        result = run_seed(seed, "leases")
        if not result.ok:
            return result.failure
    return None


def test_a_range_read_without_the_aborted_spans_is_an_aborted_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TransactionBuffer, "aborted_between", lambda self, start, end: [])
    failure = _first_failure(SEEDS)
    assert failure is not None and failure.startswith("checker found") and "aborted_read" in failure, failure


def test_a_lease_past_the_readable_end_is_an_early_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TransactionBuffer, "max_read_position", property(lambda self: self.last_position))
    failure = _first_failure(range(10))
    assert failure is not None and failure.startswith("checker found"), failure
    assert "aborted_read" in failure or "uncommitted_read" in failure, failure


def test_exclusivity_two_leases_over_one_committed_range() -> None:
    t1, t2, t3 = TxnID(0, 1), TxnID(1, 1), TxnID(0, 2)
    first = LeaseAck(7, "L0.0", 1, Position(3, 0), Position(3, 4), t1, 1.0)
    overlapping = LeaseAck(9, "L1.0", 1, Position(3, 4), Position(3, 6), t2, 2.0)
    after = LeaseAck(10, "L1.0", 1, Position(3, 5), Position(3, 6), t3, 3.0)
    other_partition = LeaseAck(11, "L1.0", 0, Position(3, 0), Position(3, 6), t3, 3.0)
    committed = {t1: "committed", t2: "aborted", t3: "committed"}
    found = violations([first, overlapping, after, other_partition], committed, [])
    assert len(found) == 1 and found[0].startswith("exclusivity: lease 9 of L1.0"), found
    # the first txn aborted: its range went out again, legitimately
    assert violations([first, overlapping], {t1: "aborted", t2: "committed"}, []) == []
    assert violations([first, after], committed, ["out-1 3:0..3:4: CorruptLedger()"])[0].startswith("range reads")
