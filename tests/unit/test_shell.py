"""The actor shell's rules, without Ray: lazy start (once, shared; a retriable failure retried by
the next call; any other failure final, the process ended after a hold-off), the stop of an
incarnation whose ledger write failed, bounded ledger replay, and the injected clock. The real
actor classes run here in one event loop on ``memory://`` storage, with the process exit replaced
by a recorder; the subscription reaches its partition in-process through the actor-lookup seam."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from raytxn.actors.coordinator import TransactionCoordinator, log_stream
from raytxn.actors.partition import PartitionBuffer, partition_stream
from raytxn.actors.shell import EXIT_CODE, ActorShell, Clock, ray_actor_options, replay
from raytxn.actors.subscription import Subscription, pending_ack_stream
from raytxn.actors.supervisor import probes_due
from raytxn.auth import Access, guarded
from raytxn.errors import (
    ActorUnavailable,
    CorruptLedger,
    Fenced,
    InvalidTxnState,
    MessageTooLarge,
    StorageUnavailable,
)
from raytxn.ids import Position, TxnID
from raytxn.ledger import LedgerConfig, ManagedLedger
from raytxn.ledger.storage import Storage
from raytxn.protocol.coordinator_state import CoordinatorState
from raytxn.protocol.entry_format import MessageRecord, decode_header, encode_message
from raytxn.protocol.txnlog import encode_record


class ManualClock(Clock):
    """A clock that moves only when told to."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def monotonic(self) -> float:
        return self.now / 1000


class Probe(ActorShell):
    """The smallest actor: its start fails with the queued errors, then succeeds."""

    actor_kind = "probe"
    STOP_EXIT_S = 0.01
    FAILED_START_EXIT_S = 0.2

    def __init__(self, *failures: BaseException) -> None:
        super().__init__("probe", ManualClock())
        self.info: dict[str, Any] = {}
        self.failures = list(failures)
        self.starts = 0
        self.exits: list[int] = []
        self.exit_process = self.exits.append

    async def _start(self) -> None:
        self.starts += 1
        await asyncio.sleep(0.01)  # concurrent callers arrive meanwhile
        if self.failures:
            raise self.failures.pop(0)


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def memory_url() -> str:
    return f"memory://shell-{uuid.uuid4().hex[:12]}"


async def outcome(call: Awaitable[Any]) -> BaseException | None:
    try:
        await call
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return error
    return None


# --- start ---------------------------------------------------------------------------------


def test_start_runs_once_for_all_concurrent_callers() -> None:
    async def main() -> None:
        probe = Probe()
        await asyncio.gather(*(probe._started() for _ in range(20)))
        await probe._started()
        assert probe.starts == 1
        assert probe.info["started_ms"] == 1_000_000 and probe.info["recovery_ms"] == 0  # the injected clock

    run(main())


def test_retriable_start_failure_is_started_again_by_the_next_call() -> None:
    async def main() -> None:
        probe = Probe(StorageUnavailable("store away"))
        first = await asyncio.gather(*(outcome(probe._started()) for _ in range(5)))
        assert all(isinstance(e, StorageUnavailable) for e in first)  # shared: one start, one failure
        assert probe.starts == 1
        await probe._started()
        assert probe.starts == 2 and probe.exits == []

    run(main())


def test_final_start_failure_fails_every_call_and_ends_the_process_after_the_hold_off() -> None:
    async def main() -> None:
        corrupt = CorruptLedger("chunk 7 fails its checksum", "streams/x/ledgers/1/7")
        probe = Probe(corrupt)
        for _ in range(3):
            assert await outcome(probe._started()) is corrupt  # the error itself, naming the object
        assert probe.starts == 1
        assert probe.exits == []  # not at once: callers see the error meanwhile
        await asyncio.sleep(Probe.FAILED_START_EXIT_S + 0.1)
        assert probe.exits == [EXIT_CODE]
        assert await outcome(probe._started()) is corrupt and probe.starts == 1

    run(main())


def test_fenced_start_tells_callers_to_retry_and_ends_the_process_at_once() -> None:
    async def main() -> None:
        fenced = Fenced("a newer incarnation opened the stream")
        probe = Probe(fenced)
        error = await outcome(probe._started())
        assert isinstance(error, ActorUnavailable) and error.__cause__ is fenced and error.retriable
        await asyncio.sleep(Probe.STOP_EXIT_S + 0.05)
        assert probe.exits == [EXIT_CODE]
        assert isinstance(await outcome(probe._started()), ActorUnavailable) and probe.starts == 1

    run(main())


