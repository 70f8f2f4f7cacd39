"""Producers: batching, key routing, idempotent pipelined appends, transactional sends, flow control.

Routing: a message with a key goes to ``murmur2(key) % partitions`` (Kafka's default
partitioner, so the same key lands where a Kafka producer would put it); without a key, messages
stick to one partition for ``max_in_flight`` sealed batches, then move to the next (Kafka's sticky
partitioner, with a longer stick): those batches are in flight together, and the partition's
ledger writes them in one put. Moving on after every batch gave each partition one batch at a
time, one put each, and a 64-partition topic took keyless sends at 0.36 of a 4-partition one's
rate (0.71 with the longer stick; ``raytxn bench scale``).

Accumulating (Kafka's RecordAccumulator): ``send_async`` runs on the caller's thread. It encodes
the message and appends it to the open batch of its (partition, transaction) under the
producer's lock. The client loop hears of a batch only when it opens (to arm its linger timer
and to register the partition with the txn's coordinator while the batch fills) and when it is
sealed, so a message costs a lock, a list append and its future, not a wake-up of another thread.

Columnar sends: ``send_batch`` takes a whole list (or Arrow array) of values, validates all of it
first, encodes it in bulk, cuts it into sealed batches (keyed messages by partition, keyless ones
as whole batches round-robin) and returns one future for the call, resolving to the list of
``MessageId`` in input order. A call's messages never join ``send_async``'s open batches: the open
batch of a (partition, transaction) is sealed first, so a partition still gets the producer's
messages in the order they were handed over. A call's last, partial batch of a partition stays
open, and the next call tops it up first (Kafka's accumulator fills a partition's last batch), so
calls that do not divide into full batches still make full entries.

Batching: a batch is sealed when it reaches ``batching_max_messages`` or ``batching_max_bytes``,
on ``flush`` (and commit), or once ``batching_max_delay_ms`` has passed and its partition has no
append in flight; while one is in flight a lingering batch keeps filling up to the limits, so a
busy partition gets fewer, larger appends. A batch is one ledger entry and its messages get batch
indexes 0..n-1. The limits default to 10,000 messages and 1 MiB (Kafka's ``max.request.size``;
Pulsar's are 1,000 and 128 KiB): each append is a Ray round trip and a durable put, and that fixed
cost, not the bytes, bounds a partition's rate. Past 100 KiB Ray passes an append's records
through the object store, which costs more per call (1,000 messages of 100 B, 107 KB, took 5.3 ms
where 920 took 3.4 ms), but ten times the messages per call more than pays for it: with 90 KiB
and 1,000 messages, ``send_batch`` ran at 0.27-0.33 of this machine's ceiling and ``send_async``
at 0.22-0.25; with these limits, 0.68-0.83 and 0.35-0.39 (``raytxn bench produce``). The limits
only bind under load: an idle partition's batch is sealed by its linger, as small as it is.

Pipelining and idempotence (Kafka's ``max.in.flight.requests.per.connection`` with idempotence):
up to ``max_in_flight`` sealed batches per partition are in flight at once (1: one at a time, in
order). Each gets its sequence ids (per producer and partition, contiguous) when it is sent, and
names the batch it follows (``previous_sequence``: the last sequence of the producer's batch sent
there before it and not acknowledged yet, -1 if none). The calls leave in sequence order from the
client loop; the partition refuses a batch whose predecessor is neither stored nor being stored
with ``OutOfOrderSequence`` (``raytxn.protocol.txn_buffer``'s sequence rule), so nothing lands
out of order. On any failure of a batch in flight (an actor that died, a refusal), the partition's
sender stops sending new batches, waits until every batch in flight has its answer, then resends
the ones that did not succeed one at a time, oldest first, with the same sequence ids: a batch
that did land is acknowledged as a duplicate, one that did not is stored now, in order. A batch
that fails for good (a final error, or retries past ``send_timeout_s``) fails its futures and its
sequence range is never reused (the partition accepts the gap: the next batch follows nothing
unacknowledged). A named producer is an incarnation of its name: at creation it asks every
partition for a new producer epoch (``init_producer``), which fences the appends of older
incarnations still on their way (a crashed client's, or a stalled one's: ``Fenced``), and its
sequence ids start again at 0 in it (Kafka's producer epochs; ``txn_buffer``'s epoch rule). A
duplicate acknowledged for a batch that is not the producer's latest there has no known
position: its ids carry ledger and entry -1.

Flow control: at most ``max_pending_messages`` (100,000: ten full batches, so a full window of
them fits) messages holding at most ``max_pending_bytes`` (64 MiB, Pulsar's client memory limit)
wait to be durable. Past either,
``send_async`` and ``send_batch`` block until appends complete (Kafka's ``max.block.ms``
behaviour), and raise ``ProducerQueueFull`` if there is still no room after ``send_timeout_s``.
A ``send_batch`` call takes room for all its messages at once (all queued or none); one larger
than the limits goes when nothing else is pending, as one large message does. Besides bounding
memory this keeps a tight send loop from starving the client loop of the GIL: the sender sleeps
while the loop drains.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import _base as futures_base
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytxn.client.batch_cuts import cut_points, pick
from raytxn.client.message import MessageId
from raytxn.client.rpc import ActorRef, retriable, retry_async, unwrap
from raytxn.client.transaction import Transaction
from raytxn.errors import InvalidArgument, MessageTooLarge, ProducerQueueFull
from raytxn.hashing import partition_for
from raytxn.ids import TxnID, partition_actor_name
from raytxn.protocol.entry_format import MessageRecord, encode_message

if TYPE_CHECKING:
    from raytxn.client.client import Client

_KEY_CACHE_SIZE = 65_536  # key -> partition memo (murmur2 in Python costs ~4 us a key)
# A message with only a value (< 256 bytes) encoded without building a MessageRecord: the same
# bytes as ``encode_message(MessageRecord(value))`` (tag "m1", bin8 value, no key, no properties,
# no event time), checked by tests/unit/test_producer_encoding.py.
_PLAIN_SMALL = b"\x95\xa2m1\xc4%c%s\xc0\x80\xc0"


def encode_plain(value: bytes) -> bytes:
    """``encode_message(MessageRecord(value))``, faster for small values."""
    if len(value) < 256:
        return _PLAIN_SMALL % (len(value), value)
    return encode_message(MessageRecord(value))


class _Outcome:
    """A ``send_async`` batch's outcome, shared by its messages' futures and settled once for all
    of them (``_settle``): where the entry landed, or the error. A future holds this, not its
    batch, so a caller keeping futures does not keep the batch's records."""

    __slots__ = ("condition", "entry_id", "error", "ledger_id", "partition", "state", "topic", "watched")

    def __init__(self, topic: str, partition: int) -> None:
        self.condition = threading.Condition()  # every future of the batch waits on it
        self.state = futures_base.PENDING
        self.topic = topic
        self.partition = partition
        self.ledger_id = -1
        self.entry_id = -1
        self.error: BaseException | None = None
        # Futures given a waiter or callback list (under ``condition``): the only ones settling
        # must visit one by one.
        self.watched: list[SendFuture] = []


