"""Pipelined producers (``Workload.pipelined_producers``; the "pipelined" profile): the real
client ``Producer`` class, with several appends in flight per partition (``max_in_flight`` > 1),
on the simulated network, and its client process crashing now and then.

Each producer ``pp<i>`` sends keyed messages ``pp<i>-<n>`` (n counting up over the producer's
whole life) in bursts through ``send_async``. The real sender numbers its batches, names with
each append the batch it follows (``previous_sequence``), and resends in order after any failure;
the simulated network delays, reorders, drops and duplicates those calls, so partitions refuse
batches that overtook their predecessor (``OutOfOrderSequence``) and see retries of batches
already stored.

A *client crash* ends the producer's process: every task of it is cancelled (its appends already
sent stay in flight, as a dead caller's calls do), the messages whose futures had not resolved
are recorded as failed sends (they may or may not be stored), and a new producer with the same
name starts after a restart delay, in a new producer epoch of that name at every partition, which
fences the dead incarnation's appends still in the network (what ``Producer.__init__`` does for a
named producer).

What must hold (``violations``, part of every run of a workload with pipelined producers, on
top of the exactly-once checker which sees every send and its outcome):

- no send fails for good: every fault is retriable and ends with the fault window, long before
  the producer's send timeout. One exception: ``Fenced``, which only the zombie-appends profile
  can cause (an incarnation that died while starting has its init_producer arrive after its
  successor's, and so fences the successor); the fenced incarnation stops and a new one starts,
  as an application answers Kafka's ProducerFencedException, and its failed sends count as
  maybe stored;
- every message whose send future resolved without an error is in the final drain of the output's
  verify subscription, exactly once (also when its position came back unknown, which the checker
  cannot follow);
- per producer and partition, its messages stand in the drain (which reads in position order) in
  the order they were handed to ``send_async``: nothing was stored out of order.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from raytxn.client.producer import Producer
from raytxn.errors import Fenced
from raytxn.hashing import partition_for
from raytxn.ids import partition_actor_name
from raytxn.tools.history import FinalState, History

if TYPE_CHECKING:
    from raytxn.sim.driver import Driver

MAX_IN_FLIGHT = 5
BATCH_MESSAGES = 3          # small batches: many of them in flight at once
BURST = (1, 12)             # messages handed over at once
PAUSE_S = (0.0, 0.1)        # between bursts
KEYS = 6                    # keys per producer (routed by murmur2 over the partitions)
SEND_TIMEOUT_S = 30.0       # the producer's retry limit for a batch
CRASH_AFTER_S = (0.005, 1.0)  # a crash lands this long after the incarnation's start
RESTART_S = (0.01, 0.5)     # a crashed client's successor starts after this
SETTLE_S = 120.0            # an incarnation waits at most this for its futures at its end


class ClientProcess:
    """The owner of a producer's tasks in the simulated loop (one per incarnation): a crash
    cancels them all, as a dead process's."""

    def __init__(self, label: str) -> None:
        self.label = label


