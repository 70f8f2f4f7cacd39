"""The gateway's codec layer (``raytxn.kafka.codecs``) and the record batches it decodes, no Ray:
each framing round-trips (hypothesis), reads what kafka-python's own codecs write (the Java
client's xerial snappy among them) and writes what they read, inflation is bounded, and every
bad batch gets the Kafka error that fits, the whole partition's data refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

from raytxn.errors import InvalidArgument
from raytxn.kafka import codecs, mapping, wire
from raytxn.kafka.records import decode_batches
from raytxn.protocol.entry_format import MessageRecord

CODECS = (codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD)
LIMIT = 1 << 20
payloads = st.one_of(st.binary(max_size=4096),
                     st.builds(lambda chunk, n: chunk * n, st.binary(min_size=1, max_size=64),
                               st.integers(1, 3000)))


@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from(CODECS), data=payloads, xerial=st.booleans())
def test_every_framing_round_trips(codec: int, data: bytes, xerial: bool) -> None:
    compressed = codecs.compress(codec, data, xerial=xerial)
    assert codecs.decompress(codec, compressed, max(len(data), 1)) == data


@settings(max_examples=40, deadline=None)
@given(data=payloads)
def test_what_kafka_pythons_codecs_write_is_read_and_the_reverse(data: bytes) -> None:
    """kafka-python's encoders are other implementations of the same framings (its snappy is
    the Java client's xerial framing; lz4 and zstd are the lz4 and zstandard packages)."""
    written = {codecs.GZIP: kafka_codec.gzip_encode(data),
               codecs.SNAPPY: kafka_codec.snappy_encode(data),                        # xerial
               codecs.LZ4: kafka_codec.lz4_encode(data), codecs.ZSTD: kafka_codec.zstd_encode(data)}
    for codec, compressed in written.items():
        assert codecs.decompress(codec, compressed, LIMIT) == data, codecs.name(codec)
    assert codecs.decompress(codecs.SNAPPY, kafka_codec.snappy_encode(data, xerial_compatible=False), LIMIT) == data
    if not data:
        return  # kafka-python's xerial reader takes a bare header for raw snappy; a batch never is empty
    read = {codecs.GZIP: kafka_codec.gzip_decode, codecs.SNAPPY: kafka_codec.snappy_decode,
            codecs.LZ4: kafka_codec.lz4_decode, codecs.ZSTD: kafka_codec.zstd_decode}
    for codec, decode in read.items():
        assert decode(codecs.compress(codec, data)) == data, codecs.name(codec)
    assert kafka_codec.snappy_decode(codecs.compress(codecs.SNAPPY, data, xerial=False)) == data


def test_xerial_snappy_has_the_java_clients_header_and_blocks() -> None:
    data = bytes(range(256)) * 300                   # 76800 bytes: three 32 KiB blocks
    framed = codecs.compress(codecs.SNAPPY, data)
    assert framed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, blocks = 16, 0
    while pos < len(framed):
        (length,) = struct.unpack_from(">i", framed, pos)
        pos += 4 + length
        blocks += 1
    assert (pos, blocks) == (len(framed), 3)
    assert codecs.decompress(codecs.SNAPPY, framed, len(data)) == data


def test_a_zstd_stream_without_content_size_and_several_frames_are_read() -> None:
    import cramjam

    streamed = cramjam.zstd.Compressor()
    for i in range(200):
        streamed.compress(b"record %d;" % i)
    frame = bytes(streamed.finish())
    expected = b"".join(b"record %d;" % i for i in range(200))
    assert codecs.decompress(codecs.ZSTD, frame, LIMIT) == expected
    two = codecs.compress(codecs.ZSTD, b"ab") + codecs.compress(codecs.ZSTD, b"cd")
    assert codecs.decompress(codecs.ZSTD, two, LIMIT) == b"abcd"


