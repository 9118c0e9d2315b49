"""The pure parts of the group state log: partitioning, transactional ids, record batches and
the read_committed filter, checked against Kafka's own test vectors and kafka-python."""

from __future__ import annotations

import gzip
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from proxy.coordination import record_batch as rb
from proxy.coordination.state_ids import (
    DIGEST_HEX,
    MAX_TRANSACTIONAL_ID,
    check_prefix,
    murmur2,
    partition_for,
    transactional_id,
)
from proxy.coordination.state_log import StateLogSettings

# -- partitioning --------------------------------------------------------------------------

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed 32-bit results)
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
        assert struct.unpack(">i", struct.pack(">I", murmur2(data)))[0] == expected


@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python(data: bytes) -> None:
    assert murmur2(data) == kafka_python_murmur2(data) & 0xFFFFFFFF


@given(st.text(min_size=1, max_size=40), st.integers(1, 200))
def test_partition_is_kafkas_default_partitioner_for_the_group_id(group: str, n: int) -> None:
    expected = (kafka_python_murmur2(group.encode()) & 0x7FFFFFFF) % n
    assert partition_for(group, n) == expected


def test_partition_of_known_groups() -> None:
    # fixed forever: a change moves every group's state to another partition
    for group, signed in ((b"21", -973932308), (b"foobar", -790332482), (b"abc", 479470107)):
        for n in (1, 16, 50, 1000):
            assert partition_for(group.decode(), n) == (signed & 0x7FFFFFFF) % n
    with pytest.raises(ValueError):
        partition_for("g", 0)


# -- transactional ids -----------------------------------------------------------------------

def test_plain_group_ids_are_used_as_they_are() -> None:
    assert transactional_id("gg", "orders.v2_eu-1") == "gg-orders.v2_eu-1"


@pytest.mark.parametrize("group", ["", "with space", "a/b", "k=v,x", "ü", "x" * 300,
                                   "new\nline", "tilde~"])
def test_other_group_ids_get_the_digest_form(group: str) -> None:
    tid = transactional_id("gg", group)
    assert tid.startswith("gg-") and len(tid) <= MAX_TRANSACTIONAL_ID
    readable, sep, digest = tid[3:].rpartition("~")
    assert sep and len(digest) == DIGEST_HEX
    assert all(c.isalnum() or c in "._-" for c in readable)
    assert transactional_id("gg", group) == tid  # stable


@given(st.text(max_size=300), st.text(max_size=300))
def test_distinct_groups_get_distinct_ids(a: str, b: str) -> None:
    if a != b:
        assert transactional_id("p", a) != transactional_id("p", b)


def test_a_literal_form_never_looks_like_a_digest_form() -> None:
    digest_form = transactional_id("p", "a b")
    assert transactional_id("p", digest_form[2:]) != digest_form  # '~' forces a digest


def test_prefixes_are_checked() -> None:
    assert check_prefix("groupgate-state") == "groupgate-state"
    for bad in ("", "a b", "x" * 101, "a~b"):
        with pytest.raises(ValueError):
            check_prefix(bad)
    with pytest.raises(ValueError):
        StateLogSettings(transactional_id_prefix="no spaces")
    with pytest.raises(ValueError):
        StateLogSettings(transaction_timeout_ms=5_000, write_timeout=10.0)


# -- record batches ------------------------------------------------------------------------

RECORDS: list[rb.Record] = [(b"g\x00m%d" % i, None if i % 4 == 3 else b"v" * i)
                            for i in range(40)]


def test_our_batch_is_kafka_pythons_byte_for_byte() -> None:
    ours = rb.encode_batch(RECORDS, producer_id=7, producer_epoch=3, base_sequence=11,
                           timestamp_ms=1_700_000_000_000)
    builder = DefaultRecordBatchBuilder(2, 0, True, 7, 3, 11, 1 << 20)
    for offset, (k, v) in enumerate(RECORDS):
        builder.append(offset, 1_700_000_000_000, k, v, [])
    assert bytes(builder.build()) == ours
    parsed = DefaultRecordBatch(ours)
    assert parsed.validate_crc() and parsed.is_transactional and not parsed.is_control_batch
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (7, 3, 11)
    assert [(r.key, r.value) for r in parsed] == RECORDS


def test_empty_batches_are_refused() -> None:
    with pytest.raises(ValueError):
        rb.encode_batch([], producer_id=1, producer_epoch=0, base_sequence=0, timestamp_ms=0)


def at(batch: bytes, base_offset: int) -> bytes:
    """``batch`` as the broker stores it at ``base_offset`` (the offset is outside the CRC)."""
    return struct.pack(">q", base_offset) + batch[8:]


def data(pid: int, offset: int, *values: bytes) -> bytes:
    records = [(b"k" + v, v) for v in values]
    return at(rb.encode_batch(records, producer_id=pid, producer_epoch=0, base_sequence=0,
                              timestamp_ms=0), offset)


