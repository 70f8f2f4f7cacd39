"""Bulk range reads (``raytxn.ledger.ranges``) against the real partition: the actor class runs in
one event loop without Ray on memory://, file:// and SeaweedFS S3, writing real ledgers; every
range read must equal what the partition's own ``read`` returns for the same range."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa
import pytest

from raytxn.actors.partition import PartitionBuffer
from raytxn.connectors.batches import batch_arrow_schema
from raytxn.errors import CorruptLedger, InvalidArgument, PositionTrimmed
from raytxn.ids import EARLIEST, Position, TxnID, partition_stream
from raytxn.ledger import ManagedLedger, chunk_path
from raytxn.ledger.ranges import RANGE_SCHEMA, read_range, read_range_async
from raytxn.ledger.storage import Storage
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, decode_entry, encode_entry, marker_header
from raytxn.protocol.txn_buffer import TransactionBuffer
from raytxn.protocol.txnlog import EndAction

TOPIC = "orders"
A, B, C = TxnID(0, 1), TxnID(0, 2), TxnID(0, 3)


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())


def message(value: bytes, key: str | None = None, **properties: str) -> bytes:
    from raytxn.protocol.entry_format import encode_message

    return encode_message(MessageRecord(value, key, dict(properties), event_time_ms=len(value)))


async def partition_rows(part: PartitionBuffer, start: Position, end: Position) -> list[dict[str, Any]]:
    """The rows the partition's own read path shows in ``start..end``."""
    rows: list[dict[str, Any]] = []
    position = start
    while position <= end:
        result = await part.read(position, 1000)
        for entry_position, records in result["entries"]:
            if entry_position > end:
                break
            header, messages = decode_entry(records)
            rows.extend(row(part.partition, entry_position, i, header, m) for i, m in enumerate(messages))
        if result["next"] == position:
            break
        position = result["next"]
    return rows


def row(partition: int, position: Position, index: int, header: EntryHeader, m: MessageRecord) -> dict[str, Any]:
    return {"key": m.key, "value": m.value, "properties": json.dumps(m.properties), "event_time": m.event_time_ms,
            "publish_time": header.publish_time_ms, "topic": TOPIC, "partition": partition,
            "message_id": f"{TOPIC}-{partition}:{position.ledger_id}:{position.entry_id}:{index}",
            "ledger_id": position.ledger_id, "entry_id": position.entry_id, "batch_index": index}


def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return pa.Table.from_batches(batches, schema=batches[0].schema if batches else RANGE_SCHEMA).to_pylist()


async def ranged(part: PartitionBuffer, start: Position, end: Position, **kwargs: Any) -> list[dict[str, Any]]:
    batches = await read_range_async(part.storage, TOPIC, part.partition, start, end,
                                     part.buffer.aborted_between(start, end), **kwargs)
    return rows_of(batches)


async def mixed_history(part: PartitionBuffer) -> None:
    """Plain data, a committed txn over two entries, an aborted one, markers, and txn C left open."""
    await part.append("plain", 0, [message(b"p0", "k0", origin="x"), message(b"p1"), message(b"p2", "k2")])
    await part.append("pa", 0, [message(b"a0", "ka"), message(b"a1")], txn=A)
    await part.append("pb", 0, [message(b"b0-aborted")], txn=B)
    await part.append("pa", 2, [message(b"a2")], txn=A)
    await part.end_txn(A, EndAction.COMMIT, -1)
    await part.append("pc", 0, [message(b"c0-open")], txn=C)
    await part.end_txn(B, EndAction.ABORT, -1)
    await part.append("plain", 3, [message(b"p3-after-open")])


