"""Kafka record batches (magic 2) as the group state log writes and reads them.

Record batches are not part of Kafka's JSON message schemas (the ``records`` fields of Produce
and Fetch are opaque bytes), so this module builds and parses them, following Kafka's
``DefaultRecordBatch``/``DefaultRecord``::

    base offset i64 | length i32 | partition leader epoch i32 | magic i8 (2) | crc u32
    | attributes i16 | last offset delta i32 | first timestamp i64 | max timestamp i64
    | producer id i64 | producer epoch i16 | base sequence i32 | record count i32 | records

    record: length varint | attributes i8 | timestamp delta varlong | offset delta varint
            | key length varint, key | value length varint (-1: null), value | header count

The CRC-32C covers everything from the attributes to the end of the batch. Attributes: bits
0-2 compression, 3 timestamp type, 4 transactional, 5 control. A control batch holds one
record whose key is (version i16, type i16): type 0 aborts, 1 commits a transaction.

:func:`encode_batch` writes one uncompressed transactional batch; :func:`read_committed`
reads a Fetch response's records the way Kafka's consumer does at ``read_committed``: data
batches of aborted transactions (the response's ``aborted_transactions``) and control batches
are skipped. Compressed batches are read when gzip-compressed (other codecs raise
:class:`BatchError`: the state log's topic keeps what its producer wrote,
``compression.type=producer``). Why this is not kafka-python's batch code:
``docs/decisions/0013-group-state-log.md``.
"""

from __future__ import annotations

import heapq
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import google_crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
"""The batch header through the record count (61 bytes)."""
LOG_OVERHEAD = 12
"""Base offset and length: the bytes before what the length counts."""
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAGIC = 2

COMPRESSION_MASK = 0x07
GZIP = 1
TRANSACTIONAL = 0x10
CONTROL = 0x20
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
NO_PRODUCER_ID = -1

_COMPRESSION_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_CONTROL_KEY = struct.Struct(">hh")

Record = tuple[bytes, bytes | None]
"""(key, value); a None value is a tombstone."""


class BatchError(ValueError):
    """Bytes that are not a well-formed record batch (or use a codec this reader lacks)."""


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(google_crc32c.value(bytes(data)))


# -- varints (zigzag, as Kafka's ByteUtils) ---------------------------------------------------

def _varint(value: int, out: bytearray) -> None:
    v = (value << 1) ^ (value >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    v = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v >> 1) ^ -(v & 1), pos
        shift += 7
        if shift > 63:
            raise BatchError("varint longer than 10 bytes")


# -- writing ----------------------------------------------------------------------------------

def encode_batch(records: Sequence[Record], *, producer_id: int, producer_epoch: int,
                 base_sequence: int, timestamp_ms: int, transactional: bool = True) -> bytes:
    """One uncompressed batch of ``records`` (offset deltas 0..n-1, one timestamp)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    body = bytearray()
    record = bytearray()
    for delta, (key, value) in enumerate(records):
        record.clear()
        record.append(0)  # attributes
        record.append(0)  # timestamp delta 0 (zigzag 0)
        _varint(delta, record)
        _varint(len(key), record)
        record += key
        if value is None:
            record.append(1)  # zigzag(-1)
        else:
            _varint(len(value), record)
            record += value
        record.append(0)  # no headers
        _varint(len(record), body)
        body += record
    attributes = TRANSACTIONAL if transactional else 0
    header = bytearray(HEADER.pack(
        0, HEADER.size - LOG_OVERHEAD + len(body), 0, MAGIC, 0, attributes, len(records) - 1,
        timestamp_ms, timestamp_ms, producer_id, producer_epoch, base_sequence, len(records)))
    crc = google_crc32c.extend(google_crc32c.value(bytes(header[ATTRIBUTES_OFFSET:])),
                               bytes(body))
    struct.pack_into(">I", header, CRC_OFFSET, crc)
    return bytes(header + body)


def record_size(key: bytes, value: bytes | None) -> int:
    """An upper bound of the bytes one record takes in a batch (for splitting)."""
    return 25 + len(key) + (len(value) if value is not None else 0)


def split(records: Sequence[Record], max_batch_bytes: int) -> list[Sequence[Record]]:
    """``records`` cut into runs whose batches stay under ``max_batch_bytes`` (a record alone
    larger than that gets a batch of its own; the broker then judges it)."""
    runs: list[Sequence[Record]] = []
    start, size = 0, HEADER.size
    for i, (key, value) in enumerate(records):
        n = record_size(key, value)
        if i > start and size + n > max_batch_bytes:
            runs.append(records[start:i])
            start, size = i, HEADER.size
        size += n
    if start < len(records):
        runs.append(records[start:])
    return runs


# -- reading ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Batch:
    """One complete batch of a records blob: its header and where its records are."""

    base_offset: int
    last_offset_delta: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    crc: int
    data: memoryview
    """The whole batch, from its base offset."""

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    def crc_ok(self) -> bool:
        return crc32c(self.data[ATTRIBUTES_OFFSET:]) == self.crc

    def control_type(self) -> int | None:
        """CONTROL_ABORT or CONTROL_COMMIT for a control batch, else None."""
        if not self.is_control or self.record_count < 1:
            return None
        for key, _value, _delta in self._records():
            if key is None or len(key) < _CONTROL_KEY.size:
                raise BatchError("control record without a (version, type) key")
            return int(_CONTROL_KEY.unpack_from(key)[1])
        return None

    def records(self) -> Iterator[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of every record."""
        base = self.base_offset
        for key, value, delta in self._records():
            yield base + delta, key, value

    def _records(self) -> Iterator[tuple[bytes | None, bytes | None, int]]:
        buf: bytes | memoryview = self.data[HEADER.size:]
        if self.compression:
            buf = _decompress(self.compression, buf)
        pos = 0
        end = len(buf)
        read = _read_varint
        try:
            for _ in range(self.record_count):
                length, pos = read(buf, pos)
                stop = pos + length
                if length < 0 or stop > end:
                    raise BatchError("record length outside its batch")
                pos += 1  # attributes
                _ts, pos = read(buf, pos)
                delta, pos = read(buf, pos)
                n, pos = read(buf, pos)
                key = None if n < 0 else bytes(buf[pos:pos + n])
                pos += max(n, 0)
                n, pos = read(buf, pos)
                value = None if n < 0 else bytes(buf[pos:pos + n])
                pos = stop  # headers are not read
                yield key, value, delta
        except IndexError as exc:
            raise BatchError("record runs past its batch") from exc


