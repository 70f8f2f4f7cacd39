"""Where the fields of many encoded ``MessageRecord``s lie, read and written with numpy, no Python
object per message.

A message record is a msgpack array of five (``entry_format.MessageRecord``)::

    0x95 | 0xa2 'm' '1' | value: bin8/bin16/bin32 | key: nil, fixstr, str8 or str16
         | properties: 0x80 (an empty map) | event time: nil or an unsigned int

Records of that shape, the "plain" ones (no properties), are located here over the joined bytes:
every record's fields are read at once, a field at a time across all records. Readers that turn
records into Arrow columns (``client.record_columns``) and the Kafka gateway, which turns them into
Kafka record batches and back (``kafka.record_batches``), use it. A run holding any record of
another shape (properties, a negative event time, bytes that are not a record at all) gives None,
and the caller decodes it with msgspec, which also raises for bad bytes. So this path accepts
only byte shapes msgspec decodes to the same record, checking every record's length to the byte.

``encode_plain`` writes the same shape, byte for byte what msgspec writes (the smallest header of
each kind), so records made here and records made by ``entry_format.encode_message`` compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_PREFIX = (0x95, 0xA2, ord("m"), ord("1"))
_BIN8, _BIN16, _BIN32 = 0xC4, 0xC5, 0xC6
_NIL, _EMPTY_MAP = 0xC0, 0x80
_STR8, _STR16 = 0xD9, 0xDA
_UINT8, _UINT16, _UINT32, _UINT64 = 0xCC, 0xCD, 0xCE, 0xCF
_SHORTEST = 9  # prefix, a bin8 header, an empty value, nil key, {}, nil event time


@dataclass(frozen=True)
class PlainLayout:
    """Per record, offsets into the joined bytes: the value's start and length, the key's (length
    0 and ``has_key`` False for a nil key), and the event time (``has_event_time`` False: nil)."""

    value_starts: np.ndarray
    value_lengths: np.ndarray
    key_starts: np.ndarray
    key_lengths: np.ndarray
    has_key: np.ndarray
    event_times: np.ndarray
    has_event_time: np.ndarray

    def __len__(self) -> int:
        return len(self.value_starts)


def _byte(buffer: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``buffer[at]`` as int64, indexes past the end clipped (such a record fails a length check)."""
    return buffer[np.minimum(at, buffer.size - 1)].astype(np.int64)