def test_ranges_equal_the_partition_read_across_ledgers_and_stop_at_max_read(storage_url: tuple[str, dict]) -> None:
    url, options = storage_url

    async def main() -> None:
        part = PartitionBuffer(TOPIC, 0, url, options)
        await mixed_history(part)
        max_read = part.buffer.max_read_position
        first = Position(part._ledger.current_ledger_id, 0)
        rows = await ranged(part, first, max_read)
        assert [r["value"] for r in rows] == [b"p0", b"p1", b"p2", b"a0", b"a1", b"a2"]
        assert rows == await partition_rows(part, first, max_read)
        # C still open: nothing at or after its first entry is in a range (the caller's bound).
        assert max_read < part.buffer.last_position

        # A restart opens a new ledger; C then commits there, so the range spans both ledgers.
        part = PartitionBuffer(TOPIC, 0, url, options)
        await part.ready()
        assert part._ledger.current_ledger_id > first.ledger_id
        await part.append("pc", 1, [message(b"c1")], txn=C)
        await part.end_txn(C, EndAction.COMMIT, -1)
        await part.append("plain", 4, [message(b"p4", "k4")])
        end = part.buffer.max_read_position
        assert end == part.buffer.last_position and end.ledger_id > first.ledger_id
        rows = await ranged(part, first, end)
        assert [r["value"] for r in rows] == [b"p0", b"p1", b"p2", b"a0", b"a1", b"a2", b"c0-open",
                                              b"p3-after-open", b"c1", b"p4"]
        assert rows == await partition_rows(part, first, end)
        # Every sub-range, and small batches, agree too.
        middle = Position(first.ledger_id, 2)
        assert await ranged(part, middle, end) == await partition_rows(part, middle, end)
        assert await ranged(part, first, end, entries_per_batch=2) == rows

    run(main)


def test_aborted_span_hides_only_the_data_after_a_commit_of_the_same_txn() -> None:
    """A late append of a committed txn (reopened, then aborted by the dangling sweep) is hidden;
    the txn's committed data before is not. Written with the ledger and encoders directly."""
    storage = Storage.from_url(f"memory://{uuid.uuid4().hex}")
    stream = partition_stream(TOPIC, 1)

    def data(sequence: int, txn: TxnID | None, *values: bytes) -> list[bytes]:
        header = EntryHeader("data", txn, "p", sequence, sequence + len(values) - 1, len(values), 7)
        return encode_entry(header, [MessageRecord(v) for v in values])

    entries = [data(0, A, b"committed"), encode_entry(marker_header(EndAction.COMMIT, A, 8)),
               data(1, None, b"plain"), data(2, A, b"late"), encode_entry(marker_header(EndAction.ABORT, A, 9)),
               data(3, None, b"last")]

    async def main() -> None:
        ledger = await ManagedLedger.open(storage, stream)
        buffer = TransactionBuffer()
        for records in entries:
            position = await ledger.append(records)
            buffer.apply(decode_entry(records)[0], position)
        start, end = Position(ledger.current_ledger_id, 0), buffer.max_read_position
        aborted = buffer.aborted_between(start, end)
        assert [(a.txn, a.first_position.entry_id, a.marker_position.entry_id) for a in aborted] == [(A, 3, 4)]
        rows = rows_of(await read_range_async(storage, TOPIC, 1, start, end, aborted, columns=["value", "entry_id"]))
        assert rows == [{"value": b"committed", "entry_id": 0}, {"value": b"plain", "entry_id": 2},
                        {"value": b"last", "entry_id": 5}]
        # A range that misses the aborted span is handed no span, and needs none.
        assert buffer.aborted_between(start, Position(start.ledger_id, 2)) == []

    run(main)


