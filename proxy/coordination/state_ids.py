"""Where a group's state lives in the state log and the transactional id its writer uses.

Both are pure functions of the group id (and the topic's partition count, the id prefix), so
every sidecar computes them alike:

* :func:`partition_for`: Kafka's default partitioner for a record keyed by the group id's
  UTF-8 bytes (``murmur2(key) & 0x7fffffff % partitions``, ``Utils.murmur2`` in
  kafka-clients), so a keyed producer or ``kafka-console-consumer`` finds the same partition.
* :func:`transactional_id`: ``<prefix>-<group id>`` when that is short and made of
  ``[A-Za-z0-9._-]`` only; otherwise ``<prefix>-<readable part>~<digest>``, the digest being
  the first 32 hex digits of the SHA-256 of the group id. Kafka refuses only an empty
  transactional id (and strings over 32,767 bytes), but the id is the key of the transaction
  coordinator's records, appears in broker logs, ``kafka-transactions.sh`` and ACLs, so it is
  kept printable and at most :data:`MAX_TRANSACTIONAL_ID` characters. ``~`` never occurs in
  the literal form, so a digest form cannot equal another group's literal form, and every id
  starts with ``<prefix>-``: one prefixed ACL (``--resource-pattern-type prefixed``) covers
  them all.
"""

from __future__ import annotations

import hashlib
import re

MAX_TRANSACTIONAL_ID = 200
DIGEST_HEX = 32
_LITERAL = re.compile(r"[A-Za-z0-9._-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as an unsigned 32-bit value."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(group_id: str, partitions: int) -> int:
    """The state log partition of ``group_id`` among ``partitions``."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(group_id.encode("utf-8")) & 0x7FFFFFFF) % partitions


def check_prefix(prefix: str) -> str:
    """``prefix`` if usable for transactional ids, else ValueError."""
    if not _LITERAL.fullmatch(prefix) or len(prefix) > MAX_TRANSACTIONAL_ID // 2:
        raise ValueError(f"transactional id prefix {prefix!r}: 1 to {MAX_TRANSACTIONAL_ID // 2} "
                         "characters of A-Z a-z 0-9 . _ -")
    return prefix


def transactional_id(prefix: str, group_id: str) -> str:
    """The transactional id of the writer of ``group_id``'s state (see the module doc)."""
    check_prefix(prefix)
    literal = f"{prefix}-{group_id}"
    if _LITERAL.fullmatch(group_id) and len(literal) <= MAX_TRANSACTIONAL_ID:
        return literal
    digest = hashlib.sha256(group_id.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]
    room = MAX_TRANSACTIONAL_ID - len(prefix) - 2 - DIGEST_HEX
    readable = _UNSAFE.sub("_", group_id)[:room]
    return f"{prefix}-{readable}~{digest}"
