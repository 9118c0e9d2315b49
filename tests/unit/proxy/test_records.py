"""Record batches (v2, proxy.records): CRC-32C, our batches read by kafka-python and
kafka-python's read by us (uncompressed and gzip), the state log's transactional batch byte for
byte as kafka-python builds it, round trips of arbitrary records, what is refused, splitting,
and the read_committed filter over aborted transactions and control batches."""

from __future__ import annotations

import gzip
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from proxy.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    Compression,
    ReadResult,
    Record,
    RecordsError,
    batches,
    crc32c,
    encode_batch,
    encode_records,
    read_committed,
    split,
)
from proxy.records.format import (
    ATTRIBUTES_OFFSET,
    CONTROL,
    CRC_OFFSET,
    HEADER,
    RECORDS_OFFSET,
    TRANSACTIONAL,
)

T = 1_700_000_000_000


def test_crc32c_check_values() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert crc32c(b"") == 0
    data = bytes(range(256)) * 3
    assert crc32c(data[100:], crc32c(data[:100])) == crc32c(data)
    assert crc32c(memoryview(data)[5:]) == crc32c(bytearray(data[5:])) == crc32c(data[5:])
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
    (batch,) = batches(raw)
    assert batch.compression is compression
    assert [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in batch.records()] == \
        [(i, r.key, r.value, r.timestamp_ms, r.headers) for i, r in enumerate(records(30))]
    assert batch.entries() == [(i, r.key, r.value) for i, r in enumerate(records(30))]


# the state log's records: (key, value | None), one timestamp per batch, no headers
STATE: list[tuple[bytes, bytes | None]] = [(b"g\x00m%d" % i, None if i % 4 == 3 else b"v" * i)
                                           for i in range(40)]


def test_a_transactional_batch_is_kafka_pythons_byte_for_byte() -> None:
    ours = encode_batch([Record(k, v, T) for k, v in STATE], transactional=True, producer_id=7,
                        producer_epoch=3, base_sequence=11,
                        partition_leader_epoch=0)  # as kafka-python writes it (brokers set it)
    builder = DefaultRecordBatchBuilder(2, 0, True, 7, 3, 11, 1 << 20)
    for offset, (k, v) in enumerate(STATE):
        builder.append(offset, T, k, v, [])
    assert bytes(builder.build()) == ours
    parsed = DefaultRecordBatch(ours)
    assert parsed.validate_crc() and parsed.is_transactional and not parsed.is_control_batch
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (7, 3, 11)
    assert [(r.key, r.value) for r in parsed] == STATE
    (batch,) = batches(ours)
    assert batch.is_transactional and not batch.is_control
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 3, 11)


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
    (batch,) = batches(raw)
    read = batch.records()
    assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in read] == \
        [(r.key, r.value, r.timestamp_ms, r.headers) for r in rs]
    assert [r.offset for r in read] == list(range(base, base + len(rs)))
    assert batch.entries() == [(r.offset, r.key, r.value) for r in read]
    assert batch.next_offset == base + len(rs)
    assert batch.max_timestamp == max(r.timestamp_ms for r in rs)


def test_several_batches_and_a_truncated_tail() -> None:
    first = encode_batch(records(3), base_offset=0)
    second = encode_batch(records(4), base_offset=3, compression=Compression.GZIP)
    assert [b.base_offset for b in batches(first + second + second[:30])] == [0, 3]
    assert list(batches(first[:-1])) == []
    assert list(batches(b"")) == []


def test_corruption_and_unsupported_batches_are_refused() -> None:
    raw = bytearray(encode_batch(records(3)))
    raw[-2] ^= 0xFF
    with pytest.raises(RecordsError, match="CRC"):
        list(batches(bytes(raw)))
    assert next(batches(bytes(raw), check_crc=False)).records()  # structure still fine
    old = bytearray(encode_batch(records(1)))
    old[16] = 1  # magic 1
    with pytest.raises(RecordsError, match="magic"):
        list(batches(bytes(old)))
    zstd = bytearray(encode_batch(records(1)))
    struct.pack_into(">h", zstd, 21, 4)
    struct.pack_into(">I", zstd, 17, crc32c(bytes(zstd[21:])))
    with pytest.raises(RecordsError, match="zstd"):
        next(batches(bytes(zstd))).records()
    long_value = bytearray(encode_batch([Record(b"k", b"value", T)]))
    # record length, attributes, timestamp delta, offset delta, key length, key: then 5 (zigzag)
    assert long_value[RECORDS_OFFSET + 6] == 10
    long_value[RECORDS_OFFSET + 6] = 40  # 20 bytes, past the record's end
    (batch,) = batches(bytes(long_value), check_crc=False)
    with pytest.raises(RecordsError, match="past the end"):
        batch.entries()
    with pytest.raises(RecordsError, match="past the end"):
        batch.records()
    with pytest.raises(ValueError):
        encode_batch([])
    with pytest.raises(ValueError):
        encode_batch(records(1), compression=Compression.LZ4)
    with pytest.raises(ValueError):
        encode_batch(records(1), transactional=True)  # without a producer id


def test_split_keeps_batches_under_the_limit_and_records_in_order() -> None:
    rs = [Record(b"k%d" % i, b"x" * 300, T) for i in range(100)]
    runs = split(rs, 4096)
    assert [r for run in runs for r in run] == rs
    for run in runs:
        assert len(encode_batch(run, transactional=True, producer_id=1, producer_epoch=0,
                                base_sequence=0)) <= 4096
    assert len(runs) > 1
    big = [Record(b"k", b"y" * 10_000, T)]
    assert split(big, 4096) == [big]
    spread = records(200)  # timestamps and headers count too
    for run in split(spread, 2048):
        assert len(encode_batch(run)) <= 2048


