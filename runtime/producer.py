"""Producers: batching, key routing, idempotent retries, transactional sends.

Routing: a message with a key goes to ``murmur2(key) % partitions`` (Kafka's default
partitioner, so the same key lands where a Kafka producer would put it); without a key, batches
go round-robin over the partitions.

Batching: messages for one (partition, transaction) accumulate until ``batching_max_messages``,
``batching_max_bytes`` or ``batching_max_delay_ms``; a batch is one ledger entry and its messages
get batch indexes 0..n-1.

Idempotence: every batch gets its sequence ids (per producer and partition, contiguous) when it is
sealed, and one batch per partition is in flight at a time, strictly in order. A batch retried
after the partition actor died carries the same producer name and sequence ids, so the partition
stores it once. A producer re-created with the same name continues above the highest sequence id
each partition holds for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.entry_format import MessageRecord
from runtime.errors import InvalidArgument, MessageTooLarge
from runtime.hashing import partition_for
from runtime.ids import partition_actor_name
from runtime.message import MessageId
from runtime.rpc import ActorRef
from runtime.transaction import Transaction

if TYPE_CHECKING:
    from runtime.client import Client


@dataclass
class _Batch:
    partition: int
    txn: Transaction | None
    messages: list[MessageRecord] = field(default_factory=list)
    futures: list[concurrent.futures.Future] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


class Producer:
    def __init__(self, client: Client, topic: str, partitions: int, producer_name: str | None = None,
                 batching_max_messages: int = 1000, batching_max_bytes: int = 128 << 10,
                 batching_max_delay_ms: float = 1.0, send_timeout_s: float = 60.0,
                 max_message_bytes: int = 5 << 20) -> None:
        if batching_max_messages < 1 or batching_max_bytes < 1 or batching_max_delay_ms < 0:
            raise InvalidArgument("batching limits must be positive")
        self._client = client
        self.topic = topic
        self.partitions = partitions
        self.producer_name = producer_name or f"producer-{uuid.uuid4().hex[:12]}"
        self.max_messages = batching_max_messages
        self.max_bytes = batching_max_bytes
        self.max_delay_s = batching_max_delay_ms / 1000
        self.send_timeout_s = send_timeout_s
        self.max_message_bytes = max_message_bytes
        self._refs = [ActorRef(partition_actor_name(topic, p), client.token) for p in range(partitions)]
        self._open: dict[tuple[int, Any], _Batch] = {}
        self._sealed: list[deque[_Batch]] = [deque() for _ in range(partitions)]
        self._sending: list[asyncio.Task | None] = [None] * partitions
        self._next_sequence = [0] * partitions
        self._round_robin = itertools.cycle(range(partitions))
        self._keyless_partition = next(self._round_robin)
        self._closed = False
        if producer_name is not None:  # continue above what the partitions hold for this name
            self._next_sequence = client.loop.run(self._last_sequences())

    async def _last_sequences(self) -> list[int]:
        values = await asyncio.gather(*(ref.call_async("last_sequence", self.producer_name) for ref in self._refs))
        return [v + 1 for v in values]

    # --- public API ------------------------------------------------------------------------

    def send(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
             event_time: int | None = None, txn: Transaction | None = None) -> MessageId:
        """Send and wait until the message is durable; returns its id."""
        future = self.send_async(value, key, properties, event_time, txn)
        self.flush_partition_of(future)
        return future.result()

    def send_async(self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None,
                   event_time: int | None = None, txn: Transaction | None = None) -> concurrent.futures.Future:
        """Queue a message; the future resolves to its MessageId once durable."""
        if self._closed:
            raise InvalidArgument(f"producer {self.producer_name} is closed")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"value must be bytes, not {type(value).__name__}")
        value = bytes(value)
        if len(value) > self.max_message_bytes:
            raise MessageTooLarge(f"message of {len(value)} bytes exceeds {self.max_message_bytes}")
        if txn is not None:
            txn.check_open()
        record = MessageRecord(value, key, dict(properties or {}), event_time)
        future: concurrent.futures.Future = concurrent.futures.Future()
        future._raytxn_partition = None  # type: ignore[attr-defined]
        if txn is not None and self not in txn._flushers:
            txn._flushers.add(self)  # commit flushes this producer's batches of the txn and waits
        self._client.loop.call_soon(self._enqueue, record, future, txn)
        return future

    def flush(self) -> None:
        """Send everything queued and wait until it is durable."""
        self._client.loop.run(self._flush(None))

    def flush_txn(self, txn: Transaction) -> None:
        self._client.loop.run(self._flush(txn))
        txn._flushers.discard(self)

    def flush_partition_of(self, future: concurrent.futures.Future) -> None:
        self._client.loop.call_soon(self._seal_all)

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    # --- on the client loop ----------------------------------------------------------------

    def _route(self, record: MessageRecord) -> int:
        if record.key is not None:
            return partition_for(record.key, self.partitions)
        return self._keyless_partition

    def _enqueue(self, record: MessageRecord, future: concurrent.futures.Future, txn: Transaction | None) -> None:
        partition = self._route(record)
        future._raytxn_partition = partition  # type: ignore[attr-defined]
        key = (partition, txn.id if txn else None)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch(partition, txn)
            batch.timer = self._client.loop.loop.call_later(self.max_delay_s, self._seal, key)
        batch.messages.append(record)
        batch.futures.append(future)
        batch.size += len(record.value)
        if len(batch.messages) >= self.max_messages or batch.size >= self.max_bytes:
            self._seal(key)

    def _seal(self, key: tuple[int, Any]) -> None:
        batch = self._open.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        if batch.partition == self._keyless_partition:  # keyless traffic moves on, batch by batch
            self._keyless_partition = next(self._round_robin)
        self._sealed[batch.partition].append(batch)
        if self._sending[batch.partition] is None:
            self._sending[batch.partition] = asyncio.get_running_loop().create_task(self._send_loop(batch.partition))

    def _seal_all(self, txn: Transaction | None = None) -> None:
        for key in list(self._open):
            if txn is None or key[1] == txn.id:
                self._seal(key)

    async def _flush(self, txn: Transaction | None) -> None:
        self._seal_all(txn)
        tasks = [t for t in self._sending if t is not None]
        if tasks:
            await asyncio.gather(*(asyncio.shield(t) for t in tasks), return_exceptions=True)

    async def _send_loop(self, partition: int) -> None:
        queue = self._sealed[partition]
        try:
            while queue:
                batch = queue.popleft()
                first = self._next_sequence[partition]
                self._next_sequence[partition] += len(batch.messages)
                await self._send_batch(batch, first)
        finally:
            self._sending[partition] = None
            if queue:  # sealed while we were finishing
                self._sending[partition] = asyncio.get_running_loop().create_task(self._send_loop(partition))

    async def _send_batch(self, batch: _Batch, first_sequence: int) -> None:
        txn = batch.txn
        try:
            if txn is not None:
                await txn.register("partition", (self.topic, batch.partition))
            result = await self._refs[batch.partition].call_async(
                "append", self.producer_name, first_sequence, batch.messages, txn.id if txn else None,
                deadline_s=self.send_timeout_s)
        except BaseException as e:  # noqa: BLE001 - every message of the batch learns why
            if txn is not None:
                txn.fail(e)  # the txn can no longer commit: its writes would be partial
            for future in batch.futures:
                if not future.done():
                    future.set_exception(e)
            return
        position = result.position
        for index, future in enumerate(batch.futures):
            message_id = MessageId(self.topic, batch.partition, position.ledger_id if position else -1,
                                   position.entry_id if position else -1, index)
            if not future.done():
                future.set_result(message_id)
