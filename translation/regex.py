"""Regular-expression subscriptions, with RE2 semantics like Kafka.

Kafka compiles ``SubscribedTopicRegex`` with RE2/J and a topic matches when the pattern
matches the *whole* name. Here ``google-re2`` provides the same syntax. Kafka resolves
regexes asynchronously and bumps the group epoch when the resolution lands; this engine
always has the topics image at hand, so it resolves synchronously and bumps the epoch once,
after resolution, in the same step. Internal topics are never matched (Kafka excludes them
from regex resolution).
"""

from __future__ import annotations

from typing import Any

import re2

from translation.errors import ErrorCode, GroupError
from translation.topics import TopicsImage

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

_compiled: dict[str, Any] = {}
_MAX_CACHED = 4096


def compile_regex(pattern: str) -> Any:
    """Compile ``pattern`` or raise INVALID_REGULAR_EXPRESSION."""
    compiled = _compiled.get(pattern)
    if compiled is not None:
        return compiled
    try:
        compiled = re2.compile(pattern)
    except Exception as exc:
        raise GroupError(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"SubscribedTopicRegex `{pattern}` is not a valid regular expression: {exc}.",
        ) from None
    if len(_compiled) >= _MAX_CACHED:
        _compiled.clear()
    _compiled[pattern] = compiled
    return compiled


def validate_regex(pattern: str) -> None:
    compile_regex(pattern)


def resolve(pattern: str, topics: TopicsImage) -> frozenset[str]:
    """Names of the topics in ``topics`` that ``pattern`` fully matches."""
    compiled = compile_regex(pattern)
    return frozenset(
        name
        for name in topics.by_name
        if name not in INTERNAL_TOPICS and compiled.fullmatch(name) is not None
    )
