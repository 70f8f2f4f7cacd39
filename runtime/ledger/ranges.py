"""Bulk range reads: a partition's committed messages in ``[start, end]`` as Arrow record batches,
straight from the ledger objects in storage, without asking the partition actor.

This is the executor side of the bulk path (docs/design.md §6, Spark's Kafka-source model): a driver plans
ranges (a subscription lease), any task reads them. The reader needs only what the lease carries:

* ``start..end``: entry positions of the partition's stream (``topics/<topic>/<p>``). **The caller
  must keep ``end`` at or below the partition's ``max_read_position``** (a lease guarantees it):
  below it every transaction has ended, so an entry's visibility follows from the entry itself and
  the aborted txns. Above it a txn may still be open, and nothing here can tell.
* ``aborted``: the partition's aborted txns whose hidden span meets the range
  (``TransactionBuffer.aborted_between``), each ``(txn, first_position, marker_position)``. A txn
  id alone is not enough: a txn's data after a COMMIT (a late append the dangling sweep aborted)
  is hidden while its committed data before is not; the span says which.

Visibility is then exactly the partition's ``read`` (``TransactionBuffer.is_visible``): markers are
skipped, plain data is visible, txn data is visible unless an aborted span holds its position.

Decoding is in bulk: one msgpack decode per ledger chunk read (the message records of all visible
entries joined into one array), then one Arrow array per column. Columns are those of
``connectors/batches.py`` (``key .. message_id``) followed by ``ledger_id, entry_id,
batch_index``; ``columns=`` projects, and a column nobody asked for is never built.

Errors: a missing, truncated or corrupted object raises ``CorruptLedger`` naming it (from the
ledger's checks, which every object read passes); a range starting below the stream's trim point
raises ``PositionTrimmed``, also when the trim happened while reading.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from raytxn.errors import CorruptLedger, InvalidArgument, StorageUnavailable
from raytxn.ids import Position, partition_stream
from raytxn.ledger.managed import READER_CONFIG, Entry, ManagedLedger
from raytxn.ledger.metadata import raise_if_trimmed
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import MessageRecord, decode_entry, decode_header
from raytxn.protocol.txn_buffer import AbortedTxn, HiddenSpans

# One ledger read (and one record batch at most) covers this many entries: bounds memory per step.
DEFAULT_ENTRIES_PER_BATCH = 1000
# A range read is read-only, so a storage outage is retried from the range's start, this many
# times with doubling waits (0.5 s, 1 s, 2 s), before the task fails: a Ray task is not retried
# on an application error unless its caller asked, and a bucket that answers a list in more than
# obstore's 10 s under load is an outage of seconds, not a lost range.
READ_ATTEMPTS = 4
READ_RETRY_FIRST_WAIT_S = 0.5

RANGE_SCHEMA = pa.schema([
    ("key", pa.string()), ("value", pa.binary()), ("properties", pa.string()),
    ("event_time", pa.int64()), ("publish_time", pa.int64()), ("topic", pa.string()),
    ("partition", pa.int32()), ("message_id", pa.string()),
    ("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("batch_index", pa.int32())])

_messages_decoder = msgspec.msgpack.Decoder(list[MessageRecord])
_EMPTY_PROPERTIES = "{}"


def _msgpack_array_header(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


class _Visible:
    """The visible entries of one chunk: their positions, publish times and message records."""

    def __init__(self) -> None:
        self.ledger_ids: list[int] = []
        self.entry_ids: list[int] = []
        self.counts: list[int] = []
        self.publish_times: list[int] = []
        self.records: list[bytes] = []

    def add(self, entry: Entry, count: int, publish_time_ms: int) -> None:
        self.ledger_ids.append(entry.position.ledger_id)
        self.entry_ids.append(entry.position.entry_id)
        self.counts.append(count)
        self.publish_times.append(publish_time_ms)
        self.records.extend(entry.records[1:])


def _select(entries: list[Entry], hidden: HiddenSpans, stream: str) -> _Visible:
    visible = _Visible()
    for entry in entries:
        where = f"{stream}@{entry.position}"
        header = decode_header(entry.records[0], where)
        if header.is_marker or hidden.hides(header.txn, entry.position):
            continue
        if len(entry.records) != header.count + 1:
            raise CorruptLedger(f"entry at {where} has {len(entry.records) - 1} messages, header says "
                                f"{header.count}", where)
        visible.add(entry, header.count, header.publish_time_ms)
    return visible


def _decode_messages(visible: _Visible, entries: list[Entry], stream: str) -> list[MessageRecord]:
    joined = _msgpack_array_header(len(visible.records)) + b"".join(visible.records)
    try:
        return _messages_decoder.decode(joined)
    except msgspec.DecodeError:
        for entry in entries:  # find the culprit, so the error names it
            decode_entry(entry.records, f"{stream}@{entry.position}")
        raise CorruptLedger(f"undecodable messages in {stream} between {entries[0].position} and "
                            f"{entries[-1].position}", stream) from None


def _properties_json(messages: list[MessageRecord]) -> list[str]:
    return [json.dumps(m.properties) if m.properties else _EMPTY_PROPERTIES for m in messages]


def _to_batch(visible: _Visible, messages: list[MessageRecord], topic: str, partition: int,
              schema: pa.Schema) -> pa.RecordBatch:
    counts = np.asarray(visible.counts, dtype=np.int64)
    total = int(counts.sum())
    ledger_ids = np.repeat(np.asarray(visible.ledger_ids, dtype=np.int64), counts)
    entry_ids = np.repeat(np.asarray(visible.entry_ids, dtype=np.int64), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    batch_index = (np.arange(total, dtype=np.int64) - starts).astype(np.int32)

    def message_ids() -> list[str]:
        prefix = f"{topic}-{partition}:"
        return [f"{prefix}{lid}:{eid}:{bi}" for lid, eid, bi in
                zip(ledger_ids.tolist(), entry_ids.tolist(), batch_index.tolist(), strict=True)]

    builders: dict[str, Any] = {
        "key": lambda: [m.key for m in messages],
        "value": lambda: [m.value for m in messages],
        "properties": lambda: _properties_json(messages),
        "event_time": lambda: [m.event_time_ms for m in messages],
        "publish_time": lambda: np.repeat(np.asarray(visible.publish_times, dtype=np.int64), counts),
        "topic": lambda: [topic] * total,
        "partition": lambda: np.full(total, partition, dtype=np.int32),
        "message_id": message_ids,
        "ledger_id": lambda: ledger_ids,
        "entry_id": lambda: entry_ids,
        "batch_index": lambda: batch_index,
    }
    arrays = [pa.array(builders[field.name](), type=field.type) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def range_schema(columns: Sequence[str] | None = None) -> pa.Schema:
    """The schema of range batches, projected to ``columns`` (in that order) when given."""
    if columns is None:
        return RANGE_SCHEMA
    unknown = [c for c in columns if c not in RANGE_SCHEMA.names]
    if unknown or not columns:
        raise InvalidArgument(f"unknown columns {unknown}; choose from {RANGE_SCHEMA.names}")
    return pa.schema([RANGE_SCHEMA.field(c) for c in columns])


def _check_range(start: Position, end: Position, entries_per_batch: int) -> None:
    if not (isinstance(start, Position) and isinstance(end, Position)):
        raise InvalidArgument(f"a range is two Positions, got {start!r}..{end!r}")
    if start.ledger_id < 0 or start.entry_id < 0 or end < start:
        raise InvalidArgument(f"invalid range {start}..{end}")
    if entries_per_batch < 1:
        raise InvalidArgument("entries_per_batch must be >= 1")


async def iter_range(storage: Storage, topic: str, partition: int, start: Position, end: Position,
                     aborted: Sequence[AbortedTxn] = (), *, columns: Sequence[str] | None = None,
                     entries_per_batch: int = DEFAULT_ENTRIES_PER_BATCH) -> AsyncIterator[pa.RecordBatch]:
    """Record batches of the visible messages of ``topic``/``partition`` in ``start..end``
    (inclusive), in append order; see the module docstring for what the caller guarantees."""
    _check_range(start, end, entries_per_batch)
    schema = range_schema(columns)
    hidden = HiddenSpans(aborted)
    stream = partition_stream(topic, partition)
    ledger = await ManagedLedger.open(storage, stream, READER_CONFIG, writable=False)
    position = start
    last_read: Position | None = None
    while True:
        try:
            entries = await ledger.read(position, max_entries=entries_per_batch, end=end)
        except CorruptLedger:
            await raise_if_trimmed(storage, stream, position)
            raise
        if not entries:
            break
        last_read = entries[-1].position
        position = Position(last_read.ledger_id, last_read.entry_id + 1)
        visible = _select(entries, hidden, stream)
        if visible.records:
            messages = _decode_messages(visible, entries, stream)
            yield _to_batch(visible, messages, topic, partition, schema)
        if last_read >= end:
            break
    if last_read != end:
        raise InvalidArgument(f"{stream} holds no entry {end} (read up to {last_read}): a range must end at an "
                              "entry at or below the partition's max_read_position")


async def read_range_async(storage: Storage, topic: str, partition: int, start: Position, end: Position,
                           aborted: Sequence[AbortedTxn] = (), *, columns: Sequence[str] | None = None,
                           entries_per_batch: int = DEFAULT_ENTRIES_PER_BATCH) -> list[pa.RecordBatch]:
    """All batches of ``iter_range`` (a lease's range is bounded, so this is too)."""
    return [batch async for batch in iter_range(storage, topic, partition, start, end, aborted, columns=columns,
                                                entries_per_batch=entries_per_batch)]


def read_range(storage_url: str, storage_options: dict[str, Any] | None, topic: str, partition: int,
               start: Position, end: Position, aborted: Sequence[AbortedTxn] = (), *,
               columns: Sequence[str] | None = None,
               entries_per_batch: int = DEFAULT_ENTRIES_PER_BATCH) -> list[pa.RecordBatch]:
    """``read_range_async`` for synchronous callers (Spark and Ray tasks), given the storage URL
    and options the engine runs on. Not from inside a running event loop."""
    storage = Storage.from_url(storage_url, **(storage_options or {}))

    async def read_retrying() -> list[pa.RecordBatch]:
        async def read() -> list[pa.RecordBatch]:
            return await read_range_async(storage, topic, partition, start, end, aborted, columns=columns,
                                          entries_per_batch=entries_per_batch)

        for retry in range(READ_ATTEMPTS - 1):
            try:
                return await read()
            except StorageUnavailable:
                await asyncio.sleep(READ_RETRY_FIRST_WAIT_S * 2**retry)
        return await read()  # the last attempt: its outage is the caller's

    return asyncio.run(read_retrying())
