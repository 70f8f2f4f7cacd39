"""Columnar receive: ``Consumer.receive_batch`` returns a ``MessageBatch``, the messages as one
Arrow table plus one handle that acknowledges them all.

The messages arrive from the subscription as runs of one entry each (``WireEntry``: the entry's
position, batch size and publish time once, the batch indexes, and the encoded records as the
partition stored them). The table is built from those runs: records of the common shape (no
properties, no event time) go to Arrow columns with numpy and no Python object per message
(``record_columns``); a batch with any other record is decoded in one msgspec call. The per-entry
columns are repeated with numpy. The ack handle keeps the runs, not message
ids: acking the batch sends, per partition, its whole entries as ranges ``(ledger_id, first,
last)`` and only the entries received in part as single batch indexes.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import pyarrow as pa

from raytxn.client.record_columns import plain_columns_joined
from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ids import Position
from raytxn.protocol.entry_format import MessageRecord
from raytxn.protocol.packed_records import PackedRecords

if TYPE_CHECKING:
    from raytxn.client.consumer import Consumer
    from raytxn.client.transaction import Transaction

__all__ = ["MESSAGE_SCHEMA", "MessageBatch"]

# The columns of a received batch, one row per message, in receive order.
MESSAGE_SCHEMA = pa.schema([
    ("value", pa.binary()),
    ("key", pa.string()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("event_time", pa.timestamp("ms")),      # null when the producer set none
    ("publish_time", pa.timestamp("ms")),
    ("partition", pa.int32()),
    ("ledger_id", pa.int64()),
    ("entry_id", pa.int64()),
    ("batch_index", pa.int32()),
    ("redelivery_count", pa.int32()),
])

_records_decoder = msgspec.msgpack.Decoder(list[MessageRecord])


class Run:
    """Messages of one entry of one partition, as received: ``indexes[i]`` is the batch index
    of the run's i-th message, ``records[i]`` its encoded ``MessageRecord`` (packed as they came,
    or a list)."""

    __slots__ = ("batch_size", "counts", "entry_id", "indexes", "ledger_id", "partition", "publish_time_ms",
                 "records")

    def __init__(self, partition: int, ledger_id: int, entry_id: int, batch_size: int, publish_time_ms: int,
                 indexes: list[int], counts: list[int] | None, records: PackedRecords | list[bytes]) -> None:
        self.partition = partition
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.batch_size = batch_size
        self.publish_time_ms = publish_time_ms
        self.indexes = indexes
        self.counts = counts  # redelivery counts, None: all 0
        self.records = records

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)

    def split(self, count: int) -> tuple[Run, Run]:
        """The first ``count`` messages, and the rest."""
        counts = self.counts
        head = Run(self.partition, self.ledger_id, self.entry_id, self.batch_size, self.publish_time_ms,
                   self.indexes[:count], None if counts is None else counts[:count], self.records[:count])
        tail = Run(self.partition, self.ledger_id, self.entry_id, self.batch_size, self.publish_time_ms,
                   self.indexes[count:], None if counts is None else counts[count:], self.records[count:])
        return head, tail


def _msgpack_array_header(length: int) -> bytes:
    if length < 16:
        return bytes([0x90 | length])
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def decode_records(records: list[bytes]) -> list[MessageRecord]:
    """Every record of a batch in one decoder call."""
    return _decode_joined(b"".join(records), len(records))


def _decode_joined(data: bytes, count: int) -> list[MessageRecord]:
    """``count`` records back to back in ``data``, decoded in one call (they are msgpack values:
    behind an array header they are one msgpack array)."""
    try:
        return _records_decoder.decode(_msgpack_array_header(count) + data)
    except msgspec.DecodeError as error:
        raise CorruptLedger(f"undecodable message in a received batch: {error}") from error


def record_columns(records: PackedRecords | Sequence[bytes]) -> list[pa.Array]:
    """The value, key, properties and event_time columns of encoded records: parsed with numpy
    when all have the plain shape (``record_columns`` module), else decoded with msgspec."""
    packed = records if isinstance(records, PackedRecords) else PackedRecords.pack(records)
    count = len(packed)
    plain = plain_columns_joined(packed.data, packed.lengths)
    if plain is not None:
        values, keys, event_times = plain
        return [values, keys, _no_properties(count), event_times]
    decoded = _decode_joined(packed.data, count)
    if any(record.properties for record in decoded):
        properties = pa.array([list(record.properties.items()) for record in decoded], MESSAGE_SCHEMA.field(2).type)
    else:
        properties = _no_properties(count)
    return [
        pa.array([record.value for record in decoded], pa.binary()),
        pa.array([record.key for record in decoded], pa.string()),
        properties,
        pa.array([record.event_time_ms for record in decoded], pa.int64()).cast(pa.timestamp("ms")),
    ]


def joined_records(runs: Sequence[Run]) -> PackedRecords:
    """The runs' records as one packed sequence: a packed run gives its buffer as it came, a run
    of single records (``MessageBatch.ack_rows``'s selections) is packed here."""
    parts = [run.records if isinstance(run.records, PackedRecords) else PackedRecords.pack(run.records)
             for run in runs]
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([part.lengths for part in parts]) if parts else np.empty(0, dtype=np.int64)
    return PackedRecords(b"".join(part.data for part in parts), np.cumsum(lengths, dtype=np.int64))


def _no_properties(count: int) -> pa.Array:
    """A map column of ``count`` empty maps, without a Python loop."""
    return pa.MapArray.from_arrays(pa.array(np.zeros(count + 1, dtype=np.int32)),
                                   pa.array([], pa.string()), pa.array([], pa.string()))


def build_table(runs: Sequence[Run]) -> pa.Table:
    """The table of the runs' messages (``MESSAGE_SCHEMA``)."""
    records = joined_records(runs)
    count = len(records)
    lengths = np.fromiter((len(run.indexes) for run in runs), dtype=np.int64, count=len(runs))

    def repeated(values: Iterable[int], dtype: type[np.integer]) -> np.ndarray:
        return np.repeat(np.fromiter(values, dtype=dtype, count=len(runs)), lengths)

    redeliveries: list[int] | np.ndarray
    if any(run.counts for run in runs):
        redeliveries = list(itertools.chain.from_iterable(run.counts or [0] * len(run.indexes) for run in runs))
    else:
        redeliveries = np.zeros(count, dtype=np.int32)
    columns = [
        *record_columns(records),
        pa.array(repeated((run.publish_time_ms for run in runs), np.int64)).cast(pa.timestamp("ms")),
        pa.array(repeated((run.partition for run in runs), np.int32)),
        pa.array(repeated((run.ledger_id for run in runs), np.int64)),
        pa.array(repeated((run.entry_id for run in runs), np.int64)),
        pa.array(np.fromiter(itertools.chain.from_iterable(run.indexes for run in runs), dtype=np.int32,
                             count=count)),
        pa.array(redeliveries, pa.int32()),
    ]
    return pa.Table.from_arrays(columns, schema=MESSAGE_SCHEMA)


class MessageBatch:
    """What ``Consumer.receive_batch`` returns: ``table`` (a ``pyarrow.Table``, one row per
    message, ``MESSAGE_SCHEMA``) and one ack handle for all of it.

    ``ack(txn=None)`` acknowledges every message of the batch (whole entries go as ranges);
    ``ack_rows(rows, txn=None)`` some of them, by row number; ``negative_ack(rows=None)`` has
    them (all, or those rows) delivered again. Plain acks return at once; with a ``txn`` they
    wait until the subscription logged them, so a ``TransactionConflict`` raises right there
    (and the transaction can only abort), as ``Consumer.acknowledge`` does."""

    def __init__(self, consumer: Consumer, runs: list[Run], table: pa.Table) -> None:
        self._consumer = consumer
        self._runs = runs
        self.table = table

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        return f"MessageBatch({self.table.num_rows} messages of {self._consumer.topic})"

    def ack(self, txn: Transaction | None = None) -> None:
        """Acknowledge every message of the batch (see the class docstring)."""
        self._consumer._ack_runs(self._runs, txn, wait=True)

    def ack_async(self, txn: Transaction | None = None) -> concurrent.futures.Future:
        """``ack`` without waiting: the future resolves once the subscription applied (plain) or
        logged (txn) the acks."""
        return self._consumer._ack_runs(self._runs, txn, wait=False)

    def ack_rows(self, rows: Sequence[int], txn: Transaction | None = None) -> None:
        """Acknowledge the messages of these rows only."""
        self._consumer._ack_runs(self._select(rows), txn, wait=True)

    def negative_ack(self, rows: Sequence[int] | None = None) -> None:
        """Deliver the messages (all, or those of ``rows``) again, after the consumer's negative
        ack delay."""
        self._consumer._negative_ack_runs(self._runs if rows is None else self._select(rows))

    def _select(self, rows: Sequence[int]) -> list[Run]:
        """The runs of just these rows (each row once; ``InvalidArgument`` for one out of range)."""
        wanted = sorted(set(rows))
        if wanted and not (0 <= wanted[0] and wanted[-1] < self.table.num_rows):
            raise InvalidArgument(f"rows must lie in 0..{self.table.num_rows - 1}, got {wanted[0]}..{wanted[-1]}")
        selected: list[Run] = []
        start = 0
        cursor = 0
        for run in self._runs:
            end = start + len(run.indexes)
            picked = []
            while cursor < len(wanted) and wanted[cursor] < end:
                picked.append(wanted[cursor] - start)
                cursor += 1
            if picked:
                counts = run.counts
                selected.append(Run(run.partition, run.ledger_id, run.entry_id, run.batch_size, run.publish_time_ms,
                                    [run.indexes[i] for i in picked],
                                    None if counts is None else [counts[i] for i in picked],
                                    [run.records[i] for i in picked]))
            start = end
        return selected
