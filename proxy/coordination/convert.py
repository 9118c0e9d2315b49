"""Decoded group API messages <-> the engine's dataclasses (sans-I/O), for both protocols.

The codec (:mod:`proxy.codec.messages`) decodes a request body into a dict keyed by Kafka's
field names in snake_case; the engine (:mod:`translation`) takes and returns dataclasses with
the same names. This module maps one onto the other and nothing else: no I/O, no state, so it
is tested without a network. The proxy calls, per request the engine serves::

    body, _ = decode_request(ApiKey.JOIN_GROUP, v, buf)
    request = join_group_request(body, v, client_id=..., client_host=...)
    response, effects = classic.join_group(request, now_ms)   # or a HeldRequest, answered later
    encode_response(ApiKey.JOIN_GROUP, v, join_group_response(response, v))

One convention for every request: :class:`Fields` reads a decoded value *at its version*,
from the schema: a field the version does not carry reads as the schema's default whatever
the dict holds (so a hand-built dict carrying it changes nothing), and a missing key or a value
of the wrong type raises :class:`ShapeError` (dicts from the codec always have the shape).
Responses are built with every field; the codec writes those the client's version carries.
What remains version-dependent here is behaviour, not layout: JoinGroup's ``protocol_name`` is
"" rather than null before v7 and null rather than "" from v7 (Kafka's ``JoinGroupResponse``);
LeaveGroup v0-v2 names one member, whose error is the top-level one.

Embedded consumer protocol:

* each JoinGroup protocol's metadata is parsed as ``ConsumerProtocolSubscription`` by
  :func:`parse_subscription`. Bytes that do not parse (too short, negative version, truncated
  or oversized fields, a null where none is allowed) give ``subscription=None``, the engine's
  "malformed" representation: routing then leaves the join to the broker, and a group the
  engine already serves answers INCONSISTENT_GROUP_PROTOCOL. Like Kafka's ``ConsumerProtocol``,
  versions above 3 are read as version 3 (newer versions only append fields) and trailing
  bytes are ignored. Metadata of a protocol type other than ``consumer`` is not parsed (its
  protocols carry ``None``): the engine never serves those groups;
* the SyncGroup assignment is encoded as ``ConsumerProtocolAssignment`` at
  ``assignment.version`` (the version of the member's own subscription, clamped to 0-3 as
  Kafka's ``ConsumerProtocol.serializeAssignment`` does), with null userData: the engine never
  produces assignment userData. With an error the assignment is empty bytes, as Kafka sends.

Every classic member of an engine group is a follower: JoinGroup answers carry no leader and
no member list (``skip_assignment`` false), and SyncGroup's ``assignments`` are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.messages import decode_data, encode_data, schema, supported_versions
from proxy.codec.schema import FieldSchema, StructSchema
from translation.classic.messages import (
    CONSUMER_PROTOCOL_TYPE,
    ClassicAssignment,
    ClassicProtocol,
    ClassicSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeavingMember,
    SyncGroupRequest,
    SyncGroupResponse,
)
from translation.describe import DescribedGroup, DescribedTopicPartitions
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.regex import TopicRights

SUBSCRIPTION_SCHEMA = "ConsumerProtocolSubscription"
ASSIGNMENT_SCHEMA = "ConsumerProtocolAssignment"
MAX_CONSUMER_PROTOCOL_VERSION = 3
"""Newest ``ConsumerProtocolSubscription``/``ConsumerProtocolAssignment`` version known."""

Partitions = tuple[tuple[str, tuple[int, ...]], ...]


class ShapeError(ValueError):
    """A request dict without the shape its schema gives, or an unsupported API version."""


# ---- reading a decoded value at its version ------------------------------------------------


class Fields:
    """A decoded message (or one struct in it) read at ``version``, checked against its schema
    (see the module docstring)."""

    __slots__ = ("_fields", "_value", "_version", "_where")

    def __init__(self, value: object, struct: StructSchema, version: int, where: str) -> None:
        if not isinstance(value, Mapping):
            raise ShapeError(f"{where}: expected a dict, got {type(value).__name__}")
        self._value: Mapping[str, Any] = value
        self._fields: dict[str, FieldSchema] = {f.key: f for f in struct.fields}
        self._version = version
        self._where = where

    @classmethod
    def request(cls, api_key: ApiKey, version: int, value: object) -> Fields:
        """A request body of ``api_key`` at ``version`` (which the codec must support)."""
        check_version(api_key, version)
        return cls(value, schema(api_key).struct, version, f"{_name(api_key)} request")

    @property
    def version(self) -> int:
        return self._version

    def raw(self, key: str) -> Any:
        """The field's value; its schema default when the version does not carry it."""
        field = self._fields[key]  # a KeyError here is a bug in this module, not bad input
        if self._version not in field.versions:
            return field.default(self._version)
        try:
            return self._value[key]
        except KeyError:
            raise ShapeError(f"{self._where}: missing {key!r}") from None

    def string(self, key: str) -> str:
        x = self.raw(key)
        if not isinstance(x, str):
            raise ShapeError(f"{self._where}: {key!r} is not a string: {x!r}")
        return x

    def opt_string(self, key: str) -> str | None:
        x = self.raw(key)
        if x is not None and not isinstance(x, str):
            raise ShapeError(f"{self._where}: {key!r} is not a string or null: {x!r}")
        return x

    def integer(self, key: str) -> int:
        x = self.raw(key)
        if isinstance(x, bool) or not isinstance(x, int):
            raise ShapeError(f"{self._where}: {key!r} is not an integer: {x!r}")
        return x

    def opt_list(self, key: str) -> Sequence[Any] | None:
        x = self.raw(key)
        if x is not None and not isinstance(x, list | tuple):
            raise ShapeError(f"{self._where}: {key!r}: expected a list, got {type(x).__name__}")
        return x

    def structs(self, key: str) -> list[Fields]:
        """An array of structs, each read at the same version."""
        items = self.opt_list(key)
        struct = self._fields[key].struct
        assert struct is not None, key
        return [Fields(item, struct, self._version, f"{key}[{i}]")
                for i, item in enumerate(items or ())]


