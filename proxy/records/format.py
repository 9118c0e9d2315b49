"""The v2 record batch layout (see :mod:`proxy.records`), the record type, CRC-32C and varints:
what :mod:`~proxy.records.encode` and :mod:`~proxy.records.decode` share.

CRC-32C is google-crc32c's C implementation (hardware CRC instructions where the CPU has
them); measurements in ``docs/decisions/0011-record-batches.md``.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import google_crc32c

MAGIC = 2
HEADER = struct.Struct(">qiibIhiqqqhii")
"""baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount."""
RECORDS_OFFSET = HEADER.size  # 61
LOG_OVERHEAD = 12
"""Base offset and length: the bytes before what the length counts."""
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
"""The CRC covers the batch from here to its end."""

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
NO_PRODUCER_ID = -1


class Compression(enum.IntEnum):
    """Attributes bits 0-2; the names lowercased are Kafka's ``compression.type`` values."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class RecordsError(ValueError):
    """Bytes that are not a readable v2 record batch, or one compressed with a codec that is
    not read here."""


class Record(NamedTuple):
    """One record. A named tuple rather than a dataclass: the state log builds and reads
    100,000s of them, and a tuple is about three times cheaper to make."""

    key: bytes | None
    value: bytes | None
    """None: a tombstone."""
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()
    offset: int = -1
    """Set when decoded (base offset + offset delta); ignored when encoding."""


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc`` (0 to start)."""
    return int(google_crc32c.extend(crc, data if type(data) is bytes else bytes(data)))