# --- stop on a failed ledger write ---------------------------------------------------------


def test_failed_ledger_write_stops_the_incarnation() -> None:
    """Fenced, or any other non-retriable error (an apply refusing a durable record), stops it;
    MessageTooLarge and retriable errors go to the caller and change nothing."""

    async def main() -> None:
        storage = Storage.from_url(memory_url())
        probe = Probe()
        await probe._started()
        ledger = await ManagedLedger.open(storage, "t/probe", LedgerConfig(max_entry_bytes=64))
        assert isinstance(await outcome(probe._write(ledger.append([b"x" * 100]))), MessageTooLarge)

        async def unavailable() -> None:
            raise StorageUnavailable("append not durable yet")

        assert isinstance(await outcome(probe._write(unavailable())), StorageUnavailable)
        await probe._started()  # still serving
        assert probe.exits == []

        def diverged(_position: Position) -> None:
            raise InvalidTxnState("the state refuses a record the log holds")

        error = await outcome(probe._write(ledger.append([b"y"], on_durable=diverged)))
        assert isinstance(error, ActorUnavailable) and isinstance(error.__cause__, InvalidTxnState)
        assert isinstance(await outcome(probe._started()), ActorUnavailable)  # every later call, at once
        await asyncio.sleep(Probe.STOP_EXIT_S + 0.05)
        assert probe.exits == [EXIT_CODE]

        fenced_probe = Probe()
        await fenced_probe._started()
        await ManagedLedger.open(storage, "t/probe")  # a newer incarnation takes the stream
        error = await outcome(fenced_probe._write(ledger.append([b"z"])))
        assert isinstance(error, ActorUnavailable) and isinstance(error.__cause__, Fenced)
        await asyncio.sleep(Probe.STOP_EXIT_S + 0.05)
        assert fenced_probe.exits == [EXIT_CODE]

    run(main())


class LocalRef:
    """Reaches an actor object in this process, as ``ActorRef`` reaches a Ray actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.name = actor.actor_name

    async def call_async(self, method: str, *args: Any, deadline_s: float | None = None, **kwargs: Any) -> Any:
        return await getattr(self.actor, method)(*args, **kwargs)

    attempt_async = call_async


async def coordinator_writing(url: str) -> tuple[Any, str, Callable[[], Awaitable[Any]]]:
    tc = TransactionCoordinator(0, url)
    return tc, log_stream(0), lambda: tc.new_txn(10_000, "alice")


async def partition_writing(url: str) -> tuple[Any, str, Callable[[], Awaitable[Any]]]:
    part = PartitionBuffer("t", 0, url)
    return part, partition_stream("t", 0), lambda: part.append("p", 1, [encode_message(MessageRecord(b"late"))])


async def subscription_writing(url: str) -> tuple[Any, str, Callable[[], Awaitable[Any]]]:
    part = PartitionBuffer("t", 0, url)
    sub = Subscription("t", 0, "s", "earliest", url, actor_refs=lambda _name, _token: LocalRef(part))
    await part.append("p", 0, [encode_message(MessageRecord(b"m"))])
    await sub.subscribe("c", "c", "Exclusive")
    [message] = (await sub.fetch("c", 10, max_wait_s=10))["messages"]
    position = Position(message[0], message[1])
    return sub, pending_ack_stream("t", 0, "s"), lambda: sub.ack("c", [(position, None, None)], txn=TxnID(0, 1))


@pytest.mark.parametrize("make", [coordinator_writing, partition_writing, subscription_writing],
                         ids=["coordinator", "partition", "subscription"])
def test_each_actor_stops_when_its_ledger_write_is_fenced(make: Callable) -> None:
    async def main() -> None:
        url = memory_url()
        actor, stream, write = await make(url)
        exits: list[int] = []
        actor.exit_process = exits.append
        await actor.ready()
        successor = await ManagedLedger.open(Storage.from_url(url), stream)
        error = await outcome(write())
        assert isinstance(error, ActorUnavailable) and isinstance(error.__cause__, Fenced), error
        assert isinstance(await outcome(actor.ready()), ActorUnavailable)
        await asyncio.sleep(ActorShell.STOP_EXIT_S + 0.1)
        assert exits == [EXIT_CODE]
        fresh, _stream, _write = await make(url)  # Ray's next incarnation recovers from the ledger
        assert (await fresh.ready())["incarnation"] > successor.incarnation

    run(main())


def test_a_loop_that_fails_stops_the_incarnation_and_a_cancelled_one_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A subscription whose read loop met corrupt data answered every call and delivered nothing,
    for ever. Now the incarnation stops (calls get ActorUnavailable, the process ends, Ray
    restarts it); a loop cancelled at passivation stops nothing."""
    from raytxn.protocol.subscription_state import SubscriptionState

    async def main() -> None:
        url = memory_url()
        part = PartitionBuffer("t", 0, url)
        sub = Subscription("t", 0, "s", "earliest", url, actor_refs=lambda _name, _token: LocalRef(part))
        exits: list[int] = []
        sub.exit_process = exits.append
        await sub.ready()
        sub._tasks[2].cancel()  # the stale-txn loop, as a passivation ends it
        await asyncio.sleep(0.05)
        assert await sub.ready() and exits == []

        def corrupt(*_args: Any, **_kwargs: Any) -> int:
            raise CorruptLedger("an entry no reader can take", "t/0")

        monkeypatch.setattr(SubscriptionState, "on_read", corrupt)
        await sub.subscribe("c", "c", "Exclusive")
        await part.append("p", 0, [encode_message(MessageRecord(b"m"))])
        await asyncio.sleep(ActorShell.STOP_EXIT_S + 0.3)
        assert exits == [EXIT_CODE]
        assert isinstance(await outcome(sub.fetch("c", 1)), ActorUnavailable)
        assert "read loop" in sub.info["failed_loops"][0]

    run(main())