def check_version(api_key: ApiKey, version: object) -> None:
    """ShapeError unless the codec reads and writes ``api_key`` at ``version``."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise ShapeError(f"{_name(api_key)}: api version {version!r} is not an integer")
    lo, hi = supported_versions(api_key)
    if not lo <= version <= hi:
        raise ShapeError(f"{_name(api_key)} v{version} is not supported (valid {lo}-{hi})")


def _name(api_key: ApiKey) -> str:
    return api_key.name.title().replace("_", "")


# ---- embedded consumer protocol --------------------------------------------------------------


def parse_subscription(metadata: bytes | bytearray | memoryview) -> ClassicSubscription | None:
    """``ConsumerProtocolSubscription`` bytes as the engine's subscription; None if malformed.

    Never raises: anything that is not a well-formed subscription (including a value that is
    not a bytes-like buffer) is None. ``version`` is the version the fields were read at: the
    wire version, or 3 for newer versions.
    """
    try:
        wire_version, value = decode_data(SUBSCRIPTION_SCHEMA, _contiguous(metadata))
    except (CodecError, TypeError, ValueError, BufferError):
        return None
    user_data = value["user_data"]
    return ClassicSubscription(
        version=min(wire_version, MAX_CONSUMER_PROTOCOL_VERSION),
        topics=tuple(value["topics"]),
        user_data=None if user_data is None else bytes(user_data),
        owned_partitions=_partitions(value["owned_partitions"]),
        generation_id=value["generation_id"],
        rack_id=value["rack_id"],
    )


def classic_protocols(protocol_type: str, protocols: Sequence[Fields | Mapping[str, Any]]
                      ) -> tuple[ClassicProtocol, ...]:
    """JoinGroup protocols (``{"name", "metadata"}``) with their parsed subscriptions, in the
    order the client sent them (its preference). Subscriptions are parsed only for the
    ``consumer`` protocol type; other types' protocols carry None."""
    consumer = protocol_type == CONSUMER_PROTOCOL_TYPE
    out: list[ClassicProtocol] = []
    for i, item in enumerate(protocols):
        p = item if isinstance(item, Fields) else Fields(item, _protocol_struct(), 0,
                                                          f"protocols[{i}]")
        metadata = p.raw("metadata")
        out.append(ClassicProtocol(p.string("name"),
                                   parse_subscription(metadata) if consumer else None))
    return tuple(out)


