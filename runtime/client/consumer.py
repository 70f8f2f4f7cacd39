"""Consumers: ``client.subscribe(topic, subscription, ...)``, over every partition of the topic.

Each partition has a subscription actor ``sub-<topic>-<p>-<subscription>``. The consumer attaches
to all of them and runs one fetch loop per partition on the client's background loop: it
long-polls the actor for as many messages as that partition's receiver queue has room for - its
permits - and asks again once half of them were received. Messages of one partition arrive in
order; ``receive`` takes them from one queue.

A partition's queue holds up to ``receiver_queue_size`` messages (20,000 by default) and, by
their average encoded size so far, about ``receiver_queue_bytes`` (8 MiB); until the first
messages came it asks for at most ``FIRST_FETCH_MESSAGES``. Pulsar's default queue is 1,000
messages, refilled at half. Here a refill is a Ray round trip, and its reply is handled by the
client's loop thread, which shares the GIL with a busy receiving thread (a thread waiting for the
GIL gets it after up to 5 ms, Python's switch interval): the half queue left must outlast that.
With 1,000, a consumer receiving and acking at full speed waited for messages about 40% of the
time (py-spy), and plain and transactional consume ran 15-19% and 40-55% below what 4,000 gave;
with 5,000 it still waited 42-47% of the time, and 20,000 gave plain consume 1.49 and pipelined
transactional consume 1.77 times what 5,000 did (medians of 4 interleaved rounds). The byte
bound keeps large messages from making the queue large: 20,000 small messages (2 MiB of 100 B
ones) stay under the 8 MiB a queue of large ones could already hold.

Acks are grouped per partition and transaction, like Pulsar's ack grouping (plain ones are sent
within ``ACK_GROUP_DELAY_S``); a group goes as ranges of whole entries and runs of batch indexes
of the rest, not as a tuple per message (``raytxn.client.ack_spans``). Plain acks return at once. An ack in a
transaction registers the subscription with the coordinator (once per txn and partition) and is
tracked by the transaction (commit waits for it, and aborts if it failed); ``acknowledge`` with a
txn waits until the ack is logged, so a conflict raises right there, while ``acknowledge_async``
returns a future, and its ack goes with the txn's others when the txn commits (or once their
group is ``TXN_ACK_GROUP_DELAY_S`` old): one call, one durable put in the subscription's
pending-ack log per txn, as Kafka sends a txn's offsets once. Each group goes in one call with a
request id, which the subscription logs: a retry of that call (its reply lost, the actor
restarted) succeeds, while a new call repeating a txn's cumulative ack is a conflict, as in Pulsar.

Ack timeouts and negative acks are tracked here, as Pulsar's client does: when one is due, the
consumer asks the actor to redeliver those messages (to whichever consumer should get them).

Every fetch reply carries the actor's generation (incarnation, seeks). When it moves on, the
messages prefetched under the older one are dropped (the actor delivers them again); when the
actor does not know this consumer (it restarted, or dropped it as idle), the consumer attaches
again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytxn.client.ack_spans import AckSpan, HeldBatch, coalesce_spans, extend_spans, whole_entry_span
from raytxn.client.batch import MessageBatch, Run, build_table
from raytxn.client.message import Message, MessageId
from raytxn.client.rpc import ActorRef
from raytxn.client.transaction import Transaction
from raytxn.config import RECEIVER_QUEUE_BYTES, RECEIVER_QUEUE_SIZE
from raytxn.errors import InvalidArgument, NotAllowed, Timeout
from raytxn.ids import Position, subscription_actor_name
from raytxn.protocol.dispatch import ConsumerType
from raytxn.protocol.subscription_state import AckRange, IndexRun, WireEntry

if TYPE_CHECKING:
    from raytxn.client.client import Client

__all__ = ["Consumer", "ConsumerType", "InitialPosition", "MessageBatch"]

log = logging.getLogger(__name__)

FETCH_WAIT_S = 5.0        # a fetch long-polls the actor this long
PING_INTERVAL_S = 0.5     # a consumer whose queue is full still shows it is alive this often
FIRST_FETCH_MESSAGES = 1000  # asked for before any message told their size
# Plain acks wait this long for company.
ACK_GROUP_DELAY_S = 0.02
# A txn's acks go when it commits, as Kafka sends a txn's offsets once, just before EndTxn, or once
# their group is this old (so a caller waiting on an ack's future is answered without a commit).
# Each ack call in a txn is a durable put to the subscription's pending-ack log, made under its
# lock. Sent every 5 ms, as they were, a 100 ms txn made about six, which queued there: a commit
# waited 13-21 ms for its last acks (p50), and one call at commit took about as long as all of them.
# Held, consume waiting for each commit went from 0.81 to 0.87 of plain, and pipelined from 0.92
# to 1.02 (medians of 5 interleaved rounds of 300k, /tmp/s46/holdab2.py).
TXN_ACK_GROUP_DELAY_S = 0.2
# A group is sent at once when it holds this many acks. Individual acks in order coalesce into a
# range or two, so a big group costs the subscription no more than a small one, and the delay
# above still bounds what a crash can leave unsent. 1,000 (Pulsar's maxAcknowledgmentGroupSize)
# meant an ack call every 1,000 messages, about a quarter of the subscription's calls under plain
# consume (with two fetches and one partition read per 1,000).
ACK_GROUP_MAX = 5000
REMEMBERED_BATCH_SIZES = 100_000  # entries whose batch size acks by MessageId can look up


class InitialPosition(enum.StrEnum):
    """Where a new subscription starts: after everything published so far, or at the beginning."""

    Latest = "latest"
    Earliest = "earliest"


@dataclass
class _Feed:
    """One partition's subscription actor and what this consumer holds of it."""

    partition: int
    ref: ActorRef
    generation: tuple[int, int] = (0, 0)
    queued: int = 0             # messages of this partition in the receive queue
    capacity: int = 1           # messages the queue may hold, by count and average size
    low_water: int = 0          # refill once ``queued`` is down to this: half the capacity
    waiting: bool = False       # the fetch loop waits for room
    signalled: bool = False     # ... and was told there is some
    room: asyncio.Event = field(default_factory=asyncio.Event)
    attaching: asyncio.Future | None = None  # a re-attach in flight (close waits for it)

    def resize(self, capacity: int) -> None:
        """Under the consumer's queue lock once receives may run: ``receive`` compares ``queued``
        with ``low_water`` under it, to tell the fetch loop there is room."""
        self.capacity = capacity
        self.low_water = capacity // 2


