"""What a member's request may carry, checked before anything is done on its behalf.

The engine's own rules (:func:`translation.heartbeat.validate`) follow Kafka's. These follow
from running in front of a broker: every group id, instance id and topic name a member sends
is carried again in the proxy's own requests (its member in the broker's group, Metadata for
the group's topics), so it must fit them, and what a member may make the proxy hold is
bounded by the configuration (:class:`translation.config.GroupConfig`):

* a group id fits the int16-length strings of the proxy's JoinGroup v5 (32,767 bytes);
* an instance id and each subscribed topic name are legal Kafka names (Kafka's own limits:
  at most 249 characters of ``[a-zA-Z0-9._-]``);
* a subscription names at most ``max_subscription_topics`` topics, and its regex is at most
  ``max_regex_bytes`` long and compiles.

Each check raises :class:`~translation.errors.GroupError` with the code a client expects.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from translation.errors import ErrorCode, GroupError
from translation.regex import validate_regex

MAX_NAME_LENGTH = 249
"""Kafka's longest topic name and group instance id."""
MAX_GROUP_ID_BYTES = 32_767
"""The longest string the proxy's own group requests (int16 lengths) can carry."""
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def check_group_id(group_id: str) -> None:
    size = len(group_id.encode("utf-8", "surrogatepass"))
    if size > MAX_GROUP_ID_BYTES:
        raise GroupError(ErrorCode.INVALID_GROUP_ID,
                         f"GroupId is {size} bytes long; at most {MAX_GROUP_ID_BYTES}.")


def legal_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and _LEGAL_NAME.fullmatch(name) is not None


def check_instance_id(instance_id: str | None) -> None:
    if instance_id is not None and not legal_name(instance_id):
        raise GroupError(ErrorCode.INVALID_REQUEST,
                         f"InstanceId {instance_id[:100]!r} is not a legal name (at most "
                         f"{MAX_NAME_LENGTH} characters of a-z, A-Z, 0-9, '.', '_', '-').")


def check_subscription(names: Sequence[str] | None, regex: str | None, *,
                       max_topics: int, max_regex_bytes: int) -> None:
    if names is not None:
        if len(names) > max_topics:
            raise GroupError(ErrorCode.INVALID_REQUEST,
                             f"SubscribedTopicNames has {len(names)} names; at most "
                             f"{max_topics}.")
        for name in names:
            if not legal_name(name):
                raise GroupError(ErrorCode.INVALID_REQUEST,
                                 f"SubscribedTopicNames has {name[:100]!r}, not a legal topic "
                                 f"name (at most {MAX_NAME_LENGTH} characters of a-z, A-Z, "
                                 "0-9, '.', '_', '-').")
    if regex is not None:
        size = len(regex.encode("utf-8", "surrogatepass"))
        if size > max_regex_bytes:
            raise GroupError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                             f"SubscribedTopicRegex is {size} bytes long; at most "
                             f"{max_regex_bytes}.")
        validate_regex(regex)
