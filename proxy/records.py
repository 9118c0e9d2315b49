"""Kafka record batches (message format v2, magic 2): encoding for Produce, decoding for Fetch.

The proxy forwards clients' record batches untouched; it builds its own only for topics it
writes itself (the group-event journal, :mod:`proxy.journal.writer`). The layout is Kafka's
``DefaultRecordBatch``::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2)
    | crc uint32 (CRC-32C of everything after it) | attributes int16 | lastOffsetDelta int32
    | baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
    | baseSequence int32 | recordCount int32 | records

    record: length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
            | keyLength varint | key | valueLength varint | value | headerCount varint
            | (headerKeyLength varint | headerKey | headerValueLength varint | value)*

Varints are zigzag-encoded; a length of -1 is null. Attributes bits 0-2 are the compression
codec of the records section: :class:`Compression` ``NONE`` and ``GZIP`` (the standard
library's zlib) are written and read; batches compressed with snappy, lz4 or zstd raise
:class:`RecordsError` when decoded. CRC-32C is table-driven pure Python, eight bytes per step
(about 3 times kafka-python's own; compression shrinks what it runs over).
``docs/decisions/0011-record-batches.md`` has the measurements behind writing this module
instead of depending on a client library.
"""

from __future__ import annotations

import enum
import struct
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

MAGIC = 2
_HEAD = struct.Struct(">qiib")
"""baseOffset, batchLength, partitionLeaderEpoch, magic."""
_HEAD_LEN = _HEAD.size  # 17
_CRC = struct.Struct(">I")
_AFTER_CRC = struct.Struct(">hiqqqhii")
"""attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
baseSequence, recordCount."""
RECORDS_OFFSET = _HEAD_LEN + 4 + _AFTER_CRC.size  # 61
_LENGTH_OFFSET = 8
_CRC_OFFSET = _HEAD_LEN
_ATTRIBUTES_OFFSET = _HEAD_LEN + 4

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class RecordsError(ValueError):
    """Bytes that are not a readable v2 record batch."""


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()
    offset: int = -1
    """Set when decoded (base offset + offset delta); ignored when encoding."""


@dataclass(frozen=True, slots=True)
class RecordBatch:
    base_offset: int
    partition_leader_epoch: int
    compression: Compression
    log_append_time: bool
    transactional: bool
    control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


# ---------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli), slicing by eight


def _crc_tables() -> list[list[int]]:
    poly = 0x82F63B78
    first = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        first.append(c)
    tables = [first]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[i] >> 8) ^ first[prev[i] & 0xFF] for i in range(256)])
    return tables


