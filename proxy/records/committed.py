"""Reading a partition's records the way Kafka's consumer does at ``read_committed``: data
batches of aborted transactions and control batches are skipped (the group state loader,
:mod:`proxy.state_log.loader`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.records.decode import Entry, batches
from proxy.records.format import CONTROL_ABORT, NO_PRODUCER_ID


@dataclass(slots=True)
class ReadResult:
    records: list[Entry]
    """(offset, key, value) of committed data records, in offset order."""
    next_offset: int | None
    """The offset after the last complete batch (None: the blob held no complete batch)."""


def read_committed(blob: bytes | bytearray | memoryview, aborted: Iterable[tuple[int, int]],
                   *, check_crc: bool = True) -> ReadResult:
    """The committed records of one partition's Fetch records, ``aborted`` being the
    response's (producer id, first offset) of aborted transactions.

    Kafka's consumer rule (``CompletedFetch``): a transaction is aborted for a batch once its
    first offset is at or before the batch's last offset; data batches of an aborted producer
    are skipped until that producer's abort marker; control batches are never data.
    """
    heap = [(first, pid) for pid, first in aborted]
    heapq.heapify(heap)
    aborted_pids: set[int] = set()
    out: list[Entry] = []
    next_offset: int | None = None
    for batch in batches(blob, check_crc=check_crc):
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
        out.extend(batch.entries())
    return ReadResult(out, next_offset)