class SendFuture(concurrent.futures.Future):
    """What ``send_async`` returns: a ``concurrent.futures.Future`` of the message's ``MessageId``
    (``result``, ``exception``, ``add_done_callback``, ``concurrent.futures.wait`` and
    ``asyncio.wrap_future`` all work). A message handed to the producer cannot be taken back:
    ``cancel()`` returns False, as with Kafka's producer futures.

    It is a view of its batch's ``_Outcome`` and its index in the batch: its lock, state, result
    and error are the outcome's, and the ``MessageId`` is made when asked for. So a batch settles
    in one step however many messages it holds: settling 10,000 futures one by one (a
    ``MessageId``, a state and a callback check each) was 3-7 ms of the client loop's GIL per
    batch. A Future of its own would also cost a Condition and an RLock per message. Its waiter
    and callback lists are made when first asked for, and only then is the future visited when
    its batch settles. Only the producer settles it: the base's setters (``set_result`` and the
    like, an executor's) raise ``AttributeError``."""

    def __init__(self, outcome: _Outcome, index: int) -> None:
        self._outcome = outcome
        self._index = index

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._outcome.condition

    @property
    def _state(self) -> str:  # type: ignore[override]
        return self._outcome.state

    @property
    def _result(self) -> MessageId | None:  # type: ignore[override]
        outcome = self._outcome
        if outcome.state != futures_base.FINISHED or outcome.error is not None:
            return None
        return MessageId(outcome.topic, outcome.partition, outcome.ledger_id, outcome.entry_id, self._index)

    @property
    def _exception(self) -> BaseException | None:  # type: ignore[override]
        return self._outcome.error

    @property
    def _waiters(self) -> list:  # type: ignore[override]  # concurrent.futures.wait appends to it
        return self._watched_list("_waiter_list")

    @property
    def _done_callbacks(self) -> list:  # add_done_callback appends to it
        return self._watched_list("_callback_list")

    def _watched_list(self, name: str) -> list:
        """The list ``name``, made on first use (callers hold the condition, as the base's do)."""
        lists = self.__dict__
        found = lists.get(name)
        if found is None:
            if "_waiter_list" not in lists and "_callback_list" not in lists:
                self._outcome.watched.append(self)
            found = lists[name] = []
        return found

    def _invoke_callbacks(self) -> None:
        if "_callback_list" in self.__dict__:
            super()._invoke_callbacks()  # type: ignore[misc]  # CPython's Future has it; typeshed leaves it out

    def cancel(self) -> bool:
        return False

    def __await__(self) -> Generator[Any, None, MessageId]:
        """Awaitable too (raytxn.aio's ``send_nowait`` returns it): wrapped for the awaiting loop
        only when awaited, so a future nobody awaits costs no asyncio future."""
        return asyncio.wrap_future(self).__await__()


def _settle(outcome: _Outcome, position: tuple[int, int] | None, error: BaseException | None) -> None:
    """Finish every future of a batch at once (at ``position``, or with ``error``), then wake the
    waiters and run the callbacks of the futures that have any, as ``Future.set_result`` does for
    one."""
    with outcome.condition:
        if outcome.state != futures_base.PENDING:
            return
        if error is None:
            assert position is not None
            outcome.ledger_id, outcome.entry_id = position
        else:
            outcome.error = error
        outcome.state = futures_base.FINISHED
        watched = list(outcome.watched)  # a wait() may still give a finished future a waiter list
        for future in watched:
            for waiter in future.__dict__.get("_waiter_list", ()):
                if error is None:
                    waiter.add_result(future)
                else:
                    waiter.add_exception(future)
        outcome.condition.notify_all()
    for future in watched:  # callbacks added from now on run at once (the base checks the state)
        future._invoke_callbacks()


class BatchSendFuture(concurrent.futures.Future):
    """What ``send_batch`` returns: a ``concurrent.futures.Future`` of the list of ``MessageId``
    of the call's messages, in input order, or of the first error of any of its batches (the
    others may still have been stored). Like a ``SendFuture`` it cannot be cancelled."""

    def cancel(self) -> bool:
        return False


