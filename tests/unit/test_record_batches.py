"""The bulk record paths (``protocol.record_layout``, ``kafka.record_batches``) against the record-
at-a-time ones they stand in for: msgspec's encoding, and kafka-python's record batch builder and
parser. Every property compares the two on the same input, so a bulk path that drifts fails here."""

from __future__ import annotations

import struct

import crc32c
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from raytxn.ids import TxnID
from raytxn.kafka import codecs, record_batches, records
from raytxn.protocol.compaction import CompactedRun
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_entry, encode_message
from raytxn.protocol.packed_records import PackedRecords
from raytxn.protocol.record_layout import encode_plain, keys_are_utf8, plain_layout

# Long keys and values are repeats (drawing 64 KiB byte by byte is slow); they cross each size's
# header width: str8 past 31 and str16 past 255 bytes, bin16 past 255 and bin32 past 65,535.
keys = st.one_of(st.none(), st.text(max_size=40), st.tuples(st.text(min_size=1, max_size=3), st.integers(90, 300))
                 .map(lambda t: t[0] * t[1]))
values = st.one_of(st.binary(max_size=300), st.tuples(st.binary(min_size=1, max_size=2), st.integers(32_765, 32_770))
                   .map(lambda t: (t[0] * 2)[:2] * t[1]))
event_times = st.one_of(st.none(), st.integers(0, 300), st.integers(0, 1 << 40), st.integers((1 << 62), (1 << 63) - 1))
plain_messages = st.lists(st.builds(MessageRecord, values, keys, st.just({}), event_times), min_size=1, max_size=30)


def _joined(messages: list[MessageRecord]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [encode_message(m) for m in messages]
    return (np.frombuffer(b"".join(encoded), dtype=np.uint8),
            np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))


@settings(max_examples=150, deadline=None)
@given(plain_messages)
def test_plain_records_are_located_and_rewritten_byte_for_byte_as_msgspec_writes_them(messages):
    source, lengths = _joined(messages)
    layout = plain_layout(source, lengths)
    assert layout is not None
    for i, message in enumerate(messages):
        start, length = layout.value_starts[i], layout.value_lengths[i]
        assert source[start:start + length].tobytes() == message.value
        assert bool(layout.has_key[i]) == (message.key is not None)
        if message.key is not None:
            key = source[layout.key_starts[i]:layout.key_starts[i] + layout.key_lengths[i]].tobytes()
            assert key.decode() == message.key
        assert bool(layout.has_event_time[i]) == (message.event_time_ms is not None)
    data, written = encode_plain(source, layout)
    assert data == source.tobytes() and written.tolist() == lengths.tolist()
    assert keys_are_utf8(source, layout)


def test_records_of_another_shape_are_left_to_msgspec():
    for other in (MessageRecord(b"v", "k", {"p": "x"}), MessageRecord(b"v", None, {}, -5),
                  MessageRecord(b"v", "k" * 70_000)):
        source, lengths = _joined([MessageRecord(b"plain"), other])
        assert plain_layout(source, lengths) is None
    source, lengths = _joined([MessageRecord(b"plain")])
    assert plain_layout(source, lengths + 1) is None  # lengths that do not cover the bytes
    assert plain_layout(np.zeros(20, dtype=np.uint8), np.array([10, 10])) is None  # not records


def _entry(messages: list[MessageRecord], txn: TxnID | None) -> list[bytes]:
    header = EntryHeader("data", txn, "p", 0, len(messages) - 1, len(messages), 1_700_000_000_000)
    return encode_entry(header, messages)


@settings(max_examples=100, deadline=None)
@given(plain_messages, st.booleans(), st.integers(0, 1 << 40))
def test_a_fetched_entry_is_the_batch_kafka_pythons_builder_writes(messages, in_txn, base_offset):
    entry = _entry(messages, TxnID(3, 9) if in_txn else None)
    header, bulk = records.encode_entry(base_offset, entry)
    producer_id = records.txn_producer_id(header.txn) if in_txn else -1
    assert bulk == records._built_batch(base_offset, entry, producer_id)
    assert records.encode_entry(base_offset, PackedRecords.pack(entry))[1] == bulk


def _kafka_batch(rows: list[tuple[bytes | None, bytes | None, int, list]], producer_id: int = 5) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, producer_id, 1, 40, 1 << 30)
    for offset, (key, value, timestamp, headers) in enumerate(rows):
        builder.append(offset, timestamp, key, value, headers)
    return bytes(builder.build())