def test_schema_extends_the_connectors_batch_schema_and_projects() -> None:
    assert RANGE_SCHEMA.names[:len(batch_arrow_schema().names)] == batch_arrow_schema().names
    assert pa.schema(list(RANGE_SCHEMA)[:8]).equals(batch_arrow_schema())
    url = f"memory://{uuid.uuid4().hex}"

    async def main() -> None:
        part = PartitionBuffer(TOPIC, 0, url)
        await part.append("p", 0, [message(b"x", "k", a="1")])
        start = Position(part._ledger.current_ledger_id, 0)
        batches = await read_range_async(part.storage, TOPIC, 0, start, start, columns=["message_id", "properties"])
        assert batches[0].schema.names == ["message_id", "properties"]
        assert rows_of(batches) == [{"message_id": f"{TOPIC}-0:{start.ledger_id}:0:0", "properties": '{"a": "1"}'}]
        with pytest.raises(InvalidArgument):
            await read_range_async(part.storage, TOPIC, 0, start, start, columns=["nope"])
        with pytest.raises(InvalidArgument):
            await read_range_async(part.storage, TOPIC, 0, Position(start.ledger_id, 1), start)
        with pytest.raises(InvalidArgument):
            await read_range_async(part.storage, TOPIC, 0, EARLIEST, start)

    run(main)


def test_sync_reader_on_file_storage(tmp_path: Any) -> None:
    url = f"file://{tmp_path}"

    async def write() -> Position:
        part = PartitionBuffer(TOPIC, 2, url)
        await part.append("p", 0, [message(b"one"), message(b"two")])
        return part.buffer.max_read_position

    end = run(write)
    batches = read_range(url, None, TOPIC, 2, Position(end.ledger_id, 0), end)
    assert rows_of(batches)[1]["value"] == b"two" and rows_of(batches)[1]["batch_index"] == 1


def test_a_corrupted_object_is_named_and_a_trimmed_range_refused() -> None:
    url = f"memory://{uuid.uuid4().hex}"

    async def main() -> None:
        part = PartitionBuffer(TOPIC, 0, url)
        for sequence in range(4):
            await part.append("p", sequence, [message(b"v%d" % sequence)])
        ledger_id = part._ledger.current_ledger_id
        start, end = Position(ledger_id, 0), part.buffer.max_read_position
        path = chunk_path(partition_stream(TOPIC, 0), ledger_id, 2)
        original = await part.storage.get(path)
        assert original is not None
        await part.storage.delete([path])
        await part.storage.create(path, original[:-1] + bytes([original[-1] ^ 1]))
        with pytest.raises(CorruptLedger) as error:
            await read_range_async(part.storage, TOPIC, 0, start, end)
        assert path in str(error.value)
        await part.storage.delete([path])
        await part.storage.create(path, original)
        assert len(rows_of(await read_range_async(part.storage, TOPIC, 0, start, end))) == 4

        await part.trim(Position(ledger_id, 2))
        with pytest.raises(PositionTrimmed):
            await read_range_async(part.storage, TOPIC, 0, start, end)
        assert [r["value"] for r in await ranged(part, Position(ledger_id, 2), end)] == [b"v2", b"v3"]

    run(main)


def test_a_range_read_retries_a_storage_outage_from_its_start_a_bounded_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk read in a Ray task met a list that took obstore more than 10 s on a loaded bucket
    (CI): one StorageUnavailable failed the task. It is read-only, so it starts again, up to
    READ_ATTEMPTS times; what keeps failing still fails, with the storage's own error."""
    from raytxn.errors import StorageUnavailable
    from raytxn.ledger import ranges

    calls: list[Position] = []
    outages = [2]

    async def flaky(storage: object, topic: str, partition: int, start: Position, *args: Any,
                    **kwargs: Any) -> list[pa.RecordBatch]:
        calls.append(start)
        if outages[0] > 0:
            outages[0] -= 1
            raise StorageUnavailable("list: timed out")
        return []

    monkeypatch.setattr(ranges, "read_range_async", flaky)
    monkeypatch.setattr(ranges, "READ_RETRY_FIRST_WAIT_S", 0.001)
    start, end = Position(0, 3), Position(0, 9)
    assert ranges.read_range("memory://", None, "t", 0, start, end) == []
    assert calls == [start] * 3
    calls.clear()
    outages[0] = ranges.READ_ATTEMPTS
    with pytest.raises(StorageUnavailable, match="timed out"):
        ranges.read_range("memory://", None, "t", 0, start, end)
    assert len(calls) == ranges.READ_ATTEMPTS