# --- replay ----------------------------------------------------------------------------------


def test_replay_applies_every_entry_from_the_trim_point_in_bounded_chunks() -> None:
    async def main() -> None:
        storage = Storage.from_url(memory_url())
        ledger = await ManagedLedger.open(storage, "t/replay", LedgerConfig(max_entries_per_ledger=4))
        positions = [await ledger.append([f"e{i}".encode()]) for i in range(11)]  # over three ledgers
        await ledger.trim(positions[2])
        reads: list[int] = []
        read = ledger.read

        async def counted(*args: Any, **kwargs: Any) -> Any:
            entries = await read(*args, **kwargs)
            reads.append(len(entries))
            return entries

        ledger.read = counted  # type: ignore[method-assign]
        seen: list[tuple[Position, bytes]] = []
        applied = await replay(ledger, lambda e: seen.append((e.position, e.records[0])), chunk_entries=3)
        assert seen == [(p, f"e{i}".encode()) for i, p in enumerate(positions)][2:]
        assert applied == 9 and max(reads) <= 3
        later: list[Position] = []
        assert await replay(ledger, lambda e: later.append(e.position), positions[7]) == 4
        assert later == positions[7:]

    run(main())


def test_coordinator_replay_starts_over_at_the_newest_checkpoint() -> None:
    """A crash between a compaction's checkpoint and its trim leaves older entries in the log:
    replay must not apply them on top of the checkpoint."""

    async def main() -> None:
        url = memory_url()
        ledger = await ManagedLedger.open(Storage.from_url(url), log_stream(0))
        state = CoordinatorState(0)
        first = state.prepare_new_txn(1_000, 60_000, "alice", None, None)
        state.apply(first)
        await ledger.append([encode_record(first)])
        await ledger.append([encode_record(r) for r in state.compacted_records()])
        second = state.prepare_new_txn(2_000, 60_000, "bob", None, None)
        state.apply(second)
        await ledger.append([encode_record(second)])
        tc = TransactionCoordinator(0, url, clock=ManualClock(3_000))
        assert (await tc.ready())["replayed_entries"] == 2  # the checkpoint and what followed
        assert (await tc.get_txn(first.txn))["owner"] == "alice"
        assert (await tc.get_txn(second.txn))["owner"] == "bob"
        assert (await tc.new_txn(60_000, "carol")).sequence > second.txn.sequence

    run(main())


# --- the clock -------------------------------------------------------------------------------


