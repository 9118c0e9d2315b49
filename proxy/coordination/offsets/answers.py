"""What the offsets handlers answer and log: failed commits, partition errors, debug lines.

Shared by the handlers (:mod:`.handlers`), the bridged members' checks (:mod:`.bridged`), the
stale-retry guard (:mod:`.retries`) and commit tickets (:mod:`.ticketed`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from proxy.coordination.handler import GroupRequest, Value

log = logging.getLogger("groupgate.offsets")


def topic_key(topic: dict[str, Any]) -> dict[str, Any]:
    """The fields naming a request topic (its name, or its id from v10 on)."""
    out: dict[str, Any] = {}
    if "name" in topic:
        out["name"] = topic["name"]
    if "topic_id" in topic:
        out["topic_id"] = topic["topic_id"]
    return out


def commit_error(value: Value, error: int) -> Value:
    """An OffsetCommit / TxnOffsetCommit response failing every partition with ``error``."""
    return {"throttle_time_ms": 0, "topics": [
        dict(topic_key(t), partitions=[{"partition_index": p["partition_index"],
                                        "error_code": error} for p in t["partitions"]])
        for t in value["topics"]]}


def offsets_text(topics: Iterable[dict[str, Any]], field: str = "committed_offset") -> str:
    """``topic[partition]=offset,...`` of a request's or response's topics, for debug lines."""
    return ",".join(f"{t.get('name') or t.get('topic_id')}[{p['partition_index']}]="
                    f"{p.get(field)}{'!' + str(p['error_code']) if p.get('error_code') else ''}"
                    for t in topics for p in t.get("partitions", ()))


def trace(what: str, request: GroupRequest, **facts: object) -> None:
    """One debug line about an offset request: where it came from and what it carries."""
    if log.isEnabledFor(logging.DEBUG):
        value = request.value
        log.debug("%s: api key %d v%d corr %d from %s node %s group %s member %s epoch %s %s",
                  what, request.api_key, request.version, request.correlation_id,
                  request.client_host, request.node_id, value.get("group_id"),
                  value.get("member_id"), value.get("generation_id_or_member_epoch"),
                  " ".join(f"{k}={v}" for k, v in facts.items()))


def partition_errors(response: Value) -> set[int]:
    return {p["error_code"] for t in response["topics"] for p in t["partitions"]}
