"""The numpy path from encoded records to Arrow columns gives exactly what msgspec decoding
gives, and never accepts bytes msgspec would refuse."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytxn.client.batch import decode_records, record_columns
from raytxn.client.record_columns import plain_columns
from raytxn.errors import CorruptLedger
from raytxn.protocol.entry_format import MessageRecord, encode_message

# Lengths at the edges of msgpack's bin8/bin16/bin32 and fixstr/str8 headers.
values = st.one_of(st.binary(max_size=40), st.sampled_from([255, 256, 65535, 65536]).map(lambda n: b"v" * n))
keys = st.one_of(st.none(), st.text(max_size=40), st.sampled_from(["", "k" * 31, "k" * 32, "k" * 256, "ключ"]))
event_times = st.one_of(st.none(), st.integers(0, 2**53))
plain_records = st.builds(MessageRecord, values, keys, st.just({}), event_times)
any_records = st.builds(MessageRecord, values, keys,
                        st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
                        st.one_of(st.none(), st.integers(-5, 2**53)))


def msgspec_columns(encoded: list[bytes]) -> tuple[list[bytes], list[str | None], list[int | None]]:
    decoded = decode_records(encoded)
    return [r.value for r in decoded], [r.key for r in decoded], [r.event_time_ms for r in decoded]


@settings(max_examples=300, deadline=None)
@given(st.lists(plain_records, max_size=30))
def test_plain_records_take_the_numpy_path_and_match_msgspec(records: list[MessageRecord]) -> None:
    encoded = [encode_message(r) for r in records]
    columns = plain_columns(encoded)
    assert columns is not None
    value_column, key_column, event_time_column = columns
    assert value_column.type == pa.binary() and key_column.type == pa.string()
    assert event_time_column.type == pa.timestamp("ms")
    value_column.validate(full=True)
    assert (value_column.to_pylist(), key_column.to_pylist(),
            event_time_column.cast(pa.int64()).to_pylist()) == msgspec_columns(encoded)


@settings(max_examples=300, deadline=None)
@given(st.lists(any_records, min_size=1, max_size=20))
def test_every_batch_gives_msgspecs_columns(records: list[MessageRecord]) -> None:
    encoded = [encode_message(r) for r in records]
    value, key, properties, event_time = record_columns(encoded)
    assert value.to_pylist() == [r.value for r in records]
    assert key.to_pylist() == [r.key for r in records]
    assert properties.to_pylist() == [list(r.properties.items()) for r in records]
    assert event_time.cast(pa.int64()).to_pylist() == [r.event_time_ms for r in records]
    shaped_plain = all(not r.properties and (r.event_time_ms is None or r.event_time_ms >= 0)
                       and (r.key is None or len(r.key.encode()) < 65536) for r in records)
    assert (plain_columns(encoded) is not None) == shaped_plain


@settings(max_examples=500, deadline=None)
@given(st.lists(plain_records, min_size=1, max_size=8), st.data())
def test_damaged_records_are_refused_or_read_as_msgspec_reads_them(records: list[MessageRecord],
                                                                  data: st.DataObject) -> None:
    """Flip, cut or extend one record: the numpy path says None (msgspec decides), or it
    reads the bytes exactly as msgspec does; it never makes up a value msgspec would refuse."""
    encoded = [encode_message(r) for r in records]
    at = data.draw(st.integers(0, len(encoded) - 1))
    record = bytearray(encoded[at])
    damage = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if damage == "flip":
        i = data.draw(st.integers(0, len(record) - 1))
        record[i] = data.draw(st.integers(0, 255))
    elif damage == "cut":
        del record[data.draw(st.integers(0, len(record) - 1)):]
    else:
        record += data.draw(st.binary(min_size=1, max_size=3))
    encoded[at] = bytes(record)
    columns = plain_columns(encoded)
    if columns is None:
        return
    try:
        expected = msgspec_columns(encoded)
    except CorruptLedger:
        pytest.fail(f"the numpy path read a batch msgspec refuses: {encoded[at]!r}")
    assert (columns[0].to_pylist(), columns[1].to_pylist(), columns[2].cast(pa.int64()).to_pylist()) == expected


def test_a_batch_with_a_record_that_is_not_one_raises_corrupt_ledger() -> None:
    encoded = [encode_message(MessageRecord(b"fine")), b"\x95\xa2m1\xc4\x05ab"]
    assert plain_columns(encoded) is None
    with pytest.raises(CorruptLedger):
        record_columns(encoded)


def test_no_records_give_empty_columns() -> None:
    assert [len(column) for column in record_columns([])] == [0, 0, 0, 0]
