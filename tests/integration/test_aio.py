"""The asyncio API (``raytxn.aio``) on the real engine, every test under asyncio's debug mode
with a small ``slow_callback_duration`` (``tests.aio_loop.run_checked``): a raytxn call that
blocked the loop (a thread waiting on a lock, an actor, a timer) shows up as a slow callback, and
fails the test."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

import raytxn as rt
from raytxn import aio
from raytxn.client import aio as aio_client
from raytxn.client.transaction import TxnClientState
from raytxn.errors import (
    Fenced,
    InvalidArgument,
    MessageTooLarge,
    Timeout,
    TransactionAlreadyAborted,
    TransactionAlreadyCommitted,
    TransactionTimedOut,
)
from tests import aio_loop
from tests.aio_loop import run_checked
from tests.engine import engine_client

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def client(ray_session: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rt.Client]:
    yield from engine_client(tmp_path_factory)


def topic_name() -> str:
    return f"aio-{uuid.uuid4().hex[:8]}"


def test_the_check_fails_a_loop_blocked_by_a_sync_call(client: rt.Client) -> None:
    """What the other tests rely on: a sync receive waiting on an empty topic in the loop (what
    ``raytxn.aio`` exists to avoid) fails the check, while the canary loop keeps its time."""
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        consumer = await ac.subscribe(topic, "s")
        with pytest.raises(Timeout):
            consumer.sync.receive(timeout=0.5)  # blocks the loop half a second
        await consumer.close()
        ac.workers.shutdown(wait=False)

    with pytest.raises(AssertionError, match=r"a step took ([1-9]|0\.[5-9])"):
        run_checked(body)


def test_the_check_fails_a_hung_body_with_where_its_tasks_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body that awaits what never completes fails the check with its await's place, long
    before pytest-timeout's thread dump (which shows the loop in ``select``, not the await)."""
    monkeypatch.setattr(aio_loop, "HUNG_AFTER_S", 0.5)

    async def body() -> None:
        await asyncio.get_running_loop().create_future()  # nothing ever completes it

    with pytest.raises(AssertionError, match=r"still awaited after 0.5s; tasks wait at .*test_aio.py:\d+"):
        run_checked(body)


@pytest.mark.parametrize("turn_every_s", [0.0, 1e9], ids=["at-once", "never"])
def test_calls_that_need_no_wait_let_the_loop_turn_by_the_clock(client: rt.Client, monkeypatch: pytest.MonkeyPatch,
                                                                turn_every_s: float) -> None:
    """A send with room, or a receive with a message queued, does not suspend; every
    ``YIELD_EVERY`` such calls it reads the clock and lets the loop turn once ``TURN_EVERY_S``
    passed, so a loop filling a producer or draining a deep queue never holds it for long. With
    the interval at 0 another task runs once every ``YIELD_EVERY`` calls; never, not once."""
    monkeypatch.setattr(aio_client, "TURN_EVERY_S", turn_every_s)
    turns = 10
    count = aio_client.YIELD_EVERY * turns

    async def body() -> tuple[int, int]:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        consumer = await ac.subscribe(topic, "s")
        producer = await ac.create_producer(topic)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = ticks
        for _ in range(count):
            await producer.send_nowait(b"m")
        while_sending = ticks - before
        await producer.flush()
        for _ in range(600):  # bounded: until every message is queued in the consumer
            if consumer.sync._queued >= count:
                break
            await asyncio.sleep(0.05)
        assert consumer.sync._queued == count
        before = ticks
        for _ in range(count):
            await consumer.receive()
        while_receiving = ticks - before
        ticking.cancel()
        await producer.close()
        await consumer.close()
        ac.workers.shutdown(wait=False)
        return while_sending, while_receiving

    expected = turns if turn_every_s == 0 else 0
    assert asyncio.run(body()) == (expected, expected)


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


