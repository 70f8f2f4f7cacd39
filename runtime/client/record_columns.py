"""Encoded message records straight to Arrow columns, with no Python object per message.

``receive_batch`` turns up to 10,000 encoded ``MessageRecord``s into table columns. Decoding them
into ``MessageRecord`` objects first costs a Python object and a ``bytes`` value per message, and
was a third of the receiving thread at 300k msgs/s. Most records have one shape: what
``encode_message(MessageRecord(value, key))`` writes when there are no properties and no event
time, a msgpack array of five items::

    0x95 | 0xa2 'm' '1' | value: bin8/bin16/bin32 | key: nil or fixstr/str8 | 0x80 {} | 0xc0 nil

Records of that shape are parsed here with numpy over the joined bytes: the headers are read at
every record's start at once, and Arrow copies the value and key bytes out. A batch holding any
record of another shape (properties, an event time, a long key, bytes that are
not a record at all) returns None, and the caller decodes it with msgspec, which also raises for
bad bytes. So this path never accepts what msgspec would refuse: it accepts only the exact byte
shape above, checks every record's length to the byte, and validates keys as UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_PREFIX = (0x95, 0xA2, ord("m"), ord("1"))
_BIN8, _BIN16, _BIN32 = 0xC4, 0xC5, 0xC6
_NIL, _EMPTY_MAP, _STR8 = 0xC0, 0x80, 0xD9
_MAX_OFFSET = (1 << 31) - 1  # binary / string arrays have int32 offsets


def plain_columns(records: Sequence[bytes]) -> tuple[pa.Array, pa.Array] | None:
    """The ``value`` (binary) and ``key`` (string, null: no key) columns of ``records``, if every
    record has the plain shape (module docstring); None if any has not."""
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    return plain_columns_joined(b"".join(records), lengths)


def plain_columns_joined(data: bytes, lengths: np.ndarray) -> tuple[pa.Array, pa.Array] | None:
    """``plain_columns`` of records given joined, back to back in ``data``, with their
    ``lengths`` (int64): how they arrive packed (``raytxn.protocol.packed_records``)."""
    count = len(lengths)
    if count == 0:
        return pa.array([], pa.binary()), pa.array([], pa.string())
    if lengths.min() < 9:  # the shortest plain record: prefix, bin8 header, nil, {}, nil
        return None
    joined = pa.py_buffer(data)
    buffer = np.frombuffer(joined, dtype=np.uint8)
    if int(lengths.sum()) != buffer.size:
        return None
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if buffer.size > _MAX_OFFSET:
        return None
    for offset, expected in enumerate(_PREFIX):
        if not np.all(buffer[starts + offset] == expected):
            return None
    values = _values(buffer, starts)
    if values is None:
        return None
    value_starts, value_lengths = values
    key_at = value_starts + value_lengths
    if np.any(key_at + 3 > ends):  # the key byte, {} and nil must still fit in the record
        return None
    keys = _keys(buffer, key_at, ends)
    if keys is None:
        return None
    key_starts, key_lengths, has_key = keys
    value_column = _binary(joined, value_starts, value_lengths, pa.binary())
    key_column = _binary(joined, key_starts, key_lengths, pa.string(), valid=has_key)
    try:
        key_column.validate(full=True)  # UTF-8, as msgspec checks a str
    except pa.ArrowInvalid:
        return None
    return value_column, key_column


def _values(buffer: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Where each record's value starts and how long it is (bin8/16/32), or None."""
    kind = buffer[starts + 4]
    if not np.all((kind == _BIN8) | (kind == _BIN16) | (kind == _BIN32)):
        return None
    last = buffer.size - 1  # indexes past the buffer are clipped: such a record fails its length check
    byte = [buffer[np.minimum(starts + 5 + i, last)].astype(np.int64) for i in range(4)]
    length = np.where(kind == _BIN8, byte[0],
                      np.where(kind == _BIN16, (byte[0] << 8) | byte[1],
                               (byte[0] << 24) | (byte[1] << 16) | (byte[2] << 8) | byte[3]))
    header = np.where(kind == _BIN8, 6, np.where(kind == _BIN16, 7, 9))
    return starts + header, length


def _keys(buffer: np.ndarray, key_at: np.ndarray, ends: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each record's key (start, length, present) after its value, with the record's exact end
    checked: key, then ``{}`` and nil as its last two bytes. None if any record differs."""
    last = buffer.size - 1
    tag = buffer[key_at].astype(np.int64)
    is_nil = tag == _NIL
    is_fixstr = (tag >= 0xA0) & (tag <= 0xBF)
    is_str8 = tag == _STR8
    if not np.all(is_nil | is_fixstr | is_str8):
        return None
    str8_length = buffer[np.minimum(key_at + 1, last)].astype(np.int64)
    key_lengths = np.where(is_fixstr, tag & 0x1F, np.where(is_str8, str8_length, 0))
    key_starts = key_at + np.where(is_str8, 2, 1)
    after = key_starts + key_lengths
    if not np.all(after + 2 == ends):
        return None
    if not (np.all(buffer[after] == _EMPTY_MAP) and np.all(buffer[after + 1] == _NIL)):
        return None
    return key_starts, key_lengths, ~is_nil


def _binary(joined: pa.Buffer, starts: np.ndarray, lengths: np.ndarray, type_: pa.DataType,
            valid: np.ndarray | None = None) -> pa.Array:
    """A binary or string array of the byte ranges ``[starts, starts + lengths)`` of ``joined``
    (in order, not overlapping), nulls where ``valid`` is False.

    The ranges and the gaps between them are made the elements of one binary array over the
    joined bytes (no copy: its offsets alternate range start, range end), and Arrow's ``take``
    of the even elements copies the ranges out in C++."""
    count = len(starts)
    offsets = np.empty(2 * count + 1, dtype=np.int32)
    offsets[0:-1:2] = starts
    offsets[1::2] = starts + lengths
    offsets[-1] = joined.size  # the last gap: to the end of the bytes
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * count, [None, pa.py_buffer(offsets), joined])
    taken = interleaved.take(pa.array(np.arange(0, 2 * count, 2)))
    validity = None
    null_count = 0
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        null_count = int(count - valid.sum())
    _, taken_offsets, taken_data = taken.buffers()
    return pa.Array.from_buffers(type_, count, [validity, taken_offsets, taken_data], null_count=null_count)
