"""Encoded records as one ``bytes`` and their end offsets: how an entry travels from a partition
to a subscription, and a run of messages from a subscription to a consumer.

Partition reads and fetch replies used to carry each message's encoded record as its own
``bytes``: one object per message to pickle in the partition and the subscription, and to
unpickle in the subscription and the consumer. At 10,000 messages a fetch
that was about 0.18 us a message on each side, and a columnar consumer then joined the records
again to parse them with numpy (``raytxn.client.record_columns``). Packed, a run of records is two
buffers whatever its length: the records back to back, and where each ends (little-endian int64).

``PackedRecords`` reads as a sequence of ``bytes`` (``len``, indexing, slicing, iteration), so
code that indexes a run's records works on either form; the per-message ``bytes`` are cut from
the buffer the first time one is asked for, once for the whole run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from raytxn.errors import CorruptLedger

_ENDS = np.dtype("<i8")


class PackedRecords(Sequence[bytes]):
    """``data``: the records back to back; ``ends[i]``: where record ``i`` ends in it."""

    __slots__ = ("_items", "data", "ends")

    def __init__(self, data: bytes, ends: np.ndarray) -> None:
        self.data = data
        self.ends = ends
        self._items: list[bytes] | None = None  # the records cut out, once one was asked for

    @classmethod
    def pack(cls, records: Sequence[bytes]) -> PackedRecords:
        lengths = np.fromiter(map(len, records), dtype=_ENDS, count=len(records))
        return cls(b"".join(records), np.cumsum(lengths, dtype=_ENDS))

    @classmethod
    def from_wire(cls, data: bytes, ends: bytes) -> PackedRecords:
        """As ``__reduce__`` sent it; ``CorruptLedger`` unless the ends are ascending offsets that
        end at the data's end (a garbled reply must not slice records out of thin air)."""
        offsets = np.frombuffer(ends, dtype=_ENDS)
        if offsets.size and (offsets[-1] != len(data) or offsets[0] < 0 or np.any(np.diff(offsets) < 0)):
            raise CorruptLedger("packed records whose offsets do not match their data")
        if not offsets.size and data:
            raise CorruptLedger("packed records with data but no offsets")
        return cls(data, offsets)

    def __reduce__(self) -> tuple:
        return (PackedRecords.from_wire, (self.data, self.ends.astype(_ENDS, copy=False).tobytes()))

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.ends, prepend=_ENDS.type(0))

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def __len__(self) -> int:
        return len(self.ends)

    def record(self, index: int) -> bytes:
        """Record ``index`` alone, without cutting out the rest (an entry's header)."""
        items = self._items
        if items is not None:
            return items[index]
        index = range(len(self.ends))[index]  # IndexError out of range, as a list's
        start = int(self.ends[index - 1]) if index else 0
        return self.data[start:int(self.ends[index])]

    def to_list(self) -> list[bytes]:
        """The records as ``bytes``, cut out once (the same list every time)."""
        return self._cut()

    def _cut(self) -> list[bytes]:
        items = self._items
        if items is None:
            data = self.data
            ends = self.ends.tolist()
            starts = [0, *ends[:-1]] if ends else []
            items = self._items = [data[start:end] for start, end in zip(starts, ends, strict=True)]
        return items

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> PackedRecords: ...

    def __getitem__(self, index: int | slice) -> bytes | PackedRecords:
        if not isinstance(index, slice):
            return self._cut()[index]
        start, stop, step = index.indices(len(self.ends))
        if step != 1:
            return PackedRecords.pack(self._cut()[index])
        if stop <= start:
            return PackedRecords(b"", np.empty(0, dtype=_ENDS))
        base = int(self.ends[start - 1]) if start else 0
        end = int(self.ends[stop - 1])
        return PackedRecords(self.data[base:end], self.ends[start:stop] - base)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._cut())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedRecords):
            return self.data == other.data and np.array_equal(self.ends, other.ends)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.data, self.ends.tobytes()))

    def __repr__(self) -> str:
        return f"PackedRecords({len(self.ends)} records, {len(self.data)} bytes)"
