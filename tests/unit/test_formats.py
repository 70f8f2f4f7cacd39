"""Format versions (``raytxn.ledger.formats``): every kind of stored object says its format; a
reader refuses one newer than this release knows with ``UnsupportedFormat`` naming the object and
the version, and the refusal changes nothing in storage; objects written before versions
existed read as format 1; writers write ``write_format`` and nothing above this release's newest.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Awaitable, Callable

import crc32c
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.errors import CorruptLedger, InvalidArgument, UnsupportedFormat
from raytxn.ids import Position, TxnID
from raytxn.ledger import ManagedLedger
from raytxn.ledger.compacted import PublishedHorizon, compact_partition, read_kept, read_published
from raytxn.ledger.formats import DEFAULT_WRITE_FORMAT, NEWEST_FORMAT, check_write_format
from raytxn.ledger.framing import FrameKind, decode_frames, encode_frame, encode_records
from raytxn.ledger.managed import chunk_path
from raytxn.ledger.metadata import meta_path, read_metadata
from raytxn.ledger.snapshots import SEGMENT_OVERHEAD, join_segments, segment_format, split_snapshot
from raytxn.ledger.storage import Storage
from raytxn.protocol.catalog import CATALOG_KEY, Catalog, encode_catalog
from raytxn.protocol.compaction import CompactionHorizon, KeptRecord
from raytxn.protocol.entry_format import EntryHeader, MessageRecord, encode_entry
from raytxn.protocol.pending_ack import AbortRecord, encode_record
from raytxn.protocol.txnlog import NewTxn, encode_batch

NEWER = st.integers(NEWEST_FORMAT + 1, 255)


def frame_in(version: int, kind: FrameKind, entry_id: int, payload: bytes) -> bytes:
    """A frame as a release writing ``version`` would, in today's header layout."""
    head = struct.pack(">2sBBIQ", b"RX", int(kind), version, len(payload), entry_id)
    return head + struct.pack(">I", crc32c.crc32c(payload, crc32c.crc32c(head))) + payload


def in_format(segment: bytes, version: int) -> bytes:
    """A format 1 segment re-marked as ``version`` (its CRC made right again)."""
    head = b"RXS" + bytes([(ord("G") + version - 1) % 256]) + segment[4:24]
    payload = segment[SEGMENT_OVERHEAD:]
    return head + struct.pack(">I", crc32c.crc32c(payload, crc32c.crc32c(head))) + payload


# --- frames and segments, pure ----------------------------------------------------------------


@given(NEWER, st.sampled_from(list(FrameKind)), st.integers(0, 2**40), st.binary(max_size=200))
def test_a_newer_frame_is_refused_naming_object_and_version(version: int, kind: FrameKind, entry_id: int,
                                                            payload: bytes) -> None:
    older = encode_frame(FrameKind.ENTRY, entry_id, encode_records([b"a"]), version=NEWEST_FORMAT)
    with pytest.raises(UnsupportedFormat) as caught:
        decode_frames(older + frame_in(version, kind, entry_id + 1, payload), "streams/s/ledgers/0/7")
    assert (caught.value.path, caught.value.version) == ("streams/s/ledgers/0/7", version)
    assert "streams/s/ledgers/0/7" in str(caught.value) and f"format {version}" in str(caught.value)
    assert "damaged" not in str(caught.value)  # it checks out in today's layout: a newer release's
    assert isinstance(caught.value, CorruptLedger)  # refused as any unreadable object is


@given(st.sampled_from([0, 1]), st.integers(0, 2**40), st.lists(st.binary(max_size=50), max_size=4))
def test_frames_written_before_versions_read_as_format_1(byte: int, entry_id: int, records: list[bytes]) -> None:
    """v0.1.0 wrote 0 where the version byte is (its flags): the same frame as format 1's."""
    payload = encode_records(records)
    assert decode_frames(frame_in(byte, FrameKind.ENTRY, entry_id, payload), "p") == \
        [(FrameKind.ENTRY, entry_id, payload)]
    assert encode_frame(FrameKind.ENTRY, entry_id, payload, 1) == frame_in(1, FrameKind.ENTRY, entry_id, payload)


def test_a_damaged_version_byte_is_refused_and_said_to_be_maybe_damage() -> None:
    frame = bytearray(encode_frame(FrameKind.ENTRY, 3, encode_records([b"x"]), version=1))
    frame[3] = 9  # the CRC covers the byte: the frame no longer checks out
    with pytest.raises(UnsupportedFormat, match="damaged") as caught:
        decode_frames(bytes(frame), "obj")
    assert caught.value.version == 9
    with pytest.raises(UnsupportedFormat):  # even when only its first bytes are there
        decode_frames(bytes(frame[:6]), "obj")


