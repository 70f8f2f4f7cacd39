"""Kafka's record-batch codecs (the low three bits of a v2 batch's attributes), with cramjam.

Pure: bytes in, bytes out, no I/O. What each codec id holds on the wire (the records section of
a magic-2 batch, after the 61-byte header):

- 1 gzip: an RFC 1952 gzip stream (Java's GZIPOutputStream, librdkafka's zlib).
- 2 snappy: either the xerial framing the Java client writes (header ``\\x82SNAPPY\\x00`` and two
  int32 versions, then blocks of int32 length + raw snappy) or one raw snappy block, which is what
  librdkafka writes; both are read, as kafka-python's and librdkafka's decoders do.
- 3 lz4: an LZ4 frame (magic 2 batches use the standard frame; 0/1's broken header checksum
  does not apply).
- 4 zstd: one or more zstd frames, with or without a content size.

Decompression is bounded by ``limit``: a small batch that inflates past it (a zip bomb) raises
``TooLarge`` without the output ever being held past ``limit`` bytes. Every error is an
``InvalidArgument`` carrying the Kafka error code that fits (``kafka_error``).
"""

from __future__ import annotations

import struct

import cramjam

from raytxn.errors import InvalidArgument
from raytxn.kafka import wire

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
CODEC_MASK = 0x07

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_BLOCK = struct.Struct(">i")
XERIAL_BLOCK_BYTES = 32 * 1024  # what the Java client's SnappyOutputStream writes per block
_FIRST_GUESS_RATIO = 8          # first output buffer: 8x the input (grown 8x on each overflow)
_MIN_BUFFER = 64 * 1024
_OVERFLOW = "failed to write whole buffer"  # cramjam's message when the output buffer is full


class CorruptBatch(InvalidArgument):
    """A batch whose bytes do not decode (CORRUPT_MESSAGE)."""

    kafka_error = wire.CORRUPT_MESSAGE


class UnsupportedCodec(InvalidArgument):
    """A codec id this gateway cannot read (UNSUPPORTED_COMPRESSION_TYPE)."""

    kafka_error = wire.UNSUPPORTED_COMPRESSION_TYPE


class TooLarge(InvalidArgument):
    """A batch whose records inflate past the limit (MESSAGE_TOO_LARGE)."""

    kafka_error = wire.MESSAGE_TOO_LARGE


def name(codec: int) -> str:
    return NAMES.get(codec, f"codec-{codec}")


def decompress(codec: int, data: bytes, limit: int) -> bytes:
    """The records section of a batch compressed with ``codec``, at most ``limit`` bytes."""
    if codec == NONE:
        if len(data) > limit:
            raise TooLarge(f"{len(data)} bytes of records exceed the limit of {limit}")
        return bytes(data)
    if codec == SNAPPY:
        return _snappy(bytes(data), limit)
    module = {GZIP: cramjam.gzip, LZ4: cramjam.lz4, ZSTD: cramjam.zstd}.get(codec)
    if module is None:
        raise UnsupportedCodec(f"compression codec id {codec} is not served (none, gzip, snappy, lz4, zstd are)")
    return _bounded(module, name(codec), bytes(data), limit)


def _bounded(module: object, what: str, data: bytes, limit: int) -> bytes:
    """Decompress into a buffer that grows 8x per overflow up to ``limit`` + 1 bytes: memory is
    bounded by the limit, and a usual batch decodes on the first try. Bounded loop: the size
    grows geometrically to the limit."""
    size = min(limit + 1, max(_MIN_BUFFER, len(data) * _FIRST_GUESS_RATIO))
    while True:
        out = bytearray(size)
        written: int | None = None  # None: the buffer overflowed (cramjam raises then)
        try:
            written = module.decompress_into(data, out)  # type: ignore[attr-defined]
        except cramjam.DecompressionError as e:
            if _OVERFLOW not in str(e):
                raise CorruptBatch(f"{what} records do not decompress: {e}") from e
        if written is not None and written <= limit:
            return bytes(memoryview(out)[:written])
        if size > limit:
            raise TooLarge(f"{what} records inflate past the limit of {limit} bytes")
        size = min(limit + 1, size * _FIRST_GUESS_RATIO)


def _snappy(data: bytes, limit: int) -> bytes:
    if data[:len(XERIAL_MAGIC)] == XERIAL_MAGIC and len(data) >= _XERIAL_HEADER.size:
        return _xerial(data, limit)
    return _raw_snappy(data, limit)


def _raw_snappy(block: bytes | memoryview, limit: int) -> bytes:
    """One raw snappy block: its varint header says its size, checked before any output."""
    try:
        size = cramjam.snappy.decompress_raw_len(block)
        if size > limit:
            raise TooLarge(f"snappy block of {size} bytes exceeds the limit of {limit}")
        out = bytearray(size)
        written = cramjam.snappy.decompress_raw_into(block, out)
    except cramjam.DecompressionError as e:
        raise CorruptBatch(f"snappy records do not decompress: {e}") from e
    if written != size:
        raise CorruptBatch(f"snappy block announced {size} bytes and held {written}")
    return bytes(out)


def _xerial(data: bytes, limit: int) -> bytes:
    """Java's SnappyOutputStream framing: a 16-byte header, then int32-length blocks."""
    view, pos, parts, total = memoryview(data), _XERIAL_HEADER.size, [], 0
    while pos < len(view):  # bounded: each block moves ``pos`` forward by at least 4 bytes
        if len(view) - pos < _XERIAL_BLOCK.size:
            raise CorruptBatch("truncated xerial snappy block length")
        (length,) = _XERIAL_BLOCK.unpack_from(view, pos)
        pos += _XERIAL_BLOCK.size
        if length < 0 or pos + length > len(view):
            raise CorruptBatch(f"xerial snappy block of {length} bytes past the end of the batch")
        part = _raw_snappy(view[pos:pos + length], limit - total)
        parts.append(part)
        total += len(part)
        pos += length
    return b"".join(parts)


def compress(codec: int, data: bytes, *, xerial: bool = True) -> bytes:
    """``data`` compressed as Kafka clients write it (snappy: the Java client's xerial framing,
    or with ``xerial=False`` one raw block as librdkafka writes). For tests and fetch."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec != SNAPPY:
        raise UnsupportedCodec(f"compression codec id {codec} is not served")
    if not xerial:
        return bytes(cramjam.snappy.compress_raw(data))
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(data), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(data[start:start + XERIAL_BLOCK_BYTES]))
        parts += [_XERIAL_BLOCK.pack(len(block)), block]
    return b"".join(parts)
