"""Stable hashing: Kafka's murmur2, so keys route to the same partition as a Kafka producer's
default partitioner would (``to_positive(murmur2(utf8(key))) % partitions``), and a transactional
id maps to its coordinator the same way (Kafka: ``abs(hash) % partitions`` of the txn log)."""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (a signed 32-bit result)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    blocks = length // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i: 4 * i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = data[4 * blocks:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def stable_hash(key: str | bytes) -> int:
    """A non-negative hash, the same in every process and release (Kafka's ``toPositive``)."""
    data = key.encode() if isinstance(key, str) else key
    return murmur2(data) & 0x7FFFFFFF


def partition_for(key: str | bytes, partitions: int) -> int:
    return stable_hash(key) % partitions


def coordinator_for(transactional_id: str, coordinators: int) -> int:
    return stable_hash(transactional_id) % coordinators
