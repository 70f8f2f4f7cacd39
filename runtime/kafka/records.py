"""Kafka record batches (magic 2, ``kafka.record``) to and from raytxn messages and entries.

Produce: each record batch of a partition becomes one raytxn append (one entry), so a Kafka
batch's producer id, epoch and base sequence map onto one raytxn producer batch.

Produce accepts every codec (``codecs``: gzip, snappy, lz4, zstd), decompressed within a bound.

Fetch: each raytxn entry becomes one uncompressed record batch at the entry's base offset (legal:
Kafka brokers too re-compress per topic). A DATA entry of a transaction is a transactional batch
whose producer id stands for that transaction (``mapping.txn_producer_id``); a COMMIT/ABORT
marker is a control batch of one record with the same producer id, as Kafka writes them, so
read_committed clients match markers to data.

Lossy corners (raytxn messages hold a str key and str properties): a record key and header values
must be UTF-8 (else INVALID_RECORD); a null value is stored as empty bytes.

Both directions first try the bulk path (``record_batches``: a whole batch at a time in numpy, for
records without headers, which is most of them); a batch it does not take is parsed or built a
record at a time with kafka-python, which also names what is wrong with a bad one.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raytxn.errors import InvalidArgument
from raytxn.kafka import codecs, record_batches
from raytxn.kafka.mapping import txn_producer_id
from raytxn.protocol.compaction import CompactedRun
from raytxn.protocol.entry_format import (
    EntryHeader,
    MessageRecord,
    decode_entry,
    decode_entry_header,
    decode_message,
    encode_message,
)
from raytxn.protocol.offsets import message_timestamp
from raytxn.protocol.packed_records import PackedRecords
from raytxn.protocol.record_layout import PlainLayout, encode_plain, keys_are_utf8, plain_layout

_CONTROL_KEY = struct.Struct(">hh")    # version 0, type (0 abort, 1 commit)
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch
_BATCH_SIZE_LIMIT = 1 << 31
_HEADER_BYTES = DefaultRecordBatch.HEADER_STRUCT.size  # 61: the records (maybe compressed) follow
# A batch's records past this once decompressed are refused (MESSAGE_TOO_LARGE) before they are
# held: the ledger's largest entry (``LedgerConfig.max_entry_bytes``), which they could not pass.
MAX_RECORDS_BYTES = 8 << 20
_PRODUCER_ID_AT = 43  # base offset 8, length 4, leader epoch 4, magic 1, CRC 4, attributes 2, .. 2 timestamps 16


@dataclass(frozen=True)
class ProducedBatch:
    """One record batch of a Produce request, its records encoded as raytxn message records."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    records: list[bytes]
    codec: int = codecs.NONE

    @property
    def messages(self) -> list[MessageRecord]:
        return [decode_message(record) for record in self.records]


def _text(data: bytes | None, what: str) -> str | None:
    if data is None:
        return None
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"a record {what} must be UTF-8 to be stored in raytxn: {e}") from e


def decode_batches(data: bytes | None, limit: int = MAX_RECORDS_BYTES) -> list[ProducedBatch]:
    """The record batches of one partition's Produce data, all or none: ``codecs.CorruptBatch``
    (CORRUPT_MESSAGE) for a batch that is truncated, fails its CRC or whose records do not
    parse, ``codecs.UnsupportedCodec`` for a codec id past zstd, ``codecs.TooLarge`` for records
    that inflate past ``limit`` bytes, ``InvalidArgument`` (INVALID_RECORD) for a batch that is not
    magic 2, is a control batch, or holds a key or header that is not UTF-8."""
    batches, pos, view = [], 0, memoryview(data or b"")
    while pos < len(view):  # bounded: each batch moves ``pos`` on by at least a header
        if len(view) - pos < _HEADER_BYTES:
            raise codecs.CorruptBatch(f"truncated record batch: {len(view) - pos} bytes")
        (length,) = struct.unpack_from(">i", view, pos + 8)
        size = length + DefaultRecordBatch.AFTER_LEN_OFFSET
        if size < _HEADER_BYTES or pos + size > len(view):
            raise codecs.CorruptBatch(f"record batch announces {length} bytes, {len(view) - pos - 12} follow")
        if view[pos + 16] != 2:
            raise InvalidArgument(f"record batch of magic {view[pos + 16]}: only magic 2 is served")
        batches.append(_decode_batch(bytes(view[pos:pos + size]), limit))
        pos += size
    return batches


