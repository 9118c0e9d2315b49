"""Record batches (v2): CRC-32C, our batches read by kafka-python and kafka-python's read by
us (uncompressed and gzip), round trips of arbitrary records, and what is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from proxy.records import (
    Compression,
    Record,
    RecordsError,
    crc32c,
    decode_batches,
    encode_batch,
)

T = 1_700_000_000_000


def test_crc32c_check_values() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert crc32c(b"") == 0
    data = bytes(range(256)) * 3
    assert crc32c(data[100:], crc32c(data[:100])) == crc32c(data)
    from kafka.record.util import calc_crc32c
    for n in (1, 7, 8, 9, 63, 64, 65, 1000):
        assert crc32c(data[:n]) == calc_crc32c(memoryview(data[:n]))


def records(n: int) -> list[Record]:
    return [Record(f"group-{i % 3}".encode(), f'{{"i":{i}}}'.encode() * (i % 5 + 1), T + i * 7,
                   (("h", b"x"),) if i % 4 == 0 else ()) for i in range(n)]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_kafka_python_reads_our_batches(compression: Compression) -> None:
    batch = encode_batch(records(50), base_offset=1000, compression=compression)
    read = DefaultRecordBatch(batch)
    assert read.validate_crc()
    assert read.compression_type == int(compression)
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in read]
    want = [(1000 + i, r.timestamp_ms, r.key, r.value, list(r.headers))
            for i, r in enumerate(records(50))]
    assert got == want


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_we_read_kafka_python_batches(compression: Compression) -> None:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=int(compression),
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, r in enumerate(records(30)):
        builder.append(i, timestamp=r.timestamp_ms, key=r.key, value=r.value,
                       headers=list(r.headers))
    raw = bytes(builder.build())
    (batch,) = decode_batches(raw)
    assert batch.compression is compression
    assert [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in batch.records] == \
        [(i, r.key, r.value, r.timestamp_ms, r.headers) for i, r in enumerate(records(30))]


record_strategy = st.builds(
    Record,
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.integers(min_value=0, max_value=2**41),
    st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)),
             max_size=3).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(record_strategy, min_size=1, max_size=20),
       st.sampled_from([Compression.NONE, Compression.GZIP]),
       st.integers(min_value=0, max_value=2**40))
def test_round_trip(rs: list[Record], compression: Compression, base: int) -> None:
    raw = encode_batch(rs, base_offset=base, compression=compression)
    (batch,) = decode_batches(raw)
    assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in batch.records] == \
        [(r.key, r.value, r.timestamp_ms, r.headers) for r in rs]
    assert [r.offset for r in batch.records] == list(range(base, base + len(rs)))
    assert batch.next_offset == base + len(rs)
    assert batch.max_timestamp == max(r.timestamp_ms for r in rs)


def test_several_batches_and_a_truncated_tail() -> None:
    first = encode_batch(records(3), base_offset=0)
    second = encode_batch(records(4), base_offset=3, compression=Compression.GZIP)
    batches = decode_batches(first + second + second[:30])
    assert [b.base_offset for b in batches] == [0, 3]
    assert decode_batches(first[:-1]) == []
    assert decode_batches(b"") == []


def test_corruption_and_unsupported_batches_are_refused() -> None:
    raw = bytearray(encode_batch(records(3)))
    raw[-2] ^= 0xFF
    with pytest.raises(RecordsError, match="CRC"):
        decode_batches(bytes(raw))
    assert decode_batches(bytes(raw), check_crc=False)[0].records  # structure still fine
    old = bytearray(encode_batch(records(1)))
    old[16] = 1  # magic 1
    with pytest.raises(RecordsError, match="magic"):
        decode_batches(bytes(old))
    zstd = bytearray(encode_batch(records(1)))
    struct.pack_into(">h", zstd, 21, 4)
    struct.pack_into(">I", zstd, 17, crc32c(bytes(zstd[21:])))
    with pytest.raises(RecordsError, match="ZSTD"):
        decode_batches(bytes(zstd))
    with pytest.raises(ValueError):
        encode_batch([])
    with pytest.raises(ValueError):
        encode_batch(records(1), compression=Compression.LZ4)