def _big_endian(buffer: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    value = np.zeros(len(at), dtype=np.uint64)
    for i in range(width):
        value = (value << np.uint64(8)) | _byte(buffer, at + i).astype(np.uint64)
    return value


def plain_layout(buffer: np.ndarray, lengths: np.ndarray) -> PlainLayout | None:
    """The layout of records back to back in ``buffer`` (uint8) with ``lengths`` (int64), if every
    record is plain (module docstring); None if any is not, or the lengths do not cover the bytes."""
    count = len(lengths)
    empty = np.empty(0, dtype=np.int64)
    if count == 0:
        return PlainLayout(empty, empty, empty, empty, empty.astype(bool), empty, empty.astype(bool))
    if lengths.min() < _SHORTEST or int(lengths.sum()) != buffer.size:
        return None
    ends = np.cumsum(lengths)
    starts = ends - lengths
    for offset, expected in enumerate(_PREFIX):
        if not np.all(buffer[starts + offset] == expected):
            return None
    kind = buffer[starts + 4]
    if not np.all((kind == _BIN8) | (kind == _BIN16) | (kind == _BIN32)):
        return None
    width = np.where(kind == _BIN8, 1, np.where(kind == _BIN16, 2, 4))
    value_lengths = np.where(width == 1, _byte(buffer, starts + 5),
                             np.where(width == 2, _big_endian(buffer, starts + 5, 2).astype(np.int64),
                                      _big_endian(buffer, starts + 5, 4).astype(np.int64)))
    value_starts = starts + 5 + width
    key_at = value_starts + value_lengths
    if np.any(key_at + 3 > ends):  # the key's tag, {} and the event time's tag must still fit
        return None
    tag = _byte(buffer, key_at)
    is_fixstr = (tag >= 0xA0) & (tag <= 0xBF)
    if not np.all((tag == _NIL) | is_fixstr | (tag == _STR8) | (tag == _STR16)):
        return None
    key_lengths = np.where(is_fixstr, tag & 0x1F,
                           np.where(tag == _STR8, _byte(buffer, key_at + 1),
                                    np.where(tag == _STR16, _big_endian(buffer, key_at + 1, 2).astype(np.int64), 0)))
    key_starts = key_at + np.where(tag == _STR8, 2, np.where(tag == _STR16, 3, 1))
    after = key_starts + key_lengths
    if np.any(after + 2 > ends) or not np.all(_byte(buffer, after) == _EMPTY_MAP):
        return None
    times = _event_times(buffer, after + 1, ends)
    if times is None:
        return None
    event_times, has_event_time = times
    return PlainLayout(value_starts, value_lengths, key_starts, key_lengths, tag != _NIL, event_times,
                       has_event_time)


def _event_times(buffer: np.ndarray, at: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The event time at ``at`` (nil, a positive fixint or uint8..uint64) ending each record exactly."""
    tag = _byte(buffer, at)
    width = np.select([tag == _NIL, tag < 0x80, tag == _UINT8, tag == _UINT16, tag == _UINT32, tag == _UINT64],
                      [0, 0, 1, 2, 4, 8], -1)
    if np.any(width < 0) or not np.all(at + 1 + width == ends):
        return None
    values = np.where(tag < 0x80, tag, 0).astype(np.uint64)
    for w in (1, 2, 4, 8):
        chosen = width == w
        if chosen.any():
            values[chosen] = _big_endian(buffer, at[chosen] + 1, w)
    if np.any(values >= np.uint64(1 << 63)):  # not an int64: msgspec would give a Python int past it
        return None
    return values.astype(np.int64), tag != _NIL


def gather(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The byte ranges ``[starts, starts + lengths)`` of ``source``, concatenated in order (a range
    may come from anywhere in ``source``; ranges must not overlap).

    The ranges, sorted, and the gaps between them are made the elements of one Arrow binary array
    over ``source`` (no copy: its offsets alternate range start, range end), and Arrow's ``take``
    of the ranges in the asked order copies them out, a ``memcpy`` a range in C++, not an index
    per byte (which cost ~9 ns a byte)."""
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    count = len(starts)
    if count == 0:
        return np.empty(0, dtype=np.uint8)
    order = np.argsort(starts, kind="stable")
    sorted_starts = starts[order]
    sorted_ends = sorted_starts + lengths[order]
    assert not np.any(sorted_ends[:-1] > sorted_starts[1:]), "gather's ranges overlap"
    large = source.size >= (1 << 31)
    offsets = np.empty(2 * count + 2, dtype=np.int64 if large else np.int32)  # gap, range, .. gap
    offsets[0] = 0
    offsets[1:-1:2] = sorted_starts
    offsets[2:-1:2] = sorted_ends
    offsets[-1] = source.size
    pieces = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * count + 1,
                                   [None, pa.py_buffer(offsets), pa.py_buffer(source)])
    rank = np.empty(count, dtype=np.int64)
    rank[order] = np.arange(count)
    taken = pieces.take(pa.array(2 * rank + 1))
    total = int(lengths.sum())
    return np.frombuffer(taken.buffers()[2], dtype=np.uint8, count=total)


def _unsigned_header(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """msgspec's smallest header for each unsigned int: (tag, width of the big-endian bytes after)."""
    tag = np.select([values < 0x80, values < 0x100, values < 0x10000, values < (1 << 32)],
                    [values, _UINT8, _UINT16, _UINT32], _UINT64)
    width = np.select([values < 0x80, values < 0x100, values < 0x10000, values < (1 << 32)], [0, 1, 2, 4], 8)
    return tag, width


def encode_plain(source: np.ndarray, layout: PlainLayout) -> tuple[bytes, np.ndarray]:
    """Plain message records of the values, keys and event times ``layout`` locates in ``source``:
    the records back to back and each one's length. Keys must be under 64 KiB (str16) and already
    checked as UTF-8; event times >= 0."""
    count = len(layout)
    value_lengths, key_lengths = layout.value_lengths, layout.key_lengths
    value_width = np.where(value_lengths < 0x100, 1, np.where(value_lengths < 0x10000, 2, 4))
    key_width = np.where(~layout.has_key | (key_lengths < 32), 0, np.where(key_lengths < 0x100, 1, 2))
    time_tag, time_width = _unsigned_header(np.where(layout.has_event_time, layout.event_times, 0))
    time_width = np.where(layout.has_event_time, time_width, 0)
    head = 5 + value_width                  # prefix, bin tag, its length
    middle = 1 + key_width                  # the key's tag and length
    tail = 2 + time_width                   # {}, the event time's tag and its bytes
    framing = np.zeros(int((head + middle + tail).sum()), dtype=np.uint8)
    framing_starts = np.cumsum(head + middle + tail) - (head + middle + tail)
    for offset, byte in enumerate(_PREFIX):
        framing[framing_starts + offset] = byte
    framing[framing_starts + 4] = np.where(value_width == 1, _BIN8, np.where(value_width == 2, _BIN16, _BIN32))
    _put_big_endian(framing, framing_starts + 5, value_lengths, value_width)
    key_at = framing_starts + head
    framing[key_at] = np.where(~layout.has_key, _NIL, np.where(key_width == 0, 0xA0 | np.minimum(key_lengths, 31),
                                                                np.where(key_width == 1, _STR8, _STR16)))
    _put_big_endian(framing, key_at + 1, key_lengths, key_width)
    tail_at = key_at + middle
    framing[tail_at] = _EMPTY_MAP
    framing[tail_at + 1] = np.where(layout.has_event_time, time_tag, _NIL)
    _put_big_endian(framing, tail_at + 2, layout.event_times, time_width)
    joined = np.concatenate([source, framing])
    base = source.size
    pieces = np.stack([framing_starts + base, layout.value_starts, key_at + base,
                       np.where(layout.has_key, layout.key_starts, 0), tail_at + base], axis=1).reshape(-1)
    piece_lengths = np.stack([head, value_lengths, middle, np.where(layout.has_key, key_lengths, 0), tail],
                             axis=1).reshape(-1)
    records = gather(joined, pieces, piece_lengths)
    lengths = head + value_lengths + middle + np.where(layout.has_key, key_lengths, 0) + tail
    assert records.size == int(lengths.sum()) and len(lengths) == count
    return records.tobytes(), lengths


def _put_big_endian(out: np.ndarray, at: np.ndarray, values: np.ndarray, widths: np.ndarray) -> None:
    """Write each value in its width (0, 1, 2, 4 or 8 bytes), big-endian, at ``at``."""
    unsigned = values.astype(np.uint64)
    for width in (1, 2, 4, 8):
        chosen = widths == width
        if not chosen.any():
            continue
        for i in range(width):
            shift = np.uint64(8 * (width - 1 - i))
            out[at[chosen] + i] = ((unsigned[chosen] >> shift) & np.uint64(0xFF)).astype(np.uint8)


def binary_array(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, type_: pa.DataType,
                 valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow binary or string array (``type_``; large ones for 2 GiB and past) of the byte ranges
    ``[starts, starts + lengths)`` of ``source`` (``gather``), nulls where ``valid`` is False (their
    lengths must be 0)."""
    count = len(starts)
    data = gather(source, starts, lengths)
    large = type_ in (pa.large_binary(), pa.large_string())
    offsets = np.zeros(count + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity, null_count = None, 0
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(count - valid.sum())
    return pa.Array.from_buffers(type_, count, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=null_count)


def keys_are_utf8(source: np.ndarray, layout: PlainLayout) -> bool:
    """Whether every key ``layout`` locates in ``source`` is UTF-8, as msgspec checks a str: the
    keys as one Arrow string array, validated in C++."""
    lengths = np.where(layout.has_key, layout.key_lengths, 0)
    if not lengths.any():
        return True
    keys = binary_array(source, np.where(layout.has_key, layout.key_starts, 0), lengths, pa.large_string())
    try:
        keys.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True
