"""Kafka record batches (magic 2) built and parsed a whole batch at a time, with numpy.

The gateway's profile (issue 57) put 70-86% of its busy time in kafka-python's record code, a
varint at a time in Python: ~13 us of CPU a record, so one gateway capped near 75k records/s.
Here a batch's records are laid out field by field across all records at once:

- fetch (``encode_batch``): the stored plain message records (``protocol.record_layout``) become
  one batch, its records' varints written for every record in one numpy pass and the keys and
  values copied by one gather; one CRC-32C for the batch.
- produce (``decode_records``): a batch's records are found by a loop that reads only each
  record's length (two bytes, typically), then every field is read across all records at once;
  records with headers, or anything unusual, give None and the caller parses them the slow way
  (``records``), which also names what is wrong.

Kafka's record, after the batch's 61-byte header (all varints zigzag-encoded)::

    length | attributes (int8, 0) | timestampDelta | offsetDelta | keyLength (-1: null) | key
           | valueLength | value | headersCount
"""

from __future__ import annotations

import struct

import crc32c
import numpy as np

from raytxn.protocol.record_layout import PlainLayout, gather

HEADER = struct.Struct(">qiibIhiqqqhii")  # base offset .. record count: 61 bytes
CRC_FROM = 21                               # the CRC covers the attributes onwards
LOG_APPEND_TIME, TRANSACTIONAL, CONTROL = 0x08, 0x10, 0x20
_MAX_VARINT = 10
# attributes, timestampDelta, offsetDelta, keyLength, valueLength and the headers' count: a byte each
_MIN_RECORD_BYTES = 6


def _zigzag(values: np.ndarray) -> np.ndarray:
    signed = values.astype(np.int64)
    return ((signed << 1) ^ (signed >> 63)).astype(np.uint64)


def _varint_widths(zigzagged: np.ndarray) -> np.ndarray:
    widths = np.ones(len(zigzagged), dtype=np.int64)
    for k in range(1, _MAX_VARINT):
        widths += zigzagged >= np.uint64(1 << (7 * k))
    return widths


