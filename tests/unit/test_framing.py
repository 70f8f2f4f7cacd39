"""Frame layout: round trip, and every kind of damage is a CorruptLedger naming the object."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.errors import CorruptLedger
from raytxn.ledger.framing import FrameKind, decode_frames, decode_records, encode_frame, encode_records


@given(st.lists(st.lists(st.binary(max_size=64), max_size=5), min_size=1, max_size=5), st.integers(0, 2**40))
def test_round_trip(entries: list[list[bytes]], first: int) -> None:
    data = b"".join(encode_frame(FrameKind.ENTRY, first + i, encode_records(r), version=1)
                    for i, r in enumerate(entries))
    frames = decode_frames(data, "obj")
    assert [(k, e) for k, e, _ in frames] == [(FrameKind.ENTRY, first + i) for i in range(len(entries))]
    assert [decode_records(p, "obj") for _, _, p in frames] == entries


def _object() -> bytes:
    return encode_frame(FrameKind.ENTRY, 7, encode_records([b"hello", b"world"]), version=1) + encode_frame(
        FrameKind.SEAL, 8, b"", version=1)


@pytest.mark.parametrize("cut", [1, 10, 19, 21, 30])
def test_truncation_detected(cut: int) -> None:
    data = _object()
    with pytest.raises(CorruptLedger, match="some/path") as info:
        decode_frames(data[: len(data) - cut], "some/path")
    assert info.value.path == "some/path"


def test_every_flipped_byte_detected() -> None:
    data = _object()
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        with pytest.raises(CorruptLedger):
            decode_frames(bytes(damaged), "p")


def test_empty_object_is_corrupt() -> None:
    with pytest.raises(CorruptLedger, match="empty"):
        decode_frames(b"", "p")
