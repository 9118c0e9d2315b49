"""Reading v2 record batches: :func:`batches` cuts a Fetch response's records into
:class:`Batch` views (the header parsed, the CRC checked); their records are read on demand,
whole (:meth:`Batch.records`: timestamps, headers) or lean (:meth:`Batch.entries`: offset, key
and value, as the state loader reads 100,000s of them).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.records.format import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL,
    HEADER,
    LOG_OVERHEAD,
    MAGIC,
    RECORDS_OFFSET,
    TIMESTAMP_TYPE,
    TRANSACTIONAL,
    Compression,
    Record,
    RecordsError,
    crc32c,
)

_CONTROL_KEY = struct.Struct(">hh")


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` and the position after it; IndexError if it runs past the
    end (the record loops turn that into :class:`RecordsError` once, outside the loop)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    z = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos + 1
        shift += 7
        if shift > 63:
            raise RecordsError("varint longer than 10 bytes")

Entry = tuple[int, bytes | None, bytes | None]
"""(offset, key, value) of one record."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One complete batch of a records blob: its header and its bytes."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
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
    def compression(self) -> Compression:
        try:
            return Compression(self.attributes & COMPRESSION_MASK)
        except ValueError:
            raise RecordsError(f"batch at offset {self.base_offset}: unknown compression "
                               f"codec {self.attributes & COMPRESSION_MASK}") from None

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)

    def crc_ok(self) -> bool:
        return crc32c(self.data[ATTRIBUTES_OFFSET:]) == self.crc

    def control_type(self) -> int | None:
        """CONTROL_ABORT or CONTROL_COMMIT for a control batch, else None."""
        if not self.is_control or self.record_count < 1:
            return None
        _offset, key, _value = self.entries()[0]
        if key is None or len(key) < _CONTROL_KEY.size:
            raise RecordsError(f"batch at offset {self.base_offset}: control record without "
                               "a (version, type) key")
        return int(_CONTROL_KEY.unpack_from(key)[1])

    def entries(self) -> list[Entry]:
        """(offset, key, value) of every record; timestamps and headers are not read."""
        buf = self._section()
        base, end, read = self.base_offset, len(buf), read_varint
        out: list[Entry] = []
        append = out.append
        pos = 0
        try:
            for _ in range(self.record_count):
                length, pos = read(buf, pos)
                stop = pos + length
                if length < 0 or stop > end:
                    raise RecordsError(f"batch at offset {base}: a record runs past its end")
                _ts, pos = read(buf, pos + 1)  # after the attributes
                delta, pos = read(buf, pos)
                n, pos = read(buf, pos)
                if n < 0:
                    key = None
                else:
                    key = buf[pos:pos + n]
                    pos += n
                n, pos = read(buf, pos)
                if pos > stop or n > stop - pos:
                    raise RecordsError(f"batch at offset {base}: a key or value runs past the "
                                       "end of its record")
                append((base + delta, key, None if n < 0 else buf[pos:pos + n]))
                pos = stop  # headers are not read
        except IndexError:
            raise RecordsError(f"batch at offset {base}: a record runs past its end") from None
        return out

    def records(self) -> list[Record]:
        """Every record, whole; RecordsError for a record whose fields do not add up."""
        buf = self._section()
        base, base_ts, end, read = self.base_offset, self.base_timestamp, len(buf), read_varint
        out: list[Record] = []
        pos = 0
        try:
            for _ in range(self.record_count):
                length, pos = read(buf, pos)
                stop = pos + length
                if length < 0 or stop > end:
                    raise RecordsError(f"batch at offset {base}: a record runs past its end")
                ts_delta, pos = read(buf, pos + 1)  # after the attributes
                delta, pos = read(buf, pos)
                key, pos = _field(buf, pos, stop)
                value, pos = _field(buf, pos, stop)
                n_headers, pos = read(buf, pos)
                headers = []
                for _ in range(max(n_headers, 0)):
                    name, pos = _field(buf, pos, stop)
                    header_value, pos = _field(buf, pos, stop)
                    headers.append(((name or b"").decode("utf-8", "replace"), header_value))
                if pos != stop:
                    raise RecordsError(f"batch at offset {base}: a record's fields do not add "
                                       "up to its length")
                out.append(Record(key, value, base_ts + ts_delta, tuple(headers), base + delta))
        except IndexError:
            raise RecordsError(f"batch at offset {base}: a record runs past its end") from None
        if pos != end:
            raise RecordsError(f"batch at offset {base}: bytes left after its last record")
        return out

    def _section(self) -> bytes:
        """The records section, decompressed."""
        compression = self.compression
        section = self.data[RECORDS_OFFSET:]
        if compression is Compression.NONE:
            return bytes(section)
        if compression is Compression.GZIP:
            try:
                return zlib.decompress(section, 47)  # 47: gzip or zlib framing
            except zlib.error as exc:
                raise RecordsError(f"batch at offset {self.base_offset}: bad gzip data: "
                                   f"{exc}") from exc
        name = compression.name.lower()
        raise RecordsError(f"batch at offset {self.base_offset} is {name}-compressed: only "
                           "uncompressed and gzip batches are read (a topic of our own keeps "
                           "what we wrote with compression.type=producer)")


def _field(buf: bytes, pos: int, stop: int) -> tuple[bytes | None, int]:
    """A length-prefixed key, value or header field that must end by ``stop``."""
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > stop:
        raise RecordsError("a key, value or header runs past the end of its record")
    return buf[pos:pos + n], pos + n


def batches(data: bytes | bytearray | memoryview, *, check_crc: bool = True
            ) -> Iterator[Batch]:
    """The complete batches of ``data`` (a Fetch response's records for one partition); a
    truncated last batch (brokers cut at the fetch size) is left out. RecordsError for a batch
    that is not v2, has a malformed header or (``check_crc``) a CRC that does not match."""
    view = memoryview(data).cast("B")
    pos, end = 0, len(view)
    while end - pos >= RECORDS_OFFSET:
        (base_offset, length, leader_epoch, magic, crc, attributes, last_delta, base_ts,
         max_ts, producer_id, producer_epoch, base_sequence, count) = HEADER.unpack_from(view,
                                                                                          pos)
        stop = pos + LOG_OVERHEAD + length
        if stop > end:
            return  # truncated: the rest comes with the next fetch
        if magic != MAGIC:
            raise RecordsError(f"batch at offset {base_offset}: magic {magic}, only v2 "
                               "(magic 2) is read")
        if length < RECORDS_OFFSET - LOG_OVERHEAD or count < 0:
            raise RecordsError(f"batch at offset {base_offset}: malformed header")
        batch = Batch(base_offset, leader_epoch, attributes, last_delta, base_ts, max_ts,
                      producer_id, producer_epoch, base_sequence, count, crc, view[pos:stop])
        if check_crc and not batch.crc_ok():
            raise RecordsError(f"batch at offset {base_offset}: CRC mismatch")
        yield batch
        pos = stop