@dataclass
class _AckGroup:
    txn: Transaction | None
    # Individual acks: spans of indexes (raytxn.client.ack_spans); a cumulative ack: one
    # (position, batch index, batch size). Either way what is sent as ``acks`` once coalesced.
    acks: list = field(default_factory=list)
    count: int = 0  # acks queued in it (an in-order run of them is one span)
    ranges: list[AckRange] = field(default_factory=list)  # whole entries (set when the group is sent)
    runs: list[IndexRun] = field(default_factory=list)    # batch indexes (set when the group is sent)
    # Names the one ack call this group becomes: the subscription knows a retry of it by this.
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    futures: list[concurrent.futures.Future] = field(default_factory=list)
    # Resolved with the group: what the txn tracks (one future per group, not per ack).
    sent: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


def check_receiver_queue(receiver_queue_size: object, receiver_queue_bytes: object) -> None:
    """``InvalidArgument`` unless both bounds of a receive queue are ints >= 1."""
    for name, value in (("receiver_queue_size", receiver_queue_size), ("receiver_queue_bytes", receiver_queue_bytes)):
        if type(value) is not int or value < 1:
            raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")


class Consumer:
    def __init__(self, client: Client, topic: str, subscription: str, partitions: int,
                 consumer_type: ConsumerType | str = ConsumerType.Exclusive, consumer_name: str | None = None,
                 receiver_queue_size: int = RECEIVER_QUEUE_SIZE, ack_timeout_s: float | None = None,
                 negative_ack_redelivery_delay_s: float = 1.0,
                 receiver_queue_bytes: int = RECEIVER_QUEUE_BYTES, read_compacted: bool = False) -> None:
        check_receiver_queue(receiver_queue_size, receiver_queue_bytes)
        if ack_timeout_s is not None and ack_timeout_s <= 0:
            raise InvalidArgument(f"ack_timeout_s must be > 0 or None, got {ack_timeout_s!r}")
        if negative_ack_redelivery_delay_s < 0:
            raise InvalidArgument("negative_ack_redelivery_delay_s must be >= 0")
        try:
            self.consumer_type = ConsumerType(consumer_type)
        except ValueError:
            raise InvalidArgument(f"unknown consumer type {consumer_type!r}") from None
        self._client = client
        self.topic = topic
        self.subscription = subscription
        self.consumer_id = uuid.uuid4().hex
        self.consumer_name = consumer_name or f"consumer-{self.consumer_id[:12]}"
        self.receiver_queue_size = receiver_queue_size
        self.receiver_queue_bytes = receiver_queue_bytes
        self.ack_timeout_s = ack_timeout_s
        self.read_compacted = read_compacted
        self.negative_ack_redelivery_delay_s = negative_ack_redelivery_delay_s
        self._feeds = [_Feed(p, ActorRef(subscription_actor_name(topic, p, subscription), client.token))
                       for p in range(partitions)]
        for feed in self._feeds:
            feed.resize(min(receiver_queue_size, FIRST_FETCH_MESSAGES))
        self._queue: deque[tuple[_Feed, Run]] = deque()  # runs of messages of one entry, in order
        self._queued = 0  # messages in ``_queue``; the front run's first ``_front_taken`` are received
        self._front_taken = 0
        self._rewinds_seen = 0
        # Guards the queue and the feeds' counters. A plain lock under the condition: receive's
        # fast path takes it without the condition's Python-level enter and exit.
        self._queue_lock = threading.Lock()
        self._cond = threading.Condition(self._queue_lock)
        # Called once (under the lock) when messages are queued or the consumer closes: how an
        # asyncio receive (raytxn.aio) waits without a thread blocked on ``_cond``.
        self._watchers: list[Callable[[], None]] = []
        self._acks_lock = threading.Lock()      # guards everything below
        self._ack_groups: dict[tuple[int, Transaction | None, bool], _AckGroup] = {}
        self._held: dict[tuple[Transaction, int, Position], HeldBatch] = {}  # (txn, partition, entry)
        self._newest_held: HeldBatch | None = None  # the one an ack was last held in (_ack_in_txn)
        self._flush_due_in = math.inf  # the grouped acks are sent within this (a flush is scheduled)
        self._unacked: OrderedDict[MessageId, float] = OrderedDict()  # received -> ack deadline
        self._nacked: list[tuple[float, MessageId]] = []  # redeliver at
        self._batch_sizes: OrderedDict[tuple[int, Position], int] = OrderedDict()
        self._tasks: list[asyncio.Task] = []
        self._sending: set[asyncio.Task] = set()
        self._closed = False
        client.loop.run(self._attach_all())
        client.loop.run(self._start())

    def __repr__(self) -> str:
        return f"Consumer({self.topic}, {self.subscription}, {self.consumer_type}, {self.consumer_name})"

    # --- receiving -------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; waits up to ``timeout`` seconds (None: forever), then ``Timeout``."""
        with self._queue_lock:
            if self._queued and not self._closed:
                message = self._pop_locked()
            else:
                message = self._wait_and_pop_locked(timeout)
        if self.ack_timeout_s is not None:
            self._track_received([message])
        return message

    def _unwatch(self, watcher: Callable[[], None]) -> None:
        """Forget ``watcher`` if it was not called yet (an asyncio receive that timed out or was
        cancelled): the list stays as long as the receives waiting, not as their history."""
        with self._queue_lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def _wake_watchers_locked(self) -> None:
        watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            watcher()

    def _wait_and_pop_locked(self, timeout: float | None) -> Message:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._check_open()
        while not self._queued:
            self._check_open()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise Timeout(f"no message on {self.topic}/{self.subscription} within {timeout}s")
            self._cond.wait(remaining)
        return self._pop_locked()

    def receive_batch(self, max_messages: int = 10_000, timeout_s: float = 0.1) -> MessageBatch:
        """Up to ``max_messages`` messages as one ``MessageBatch``: an Arrow table (``.table``,
        columns value, key, properties, event_time, publish_time, partition, ledger_id, entry_id,
        batch_index, redelivery_count) and one ack handle (``.ack(txn=None)``). Returns as soon
        as any message is there, waiting up to ``timeout_s`` for the first (then possibly
        none); what is queued already is taken up to ``max_messages``. A receive queue of about
        four batches (``receiver_queue_size``) keeps the next ones coming while one is used."""
        if type(max_messages) is not int or max_messages < 1:
            raise InvalidArgument(f"max_messages must be an int >= 1, got {max_messages!r}")
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._check_open()
            while not self._queued:
                self._check_open()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            runs = self._take_runs_locked(max_messages)
        if self.ack_timeout_s is not None:
            self._track_received_runs(runs)
        return MessageBatch(self, runs, build_table(runs))

    def _take_runs_locked(self, max_messages: int) -> list[Run]:
        runs: list[Run] = []
        room = max_messages
        while room and self._queue:
            feed, run = self._queue[0]
            if self._front_taken:  # receive() took some of it: the rest is ours
                run = run.split(self._front_taken)[1]
                self._front_taken = 0
                self._queue[0] = (feed, run)
            count = len(run.indexes)
            if count > room:
                run, rest = run.split(room)
                self._queue[0] = (feed, rest)
                count = room
            else:
                self._queue.popleft()
            runs.append(run)
            room -= count
            self._queued -= count
            feed.queued -= count
            self._signal_room_locked(feed)
        return runs

    def batch_receive(self, max_messages: int = 100, timeout: float = 0.1) -> list[Message]:
        """Up to ``max_messages`` messages: returns when that many are there or ``timeout``
        seconds passed (then possibly none)."""
        if max_messages < 1:
            raise InvalidArgument(f"max_messages must be >= 1, got {max_messages!r}")
        deadline = time.monotonic() + timeout
        with self._cond:
            self._check_open()
            while self._queued < max_messages:
                self._check_open()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            messages = [self._pop_locked() for _ in range(min(max_messages, self._queued))]
        if self.ack_timeout_s is not None:
            self._track_received(messages)
        return messages

    def _pop_locked(self) -> Message:
        feed, run = self._queue[0]
        at = self._front_taken
        records = run.records
        if not isinstance(records, list):  # packed as it came: cut once, not indexed through per message
            records = run.records = records.to_list()
        message = Message(MessageId(self.topic, run.partition, run.ledger_id, run.entry_id, run.indexes[at]),
                          records[at], run.publish_time_ms, run.counts[at] if run.counts else 0, run.batch_size)
        if at + 1 == len(run.indexes):
            self._queue.popleft()
            self._front_taken = 0
        else:
            self._front_taken = at + 1
        self._queued -= 1
        feed.queued -= 1
        if feed.waiting:
            self._signal_room_locked(feed)
        return message

    def _signal_room_locked(self, feed: _Feed) -> None:
        if feed.waiting and not feed.signalled and feed.queued <= feed.low_water:
            feed.signalled = True
            self._client.loop.call_soon(feed.room.set)

    def _track_received(self, messages: list[Message]) -> None:
        """Start the messages' ack deadlines (``ack_timeout_s``)."""
        assert self.ack_timeout_s is not None
        deadline = time.monotonic() + self.ack_timeout_s
        with self._acks_lock:
            for message in messages:
                self._unacked[message.message_id()] = deadline

    def _track_received_runs(self, runs: list[Run]) -> None:
        assert self.ack_timeout_s is not None
        deadline = time.monotonic() + self.ack_timeout_s
        with self._acks_lock:
            for run in runs:
                for index in run.indexes:
                    self._unacked[MessageId(self.topic, run.partition, run.ledger_id, run.entry_id, index)] = deadline

    def _remember_batch_sizes(self, runs: list[tuple[_Feed, Run]]) -> None:
        """Remember the batch size of each delivered entry of several messages, once per entry:
        an ack by ``MessageId`` looks it up (a single message's acks without it)."""
        batched = [run for _, run in runs if run.batch_size > 1]
        if not batched:
            return
        with self._acks_lock:
            for run in batched:
                self._batch_sizes[(run.partition, run.position)] = run.batch_size
            while len(self._batch_sizes) > REMEMBERED_BATCH_SIZES:
                self._batch_sizes.popitem(last=False)

    def _check_open(self) -> None:
        if self._closed:
            raise NotAllowed(f"consumer {self.consumer_name} is closed")

    # --- acks ------------------------------------------------------------------------------

    def acknowledge(self, message: Message | MessageId, txn: Transaction | None = None) -> None:
        """Ack one message. Plain acks return at once (grouped, sent within milliseconds); with a
        ``txn`` this waits until the ack is in the subscription's pending-ack log and raises
        ``TransactionConflict`` / ``NotAllowed`` as the rules say."""
        if txn is None:
            self._ack_plain(message)
        else:
            self._ack(message, False, txn, wait=True)

    def acknowledge_async(self, message: Message | MessageId,
                          txn: Transaction | None = None) -> concurrent.futures.Future:
        """Ack one message; the future resolves once the subscription applied (or logged) it.
        (Plain acks of one group share one future.)

        In a txn, an ack of a message of a batch entry is held until the txn acked the whole
        entry (then one whole-entry ack goes) or commits, and its future resolves then: wait for
        it after ``txn.commit()``, not before (``acknowledge(message, txn)`` sends at once)."""
        if txn is None:
            return self._ack_plain(message)
        return self._ack_in_txn(message, txn)

    def _ack_in_txn_now(self, message: Message | MessageId, txn: Transaction) -> concurrent.futures.Future:
        """An ack in a txn sent at once, never held with its batch entry: for a caller that awaits
        it inside the txn (``raytxn.aio``). A held ack's future resolves when the commit sends it,
        and the commit waits for the caller, so awaiting a held ack waited for ever (a message of
        a batch entry acked in ``async with client.transaction()``)."""
        with txn.operation():
            return self._queue_ack(message, False, txn, send_now=True)

    def _ack_in_txn(self, message: Message | MessageId, txn: Transaction) -> concurrent.futures.Future:
        """An individual async ack in a txn, the hot path of consume-transform-produce: what
        ``with txn.operation():`` does (refused unless the txn is open; an error raised here makes
        it abort-only), without an object and two calls per ack.

        The hottest case goes without ``_queue_ack``'s calls and lookups: the next message, in
        index order, of the batch entry this consumer last held an ack of in the same txn, when it
        does not complete the entry. The held batch was made by ``_queue_ack`` for a message of the
        same topic, partition and entry, so the checks it made hold for this one too. An ack in a
        txn cost 1.06 us through ``_queue_ack``, and 0.60-0.62 here (a plain ack: 0.82-0.86), on the thread
        that also receives, whose share of the GIL sets the consume rate. The txn is tested as a
        producer's send tests it (``Producer._accumulate``): without a clock read."""
        if not txn.machine.sendable:
            txn.check_open()
        try:
            held = self._newest_held
            if held is not None and held.txn is txn and type(message) is Message:
                message_id = message._id
                if (message_id.entry_id == held.entry_id and message_id.ledger_id == held.ledger_id
                        and message_id.partition == held.partition and message_id.topic == self.topic):
                    with self._acks_lock:
                        if not self._closed and held.extend_run(message_id.batch_index):
                            if self._unacked:
                                self._unacked.pop(message_id, None)
                            return held.future
            return self._queue_ack(message, False, txn)
        except BaseException as error:
            txn.fail(error)
            raise

    def _ack_plain(self, message: Message | MessageId) -> concurrent.futures.Future:
        """A plain individual ack, the hot path: into its partition's group, nothing per message
        but extending the group's newest span (``extend_spans``: acks in order of an entry's
        messages make one span); the group's one future stands for all of its acks.

        A ``Message`` received here takes ``_id_and_size``'s checks inline (1.0 -> 0.82-0.86 us an
        ack, enqueue alone)."""
        if self._closed:
            self._check_open()
        message_id = message._id if type(message) is Message else None
        if message_id is not None and message_id.topic == self.topic and 0 <= message_id.partition < len(self._feeds):
            batch_size = message._batch_size  # type: ignore[union-attr]
        else:
            message_id, batch_size = self._id_and_size(message)
        with self._acks_lock:
            if self._unacked:
                self._unacked.pop(message_id, None)
            group = self._ack_groups.get((message_id.partition, None, False))
            if group is None:
                group = self._ack_groups[(message_id.partition, None, False)] = _AckGroup(None)
            extend_spans(group.acks, message_id.ledger_id, message_id.entry_id, batch_size, message_id.batch_index)
            group.count += 1
            flush_now = group.count >= ACK_GROUP_MAX
            flush_later = not flush_now and ACK_GROUP_DELAY_S < self._flush_due_in
            if flush_later:
                self._flush_due_in = ACK_GROUP_DELAY_S
        if flush_now:
            self._client.loop.call_soon(self._flush)
        elif flush_later:
            self._client.loop.call_soon(self._flush_later, ACK_GROUP_DELAY_S)
        return group.sent

    def acknowledge_cumulative(self, message: Message | MessageId, txn: Transaction | None = None) -> None:
        """Ack every message of the message's partition up to it (Exclusive and Failover only)."""
        self._ack(message, True, txn, wait=True)

    def acknowledge_cumulative_async(self, message: Message | MessageId,
                                     txn: Transaction | None = None) -> concurrent.futures.Future:
        return self._ack(message, True, txn, wait=False)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message delivered again after ``negative_ack_redelivery_delay_s``."""
        message_id, _ = self._id_and_size(message)
        with self._acks_lock:
            self._unacked.pop(message_id, None)
            self._nacked.append((time.monotonic() + self.negative_ack_redelivery_delay_s, message_id))

    def redeliver_unacknowledged_messages(self) -> None:
        """Every message delivered to this consumer and not acked yet is delivered again (the
        prefetched ones too: they are dropped here and come again, in order)."""
        with self._acks_lock:
            self._unacked.clear()
        with self._cond:
            self._queue.clear()
            self._queued = self._front_taken = 0
            for feed in self._feeds:
                feed.queued = 0
        self._client.loop.run(self._call_all("redeliver", self.consumer_id, None))

    def _ack(self, message: Message | MessageId, cumulative: bool, txn: Transaction | None,
             wait: bool) -> concurrent.futures.Future:
        """Queue an ack; with a ``txn`` and ``wait``, send it at once and wait until it is logged.
        An ack with a ``txn`` is refused unless the txn is open, and any error raised for it here
        makes the txn abort-only (an error that comes later through the future does too)."""
        if txn is None:
            return self._queue_ack(message, cumulative, None)
        with txn.operation():
            future = self._queue_ack(message, cumulative, txn, send_now=wait)
            if wait:
                future.result()
            return future

    def _queue_ack(self, message: Message | MessageId, cumulative: bool, txn: Transaction | None,
                   send_now: bool = False) -> concurrent.futures.Future:
        """Queue an ack in its group; ``send_now`` for a caller that waits for it.

        Async acks in a txn of batch messages are held until the txn acked every message of the
        entry, which then goes as one whole-entry ack (as Pulsar's client acks batches), or until
        the txn commits (then the indexes go one by one)."""
        self._check_open()
        message_id, batch_size = self._id_and_size(message)
        if cumulative and self.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise NotAllowed(f"cumulative acks are not allowed on a {self.consumer_type} subscription")
        position = message_id.position
        whole = False  # a held batch that this ack completes goes as its whole entry
        with self._acks_lock:
            if self._unacked:
                self._untrack(message_id, cumulative)
            if txn is not None and batch_size > 1 and not cumulative and not send_now:
                held_key = (txn, message_id.partition, position)
                held = self._held.get(held_key)
                if held is None:
                    held = self._held[held_key] = HeldBatch(txn, message_id.partition, message_id.ledger_id,
                                                             message_id.entry_id, batch_size)
                    txn.hold(self)  # the commit sends what is held (flush_txn takes every held batch)
                self._newest_held = held
                if not held.add(message_id.batch_index):
                    return held.future
                del self._held[held_key]
                held.taken = True
                whole, future = True, held.future
            else:
                future = concurrent.futures.Future()
            group, new_group = self._group_locked(message_id.partition, txn, cumulative)
            if cumulative:  # one call names one message: the highest, which covers the others
                ack = (position, message_id.batch_index, batch_size)
                group.acks = [max([*group.acks, ack], key=lambda a: (a[0], a[1] or 0))]
            elif whole:
                group.acks.append(whole_entry_span(position, batch_size))
            else:
                extend_spans(group.acks, message_id.ledger_id, message_id.entry_id, batch_size, message_id.batch_index)
            group.count += 1
            group.futures.append(future)
            flush_now = send_now or group.count >= ACK_GROUP_MAX
            flush_later = txn is None and not flush_now and ACK_GROUP_DELAY_S < self._flush_due_in
            if flush_later:
                self._flush_due_in = ACK_GROUP_DELAY_S
        if txn is not None and new_group:
            txn.track(group.sent)
            txn.hold(self)  # commit flushes this txn's grouped acks first
            if not flush_now:
                self._client.loop.call_soon(self._send_when_old, (message_id.partition, txn, cumulative), group)
        if flush_now:
            self._client.loop.call_soon(self._flush)
        elif flush_later:
            self._client.loop.call_soon(self._flush_later, ACK_GROUP_DELAY_S)
        return future

    def _group_locked(self, partition: int, txn: Transaction | None, cumulative: bool) -> tuple[_AckGroup, bool]:
        """The ack group of (partition, txn, kind), and whether it is new."""
        key = (partition, txn, cumulative)
        group = self._ack_groups.get(key)
        if group is not None:
            return group, False
        group = self._ack_groups[key] = _AckGroup(txn)
        return group, True

    def _id_and_size(self, message: Message | MessageId) -> tuple[MessageId, int]:
        if isinstance(message, Message):
            message_id, batch_size = message.message_id(), message.batch_size
        elif isinstance(message, MessageId):
            message_id = message
            with self._acks_lock:
                known = self._batch_sizes.get((message_id.partition, message_id.position))
            if known is None and message_id.batch_index != 0:
                raise InvalidArgument(f"batch size of {message_id} unknown here; acknowledge the Message")
            batch_size = known or 1
        else:
            raise InvalidArgument(f"expected a Message or MessageId, got {type(message).__name__}")
        if message_id.topic != self.topic or not 0 <= message_id.partition < len(self._feeds):
            raise InvalidArgument(f"{message_id} is not a message of {self.topic}")
        return message_id, batch_size

    def _untrack(self, message_id: MessageId, cumulative: bool) -> None:
        """Acked: no ack timeout or negative ack for it (or anything before it, cumulatively)."""
        if not cumulative:
            self._unacked.pop(message_id, None)
            return
        for tracked in [m for m in self._unacked if m.partition == message_id.partition and m <= message_id]:
            del self._unacked[tracked]

    def flush_txn(self, txn: Transaction) -> None:
        """Send this txn's held and grouped acks now (``Transaction.commit`` calls it, then waits
        for them)."""
        txn.release(self)
        new_groups = []
        with self._acks_lock:
            for held_key in [key for key in self._held if key[0] is txn]:
                held = self._held.pop(held_key)
                held.taken = True
                group, new_group = self._group_locked(held.partition, txn, False)
                group.acks += held.spans()
                group.count += held.acked()
                group.futures.append(held.future)
                if new_group:
                    new_groups.append(group)
        for group in new_groups:
            txn.track(group.sent)
        self._client.loop.call_soon(self._flush)

    def _ack_runs(self, runs: list[Run], txn: Transaction | None, wait: bool) -> concurrent.futures.Future:
        """Acknowledge received runs (``MessageBatch.ack``): one ack call per partition, now,
        with the whole entries as ranges. With a ``txn`` and ``wait``, wait until logged."""
        self._check_open()
        per_partition: dict[int, list[AckSpan]] = {}
        for run in runs:
            spans = per_partition.setdefault(run.partition, [])
            if len(run.indexes) == run.batch_size:
                spans.append(whole_entry_span(run.position, run.batch_size))
            else:
                for index in run.indexes:
                    extend_spans(spans, run.ledger_id, run.entry_id, run.batch_size, index)
        if self._unacked:
            with self._acks_lock:
                for run in runs:
                    for index in run.indexes:
                        self._unacked.pop(MessageId(self.topic, run.partition, run.ledger_id, run.entry_id, index),
                                          None)
        groups = []
        for partition, spans in per_partition.items():
            group = _AckGroup(txn)
            group.ranges, group.runs, group.acks = _coalesced(spans)
            groups.append((partition, group))
        if txn is None:
            for partition, group in groups:
                self._client.loop.call_soon(self._send_group, partition, group)
            return _all_of([group.sent for _, group in groups])
        with txn.operation():
            for partition, group in groups:
                txn.track(group.sent)
                self._client.loop.call_soon(self._send_group, partition, group)
            future = _all_of([group.sent for _, group in groups])
            if wait:
                future.result()
            return future

    def _send_group(self, partition: int, group: _AckGroup) -> None:
        task = asyncio.get_running_loop().create_task(self._send_acks(partition, False, group))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _negative_ack_runs(self, runs: list[Run]) -> None:
        due = time.monotonic() + self.negative_ack_redelivery_delay_s
        with self._acks_lock:
            for run in runs:
                for index in run.indexes:
                    message_id = MessageId(self.topic, run.partition, run.ledger_id, run.entry_id, index)
                    self._unacked.pop(message_id, None)
                    self._nacked.append((due, message_id))

    # --- seek, unsubscribe, close ----------------------------------------------------------

    def seek(self, target: MessageId | int) -> None:
        """Deliver again from a message id (inclusive; on its partition) or from a publish time in
        ms since the epoch (on every partition). Prefetched messages are dropped; acks made before
        it are sent first, so they cannot ack what it delivers again."""
        where: dict[str, Position | int]
        if isinstance(target, MessageId):
            if target.topic != self.topic or not 0 <= target.partition < len(self._feeds):
                raise InvalidArgument(f"{target} is not a message of {self.topic}")
            feeds, where = [self._feeds[target.partition]], {"position": target.position}
        elif isinstance(target, int) and not isinstance(target, bool):
            feeds, where = self._feeds, {"publish_time_ms": target}
        else:
            raise InvalidArgument(f"seek takes a MessageId or a publish time in ms, got {target!r}")
        self._check_open()
        self._client.loop.run(self._seek(feeds, where))

    async def _seek(self, feeds: list[_Feed], where: dict[str, Any]) -> None:
        # Acks made before the seek go before it, as Pulsar's seek flushes its grouped acks:
        # sent after it, they would ack the messages the seek brings back.
        self._flush()
        if self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)
        generations = await asyncio.gather(*(
            feed.ref.call_async("seek", deadline_s=self._client.deadline_s, **where) for feed in feeds))
        with self._cond:
            for feed, generation in zip(feeds, generations, strict=True):
                self._move_to_generation_locked(feed, tuple(generation))
        self._forget_redeliveries({feed.partition for feed in feeds})

    def unsubscribe(self) -> None:
        """Delete the subscription (``NotAllowed`` while other consumers are attached) and close."""
        self._check_open()
        self._client.loop.run(self._call_all("unsubscribe", self.consumer_id))
        self.close()
        self._client.supervisor.call("delete_subscription", self.topic, self.subscription,
                                     deadline_s=self._client.deadline_s)

    def close(self) -> None:
        """Send the grouped acks, detach from the subscription (its unacked messages go to other
        consumers) and stop. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            self._wake_watchers_locked()
        if self._client.loop.loop.is_running():
            try:
                self._client.loop.run(self._shutdown(), timeout=30)
            except Exception:  # closing must not fail; the actors drop idle consumers
                log.warning("closing %r failed", self, exc_info=True)

    @property
    def rewinds_seen(self) -> int:
        """How many times a subscription partition this consumer reads moved to a new generation
        after it attached: its actor restarted (a crash, or an activation after passivation), or
        a seek rewound it. Each time, what was prefetched here is dropped and every unacked message
        comes again, to this consumer or another. So a message may then arrive below one received
        before it, with a redelivery count of 0 after a restart (the count is not durable, as in
        Pulsar). A workload that checks order records a reset when this grows
        (``raytxn.tools.history.History.reset``)."""
        return self._rewinds_seen

    def stats(self) -> list[dict[str, Any]]:
        """The subscription actors' stats, one per partition."""
        return self._client.loop.run(self._call_all("stats"))

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- on the client loop ----------------------------------------------------------------

    async def _call_all(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every partition's subscription actor."""
        return list(await asyncio.gather(*(feed.ref.call_async(method, *args, deadline_s=self._client.deadline_s)
                                           for feed in self._feeds)))

    async def _attach_all(self) -> None:
        results = await asyncio.gather(*(self._attach(feed) for feed in self._feeds), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:  # e.g. an exclusive consumer holds one partition: attach to none
            await asyncio.gather(*(feed.ref.call_async("close_consumer", self.consumer_id, deadline_s=10)
                                   for feed, r in zip(self._feeds, results, strict=True)
                                   if not isinstance(r, BaseException)), return_exceptions=True)
            raise failures[0]

    async def _attach(self, feed: _Feed) -> None:
        reply = await feed.ref.call_async("subscribe", self.consumer_id, self.consumer_name,
                                          str(self.consumer_type), self.read_compacted,
                                          deadline_s=self._client.deadline_s)
        with self._cond:
            rewound = self._move_to_generation_locked(feed, tuple(reply["generation"]))
        if rewound:
            self._forget_redeliveries(feed.partition)

    def _move_to_generation_locked(self, feed: _Feed, generation: tuple[int, int]) -> bool:
        """A newer generation: what was prefetched under an older one is dropped (redelivered).
        True when it rewound an attached partition: call ``_forget_redeliveries`` after the lock."""
        rewound = False
        if generation > feed.generation:
            if feed.generation != (0, 0):  # (0, 0): not attached yet
                self._rewinds_seen += 1
                rewound = True
            self._drop_queued_locked(feed)
            feed.generation = generation
        return rewound

    def _forget_redeliveries(self, partitions: int | set[int]) -> None:
        """After a rewind every unacked message of the partition comes again, so its pending
        negative acks and ack timeouts are spent: due later, each would ask the subscription to
        redeliver the copy the rewind brought (it names a position, not a copy), and the consumer
        would hold that message twice (a pipeline then processed it twice in one txn, in CI's
        rolling restart of hosts). Pulsar clears both trackers when its consumer epoch moves."""
        partitions = {partitions} if isinstance(partitions, int) else partitions
        with self._acks_lock:
            for message_id in [m for m in self._unacked if m.partition in partitions]:
                del self._unacked[message_id]
            self._nacked = [(at, m) for at, m in self._nacked if m.partition not in partitions]

    def _drop_queued_locked(self, feed: _Feed) -> None:
        """Drop what the partition's queue holds: the actor no longer counts it as this consumer's."""
        if feed.queued:
            if self._queue and self._queue[0][0] is feed and self._front_taken:
                self._front_taken = 0  # the front run goes: the next one starts fresh
            self._queue = deque(item for item in self._queue if item[0] is not feed)
            self._queued -= feed.queued
            feed.queued = 0

    def _forget_detached(self, feed: _Feed) -> None:
        """The actor dropped this consumer (idle for its timeout: an outage held its fetches) and
        gave its messages to the consumers attached, this one too once it attaches again. The
        copies still queued here are stale: received, each would come twice (the second's txn ack
        refused as already acked). Dropped, as Pulsar's consumer epoch (PIP-84) drops messages
        sent before a redelivery; the messages it had received come again too, so it counts as a
        rewind (their order starts over)."""
        with self._cond:
            self._rewinds_seen += 1
            self._drop_queued_locked(feed)
        self._forget_redeliveries(feed.partition)

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._fetch_loop(feed)) for feed in self._feeds]
        self._tasks.append(loop.create_task(self._redelivery_loop()))

    async def _fetch_loop(self, feed: _Feed) -> None:
        backoff = 0.05
        while not self._closed:
            try:
                room = 0
                if feed.queued <= feed.low_water or await self._wait_for_room(feed):
                    room = max(0, feed.capacity - feed.queued)
                # No room after a while: a zero fetch, so the actor knows this consumer lives.
                reply = await feed.ref.call_async("fetch", self.consumer_id, room, FETCH_WAIT_S if room else 0.0,
                                                  deadline_s=self._client.deadline_s)
                if not reply["registered"]:
                    if self._closed:  # the actor forgot us because close detached us: stay detached
                        return
                    if tuple(reply["generation"]) == feed.generation:  # the incarnation we attached to dropped us
                        self._forget_detached(feed)  # (a newer one's generation drops the queue at attach)
                    # Shielded: if close cancels this loop now, the subscribe still completes and
                    # close detaches after it, rather than the subscribe landing after the detach
                    # and leaving a consumer attached that nobody fetches for.
                    feed.attaching = asyncio.ensure_future(self._attach(feed))
                    await asyncio.shield(feed.attaching)
                    continue
                if reply["messages"]:
                    self._deliver(feed, tuple(reply["generation"]), reply["messages"])
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception:  # restarting actor, or refused: try again
                if self._closed:
                    return
                log.warning("fetch from %s failed", feed.ref.name, exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _wait_for_room(self, feed: _Feed) -> bool:
        """Wait until half the partition's queue was received; False after PING_INTERVAL_S."""
        feed.room.clear()
        feed.signalled = False
        feed.waiting = True
        try:
            if feed.queued > feed.low_water:
                await asyncio.wait_for(feed.room.wait(), PING_INTERVAL_S)
        except TimeoutError:
            return False
        finally:
            feed.waiting = False
        return True

    def _deliver(self, feed: _Feed, generation: tuple[int, int], wire: list[WireEntry]) -> None:
        """Queue a fetch's runs as they came: records stay encoded until a message is used."""
        partition = feed.partition
        runs = [(feed, Run(partition, *entry)) for entry in wire]
        count = sum(len(entry[4]) for entry in wire)
        self._remember_batch_sizes(runs)
        capacity = feed.capacity
        if count:  # entry[6]: the run's encoded records, packed
            average = max(1, sum(entry[6].nbytes for entry in wire) // count)
            capacity = max(1, min(self.receiver_queue_size, self.receiver_queue_bytes // average))
        if generation > feed.generation != (0, 0):  # a rewind: before its messages can be received
            self._forget_redeliveries(partition)  # (generations move on this loop only)
        with self._cond:
            feed.resize(capacity)
            if generation < feed.generation:
                return  # handed out before a seek we know of; the actor forgot them
            self._move_to_generation_locked(feed, generation)
            self._queue.extend(runs)
            feed.queued += count
            self._queued += count
            self._cond.notify_all()
            self._wake_watchers_locked()

    def _flush_later(self, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self._flush)

    def _send_when_old(self, key: tuple[int, Transaction | None, bool], group: _AckGroup) -> None:
        """A txn's ack group goes ``TXN_ACK_GROUP_DELAY_S`` after it was made, unless its commit
        (or a flush) took it first."""
        asyncio.get_running_loop().call_later(TXN_ACK_GROUP_DELAY_S, self._send_if_still_held, key, group)

    def _send_if_still_held(self, key: tuple[int, Transaction | None, bool], group: _AckGroup) -> None:
        with self._acks_lock:
            if self._ack_groups.get(key) is not group:
                return
            del self._ack_groups[key]
        self._send_groups({key: group})

    def _flush(self) -> None:
        with self._acks_lock:
            groups, self._ack_groups = self._ack_groups, {}
            self._flush_due_in = math.inf
        self._send_groups(groups)

    def _send_groups(self, groups: dict[tuple[int, Transaction | None, bool], _AckGroup]) -> None:
        for (partition, _, cumulative), group in groups.items():
            if not cumulative:
                group.ranges, group.runs, group.acks = _coalesced(group.acks)
            task = asyncio.get_running_loop().create_task(self._send_acks(partition, cumulative, group))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send_acks(self, partition: int, cumulative: bool, group: _AckGroup) -> None:
        feed = self._feeds[partition]
        txn = group.txn
        try:
            if txn is not None:
                await txn.register("subscription", (self.topic, partition, self.subscription))
            await feed.ref.call_async("ack", self.consumer_id, group.acks, cumulative,
                                      txn.id if txn is not None else None, deadline_s=self._client.deadline_s,
                                      request_id=group.request_id, ranges=group.ranges or None,
                                      runs=group.runs or None)
        except BaseException as error:  # every ack of the group learns why
            if txn is None:
                log.warning("acks on %s failed: %r", feed.ref.name, error)
            for future in [*group.futures, group.sent]:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        for future in [*group.futures, group.sent]:
            if not future.done():
                future.set_result(None)

    async def _redelivery_loop(self) -> None:
        """Ack timeouts and negative acks that are due become redelivery requests."""
        while not self._closed:
            await asyncio.sleep(0.05)
            due = self._due_redeliveries(time.monotonic())
            for partition, keys in due.items():
                try:
                    await self._feeds[partition].ref.call_async("redeliver", self.consumer_id, keys,
                                                                deadline_s=self._client.deadline_s)
                except Exception:  # the actor restarted: it redelivers everything anyway
                    log.warning("redelivery request to %s failed", self._feeds[partition].ref.name, exc_info=True)

    def _due_redeliveries(self, now: float) -> dict[int, list[tuple[Position, int]]]:
        due: dict[int, list[tuple[Position, int]]] = {}
        with self._acks_lock:
            while self._unacked:
                message_id, deadline = next(iter(self._unacked.items()))
                if deadline > now:
                    break
                del self._unacked[message_id]
                due.setdefault(message_id.partition, []).append((message_id.position, message_id.batch_index))
            if self._nacked:
                ready = [m for at, m in self._nacked if at <= now]
                self._nacked = [(at, m) for at, m in self._nacked if at > now]
                for message_id in ready:
                    due.setdefault(message_id.partition, []).append((message_id.position, message_id.batch_index))
        return due

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        attaching = [feed.attaching for feed in self._feeds if feed.attaching is not None]
        await asyncio.gather(*attaching, return_exceptions=True)
        for txn in {held.txn for held in list(self._held.values())}:
            self.flush_txn(txn)
        self._flush()
        if self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)
        await asyncio.gather(*(feed.ref.call_async("close_consumer", self.consumer_id, deadline_s=10)
                               for feed in self._feeds), return_exceptions=True)


def _all_of(futures: list[concurrent.futures.Future]) -> concurrent.futures.Future:
    """A future that resolves when all of ``futures`` did (with the first error, if any)."""
    if len(futures) == 1:
        return futures[0]
    combined: concurrent.futures.Future = concurrent.futures.Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(future: concurrent.futures.Future) -> None:
        error = future.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
            if combined.done():
                return
            if error is not None:
                combined.set_exception(error)
            elif last:
                combined.set_result(None)

    if not futures:
        combined.set_result(None)
    for future in futures:
        future.add_done_callback(done)
    return combined


def _coalesced(spans: list[AckSpan]) -> tuple[list[AckRange], list[IndexRun], list[tuple[Position, int | None, int]]]:
    """A group's individual acks as it is sent: (ranges of whole entries, index runs, no single
    acks)."""
    ranges, runs = coalesce_spans(spans)
    return ranges, runs, []