def _decode_batch(raw: bytes, limit: int) -> ProducedBatch:
    (_, _, _, _, crc, attributes, _, base_timestamp, _, producer_id, producer_epoch, base_sequence,
     count) = record_batches.HEADER.unpack_from(raw)
    if crc32c.crc32c(memoryview(raw)[record_batches.CRC_FROM:]) != crc:
        raise codecs.CorruptBatch("record batch fails its CRC")
    if attributes & record_batches.CONTROL:
        raise InvalidArgument("clients may not produce control batches")
    codec = attributes & codecs.CODEC_MASK
    if codec == codecs.NONE:
        if len(raw) - _HEADER_BYTES > limit:
            raise codecs.TooLarge(f"{len(raw) - _HEADER_BYTES} bytes of records exceed the limit of {limit}")
        plain = raw
    else:  # kafka-python reads the records as if they had been sent plain
        inflated = bytearray(raw[:_HEADER_BYTES]) + codecs.decompress(codec, memoryview(raw)[_HEADER_BYTES:], limit)
        struct.pack_into(">h", inflated, DefaultRecordBatch.ATTRIBUTES_OFFSET, attributes & ~codecs.CODEC_MASK)
        plain = bytes(inflated)
    transactional = bool(attributes & record_batches.TRANSACTIONAL)
    # LOG_APPEND_TIME (a broker's stamp, never a producer's): kafka-python reads it, as Kafka does
    records = None if attributes & record_batches.LOG_APPEND_TIME else _bulk_records(plain, count, base_timestamp)
    if records is None:
        records = [encode_message(m) for m in _parsed_messages(plain)]
    return ProducedBatch(producer_id, producer_epoch, base_sequence, transactional, records, codec)


def _bulk_records(plain: bytes, count: int, base_timestamp: int) -> list[bytes] | None:
    """The batch's records encoded for raytxn by the bulk path, or None for it to be parsed the
    slow way (headers, a null value, a negative timestamp, a key that is not UTF-8, garbage)."""
    if count < 1:
        return None
    decoded = record_batches.decode_records(plain[_HEADER_BYTES:], count, base_timestamp)
    if decoded is None:
        return None
    source, layout = decoded
    if np.any(layout.event_times < 0) or not keys_are_utf8(source, layout):
        return None
    data, lengths = encode_plain(source, layout)
    return PackedRecords(data, np.cumsum(lengths)).to_list()


def _parsed_messages(plain: bytes) -> list[MessageRecord]:
    batch = DefaultRecordBatch(plain)
    try:
        return [MessageRecord(bytes(record.value or b""), _text(record.key, "key"),
                              {k: _text(v, f"header {k!r}") or "" for k, v in record.headers},
                              record.timestamp)
                for record in batch]
    except InvalidArgument:
        raise
    except Exception as e:  # kafka-python's parser: CorruptRecordError, or worse on garbage
        raise codecs.CorruptBatch(f"the records of a batch do not parse: {e!r}") from e


class _ControlBatchBuilder(DefaultRecordBatchBuilder):
    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK


def encode_entry(base_offset: int, records: Sequence[bytes]) -> tuple[EntryHeader, bytes]:
    """One raytxn entry (its records as stored, a list or packed) as a record batch at ``base_offset``."""
    header = decode_entry_header(records)
    producer_id = txn_producer_id(header.txn) if header.txn is not None else -1
    if not header.is_marker:
        batch = _bulk_batch(base_offset, header, records, producer_id)
        if batch is not None:
            return header, batch
    return header, _built_batch(base_offset, records, producer_id)


def _bulk_batch(base_offset: int, header: EntryHeader, records: Sequence[bytes], producer_id: int) -> bytes | None:
    """The batch of a DATA entry by the bulk path, or None if a message is not plain (properties)."""
    if isinstance(records, PackedRecords):
        skip = int(records.ends[0])
        data, lengths = records.data[skip:], records.lengths[1:]
    else:
        data = b"".join(records[1:])
        lengths = np.fromiter(map(len, records[1:]), dtype=np.int64, count=len(records) - 1)
    source = np.frombuffer(data, dtype=np.uint8)
    layout = plain_layout(source, lengths)
    if layout is None:
        return None
    timestamps = np.where(layout.has_event_time, layout.event_times, header.publish_time_ms)
    transactional = header.txn is not None
    return record_batches.encode_batch(
        base_offset, source, layout, timestamps, producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        attributes=record_batches.TRANSACTIONAL if transactional else 0)


