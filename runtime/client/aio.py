"""The asyncio API (``raytxn.aio``): the engine client, awaited, for async Ray actors, Ray Serve
replicas and asyncio services, where a blocking call would stall every request the loop serves.

It is not a second client. An ``AsyncClient`` holds a ``Client`` and uses its machinery: the one
client loop (a thread of its own, where producers batch and consumers prefetch), the same
batching, retries, fencing, errors and state machines. What it adds is how a caller waits:

* the hot paths wait natively on the caller's loop: a send awaits its ``SendFuture``
  (``asyncio.wrap_future``) and, when the producer is full, a one-shot watcher the producer calls
  when pending messages complete; a receive awaits a one-shot watcher the consumer calls when
  messages are queued. Neither holds a thread, and the consumer's lock is held only to pop;
* calls whose implementation is a sequence of blocking steps (a commit: flush the txn's sends and
  acks, then end it at its coordinator; admin calls; subscribe, which attaches to every partition)
  run that same implementation on the client's worker threads (``AsyncClient.workers``, bounded),
  and the caller awaits it. They are shielded: a cancelled ``commit`` still ends the txn one way
  or the other, and the txn's ``state`` says which (a cancelled ``receive`` takes nothing: a
  message is popped only by a receive that returns it).

The bulk path has its forms too (``raytxn.client.aio_bulk``): leases, table views and compacted
readers, each awaiting the sync object's own machinery.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from raytxn.client.batch import MessageBatch
from raytxn.client.client import Client
from raytxn.client.client import connect as connect_sync
from raytxn.client.consumer import Consumer
from raytxn.client.message import Message, MessageId
from raytxn.client.producer import Producer, SendFuture
from raytxn.client.transaction import Transaction, TxnClientState
from raytxn.errors import InvalidArgument, NotAllowed, ProducerQueueFull, Timeout, TransactionAlreadyAborted
from raytxn.ids import TxnID

if TYPE_CHECKING:
    from raytxn.client.aio_bulk import AsyncCompactedReader, AsyncLeaseSet, AsyncTableView

T = TypeVar("T")
WORKER_THREADS = 8  # blocking implementations in flight at once per client (commits, admin calls)
# A send or receive that needs no wait (room in the producer, a message queued) returns without
# suspending, as asyncio's own streams do. So that a loop consuming a deep queue or filling a
# large producer never holds the loop for long, every YIELD_EVERY such calls in a row read the
# clock, and the loop turns once TURN_EVERY_S passed since it last did. Not every YIELD_EVERY
# calls (a fifth of a millisecond): each turn's select releases the GIL, which the client loop's
# thread, busy with this very producer's batches, then holds until it blocks or is asked back.
# Async sends of 80k messages, medians of 9 rounds, two runs: turning every 128 sends 343k and
# 329k msgs/s; every 10 ms 384k and 369k; 20 ms 373k (second run); 50 ms 404k and 368k; never
# 418k and 385k; the sync API 437k and 429k.
YIELD_EVERY = 128
TURN_EVERY_S = 0.02  # a fifth of asyncio's slow-callback threshold (100 ms)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # marks it retrieved: whoever awaits it still gets it


def _watcher(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future, Callable[[], None]]:
    """A future of the caller's loop, and a thread-safe one-shot call that completes it."""
    future = loop.create_future()

    def wake() -> None:
        if not loop.is_closed():  # (a caller's loop gone meanwhile has nobody to wake)
            loop.call_soon_threadsafe(_wake, future)

    return future, wake


