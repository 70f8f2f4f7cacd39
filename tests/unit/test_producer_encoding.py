"""The producer's fast path for value-only messages writes exactly what ``encode_message`` writes
(partitions and readers decode it as a ``MessageRecord``)."""

from hypothesis import given
from hypothesis import strategies as st

from raytxn.client.producer import encode_plain
from raytxn.protocol.entry_format import MessageRecord, decode_submitted_message, encode_message


@given(st.one_of(st.binary(max_size=300), st.integers(250, 70_000).map(lambda n: bytes(n))))
def test_encode_plain_is_encode_message(value: bytes) -> None:
    assert encode_plain(value) == encode_message(MessageRecord(value))
    assert decode_submitted_message(encode_plain(value)) == MessageRecord(value)