def test_an_awaited_ack_in_a_txn_of_a_message_of_a_batch_entry_does_not_wait_for_the_commit(client: rt.Client) -> None:
    """Acks in a txn of a batch entry's messages may be held until the entry is whole or the
    commit; an awaited one is sent at once instead. It was held: its future waited for the
    commit, which waited for it (CI hung on it when the first message received was in a batch)."""

    async def body() -> None:
        async with await aio.connect(storage=client.config.storage_url) as ac:
            source, sink = topic_name(), topic_name()
            await ac.create_topic(source)
            await ac.create_topic(sink)
            consumer = await ac.subscribe(source, "work", initial_position="earliest")
            producer = await ac.create_producer(source)
            for i in range(5):  # one batch entry of five messages
                await producer.send_nowait(f"m{i}".encode())
            await producer.flush()
            first = await consumer.receive(timeout=20)
            assert first.batch_size > 1, "the five were not batched: nothing tested"
            out = await ac.create_producer(sink)
            async with ac.transaction() as txn:
                await out.send(first.value().upper(), txn=txn)
                await asyncio.wait_for(consumer.acknowledge(first, txn=txn), 20)  # held: waited for ever
            assert txn.state is TxnClientState.COMMITTED
            for closing in (consumer, out, producer):
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


def test_a_cancelled_commit_still_ends_the_txn_and_the_next_call_says_how(client: rt.Client) -> None:
    """A commit cancelled right away still commits, and the next ``commit`` waits for it and
    returns (``abort`` then says it is committed); one that can only abort (its timeout passed)
    still aborts, and the next ``commit`` says so, chained to why; acks in a txn whose caller is
    cancelled while they await still go into the txn."""
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
        await txn.commit()  # the next call: waits for the cancelled one's end, then says it committed
        assert txn.state is TxnClientState.COMMITTED
        with pytest.raises(TransactionAlreadyCommitted):
            await txn.abort()

        late = await ac.new_transaction(timeout=1)
        await producer.send(b"too late", txn=late)
        await asyncio.sleep(1.2)  # past its timeout: its commit can only abort
        committing = asyncio.ensure_future(late.commit())
        await asyncio.sleep(0)
        committing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await committing
        with pytest.raises(TransactionAlreadyAborted) as said:
            await late.commit()
        assert isinstance(said.value.__cause__, TransactionTimedOut), said.value.__cause__
        assert late.state is TxnClientState.ABORTED
        await late.abort()  # aborted already: nothing to do

        # Acks in a txn of the messages of one entry share one future: a cancelled caller must
        # not cancel it for the others, and its ack goes on, so the commit covers both.
        pair = [await producer.send_nowait(value) for value in (b"a", b"b")]
        await producer.flush()
        assert len({((await f).ledger_id, (await f).entry_id) for f in pair}) == 1, "one entry"
        consumer = await ac.subscribe(topic, "s", initial_position="earliest")
        first = await consumer.receive(timeout=20)
        assert first.value() == b"committed anyway"
        a, b = [await consumer.receive(timeout=20) for _ in range(2)]
        acking = await ac.new_transaction(timeout=30)
        await consumer.acknowledge(first, txn=acking)
        ack_a = asyncio.ensure_future(consumer.acknowledge(a, txn=acking))
        ack_b = asyncio.ensure_future(consumer.acknowledge(b, txn=acking))
        await asyncio.sleep(0)
        ack_a.cancel()  # its caller stops waiting
        await ack_b  # b's caller was not cancelled: it gets its answer
        await acking.commit()
        assert acking.state is TxnClientState.COMMITTED
        await consumer.close()
        again = await ac.subscribe(topic, "s")
        with pytest.raises(Timeout):
            await again.receive(timeout=1)  # all acked in the committed txn: never delivered again
        await again.close()
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


def test_send_batch_awaits_many_messages_in_one_call_in_order_and_in_txns(client: rt.Client) -> None:
    """``send_batch`` takes a list or an Arrow array (with keys) in one await, in input order;
    bad input queues nothing; in a txn its messages show once committed, never once aborted."""
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        producer = await ac.create_producer(topic)
        consumer = await ac.subscribe(topic, "s")
        ids = await producer.send_batch([b"a", b"b", b"c"], keys=["k", None, "k"])
        assert len(ids) == 3 and ids == sorted(ids, key=lambda i: (i.ledger_id, i.entry_id, i.batch_index))
        durable = await producer.send_batch_nowait(pa.array([b"d", b"e"], pa.binary()))
        assert len(await durable) == 2
        with pytest.raises(InvalidArgument):
            await producer.send_batch([b"f", "not bytes"])
        with pytest.raises(MessageTooLarge):
            await producer.send_batch([b"g", b"x" * (producer.sync.max_message_bytes + 1)])
        async with ac.transaction() as txn:
            await producer.send_batch([b"committed-1", b"committed-2"], txn=txn)
        aborted = await ac.new_transaction()
        await producer.send_batch_nowait([b"aborted"], txn=aborted)
        await aborted.abort()
        await producer.send(b"last")
        values = [(await consumer.receive(timeout=20)).value() for _ in range(8)]
        assert values == [b"a", b"b", b"c", b"d", b"e", b"committed-1", b"committed-2", b"last"]
        with pytest.raises(Timeout):
            await consumer.receive(timeout=0.5)
        for closing in (consumer, producer):
            await closing.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)


