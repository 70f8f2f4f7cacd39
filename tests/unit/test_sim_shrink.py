"""Shrinking a failing simulator run (raytxn.sim.shrink), and the schedule overrides it searches
(raytxn.sim.schedule: parsed from and printed as ``--schedule`` strings; raytxn.sim.gate: faults
masked or capped after their draw).

The failure these tests shrink is made by the harness on purpose, not found in the engine: an extra
check (``run_seed(extra_check=...)``, ``raytxn sim --check``) that fails a run in which a pipeline
worker, dropped by its input subscription when that restarted, subscribes again and then commits a
transform. That is a legitimate event, not a bug; but it needs a subscription crash while a worker
is registered, and txns around it, so the shrinker has a real, deterministic schedule to minimise
(faults to remove, txns to cut), through the same code path as any other failure. A known-failing
engine seed (stale-handles seed 4) would do today, but stops failing once its bug is fixed, and a
test built on it would then have nothing to shrink; this failure lasts as long as the simulator
can crash a subscription.
"""

from __future__ import annotations

import functools
import shlex

import pytest
from typer.testing import CliRunner

from raytxn.errors import InvalidArgument
from raytxn.sim.run import check_spec, run_seed
from raytxn.sim.schedule import KINDS, Schedule, format_schedule, parse_schedule
from raytxn.sim.shrink import ShrinkResult, failure_kind, shrink, size
from raytxn.testing_bugs import reintroduced
from raytxn.tools.cli import app
from raytxn.tools.history import Acked, History, Reset, TxnEnded

PROFILE = "default"
SHRINK_RUNS = 30  # the test's budget: a few seconds on one core


def resubscribed_then_committed(history: History) -> str | None:
    """The extra check: a message when a worker that had to subscribe again commits a transform."""
    reset_at: dict[str, float] = {}
    acked_by: dict[object, str] = {}
    for event in history.events:
        if isinstance(event, Reset):
            reset_at.setdefault(event.consumer, event.t)
        elif isinstance(event, Acked) and event.txn is not None:
            acked_by[event.txn] = event.consumer
        elif isinstance(event, TxnEnded) and event.outcome == "committed":
            consumer = acked_by.get(event.txn)
            if consumer in reset_at and event.t > reset_at[consumer]:
                return f"{consumer} subscribed again at t={reset_at[consumer]:.3f}, then committed {event.txn}"
    return None


@functools.cache
def failing_seed() -> int:
    """The first seed whose run the extra check fails (most do: the default profile crashes a
    subscription in most runs)."""
    for seed in range(20):
        if not run_seed(seed, PROFILE, extra_check=resubscribed_then_committed).ok:
            return seed
    raise AssertionError("no seed in 0-19 makes a worker subscribe again: the extra check never fails")