kafka_keys = st.one_of(st.none(), st.binary(max_size=40), keys.map(lambda k: None if k is None else k.encode()))
kafka_rows = st.lists(st.tuples(kafka_keys,
                                st.one_of(st.binary(max_size=300),
                                          st.integers(8190, 8200).map(lambda n: b"v" * n)),
                                st.integers(0, 1 << 42), st.just([])), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(kafka_rows)
def test_a_produced_batch_becomes_the_records_the_record_at_a_time_parser_makes(rows):
    raw = _kafka_batch(rows)
    bulk = records._bulk_records(raw, len(rows), rows[0][2])
    if not all(key is None or _is_utf8(key) for key, _, _, _ in rows):
        assert bulk is None  # and the slow path refuses it (below)
        return
    slow = [encode_message(m) for m in records._parsed_messages(raw)]
    if all(len(v) < 8000 for _, v, _, _ in rows):
        assert bulk == slow  # the bulk path takes every plain batch of records under 8 KiB
    elif bulk is not None:
        assert bulk == slow
    (batch,) = records.decode_batches(raw)
    assert batch.records == slow and (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (5, 1, 40)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_headers_null_values_and_negative_timestamps_take_the_slow_path_and_say_the_same():
    for rows in ([(b"k", b"v", 10, [("h", b"x")])], [(b"k", None, 10, [])], [(None, b"v", -1, [])]):
        raw = _kafka_batch(rows)
        assert records._bulk_records(raw, 1, rows[0][2]) is None
        (batch,) = records.decode_batches(raw)
        assert batch.records == [encode_message(m) for m in records._parsed_messages(raw)]


@settings(max_examples=300, deadline=None)
@given(kafka_rows, st.data())
def test_a_damaged_batch_is_never_accepted_differently_from_the_slow_parser(rows, data):
    """Flip bytes of the records, cut some off or change the batch's record count (the CRC then
    recomputed, so only the records' parse judges them): the bulk path either declines or gives
    exactly what kafka-python parses, and the whole decode either reads the batch or refuses it
    with an error the gateway maps to a Kafka code, never another exception."""
    raw = bytearray(_kafka_batch(rows))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(record_batches.HEADER.size, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[len(raw) - data.draw(st.integers(0, min(8, len(raw) - record_batches.HEADER.size))):]
        struct.pack_into(">i", raw, 8, len(raw) - 12)  # the batch's length, kept true to its bytes
    count = len(rows) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    struct.pack_into(">i", raw, record_batches.HEADER.size - 4, count)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(memoryview(raw)[record_batches.CRC_FROM:]))
    bulk = records._bulk_records(bytes(raw), count, rows[0][2])
    if bulk is not None:
        assert bulk == [encode_message(m) for m in records._parsed_messages(bytes(raw))]
    try:
        (batch,) = records.decode_batches(bytes(raw))
    except (codecs.CorruptBatch, records.InvalidArgument):
        assert bulk is None
    else:
        assert bulk is None or batch.records == bulk


def test_a_record_too_short_for_its_fields_is_refused_as_corrupt_not_by_an_index_error():
    """Found by the property above: a batch whose last record says it is 0 bytes long."""
    raw = bytearray(_kafka_batch([(None, b"\x00\x00", 8193, []), (None, b"", 0, [])]))
    raw.append(0)  # a third record, of length 0
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">i", raw, record_batches.HEADER.size - 4, 3)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(memoryview(raw)[record_batches.CRC_FROM:]))
    assert records._bulk_records(bytes(raw), 3, 8193) is None
    try:
        records.decode_batches(bytes(raw))
    except codecs.CorruptBatch:
        pass
    else:
        raise AssertionError("a zero-length record was read")


def test_a_batch_stamped_with_log_append_time_reads_its_max_timestamp_as_kafka_does():
    builder = DefaultRecordBatchBuilder(2, 0, False, 5, 1, 40, 1 << 30)
    builder.append(0, 100, None, b"a", [])
    builder.append(1, 200, None, b"b", [])
    raw = bytearray(builder.build())
    raw[22] |= record_batches.LOG_APPEND_TIME  # the attributes' low byte
    struct.pack_into(">I", raw, 17, crc32c.crc32c(memoryview(raw)[record_batches.CRC_FROM:]))
    (batch,) = records.decode_batches(bytes(raw))
    assert [m.event_time_ms for m in batch.messages] == [200, 200]


def test_a_key_that_is_not_utf8_is_refused_through_either_path():
    raw = _kafka_batch([(b"\xff\xfe", b"v", 10, [])])
    assert records._bulk_records(raw, 1, 10) is None
    try:
        records.decode_batches(raw)
    except records.InvalidArgument as e:
        assert "UTF-8" in str(e)
    else:
        raise AssertionError("a non-UTF-8 key was accepted")


def test_fetched_batches_are_encoded_once_and_the_cache_stays_within_its_bytes():
    cache = records.EncodedBatches(max_bytes=4000)
    entries = [_entry([MessageRecord(b"v" * 100, f"k{i}")] * 3, None) for i in range(30)]
    first = [cache.batch("t", 0, 3 * i, entry) for i, entry in enumerate(entries)]
    assert cache.misses == 30 and cache.hits == 0 and cache.held_bytes <= 4000
    assert cache.batch("t", 0, 87, PackedRecords.pack(entries[29])) == first[29]  # packed or not: one key
    assert cache.hits == 1
    assert cache.batch("t", 1, 87, entries[29]) == first[29] and cache.misses == 31  # another partition
    assert cache.batch("t", 0, 0, entries[0]) == first[0] and cache.misses == 32  # the oldest was let go
    encoded_now = [records.encode_entry(3 * i, entry)[1] for i, entry in enumerate(entries)]
    assert first == encoded_now


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.text(min_size=1, max_size=20), values,
                          st.integers(0, 1 << 41)), min_size=1, max_size=40), st.integers(0, 1 << 40))
def test_a_compacted_run_is_one_batch_with_gaps_that_kafka_pythons_parser_reads_at_the_original_offsets(
        drawn, first_offset):
    offsets = list(first_offset + np.cumsum([gap for gap, _, _, _ in drawn]) - drawn[0][0])
    run = CompactedRun([int(o) for o in offsets], [k.encode() for _, k, _, _ in drawn],
                       [v for _, _, v, _ in drawn], [t for _, _, _, t in drawn])
    batch = DefaultRecordBatch(records.encode_compacted_run(run))
    assert batch.validate_crc() and batch.base_offset == run.offsets[0]
    assert batch.next_offset == run.offsets[-1] + 1 and batch.max_timestamp == max(run.times_ms)
    parsed = [(r.offset, r.key, r.value, r.timestamp) for r in batch]
    assert parsed == list(zip(run.offsets, run.keys, run.values, run.times_ms, strict=True))