@given(NEWER, st.binary(max_size=300), st.integers(0, 2**40), st.integers(SEGMENT_OVERHEAD + 1, 120))
def test_a_newer_snapshot_segment_is_refused_naming_it(version: int, data: bytes, snapshot_id: int,
                                                        segment_bytes: int) -> None:
    segments = split_snapshot(data, snapshot_id, segment_bytes, version=NEWEST_FORMAT)
    names = [f"topics/t/0/snapshots/{name}" for name, _ in segments]
    blobs = [blob for _, blob in segments]
    assert join_segments(blobs, snapshot_id, "snap", names) == data
    last = len(blobs) - 1
    blobs[last] = in_format(blobs[last], version)
    with pytest.raises(UnsupportedFormat) as caught:
        join_segments(blobs, snapshot_id, "snap", names)
    assert (caught.value.path, caught.value.version) == (names[last], version)
    assert "damaged" not in str(caught.value)


def test_segment_magics() -> None:
    """Format 1 keeps v0.1.0's magic (releases before versions read it); each byte names a format."""
    assert split_snapshot(b"x", 1, 100, version=1)[0][1][:4] == b"RXSG"
    assert [segment_format(m) for m in (b"RXSG", b"RXSH", b"RXSF", b"RXS\x00", b"RXAG")] == [1, 2, 256, 186, None]


# --- every stored kind, through its reader, on a store ---------------------------------------


def memory() -> Storage:
    return Storage.from_url(f"memory://formats-{uuid.uuid4().hex}")


async def everything(storage: Storage) -> dict[str, bytes]:
    return {path: await storage.get(path) or b"" for path in await storage.list("")}


async def refused(storage: Storage, read: Callable[[], Awaitable[object]], path: str, version: int) -> None:
    """``read`` raises UnsupportedFormat naming ``path`` and ``version`` and changes nothing."""
    before = await everything(storage)
    with pytest.raises(UnsupportedFormat) as caught:
        await read()
    assert (caught.value.path, caught.value.version) == (path, version), str(caught.value)
    assert await everything(storage) == before


ENTRY_RECORDS = {  # a stream of each kind, and the records of one of its entries
    "topics/orders/0": encode_entry(EntryHeader("data", None, "p", 0, 0, 1, 0), [MessageRecord(b"v", "k")]),
    "coordinator/0/log": [encode_batch([NewTxn(TxnID(0, 1), "owner", 1000, 0)])],
    "subscriptions/orders/0/billing/pending-ack": [encode_record(AbortRecord(TxnID(0, 1)))],
    "catalog": [b"(the catalog stream keeps its record in properties; an entry all the same)"],
}


@pytest.mark.parametrize("stream", sorted(ENTRY_RECORDS))
@settings(max_examples=10, deadline=None)
@given(version=NEWER)
def test_a_newer_ledger_entry_is_refused_by_readers_and_the_next_writer(stream: str, version: int) -> None:
    """A stream whose open ledger ends with an object a newer release wrote (one run with
    ``write_format`` raised, then lowered): a read stops at it, and so does a writer's open
    (which seals the ledger after that object): nothing is sealed, no metadata written."""

    async def run() -> None:
        storage = memory()
        ledger = await ManagedLedger.open(storage, stream)
        for _ in range(3):
            await ledger.append(ENTRY_RECORDS[stream])
        path = chunk_path(stream, ledger.current_ledger_id or 0, 3)
        await storage.create(path, frame_in(version, FrameKind.ENTRY, 3, encode_records(ENTRY_RECORDS[stream])))

        async def read() -> None:
            reader = await ManagedLedger.open(storage, stream, writable=False)
            await reader.read(Position(0, 0), 100)

        await refused(storage, read, path, version)
        await refused(storage, lambda: ManagedLedger.open(storage, stream), path, version)

    asyncio.run(run())


@pytest.mark.parametrize("stream, properties", [
    ("catalog", {CATALOG_KEY: encode_catalog(Catalog())}),  # the catalog
    ("subscriptions/orders/0/billing/pending-ack", {"cursor": b"(a persisted cursor)"}),  # a cursor
    ("topics/orders/0", {}),
])
@settings(max_examples=10, deadline=None)
@given(version=NEWER)
def test_newer_stream_metadata_is_refused_before_anything_is_written(stream: str, properties: dict[str, bytes],
                                                                     version: int) -> None:
    """The record of a stream (its ledgers, trim point and properties: the catalog, a cursor) as
    a newer release wrote it: reading it is refused, and so is opening the stream to write."""

    async def run() -> None:
        storage = memory()
        ledger = await ManagedLedger.open(storage, stream)
        await ledger.set_properties(dict(properties))
        await ledger.append([b"x"])
        meta = await read_metadata(storage, stream)
        assert meta is not None
        newer = msgspec.structs.replace(meta, version=meta.version + 1)
        path = meta_path(stream, newer.version)
        await storage.create(path, frame_in(version, FrameKind.META, newer.version, msgspec.msgpack.encode(newer)))
        await refused(storage, lambda: read_metadata(storage, stream), path, version)
        await refused(storage, lambda: ManagedLedger.open(storage, stream), path, version)
        await refused(storage, lambda: ManagedLedger.open(storage, stream, writable=False), path, version)

    asyncio.run(run())