_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = _crc_tables()
_LITTLE_ENDIAN = sys.byteorder == "little"


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``crc`` (0 to start)."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7
    crc ^= 0xFFFFFFFF
    view = memoryview(data).cast("B")
    whole = len(view) // 8 * 8
    if whole:
        if _LITTLE_ENDIAN:
            words: Iterator[int] = iter(view[:whole].cast("Q"))
        else:
            words = (w for (w,) in struct.iter_unpack("<Q", view[:whole]))
        for w in words:
            x = crc ^ (w & 0xFFFFFFFF)
            h = w >> 32
            crc = (t7[x & 0xFF] ^ t6[(x >> 8) & 0xFF] ^ t5[(x >> 16) & 0xFF] ^ t4[x >> 24]
                   ^ t3[h & 0xFF] ^ t2[(h >> 8) & 0xFF] ^ t1[(h >> 16) & 0xFF] ^ t0[h >> 24])
    for b in view[whole:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# varints

_SMALL = [bytes([(n << 1) & 0xFF]) for n in range(64)]
"""Zigzag varints of 0..63 (one byte each)."""


def _varint(n: int) -> bytes:
    if 0 <= n < 64:
        return _SMALL[n]
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    z = 0
    while True:
        if pos >= len(buf):
            raise RecordsError("varint runs past the end")
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise RecordsError("varint longer than 10 bytes")
    return (z >> 1) ^ -(z & 1), pos


def _bytes_field(value: bytes | None) -> bytes:
    if value is None:
        return b"\x01"  # -1
    return _varint(len(value)) + value


# ---------------------------------------------------------------------------------------------
# encoding


def encode_records(records: Sequence[Record], base_timestamp: int) -> bytes:
    """The records section of a batch (uncompressed), offset deltas from 0."""
    parts: list[bytes] = []
    append = parts.append
    for delta, record in enumerate(records):
        body = b"".join((
            b"\x00",  # attributes
            _varint(record.timestamp_ms - base_timestamp),
            _varint(delta),
            _bytes_field(record.key),
            _bytes_field(record.value),
            _varint(len(record.headers)),
            *(_bytes_field(k.encode()) + _bytes_field(v) for k, v in record.headers),
        ))
        append(_varint(len(body)))
        append(body)
    return b"".join(parts)


def encode_batch(records: Sequence[Record], *, base_offset: int = 0,
                 compression: Compression = Compression.NONE, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 partition_leader_epoch: int = -1, gzip_level: int = 6) -> bytes:
    """One v2 batch of ``records`` (create-time timestamps, not transactional)."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    if compression not in (Compression.NONE, Compression.GZIP):
        raise ValueError(f"cannot write {compression.name} batches")
    timestamps = [r.timestamp_ms for r in records]
    base_timestamp, max_timestamp = min(timestamps), max(timestamps)
    section = encode_records(records, base_timestamp)
    if compression is Compression.GZIP:
        compressor = zlib.compressobj(gzip_level, zlib.DEFLATED, 31)  # 31: gzip framing
        section = compressor.compress(section) + compressor.flush()
    after_crc = _AFTER_CRC.pack(int(compression), len(records) - 1, base_timestamp,
                                max_timestamp, producer_id, producer_epoch, base_sequence,
                                len(records)) + section
    crc = crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)  # partitionLeaderEpoch, magic, crc, the rest
    return _HEAD.pack(base_offset, length, partition_leader_epoch, MAGIC) + _CRC.pack(crc) \
        + after_crc


# ---------------------------------------------------------------------------------------------
# decoding


def decode_batches(data: bytes | bytearray | memoryview, *, check_crc: bool = True
                   ) -> list[RecordBatch]:
    """Every complete batch in ``data`` (a Fetch response's records); a truncated last batch
    (brokers cut at the fetch size) is left out. RecordsError for anything unreadable."""
    view = memoryview(data).cast("B")
    batches: list[RecordBatch] = []
    pos = 0
    while len(view) - pos >= _HEAD_LEN:
        base_offset, length, leader_epoch, magic = _HEAD.unpack_from(view, pos)
        end = pos + _LENGTH_OFFSET + 4 + length
        if length < RECORDS_OFFSET - _LENGTH_OFFSET - 4:
            raise RecordsError(f"batch at {pos}: length {length} is too small")
        if end > len(view):
            break  # truncated: the rest comes with the next fetch
        if magic != MAGIC:
            raise RecordsError(f"batch at {pos}: magic {magic}, only v2 (magic 2) is read")
        batches.append(_decode_batch(view[pos:end], base_offset, leader_epoch, check_crc))
        pos = end
    return batches


def _decode_batch(batch: memoryview, base_offset: int, leader_epoch: int, check_crc: bool
                  ) -> RecordBatch:
    (crc,) = _CRC.unpack_from(batch, _CRC_OFFSET)
    if check_crc and crc32c(batch[_ATTRIBUTES_OFFSET:]) != crc:
        raise RecordsError(f"batch at offset {base_offset}: CRC mismatch")
    (attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence,
     count) = _AFTER_CRC.unpack_from(batch, _ATTRIBUTES_OFFSET)
    try:
        compression = Compression(attributes & _COMPRESSION_MASK)
    except ValueError as exc:
        raise RecordsError(f"unknown compression codec {attributes & 7}") from exc
    section: memoryview = batch[RECORDS_OFFSET:]
    if compression is Compression.GZIP:
        try:
            section = memoryview(zlib.decompress(section, 47))  # 47: gzip or zlib framing
        except zlib.error as exc:
            raise RecordsError(f"batch at offset {base_offset}: bad gzip data: {exc}") from exc
    elif compression is not Compression.NONE:
        raise RecordsError(f"batch at offset {base_offset} is {compression.name}-compressed; "
                           "only uncompressed and gzip batches are read")
    records = _decode_records(section, count, base_offset, base_ts)
    return RecordBatch(base_offset, leader_epoch, compression,
                       bool(attributes & _TIMESTAMP_TYPE_BIT),
                       bool(attributes & _TRANSACTIONAL_BIT), bool(attributes & _CONTROL_BIT),
                       last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence,
                       records)


def _read_bytes(buf: memoryview, pos: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise RecordsError("a key, value or header runs past the end of its record")
    return bytes(buf[pos:pos + n]), pos + n


def _decode_records(buf: memoryview, count: int, base_offset: int, base_ts: int
                    ) -> tuple[Record, ...]:
    records: list[Record] = []
    pos = 0
    for _ in range(count):
        length, pos = _read_varint(buf, pos)
        end = pos + length
        if length < 0 or end > len(buf):
            raise RecordsError("a record runs past the end of its batch")
        pos += 1  # attributes
        ts_delta, pos = _read_varint(buf, pos)
        offset_delta, pos = _read_varint(buf, pos)
        key, pos = _read_bytes(buf, pos)
        value, pos = _read_bytes(buf, pos)
        n_headers, pos = _read_varint(buf, pos)
        headers = []
        for _ in range(max(n_headers, 0)):
            hkey, pos = _read_bytes(buf, pos)
            hvalue, pos = _read_bytes(buf, pos)
            headers.append(((hkey or b"").decode("utf-8", "replace"), hvalue))
        if pos != end:
            raise RecordsError("a record's fields do not add up to its length")
        records.append(Record(key, value, base_ts + ts_delta, tuple(headers),
                              base_offset + offset_delta))
    if pos != len(buf):
        raise RecordsError("bytes left after the batch's last record")
    return tuple(records)
