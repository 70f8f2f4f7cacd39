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
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raytxn.errors import InvalidArgument
from raytxn.kafka import codecs
from raytxn.kafka.mapping import txn_producer_id
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, decode_entry
from raytxn.protocol.offsets import message_timestamp

_CONTROL_KEY = struct.Struct(">hh")    # version 0, type (0 abort, 1 commit)
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch
_BATCH_SIZE_LIMIT = 1 << 31
_HEADER_BYTES = DefaultRecordBatch.HEADER_STRUCT.size  # 61: the records (maybe compressed) follow
# A batch's records past this once decompressed are refused (MESSAGE_TOO_LARGE) before they are
# held: the ledger's largest entry (``LedgerConfig.max_entry_bytes``), which they could not pass.
MAX_RECORDS_BYTES = 8 << 20


@dataclass(frozen=True)
class ProducedBatch:
    """One record batch of a Produce request."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    messages: list[MessageRecord]
    codec: int = codecs.NONE


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
    batch = DefaultRecordBatch(raw)
    if not batch.validate_crc():
        raise codecs.CorruptBatch("record batch fails its CRC")
    if batch.is_control_batch:
        raise InvalidArgument("clients may not produce control batches")
    codec = batch.attributes & codecs.CODEC_MASK
    if codec == codecs.NONE:
        if len(raw) - _HEADER_BYTES > limit:
            raise codecs.TooLarge(f"{len(raw) - _HEADER_BYTES} bytes of records exceed the limit of {limit}")
    else:  # kafka-python reads the records as if they had been sent plain
        plain = bytearray(raw[:_HEADER_BYTES]) + codecs.decompress(codec, memoryview(raw)[_HEADER_BYTES:], limit)
        struct.pack_into(">h", plain, DefaultRecordBatch.ATTRIBUTES_OFFSET, batch.attributes & ~codecs.CODEC_MASK)
        batch = DefaultRecordBatch(bytes(plain))
    try:
        messages = [MessageRecord(bytes(record.value or b""), _text(record.key, "key"),
                                  {k: _text(v, f"header {k!r}") or "" for k, v in record.headers},
                                  record.timestamp)
                    for record in batch]
    except InvalidArgument:
        raise
    except Exception as e:  # kafka-python's parser: CorruptRecordError, or worse on garbage
        raise codecs.CorruptBatch(f"the records of a batch do not parse: {e!r}") from e
    return ProducedBatch(batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.is_transactional,
                         messages, codec)


class _ControlBatchBuilder(DefaultRecordBatchBuilder):
    def _get_attributes(self, include_compression_type: bool = True) -> int:
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK


def encode_entry(base_offset: int, records: list[bytes]) -> tuple[EntryHeader, bytes]:
    """One raytxn entry (its records as stored) as a record batch at ``base_offset``."""
    header, messages = decode_entry(records)
    transactional = header.txn is not None
    producer_id = txn_producer_id(header.txn) if header.txn is not None else -1
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
    return header, bytes(batch)