def _in_a_thread(fn: Callable[[], T], on_abandoned: Callable[[T], None] | None = None) -> asyncio.Future[T]:
    """``fn()`` in a thread of its own, started without waiting for it to run (``threading.Thread``
    waits: see ``AsyncClient._on_worker``): a future of the caller's loop. For the calls that
    cannot use the client's workers: connecting (no client yet) and closing (it stops the client
    loop, which hands calls to the workers). A result nobody waits for any more (the caller was
    cancelled) goes to ``on_abandoned``."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: T | None, error: BaseException | None) -> None:
        if future.cancelled():
            if error is None and on_abandoned is not None:
                on_abandoned(outcome)  # type: ignore[arg-type]
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]

    def run() -> None:
        try:
            outcome, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            outcome, error = None, e
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, outcome, error)

    _thread.start_new_thread(run, ())
    return future


async def connect(storage: str | None = None, address: str | None = None, **options: Any) -> AsyncClient:
    """``raytxn.connect``, awaited: connecting may start Ray and the engine, which takes seconds."""
    connecting = _in_a_thread(functools.partial(connect_sync, storage, address, **options), Client.close)
    return AsyncClient(await connecting)


class AsyncClient:
    """A ``Client`` awaited (see the module docstring); ``sync`` is the client itself."""

    def __init__(self, client: Client) -> None:
        self.sync = client
        self.workers = concurrent.futures.ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="raytxn-aio")

    def _on_worker(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """``fn(*args, **kwargs)`` started on a worker thread: a future of the caller's loop. The
        client loop hands it to the pool, not the caller's loop: the pool starts its threads as
        calls come, and a thread's start waits until it runs (a step of 0.14 s at a client's first
        call on this busy machine). Its outcome counts as retrieved, so one that nobody awaits (its
        caller was cancelled) is not reported as an error never retrieved."""
        call = functools.partial(fn, *args, **kwargs)

        async def on_worker() -> T:
            return await asyncio.get_running_loop().run_in_executor(self.workers, call)

        future = asyncio.wrap_future(self.sync.loop.submit(on_worker()))
        future.add_done_callback(_retrieved)
        return future

    async def _blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread, awaited, shielded from the caller's
        cancellation (the call runs to its end: see the module docstring)."""
        return await asyncio.shield(self._on_worker(fn, *args, **kwargs))

    async def _offload(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread, awaited: for reads, which change nothing, so
        a cancelled caller just stops waiting (the thread finishes the read and drops it)."""
        return await self._on_worker(fn, *args, **kwargs)

    # --- admin ---------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int = 1, **options: Any) -> dict[str, Any]:
        return await self._blocking(self.sync.create_topic, name, partitions, **options)

    async def delete_topic(self, name: str) -> None:
        await self._blocking(self.sync.delete_topic, name)

    async def get_topic(self, name: str) -> dict[str, Any]:
        return await self._blocking(self.sync.get_topic, name)

    async def list_topics(self) -> list[dict[str, Any]]:
        return await self._blocking(self.sync.list_topics)

    async def create_subscription(self, topic: str, subscription: str, initial_position: str = "latest") -> dict:
        return await self._blocking(self.sync.create_subscription, topic, subscription, initial_position)

    async def register_transactional_id(self, transactional_id: str) -> int:
        return await self._blocking(self.sync.register_transactional_id, transactional_id)

    # --- producers, consumers, transactions ----------------------------------------------

    async def create_producer(self, topic: str, producer_name: str | None = None, **options: Any) -> AsyncProducer:
        producer = await self._blocking(self.sync.create_producer, topic, producer_name, **options)
        return AsyncProducer(self, producer)

    async def subscribe(self, topic: str, subscription: str, **options: Any) -> AsyncConsumer:
        """``Client.subscribe`` (the same options), awaited."""
        consumer = await self._blocking(_subscribed, self.sync, topic, subscription, options)
        return AsyncConsumer(self, consumer)

    async def new_transaction(self, timeout: float = 60.0, transactional_id: str | None = None,
                              epoch: int | None = None) -> AsyncTransaction:
        """A transaction; with a ``transactional_id``, begun under its epoch (fencing a zombie)."""
        if transactional_id is None:
            txn = self.sync.new_transaction(timeout)  # lazy: its begin travels with its first send or ack
        else:
            txn = await asyncio.wrap_future(self.sync.new_transaction_async(timeout, transactional_id, epoch))
        return AsyncTransaction(self, txn)

    def transaction(self, timeout: float = 60.0, transactional_id: str | None = None,
                    epoch: int | None = None) -> _TransactionScope:
        """``async with client.transaction() as txn``: committed at the end of the block, aborted
        if it raises (the error then goes on)."""
        return _TransactionScope(self, timeout, transactional_id, epoch)

    # --- the bulk path, compaction (raytxn.client.aio_bulk) ------------------------------------

    async def lease_ranges(self, topic: str, subscription: str, holder: str, epoch: int = 0,
                           **options: Any) -> AsyncLeaseSet:
        """``Client.lease_ranges`` (the same options), awaited on the client loop."""
        from raytxn.client.aio_bulk import AsyncLeaseSet

        leases = await asyncio.wrap_future(self.sync.lease_ranges_async(topic, subscription, holder, epoch,
                                                                        **options))
        return AsyncLeaseSet(self, leases)

    async def table_view(self, topic: str, poll_interval_s: float = 0.2) -> AsyncTableView:
        """``Client.table_view``: loaded (from the compacted view, then the tail) on a worker."""
        from raytxn.client.aio_bulk import AsyncTableView

        return AsyncTableView(self, await self._blocking(self.sync.table_view, topic, poll_interval_s))

    async def compacted_reader(self, topic: str, partition: int = 0, from_offset: int = 0,
                               poll_interval_s: float = 0.2) -> AsyncCompactedReader:
        """``Client.compacted_reader``: its first look made on a worker."""
        from raytxn.client.aio_bulk import AsyncCompactedReader

        reader = await self._blocking(self.sync.compacted_reader, topic, partition, from_offset, poll_interval_s)
        return AsyncCompactedReader(self, reader)

    async def compact(self, topic: str, partition: int | None = None, **options: Any) -> list[dict[str, Any]]:
        """``Client.compact`` on a worker (it reads and writes storage in bulk)."""
        return await self._blocking(self.sync.compact, topic, partition, **options)

    async def read_compacted(self, topic: str, partition: int = 0, from_offset: int = 0) -> list[dict[str, Any]]:
        return await self._offload(self.sync.read_compacted, topic, partition, from_offset)

    async def close(self) -> None:
        """``Client.close`` (producers flushed, consumers closed), awaited; then the workers end."""
        await asyncio.shield(_in_a_thread(self.sync.close))
        self.workers.shutdown(wait=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _subscribed(client: Client, topic: str, subscription: str, options: dict[str, Any]) -> Consumer:
    """``Client.subscribe``, and the imports ``receive_batch`` would otherwise make on the loop
    the first time (pyarrow's ``take`` imports its compute functions and pandas: a quarter
    second), made here by one small ``take``."""
    import pyarrow as pa

    pa.array([b""]).take(pa.array([0]))

    return client.subscribe(topic, subscription, **options)


class AsyncTransaction:
    """A ``Transaction`` awaited; ``sync`` is the transaction itself (pass it as ``txn=`` to the
    async producers and consumers, or its ``sync`` to the sync ones).

    Its end runs on a worker, shielded: a commit or abort whose caller was cancelled still ends
    the transaction one way or the other, and the next ``commit`` or ``abort`` first waits for
    that end, then says how it went (``commit`` returns once committed and raises
    ``TransactionAlreadyAborted``, chained to why, once aborted; ``abort`` the reverse), as
    ``state`` does at any time."""

    def __init__(self, client: AsyncClient, txn: Transaction) -> None:
        self._client = client
        self.sync = txn
        self._ending: asyncio.Future[None] | None = None  # the last commit or abort, on a worker
        self._end_error: BaseException | None = None  # what the first end that failed raised

    @property
    def id(self) -> TxnID | None:
        """Its id at the coordinator, None until it began: a lazy transaction begins with its
        first send or ack (``await begin()`` begins it now). Reading it never waits."""
        return self.sync.id if self.sync.began else None

    async def begin(self) -> TxnID:
        """Begin it at a coordinator now, if its first send or ack has not; its id."""
        if self.sync.began:
            return self.sync.id
        return await asyncio.wrap_future(self._client.sync.loop.submit(self.sync._begun()))

    @property
    def state(self) -> TxnClientState:
        return self.sync.state

    async def commit(self, until_applied: bool = False) -> None:
        """``Transaction.commit``: raises as it does (see the class docstring for a commit whose
        caller was cancelled); ``until_applied`` as there."""
        await self._end(functools.partial(self.sync.commit, until_applied))

    async def abort(self) -> None:
        await self._end(self.sync.abort)

    async def _end(self, end: Callable[[], None]) -> None:
        previous = self._ending
        if previous is not None and not previous.done():
            await asyncio.wait([previous])  # (never raises; cancelling this waiter leaves it running)
        ending = self._ending = self._client._on_worker(end)
        ending.add_done_callback(self._note_failure)
        try:
            await asyncio.shield(ending)
        except TransactionAlreadyAborted as e:
            if self._end_error is not None and e is not self._end_error and e.__cause__ is None:
                raise e from self._end_error  # says why: the end that did abort it
            raise

    def _note_failure(self, ending: asyncio.Future[None]) -> None:
        if self._end_error is None and not ending.cancelled() and ending.exception() is not None:
            self._end_error = ending.exception()


class _TransactionScope:
    def __init__(self, client: AsyncClient, timeout: float, transactional_id: str | None, epoch: int | None) -> None:
        self._args = (client, timeout, transactional_id, epoch)
        self._txn: AsyncTransaction | None = None

    async def __aenter__(self) -> AsyncTransaction:
        client, timeout, transactional_id, epoch = self._args
        self._txn = await client.new_transaction(timeout, transactional_id, epoch)
        return self._txn

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        assert self._txn is not None
        if exc_type is None:
            await self._txn.commit()
        elif self._txn.state not in (TxnClientState.ABORTED, TxnClientState.COMMITTED):
            await self._txn.abort()


@overload
def _sync_txn(txn: AsyncTransaction | Transaction) -> Transaction: ...
@overload
def _sync_txn(txn: None) -> None: ...
def _sync_txn(txn: AsyncTransaction | Transaction | None) -> Transaction | None:
    return txn.sync if isinstance(txn, AsyncTransaction) else txn


class AsyncProducer:
    """A ``Producer`` awaited; ``sync`` is the producer itself."""

    def __init__(self, client: AsyncClient, producer: Producer) -> None:
        self._client = client
        self.sync = producer
        self._without_turn = 0  # sends since the clock was last read (YIELD_EVERY)
        self._turned = 0.0  # when this producer last let the loop turn (TURN_EVERY_S)

    async def send(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time: int | None = None, txn: AsyncTransaction | Transaction | None = None) -> MessageId:
        """Send and await durability; the message's id. Cancelled while it awaits, the message
        is still sent (a message handed to the producer is not taken back, as with Kafka's)."""
        return await (await self.send_nowait(value, key, properties, event_time, txn))

    async def send_nowait(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
                          event_time: int | None = None,
                          txn: AsyncTransaction | Transaction | None = None) -> SendFuture:
        """Queue the message (awaiting room while the producer is at its pending limits, where the
        sync ``send_async`` would block its thread); returns the producer's future of its id, which
        is awaitable: resolved once the message is durable."""
        sync_txn = txn.sync if isinstance(txn, AsyncTransaction) else txn
        future = self.sync._send_if_room(value, key, properties, event_time, sync_txn)
        if future is None:  # full: nothing was queued
            size = len(value) if isinstance(value, bytes | bytearray | memoryview) else 0
            while future is None:
                if not await self._room(size):
                    producer = self.sync
                    error = ProducerQueueFull(
                        f"producer {producer.producer_name}: {producer.pending[0]} messages still pending after "
                        f"{producer.send_timeout_s}s (max_pending_messages {producer.max_pending_messages}, "
                        f"max_pending_bytes {producer.max_pending_bytes})")
                    if sync_txn is not None:
                        sync_txn.fail(error)  # as the sync send's: its earlier sends never commit without it
                    raise error
                future = self.sync._send_if_room(value, key, properties, event_time, sync_txn)
            self._without_turn, self._turned = 0, time.monotonic()  # it awaited room: the loop turned
        else:
            self._without_turn += 1
            if self._without_turn >= YIELD_EVERY:
                self._without_turn = 0
                now = time.monotonic()
                if now - self._turned >= TURN_EVERY_S:
                    self._turned = now
                    await asyncio.sleep(0)
        return future

    async def send_batch(self, values: Any, keys: Any = None,
                         properties: Sequence[dict[str, str] | None] | None = None,
                         txn: AsyncTransaction | Transaction | None = None) -> list[MessageId]:
        """``Producer.send_batch`` awaited until every message is durable: their ids, in input
        order (or the first error of any of their batches)."""
        return await (await self.send_batch_nowait(values, keys, properties, txn))

    async def send_batch_nowait(self, values: Any, keys: Any = None,
                                properties: Sequence[dict[str, str] | None] | None = None,
                                txn: AsyncTransaction | Transaction | None = None) -> asyncio.Future[list[MessageId]]:
        """Queue many messages in one call (``Producer.send_batch``: a list of bytes or an Arrow
        binary array, keys and properties alike) and return an awaitable of their ids, resolved
        once all are durable. The checks, the encoding and any wait for room run on a worker
        thread: a batch's encoding is too long a step for the loop, and a producer at its pending
        limits would block it. Bad input raises as the sync call does and queues nothing (in a
        txn, making it abort-only). Cancelled while it awaits, the call still queues its
        messages, as a cancelled ``send`` does."""
        queued = await self._client._blocking(self.sync.send_batch, values, keys, properties, _sync_txn(txn))
        return _settled(queued)

    async def _room(self, size: int) -> bool:
        """Wait until one more message of ``size`` bytes fits (True), or ``send_timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.sync.send_timeout_s
        while True:
            waiter, wake = _watcher(loop)
            if self.sync._room_or_watch(size, wake):
                return True
            try:
                await asyncio.wait_for(waiter, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    return False
            finally:
                self.sync._unwatch_room(wake)

    async def flush(self, txn: AsyncTransaction | Transaction | None = None) -> None:
        """Await everything queued so far (in ``txn`` only, if given) being durable."""
        sync_txn = _sync_txn(txn)
        if sync_txn is None:
            await self._client._blocking(self.sync.flush)
        else:
            await self._client._blocking(self.sync.flush_txn, sync_txn)

    async def close(self) -> None:
        await self._client._blocking(self.sync.close)


def _settled(future: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """A future of the client loop, to await on the caller's loop: a cancelled caller stops
    waiting, the work goes on and its outcome stays the transaction's (``Transaction.track``)."""
    return asyncio.shield(asyncio.wrap_future(future))


def _done() -> asyncio.Future[None]:
    """A future that is done already: what a plain ack returns. Awaiting a done future runs no
    Python code (an awaitable of our own ran its ``__await__``, as much as the ack itself), and
    never touches its loop, so one serves every await."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


class AsyncConsumer:
    """A ``Consumer`` awaited; ``sync`` is the consumer itself. ``async for message in consumer``
    receives until the consumer closes."""

    def __init__(self, client: AsyncClient, consumer: Consumer) -> None:
        self._client = client
        self.sync = consumer
        self._without_turn = 0  # receives since the clock was last read (YIELD_EVERY)
        self._turned = 0.0  # when this consumer last let the loop turn (TURN_EVERY_S)
        self._acked: asyncio.Future[None] | None = None  # done: what every plain ack returns

    async def _wait_queued(self, deadline: float | None, count: int = 1) -> bool:
        """Wait until ``count`` messages are queued (True) or ``deadline`` passes (False)."""
        consumer = self.sync
        loop = asyncio.get_running_loop()
        while True:
            with consumer._cond:
                consumer._check_open()
                if consumer._queued >= count:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                waiter, wake = _watcher(loop)
                consumer._watchers.append(wake)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return False
            finally:
                consumer._unwatch(wake)  # (called already when a message came: then a no-op)

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; waits up to ``timeout`` seconds (None: for ever), then ``Timeout``.
        Cancelled while waiting, it takes nothing."""
        consumer = self.sync
        if consumer._queued:  # the common case under load: no watcher (receive(0) checks it is open)
            self._without_turn += 1
            if self._without_turn >= YIELD_EVERY:
                self._without_turn = 0
                now = time.monotonic()
                if now - self._turned >= TURN_EVERY_S:
                    self._turned = now
                    await asyncio.sleep(0)
            # Consumer.receive's pop, inline: a call layer less on the path every message takes
            with consumer._queue_lock:
                message = consumer._pop_locked() if consumer._queued and not consumer._closed else None
            if message is not None:
                if consumer.ack_timeout_s is not None:
                    consumer._track_received([message])
                return message
        self._without_turn, self._turned = 0, time.monotonic()  # it waits: the loop turns
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not await self._wait_queued(deadline):
                raise Timeout(f"no message on {consumer.topic}/{consumer.subscription} within {timeout}s")
            try:
                return consumer.receive(timeout=0)  # pops without waiting
            except Timeout:
                continue  # another receive took it first

    async def receive_batch(self, max_messages: int = 10_000, timeout_s: float = 0.1) -> MessageBatch:
        """``Consumer.receive_batch``: returns as soon as any message is there, waiting up to
        ``timeout_s`` for the first (then possibly none)."""
        if type(max_messages) is not int or max_messages < 1:
            raise InvalidArgument(f"max_messages must be an int >= 1, got {max_messages!r}")
        await self._wait_queued(time.monotonic() + timeout_s)
        return self.sync.receive_batch(max_messages, timeout_s=0)

    async def batch_receive(self, max_messages: int = 100, timeout: float = 0.1) -> list[Message]:
        """``Consumer.batch_receive``: up to ``max_messages`` messages, once that many are queued
        or ``timeout`` seconds passed (then possibly none). One await for many messages: where a
        loop's work per message is small, the await per ``receive`` is a share of it that this
        spreads over the batch."""
        if type(max_messages) is not int or max_messages < 1:
            raise InvalidArgument(f"max_messages must be an int >= 1, got {max_messages!r}")
        if self.sync._queued < max_messages:
            await self._wait_queued(time.monotonic() + timeout, max_messages)
        else:
            await asyncio.sleep(0)  # (one turn of the loop a batch: a full queue never holds it)
        return self.sync.batch_receive(max_messages, timeout=0)

    async def seek(self, target: MessageId | int) -> None:
        """``Consumer.seek`` (a message id, or a publish time in ms), on a worker."""
        await self._client._blocking(self.sync.seek, target)

    async def unsubscribe(self) -> None:
        await self._client._blocking(self.sync.unsubscribe)

    async def stats(self) -> list[dict[str, Any]]:
        return await self._client._offload(self.sync.stats)

    def acknowledge(self, message: Message | MessageId,
                    txn: AsyncTransaction | Transaction | None = None) -> Awaitable[None]:
        """Ack, made at the call; await what it returns. A plain ack is done at once (grouped,
        sent within milliseconds); one in a txn once it is in the subscription's pending-ack log
        (raising as ``Consumer.acknowledge`` does). A caller cancelled while it awaits stops
        waiting; the ack goes on, and the txn's commit waits for it (aborting if it failed).

        Not a coroutine: a plain ack is a call that never waits, and a coroutine of its own was a
        quarter of an awaited receive-and-ack's cost per message."""
        if txn is None:
            self.sync._ack_plain(message)  # Consumer.acknowledge's plain path, a call layer less
            done = self._acked
            if done is None:
                done = self._acked = _done()
            return done
        return _settled(self.sync._ack_in_txn_now(message, _sync_txn(txn)))

    async def acknowledge_cumulative(self, message: Message | MessageId,
                                     txn: AsyncTransaction | Transaction | None = None) -> None:
        await _settled(self.sync.acknowledge_cumulative_async(message, _sync_txn(txn)))

    async def acknowledge_batch(self, batch: MessageBatch, txn: AsyncTransaction | Transaction | None = None) -> None:
        """``MessageBatch.ack``, awaited: every message of a ``receive_batch``'s batch."""
        await _settled(batch.ack_async(_sync_txn(txn)))

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        self.sync.negative_acknowledge(message)

    async def close(self) -> None:
        await self._client._blocking(self.sync.close)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            try:
                message = await self.receive()
            except NotAllowed:
                if self.sync._closed:
                    return  # closed: the iteration ends
                raise
            yield message