def invoke(args: list[str]) -> list[str]:
    """``raytxn sim ...`` in-process; its output lines."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    return result.output.splitlines()


def cli_args(replay_command: str) -> list[str]:
    words = shlex.split(replay_command)
    assert words[0] == "raytxn"
    return words[1:]


# --- the schedule string -----------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "",
    "workers=1",
    "max_faults=0",
    "inputs=0,tid_txns=3,tid_producers=0,workers=1,partitions=1,coordinators=1,max_txns=12,window=0.75",
    "no=" + "+".join(KINDS),
    "max_faults=7 , no=zombie+drop,window=1,workers=1",
])
def test_schedule_strings_round_trip(text: str) -> None:
    schedule = parse_schedule(text)
    printed = format_schedule(schedule)
    assert parse_schedule(printed) == schedule
    assert format_schedule(parse_schedule(printed)) == printed == str(schedule)


def test_schedule_prints_in_one_canonical_order() -> None:
    # Keys in field order and kinds in KINDS order, whatever order they were given in: one run,
    # one string (the shrinker also uses the string to skip a schedule it ran already).
    assert str(parse_schedule("max_faults=7,no=zombie+drop,window=1,workers=1")) == \
        "workers=1,window=1.0,no=drop+zombie,max_faults=7"
    assert str(Schedule()) == ""


@pytest.mark.parametrize(("text", "says"), [
    ("workers", "not key=value"),
    ("workers=", "not key=value"),
    ("workers=two", "not an integer"),
    ("workers=0", "workers must be an integer >= 1"),
    ("max_txns=-1", "max_txns must be an integer >= 0"),
    ("max_faults=1.5", "not an integer"),
    ("window=-1", "window must be a number of seconds >= 0"),
    ("window=nan", "window must be a number of seconds >= 0"),
    ("no=", "not key=value"),
    ("no=zombie++drop", "an empty kind"),
    ("no=zombies", "unknown kinds ['zombies']"),
    ("txns=20", "unknown key 'txns'"),
    ("workers=1,workers=2", "workers given twice"),
])
def test_malformed_schedules_raise_invalid_argument(text: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^schedule: ") as raised:
        parse_schedule(text)
    assert says in str(raised.value)


# --- what a schedule does to a run -------------------------------------------------------------

# A seed whose run has drops, so that masking them lowers its fault count (seed 5 stopped having
# that when ledger reads got their objects together, seed 6 when the coordinator's last records
# began to linger: other faults took the drops' place).
SEED = 0


def test_no_override_and_a_cap_above_the_faults_change_nothing() -> None:
    plain = run_seed(SEED, PROFILE)
    assert plain.fault_total > 0
    assert run_seed(SEED, PROFILE, schedule=Schedule()).digest == plain.digest
    loose = run_seed(SEED, PROFILE, schedule=Schedule(max_faults=plain.fault_total + 1))
    assert loose.digest == plain.digest and loose.fault_total == plain.fault_total
    assert plain.replay_command() == f"raytxn sim --seed {SEED} --seeds 1 --faults {PROFILE}"
    # What the shrinker relies on when it lowers a kept run's cap to the faults that run had.
    masked = run_seed(SEED, PROFILE, schedule=Schedule(no=frozenset({"drop"}), max_faults=plain.fault_total))
    assert masked.fault_total < plain.fault_total  # drops were there, and the cap is loose
    tight = run_seed(SEED, PROFILE, schedule=Schedule(no=frozenset({"drop"}), max_faults=masked.fault_total))
    assert tight.digest == masked.digest


# A seed whose most frequent fault kind, and the second half of its faults, first fire well into the
# run (seed 5 stopped being one when the coordinator began to answer a commit before it prepares
# the txn's last record: its most frequent kind then fired at trace line 20).
PREFIX_SEED = 2


@pytest.mark.parametrize("schedule", ["cap", "mask"])
def test_a_capped_or_masked_run_is_the_original_up_to_the_first_suppressed_fault(schedule: str) -> None:
    plain = run_seed(PREFIX_SEED, PROFILE, keep_trace=True)
    reduced = Schedule(max_faults=plain.fault_total // 2) if schedule == "cap" else \
        Schedule(no=frozenset({max(plain.fault_kinds, key=lambda kind: plain.fault_kinds[kind])}))
    other = run_seed(PREFIX_SEED, PROFILE, keep_trace=True, schedule=reduced)
    assert plain.trace_lines is not None and other.trace_lines is not None
    first = next(i for i, line in enumerate(other.trace_lines) if " fault_suppressed " in line)
    assert first > 20  # a real common prefix (the kinds masked or capped fire well into the run)
    assert other.trace_lines[:first] == plain.trace_lines[:first]
    assert other.digest != plain.digest
    if schedule == "cap":
        assert other.fault_total == plain.fault_total // 2


# --- shrinking ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shrunk() -> ShrinkResult:
    return shrink(failing_seed(), PROFILE, extra_check=resubscribed_then_committed, max_runs=SHRINK_RUNS)


def test_shrunk_run_fails_the_same_way_and_is_smaller(shrunk: ShrinkResult) -> None:
    before, after = shrunk.original, shrunk.shrunk
    assert before.failure is not None and after.failure is not None
    assert failure_kind(after.failure) == failure_kind(before.failure) == "extra check"
    assert after.txns <= before.txns and after.fault_total <= before.fault_total
    assert size(after) < size(before) and shrunk.smaller
    assert str(after.schedule) and 0 < shrunk.runs <= SHRINK_RUNS
    # The shrunk run is what its schedule says, run afresh.
    again = run_seed(after.seed, PROFILE, schedule=after.schedule, extra_check=resubscribed_then_committed)
    assert (again.digest, again.failure) == (after.digest, after.failure)


def test_shrunk_run_replays_from_its_printed_command(shrunk: ShrinkResult) -> None:
    after = shrunk.shrunk
    command = after.replay_command()
    assert f"--schedule '{after.schedule}'" in command
    assert f"--check {check_spec(resubscribed_then_committed)}" in command
    failed = [line for line in invoke(cli_args(command)) if " FAILED: " in line]
    assert failed == [f"seed {after.seed} FAILED: {after.failure}  trace {after.digest[:12]}  replay: {command}"]


def test_cli_shrink_prints_a_smaller_run_that_replays_the_same() -> None:
    seed, spec = failing_seed(), check_spec(resubscribed_then_committed)
    lines = invoke(["sim", "--seed", str(seed), "--seeds", "1", "--faults", PROFILE, "--check", spec,
                    "--shrink", "--shrink-runs", "8"])
    failed, summary, smallest = lines[0], lines[1], lines[2]
    assert failed.startswith(f"seed {seed} FAILED: extra check: ")
    assert failed.endswith(f"replay: raytxn sim --seed {seed} --seeds 1 --faults {PROFILE} --check {spec}")
    assert summary.startswith("  shrunk in ") and " txns, faults " in summary and "removed: " in summary
    assert smallest.startswith(f"  smallest: seed {seed} FAILED: extra check: ") and "--schedule '" in smallest
    # The printed smallest run, replayed from its own command, prints the same line.
    replay = smallest.split("replay: ", 1)[1]
    assert [line for line in invoke(cli_args(replay)) if " FAILED: " in line] == [smallest.removeprefix("  smallest: ")]


def test_shrinking_a_passing_seed_and_bad_options_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="passes: nothing to shrink"):
        shrink(0, "none", max_runs=1)
    for args, says in ((["--schedule", "workers=0"], "workers must be an integer >= 1"),
                       (["--check", "no_colon"], "--check takes module:function"),
                       (["--check", "tests.unit.test_sim_shrink:missing"], "has no function 'missing'")):
        result = CliRunner().invoke(app, ["sim", "--seeds", "1", *args])
        assert result.exit_code == 2 and says in result.output, result.output


def test_a_reintroduced_bug_of_a_profile_with_its_own_workload_shrinks_to_a_few_txns() -> None:
    """consumer-swap runs its own workload (Exclusive consumers taking turns): the shrink searches
    that workload, not the default one, and with the bug brought back (1149ba3) finds a run of a
    few txns and no faults that still loses inputs, and whose printed command replays it."""
    with reintroduced("consumer_swap_loss"):
        result = shrink(0, "consumer-swap", max_runs=60)
    after = result.shrunk
    assert after.failure is not None and failure_kind(after.failure) == failure_kind(result.original.failure or "")
    assert after.failure.startswith("lost: ")
    assert after.txns <= 20 < result.original.txns and after.fault_total < result.original.fault_total
    command = after.replay_command()
    assert " --reintroduce consumer_swap_loss --schedule " in command
    replayed = CliRunner().invoke(app, shlex.split(command)[1:])
    assert replayed.exit_code == 1, replayed.output
    assert f"trace {after.digest[:12]}" in replayed.output
