"""What a partition ledger entry holds.

Every entry of a partition ledger is a list of records (``ManagedLedger.append``): the first is an
``EntryHeader``, the rest are the entry's messages. A DATA entry is one producer batch of
``count`` messages, plain or in a transaction; a COMMIT or ABORT marker ends one transaction on
this partition and has the header only.

Headers are small and decoded on their own (recovery replays headers only; the transaction buffer
never looks at message bodies). Both structs are msgpack arrays with a leading tag, so a record of
the wrong kind fails to decode instead of being misread. Decode failures raise ``CorruptLedger``:
the ledger's CRC passed, so an undecodable record is a writer bug or tampering, never skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import msgspec

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ids import TxnID
from raytxn.protocol.packed_records import PackedRecords
from raytxn.protocol.txnlog import EndAction

# The header's on-disk tag, a msgpack string in every partition ledger: these lowercase literals
# stay as they are (not EndAction's values) so that existing ledgers replay.
EntryKind = Literal["data", "commit", "abort"]
_MARKER_KINDS: dict[EndAction, EntryKind] = {EndAction.COMMIT: "commit", EndAction.ABORT: "abort"}
_END_ACTIONS: dict[str, EndAction] = {kind: action for action, kind in _MARKER_KINDS.items()}


class EntryHeader(msgspec.Struct, frozen=True, array_like=True, tag="h1"):
    """First record of every partition entry.

    DATA: ``producer`` and the batch's sequence ids ``first_sequence..last_sequence`` (dedup key),
    ``count`` >= 1 messages follow. Markers: ``txn`` set, ``producer`` empty, sequences -1,
    ``count`` 0, and ``low_watermark`` = the coordinator's low watermark the end came with (so a
    replay relearns it). ``publish_time_ms`` is stamped by the partition actor's clock.
    ``base_offset``: the entry's first dense Kafka offset (``protocol.offsets``), stamped when the
    entry is handed to the ledger; None in entries written before offsets existed.
    ``producer_epoch``: the producer incarnation's epoch at this partition (``txn_buffer``'s epoch
    rule); 0 in entries written before epochs, and for producers that never asked for one."""

    kind: EntryKind
    txn: TxnID | None
    producer: str
    first_sequence: int
    last_sequence: int
    count: int
    publish_time_ms: int
    low_watermark: int | None = None
    base_offset: int | None = None
    producer_epoch: int = 0

    @property
    def is_marker(self) -> bool:
        return self.kind != "data"

    @property
    def end_action(self) -> EndAction | None:
        """The end a marker writes (None for DATA)."""
        return _END_ACTIONS.get(self.kind)


class MessageRecord(msgspec.Struct, frozen=True, array_like=True, tag="m1"):
    """One message of a DATA entry."""

    value: bytes
    key: str | None = None
    properties: dict[str, str] = {}
    event_time_ms: int | None = None


def marker_header(action: EndAction, txn: TxnID, publish_time_ms: int,
                  low_watermark: int | None = None) -> EntryHeader:
    """The header (the whole entry) of the COMMIT or ABORT marker of ``txn``."""
    return EntryHeader(_MARKER_KINDS[action], txn, "", -1, -1, 0, publish_time_ms, low_watermark)


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(EntryHeader)
_message_decoder = msgspec.msgpack.Decoder(MessageRecord)


def encode_header(header: EntryHeader) -> bytes:
    return _encoder.encode(header)


def encode_message(message: MessageRecord) -> bytes:
    return _encoder.encode(message)


def encode_entry(header: EntryHeader, messages: Sequence[MessageRecord] = ()) -> list[bytes]:
    """The records to append for one entry: header first, then the messages."""
    return entry_records(header, [encode_message(m) for m in messages])


def entry_records(header: EntryHeader, messages: Sequence[bytes]) -> list[bytes]:
    """The records to append for one entry whose messages are already encoded."""
    if len(messages) != header.count:
        raise ValueError(f"header says {header.count} messages, got {len(messages)}")
    return [encode_header(header), *messages]


def decode_submitted_message(record: object) -> MessageRecord:
    """A message record as a producer sent it (encoded by ``encode_message``). An undecodable one
    is the sender's error, ``InvalidArgument``; nothing of it reaches a ledger."""
    if not isinstance(record, bytes):
        raise InvalidArgument(f"a message record must be bytes, not {type(record).__name__}")
    try:
        return _message_decoder.decode(record)
    except msgspec.DecodeError as e:
        raise InvalidArgument(f"undecodable message record: {e}") from e


class SubmittedBatch(NamedTuple):
    """What an append checks of a producer batch, from one decode of its records."""

    value_sizes: list[int]       # each message's value size
    first_keyless: int | None    # the first message without a key (None: each has one, or not asked)


def decode_submitted_batch(records: Sequence[object], find_keyless: bool = False) -> SubmittedBatch:
    """Every record of a producer batch decoded once (so no reader meets a bad one): the value
    sizes, and with ``find_keyless`` (a compacted topic's append) the first keyless message. One
    pass in C for a well-formed batch; the first bad record raises what
    ``decode_submitted_message`` says of it."""
    try:
        if set(map(type, records)) == {bytes}:  # bytes only, as one at a time: no buffer-likes
            messages = list(map(_message_decoder.decode, records))  # type: ignore[arg-type]
            keyless = (next((i for i, m in enumerate(messages) if m.key is None), None)
                       if find_keyless else None)
            return SubmittedBatch([len(message.value) for message in messages], keyless)
    except (msgspec.DecodeError, TypeError):
        pass
    for record in records:
        decode_submitted_message(record)
    raise AssertionError("a batch that failed to decode decoded one record at a time")


def submitted_value_sizes(records: Sequence[object]) -> list[int]:
    """The value size of each message record of a producer batch (``decode_submitted_batch``)."""
    return decode_submitted_batch(records).value_sizes


def _check_header(header: EntryHeader, where: str) -> EntryHeader:
    if header.is_marker:
        ok = header.txn is not None and header.count == 0
    else:
        ok = (header.count >= 1 and 0 <= header.first_sequence <= header.last_sequence
              and header.producer != "")
    ok = ok and (header.base_offset is None or header.base_offset >= 0)
    if not ok:
        raise CorruptLedger(f"inconsistent entry header {header!r} at {where}", where)
    return header


def decode_header(record: bytes, where: str = "") -> EntryHeader:
    """Decode and sanity-check a header record; ``where`` names the entry for the error."""
    try:
        header = _header_decoder.decode(record)
    except msgspec.DecodeError as e:
        raise CorruptLedger(f"undecodable entry header at {where}: {e}", where) from e
    return _check_header(header, where)


def decode_message(record: bytes, where: str = "") -> MessageRecord:
    try:
        return _message_decoder.decode(record)
    except msgspec.DecodeError as e:
        raise CorruptLedger(f"undecodable message at {where}: {e}", where) from e


def decode_entry_header(records: Sequence[bytes], where: str = "") -> EntryHeader:
    """The header of an entry's records, checking the record count (recovery: headers only)."""
    if not records:
        raise CorruptLedger(f"entry without header at {where}", where)
    header = decode_header(records.record(0) if isinstance(records, PackedRecords) else records[0], where)
    if len(records) != header.count + 1:
        raise CorruptLedger(f"entry at {where} has {len(records) - 1} messages, header says {header.count}",
                            where)
    return header


def decode_entry(records: Sequence[bytes], where: str = "") -> tuple[EntryHeader, list[MessageRecord]]:
    """Header and messages of an entry."""
    header = decode_entry_header(records, where)
    return header, [decode_message(r, where) for r in records[1:]]
