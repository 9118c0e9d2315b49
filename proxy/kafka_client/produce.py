"""Produce of record batches the proxy encoded itself, and the answer per partition.

:func:`produce_request` sends one topic's batches (partition -> encoded batch,
:mod:`proxy.records`), transactional or not; :func:`partition_results` reads the answer per
partition. A partition the answer leaves out reads as NETWORK_EXCEPTION (:data:`NOT_ANSWERED`):
not written, worth another try. The journal writes plain batches with its ``acks``; the state
log transactional ones with acks=all. Produce v9 (flexible, before KIP-951's leader hints,
which the proxy's writers do not use), which 3.x and 4.x brokers serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from translation.errors import ErrorCode

PRODUCE_VERSION = 9
NOT_ANSWERED: Mapping[str, Any] = MappingProxyType(
    {"error_code": ErrorCode.NETWORK_EXCEPTION, "error_message": None})
"""The result of a partition the answer does not name."""


def produce_request(topic: str, batches: Mapping[int, bytes], *, acks: int, timeout_ms: int,
                    transactional_id: str | None = None) -> dict[str, Any]:
    """A Produce request for ``batches`` (partition -> record batch) of ``topic``."""
    return {"transactional_id": transactional_id, "acks": acks, "timeout_ms": timeout_ms,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": batch} for partition, batch in batches.items()]}]}


def partition_results(response: dict[str, Any], topic: str) -> dict[int, Mapping[str, Any]]:
    """partition -> its result (``error_code``, ``error_message``...) for ``topic``."""
    return {p["index"]: p for t in response["responses"] if t["name"] == topic
            for p in t["partition_responses"]}
