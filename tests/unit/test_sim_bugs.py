"""Proof that the simulator finds bugs: two bugs this project fixed, brought back by the test-only
switches of ``raytxn.testing_bugs``, are each found within the first ``N`` seeds of the profile
made for them, with the failure they cause; with the switch off the same seeds are clean (those
profiles are coverage of their own: Exclusive consumers taking turns with cumulative acks, and
topics deleted under open transactions).

- ``consumer_swap_loss`` (fixed in 1149ba3): a closed Exclusive consumer's unacked messages were
  re-read behind later ones still queued; its successor got the later ones first and its
  cumulative ack covered messages nobody received. Found as inputs lost by the pipeline.
- ``deleted_topic_stuck`` (fixed in f49da2f): an end for a participant whose topic was deleted was
  retried forever; the txn never ended. Found by the liveness check of the quiet period.
- ``given_back_cumulative_ack`` and ``restarted_producer_collision``: bugs the simulator found
  (see ``raytxn.testing_bugs``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from raytxn import testing_bugs
from raytxn.sim.run import SeedResult, run_seed
from raytxn.testing_bugs import reintroduced
from raytxn.tools.cli import app

N = 20  # seeds 0..N-1 (or N from another start): each bug is found in them; about 0.15 s a seed

# bug -> (the profile made to find it, what its failure starts with, what it says (or one of these
# things), the seeds)
CASES = {
    "consumer_swap_loss": ("consumer-swap", "lost: ", "consumed but neither transformed by a committed txn",
                           range(N)),
    "given_back_cumulative_ack": ("consumer-swap", "lost: ", "consumed but neither transformed by a committed txn",
                                  range(N)),
    "deleted_topic_stuck": ("topic-delete", "liveness: ", "txns still live", range(N)),
    # Needs a client crash while an append is being stored: 6 of seeds 0-199 find it without the
    # fix (22, 61, 69, 79, 105, 150: acknowledged sends lost, or pipelined sends refused for good
    # as overlaps), 3 of them in the 20 from 60. (Counted again when the sized-down workload and the
    # simulator's cheaper waits changed every seed's schedule; 2 of 0-199 before.)
    "restarted_producer_collision": ("pipelined", "", ("plain send acknowledged", "pipelined sends"),
                                     range(60, 60 + N)),
    # A dead client's append still in the network, arriving after its successor started (the
    # zombie-appends profile makes that common): 8 of seeds 0-59 without producer epochs, from 9.
    "no_producer_epochs": ("zombie-appends", "", ("plain send acknowledged", "pipelined sends"), range(N)),
}


@pytest.fixture(autouse=True)
def _switches_off() -> Iterator[None]:
    """Every test starts and ends with every switch off (``reintroduced`` restores them also when
    a test fails inside it; this checks that nothing leaked)."""
    assert testing_bugs.active() == ()
    yield
    leaked = testing_bugs.active()
    testing_bugs.REINTRODUCED.update(dict.fromkeys(testing_bugs.REINTRODUCED, False))
    assert leaked == ()


def _first_failure(profile: str, seeds: range) -> SeedResult | None:
    for seed in seeds:
        result = run_seed(seed, profile)
        if not result.ok:
            return result
    return None


@pytest.mark.parametrize("bug", list(CASES))
def test_the_simulator_finds_the_reintroduced_bug(bug: str) -> None:
    profile, starts, says, seeds = CASES[bug]
    with reintroduced(bug):
        found = _first_failure(profile, seeds)
    assert found is not None, f"{bug}: no failure in seeds {seeds.start}..{seeds.stop - 1} of {profile}"
    says_any = (says,) if isinstance(says, str) else says
    assert found.failure is not None and found.failure.startswith(starts), found.failure
    assert any(text in found.failure for text in says_any), found.failure
    assert found.replay_command() == f"raytxn sim --seed {found.seed} --seeds 1 --faults {profile} --reintroduce {bug}"


@pytest.mark.parametrize("bug", list(CASES))
def test_the_same_seeds_are_clean_with_the_fix(bug: str) -> None:
    profile, seeds = CASES[bug][0], CASES[bug][3]
    results = [run_seed(seed, profile) for seed in seeds]
    failing = [f"seed {r.seed}: {r.failure}  (replay: {r.replay_command()})" for r in results if not r.ok]
    assert not failing, "\n".join(failing)
    assert all(r.committed > 0 and r.aborted > 0 for r in results)
    assert sum(r.faults["crashes"] for r in results) > 0 and sum(r.faults["network"] for r in results) > 0


@pytest.mark.parametrize("profile", ["consumer-swap", "topic-delete", "pipelined", "zombie-appends"])
def test_the_new_profiles_are_deterministic(profile: str) -> None:
    assert run_seed(3, profile).digest == run_seed(3, profile).digest


def test_switches_are_off_by_default_and_restored_after_an_error() -> None:
    assert set(testing_bugs.REINTRODUCED) == set(CASES)
    with pytest.raises(RuntimeError), reintroduced("deleted_topic_stuck"):
        assert testing_bugs.active() == ("deleted_topic_stuck",)
        raise RuntimeError("a failing test")
    assert testing_bugs.active() == ()
    with pytest.raises(ValueError, match="no reintroducible bug named nope"), reintroduced("nope"):
        pass


def test_cli_reintroduce() -> None:
    runner = CliRunner()
    found = runner.invoke(app, ["sim", "--faults", "topic-delete", "--reintroduce", "deleted_topic_stuck",
                                "--seeds", "1"])
    assert found.exit_code == 1, found.output
    assert "seed 0 FAILED: liveness: " in found.output
    replay = "replay: raytxn sim --seed 0 --seeds 1 --faults topic-delete --reintroduce deleted_topic_stuck"
    assert replay in found.output
    assert testing_bugs.active() == ()
    assert runner.invoke(app, ["sim", "--reintroduce", "nope", "--seeds", "1"]).exit_code == 2


# --- what the new workload found ---------------------------------------------------------------

# Found by the consumer-swap workload with forgotten txns (fixed: a cumulative ack in a txn may
# not cover messages given back and not handed out again; after a restart everything unacked
# counts as given back). A consumer closed while its txn held a cumulative ack up to m; its
# successor got the messages after m; the open txn timed out and aborted, giving back those up
# to m; the successor's cumulative ack of a later message was accepted and committed, covering
# given-back messages nobody received (9 of seeds 0-29 lost inputs without the check; also through a restart
# right after the abort, where the new incarnation had forgotten the give-back).
# Seeds 2, 3 and 5 found it; the schedules of every seed changed since (a workload sized to 100 txns,
# cheaper waits in the simulator, subscriptions asking about stale txns), so the seeds kept are ones
# whose schedule today still loses inputs with the bug brought back (5 of 0-29: 0, 11, 25, 26, 27),
# and the test shows both.
@pytest.mark.parametrize("seed", [0, 11, 25])
def test_regression_seed_a_cumulative_ack_after_an_abort_covers_the_messages_it_gave_back(seed: int) -> None:
    result = run_seed(seed, "consumer-swap")
    assert result.ok, result.failure
    with reintroduced("given_back_cumulative_ack"):
        broken = run_seed(seed, "consumer-swap")
    assert broken.failure is not None and broken.failure.startswith("lost: "), broken.failure
