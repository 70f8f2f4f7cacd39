"""The asyncio API (``raytxn.aio``) on the real engine, every test under asyncio's debug mode
with a small ``slow_callback_duration``: a raytxn call that blocked the loop (a thread waiting on
a lock, an actor, a timer) shows up as a slow callback, and fails the test."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import raytxn as rt
from raytxn import aio
from raytxn.client.transaction import TxnClientState
from raytxn.errors import Fenced, Timeout
from tests.engine import engine_client

pytestmark = pytest.mark.ray
# A blocked loop shows as a callback this slow; on this shared 2-core machine a Python step that
# does not block takes well under it.
SLOW_CALLBACK_S = 0.1


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and "took" in message:
            self.found.append(message)


def run_checked(body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``body()`` in a debug-mode loop; fail on any slow callback."""
    slow = _SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(slow)

    async def main() -> Any:
        asyncio.get_running_loop().slow_callback_duration = SLOW_CALLBACK_S
        return await body()

    try:
        result = asyncio.run(main(), debug=True)
    finally:
        logger.removeHandler(slow)
    assert slow.found == [], slow.found
    return result


def topic_name() -> str:
    return f"aio-{uuid.uuid4().hex[:8]}"


def test_produce_consume_and_a_transaction_never_block_the_loop(client: rt.Client) -> None:
    async def body() -> None:
        async with await aio.connect(storage=client.config.storage_url) as ac:  # a second client of the engine
            source, sink = topic_name(), topic_name()
            await ac.create_topic(source, 2)
            await ac.create_topic(sink)
            assert (await ac.get_topic(source))["partitions"] == 2
            consumer = await ac.subscribe(source, "work", initial_position="earliest")
            producer = await ac.create_producer(source)
            first = await producer.send(b"m0", key="k")
            pending = [await producer.send_nowait(f"m{i}".encode(), key=f"k{i}") for i in range(1, 20)]
            await producer.flush()
            assert all(f.done() for f in pending) and first.topic == source
            received = [await consumer.receive(timeout=20) for _ in range(10)]
            batches = []
            while sum(b.table.num_rows for b in batches) < 10:
                batch = await consumer.receive_batch(100, timeout_s=5)
                assert batch.table.num_rows, "messages missing"
                batches.append(batch)
            values = [m.value() for m in received] + [v for b in batches for v in b.table.column("value").to_pylist()]
            assert sorted(values) == sorted(f"m{i}".encode() for i in range(20))
            for batch in batches:
                await asyncio.wrap_future(batch.ack_async())

            # consume-transform-produce in one transaction
            out = await ac.create_producer(sink)
            async with ac.transaction() as txn:
                message = received[0]
                await out.send(message.value().upper(), txn=txn)
                await consumer.acknowledge(message, txn=txn)
            assert txn.state is TxnClientState.COMMITTED
            with pytest.raises(RuntimeError, match="transform failed"):
                async with ac.transaction() as doomed:
                    await out.send(b"never", txn=doomed)
                    raise RuntimeError("transform failed")
            assert doomed.state is TxnClientState.ABORTED
            check = await ac.subscribe(sink, "check", initial_position="earliest")
            assert (await check.receive(timeout=20)).value() == message.value().upper()
            with pytest.raises(Timeout):
                await check.receive(timeout=0.5)  # the aborted one never shows
            for closing in (check, consumer, out, producer):
                await closing.close()

    run_checked(body)


def test_a_cancelled_receive_takes_nothing_and_async_for_ends_at_close(client: rt.Client) -> None:
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        consumer = await ac.subscribe(topic, "s", initial_position="earliest")
        waiting = asyncio.ensure_future(consumer.receive())
        await asyncio.sleep(0.2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        producer = await ac.create_producer(topic)
        await producer.send(b"kept")
        assert (await consumer.receive(timeout=20)).value() == b"kept"  # the cancelled receive took nothing
        await producer.send(b"next")
        seen = []

        async def iterate() -> None:
            async for message in consumer:
                seen.append(message.value())

        iterating = asyncio.ensure_future(iterate())
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.05)
        await consumer.close()
        await asyncio.wait_for(iterating, 10)  # the iteration ends with the consumer
        assert seen == [b"next"]
        await producer.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)


def test_a_cancelled_commit_still_ends_the_txn_and_its_state_says_how(client: rt.Client) -> None:
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        producer = await ac.create_producer(topic)
        txn = await ac.new_transaction(timeout=30)
        await producer.send(b"committed anyway", txn=txn)
        committing = asyncio.ensure_future(txn.commit())
        await asyncio.sleep(0)
        committing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await committing
        for _ in range(400):
            if txn.state in (TxnClientState.COMMITTED, TxnClientState.ABORTED):
                break
            await asyncio.sleep(0.05)
        assert txn.state is TxnClientState.COMMITTED
        consumer = await ac.subscribe(topic, "s", initial_position="earliest")
        assert (await consumer.receive(timeout=20)).value() == b"committed anyway"
        await consumer.close()
        await producer.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)


def test_a_full_producer_awaits_room_and_a_transactional_id_fences_its_zombie(client: rt.Client) -> None:
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        producer = await ac.create_producer(topic, max_pending_messages=2, batching_max_messages=1)
        futures = [await producer.send_nowait(f"v{i}".encode()) for i in range(30)]  # awaits room, never blocks
        ids = await asyncio.gather(*futures)
        assert len(set(ids)) == 30
        tid = f"aio-{uuid.uuid4().hex[:6]}"
        epoch = await ac.register_transactional_id(tid)
        zombie = await ac.new_transaction(transactional_id=tid, epoch=epoch)
        await producer.send(b"zombie's", txn=zombie)
        successor_epoch = await ac.register_transactional_id(tid)  # a new incarnation: the zombie is fenced
        with pytest.raises(Fenced):
            await zombie.commit()
        successor = await ac.new_transaction(transactional_id=tid, epoch=successor_epoch)
        await producer.send(b"successor's", txn=successor)
        await successor.commit()
        consumer = await ac.subscribe(topic, "s", initial_position="earliest")
        values = [(await consumer.receive(timeout=20)).value() for _ in range(31)]
        assert b"zombie's" not in values and values[-1] == b"successor's"
        for closing in (consumer, producer):
            await closing.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)