class _Collector:
    """Gathers the ids of one ``send_batch`` call's batches (on the client loop only)."""

    __slots__ = ("future", "ids", "remaining")

    def __init__(self, count: int) -> None:
        self.future = BatchSendFuture()
        self.ids: list[MessageId | None] = [None] * count
        self.remaining = count

    def deliver(self, indexes: Sequence[int], ids: list[MessageId]) -> None:
        if self.future.done():
            return
        for index, message_id in zip(indexes, ids, strict=True):
            self.ids[index] = message_id
        self.remaining -= len(ids)
        if self.remaining == 0:
            self.future.set_result(self.ids)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(eq=False)
class _Batch:
    partition: int
    txn: Transaction | None
    records: list[bytes] = field(default_factory=list)  # encoded MessageRecords
    outcome: _Outcome | None = None  # send_async's: what its futures (one per record) show
    size: int = 0
    lingered: bool = False  # its delay has passed: seal as soon as the partition is free
    sealed: bool = False
    durable: asyncio.Event = field(default_factory=asyncio.Event)  # set once it has its outcome
    # send_batch's: per call whose messages it holds, in record order, the call's collector and
    # the input index of each of its records. Empty for send_async's batches (``outcome``).
    parts: list[tuple[_Collector, list[int]]] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, Transaction | None]:
        return _batch_key(self.partition, self.txn)


def _batch_key(partition: int, txn: Transaction | None) -> tuple[int, Transaction | None]:
    """Messages of one (partition, transaction) share a batch. The key holds the transaction
    itself, not its id: a lazily begun one has no id before its first registration."""
    return partition, txn


class _Flight:
    """A batch sent to its partition, with its sequence ids, until it has its outcome."""

    __slots__ = ("batch", "error", "first", "last", "replied")

    def __init__(self, batch: _Batch, first: int) -> None:
        self.batch = batch
        self.first = first
        self.last = first + len(batch.records) - 1
        self.replied = False
        self.error: BaseException | None = None


