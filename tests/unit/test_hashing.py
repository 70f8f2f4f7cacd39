"""murmur2 matches Kafka's reference values (from Kafka's UtilsTest.testMurmur2)."""

import pytest

from raytxn.hashing import murmur2, partition_for, stable_hash

KAFKA_CASES = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), KAFKA_CASES.items())
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_stable_hash_non_negative_and_partition_in_range() -> None:
    for i in range(1000):
        assert stable_hash(f"key-{i}") >= 0
        assert 0 <= partition_for(f"key-{i}", 7) < 7
