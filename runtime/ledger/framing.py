"""Byte layout of ledger objects.

An object holds one or more frames, back to back. A frame is

    magic "RX" | kind u8 | version u8 | payload length u32 | entry id u64 | crc32c u32 | payload

all big-endian; the CRC32C covers the first 16 header bytes and the payload, so a flipped bit
anywhere, a truncated object, or an object moved to another position is detected. A data entry's
payload is the msgpack encoding of its list of records (bytes). A SEAL frame has no payload: it
closes the ledger at its entry id, and nothing after it is part of the ledger.

``version`` is the format the frame was written in (``formats.py``; 0, in frames written before
versions existed, is format 1). It is read right after the magic, before anything whose layout a
later format might change, and a frame of a format newer than this release knows is refused
(``UnsupportedFormat``), never decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import IntEnum

import crc32c
import msgspec

from raytxn.errors import CorruptLedger
from raytxn.ledger.formats import NEWEST_FORMAT, refuse

MAGIC = b"RX"
_HEADER = struct.Struct(">2sBBIQI")
HEADER_SIZE = _HEADER.size  # 20
_CRC_COVERS = 16  # header bytes before the CRC field

_records_encoder = msgspec.msgpack.Encoder()
_records_decoder = msgspec.msgpack.Decoder(list[bytes])


class FrameKind(IntEnum):
    ENTRY = 1
    SEAL = 2
    META = 3
    COMPACTED = 4  # a chunk of a compacted ledger's records (ledger.compacted)
    HORIZON = 5    # a published compaction horizon (ledger.compacted)


def encode_frame(kind: FrameKind, entry_id: int, payload: bytes, version: int) -> bytes:
    """One frame in format ``version`` (the writer's ``Storage.write_format``, checked there)."""
    head = struct.pack(">2sBBIQ", MAGIC, int(kind), version, len(payload), entry_id)
    crc = crc32c.crc32c(payload, crc32c.crc32c(head))
    return head + struct.pack(">I", crc) + payload


def encode_records(records: Sequence[bytes]) -> bytes:
    return _records_encoder.encode(list(records))


def decode_records(payload: bytes, path: str) -> list[bytes]:
    try:
        return _records_decoder.decode(payload)
    except msgspec.DecodeError as e:  # CRC passed yet payload undecodable: a writer bug or tampering
        raise CorruptLedger(f"undecodable entry in {path}: {e}", path) from e


def decode_frames(data: bytes, path: str) -> list[tuple[FrameKind, int, bytes]]:
    """Split an object into ``(kind, entry_id, payload)`` frames, verifying every CRC.

    Raises ``CorruptLedger`` naming ``path`` on any truncation, bad magic or checksum, and its
    subclass ``UnsupportedFormat`` on a frame of a format newer than ``NEWEST_FORMAT``."""
    frames: list[tuple[FrameKind, int, bytes]] = []
    view = memoryview(data)
    offset = 0
    if not data:
        raise CorruptLedger(f"empty ledger object {path}", path)
    while offset < len(data):
        if len(data) - offset < HEADER_SIZE:
            if data[offset:offset + 2] == MAGIC and len(data) - offset > 3 and data[offset + 3] > NEWEST_FORMAT:
                raise refuse("object", path, data[offset + 3])  # a newer format's shorter frame
            raise CorruptLedger(f"truncated frame header at byte {offset} of {path}", path)
        magic, kind, version, length, entry_id, crc = _HEADER.unpack_from(view, offset)
        if magic != MAGIC:
            raise CorruptLedger(f"bad magic at byte {offset} of {path}", path)
        if version > NEWEST_FORMAT:  # (0: written before versions, format 1)
            raise _newer_frame(view, offset, path, version)
        start = offset + HEADER_SIZE
        end = start + length
        if end > len(data):
            raise CorruptLedger(f"truncated frame payload at byte {offset} of {path}", path)
        payload = bytes(view[start:end])
        actual = crc32c.crc32c(payload, crc32c.crc32c(view[offset:offset + _CRC_COVERS]))
        if actual != crc:
            raise CorruptLedger(f"checksum mismatch at byte {offset} of {path}", path)
        try:
            frames.append((FrameKind(kind), entry_id, payload))
        except ValueError as e:
            raise CorruptLedger(f"unknown frame kind {kind} at byte {offset} of {path}", path) from e
        offset = end
    return frames


def _newer_frame(view: memoryview, offset: int, path: str, version: int) -> CorruptLedger:
    """The refusal of a frame whose version byte says a format newer than this release's; it
    says whether the frame would also check out in today's layout (then it is surely a newer
    release's) or not (a newer layout, or a damaged version byte)."""
    _, _, _, length, _, crc = _HEADER.unpack_from(view, offset)
    start = offset + HEADER_SIZE
    whole = start + length <= len(view) and crc == crc32c.crc32c(
        view[start:start + length], crc32c.crc32c(view[offset:offset + _CRC_COVERS]))
    note = "" if whole else " (or its version byte is damaged: the frame does not check out in this release's layout)"
    return refuse("object", path, version, note)
