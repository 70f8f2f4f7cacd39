"""Encoded message records straight to Arrow columns, with no Python object per message.

``receive_batch`` turns up to 10,000 encoded ``MessageRecord``s into table columns. Decoding them
into ``MessageRecord`` objects first costs a Python object and a ``bytes`` value per message, and
was a third of the receiving thread at 300k msgs/s. Most records have one shape, the plain one: no
properties (``protocol.record_layout`` says which bytes). Records of that shape are located with
numpy over the joined bytes (``plain_layout``: the headers are read at every record's start at
once), and Arrow copies the value and key bytes out. A batch holding any record of another shape
(properties, bytes that are not a record at all) returns None, and the caller decodes it with
msgspec, which also raises for bad bytes. So this path never accepts what msgspec would refuse: it
accepts only the shape ``plain_layout`` reads, which checks every record's length to the byte, and
validates keys as UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from raytxn.protocol.record_layout import binary_array, plain_layout

_MAX_OFFSET = (1 << 31) - 1  # binary / string arrays have int32 offsets


def plain_columns(records: Sequence[bytes]) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """The ``value`` (binary), ``key`` (string, null: no key) and ``event_time`` (timestamp, null:
    none) columns of ``records``, if every record has the plain shape (module docstring); None if
    any has not."""
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    return plain_columns_joined(b"".join(records), lengths)


def plain_columns_joined(data: bytes, lengths: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """``plain_columns`` of records given joined, back to back in ``data``, with their
    ``lengths`` (int64): how they arrive packed (``raytxn.protocol.packed_records``)."""
    if len(lengths) == 0:
        return pa.array([], pa.binary()), pa.array([], pa.string()), pa.array([], pa.timestamp("ms"))
    buffer = np.frombuffer(data, dtype=np.uint8)
    if buffer.size > _MAX_OFFSET:
        return None
    layout = plain_layout(buffer, lengths)
    if layout is None:
        return None
    value_column = binary_array(buffer, layout.value_starts, layout.value_lengths, pa.binary())
    key_column = binary_array(buffer, layout.key_starts, layout.key_lengths, pa.string(), valid=layout.has_key)
    try:
        key_column.validate(full=True)  # UTF-8, as msgspec checks a str
    except pa.ArrowInvalid:
        return None
    event_times = pa.array(layout.event_times, pa.int64(), mask=~layout.has_event_time).cast(pa.timestamp("ms"))
    return value_column, key_column, event_times