def _protocol_struct() -> StructSchema:
    """JoinGroup's protocol entry (name and metadata, the same at every version)."""
    field = next(f for f in schema(ApiKey.JOIN_GROUP).struct.fields if f.key == "protocols")
    assert field.struct is not None
    return field.struct


def encode_assignment(assignment: ClassicAssignment) -> bytes:
    """The engine's assignment as ``ConsumerProtocolAssignment`` bytes, without userData.

    Encoded at ``assignment.version`` clamped to 0-3 (Kafka's ``checkAssignmentVersion``).
    """
    version = max(0, min(assignment.version, MAX_CONSUMER_PROTOCOL_VERSION))
    return encode_data(ASSIGNMENT_SCHEMA, version, {
        "assigned_partitions": [{"topic": topic, "partitions": list(partitions)}
                                for topic, partitions in assignment.partitions],
        "user_data": None,
    })


def parse_assignment(data: bytes | bytearray | memoryview
                     ) -> tuple[ClassicAssignment, bytes | None]:
    """``ConsumerProtocolAssignment`` bytes as ``(assignment, userData)``.

    For reading assignments the broker handed out (a classic group being converted). Raises
    :class:`ShapeError` when the bytes do not parse; empty bytes (a member that never synced)
    are the caller's to treat as "no assignment" before calling this.
    """
    try:
        wire_version, value = decode_data(ASSIGNMENT_SCHEMA, _contiguous(data))
    except (CodecError, TypeError, ValueError, BufferError) as err:
        raise ShapeError(f"malformed {ASSIGNMENT_SCHEMA}: {err}") from err
    user_data = value["user_data"]
    assignment = ClassicAssignment(min(wire_version, MAX_CONSUMER_PROTOCOL_VERSION),
                                   _partitions(value["assigned_partitions"]))
    return assignment, None if user_data is None else bytes(user_data)


def _contiguous(data: object) -> object:
    """A strided memoryview copied into bytes (the codec reads contiguous buffers only)."""
    if isinstance(data, memoryview) and not data.c_contiguous:
        return data.tobytes()
    return data


def _partitions(items: Sequence[Mapping[str, Any]]) -> Partitions:
    return tuple((tp["topic"], tuple(tp["partitions"])) for tp in items)


# ---- requests: wire dict -> engine -----------------------------------------------------------


def join_group_request(value: Mapping[str, Any], api_version: int, *,
                       client_id: str | None = "", client_host: str = "") -> JoinGroupRequest:
    """The engine's request for a decoded JoinGroup request body."""
    v = Fields.request(ApiKey.JOIN_GROUP, api_version, value)
    protocol_type = v.string("protocol_type")
    return JoinGroupRequest(
        group_id=v.string("group_id"),
        member_id=v.string("member_id"),
        protocol_type=protocol_type,
        protocols=classic_protocols(protocol_type, v.structs("protocols")),
        session_timeout_ms=v.integer("session_timeout_ms"),
        rebalance_timeout_ms=v.integer("rebalance_timeout_ms"),  # v0: -1, the session timeout
        group_instance_id=v.opt_string("group_instance_id"),
        reason=v.opt_string("reason"),
        api_version=api_version,
        client_id=client_id or "",
        client_host=client_host,
    )