def test_batch_receive_seek_and_unsubscribe_await(client: rt.Client) -> None:
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        producer = await ac.create_producer(topic)
        ids = [await producer.send(f"m{i}".encode()) for i in range(10)]
        consumer = await ac.subscribe(topic, "s", initial_position="earliest")
        first = await consumer.batch_receive(4, timeout=10)  # four are there (or come): no need to wait longer
        rest = await consumer.batch_receive(100, timeout=0.5)  # fewer than 100 by the timeout: what there is
        assert [m.value() for m in first + rest] == [f"m{i}".encode() for i in range(10)]
        assert await consumer.batch_receive(5, timeout=0.2) == []
        await consumer.seek(ids[7])  # from the 8th again
        assert [(await consumer.receive(timeout=10)).value() for _ in range(3)] == [b"m7", b"m8", b"m9"]
        assert [row["subscription"] for row in await consumer.stats()] == ["s"]
        assert (await ac.get_topic(topic))["subscriptions"] == ["s"]
        await consumer.unsubscribe()
        assert (await ac.get_topic(topic))["subscriptions"] == []
        await producer.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)


# --- cancellation: no half-state ----------------------------------------------------------------


def test_receives_cancelled_at_any_moment_lose_and_repeat_nothing(client: rt.Client) -> None:
    """Receives cancelled at seeded random moments (before, while and after a message arrives),
    and receives that time out: every message is received once, and no waiter is left behind
    (a consumer's watchers are as many as its receives waiting, not as its history)."""
    rng = random.Random(61)

    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic)
        consumer = await ac.subscribe(topic, "s", initial_position="earliest")
        producer = await ac.create_producer(topic, batching_max_messages=1)
        got: list[bytes] = []
        cancelled = 0
        for i in range(40):
            receiving = asyncio.ensure_future(consumer.receive(timeout=10))
            sending = await producer.send_nowait(f"m{i}".encode())
            await asyncio.sleep(rng.choice([0, 0.001, 0.003, 0.01]))
            if receiving.cancel():
                cancelled += 1
            try:
                got.append((await receiving).value())
            except asyncio.CancelledError:
                pass
            await sending
        while len(got) < 40:
            got.append((await consumer.receive(timeout=20)).value())
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(40)), got
        assert 0 < cancelled < 40  # some receives were cancelled while waiting, some got theirs first
        for _ in range(100):  # waits that end empty-handed: nothing is there twice
            with pytest.raises(Timeout):
                await consumer.receive(timeout=0.001)
            assert (await consumer.receive_batch(10, timeout_s=0.001)).num_rows == 0
        assert consumer.sync._watchers == []  # 240 waits came and went: none left its watcher
        for closing in (consumer, producer):
            await closing.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)


# --- the bulk path and compacted topics ---------------------------------------------------------


