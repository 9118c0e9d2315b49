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
  ``max_regex_bytes`` long and compiles;
* with a state log, a member's member record (:mod:`translation.records`: its subscription,
  regex, client id and host, rack, and for a classic member its protocol names and
  subscription userData) fits ``max_state_record_bytes`` (:func:`check_member_record`).

Each check raises :class:`~translation.errors.GroupError` with the code a client expects.

Why a member record that would not fit is refused, and how. The state log cannot write a record
larger than its topic's ``max.message.bytes``; a member admitted with one would make every
write of its group fail, and each failed write gives the whole group up (every member is
answered NOT_COORDINATOR, the group is taken over again, and the member rejoins and fails it
again). So the record is sized before the member joins and before a member's change (a new
subscription, new userData) is applied, in both protocols, and a refusal changes nothing: the
other members, and the refused member's own earlier state when it is a member already, stay as
they were. Kafka's own coordinator has the same limit (its records go to
``__consumer_offsets``) and answers such a request UNKNOWN_SERVER_ERROR after the append
fails; here the request is refused up front with INVALID_REQUEST
(:class:`~translation.errors.StateRecordTooLarge`), the code Kafka and this module give for a
subscription the coordinator does not accept (too many names, an illegal name):

* ConsumerGroupHeartbeat: INVALID_REQUEST with an ErrorMessage naming the record's size and the
  limit. The Java consumer and librdkafka treat it as fatal for the consumer (the application
  sees the error and the message); no retry could succeed.
* JoinGroup (which has no ErrorMessage on the wire): INVALID_REQUEST too. The Java consumer
  raises it from ``poll()`` (a KafkaException, "Unexpected error in join group response"), as it
  does for every error it has no case for, and joins again on the next ``poll()``; librdkafka
  hands the application a consumer error ("JoinGroup failed: Broker: Invalid request") and
  joins again after its join interval; kafka-python raises it from ``poll()``. Either way the
  application hears of it and the client does not spin. The alternatives are worse: a
  retriable code (COORDINATOR_NOT_AVAILABLE, REBALANCE_IN_PROGRESS) has the client retry
  silently for ever; UNKNOWN_SERVER_ERROR (Kafka's) behaves the same in the clients but blames
  the server; GROUP_MAX_SIZE_REACHED and INCONSISTENT_GROUP_PROTOCOL name a cause that is not
  this one and send operators after the wrong setting; MESSAGE_TOO_LARGE is a produce error no
  client expects from JoinGroup.

A classic JoinGroup for a group the engine does not serve yet is not refused but passed to the
broker (:mod:`translation.classic.routing`), like any join the engine would refuse.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from translation.config import GroupConfig
from translation.effects import Effect, MemberTooLarge
from translation.errors import ErrorCode, GroupError, StateRecordTooLarge
from translation.records import MemberValue, RecordKey, RecordKind, encode_key, encode_value
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


def check_member_record(config: GroupConfig, group_id: str, member_id: str,
                        value: MemberValue, *, api: str, effects: list[Effect]) -> None:
    """Refuse a member whose member record would be ``value`` when it is larger than
    ``config.max_state_record_bytes`` (see the module docstring): a
    :class:`~translation.effects.MemberTooLarge` effect (``api``: which request was refused,
    for the driver's metric) and :class:`~translation.errors.StateRecordTooLarge`."""
    limit = config.max_state_record_bytes
    if limit is None:
        return
    # as record_bytes measures it; an empty member id (a join checked before the engine gives
    # it one) is measured as is: the engine checks again with the id it gives
    key = encode_key(RecordKey(RecordKind.MEMBER, group_id, member_id))
    size = len(key) + len(encode_value(value) or b"")
    if size <= limit:
        return
    names = len(value.subscribed_topic_names)
    user_data = value.classic.user_data if value.classic is not None else None
    what = f"{names} subscribed topic names" + (
        f", {len(user_data)} bytes of userData" if user_data else "")
    effects.append(MemberTooLarge(group_id, member_id, api, size, limit))
    raise StateRecordTooLarge(size, limit, what)
