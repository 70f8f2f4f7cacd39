"""The per-stream metadata record, updated by compare-and-set.

Not every store offers a conditional overwrite (obstore's LocalStore has no ``If-Match``), but all
offer conditional create. So the record is versioned: version ``v`` lives at
``streams/<stream>/meta/<v, 20 digits>``, the newest version is the current record, and an update
from version ``v`` is the conditional create of ``v + 1``. Of two incarnations updating from the
same version exactly one create succeeds; the other gets ``Fenced``.

Old versions are deleted to keep listings short. That opens one hole: a writer holding a very old
version ``v`` could re-create a deleted ``v + 1`` although ``v + 5`` exists. Two rules close it:
readers always take the highest version, and a writer lists again after its create and counts as
fenced if anything higher exists.
"""

from __future__ import annotations

import asyncio

import msgspec

from raytxn.errors import CorruptLedger, Fenced, PositionTrimmed, StorageUnavailable
from raytxn.ids import Position
from raytxn.ledger.framing import FrameKind, decode_frames, encode_frame
from raytxn.ledger.storage import ObjectExists, Storage

KEEP_VERSIONS = 4


class LedgerInfo(msgspec.Struct):
    """One ledger of a stream. ``last_entry_id`` is known once the ledger is closed."""

    ledger_id: int
    closed: bool = False
    last_entry_id: int = -1
    created_ms: int = 0


class StreamMetadata(msgspec.Struct):
    """What a stream consists of. ``incarnation`` counts the writers that opened it."""

    version: int = 0
    incarnation: int = 0
    ledgers: list[LedgerInfo] = msgspec.field(default_factory=list)
    trimmed_below: Position = Position(-1, -1)
    next_ledger_id: int = 0
    properties: dict[str, bytes] = msgspec.field(default_factory=dict)
    # Ledger id -> entry id of the SEAL a reopening put after a crashed writer's last object.
    # Trimming that ledger keeps this one object: the crashed writer may live on as a zombie, and
    # the SEAL is all that makes its next put collide (``Fenced``) instead of landing in a
    # deleted ledger and being acknowledged to its caller (found by the simulator: a zombie
    # coordinator logged begins there and handed out a txn id its successor also gave out).
    tombstones: dict[int, int] = msgspec.field(default_factory=dict)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StreamMetadata)


def meta_prefix(stream: str) -> str:
    return f"streams/{stream}/meta"


def meta_path(stream: str, version: int) -> str:
    return f"{meta_prefix(stream)}/{version:020d}"


async def read_metadata(storage: Storage, stream: str) -> StreamMetadata | None:
    """The current record of ``stream``, or None for a stream never created."""
    paths = await storage.list(meta_prefix(stream))
    if not paths:
        return None
    newest = paths[-1]
    data = await storage.get(newest)
    if data is None:  # deleted between list and get: a newer version exists, read again
        return await read_metadata(storage, stream)
    return decode_metadata(data, newest)


async def raise_if_trimmed(storage: Storage, stream: str, position: Position) -> None:
    """An object vanished under a reader that listed it: ``PositionTrimmed`` when retention
    trimmed ``position`` meanwhile (the reader's ledger metadata was older than the trim), else
    nothing (the caller's ``CorruptLedger`` stands)."""
    meta = await read_metadata(storage, stream)
    if meta is not None and position < meta.trimmed_below:
        raise PositionTrimmed(f"{stream}: {position} was trimmed while reading (trim point {meta.trimmed_below})")


def decode_metadata(data: bytes, path: str) -> StreamMetadata:
    frames = decode_frames(data, path)
    if len(frames) != 1 or frames[0][0] != FrameKind.META:
        raise CorruptLedger(f"not a metadata object: {path}", path)
    try:
        meta = _decoder.decode(frames[0][2])
    except msgspec.DecodeError as e:
        raise CorruptLedger(f"undecodable metadata {path}: {e}", path) from e
    if meta_path_version(path) != meta.version:
        raise CorruptLedger(f"metadata {path} claims version {meta.version}", path)
    return meta


def meta_path_version(path: str) -> int:
    return int(path.rsplit("/", 1)[1])


async def compare_and_set(storage: Storage, stream: str, new: StreamMetadata, *,
                          retry_backoff_s: tuple[float, float] | None = None) -> StreamMetadata:
    """Store ``new`` as the version after ``new.version - 1``; ``Fenced`` if someone else did.

    The caller builds ``new`` from the record it read, with ``version`` one higher.

    With ``retry_backoff_s`` (the stream's writer, updating its own current version) storage
    outages are retried here, with the same bytes, until the update lands or is fenced. A retry
    that finds its version already there with exactly these bytes goes on: that is its own
    earlier attempt, which landed while its reply was lost (no other writer can build this
    incarnation's record). Raising instead made the retry find its own version and fence a
    healthy writer (found by the simulator). A failed cleanup of old versions is left to the next
    update: it changes nothing that readers see."""
    path = meta_path(stream, new.version)
    data = encode_frame(FrameKind.META, new.version, _encoder.encode(new), version=storage.write_format)
    delay = retry_backoff_s[0] if retry_backoff_s else 0.0
    while True:
        try:
            return await _create_and_check(storage, stream, new, path, data, mine_if_same=retry_backoff_s is not None)
        except StorageUnavailable:
            if retry_backoff_s is None:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, retry_backoff_s[1])


async def _create_and_check(storage: Storage, stream: str, new: StreamMetadata, path: str, data: bytes,
                            mine_if_same: bool) -> StreamMetadata:
    try:
        await storage.create(path, data)
    except ObjectExists as e:
        if not mine_if_same or await storage.get(path) != data:
            raise Fenced(f"stream {stream}: metadata version {new.version} was written by another "
                         "incarnation") from e
    paths = await storage.list(meta_prefix(stream))
    if paths and meta_path_version(paths[-1]) > new.version:
        raise Fenced(f"stream {stream}: metadata moved past version {new.version}")
    stale = [p for p in paths if meta_path_version(p) <= new.version - KEEP_VERSIONS]
    try:
        await storage.delete(stale)
    except StorageUnavailable:
        pass
    return new
