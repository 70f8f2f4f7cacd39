"""The producer's fast path for value-only messages writes exactly what ``encode_message`` writes
(partitions and readers decode it as a ``MessageRecord``)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytxn.client.producer import encode_plain
from raytxn.errors import InvalidArgument
from raytxn.protocol.entry_format import (
    MessageRecord,
    decode_submitted_batch,
    decode_submitted_message,
    encode_message,
    submitted_value_sizes,
)


@given(st.one_of(st.binary(max_size=300), st.integers(250, 70_000).map(lambda n: bytes(n))))
def test_encode_plain_is_encode_message(value: bytes) -> None:
    assert encode_plain(value) == encode_message(MessageRecord(value))
    assert decode_submitted_message(encode_plain(value)) == MessageRecord(value)


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20), st.integers(0, 19),
       st.sampled_from(["not bytes", bytearray(b"\x95"), b"\xc1", b"\x00", b""]))
def test_a_batch_is_sized_as_its_records_one_at_a_time_and_a_bad_record_fails_it_as_alone(
        values: list[bytes], where: int, bad: object) -> None:
    records = [encode_plain(value) for value in values]
    assert submitted_value_sizes(records) == [len(value) for value in values]
    records.insert(min(where, len(records)), bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as in_batch:
        submitted_value_sizes(records)
    with pytest.raises(InvalidArgument) as alone:
        decode_submitted_message(bad)
    assert str(in_batch.value) == str(alone.value)


@given(st.lists(st.tuples(st.binary(max_size=50), st.one_of(st.none(), st.text(max_size=5))), min_size=1,
                max_size=20))
def test_the_same_decode_finds_a_compacted_topics_first_keyless_record_only_when_asked(
        drawn: list[tuple[bytes, str | None]]) -> None:
    records = [encode_message(MessageRecord(value, key)) for value, key in drawn]
    keyless = next((i for i, (_, key) in enumerate(drawn) if key is None), None)
    assert decode_submitted_batch(records, find_keyless=True) == ([len(v) for v, _ in drawn], keyless)
    assert decode_submitted_batch(records).first_keyless is None
