"""Regular-expression subscriptions, with RE2 semantics like Kafka.

Kafka compiles ``SubscribedTopicRegex`` with RE2/J and a topic matches when the pattern
matches the *whole* name. Here ``google-re2`` provides the same syntax. Kafka resolves
regexes asynchronously and bumps the group epoch when the resolution lands; this engine
always has the topics image at hand, so it resolves synchronously and bumps the epoch once,
after resolution, in the same step. Internal topics are never matched (Kafka excludes them
from regex resolution).

With an authorizer, Kafka keeps of a resolution only the topics that the member whose
heartbeat triggered it may DESCRIBE (``filterTopicDescribeAuthorizedTopics``; every regex of
the group is resolved under that one member's rights). The engine cannot ask an authorizer:
the proxy passes the member's rights with its heartbeat (:class:`TopicRights`), and the group
resolves its regexes under them (:meth:`translation.group.ConsumerGroup.resolve_regexes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import re2
from cachetools import LRUCache

from translation.errors import ErrorCode, GroupError
from translation.topics import TopicsImage

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

CACHE_PATTERN_BYTES = 256 * 1024
"""The compiled-pattern cache is bounded by the length of the patterns it holds (a compiled
RE2 program takes tens of times its pattern's length), least recently used first out."""

_compiled: LRUCache[str, Any] = LRUCache(maxsize=CACHE_PATTERN_BYTES,
                                         getsizeof=lambda c: len(c.pattern))


@dataclass(frozen=True, slots=True)
class TopicRights:
    """What a member may DESCRIBE, as the proxy found out before its heartbeat: of the topic
    names in ``checked`` (the matches of its group's regexes when it asked), those in
    ``allowed``. A topic outside ``checked`` (created since) keeps what the resolution made of
    it before (a new one is left out) until a member's heartbeat brings rights that checked
    it."""

    checked: frozenset[str]
    allowed: frozenset[str]


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
    if len(pattern) <= CACHE_PATTERN_BYTES:
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
