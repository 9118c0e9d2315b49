"""Kafka's default partitioner for keyed records: the partition a key's records go to.

:func:`murmur2` is ``Utils.murmur2`` of kafka-clients (a signed 32-bit int, as Java returns
it) and :func:`partition_for` is what the default partitioner does with it
(``(murmur2(key) & 0x7fffffff) % partitions``), so a keyed Java producer, kafka-python or
``kafka-console-consumer`` finds a record where the proxy put it. The journal keys its events
and the state log its groups' records this way.
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (a signed 32-bit int)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of ``partitions`` Kafka's default partitioner picks for ``key``."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