@pytest.mark.parametrize("codec", CODECS, ids=codecs.name)
def test_inflation_past_the_limit_is_refused_as_too_large(codec: int) -> None:
    """A zip bomb: 32 MiB of zeros compress to a few KiB (zstd: bytes); with a 1 MiB limit the
    output never grows past it (gzip/lz4/zstd: a bounded buffer; snappy: each block's varint
    size is read before any output). Exactly the limit is fine."""
    bomb = codecs.compress(codec, bytes(32 << 20))
    assert len(bomb) < 2 << 20
    with pytest.raises(codecs.TooLarge) as refused:
        codecs.decompress(codec, bomb, LIMIT)
    assert mapping.error_code(refused.value) == wire.MESSAGE_TOO_LARGE
    assert codecs.decompress(codec, codecs.compress(codec, bytes(LIMIT)), LIMIT) == bytes(LIMIT)
    with pytest.raises(codecs.TooLarge):
        codecs.decompress(codec, codecs.compress(codec, bytes(LIMIT + 1)), LIMIT)
    with pytest.raises(codecs.TooLarge):
        codecs.decompress(codecs.NONE, bytes(LIMIT + 1), LIMIT)


@pytest.mark.parametrize("codec", CODECS, ids=codecs.name)
def test_truncated_or_garbage_compressed_records_are_corrupt(codec: int) -> None:
    compressed = codecs.compress(codec, b"some records, " * 500)
    for bad in (compressed[:len(compressed) // 2], b"\x00garbage, not a stream of this codec", b""):
        with pytest.raises(codecs.CorruptBatch) as refused:
            codecs.decompress(codec, bad, LIMIT)
        assert mapping.error_code(refused.value) == wire.CORRUPT_MESSAGE


def test_xerial_blocks_past_the_end_or_negative_are_corrupt() -> None:
    header = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for bad in (header + struct.pack(">i", 100) + b"abc", header + struct.pack(">i", -5), header + b"\x00\x00"):
        with pytest.raises(codecs.CorruptBatch):
            codecs.decompress(codecs.SNAPPY, bad, LIMIT)


@pytest.mark.parametrize("codec", (5, 6, 7))
def test_codec_ids_past_zstd_are_unsupported(codec: int) -> None:
    with pytest.raises(codecs.UnsupportedCodec) as refused:
        codecs.decompress(codec, b"anything", LIMIT)
    assert mapping.error_code(refused.value) == wire.UNSUPPORTED_COMPRESSION_TYPE == 76


# --- whole record batches ----------------------------------------------------------------------


def batch(codec: int, values: list[bytes], producer_id: int = 7) -> bytes:
    """A v2 batch written by kafka-python's builder (which compresses with its own codecs and
    sends plain when compression would not shrink the batch)."""
    builder = DefaultRecordBatchBuilder(2, codec, False, producer_id, 0, 0, 1 << 30)
    for i, value in enumerate(values):
        builder.append(i, 1000 + i, f"k{i}".encode(), value, [("h", b"x")])
    return bytes(builder.build())


def with_attributes(data: bytes, attributes: int) -> bytes:
    """``data`` with other attributes and a CRC that is right for them."""
    out = bytearray(data)
    struct.pack_into(">h", out, DefaultRecordBatch.ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", out, DefaultRecordBatch.CRC_OFFSET,
                     calc_crc32c(memoryview(out)[DefaultRecordBatch.ATTRIBUTES_OFFSET:]))
    return bytes(out)


@settings(max_examples=30, deadline=None)
@given(codec=st.sampled_from((codecs.NONE, *CODECS)),
       values=st.lists(st.binary(max_size=200).map(lambda b: b * 4), min_size=1, max_size=30))
def test_batches_of_every_codec_become_the_same_messages(codec: int, values: list[bytes]) -> None:
    data = batch(codec, values)
    (produced,) = decode_batches(data)
    assert produced.codec == DefaultRecordBatch(data).compression_type  # as sent (plain if no gain)
    assert (produced.producer_id, produced.base_sequence) == (7, 0)
    assert produced.messages == [MessageRecord(v, f"k{i}", {"h": "x"}, 1000 + i) for i, v in enumerate(values)]


@pytest.mark.parametrize("codec", CODECS, ids=codecs.name)
def test_compressible_batches_are_sent_and_read_compressed(codec: int) -> None:
    data = batch(codec, [b"value " * 100] * 20)
    assert DefaultRecordBatch(data).compression_type == codec
    (produced,) = decode_batches(data)
    assert produced.codec == codec and [m.value for m in produced.messages] == [b"value " * 100] * 20


def test_a_bad_batch_refuses_the_whole_partitions_data_with_its_code() -> None:
    good = batch(codecs.ZSTD, [b"v" * 500] * 3)
    flipped = bytearray(good)
    flipped[DefaultRecordBatch.CRC_OFFSET + 1] ^= 0x40
    codec7 = with_attributes(batch(codecs.NONE, [b"v"]), 7)
    bomb = batch(codecs.GZIP, [bytes(300_000)] * 4)              # 1.2 MB of records inflate past 1 MiB
    garbage_records = good[:61] + codecs.compress(codecs.ZSTD, b"\xff" * 100)
    garbage_records = with_attributes(struct.pack(">qi", 0, len(garbage_records) - 12) + garbage_records[12:],
                                      codecs.ZSTD)
    long_length = bytearray(good)
    struct.pack_into(">i", long_length, 8, len(good))              # announces 12 more bytes than follow
    cases = {bytes(flipped): wire.CORRUPT_MESSAGE, codec7: wire.UNSUPPORTED_COMPRESSION_TYPE,
             bomb: wire.MESSAGE_TOO_LARGE, batch(codecs.NONE, [bytes(LIMIT)]): wire.MESSAGE_TOO_LARGE,
             garbage_records: wire.CORRUPT_MESSAGE,
             bytes(long_length): wire.CORRUPT_MESSAGE, good[:40]: wire.CORRUPT_MESSAGE,
             good[:61]: wire.CORRUPT_MESSAGE}
    for bad, code in cases.items():
        for data in (bad, good + bad):                             # after a good batch: still all refused
            with pytest.raises(InvalidArgument) as refused:
                decode_batches(data, limit=LIMIT)
            assert mapping.error_code(refused.value) == code, (refused.value, code)
    assert len(decode_batches(good + good)) == 2


def test_malformed_requests_and_close_reasons() -> None:
    from kafka.protocol.producer import ProduceRequest

    request = ProduceRequest[7](transactional_id=None, acks=1, timeout_ms=1000,
                                topic_data=[("t", [(0, batch(codecs.NONE, [b"v"]))])])
    request.with_header(correlation_id=5, client_id="c")
    payload = bytes(request.encode(header=True, framed=False))
    header = wire.peek_header(payload)
    assert wire.decode_request(header, payload).topic_data[0].name == "t"
    for cut in (9, 16, 24):
        with pytest.raises(wire.Malformed):
            wire.decode_request(header, payload[:cut])
    errors = {wire.Unsupported("u"): "unsupported", wire.Malformed("m"): "malformed",
              wire.FrameTooLarge("f"): "oversized", InvalidArgument("i"): "invalid",
              ConnectionResetError("c"): "connection", wire.LoginFailed("l"): "login_failed",
              KeyError("k"): "internal_error"}
    assert {wire.close_reason(e) for e in errors} == set(wire.CLOSE_REASONS)
    assert all(wire.close_reason(e) == reason for e, reason in errors.items())
    for size in (0, -1, wire.MAX_FRAME_BYTES + 1):
        with pytest.raises(wire.FrameTooLarge):
            wire.frame_size(struct.pack(">i", size))
    assert wire.ERROR_NAMES[wire.UNSUPPORTED_COMPRESSION_TYPE] == "UNSUPPORTED_COMPRESSION_TYPE"
