"""Packed records read as the list of ``bytes`` they were packed from, survive pickling (how they
cross Ray) unchanged, and refuse offsets that do not match their data."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.client.batch import Run, build_table
from raytxn.errors import CorruptLedger
from raytxn.protocol.entry_format import MessageRecord, encode_message
from raytxn.protocol.packed_records import PackedRecords

records_lists = st.lists(st.binary(max_size=30), max_size=40)


@settings(max_examples=200, deadline=None)
@given(records_lists, st.integers(-45, 45), st.integers(-45, 45))
def test_packed_records_read_as_the_list_they_were_packed_from(records: list[bytes], start: int, stop: int) -> None:
    packed = PackedRecords.pack(records)
    assert len(packed) == len(records) and packed.nbytes == sum(map(len, records))
    assert list(packed.lengths) == [len(r) for r in records]
    assert [packed.record(i) for i in range(len(records))] == records  # one at a time, nothing cut
    assert list(packed[start:stop]) == records[start:stop]               # a slice is packed too
    assert isinstance(packed[start:stop], PackedRecords)
    assert list(packed[::2]) == records[::2]
    assert list(packed) == records and [packed[i] for i in range(-len(records), len(records))] == records * 2
    for index in (len(records), -len(records) - 1):
        with pytest.raises(IndexError):
            packed[index]
        with pytest.raises(IndexError):
            packed.record(index)


@settings(max_examples=100, deadline=None)
@given(records_lists)
def test_packed_records_cross_a_pickle_unchanged(records: list[bytes]) -> None:
    packed = PackedRecords.pack(records)
    again = pickle.loads(pickle.dumps(packed, protocol=5))
    assert again == packed and list(again) == records


@pytest.mark.parametrize(("data", "ends"), [
    (b"abc", [1, 2]),           # the last record ends before the data does
    (b"abc", [2, 1, 3]),        # offsets going back
    (b"abc", [-1, 3]),          # before the start
    (b"abc", [1, 4]),           # past the end
    (b"abc", []),               # data, and no record
])
def test_packed_records_with_offsets_that_do_not_match_their_data_are_refused(data: bytes, ends: list[int]) -> None:
    with pytest.raises(CorruptLedger):
        PackedRecords.from_wire(data, np.array(ends, dtype="<i8").tobytes())


def test_a_batch_table_is_the_same_from_packed_runs_and_from_runs_of_single_records() -> None:
    """``receive_batch`` builds its table from runs packed as they came; ``ack_rows`` selections
    hold lists. Both, and a mix, give the same columns."""
    encoded = [encode_message(MessageRecord(b"v%d" % i, None if i % 3 else f"k{i}")) for i in range(7)]
    odd = [encode_message(MessageRecord(b"p", "k", {"a": "b"}, 5))]  # not the plain shape: msgspec decodes

    def runs(pack: bool) -> list[Run]:
        parts = [encoded[:4], encoded[4:], odd]
        return [Run(0, 1, entry, len(part), 1000, list(range(len(part))), None,
                    PackedRecords.pack(part) if pack else list(part)) for entry, part in enumerate(parts)]

    packed, listed = build_table(runs(True)), build_table(runs(False))
    mixed = build_table([*runs(True)[:2], runs(False)[2]])
    assert packed.equals(listed) and mixed.equals(listed)
    assert packed.column("value").to_pylist() == [b"v%d" % i for i in range(7)] + [b"p"]
    plain_only = build_table(runs(True)[:2])
    assert plain_only.equals(build_table(runs(False)[:2]))
