"""Kafka record batches (magic 2, ``kafka.record``) to and from raytxn messages and entries.

Produce: each record batch of a partition becomes one raytxn append (one entry), so a Kafka
batch's producer id, epoch and base sequence map onto one raytxn producer batch.

Fetch: each raytxn entry becomes one record batch at the entry's base offset. A DATA entry of a
transaction is a transactional batch whose producer id stands for that transaction
(``mapping.txn_producer_id``); a COMMIT/ABORT marker is a control batch of one record with the
same producer id, as Kafka writes them, so read_committed clients match markers to data.

Lossy corners (raytxn messages hold a str key and str properties): a record key and header values
must be UTF-8 (else INVALID_RECORD); a null value is stored as empty bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raytxn.errors import InvalidArgument
from raytxn.kafka.mapping import txn_producer_id
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, decode_entry
from raytxn.protocol.offsets import message_timestamp

_CONTROL_KEY = struct.Struct(">hh")    # version 0, type (0 abort, 1 commit)
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch
_BATCH_SIZE_LIMIT = 1 << 31


@dataclass(frozen=True)
class ProducedBatch:
    """One record batch of a Produce request."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    messages: list[MessageRecord]


def _text(data: bytes | None, what: str) -> str | None:
    if data is None:
        return None
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"a record {what} must be UTF-8 to be stored in raytxn: {e}") from e


def decode_batches(data: bytes | None) -> list[ProducedBatch]:
    """The record batches of one partition's Produce data; ``InvalidArgument`` for a batch that
    is not magic 2, fails its CRC, is a control batch, or holds a key or header that is not UTF-8."""
    batches, pos, view = [], 0, memoryview(data or b"")
    while pos < len(view):
        if len(view) - pos < DefaultRecordBatch.HEADER_STRUCT.size:
            raise InvalidArgument("truncated record batch")
        (length,) = struct.unpack_from(">i", view, pos + 8)
        size = length + DefaultRecordBatch.AFTER_LEN_OFFSET
        if view[pos + 16] != 2:
            raise InvalidArgument(f"record batch of magic {view[pos + 16]}: only magic 2 is served")
        batch = DefaultRecordBatch(bytes(view[pos:pos + size]))
        if not batch.validate_crc():
            raise InvalidArgument("record batch fails its CRC")
        if batch.is_control_batch:
            raise InvalidArgument("clients may not produce control batches")
        messages = [MessageRecord(bytes(record.value or b""), _text(record.key, "key"),
                                  {k: _text(v, f"header {k!r}") or "" for k, v in record.headers},
                                  record.timestamp)
                    for record in batch]
        batches.append(ProducedBatch(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                     batch.is_transactional, messages))
        pos += size
    return batches


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
