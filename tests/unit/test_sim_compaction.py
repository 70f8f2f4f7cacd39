"""The simulator's compaction profile (``raytxn.sim.compaction``): a compacted topic written by
keyed txn writers (committed, aborted, left open, fenced) and plain writers resending, compacting
itself while compactions from outside race it, under default's faults. It runs, it is
deterministic, it does what it says (self-compactions, outside compactions published, lost and
crashed, tombstones, fenced txns, late resends answered as duplicates, table reloads after
trims, a read_compacted consumer served from the compacted view), and each of its checks catches
the bug it is there for: a classic bug of compaction brought back with ``raytxn.testing_bugs``,
or one patched into the engine here."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from raytxn import testing_bugs
from raytxn.actors import compaction as partition_compaction
from raytxn.protocol.compaction import DEFAULT_DELETE_RETENTION_MS, Compactor, KeptRecord, compacted_entries
from raytxn.sim.compacted import one_of_each
from raytxn.sim.run import SeedResult, run_seed
from raytxn.testing_bugs import reintroduced

SEEDS = range(3)

# bug -> (the kinds of violation its failure must name (any one of them), the seeds to look in)
BUGS = {
    # aborted writes in the key map (KAFKA-13727's class): in the first generation published
    "compaction_keeps_aborted": (("compaction: uncommitted: ",), range(3)),
    # a partition compacting up to its last entry: horizons past max_read_position, over open txns
    "compaction_past_max_read": (("max_read: ", "open txn: "), range(3)),
    # trims past the horizon: the compacted view plus the tail no longer reachable or complete
    "compacted_trim_past_horizon": (("table: ", "final view: "), range(3)),
    # the table's tail reads aborted data
    "table_view_reads_aborted": (("table: ",), range(3)),
    # txns of a fenced instance committed after all
    "no_tid_fencing": (("fencing: values of fenced txns are visible",), range(3)),
    # a late resend stored twice after a restart (seed 1 of 0-9 finds it)
    "snapshot_without_dedup": (("checker found duplicate",), range(5)),
}


@pytest.fixture(autouse=True)
def _switches_off() -> None:
    assert testing_bugs.active() == ()


def _first_failure(seeds: range) -> SeedResult | None:
    for seed in seeds:
        result = run_seed(seed, "compaction")
        if not result.ok:
            return result
    return None


def test_the_profile_compacts_under_faults_and_every_check_passes() -> None:
    results = [run_seed(seed, "compaction") for seed in SEEDS]
    assert [r.failure for r in results] == [None] * len(results)
    done: Counter[str] = Counter()
    for result in results:
        done.update(result.workload_stats)
        assert result.txns >= 100 and result.committed > 0 and result.aborted > 0
        assert result.faults["crashes"] > 0
    for what in ("generations", "compactions", "outside_published", "outside_unchanged", "tombstones",
                 "fenced_txns", "late_resends_duplicate", "table_views"):
        assert done[what] > 0, (what, done)
    assert done["outside_lost"] + done["outside_crashed"] > 0, done  # races lost, compactors dead mid-way
    assert done["generations"] > done["compactions"]  # some published by the outside compactor
    assert done["table_loads"] > 2 * len(results)  # each table loads both partitions, then again after trims
    assert done["compacted_view_reads"] > 0, done
    assert run_seed(0, "compaction").digest == results[0].digest


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_reintroduced_bug_is_found(bug: str) -> None:
    kinds, seeds = BUGS[bug]
    with reintroduced(bug):
        found = _first_failure(seeds)
    assert found is not None, f"{bug}: no failure in seeds {seeds.start}..{seeds.stop - 1}"
    assert found.failure is not None and any(kind in found.failure for kind in kinds), found.failure


def test_a_fold_keeping_the_first_value_of_a_key_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generation must hold the latest committed value of each key at its horizon."""
    add = Compactor.add

    def keep_first(self: Compactor, header, position, messages) -> None:  # type: ignore[no-untyped-def]
        before = dict(self._latest)
        add(self, header, position, messages)
        self._latest.update(before)  # what was there stays: a stale value wins

    monkeypatch.setattr(Compactor, "add", keep_first)
    found = _first_failure(range(3))
    assert found is not None and found.failure is not None and "stale: generation " in found.failure, found


def test_a_compaction_losing_a_key_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generation must hold each key whose latest committed value at its horizon is a value."""
    finish = Compactor.finish

    def lose_a_key(self: Compactor, now_ms: int,  # type: ignore[no-untyped-def]
                   delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS):
        result = finish(self, now_ms, delete_retention_ms)
        values = [r for r in result.records if not r.is_tombstone]
        if not result.publishes or not values:
            return result
        records: list[KeptRecord] = [r for r in result.records if r is not values[0]]
        horizon = msgspec.structs.replace(result.horizon, records=len(records))
        return msgspec.structs.replace(result, records=records, horizon=horizon)

    monkeypatch.setattr(Compactor, "finish", lose_a_key)
    found = _first_failure(range(3))
    assert found is not None and found.failure is not None and "lost: generation " in found.failure, found


def test_a_compacted_read_skipping_an_entry_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read_compacted subscription must end with the latest value of every key (seed 3 of 0-5
    meets a read whose first entry holds one)."""
    entries = compacted_entries

    def skipping_the_first(kept, start, max_entries):  # type: ignore[no-untyped-def]
        found = entries(kept, start, max_entries + 1)
        return found[1:] if len(found) > 1 else found

    monkeypatch.setattr(partition_compaction, "compacted_entries", skipping_the_first)
    found = _first_failure(range(3, 6))
    assert found is not None and found.failure is not None and "compacted reader: partition " in found.failure, found


def test_a_verdict_names_the_first_violation_of_each_kind_first() -> None:
    found = ["stale: g1", "stale: g2", "lost: g1", "stale: g3", "table: p0", "lost: g2"]
    assert one_of_each(found) == ["stale: g1", "lost: g1", "table: p0", "stale: g2", "stale: g3"]
    assert one_of_each(found, 2) == ["stale: g1", "lost: g1"]