class _Loop:
    """What ``Producer`` uses of the client's loop thread, on the simulator's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def call_soon(self, callback: Any, *args: Any) -> None:
        self._loop.call_soon(callback, *args)

    def in_loop(self) -> bool:
        return True

    def run(self, coro: Any) -> Any:
        raise RuntimeError("blocking calls cannot run in the simulator")


class _Client:
    token = None

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = _Loop(loop)


def uid_of(index: int, n: int) -> str:
    return f"pp{index}-{n}"


async def pipelined_producer(d: Driver, index: int, topic: str, messages: int) -> None:
    """Producer ``pp<index>``: ``messages`` messages to ``topic``, over as many client
    incarnations as its crashes make."""
    name = f"pp{index}"
    loop = d.world.loop
    sent = 0
    incarnation = 0
    while sent < messages:
        incarnation += 1
        process = ClientProcess(f"{name}-client#{incarnation}")
        state = _Incarnation(d, index, name, topic, sent, messages)
        task = loop.spawn(process, state.run())
        crash = d.rng.random() < d.w.client_crash and d.quiet_since is None
        crash_after = d.rng.uniform(*CRASH_AFTER_S)
        if crash:
            done, _ = await asyncio.wait([task], timeout=crash_after)
            if not done:
                d.world.trace.add("client_crash", process.label, state.next_n)
                loop.kill_owner(process)
                await asyncio.gather(task, return_exceptions=True)
                state.crashed()
                sent = state.next_n
                at_once = bool(d.w.client_restart_at_once) and d.rng.random() < d.w.client_restart_at_once
                if not at_once:  # (no draw when the workload never restarts at once: traces stay as they were)
                    await asyncio.sleep(d.rng.uniform(*RESTART_S))
                continue
        await task
        sent = state.next_n


class _Incarnation:
    def __init__(self, d: Driver, index: int, name: str, topic: str, first_n: int, end_n: int) -> None:
        self.d = d
        self.index = index
        self.name = name
        self.topic = topic
        self.next_n = first_n
        self.end_n = end_n
        self.unsettled: dict[str, None] = {}  # uids handed over whose futures have not resolved
        # A send failed ``Fenced``: a newer incarnation of the name exists at some partition (the
        # late init_producer of an incarnation that died while starting, zombie-appends). The
        # application's answer, as to Kafka's ProducerFencedException: stop, and start anew.
        self.fenced = False

    async def run(self) -> None:
        d = self.d
        producer = Producer(_Client(d.world.loop), self.topic, d.w.partitions,  # type: ignore[arg-type]
                            batching_max_messages=BATCH_MESSAGES, send_timeout_s=SEND_TIMEOUT_S,
                            max_in_flight=MAX_IN_FLIGHT)
        # As Producer.__init__ does for a named producer (its own call blocks): a new epoch of the
        # name at every partition, which fences the appends of the incarnations before it.
        producer.producer_name = self.name
        producer._refs = [d.world.network.ref(partition_actor_name(self.topic, p)) for p in range(d.w.partitions)]
        producer._epochs, producer._next_sequence = await producer._init_epochs()
        d.world.trace.add("producer_start", self.name, *producer._epochs, *producer._next_sequence)
        while self.next_n < self.end_n and not self.fenced:
            for _ in range(min(d.rng.randint(*BURST), self.end_n - self.next_n)):
                self._send(producer)
            await asyncio.sleep(d.rng.uniform(*PAUSE_S))
        deadline = d.now() + SETTLE_S
        while self.unsettled and d.now() < deadline:
            await asyncio.sleep(0.05)

    def _send(self, producer: Producer) -> None:
        d = self.d
        n = self.next_n
        self.next_n += 1
        uid = uid_of(self.index, n)
        key = f"k{self.index}.{d.rng.randrange(KEYS)}"
        partition = partition_for(key, d.w.partitions)
        d.history.send(uid, self.topic, partition, None, self.name, d.now())
        self.unsettled[uid] = None
        future = producer.send_async(uid.encode(), key=key)
        future.add_done_callback(lambda f, uid=uid: self._settled(uid, f))

    def _settled(self, uid: str, future: Any) -> None:
        if uid not in self.unsettled:
            return  # crashed first: recorded as failed then
        del self.unsettled[uid]
        d = self.d
        error = future.exception()
        if isinstance(error, Fenced):  # may or may not be stored (an earlier attempt may have landed)
            if not self.fenced:
                d.world.trace.add("producer_fenced", self.name, uid)
            self.fenced = True
            d.counts.error(error)
            d.history.send_failed(uid, error, d.now(), producer=self.name)
            return
        if error is not None:
            d.counts.error(error)
            d.pipelined_failed.append(f"{uid}: {error!r}")
            d.history.send_failed(uid, error, d.now(), producer=self.name)
            return
        mid = future.result()
        d.pipelined_acked.append(uid)
        if mid.ledger_id < 0:  # a duplicate acknowledged for a batch not the producer's latest
            d.history.send_failed(uid, "PositionUnknown", d.now(), producer=self.name)
        else:
            d.history.send_ok(uid, mid, d.now(), producer=self.name)

    def crashed(self) -> None:
        """The process died: what had no outcome may or may not be stored."""
        for uid in self.unsettled:
            self.d.history.send_failed(uid, "client crashed", self.d.now(), producer=self.name)
        self.unsettled.clear()


def violations(history: History, topic: str, subscription: str, acked: list[str], failed: list[str]) -> list[str]:
    """What the module docstring says must hold, broken (empty: nothing)."""
    drained: list[tuple[int, str]] = []
    for event in history.events:
        if isinstance(event, FinalState) and event.subscription == subscription and event.topic == topic:
            drained.extend((m.partition, m.msg_uid) for m in event.messages if m.msg_uid.startswith("pp"))
    found: list[str] = []
    if failed:
        found.append(f"failed: {len(failed)} pipelined sends failed for good: {failed[:3]}")
    counts: dict[str, int] = defaultdict(int)
    for _, uid in drained:
        counts[uid] += 1
    missing = [uid for uid in acked if counts[uid] == 0]
    if missing:
        found.append(f"lost: {len(missing)} acknowledged pipelined sends not stored: {missing[:5]}")
    twice = sorted(uid for uid, count in counts.items() if count > 1)
    if twice:
        found.append(f"duplicate: {len(twice)} pipelined sends stored more than once: {twice[:5]}")
    last: dict[tuple[str, int], int] = {}
    for partition, uid in drained:
        producer, _, n = uid.rpartition("-")
        stream = (producer, partition)
        if stream in last and int(n) <= last[stream]:
            found.append(f"order: {uid} stored after {producer}-{last[stream]} on partition {partition}")
            break
        last[stream] = int(n)
    return found