def _decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == GZIP:
        try:
            return zlib.decompress(data, wbits=31)
        except zlib.error as exc:
            raise BatchError(f"corrupt gzip batch: {exc}") from exc
    name = _COMPRESSION_NAMES.get(codec, str(codec))
    raise BatchError(f"{name}-compressed batch: set compression.type=producer on the topic")


def batches(blob: bytes | memoryview) -> Iterator[Batch]:
    """The complete batches of a Fetch response's records; a truncated last one (the broker
    cuts at the fetch size) is left out."""
    view = memoryview(blob)
    pos, end = 0, len(view)
    while end - pos >= HEADER.size:
        (base_offset, length, _epoch, magic, crc, attributes, last_delta, _ft, _mt, producer_id,
         producer_epoch, base_sequence, count) = HEADER.unpack_from(view, pos)
        stop = pos + LOG_OVERHEAD + length
        if stop > end:
            return
        if magic != MAGIC:
            raise BatchError(f"record batch of magic {magic} at offset {base_offset}")
        if length < HEADER.size - LOG_OVERHEAD or count < 0:
            raise BatchError(f"malformed batch header at offset {base_offset}")
        yield Batch(base_offset, last_delta, attributes, producer_id, producer_epoch,
                    base_sequence, count, crc, view[pos:stop])
        pos = stop


@dataclass(slots=True)
class ReadResult:
    records: list[tuple[int, bytes | None, bytes | None]]
    """(offset, key, value) of committed data records, in offset order."""
    next_offset: int | None
    """The offset after the last complete batch (None: the blob held no complete batch)."""


def read_committed(blob: bytes | memoryview, aborted: Iterable[tuple[int, int]], *,
                   check_crc: bool = True) -> ReadResult:
    """The committed records of one partition's Fetch records, ``aborted`` being the
    response's (producer id, first offset) of aborted transactions.

    Kafka's consumer rule (``CompletedFetch``): a transaction is aborted for a batch once its
    first offset is at or before the batch's last offset; data batches of an aborted producer
    are skipped until that producer's abort marker; control batches are never data.
    """
    heap = sorted((first, pid) for pid, first in aborted)
    heapq.heapify(heap)
    aborted_pids: set[int] = set()
    out: list[tuple[int, bytes | None, bytes | None]] = []
    next_offset: int | None = None
    for batch in batches(blob):
        if check_crc and not batch.crc_ok():
            raise BatchError(f"CRC mismatch in the batch at offset {batch.base_offset}")
        next_offset = batch.next_offset
        if batch.producer_id != NO_PRODUCER_ID:
            while heap and heap[0][0] <= batch.last_offset:
                aborted_pids.add(heapq.heappop(heap)[1])
            if batch.is_control:
                if batch.control_type() == CONTROL_ABORT:
                    aborted_pids.discard(batch.producer_id)
                continue
            if batch.is_transactional and batch.producer_id in aborted_pids:
                continue
        if batch.is_control:
            continue
        out.extend(batch.records())
    return ReadResult(out, next_offset)
