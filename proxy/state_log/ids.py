"""Where a group's state lives in the state log and the transactional id its writer uses.

Both are pure functions of the group id (and the topic's partition count, the id prefix), so
every sidecar computes them alike:

* :func:`partition_for`: Kafka's default partitioner for a record keyed by the group id's
  UTF-8 bytes (:mod:`proxy.kafka_client.partitioner`), so a keyed producer or
  ``kafka-console-consumer`` finds the same partition.
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

from proxy.kafka_client.partitioner import partition_for as key_partition

MAX_TRANSACTIONAL_ID = 200
DIGEST_HEX = 32
_LITERAL = re.compile(r"[A-Za-z0-9._-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def partition_for(group_id: str, partitions: int) -> int:
    """The state log partition of ``group_id`` among ``partitions``."""
    return key_partition(group_id.encode("utf-8"), partitions)


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
