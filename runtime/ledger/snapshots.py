"""Segmented snapshots (Pulsar's "multi-snapshot"): one large snapshot as several objects.

A snapshot of ``snapshot_id`` is written as ``total`` objects named, relative to the snapshot
folder, ``<snapshot_id:020d>/<index:06d>-of-<total:06d>``. Each object is one framed segment:

    magic "RXS" + version | snapshot_id u64 | index u32 | total u32 | payload length u32 | crc32c u32 | payload

big-endian; the CRC32C covers the 24 header bytes before it and the payload, so a flipped bit, a
truncation or a segment of another snapshot or slot is detected. The payloads, joined in index
order, are the snapshot bytes (msgspec-msgpack, encoded by the caller).

The magic's last byte says the segment's format (``formats.py``): the letter ``G`` + (format - 1),
so format 1 keeps ``RXSG``, the only magic before versions existed, which releases before versions
read; format 2 is ``RXSH``, and so on. A segment of a format newer than this release knows is
refused (``UnsupportedFormat``) before anything else of it is read.

A crash while writing leaves a snapshot with missing segments; ``newest_complete`` ignores it, so
readers fall back to the newest snapshot whose segments are all there. Pure: no I/O.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence

import crc32c

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ledger.formats import NEWEST_FORMAT, refuse

MAGIC = b"RXSG"  # format 1's
_MAGIC_STEM = b"RXS"
_FORMAT_1_MARK = MAGIC[3]
_HEAD = struct.Struct(">4sQIII")  # magic, snapshot id, index, total, payload length
_CRC = struct.Struct(">I")
SEGMENT_OVERHEAD = _HEAD.size + _CRC.size  # 28 bytes
_NAME = re.compile(r"^(\d{20})/(\d{6})-of-(\d{6})$")


def segment_name(snapshot_id: int, index: int, total: int) -> str:
    return f"{snapshot_id:020d}/{index:06d}-of-{total:06d}"


def segment_magic(version: int) -> bytes:
    """The magic of a segment in format ``version``: ``RXS`` and the letter ``G`` + (version - 1)."""
    assert 1 <= version <= NEWEST_FORMAT, version
    return _MAGIC_STEM + bytes([(_FORMAT_1_MARK + version - 1) % 256])


def segment_format(magic: bytes) -> int | None:
    """The format a segment's magic says (None: not a segment's magic). Every last byte names one
    format (1 to 256), so a damaged one reads as some format, never as none."""
    if magic[:3] != _MAGIC_STEM:
        return None
    return (magic[3] - _FORMAT_1_MARK) % 256 + 1


def split_snapshot(snapshot_bytes: bytes, snapshot_id: int, max_segment_bytes: int, *,
                   version: int) -> list[tuple[str, bytes]]:
    """``(name, object bytes)`` of every segment of a snapshot, in format ``version`` (the
    writer's ``Storage.write_format``). ``max_segment_bytes`` bounds each object (header
    included). An empty snapshot still has one segment, so it can be found."""
    if snapshot_id < 0 or snapshot_id >= 10**20:
        raise InvalidArgument(f"snapshot id must be in [0, 10**20), got {snapshot_id}")
    chunk = max_segment_bytes - SEGMENT_OVERHEAD
    if chunk < 1:
        raise InvalidArgument(f"max_segment_bytes must exceed the {SEGMENT_OVERHEAD}-byte segment header")
    chunks = [snapshot_bytes[i:i + chunk] for i in range(0, len(snapshot_bytes), chunk)] or [b""]
    total = len(chunks)
    if total >= 10**6:
        raise InvalidArgument(f"{total} segments: raise max_segment_bytes")
    segments = []
    for index, payload in enumerate(chunks):
        head = _HEAD.pack(segment_magic(version), snapshot_id, index, total, len(payload))
        crc = crc32c.crc32c(payload, crc32c.crc32c(head))
        segments.append((segment_name(snapshot_id, index, total), head + _CRC.pack(crc) + payload))
    return segments


def _parse_name(name: str) -> tuple[int, int, int] | None:
    # Tolerate listings that carry the folder: only the last two path parts matter.
    match = _NAME.match("/".join(name.rsplit("/", 2)[-2:]))
    if match is None:
        return None
    snapshot_id, index, total = (int(g) for g in match.groups())
    return (snapshot_id, index, total) if index < total else None


def _complete_ids(listing: Iterable[str]) -> tuple[dict[int, list[str]], set[int]]:
    """Names per snapshot id (in index order) and the ids whose segments are all listed."""
    found: dict[int, dict[int, str]] = {}
    totals: dict[int, set[int]] = {}
    for name in listing:
        parsed = _parse_name(name)
        if parsed is None:
            continue  # not a segment (some other object in the folder)
        snapshot_id, index, total = parsed
        found.setdefault(snapshot_id, {})[index] = name
        totals.setdefault(snapshot_id, set()).add(total)
    by_id = {sid: [names[i] for i in sorted(names)] for sid, names in found.items()}
    complete = {sid for sid, names in found.items()
                if len(totals[sid]) == 1 and len(names) == next(iter(totals[sid]))}
    return by_id, complete


def newest_complete(listing: Iterable[str]) -> tuple[int, list[str]] | None:
    """The newest snapshot with every segment listed: ``(snapshot_id, names in index order)``,
    or None. Snapshots with a missing segment (a crash mid-write) are ignored."""
    by_id, complete = _complete_ids(listing)
    if not complete:
        return None
    newest = max(complete)
    return newest, by_id[newest]


def obsolete_segments(listing: Iterable[str]) -> list[str]:
    """Names that may be deleted: every segment of snapshots older than the newest complete one
    (newer incomplete ones may still be being written, so they stay)."""
    by_id, complete = _complete_ids(listing)
    if not complete:
        return []
    newest = max(complete)
    return [name for sid in sorted(by_id) if sid < newest for name in by_id[sid]]


_DAMAGED_NOTE = " (or its magic is damaged: it does not check out in this release's layout)"


def _checks_out(data: bytes) -> bool:
    """Whether a segment's length and CRC hold in format 1's layout (a newer release's segment
    of the same layout, rather than a damaged one)."""
    if len(data) < SEGMENT_OVERHEAD:
        return False
    length = _HEAD.unpack_from(data)[4]
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    payload = data[SEGMENT_OVERHEAD:]
    return length == len(payload) and crc32c.crc32c(payload, crc32c.crc32c(data[:_HEAD.size])) == crc


def join_segments(segments: Sequence[bytes], snapshot_id: int | None = None, where: str = "",
                  names: Sequence[str] | None = None) -> bytes:
    """The snapshot bytes from its segments in index order, verifying framing, CRC, ids, indexes
    and count. Raises ``CorruptLedger`` on any damage, naming the segment's object when ``names``
    (the segments' paths, in the same order) are given, else ``where``; ``UnsupportedFormat`` on
    a segment of a format newer than ``NEWEST_FORMAT``."""
    if not segments:
        raise CorruptLedger(f"snapshot {where} has no segments", where)
    payloads = []
    for position, data in enumerate(segments):
        name = names[position] if names is not None else where
        label = f"snapshot segment {name}" if names is not None else f"snapshot segment {position} of {where}"
        version = segment_format(data[:4]) if len(data) >= 4 else None  # (None: not ours, damage)
        if version is not None and version > NEWEST_FORMAT:  # (before anything a newer format may lay out anew)
            raise refuse("snapshot segment", name, version, "" if _checks_out(data) else _DAMAGED_NOTE)
        if len(data) < SEGMENT_OVERHEAD:
            raise CorruptLedger(f"{label} truncated", name)
        if version is None:
            raise CorruptLedger(f"{label}: bad magic", name)
        _, sid, index, total, length = _HEAD.unpack_from(data)
        (crc,) = _CRC.unpack_from(data, _HEAD.size)
        payload = data[SEGMENT_OVERHEAD:]
        if length != len(payload):
            raise CorruptLedger(f"{label}: bad length", name)
        if crc32c.crc32c(payload, crc32c.crc32c(data[:_HEAD.size])) != crc:
            raise CorruptLedger(f"{label}: checksum mismatch", name)
        if snapshot_id is None:
            snapshot_id = sid
        if sid != snapshot_id or index != position or total != len(segments):
            raise CorruptLedger(f"{label} is segment {index}/{total} of snapshot {sid}, expected "
                                f"{position}/{len(segments)} of {snapshot_id}", name)
        payloads.append(payload)
    return b"".join(payloads)