class Producer:
    def __init__(self, client: Client, topic: str, partitions: int, producer_name: str | None = None,
                 batching_max_messages: int = 10_000, batching_max_bytes: int = 1 << 20,
                 batching_max_delay_ms: float = 1.0, send_timeout_s: float = 60.0,
                 max_message_bytes: int = 5 << 20, max_pending_messages: int = 100_000,
                 max_pending_bytes: int = 64 << 20, max_in_flight: int = 5) -> None:
        if batching_max_messages < 1 or batching_max_bytes < 1 or batching_max_delay_ms < 0:
            raise InvalidArgument("batching limits must be positive")
        if max_pending_messages < 1 or max_pending_bytes < 1 or send_timeout_s <= 0:
            raise InvalidArgument("max_pending_messages, max_pending_bytes and send_timeout_s must be positive")
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise InvalidArgument(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        self._client = client
        self.topic = topic
        self.partitions = partitions
        self.producer_name = producer_name or f"producer-{uuid.uuid4().hex[:12]}"
        self.max_messages = batching_max_messages
        self.max_bytes = batching_max_bytes
        self.max_delay_s = batching_max_delay_ms / 1000
        self.send_timeout_s = send_timeout_s
        self.max_message_bytes = max_message_bytes
        self.max_pending_messages = max_pending_messages
        self.max_pending_bytes = max_pending_bytes
        self.max_in_flight = max_in_flight
        self._refs = [ActorRef(partition_actor_name(topic, p), client.token) for p in range(partitions)]
        self._partition_of: dict[str, int] = {}
        self._holding: set[Transaction] = set()  # txns told (``hold``) that this producer has their work
        # Shared by callers' threads and the client loop: open and sealed batches, the keyless
        # partition, and the pending byte count.
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified when pending messages complete
        self._room_watchers: list[Callable[[], None]] = []  # called once when pending messages complete
        self._pending_messages = 0
        self._pending_bytes = 0
        self._open: dict[tuple[int, Transaction | None], _Batch] = {}
        self._sealed: list[deque[_Batch]] = [deque() for _ in range(partitions)]
        self._keyless_partition = 0
        self._keyless_sealed = 0  # batches sealed on the keyless partition since it became current
        # Client loop only.
        self._sending: list[asyncio.Task | None] = [None] * partitions
        self._window: list[deque[_Flight]] = [deque() for _ in range(partitions)]  # in sequence order
        self._recovering = [False] * partitions  # a batch in flight failed: resend in order first
        self._launching: list[_Batch | None] = [None] * partitions  # waiting for its txn's registration
        self._wake: list[asyncio.Event | None] = [None] * partitions
        self._next_sequence = [0] * partitions
        self._epochs = [0] * partitions  # this incarnation's producer epoch at each partition
        self._registering: set[asyncio.Task] = set()
        self._replies: set[asyncio.Task] = set()
        # The partitions the latest transaction sent to (see _register_early).
        self._working_set: tuple[Transaction | None, set[int]] = (None, set())
        self._closed = False
        if producer_name is not None:  # a new incarnation of the name: fence the older ones
            self._epochs, self._next_sequence = client.loop.run(self._init_epochs())

    async def _init_epochs(self) -> tuple[list[int], list[int]]:
        """This incarnation's epoch and first sequence id at every partition (``init_producer``):
        the epoch fences the appends of older incarnations of the name still on their way."""
        replies = await asyncio.gather(*(ref.call_async("init_producer", self.producer_name) for ref in self._refs))
        return [epoch for epoch, _ in replies], [first for _, first in replies]

    # --- public API ------------------------------------------------------------------------

    def send(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
             event_time: int | None = None, txn: Transaction | None = None) -> MessageId:
        """Send and wait until the message is durable; returns its id."""
        future, batch = self._accumulate(value, key, properties, event_time, txn)
        self._client.loop.call_soon(self._seal_now, batch)  # no point lingering: we wait anyway
        return future.result()

    def send_async(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time: int | None = None, txn: Transaction | None = None) -> SendFuture:
        """Queue a message; the future resolves to its MessageId once durable. Blocks while the
        producer's pending messages are at ``max_pending_messages`` or ``max_pending_bytes``."""
        return self._accumulate(value, key, properties, event_time, txn)[0]

    def send_batch(self, values: Any, keys: Any = None, properties: Sequence[dict[str, str] | None] | None = None,
                   txn: Transaction | None = None) -> BatchSendFuture:
        """Queue many messages at once; one future for the call, resolving to their ``MessageId``
        list in input order once all are durable (or to the first error).

        ``values``: a list of bytes, or a pyarrow ``BinaryArray``/``LargeBinaryArray``/
        ``ChunkedArray`` of them (no nulls). ``keys``: None, a list of ``str``/None, or an Arrow
        string array (null: no key); routed as ``send_async`` routes. ``properties``: None or a
        list of ``dict[str, str]``/None, one per value. Everything is checked before anything is
        queued: bad input raises ``InvalidArgument`` (``MessageTooLarge`` for a value past
        ``max_message_bytes``) and queues nothing; with a ``txn`` it also makes the txn
        abort-only, as a failed ``send_async`` does. Blocks for room as ``send_async`` does."""
        if txn is None:
            return self._send_batch(values, keys, properties, None)
        with txn.operation():
            return self._send_batch(values, keys, properties, txn)

    def flush(self) -> None:
        """Send everything queued so far and wait until it is durable."""
        if not self._idle():
            self._client.loop.run(self._flush(None))

    def flush_txn(self, txn: Transaction) -> None:
        """Send everything queued so far in ``txn`` and wait until it is durable."""
        self._holding.discard(txn)  # before the release: a send racing it holds again
        if not self._idle():
            self._client.loop.run(self._flush(txn))
        txn.release(self)

    def _idle(self) -> bool:
        """Nothing is queued or in flight (every message counts as pending until its batch is
        settled): a flush would find nothing to wait for, so it skips the round trip to the
        client loop (0.13 ms, on every commit right after a synchronous send)."""
        with self._lock:
            return self._pending_messages == 0

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    @property
    def pending(self) -> tuple[int, int]:
        """Messages queued or in flight, not yet durable, and their encoded bytes."""
        return self._pending_messages, self._pending_bytes

    # --- on the caller's thread ------------------------------------------------------------

    def _accumulate(self, value: bytes, key: str | None, properties: dict[str, str] | None,
                    event_time: int | None, txn: Transaction | None) -> tuple[SendFuture, _Batch]:
        """Queue one message. With a ``txn``: refused unless it is open, and any error raised here
        (``MessageTooLarge``, ``ProducerQueueFull``, a bad argument) makes it abort-only, so the
        messages sent before in it never commit without this one (Kafka's abortable error)."""
        if txn is None:
            return self._enqueue(value, key, properties, event_time, None)  # type: ignore[return-value]
        # What ``txn.operation()`` does, without an object per message, and without a clock read:
        # ``sendable`` turns False when the txn leaves OPEN or its timer times it out; then
        # ``check_open`` raises why. (A send a moment past the deadline, before the timer fired,
        # fails with ``TransactionTimedOut`` on its future: its batch's registration reads the clock.)
        if not txn.machine.sendable:
            txn.check_open()
        try:
            return self._enqueue(value, key, properties, event_time, txn)  # type: ignore[return-value]
        except BaseException as error:
            txn.fail(error)
            raise

    def _send_if_room(self, value: bytes, key: str | None, properties: dict[str, str] | None,
                      event_time: int | None, txn: Transaction | None) -> SendFuture | None:
        """``send_async``, except that where it would wait for room it queues nothing and returns
        None (raytxn.aio then awaits room on its loop): the same checks, errors and txn rules."""
        if txn is None:
            queued = self._enqueue(value, key, properties, event_time, None, False)
        else:
            if not txn.machine.sendable:
                txn.check_open()
            try:
                queued = self._enqueue(value, key, properties, event_time, txn, False)
            except BaseException as error:
                txn.fail(error)
                raise
        return None if queued is None else queued[0]

    def _hold(self, txn: Transaction) -> None:
        """Tell ``txn`` this producer has work of it (its commit flushes it here and waits), once
        until it is flushed: ``hold`` takes the txn's lock, a cost per message otherwise."""
        if len(self._holding) >= 256:  # txns never ended stay in it: a bound, holding again is harmless
            self._holding.clear()
        self._holding.add(txn)
        txn.hold(self)

    def _partition(self, key: str) -> int:
        partition = self._partition_of.get(key)
        if partition is None:
            if len(self._partition_of) >= _KEY_CACHE_SIZE:
                self._partition_of.clear()  # a bound, not an LRU: refilling costs one hash a key
            partition = self._partition_of[key] = partition_for(key, self.partitions)
        return partition

    def _enqueue(self, value: bytes, key: str | None, properties: dict[str, str] | None,
                 event_time: int | None, txn: Transaction | None,
                 wait: bool = True) -> tuple[SendFuture, _Batch] | None:
        """Queue one message, waiting for room (or, not ``wait``, returning None then)."""
        if self._closed:
            raise InvalidArgument(f"producer {self.producer_name} is closed")
        if type(value) is not bytes:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise InvalidArgument(f"value must be bytes, not {type(value).__name__}")
            value = bytes(value)
        if len(value) > self.max_message_bytes:
            raise MessageTooLarge(f"message of {len(value)} bytes exceeds {self.max_message_bytes}")
        if key is None:
            partition = -1
        elif type(key) is str:
            partition = self._partition(key)
        else:
            raise InvalidArgument(f"key must be a str, not {type(key).__name__}")
        if key is None and not properties and event_time is None:
            record = encode_plain(value)
        else:
            record = encode_message(MessageRecord(value, key, dict(properties) if properties else {}, event_time))
        size = len(record)
        with self._lock:
            if self._pending_messages and (self._pending_messages >= self.max_pending_messages
                                           or self._pending_bytes + size > self.max_pending_bytes):
                if not wait:
                    return None
                self._wait_for_room(1, size)
            if partition < 0:
                partition = self._keyless_partition
            batch_key = (partition, txn)
            batch = self._open.get(batch_key)
            if batch is not None and batch.parts:  # a send_batch call's tail goes first, as it is
                self._seal_locked(batch)
                batch = None
            opened = batch is None
            if batch is None:
                batch = self._open[batch_key] = _Batch(partition, txn, outcome=_Outcome(self.topic, partition))
            future = SendFuture(batch.outcome, len(batch.records))  # type: ignore[arg-type]
            batch.records.append(record)
            batch.size += size
            self._pending_messages += 1
            self._pending_bytes += size
            full = len(batch.records) >= self.max_messages or batch.size >= self.max_bytes
            if full:
                self._seal_locked(batch)
        if opened or full:
            # A txn's batch here opens after every flush of it (which seals them): holding it then,
            # before this send returns, is holding it for every message, at a set lookup a batch.
            if opened and txn is not None and txn not in self._holding:
                self._hold(txn)
            self._client.loop.call_soon(self._batch_event, batch, opened)
        return future, batch

    def _send_batch(self, values: Any, keys: Any, properties: Sequence[dict[str, str] | None] | None,
                    txn: Transaction | None) -> BatchSendFuture:
        if self._closed:
            raise InvalidArgument(f"producer {self.producer_name} is closed")
        value_list = _value_list(values)
        count = len(value_list)
        key_list = _key_list(keys, count)
        if properties is not None and (not isinstance(properties, Sequence) or len(properties) != count):
            raise InvalidArgument(f"properties must be None or a list of {count} dicts (or None)")
        if value_list and max(map(len, value_list)) > self.max_message_bytes:  # the common case in C
            index = next(i for i, value in enumerate(value_list) if len(value) > self.max_message_bytes)
            raise MessageTooLarge(f"message {index} of {len(value_list[index])} bytes exceeds "
                                  f"{self.max_message_bytes}")
        records = self._encode_all(value_list, key_list, properties)
        collector = _Collector(count)
        if count == 0:
            collector.future.set_result([])
            return collector.future
        sizes = list(map(len, records))
        total = sum(sizes)
        # Keyed messages by partition, input order kept; keyless ones go as whole batches.
        keyed: dict[int, list[int]] = {}
        keyless: list[int] = []
        if key_list is None:
            keyless = list(range(count))
        else:
            partition_of = self._partition
            for index, key in enumerate(key_list):
                if key is None:
                    keyless.append(index)
                else:
                    keyed.setdefault(partition_of(key), []).append(index)
        if txn is not None and txn not in self._holding:
            self._hold(txn)
        touched: list[int] = []
        tails: list[_Batch] = []
        keyless_chunks = self._chunks(sizes, keyless)
        with self._lock:
            if self._pending_messages and (self._pending_messages + count > self.max_pending_messages
                                           or self._pending_bytes + total > self.max_pending_bytes):
                self._wait_for_room(count, total)
            self._pending_messages += count
            self._pending_bytes += total
            for chunk in keyless_chunks:  # whole batches, round-robin
                partition = self._keyless_partition
                self._keyless_partition = (partition + 1) % self.partitions
                if partition in keyed:
                    keyed[partition] = sorted(keyed[partition] + chunk)  # the partition gets input order
                else:
                    keyed[partition] = chunk
            for partition, indexes in keyed.items():
                self._queue_chunks_locked(partition, txn, records, sizes, indexes, collector, touched, tails)
        self._client.loop.call_soon(self._batches_queued, txn, touched, tails)
        return collector.future

    def _chunks(self, sizes: list[int], indexes: list[int], held: tuple[int, int] = (0, 0)) -> list[list[int]]:
        """``indexes`` (ascending) cut into runs within the batch limits (a record alone always
        makes one); ``sizes``: every record's encoded size, by index. ``held``: the messages and
        bytes of an open batch the first run tops up (that run is empty when even the first
        record does not fit)."""
        chunks = []
        start = 0
        for end in cut_points(pick(sizes, indexes), self.max_messages, self.max_bytes, held):
            chunks.append(indexes[start:end])
            start = end
        return chunks

    def _encode_all(self, values: list[bytes], keys: list[str | None] | None,
                    properties: Sequence[dict[str, str] | None] | None) -> list[bytes]:
        """Every record of a ``send_batch`` call, checking the properties on the way."""
        if keys is None and properties is None:
            return [_PLAIN_SMALL % (len(v), v) if len(v) < 256 else encode_message(MessageRecord(v))
                    for v in values]
        records = []
        for index, value in enumerate(values):
            key = keys[index] if keys is not None else None
            props = properties[index] if properties is not None else None
            if props:
                if not isinstance(props, dict) or not all(type(k) is str and type(v) is str for k, v in props.items()):
                    raise InvalidArgument(f"properties of message {index} must be a dict of str to str, "
                                          f"got {props!r}")
                records.append(encode_message(MessageRecord(value, key, dict(props))))
            elif props is None or isinstance(props, dict):
                records.append(encode_plain(value) if key is None else encode_message(MessageRecord(value, key)))
            else:
                raise InvalidArgument(f"properties of message {index} must be a dict, got {type(props).__name__}")
        return records

    def _queue_chunks_locked(self, partition: int, txn: Transaction | None, records: list[bytes], sizes: list[int],
                             indexes: list[int], collector: _Collector, touched: list[int],
                             tails: list[_Batch]) -> None:
        """Under the lock: queue ``indexes`` for ``partition`` behind the open batch of the same
        (partition, transaction). An earlier call's open tail there is topped up first; a
        ``send_async`` batch is sealed first. The rest is cut into sealed batches, but for the
        last, partial one, which stays open (``tails``: its linger is armed on the loop) for the
        next call to top up, as Kafka's accumulator fills a partition's last batch: 1,000-message
        calls of 100 B (104 KB, past the byte limit) otherwise made entries of 886 and 114
        messages, twice the appends for the same data."""
        touched.append(partition)
        open_batch = self._open.get(_batch_key(partition, txn))
        tail = open_batch if open_batch is not None and open_batch.parts else None
        chunks = self._chunks(sizes, indexes, (len(tail.records), tail.size) if tail is not None else (0, 0))
        if tail is not None and chunks:
            topped = chunks.pop(0)
            if topped:
                tail.records.extend(pick(records, topped))
                tail.parts.append((collector, topped))
                tail.size += sum(pick(sizes, topped))
        if open_batch is not None and chunks:  # what follows goes after it
            self._seal_locked(open_batch)
        for number, chunk in enumerate(chunks, 1):
            batch = _Batch(partition, txn, pick(records, chunk), size=sum(pick(sizes, chunk)),
                           parts=[(collector, chunk)])
            if number < len(chunks) or len(chunk) >= self.max_messages or batch.size >= self.max_bytes:
                batch.sealed = True  # not _queue_sealed_locked: a call's batches leave keyless stickiness as is
                self._sealed[partition].append(batch)
            else:
                self._open[batch.key] = batch
                tails.append(batch)

    def _room_or_watch(self, size: int, watcher: Callable[[], None]) -> bool:
        """Whether one more message of ``size`` bytes fits now; if not, ``watcher`` is called once
        pending messages complete (raytxn.aio waits for room so, not blocked on ``_room``; a
        waiter that gives up takes its watcher back with ``_unwatch_room``)."""
        with self._lock:
            if self._pending_messages > 0 and (self._pending_messages + 1 > self.max_pending_messages
                                               or self._pending_bytes + size > self.max_pending_bytes):
                self._room_watchers.append(watcher)
                return False
            return True

    def _unwatch_room(self, watcher: Callable[[], None]) -> None:
        """Forget ``watcher`` if it was not called yet: the list stays as long as the waits."""
        with self._lock:
            if watcher in self._room_watchers:
                self._room_watchers.remove(watcher)

    def _wait_for_room(self, count: int, size: int) -> None:
        """Under the lock: block while ``count`` more messages of ``size`` bytes would pass the
        limits (never while nothing is pending: one message, or call, larger than them goes)."""
        def full() -> bool:
            return self._pending_messages > 0 and (
                self._pending_messages + count > self.max_pending_messages
                or self._pending_bytes + size > self.max_pending_bytes)

        if not full():
            return
        if self._client.loop.in_loop():  # the loop frees the room: it must never wait for it
            raise ProducerQueueFull(f"producer {self.producer_name}: {self._pending_messages} messages pending")
        deadline = time.monotonic() + self.send_timeout_s
        while full():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProducerQueueFull(
                    f"producer {self.producer_name}: {self._pending_messages} messages ({self._pending_bytes} "
                    f"bytes) still pending after {self.send_timeout_s}s (max_pending_messages "
                    f"{self.max_pending_messages}, max_pending_bytes {self.max_pending_bytes})")
            self._room.wait(left)

    def _seal_locked(self, batch: _Batch) -> None:
        """Under the lock: close ``batch`` to new messages and queue it for its partition."""
        del self._open[batch.key]
        self._queue_sealed_locked(batch)

    def _queue_sealed_locked(self, batch: _Batch) -> None:
        batch.sealed = True
        self._sealed[batch.partition].append(batch)
        if batch.partition == self._keyless_partition:  # keyless traffic moves on after a window's worth
            self._keyless_sealed += 1
            if self._keyless_sealed >= self.max_in_flight:
                self._keyless_partition = (self._keyless_partition + 1) % self.partitions
                self._keyless_sealed = 0

    # --- on the client loop ----------------------------------------------------------------

    def _batch_event(self, batch: _Batch, opened: bool) -> None:
        if opened:
            if batch.txn is not None:
                self._register_early(batch.txn, [batch.partition])
            if not batch.sealed:
                asyncio.get_running_loop().call_later(self.max_delay_s, self._linger_passed, batch)
        self._kick(batch.partition)

    def _batches_queued(self, txn: Transaction | None, partitions: list[int], tails: list[_Batch]) -> None:
        if txn is not None:
            self._register_early(txn, partitions)
        loop = asyncio.get_running_loop()
        for tail in tails:
            if not tail.sealed:
                loop.call_later(self.max_delay_s, self._linger_passed, tail)
        for partition in partitions:
            self._kick(partition)

    def _register_early(self, txn: Transaction, partitions: list[int]) -> None:
        """Register ``partitions`` with the txn's coordinator while their batches fill, not when
        they are sent. A txn's first batch also registers, in the same call, every partition the
        previous txn sent to if that was more than one: a steady stream of transactions (a
        pipeline committing every N ms) touches the same partitions each time, and each
        partition's first append would otherwise wait for a registration of its own. A guess that
        is wrong costs little: a commit reaching a partition the txn never wrote to writes nothing
        there, an abort one marker."""
        working_txn, working_set = self._working_set
        wanted = list(partitions)
        if working_txn is not txn:
            if len(working_set) > 1:
                wanted += sorted(working_set - set(partitions))
            self._working_set = (txn, set(partitions))
        else:
            working_set.update(partitions)
        participants = [(self.topic, p) for p in wanted]
        if txn.registered("partition", participants):
            return  # the usual case after a txn's first batches: no task for every batch that opens
        task = asyncio.get_running_loop().create_task(self._register(txn, participants))
        self._registering.add(task)
        task.add_done_callback(self._registering.discard)

    async def _register(self, txn: Transaction, participants: list[tuple]) -> None:
        try:
            await txn.register_many("partition", participants)
        except BaseException:  # noqa: BLE001 - the batch's own send registers again and reports it
            pass

    def _busy(self, partition: int) -> bool:
        return bool(self._window[partition]) or self._recovering[partition]

    def _linger_passed(self, batch: _Batch) -> None:
        with self._lock:
            if batch.sealed:
                return
            batch.lingered = True
            if not self._busy(batch.partition):
                self._seal_locked(batch)
        self._kick(batch.partition)

    def _seal_now(self, batch: _Batch) -> None:
        with self._lock:
            if not batch.sealed:
                self._seal_locked(batch)
        self._kick(batch.partition)

    def _kick(self, partition: int) -> None:
        if self._sending[partition] is None:
            if self._sealed[partition]:
                self._sending[partition] = asyncio.get_running_loop().create_task(self._send_loop(partition))
        else:
            wake = self._wake[partition]
            if wake is not None:
                wake.set()

    def _next_batch(self, partition: int) -> _Batch | None:
        """Under the lock: the partition's next batch to send, sealing any that have lingered
        when nothing is in flight there."""
        queue = self._sealed[partition]
        if not queue and not self._busy(partition):
            for batch in [b for b in self._open.values() if b.partition == partition and b.lingered]:
                self._seal_locked(batch)
        return queue.popleft() if queue else None

    async def _flush(self, txn: Transaction | None) -> None:
        """Seal the open batches (of ``txn``, or all) and wait for those and every earlier one of
        them; later sends (other threads keep producing) are not waited for."""
        with self._lock:
            for batch in list(self._open.values()):
                if txn is None or batch.txn is txn:
                    self._seal_locked(batch)
            waiting = [b for queue in self._sealed for b in queue if txn is None or b.txn is txn]
        waiting += [f.batch for window in self._window for f in window if txn is None or f.batch.txn is txn]
        waiting += [b for b in self._launching if b is not None and (txn is None or b.txn is txn)]
        for partition in range(self.partitions):
            self._kick(partition)
        for batch in waiting:
            await batch.durable.wait()

    async def _send_loop(self, partition: int) -> None:
        """The partition's sender: keeps up to ``max_in_flight`` batches in flight, in sequence
        order; after a failure, resends in order before anything new goes."""
        wake = self._wake[partition] = self._wake[partition] or asyncio.Event()
        window = self._window[partition]
        try:
            while True:
                wake.clear()
                if self._recovering[partition]:
                    if all(f.replied for f in window):
                        await self._recover(partition)
                        continue
                elif len(window) < self.max_in_flight:
                    with self._lock:
                        batch = self._next_batch(partition)
                    if batch is not None:
                        await self._launch(partition, batch)
                        continue
                if not window and not self._recovering[partition]:
                    return
                await wake.wait()
        finally:
            self._sending[partition] = None

    async def _launch(self, partition: int, batch: _Batch) -> None:
        """Register the batch's partition with its txn (usually done already), then give it its
        sequence ids and send it. No await between numbering and sending, so calls leave in
        sequence order."""
        txn = batch.txn
        if txn is not None:
            self._launching[partition] = batch  # a flush meanwhile waits for it too
            try:
                await txn.register("partition", (self.topic, partition))
            except Exception as error:  # noqa: BLE001 - the batch's futures carry it
                self._fail(batch, error)
                return
            finally:
                self._launching[partition] = None
            if self._recovering[partition]:  # something failed meanwhile: this one waits its turn
                with self._lock:
                    self._sealed[partition].appendleft(batch)
                return
        window = self._window[partition]
        flight = _Flight(batch, self._next_sequence[partition])
        self._next_sequence[partition] = flight.last + 1
        previous = window[-1].last if window else -1
        window.append(flight)
        try:
            reply = self._refs[partition].submit("append", self.producer_name, flight.first, batch.records,
                                                 txn.id if txn else None, previous, self._epochs[partition])
        except Exception as error:  # noqa: BLE001 - e.g. ActorNotFound: sorted out by the recovery
            self._flight_failed(partition, flight, error)
            return
        task = asyncio.ensure_future(self._await_reply(partition, flight, reply))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _await_reply(self, partition: int, flight: _Flight, reply: Any) -> None:
        try:
            result = await reply
        except Exception as raw:  # noqa: BLE001 - sorted out by the recovery
            self._flight_failed(partition, flight, raw)
            return
        flight.replied = True
        self._window[partition].remove(flight)
        self._complete(flight.batch, result)
        self._kick(partition)

    def _flight_failed(self, partition: int, flight: _Flight, raw: BaseException) -> None:
        error = unwrap(raw)
        if retriable(error):
            self._refs[partition].forget()  # it may have been replaced
        flight.replied = True
        flight.error = error
        self._recovering[partition] = True
        self._kick(partition)

    async def _recover(self, partition: int) -> None:
        """Every batch in flight has its answer and some failed: resend those that did not
        succeed, oldest first, one at a time, with their sequence ids (a duplicate is acknowledged
        with the original's outcome). Each follows nothing unacknowledged (``previous`` -1): every
        batch before it is stored, or failed for good."""
        window = self._window[partition]
        ref = self._refs[partition]
        while window:
            flight = window[0]
            batch = flight.batch
            error = flight.error
            if error is not None and retriable(error):
                txn_id = batch.txn.id if batch.txn else None

                def append_again(f: _Flight = flight, t: TxnID | None = txn_id) -> Any:
                    # the epoch is read at each attempt: a re-init between attempts moves it
                    return ref.attempt_async("append", self.producer_name, f.first, f.batch.records, t, -1,
                                             self._epochs[partition])

                try:
                    result = await retry_async(append_again, self.send_timeout_s, what=f"{ref.name}.append")
                except Exception as final:  # noqa: BLE001 - the batch's futures carry it
                    error = final
                else:
                    error = None
                    window.popleft()
                    self._complete(batch, result)
                    continue
            window.popleft()
            self._fail(batch, error if error is not None else RuntimeError("batch without outcome"))
        self._recovering[partition] = False

    def _finish(self, batch: _Batch) -> None:
        with self._lock:
            self._pending_messages -= len(batch.records)
            self._pending_bytes -= batch.size
            self._room.notify_all()
            watchers, self._room_watchers = self._room_watchers, []
        for watcher in watchers:  # (raytxn.aio's sends waiting for room)
            watcher()
        batch.durable.set()

    def _complete(self, batch: _Batch, result: Any) -> None:
        position = result.position
        ledger_id, entry_id = (position.ledger_id, position.entry_id) if position else (-1, -1)
        if batch.outcome is not None:
            _settle(batch.outcome, (ledger_id, entry_id), None)
        else:
            topic, partition = self.topic, batch.partition
            ids = [MessageId(topic, partition, ledger_id, entry_id, i) for i in range(len(batch.records))]
            start = 0
            for collector, indexes in batch.parts:
                collector.deliver(indexes, ids[start:start + len(indexes)])
                start += len(indexes)
        self._finish(batch)

    def _fail(self, batch: _Batch, error: BaseException) -> None:
        if batch.txn is not None:
            batch.txn.fail(error)  # the txn can no longer commit: its writes would be partial
        if batch.outcome is not None:
            _settle(batch.outcome, None, error)
        for collector, _indexes in batch.parts:
            collector.fail(error)
        self._finish(batch)

    def __repr__(self) -> str:
        return f"Producer({self.producer_name!r}, topic={self.topic!r})"


def _value_list(values: Any) -> list[bytes]:
    """``send_batch``'s values as a list of bytes; ``InvalidArgument`` for anything else."""
    if isinstance(values, (list, tuple)):
        converted = None
        for index, value in enumerate(values):
            if type(value) is not bytes:
                if not isinstance(value, (bytes, bytearray, memoryview)):
                    raise InvalidArgument(f"value {index} must be bytes, not {type(value).__name__}")
                converted = converted or list(values)
                converted[index] = bytes(value)
        if converted is not None:
            return converted
        return values if isinstance(values, list) else list(values)
    arrow = _arrow_list(values, ("binary", "large_binary"), "values")
    if arrow is None:
        raise InvalidArgument(f"values must be a list of bytes or an Arrow binary array, not {type(values).__name__}")
    if None in arrow:
        raise InvalidArgument(f"values must not be null (value {arrow.index(None)} is)")
    return arrow


def _key_list(keys: Any, count: int) -> list[str | None] | None:
    if keys is None:
        return None
    if isinstance(keys, (list, tuple)):
        key_list = list(keys)
        for index, key in enumerate(key_list):
            if key is not None and type(key) is not str:
                raise InvalidArgument(f"key {index} must be a str or None, not {type(key).__name__}")
    else:
        key_list = _arrow_list(keys, ("string", "large_string"), "keys")  # type: ignore[assignment]
        if key_list is None:
            raise InvalidArgument(f"keys must be None, a list of str or an Arrow string array, "
                                  f"not {type(keys).__name__}")
    if len(key_list) != count:
        raise InvalidArgument(f"{len(key_list)} keys for {count} values")
    if all(key is None for key in key_list):
        return None
    return key_list


def _arrow_list(column: Any, type_names: tuple[str, ...], what: str) -> list | None:
    """A pyarrow Array or ChunkedArray of one of ``type_names`` as a Python list; None when
    ``column`` is not Arrow (pyarrow is imported only if it is loaded already)."""
    import sys

    pa = sys.modules.get("pyarrow")
    if pa is None or not isinstance(column, (pa.Array, pa.ChunkedArray)):
        return None
    if str(column.type) not in type_names:
        raise InvalidArgument(f"{what} must be an Arrow array of {' or '.join(type_names)}, not {column.type}")
    return column.to_pylist()
