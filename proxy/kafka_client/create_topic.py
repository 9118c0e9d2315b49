"""CreateTopics for one topic, as the state log and the journal create theirs.

:func:`create_topic_request` asks for one topic with its partition count, replication factor
(-1 for either: the cluster's default) and topic configs (sent sorted by name);
:func:`create_topic_error` reads the answer's error code and message. Retrying, and what an
error means, is the caller's: the state log checks the created topic and refuses one it cannot
use, the journal takes what the cluster gives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from translation.errors import ErrorCode

CREATE_TOPICS_VERSION = 7


def create_topic_request(name: str, *, partitions: int, replication_factor: int,
                         configs: Mapping[str, str], timeout_ms: int) -> dict[str, Any]:
    """A CreateTopics request for topic ``name`` alone (not validate-only)."""
    return {"topics": [{"name": name, "num_partitions": partitions,
                        "replication_factor": replication_factor, "assignments": [],
                        "configs": [{"name": k, "value": v} for k, v in sorted(configs.items())]}],
            "timeout_ms": timeout_ms, "validate_only": False}


def create_topic_error(response: dict[str, Any]) -> tuple[int, str]:
    """(error code, error message or "") of the one topic of a CreateTopics response."""
    if not response["topics"]:
        return ErrorCode.UNKNOWN_SERVER_ERROR, "no topic in the CreateTopics response"
    (result, *_) = response["topics"]
    return result["error_code"], result.get("error_message") or ""
