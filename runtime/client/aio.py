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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from raytxn.client.batch import MessageBatch
from raytxn.client.client import Client
from raytxn.client.client import connect as connect_sync
from raytxn.client.consumer import Consumer
from raytxn.client.message import Message, MessageId
from raytxn.client.producer import Producer
from raytxn.client.transaction import Transaction, TxnClientState
from raytxn.errors import InvalidArgument, NotAllowed, Timeout

T = TypeVar("T")
WORKER_THREADS = 8  # blocking implementations in flight at once per client (commits, admin calls)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _watcher(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future, Callable[[], None]]:
    """A future of the caller's loop, and a thread-safe one-shot call that completes it."""
    future = loop.create_future()

    def wake() -> None:
        if not loop.is_closed():  # (a caller's loop gone meanwhile has nobody to wake)
            loop.call_soon_threadsafe(_wake, future)

    return future, wake


async def connect(storage: str | None = None, address: str | None = None, **options: Any) -> AsyncClient:
    """``raytxn.connect``, awaited: connecting may start Ray and the engine, which takes seconds."""
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, functools.partial(connect_sync, storage, address, **options))
    return AsyncClient(client)


class AsyncClient:
    """A ``Client`` awaited (see the module docstring); ``sync`` is the client itself."""

    def __init__(self, client: Client) -> None:
        self.sync = client
        self.workers = concurrent.futures.ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="raytxn-aio")

    async def _blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread, awaited, shielded from the caller's
        cancellation (the call runs to its end: see the module docstring)."""
        loop = asyncio.get_running_loop()
        return await asyncio.shield(loop.run_in_executor(self.workers, functools.partial(fn, *args, **kwargs)))

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

    async def close(self) -> None:
        await self._blocking(self.sync.close)
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
    async producers and consumers, or its ``sync`` to the sync ones)."""

    def __init__(self, client: AsyncClient, txn: Transaction) -> None:
        self._client = client
        self.sync = txn

    @property
    def id(self) -> Any:
        return self.sync.id

    @property
    def state(self) -> TxnClientState:
        return self.sync.state

    async def commit(self, until_applied: bool = False) -> None:
        """``Transaction.commit``: raises as it does. Cancelled, the commit still runs to its end;
        ``state`` then says how it ended."""
        await self._client._blocking(self.sync.commit, until_applied)

    async def abort(self) -> None:
        await self._client._blocking(self.sync.abort)


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


def _sync_txn(txn: AsyncTransaction | Transaction | None) -> Transaction | None:
    return txn.sync if isinstance(txn, AsyncTransaction) else txn


class AsyncProducer:
    """A ``Producer`` awaited; ``sync`` is the producer itself."""

    def __init__(self, client: AsyncClient, producer: Producer) -> None:
        self._client = client
        self.sync = producer

    async def send(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time: int | None = None, txn: AsyncTransaction | Transaction | None = None) -> MessageId:
        """Send and await durability; the message's id."""
        return await (await self.send_nowait(value, key, properties, event_time, txn))

    async def send_nowait(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
                          event_time: int | None = None,
                          txn: AsyncTransaction | Transaction | None = None) -> asyncio.Future[MessageId]:
        """Queue the message (awaiting room while the producer is at its pending limits, where the
        sync ``send_async`` would block its thread); returns a future of its id, resolved once it
        is durable."""
        await self._room(len(value) if isinstance(value, bytes | bytearray | memoryview) else 0)
        future = self.sync.send_async(value, key, properties, event_time, _sync_txn(txn))
        return asyncio.wrap_future(future)

    async def _room(self, size: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.sync.send_timeout_s
        while True:
            waiter, wake = _watcher(loop)
            if self.sync._room_or_watch(size, wake):
                return
            left = deadline - time.monotonic()
            try:
                await asyncio.wait_for(waiter, max(0.0, left))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    return  # send_async raises ProducerQueueFull, as the sync producer does

    async def flush(self, txn: AsyncTransaction | Transaction | None = None) -> None:
        """Await everything queued so far (in ``txn`` only, if given) being durable."""
        sync_txn = _sync_txn(txn)
        if sync_txn is None:
            await self._client._blocking(self.sync.flush)
        else:
            await self._client._blocking(self.sync.flush_txn, sync_txn)

    async def close(self) -> None:
        await self._client._blocking(self.sync.close)


class AsyncConsumer:
    """A ``Consumer`` awaited; ``sync`` is the consumer itself. ``async for message in consumer``
    receives until the consumer closes."""

    def __init__(self, client: AsyncClient, consumer: Consumer) -> None:
        self._client = client
        self.sync = consumer

    async def _wait_queued(self, deadline: float | None) -> bool:
        """Wait until a message is queued (True) or ``deadline`` passes (False)."""
        consumer = self.sync
        loop = asyncio.get_running_loop()
        while True:
            with consumer._cond:
                consumer._check_open()
                if consumer._queued:
                    return True
                waiter, wake = _watcher(loop)
                consumer._watchers.append(wake)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return False

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; waits up to ``timeout`` seconds (None: for ever), then ``Timeout``.
        Cancelled while waiting, it takes nothing."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not await self._wait_queued(deadline):
                raise Timeout(f"no message on {self.sync.topic}/{self.sync.subscription} within {timeout}s")
            try:
                return self.sync.receive(timeout=0)  # pops without waiting
            except Timeout:
                continue  # another receive took it first

    async def receive_batch(self, max_messages: int = 10_000, timeout_s: float = 0.1) -> MessageBatch:
        """``Consumer.receive_batch``: returns as soon as any message is there, waiting up to
        ``timeout_s`` for the first (then possibly none)."""
        if type(max_messages) is not int or max_messages < 1:
            raise InvalidArgument(f"max_messages must be an int >= 1, got {max_messages!r}")
        await self._wait_queued(time.monotonic() + timeout_s)
        return self.sync.receive_batch(max_messages, timeout_s=0)

    async def acknowledge(self, message: Message | MessageId,
                          txn: AsyncTransaction | Transaction | None = None) -> None:
        """Ack; a plain ack returns at once (grouped, sent within milliseconds), one in a txn once
        it is in the subscription's pending-ack log (raising as ``Consumer.acknowledge`` does)."""
        sync_txn = _sync_txn(txn)
        if sync_txn is None:
            self.sync.acknowledge(message)
        else:
            await asyncio.wrap_future(self.sync.acknowledge_async(message, sync_txn))

    async def acknowledge_cumulative(self, message: Message | MessageId,
                                     txn: AsyncTransaction | Transaction | None = None) -> None:
        await asyncio.wrap_future(self.sync.acknowledge_cumulative_async(message, _sync_txn(txn)))

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