def test_leases_are_leased_read_acked_released_and_renewed_without_blocking_the_loop(client: rt.Client) -> None:
    """The bulk path awaited: a lease reads committed data only (the chunks decoded on the
    workers); its ack in a committed txn moves past the range, in an aborted one hands it out
    again, as release does; renew; a plain ack."""
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic, 2)
        producer = await ac.create_producer(topic)
        for i in range(30):
            await producer.send_nowait(f"plain{i}".encode(), key=str(i))
        aborted = await ac.new_transaction()
        await producer.send(b"aborted", key="0", txn=aborted)
        await aborted.abort()
        committed = await ac.new_transaction()
        await producer.send(b"committed", key="1", txn=committed)
        await committed.commit()
        await producer.flush()
        expected = sorted([f"plain{i}".encode() for i in range(30)] + [b"committed"])

        first = await ac.lease_ranges(topic, "bulk", "reader")
        assert len(first.leases) == 2 and first.entries >= 2
        read = await first.read_all(columns=["value"])
        assert sorted(read.column("value").to_pylist()) == expected
        chunked = [await first.read(chunk, ["value"]) for chunk in first.chunks(max_entries=1)]
        assert sorted(v for t in chunked for v in t.column("value").to_pylist()) == expected
        async with ac.transaction() as txn:
            await first.acknowledge(txn)
        assert txn.state is TxnClientState.COMMITTED
        assert not await ac.lease_ranges(topic, "bulk", "reader")  # past the cursor: nothing

        await producer.send(b"late", key="2")
        second = await ac.lease_ranges(topic, "bulk", "reader")
        await second.renew(30)
        await second.release()  # given back: the next lease starts at it again
        third = await ac.lease_ranges(topic, "bulk", "reader")
        ranges = {p: (lease.start, lease.end) for p, lease in second.leases.items()}
        assert {p: (lease.start, lease.end) for p, lease in third.leases.items()} == ranges
        txn = await ac.new_transaction()
        await third.acknowledge(txn)
        await txn.abort()  # hands the range out again
        fourth = await ac.lease_ranges(topic, "bulk", "reader")
        assert {p: (lease.start, lease.end) for p, lease in fourth.leases.items()} == ranges
        assert (await fourth.read_all(["value"])).column("value").to_pylist() == [b"late"]
        await fourth.acknowledge_plain()
        assert not await ac.lease_ranges(topic, "bulk", "reader")
        await producer.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)


def test_a_table_view_and_a_compacted_reader_follow_commits_without_blocking_the_loop(client: rt.Client) -> None:
    async def body() -> None:
        ac = aio.AsyncClient(client)
        topic = topic_name()
        await ac.create_topic(topic, 2)
        producer = await ac.create_producer(topic)
        for key, value in [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("c", b"")]:
            await producer.send(value, key=key)
        assert len(await ac.compact(topic)) == 2
        assert {r["key"]: r["value"] for p in (0, 1) for r in await ac.read_compacted(topic, p)}.get("a") == b"2"

        async with await ac.table_view(topic, poll_interval_s=0.05) as view:
            assert view.items() == {"a": b"2", "b": b"1"} and len(view) == 2 and "c" not in view
            heard: list[tuple[str, bytes | None]] = []
            view.listen(lambda key, value: heard.append((key, value)))
            await producer.send(b"", key="b")  # b deleted
            txn = await ac.new_transaction()
            await producer.send(b"open", key="a", txn=txn)
            await view.refresh()
            assert view.get("a") == b"2" and view.get("b") is None  # the open txn's value not yet
            await txn.commit()
            position = await view.refresh()  # everything committed before the call
            assert view.get("a") == b"open" and position == view.position
            assert ("a", b"open") in heard and ("b", None) in heard

        compacted = {p: await ac.read_compacted(topic, p) for p in (0, 1)}
        partition = next(p for p in (0, 1) if any(r["key"] == "a" for r in compacted[p]))
        async with await ac.compacted_reader(topic, partition, poll_interval_s=0.05) as reader:
            ready = await reader.read_available()
            assert ready and ready[-1]["key"] == "a" and ready[-1]["value"] == b"open"
            with pytest.raises(Timeout):
                await reader.read_next(timeout=0.3)
            seen: list[dict] = []

            async def follow() -> None:
                async for record in reader:
                    seen.append(record)

            following = asyncio.ensure_future(follow())
            await producer.send(b"later", key="a")
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.05)
            assert [(r["key"], r["value"]) for r in seen] == [("a", b"later")]
            reader.seek(0)  # back into the compacted view: the follower reads it again
            for _ in range(200):
                if len(seen) > 1:
                    break
                await asyncio.sleep(0.05)
            assert seen[1]["offset"] < seen[0]["offset"]
            await reader.close()
            await asyncio.wait_for(following, 10)  # the iteration ends with the reader
        await producer.close()
        ac.workers.shutdown(wait=False)

    run_checked(body)
