"""Segmented snapshots: round trip, incomplete snapshots ignored, every kind of damage detected."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.errors import CorruptLedger, InvalidArgument
from raytxn.ledger.snapshots import (
    SEGMENT_OVERHEAD,
    join_segments,
    newest_complete,
    obsolete_segments,
    split_snapshot,
)


@given(st.binary(max_size=2000), st.integers(0, 2**40), st.integers(SEGMENT_OVERHEAD + 1, 600))
def test_round_trip(data: bytes, snapshot_id: int, max_segment_bytes: int) -> None:
    segments = split_snapshot(data, snapshot_id, max_segment_bytes, version=1)
    assert all(len(blob) <= max_segment_bytes for _, blob in segments)
    found = newest_complete([name for name, _ in reversed(segments)])
    assert found == (snapshot_id, [name for name, _ in segments])
    assert join_segments([blob for _, blob in segments], snapshot_id) == data


def test_names_and_empty_snapshot() -> None:
    segments = split_snapshot(b"x" * 100, 7, SEGMENT_OVERHEAD + 40, version=1)
    assert [name for name, _ in segments] == [
        "00000000000000000007/000000-of-000003",
        "00000000000000000007/000001-of-000003",
        "00000000000000000007/000002-of-000003",
    ]
    empty = split_snapshot(b"", 8, 100, version=1)
    assert len(empty) == 1 and join_segments([empty[0][1]]) == b""
    with pytest.raises(InvalidArgument):
        split_snapshot(b"x", 1, SEGMENT_OVERHEAD, version=1)


def test_incomplete_newest_is_ignored() -> None:
    old = [name for name, _ in split_snapshot(b"a" * 50, 1, SEGMENT_OVERHEAD + 20, version=1)]
    new = [name for name, _ in split_snapshot(b"b" * 50, 2, SEGMENT_OVERHEAD + 20, version=1)]
    assert len(new) == 3
    listing = ["snapshots/" + n for n in [*old, new[0], new[2]]] + ["snapshots/README", "junk/000001-of-000001"]
    sid, names = newest_complete(listing)
    assert sid == 1 and names == ["snapshots/" + n for n in old]
    # The complete newer one wins once its last segment is there.
    assert newest_complete([*old, *new])[0] == 2
    assert newest_complete([new[0], new[1]]) is None
    assert newest_complete([]) is None
    # Old snapshots may go once a newer one is complete; a newer incomplete one stays.
    assert obsolete_segments([*old, *new]) == old
    third = [name for name, _ in split_snapshot(b"c" * 50, 3, SEGMENT_OVERHEAD + 20, version=1)]
    assert obsolete_segments([*old, *new, third[0]]) == old
    assert obsolete_segments([*old, new[0]]) == []


def test_flipped_byte_is_corrupt() -> None:
    segments = [blob for _, blob in split_snapshot(bytes(range(200)), 5, SEGMENT_OVERHEAD + 64, version=1)]
    for s in range(len(segments)):
        for i in range(len(segments[s])):
            damaged = list(segments)
            blob = bytearray(damaged[s])
            blob[i] ^= 0x01
            damaged[s] = bytes(blob)
            with pytest.raises(CorruptLedger):
                join_segments(damaged, 5)


def test_order_count_and_identity_checked() -> None:
    a = [blob for _, blob in split_snapshot(b"a" * 90, 1, SEGMENT_OVERHEAD + 30, version=1)]
    b = [blob for _, blob in split_snapshot(b"b" * 90, 2, SEGMENT_OVERHEAD + 30, version=1)]
    for bad in ([a[1], a[0], a[2]], a[:2], [a[0], b[1], a[2]], [*a, a[2]], [], [a[0][:10]], [a[0][:-1], *a[1:]]):
        with pytest.raises(CorruptLedger, match="snap-1"):
            join_segments(bad, where="snap-1")
    with pytest.raises(CorruptLedger):
        join_segments(a, snapshot_id=2)
