"""Appends in flight (a producer's ``max_in_flight`` > 1) against the pure partition state: the
sequence rule of ``raytxn.protocol.txn_buffer`` plus the producer's resend protocol
(``raytxn.client.producer``) keep every producer's entries in order and stored once, whatever
the arrival order, duplicates, lost requests, lost replies and partition restarts.

The producers here follow the real producer's protocol step by step: batches numbered
contiguously in send order; each names the last sequence of the batch before it that is not
acknowledged yet (``previous_sequence``, -1 if none); after any failure, nothing new goes until
every request in flight has its answer, then the failed batches are resent one at a time,
oldest first, with ``previous_sequence`` -1. The network is the adversary: it delivers any
request in flight next, or twice, or loses it or its reply."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raytxn.errors import InvalidArgument, OutOfOrderSequence
from raytxn.ids import EARLIEST, Position
from raytxn.protocol.entry_format import EntryHeader
from raytxn.protocol.txn_buffer import TransactionBuffer

WINDOW = 3
PRODUCERS = ("a", "b")


@dataclass
class Request:
    producer: str
    batch: int  # index in the producer's stream
    first: int
    last: int
    previous: int


@dataclass
class Producer:
    """The real producer's per-partition sender, reduced to its sequence bookkeeping."""

    name: str
    sizes: list[int]
    firsts: list[int] = field(default_factory=list)
    sent: int = 0  # batches numbered and sent so far
    window: list[int] = field(default_factory=list)  # batches in flight, in sequence order
    failed: set[int] = field(default_factory=set)  # in the window, answered with an error
    outstanding: dict[int, int] = field(default_factory=dict)  # batch -> its requests not answered yet
    acked: set[int] = field(default_factory=set)
    abandoned: set[int] = field(default_factory=set)
    recovering: bool = False

    def __post_init__(self) -> None:
        first = 0
        for size in self.sizes:
            self.firsts.append(first)
            first += size

    def request(self, batch: int, previous: int) -> Request:
        self.outstanding[batch] = self.outstanding.get(batch, 0) + 1
        return Request(self.name, batch, self.firsts[batch], self.firsts[batch] + self.sizes[batch] - 1, previous)

    def next_request(self) -> Request | None:
        """What the sender sends next, if anything: a new batch while the window has room and
        nothing failed; in recovery, the oldest failed batch once every answer is in."""
        if self.recovering:
            if any(self.outstanding.get(b) for b in self.window) or not self.window:
                return None
            batch = self.window[0]
            return self.request(batch, -1)
        if self.sent == len(self.sizes) or len(self.window) >= WINDOW:
            return None
        batch = self.sent
        self.sent += 1
        previous = self.firsts[self.window[-1]] + self.sizes[self.window[-1]] - 1 if self.window else -1
        self.window.append(batch)
        return self.request(batch, previous)

    def answered(self, batch: int, ok: bool) -> None:
        self.outstanding[batch] -= 1
        if batch not in self.window:
            return  # an answer to a copy of a batch already settled
        if ok:
            self.acked.add(batch)
            self.failed.discard(batch)
            self.window.remove(batch)
        else:
            self.failed.add(batch)
            self.recovering = True
        if self.recovering and not self.failed.intersection(self.window):
            self.recovering = False

    def give_up(self) -> None:
        """The oldest failed batch passed its send timeout in recovery: it fails for good."""
        if self.recovering and self.window and not any(self.outstanding.get(b) for b in self.window):
            batch = self.window.pop(0)
            self.failed.discard(batch)
            self.abandoned.add(batch)
            if not self.window:
                self.recovering = False


class Partition:
    """prepare -> ledger -> apply, with appends written but applied (durable) only on ``sync``;
    a reply goes out only once its entry is durable, as the actor answers."""

    def __init__(self) -> None:
        self.buffer = TransactionBuffer()
        self.ledger: list[tuple[Position, EntryHeader]] = []
        self.ledger_id = 0
        self.unsynced: list[tuple[Position, EntryHeader, Request]] = []

    def receive(self, request: Request) -> tuple[str, Request]:
        header = EntryHeader("data", None, request.producer, request.first, request.last,
                             request.last - request.first + 1, 0)
        try:
            decision = self.buffer.prepare_append(header, request.previous)
        except OutOfOrderSequence:
            return "error", request
        if decision.duplicate:
            return ("error" if decision.in_flight else "ok"), request  # in flight: the actor waits; here, a timeout
        position = Position(self.ledger_id, len([p for p, _ in self.ledger if p.ledger_id == self.ledger_id])
                            + len(self.unsynced))
        self.unsynced.append((position, header, request))
        return "pending", request

    def sync(self) -> list[Request]:
        done = []
        for position, header, request in self.unsynced:
            self.buffer.apply(header, position)
            self.ledger.append((position, header))
            done.append(request)
        self.unsynced.clear()
        return done

    def crash(self) -> list[Request]:
        """Unsynced entries never became durable; the new incarnation replays the ledger and
        writes to a new ledger."""
        lost = [request for _, _, request in self.unsynced]
        self.unsynced.clear()
        self.buffer = TransactionBuffer()
        for position, header in self.ledger:
            self.buffer.apply(header, position)
        self.ledger_id += 1
        return lost


OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(PRODUCERS)),
    st.tuples(st.just("deliver"), st.integers(0, 10)),
    st.tuples(st.just("deliver"), st.integers(0, 10)),
    st.tuples(st.just("duplicate"), st.integers(0, 10)),
    st.tuples(st.just("lose_request"), st.integers(0, 10)),
    st.tuples(st.just("lose_reply"), st.integers(0, 10)),
    st.tuples(st.just("sync"),),
    st.tuples(st.just("crash"),),
    st.tuples(st.just("give_up"), st.sampled_from(PRODUCERS)),
), min_size=10, max_size=80)


def check_ledger(partition: Partition, producers: dict[str, Producer]) -> None:
    """Each producer's entries: in sequence order, no sequence twice, each one of its batches."""
    last = dict.fromkeys(producers, -1)
    for _, header in partition.ledger:
        producer = producers[header.producer]
        assert header.first_sequence > last[header.producer], "stored out of order, or twice"
        batch = producer.firsts.index(header.first_sequence)
        assert header.last_sequence == header.first_sequence + producer.sizes[batch] - 1
        last[header.producer] = header.last_sequence
    positions = [p for p, _ in partition.ledger]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def stored_batches(partition: Partition, producer: Producer) -> list[int]:
    return [producer.firsts.index(h.first_sequence) for _, h in partition.ledger if h.producer == producer.name]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 4), min_size=1, max_size=12), st.lists(st.integers(1, 4), min_size=1, max_size=12),
       OPS)
def test_appends_in_flight_keep_order_and_dedup(sizes_a: list[int], sizes_b: list[int], ops: list[tuple]) -> None:
    producers = {"a": Producer("a", sizes_a), "b": Producer("b", sizes_b)}
    partition = Partition()
    network: list[Request] = []  # requests in flight, in the order sent
    awaiting_sync: list[Request] = []  # prepared and written, answered once durable
    lost_replies: set[int] = set()  # ids of requests whose reply the network will drop

    def answer(request: Request, ok: bool) -> None:
        if id(request) in lost_replies:
            lost_replies.discard(id(request))
            ok = False  # the producer sees a retriable failure (the actor "died" before answering)
        producers[request.producer].answered(request.batch, ok)

    def deliver(request: Request) -> None:
        outcome, _ = partition.receive(request)
        if outcome == "pending":
            awaiting_sync.append(request)
        else:
            answer(request, outcome == "ok")

    def pick(index: int) -> Request | None:
        return network.pop(index % len(network)) if network else None

    for op in ops:
        kind = op[0]
        if kind == "send":
            request = producers[op[1]].next_request()
            if request is not None:
                network.append(request)
        elif kind == "deliver" and (request := pick(op[1])):
            deliver(request)
        elif kind == "duplicate" and network:  # a copy arrives now, the original later
            original = network[op[1] % len(network)]
            copy = producers[original.producer].request(original.batch, original.previous)
            deliver(copy)
        elif kind == "lose_request" and (request := pick(op[1])):
            answer(request, False)
        elif kind == "lose_reply" and network:
            lost_replies.add(id(network[op[1] % len(network)]))
        elif kind == "sync":
            durable = partition.sync()
            for request in durable:
                awaiting_sync.remove(request)
                answer(request, True)
        elif kind == "crash":
            for request in partition.crash():
                awaiting_sync.remove(request)
                answer(request, False)
        elif kind == "give_up":
            producers[op[1]].give_up()
        check_ledger(partition, producers)
        for producer in producers.values():
            assert producer.acked <= set(stored_batches(partition, producer)), "an acknowledged batch is not stored"

    # Drain: the network settles, and each producer sends (and resends) until done.
    for _ in range(10_000):
        if network:
            deliver(network.pop(0))
        elif awaiting_sync:
            for request in partition.sync():
                awaiting_sync.remove(request)
                answer(request, True)
        else:
            requests = [r for p in producers.values() if (r := p.next_request()) is not None]
            if not requests:
                break
            network += requests
    check_ledger(partition, producers)
    for producer in producers.values():
        stored = stored_batches(partition, producer)
        assert not producer.window and producer.sent == len(producer.sizes)
        assert producer.acked | producer.abandoned == set(range(len(producer.sizes)))
        assert producer.acked <= set(stored)  # nothing acknowledged is lost
        assert stored == sorted(stored)  # in send order (a given-up batch may have landed: in its place)


def test_a_batch_ahead_of_its_predecessor_is_refused_and_changes_nothing() -> None:
    buffer = TransactionBuffer()
    second = EntryHeader("data", None, "p", 3, 5, 3, 0)
    with pytest.raises(OutOfOrderSequence):
        buffer.prepare_append(second, previous_sequence=2)
    assert buffer.dedup_position("p") is None and buffer.snapshot() == TransactionBuffer().snapshot()
    assert buffer.prepare_append(EntryHeader("data", None, "p", 0, 2, 3, 0), -1).status == "ok"
    assert buffer.prepare_append(second, previous_sequence=2).status == "ok"  # its predecessor is prepared
    buffer.apply(EntryHeader("data", None, "p", 0, 2, 3, 0), Position(0, 0))
    buffer.apply(second, Position(0, 1))
    # A gap is fine when the batch follows nothing unacknowledged (a failed batch's range skipped).
    assert buffer.prepare_append(EntryHeader("data", None, "p", 9, 9, 1, 0), -1).status == "ok"
    with pytest.raises(InvalidArgument):
        buffer.prepare_append(EntryHeader("data", None, "p", 12, 12, 1, 0), previous_sequence=12)
    assert buffer.last_position != EARLIEST