def sync_group_request(value: Mapping[str, Any], api_version: int) -> SyncGroupRequest:
    """The engine's request for a decoded SyncGroup request body."""
    v = Fields.request(ApiKey.SYNC_GROUP, api_version, value)
    return SyncGroupRequest(
        group_id=v.string("group_id"),
        member_id=v.string("member_id"),
        generation_id=v.integer("generation_id"),
        group_instance_id=v.opt_string("group_instance_id"),
        protocol_type=v.opt_string("protocol_type"),
        protocol_name=v.opt_string("protocol_name"),
        api_version=api_version,
    )


def heartbeat_request(value: Mapping[str, Any], api_version: int) -> HeartbeatRequest:
    """The engine's request for a decoded Heartbeat request body."""
    v = Fields.request(ApiKey.HEARTBEAT, api_version, value)
    return HeartbeatRequest(
        group_id=v.string("group_id"),
        member_id=v.string("member_id"),
        generation_id=v.integer("generation_id"),
        group_instance_id=v.opt_string("group_instance_id"),
        api_version=api_version,
    )


def leave_group_request(value: Mapping[str, Any], api_version: int) -> LeaveGroupRequest:
    """The engine's request for a decoded LeaveGroup request body: v0-v2 name one member by
    ``member_id``; v3+ list ``members`` (possibly none: the engine answers an empty batch with
    no member responses)."""
    v = Fields.request(ApiKey.LEAVE_GROUP, api_version, value)
    group_id = v.string("group_id")
    if api_version < 3:
        return LeaveGroupRequest(group_id, (LeavingMember(v.string("member_id")),),
                                 api_version=api_version)
    members = tuple(
        LeavingMember(member_id=m.string("member_id"),
                      group_instance_id=m.opt_string("group_instance_id"),
                      reason=m.opt_string("reason"))
        for m in v.structs("members"))
    return LeaveGroupRequest(group_id, members, api_version=api_version)


def consumer_group_heartbeat_request(value: Mapping[str, Any], api_version: int, *,
                                     client_id: str | None, client_host: str,
                                     topic_rights: TopicRights | None = None
                                     ) -> ConsumerGroupHeartbeatRequest:
    """The engine's request for a decoded ConsumerGroupHeartbeat request body (``topic_rights``:
    what the client may describe, from the authorization stage)."""
    v = Fields.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, api_version, value)
    owned = v.structs("topic_partitions") if v.opt_list("topic_partitions") is not None else None
    names = v.opt_list("subscribed_topic_names")
    return ConsumerGroupHeartbeatRequest(
        group_id=v.string("group_id"),
        member_id=v.string("member_id"),
        member_epoch=v.integer("member_epoch"),
        instance_id=v.opt_string("instance_id"),
        rack_id=v.opt_string("rack_id"),
        rebalance_timeout_ms=v.integer("rebalance_timeout_ms"),
        subscribed_topic_names=None if names is None else list(names),
        subscribed_topic_regex=v.opt_string("subscribed_topic_regex"),
        server_assignor=v.opt_string("server_assignor"),
        topic_partitions=None if owned is None else [
            (tp.raw("topic_id"), tuple(tp.opt_list("partitions") or ())) for tp in owned],
        client_id=client_id or "",
        client_host=client_host,
        api_version=api_version,
        topic_rights=topic_rights,
    )


# ---- responses: engine -> wire dict ----------------------------------------------------------


def join_group_response(response: JoinGroupResponse, api_version: int) -> dict[str, Any]:
    """The JoinGroup response body at ``api_version``."""
    check_version(ApiKey.JOIN_GROUP, api_version)
    protocol_name = response.protocol_name
    if api_version < 7:
        protocol_name = protocol_name or ""
    elif protocol_name == "":
        protocol_name = None
    return {
        "throttle_time_ms": response.throttle_time_ms,
        "error_code": response.error_code,
        "generation_id": response.generation_id,
        "protocol_type": response.protocol_type,
        "protocol_name": protocol_name,
        "leader": response.leader,
        "skip_assignment": response.skip_assignment,
        "member_id": response.member_id,
        "members": [],
    }