HORIZON = CompactionHorizon(1, Position(0, 0), 1, 1, 0)
KEPT = [KeptRecord(0, Position(0, 0), "k", b"v", 0)]
STREAM = "topics/table/0"


@settings(max_examples=10, deadline=None)
@given(version=NEWER, which=st.sampled_from(["horizon", "data"]))
def test_a_newer_compaction_generation_is_refused_by_readers_and_the_compactor(version: int, which: str) -> None:
    """A published horizon, or the compacted data it names, in a newer format: the compacted
    read and the next compaction both refuse it, and the compaction publishes nothing."""

    async def run() -> None:
        storage = memory()
        ledger = await ManagedLedger.open(storage, STREAM)
        await ledger.append(encode_entry(EntryHeader("data", None, "p", 0, 0, 1, 0, base_offset=0),
                                         [MessageRecord(b"v", "k")]))
        data_path = f"streams/{STREAM}/compacted/data/{1:020d}-x"
        horizon_path = f"streams/{STREAM}/compacted/horizons/{1:020d}"
        data_version, horizon_version = (version, 1) if which == "data" else (1, version)
        await storage.create(data_path, frame_in(data_version, FrameKind.COMPACTED, 0, msgspec.msgpack.encode(KEPT)))
        await storage.create(horizon_path, frame_in(horizon_version, FrameKind.HORIZON, 1,
                                                    msgspec.msgpack.encode(PublishedHorizon(HORIZON, data_path))))
        path = data_path if which == "data" else horizon_path

        async def read() -> None:
            await read_kept(storage, await read_published(storage, STREAM))

        await refused(storage, read, path, version)
        head = Position(ledger.current_ledger_id or 0, 0)
        await refused(storage, lambda: compact_partition(storage, "table", 0, head, [], 0), path, version)

    asyncio.run(run())


# --- what writers write ----------------------------------------------------------------------


def test_writers_write_their_storage_s_write_format() -> None:
    """Every writer on a storage stamps its ``write_format``: ledger entries, seals, metadata,
    compacted data, horizons and snapshot segments (format 1: 1, and RXSG for segments)."""

    async def run() -> dict[str, bytes]:
        storage = memory()
        assert storage.write_format == DEFAULT_WRITE_FORMAT == 1
        ledger = await ManagedLedger.open(storage, STREAM)
        await ledger.append(encode_entry(EntryHeader("data", None, "p", 0, 0, 1, 0, base_offset=0),
                                         [MessageRecord(b"v", "k")]))
        await compact_partition(storage, "table", 0, ledger.last_position, [], 0)
        await ledger.close()
        return await everything(storage)

    stored = asyncio.run(run())
    kinds = {path.split("/")[4] for path in stored}
    assert kinds == {"ledgers", "meta", "compacted"}, kinds
    for path, data in stored.items():
        assert data[:2] == b"RX" and data[3] == 1, path
    assert split_snapshot(b"snapshot", 1, 64, version=check_write_format(1))[0][1][:4] == b"RXSG"


@given(st.one_of(st.integers(NEWEST_FORMAT + 1, 10**6), st.integers(-10, 0), st.just(True), st.just("1"),
                 st.just(1.0), st.none()))
def test_a_write_format_this_release_cannot_write_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgument, match="write_format"):
        check_write_format(value)
    with pytest.raises(InvalidArgument, match="write_format"):
        Storage.from_url(f"memory://formats-{uuid.uuid4().hex}", write_format=value)


def test_write_format_is_a_storage_option_and_checked_before_an_engine_starts() -> None:
    from raytxn.client.client import _engine_config

    assert Storage.from_url("memory://formats-option", write_format=1).write_format == 1
    assert _engine_config("memory://x", {"write_format": 1}, {}).storage_options == {"write_format": 1}
    with pytest.raises(InvalidArgument, match=f"write_format {NEWEST_FORMAT + 1} is newer"):
        _engine_config("memory://x", {"write_format": NEWEST_FORMAT + 1}, {})


def test_connect_refuses_a_write_format_above_the_release_s_before_starting_anything() -> None:
    import ray

    import raytxn as rt

    running = ray.is_initialized()  # (no unit test starts Ray: this one must not either)
    with pytest.raises(InvalidArgument, match="write_format"):
        rt.connect(storage="memory://formats-connect", storage_options={"write_format": NEWEST_FORMAT + 1})
    assert ray.is_initialized() == running