def _put_varints(out: np.ndarray, at: np.ndarray, zigzagged: np.ndarray, widths: np.ndarray) -> None:
    for k in range(int(widths.max(initial=0))):
        chosen = widths > k
        chunk = (zigzagged[chosen] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (widths[chosen] > k + 1).astype(np.uint64) << np.uint64(7)
        out[at[chosen] + k] = (chunk | more).astype(np.uint8)


def encode_batch(base_offset: int, source: np.ndarray, layout: PlainLayout, timestamps: np.ndarray, *,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 attributes: int = 0, offset_deltas: np.ndarray | None = None) -> bytes:
    """One record batch at ``base_offset`` of the records whose keys and values ``layout`` locates
    in ``source`` (uint8), with ``timestamps`` (ms, int64) and no headers. Kafka's first record's
    timestamp is the batch's base timestamp, as its builders write it. ``offset_deltas``: each
    record's offset past ``base_offset``, ascending from 0, with gaps as a compacted log has
    them (None: 0, 1, 2, ...)."""
    count = len(layout)
    assert count >= 1 and len(timestamps) == count
    deltas = np.arange(count) if offset_deltas is None else offset_deltas
    assert len(deltas) == count and deltas[0] == 0 and bool(np.all(np.diff(deltas) > 0))
    base_timestamp = int(timestamps[0])
    fields = [_zigzag(timestamps - base_timestamp), _zigzag(deltas),
              _zigzag(np.where(layout.has_key, layout.key_lengths, -1))]
    value_field = _zigzag(layout.value_lengths)
    key_bytes = np.where(layout.has_key, layout.key_lengths, 0)
    widths = [_varint_widths(f) for f in fields]
    value_width = _varint_widths(value_field)
    body = 1 + sum(widths) + key_bytes + value_width + layout.value_lengths + 1
    length_field = _zigzag(body)
    length_width = _varint_widths(length_field)
    head = length_width + 1 + sum(widths)  # length .. keyLength, framing bytes before the key
    framed = head + value_width + 1         # and valueLength, and the headers count (0)
    framing = np.zeros(int(framed.sum()), dtype=np.uint8)
    framing_starts = np.cumsum(framed) - framed
    _put_varints(framing, framing_starts, length_field, length_width)
    at = framing_starts + length_width + 1  # the attributes byte stays 0
    for field, width in zip(fields, widths, strict=True):
        _put_varints(framing, at, field, width)
        at = at + width
    _put_varints(framing, at, value_field, value_width)  # the headers count after it stays 0
    joined = np.concatenate([source, framing])
    base = source.size
    pieces = np.stack([framing_starts + base, np.where(layout.has_key, layout.key_starts, 0), at + base,
                       layout.value_starts, at + value_width + base], axis=1).reshape(-1)
    piece_lengths = np.stack([head, key_bytes, value_width, layout.value_lengths, np.ones(count, np.int64)],
                             axis=1).reshape(-1)
    records = gather(joined, pieces, piece_lengths).tobytes()
    header = bytearray(HEADER.pack(base_offset, HEADER.size - 12 + len(records), 0, 2, 0, attributes,
                                   int(deltas[-1]), base_timestamp, int(timestamps.max()), producer_id,
                                   producer_epoch, base_sequence, count))
    crc = crc32c.crc32c(records, crc32c.crc32c(memoryview(header)[CRC_FROM:]))
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + records


def _varints_at(buffer: np.ndarray, at: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The zigzag varints starting at ``at`` (each before its record's end): (values, widths), or
    None if any runs past its record or past 10 bytes."""
    if np.any(at >= ends):
        return None
    last = buffer.size - 1
    values = np.zeros(len(at), dtype=np.uint64)
    widths = np.zeros(len(at), dtype=np.int64)
    going = np.ones(len(at), dtype=bool)
    for k in range(_MAX_VARINT):
        byte = buffer[np.minimum(at + k, last)].astype(np.uint64)
        values |= np.where(going, (byte & np.uint64(0x7F)) << np.uint64(7 * k), np.uint64(0))
        widths += going
        going &= byte >= np.uint64(0x80)
        if not going.any():
            break
    else:
        return None
    if np.any(at + widths > ends):
        return None
    signed = (values >> np.uint64(1)).astype(np.int64) ^ -(values & np.uint64(1)).astype(np.int64)
    return signed, widths


def record_bounds(records: bytes, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where each of a batch's ``count`` records starts (after its length) and ends; None unless
    exactly ``count`` well-formed lengths cover ``records``.

    Each record's place depends on every length before it, so they are walked in Python, but the
    walk only hops (the one- and two-byte lengths of records under 8 KiB, read as if not negative);
    every length is then decoded and checked across all records at once, which catches a hop a
    negative or longer length sent astray."""
    begins: list[int] = []
    note = begins.append
    pos = 0
    try:
        for _ in range(count):  # bounded by the batch's count
            note(pos)
            byte = records[pos]
            if byte < 0x80:
                pos += 1 + (byte >> 1)
            else:
                pos += 2 + (((byte & 0x7F) | (records[pos + 1] << 7)) >> 1)
    except IndexError:
        return None
    if pos != len(records):
        return None
    at = np.array(begins, dtype=np.int64)
    buffer = np.frombuffer(records, dtype=np.uint8)
    read = _varints_at(buffer, at, np.append(at[1:], len(records)))
    if read is None:
        return None
    lengths, widths = read
    starts = at + widths
    ends = starts + lengths
    if np.any(lengths < 0) or np.any(widths > 2) or not np.array_equal(ends[:-1], at[1:]):
        return None
    return starts, ends


def decode_records(records: bytes, count: int, base_timestamp: int) -> tuple[np.ndarray, PlainLayout] | None:
    """The keys, values and timestamps of a batch's ``count`` uncompressed records (the bytes after
    its header) as a layout over them, if every record is plain: no headers, offset deltas
    0..count-1, lengths that add up. None otherwise: the slow path then parses or refuses it."""
    bounds = record_bounds(records, count)
    if bounds is None:
        return None
    starts, ends = bounds
    if np.any(ends - starts < _MIN_RECORD_BYTES):  # too short to hold its own fields: the slow path
        return None  # refuses it (and indexing its attributes byte could run past the buffer)
    buffer = np.frombuffer(records, dtype=np.uint8)
    if np.any(buffer[starts] != 0):  # the attributes byte, unused in magic 2: clients write 0
        return None  # (kafka-python reads it as a varint; the slow path then says what it makes of it)
    at = starts + 1
    fields = []
    for _ in range(3):  # timestampDelta, offsetDelta, keyLength
        read = _varints_at(buffer, at, ends)
        if read is None:
            return None
        fields.append(read[0])
        at = at + read[1]
    time_deltas, offset_deltas, key_lengths = fields
    if not np.array_equal(offset_deltas, np.arange(count)) or np.any(key_lengths < -1):
        return None
    has_key = key_lengths >= 0
    key_starts = at
    at = at + np.maximum(key_lengths, 0)
    read = _varints_at(buffer, at, ends)
    if read is None:
        return None
    value_lengths, width = read
    value_starts = at + width
    if np.any(value_lengths < 0) or np.any(value_starts + value_lengths + 1 != ends):
        return None  # a null value (-1), or headers: the slow path
    if not np.all(buffer[value_starts + value_lengths] == 0):
        return None
    timestamps = base_timestamp + time_deltas
    layout = PlainLayout(value_starts, value_lengths, key_starts, np.maximum(key_lengths, 0), has_key,
                         timestamps, np.ones(count, dtype=bool))
    return buffer, layout