def test_actors_take_time_from_the_injected_clock() -> None:
    async def main() -> None:
        url = memory_url()
        clock = ManualClock(5_000_000)
        tc = TransactionCoordinator(0, url, clock=clock)
        txn = await tc.new_txn(1_000, "alice")
        assert (await tc.get_txn(txn))["start_ms"] == 5_000_000
        await asyncio.sleep(1.2)  # past the timeout on the wall clock: nothing happens
        assert (await tc.get_txn(txn))["state"] == "OPEN"
        clock.now += 1_001  # past it on the actor's clock: the timer aborts it
        for _ in range(200):
            if (await tc.get_txn(txn))["state"] == "ABORTED":
                break
            await asyncio.sleep(0.01)
        assert (await tc.get_txn(txn))["state"] == "ABORTED"

        part = PartitionBuffer("t", 0, url, clock=clock)
        await part.append("p", 0, [encode_message(MessageRecord(b"m"))])
        [(_position, records)] = (await part.read(Position(0, 0)))["entries"]
        assert decode_header(records[0]).publish_time_ms == clock.now

    run(main())


class Idler(Probe):
    """A probe with guarded calls (traffic), blockers to set and a slow final persist."""

    def __init__(self) -> None:
        super().__init__()
        self.blockers: list[str] = []
        self.persists = 0
        self.during_persist: Callable[[], Awaitable[Any]] | None = None

    def _passivation_blockers(self) -> list[str]:
        return list(self.blockers)

    async def _before_passivate(self) -> None:
        self.persists += 1
        if self.during_persist is not None:
            await self.during_persist()

    @guarded(Access.PUBLIC)
    async def work(self, hold_s: float = 0.0) -> str:
        await self._started()
        await asyncio.sleep(hold_s)
        return "done"


def test_passivation_needs_idleness_and_no_blocker_and_a_quiet_persist() -> None:
    async def scenario() -> None:
        actor = Idler()
        clock = actor.clock
        assert isinstance(clock, ManualClock)
        await actor.work()
        assert (await actor.passivate(5.0))["why"] == ["idle 0.0s < 5.0s"]
        clock.now += 6000
        assert actor.idle_s() == 6.0
        in_flight = asyncio.ensure_future(actor.work(hold_s=0.05))
        await asyncio.sleep(0.01)
        assert actor.idle_s() == 0.0  # a call being served is traffic
        assert not (await actor.passivate(5.0))["passivated"]
        await in_flight
        clock.now += 6000
        actor.blockers = ["2 open txns"]
        assert (await actor.passivate(5.0))["why"] == ["2 open txns"]
        actor.blockers = []

        async def call_meanwhile() -> None:
            await actor.work()

        actor.during_persist = call_meanwhile
        assert (await actor.passivate(5.0))["why"] == ["idle 0.0s < 5.0s", "a call came in meanwhile"]
        actor.during_persist = None
        clock.now += 6000
        assert await actor.passivate(5.0) == {"passivated": True, "why": []}
        assert actor.persists == 2  # one refused after it (the call meanwhile), one kept
        assert isinstance(await outcome(actor.work()), ActorUnavailable)  # callers retry: activation
        assert actor.exits == []  # the supervisor kills it; it ends itself only PASSIVATED_EXIT_S later

    run(scenario())


def test_the_watcher_probes_live_actors_in_turn_under_its_budget() -> None:
    """Two probes per round over five actors: the least recently probed go first, so every
    actor is probed within three rounds and none twice before all were probed once."""
    probed_at: dict[str, float] = {"a": 5.0}  # "a" was probed; the others never were
    names = ["a", "b", "c", "d", "e"]
    rounds = []
    for now in (10.0, 11.0, 12.0):
        due = probes_due(names, probed_at, 2)
        rounds.append(due)
        probed_at.update(dict.fromkeys(due, now))
    assert rounds[0] == ["b", "c"]  # never probed first, in the order given
    assert sorted(rounds[0] + rounds[1] + [rounds[2][0]]) == names  # all five within three rounds
    assert probes_due(names, probed_at, 10) == sorted(names, key=probed_at.__getitem__)  # under budget: all


def test_engine_actors_record_no_ray_task_events_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from raytxn.actors.coordinator import CoordinatorActor
    from raytxn.actors.host import ActorHostActor
    from raytxn.actors.partition import PartitionActor
    from raytxn.actors.subscription import SubscriptionActor

    for actor_class in (PartitionActor, SubscriptionActor, CoordinatorActor, ActorHostActor):
        options = actor_class._default_options
        assert options["enable_task_events"] is False, actor_class
        assert (options["max_restarts"], options["max_task_retries"], options["num_cpus"]) == (-1, 0, 0)
    monkeypatch.setenv("RAYTXN_TASK_EVENTS", "1")
    assert ray_actor_options(10)["enable_task_events"] is True
