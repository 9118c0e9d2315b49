"""Kafka's default partitioner, checked against Kafka's own test vectors and kafka-python."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from proxy.kafka_client.partitioner import murmur2, partition_for

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed, as Java returns them)
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafkas_test_vectors() -> None:
    for data, expected in KAFKA_VECTORS.items():
        assert murmur2(data) == expected


@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python(data: bytes) -> None:
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


def test_murmur2_of_every_tail_length() -> None:
    for key in (b"", b"a", b"ab", b"abcd", b"group-17", "grüppe".encode(), bytes(range(200))):
        assert murmur2(key) & 0xFFFFFFFF == kafka_python_murmur2(key), key


@given(st.binary(max_size=40), st.integers(1, 200))
def test_partition_is_kafkas_default_partitioner(key: bytes, n: int) -> None:
    assert partition_for(key, n) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % n


def test_a_topic_has_partitions() -> None:
    assert partition_for(b"group-1", 1) == 0
    with pytest.raises(ValueError):
        partition_for(b"g", 0)
