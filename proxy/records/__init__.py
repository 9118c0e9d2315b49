"""Kafka record batches (message format v2, magic 2): writing them for Produce, reading them
from Fetch.

The proxy forwards clients' record batches untouched; it builds and reads its own only for the
topics it keeps itself: the group-event journal (:mod:`proxy.journal.writer`) and the group
state log (:mod:`proxy.state_log.writer`, :mod:`proxy.state_log.loader`).
The layout is Kafka's ``DefaultRecordBatch`` (record batches are not part of Kafka's JSON
message schemas: the ``records`` fields of Produce and Fetch are opaque bytes)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2)
    | crc uint32 (CRC-32C of everything after it) | attributes int16 | lastOffsetDelta int32
    | baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
    | baseSequence int32 | recordCount int32 | records

    record: length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
            | keyLength varint | key | valueLength varint | value | headerCount varint
            | (headerKeyLength varint | headerKey | headerValueLength varint | value)*

Varints are zigzag-encoded; a length of -1 is null. Attributes: bits 0-2 the compression codec
of the records section, 3 the timestamp type, 4 transactional, 5 control. A control batch holds
one record whose key is (version int16, type int16): type 0 aborts, 1 commits a transaction.

The parts: :mod:`~proxy.records.format` (the layout, :class:`Record`, :class:`Compression`,
:class:`RecordsError`, CRC-32C), :mod:`~proxy.records.encode` (:func:`encode_batch`,
:func:`split`, :func:`max_record_bytes`), :mod:`~proxy.records.decode` (:func:`batches` and
the :class:`Batch` view),
:mod:`~proxy.records.committed` (:func:`read_committed`, Kafka's consumer at
``read_committed``). Uncompressed and gzip batches are written and read; snappy, lz4 and zstd
ones raise :class:`RecordsError` when their records are read. Measurements behind writing this
instead of depending on a client library: ``docs/decisions/0011-record-batches.md`` and
``docs/decisions/0013-group-state-log.md``.
"""

from proxy.records.committed import ReadResult, read_committed
from proxy.records.decode import Batch, batches
from proxy.records.encode import (
    encode_batch,
    encode_records,
    max_record_bytes,
    record_size,
    split,
)
from proxy.records.format import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    Compression,
    Record,
    RecordsError,
    crc32c,
)

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "Batch",
    "Compression",
    "ReadResult",
    "Record",
    "RecordsError",
    "batches",
    "crc32c",
    "encode_batch",
    "encode_records",
    "max_record_bytes",
    "read_committed",
    "record_size",
    "split",
]