def encode_compacted_run(run: CompactedRun) -> bytes:
    """A run of a compacted topic's kept records (``protocol.compaction.kafka_runs``) as one
    record batch at its first record's offset, the offset deltas leaving the gaps the compaction
    made, as a compacted Kafka log's batches do."""
    count = len(run.offsets)
    key_lengths = np.fromiter(map(len, run.keys), dtype=np.int64, count=count)
    value_lengths = np.fromiter(map(len, run.values), dtype=np.int64, count=count)
    key_starts = np.cumsum(key_lengths) - key_lengths
    value_starts = int(key_lengths.sum()) + np.cumsum(value_lengths) - value_lengths
    source = np.frombuffer(b"".join(run.keys) + b"".join(run.values), dtype=np.uint8)
    layout = PlainLayout(value_starts, value_lengths, key_starts, key_lengths, np.ones(count, dtype=bool),
                         np.zeros(count, dtype=np.int64), np.zeros(count, dtype=bool))
    offsets = np.asarray(run.offsets, dtype=np.int64)
    return record_batches.encode_batch(run.offsets[0], source, layout, np.asarray(run.times_ms, dtype=np.int64),
                                       offset_deltas=offsets - offsets[0])


def _built_batch(base_offset: int, records: Sequence[bytes], producer_id: int) -> bytes:
    """A marker's control batch, or a DATA entry whose messages carry properties, a record at a time."""
    header, messages = decode_entry(records)
    transactional = header.txn is not None
    if header.is_marker:
        builder: DefaultRecordBatchBuilder = _ControlBatchBuilder(2, 0, True, producer_id, 0, -1, _BATCH_SIZE_LIMIT)
        kind = 1 if header.kind == "commit" else 0
        builder.append(0, header.publish_time_ms, _CONTROL_KEY.pack(0, kind), _CONTROL_VALUE.pack(0, 0), [])
    else:
        builder = DefaultRecordBatchBuilder(2, 0, transactional, producer_id, 0 if producer_id >= 0 else -1,
                                            -1, _BATCH_SIZE_LIMIT)
        for i, message in enumerate(messages):
            timestamp = message_timestamp(header, message)
            key = message.key.encode() if message.key is not None else None
            builder.append(i, timestamp, key, message.value,
                           [(k, v.encode()) for k, v in message.properties.items()])
    batch = builder.build()
    struct.pack_into(">q", batch, 0, base_offset)  # outside the CRC, which starts at the attributes
    return bytes(batch)


class EncodedBatches:
    """The record batches last fetched, by entry, so consumers of one partition (several groups, a
    retry, a rebalance re-reading) encode each entry once. Least recently used first out, bounded in
    bytes. Entries are immutable, and the key holds the entry's encoded header (producer, sequences,
    append time, base offset), so a topic deleted and made again under its name misses."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0
        self.hits = self.misses = 0
        self._batches: OrderedDict[tuple[str, int, int, bytes], bytes] = OrderedDict()

    def batch(self, topic: str, partition: int, base_offset: int, records: Sequence[bytes]) -> bytes:
        """The batch of the entry ``records`` at ``base_offset``, from here or encoded now."""
        header = records.record(0) if isinstance(records, PackedRecords) else records[0]
        key = (topic, partition, base_offset, header)
        batch = self._batches.get(key)
        if batch is not None:
            self.hits += 1
            self._batches.move_to_end(key)
            return batch
        self.misses += 1
        _, batch = encode_entry(base_offset, records)
        if len(batch) <= self.max_bytes // 4:  # one huge entry does not empty the cache
            self._batches[key] = batch
            self.held_bytes += len(batch)
            while self.held_bytes > self.max_bytes:  # bounded: each turn removes one
                _, dropped = self._batches.popitem(last=False)
                self.held_bytes -= len(dropped)
        return batch


def idempotent_only(request: Any) -> bool:
    """Whether every record batch of a Produce request comes from an idempotent (or transactional)
    producer: one with a producer id, whose batches the partitions order by sequence number
    whatever order their appends arrive in. Only such requests may be served while an earlier one
    on the connection is still appending (``KafkaGateway._serve``); a batch without a producer id
    is ordered only by being appended after the one before it."""
    seen = 0
    for topic in request.topic_data:
        for data in topic.partition_data:
            view, pos = memoryview(data.records or b""), 0
            while pos + _HEADER_BYTES <= len(view):  # bounded: each batch moves on by a header at least
                (length,) = struct.unpack_from(">i", view, pos + 8)
                (producer_id,) = struct.unpack_from(">q", view, pos + _PRODUCER_ID_AT)
                if producer_id < 0 or length + DefaultRecordBatch.AFTER_LEN_OFFSET < _HEADER_BYTES:
                    return False
                pos += length + DefaultRecordBatch.AFTER_LEN_OFFSET
                seen += 1
            if pos != len(view):
                return False  # a truncated batch: served alone, so its error comes in order
    return seen > 0