# -- read_committed ----------------------------------------------------------------------------

def data(pid: int, offset: int, *values: bytes) -> bytes:
    """A transactional batch of ``pid`` as the broker stores it at ``offset``."""
    return encode_batch([Record(b"k" + v, v, 0) for v in values], base_offset=offset,
                        transactional=True, producer_id=pid, producer_epoch=0, base_sequence=0)


def marker(pid: int, offset: int, commit: bool) -> bytes:
    """A control batch as a transaction coordinator's marker is written."""
    key = struct.pack(">hh", 0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    body = encode_records([Record(key, struct.pack(">hi", 0, 5), 0)], 0)
    header = bytearray(HEADER.pack(offset, HEADER.size - 12 + len(body), 0, 2, 0,
                                   TRANSACTIONAL | CONTROL, 0, 0, 0, pid, 0, -1, 1))
    crc = crc32c(bytes(header[ATTRIBUTES_OFFSET:]) + body)
    struct.pack_into(">I", header, CRC_OFFSET, crc)
    return bytes(header + body)


def values(result: ReadResult) -> list[bytes | None]:
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
    result = read_committed(blob, [(1, 0)])
    assert values(result) == [b"c1", b"b1", b"open"]
    assert [o for o, _, _ in result.records] == [2, 6, 8]
    assert result.next_offset == 9
    # without the aborted list everything but the markers is data
    assert values(read_committed(blob, [])) == [b"a1", b"a2", b"c1", b"a3", b"b1", b"open"]
    assert [b.control_type() for b in batches(blob)] == [
        None, None, None, CONTROL_ABORT, CONTROL_COMMIT, None, CONTROL_COMMIT, None]


def test_an_aborted_transaction_that_starts_on_an_earlier_page() -> None:
    # the broker lists the transaction again for a fetch that starts inside it
    page2 = data(1, 3, b"a3") + marker(1, 4, commit=False) + data(1, 6, b"b1")
    assert values(read_committed(page2, [(1, 0)])) == [b"b1"]


def test_a_second_aborted_transaction_of_one_producer() -> None:
    blob = (data(1, 0, b"x") + marker(1, 1, commit=False) + data(1, 2, b"y")
            + marker(1, 3, commit=False) + data(1, 4, b"z"))
    assert values(read_committed(blob, [(1, 0), (1, 2)])) == [b"z"]


def test_a_truncated_last_batch_is_left_for_the_next_fetch() -> None:
    blob = data(2, 0, b"one") + data(2, 1, b"two")
    result = read_committed(blob[:-5], [])
    assert values(result) == [b"one"] and result.next_offset == 1
    assert read_committed(blob[:30], []).next_offset is None


def test_corruption_is_detected() -> None:
    blob = bytearray(data(2, 0, b"payload"))
    blob[-3] ^= 0xFF
    with pytest.raises(RecordsError, match="CRC"):
        read_committed(bytes(blob), [])
    assert values(read_committed(bytes(blob), [], check_crc=False)) != [b"payload"]
    bad_magic = bytearray(data(2, 0, b"x"))
    bad_magic[16] = 1
    with pytest.raises(RecordsError, match="magic"):
        read_committed(bytes(bad_magic), [])


def test_gzip_batches_are_read_and_other_codecs_named() -> None:
    builder = DefaultRecordBatchBuilder(2, int(Compression.GZIP), False, -1, -1, -1, 1 << 20)
    for offset, (k, v) in enumerate(STATE):
        builder.append(offset, 0, k, v, [])
    blob = bytes(builder.build())
    assert gzip.decompress(blob[RECORDS_OFFSET:])  # really compressed
    assert [(k, v) for _, k, v in read_committed(blob, []).records] == STATE
    lz4 = bytearray(blob)
    struct.pack_into(">h", lz4, ATTRIBUTES_OFFSET, 3)
    with pytest.raises(RecordsError, match="lz4"):
        read_committed(bytes(lz4), [], check_crc=False)


@pytest.mark.parametrize("max_message_bytes", [4096, 65_536, 1_048_588])
def test_a_record_of_max_record_bytes_fits_a_transactional_batch_of_its_own(
        max_message_bytes: int) -> None:
    """The state log's record limit: a record with that many key and value bytes, alone in a
    transactional batch, stays within the topic's max.message.bytes (which the broker
    compares with the whole batch)."""
    from proxy.records import max_record_bytes
    size = max_record_bytes(max_message_bytes)
    key = b"k" * 40
    record = Record(key, b"v" * (size - len(key)), 1_700_000_000_000)
    batch = encode_batch([record], transactional=True, producer_id=7, producer_epoch=1,
                         base_sequence=0)
    assert len(batch) <= max_message_bytes
    assert split([record], max_message_bytes) == [[record]]


def test_the_state_log_takes_its_record_limit_from_the_topic_s_max_message_bytes() -> None:
    from proxy.records import max_record_bytes
    from proxy.state_log.log import StateLog, StateLogSettings
    default = StateLog([("127.0.0.1", 1)], StateLogSettings(), group_of=lambda k: "")
    assert default.max_record_bytes == max_record_bytes(1_048_588)
    small = StateLog([("127.0.0.1", 1)], StateLogSettings(
        topic_configs={"max.message.bytes": "65536"}), group_of=lambda k: "")
    assert small.max_record_bytes == max_record_bytes(65_536)
    assert small._writer_config.max_batch_bytes == 65_536