def marker(pid: int, offset: int, commit: bool) -> bytes:
    """A control batch as a transaction coordinator's marker is written."""
    body = bytearray()
    key = struct.pack(">hh", 0, rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT)
    value = struct.pack(">hi", 0, 5)
    record = bytearray([0, 0, 0])
    rb._varint(len(key), record)
    record += key
    rb._varint(len(value), record)
    record += value
    record.append(0)
    rb._varint(len(record), body)
    body += record
    header = bytearray(rb.HEADER.pack(offset, rb.HEADER.size - 12 + len(body), 0, 2, 0,
                                      rb.TRANSACTIONAL | rb.CONTROL, 0, 0, 0, pid, 0, -1, 1))
    crc = rb.crc32c(bytes(header[rb.ATTRIBUTES_OFFSET:]) + body)
    struct.pack_into(">I", header, rb.CRC_OFFSET, crc)
    return bytes(header + body)


def values(result: rb.ReadResult) -> list[bytes | None]:
    return [v for _, _, v in result.records]


def test_aborted_transactions_and_markers_are_skipped() -> None:
    blob = b"".join([
        data(1, 0, b"a1", b"a2"),       # pid 1: aborted at 4
        data(2, 2, b"c1"),              # pid 2: committed at 5
        data(1, 3, b"a3"),
        marker(1, 4, commit=False),
        marker(2, 5, commit=True),
        data(1, 6, b"b1"),              # pid 1 again, a new transaction, committed
        marker(1, 7, commit=True),
        data(3, 8, b"open"),            # below the LSO only if committed: here, no marker
    ])
    result = rb.read_committed(blob, [(1, 0)])
    assert values(result) == [b"c1", b"b1", b"open"]
    assert [o for o, _, _ in result.records] == [2, 6, 8]
    assert result.next_offset == 9
    # without the aborted list everything but the markers is data
    assert values(rb.read_committed(blob, [])) == [b"a1", b"a2", b"c1", b"a3", b"b1", b"open"]


def test_an_aborted_transaction_that_starts_on_an_earlier_page() -> None:
    # the broker lists the transaction again for a fetch that starts inside it
    page2 = data(1, 3, b"a3") + marker(1, 4, commit=False) + data(1, 6, b"b1")
    assert values(rb.read_committed(page2, [(1, 0)])) == [b"b1"]


def test_a_second_aborted_transaction_of_one_producer() -> None:
    blob = (data(1, 0, b"x") + marker(1, 1, commit=False) + data(1, 2, b"y")
            + marker(1, 3, commit=False) + data(1, 4, b"z"))
    assert values(rb.read_committed(blob, [(1, 0), (1, 2)])) == [b"z"]


def test_a_truncated_last_batch_is_left_for_the_next_fetch() -> None:
    blob = data(2, 0, b"one") + data(2, 1, b"two")
    result = rb.read_committed(blob[:-5], [])
    assert values(result) == [b"one"] and result.next_offset == 1
    assert rb.read_committed(blob[:30], []).next_offset is None


def test_corruption_is_detected() -> None:
    blob = bytearray(data(2, 0, b"payload"))
    blob[-3] ^= 0xFF
    with pytest.raises(rb.BatchError, match="CRC"):
        rb.read_committed(bytes(blob), [])
    assert values(rb.read_committed(bytes(blob), [], check_crc=False)) != [b"payload"]
    bad_magic = bytearray(data(2, 0, b"x"))
    bad_magic[16] = 1
    with pytest.raises(rb.BatchError, match="magic"):
        rb.read_committed(bytes(bad_magic), [])


def test_gzip_batches_are_read_and_other_codecs_named() -> None:
    builder = DefaultRecordBatchBuilder(2, rb.GZIP, False, -1, -1, -1, 1 << 20)
    for offset, (k, v) in enumerate(RECORDS):
        builder.append(offset, 0, k, v, [])
    blob = bytes(builder.build())
    assert gzip.decompress(blob[rb.HEADER.size:])  # really compressed
    assert [(k, v) for _, k, v in rb.read_committed(blob, []).records] == RECORDS
    lz4 = bytearray(blob)
    struct.pack_into(">h", lz4, rb.ATTRIBUTES_OFFSET, 3)
    with pytest.raises(rb.BatchError, match="lz4"):
        rb.read_committed(bytes(lz4), [], check_crc=False)


def test_split_keeps_batches_under_the_limit_and_records_in_order() -> None:
    records = [(b"k%d" % i, b"x" * 300) for i in range(100)]
    runs = rb.split(records, 4096)
    assert [r for run in runs for r in run] == records
    for run in runs:
        assert len(rb.encode_batch(run, producer_id=1, producer_epoch=0, base_sequence=0,
                                   timestamp_ms=0)) <= 4096
    assert len(runs) > 1
    big = [(b"k", b"y" * 10_000)]
    assert rb.split(big, 4096) == [big]
