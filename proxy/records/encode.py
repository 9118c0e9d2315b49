"""Writing v2 record batches: :func:`encode_batch` for the journal (gzip, per-record timestamps
and headers) and the state log (transactional, one timestamp), and :func:`split` to keep each
batch under a size limit.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from proxy.records.format import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER,
    LOG_OVERHEAD,
    MAGIC,
    TRANSACTIONAL,
    Compression,
    Record,
    crc32c,
)


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL = 1024
_VARINTS = [_zigzag(n) for n in range(_SMALL)]
"""Varints of 0..1023 (one or two bytes): offset deltas and most lengths, looked up inline in
:func:`encode_records`, whose per-record cost is what a state-log write of many records pays."""


def varint(n: int) -> bytes:
    """``n`` as a zigzag varint (as Kafka's ByteUtils)."""
    return _VARINTS[n] if 0 <= n < _SMALL else _zigzag(n)


_NULL = b"\x01"  # zigzag(-1): a null key or value


def _header_fields(headers: tuple[tuple[str, bytes | None], ...]) -> bytes:
    parts = [varint(len(headers))]
    for name, value in headers:
        encoded = name.encode()
        parts += (varint(len(encoded)), encoded,
                  _NULL if value is None else varint(len(value)) + value)
    return b"".join(parts)


def encode_records(records: Sequence[Record], base_timestamp: int) -> bytes:
    """The records section of a batch (uncompressed), offset deltas from 0."""
    small, cached = _VARINTS, _SMALL
    parts: list[bytes] = []
    append = parts.append
    for delta, (key, value, timestamp_ms, headers, _offset) in enumerate(records):
        ts_delta = timestamp_ms - base_timestamp
        if key is None:
            key_field = _NULL
        else:
            n = len(key)
            key_field = (small[n] if n < cached else varint(n)) + key
        if value is None:
            value_field = _NULL
        else:
            n = len(value)
            value_field = (small[n] if n < cached else varint(n)) + value
        body = b"".join((
            b"\x00",  # attributes
            small[ts_delta] if 0 <= ts_delta < cached else varint(ts_delta),
            small[delta] if delta < cached else varint(delta),
            key_field,
            value_field,
            _header_fields(headers) if headers else b"\x00"))
        n = len(body)
        append(small[n] if n < cached else varint(n))
        append(body)
    return b"".join(parts)


def encode_batch(records: Sequence[Record], *, base_offset: int = 0,
                 compression: Compression = Compression.NONE, transactional: bool = False,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 partition_leader_epoch: int = -1, gzip_level: int = 6) -> bytes:
    """One v2 batch of ``records`` (create-time timestamps; offset deltas 0..n-1, each record's
    ``offset`` ignored). A transactional batch needs the producer id and epoch that
    InitProducerId gave; the broker sets the partition leader epoch when it appends."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    if compression not in (Compression.NONE, Compression.GZIP):
        raise ValueError(f"cannot write {compression.name} batches")
    if transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id")
    timestamps = [r.timestamp_ms for r in records]
    base_timestamp, max_timestamp = min(timestamps), max(timestamps)
    section = encode_records(records, base_timestamp)
    if compression is Compression.GZIP:
        compressor = zlib.compressobj(gzip_level, zlib.DEFLATED, 31)  # 31: gzip framing
        section = compressor.compress(section) + compressor.flush()
    attributes = int(compression) | (TRANSACTIONAL if transactional else 0)
    header = HEADER.pack(base_offset, HEADER.size - LOG_OVERHEAD + len(section),
                         partition_leader_epoch, MAGIC, 0, attributes, len(records) - 1,
                         base_timestamp, max_timestamp, producer_id, producer_epoch,
                         base_sequence, len(records))
    crc = crc32c(section, crc32c(header[ATTRIBUTES_OFFSET:]))
    return b"".join((header[:CRC_OFFSET], crc.to_bytes(4, "big"), header[ATTRIBUTES_OFFSET:],
                     section))


RECORD_OVERHEAD = 36
"""The most bytes a record takes beyond its key, value and headers: its length, offset delta
and the two field lengths (varints, 5 bytes each at most), its attributes (1), timestamp delta
(a varlong, 10) and header count (5)."""


def record_size(record: Record) -> int:
    """An upper bound of the bytes ``record`` takes in an uncompressed batch."""
    size = RECORD_OVERHEAD + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += 10 + len(name.encode()) + len(value or b"")
    return size


def max_record_bytes(max_batch_bytes: int) -> int:
    """The most key and value bytes a record without headers may have for the batch holding it
    alone to stay within ``max_batch_bytes`` (a topic's ``max.message.bytes``, which the broker
    compares with the whole batch, its log overhead included)."""
    return max_batch_bytes - HEADER.size - RECORD_OVERHEAD


def split(records: Sequence[Record], max_batch_bytes: int) -> list[Sequence[Record]]:
    """``records`` cut into runs whose uncompressed batches stay under ``max_batch_bytes``, in
    order (a record alone larger than that gets a batch of its own; the broker then judges
    it)."""
    runs: list[Sequence[Record]] = []
    start, size = 0, HEADER.size
    for i, record in enumerate(records):
        n = record_size(record)
        if i > start and size + n > max_batch_bytes:
            runs.append(records[start:i])
            start, size = i, HEADER.size
        size += n
    if start < len(records):
        runs.append(records[start:])
    return runs