def sync_group_response(response: SyncGroupResponse, api_version: int) -> dict[str, Any]:
    """The SyncGroup response body: the assignment is :func:`encode_assignment` of the
    engine's, empty bytes with an error. A success without an assignment (not something the
    engine returns) is an empty v0 assignment, which every client reads as "no partitions"."""
    check_version(ApiKey.SYNC_GROUP, api_version)
    if response.error_code != 0:
        assignment = b""
    elif response.assignment is None:
        assignment = encode_assignment(ClassicAssignment(0, ()))
    else:
        assignment = encode_assignment(response.assignment)
    return {
        "throttle_time_ms": response.throttle_time_ms,
        "error_code": response.error_code,
        "protocol_type": response.protocol_type,
        "protocol_name": response.protocol_name,
        "assignment": assignment,
    }


def heartbeat_response(response: HeartbeatResponse, api_version: int) -> dict[str, Any]:
    """The Heartbeat response body."""
    check_version(ApiKey.HEARTBEAT, api_version)
    return {"throttle_time_ms": response.throttle_time_ms, "error_code": response.error_code}


def leave_group_response(response: LeaveGroupResponse, api_version: int) -> dict[str, Any]:
    """The LeaveGroup response body: v0-v2 carry the top-level error code only, the single
    member's when the top level has none (Kafka's ``LeaveGroupResponse``); v3+ the top-level
    code and one entry per member."""
    check_version(ApiKey.LEAVE_GROUP, api_version)
    error_code = response.error_code
    if api_version < 3 and error_code == 0 and response.members:
        error_code = response.members[0].error_code
    return {
        "throttle_time_ms": response.throttle_time_ms,
        "error_code": error_code,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "error_code": m.error_code} for m in response.members],
    }


def consumer_group_heartbeat_response(response: ConsumerGroupHeartbeatResponse
                                      ) -> dict[str, Any]:
    """The ConsumerGroupHeartbeat response body value for an engine response."""
    assignment = None
    if response.assignment is not None:
        assignment = {"topic_partitions": [
            {"topic_id": tp.topic_id, "partitions": list(tp.partitions)}
            for tp in response.assignment]}
    return {
        "throttle_time_ms": response.throttle_time_ms,
        "error_code": response.error_code,
        "error_message": response.error_message,
        "member_id": response.member_id,
        "member_epoch": response.member_epoch,
        "heartbeat_interval_ms": response.heartbeat_interval_ms,
        "assignment": assignment,
    }


def consumer_group_heartbeat_error(error_code: int, message: str | None) -> dict[str, Any]:
    return consumer_group_heartbeat_response(
        ConsumerGroupHeartbeatResponse(error_code=error_code, error_message=message))


def _described_partitions(items: Sequence[DescribedTopicPartitions]) -> dict[str, Any]:
    return {"topic_partitions": [
        {"topic_id": tp.topic_id, "topic_name": tp.topic_name, "partitions": list(tp.partitions)}
        for tp in items]}


def consumer_group_describe_response(groups: Sequence[DescribedGroup]) -> dict[str, Any]:
    """The ConsumerGroupDescribe response body value for the engine's descriptions."""
    return {"throttle_time_ms": 0, "groups": [{
        "error_code": g.error_code,
        "error_message": g.error_message,
        "group_id": g.group_id,
        "group_state": g.group_state,
        "group_epoch": g.group_epoch,
        "assignment_epoch": g.assignment_epoch,
        "assignor_name": g.assignor_name,
        "members": [{
            "member_id": m.member_id,
            "instance_id": m.instance_id,
            "rack_id": m.rack_id,
            "member_epoch": m.member_epoch,
            "client_id": m.client_id,
            "client_host": m.client_host,
            "subscribed_topic_names": list(m.subscribed_topic_names),
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "assignment": _described_partitions(m.assignment),
            "target_assignment": _described_partitions(m.target_assignment),
            "member_type": m.member_type,
        } for m in g.members],
    } for g in groups]}
