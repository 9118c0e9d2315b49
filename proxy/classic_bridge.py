"""Classic group API messages: decoded wire dicts <-> the engine's classic dataclasses (sans-I/O).

The codec (:mod:`proxy.codec.messages`) decodes JoinGroup (11), Heartbeat (12), LeaveGroup
(13) and SyncGroup (14) bodies into dicts keyed by Kafka's field names in snake_case; the
classic side of the engine (:mod:`translation.classic`) takes and returns the dataclasses of
:mod:`translation.classic.messages`, with the embedded consumer protocol already decoded.
This module maps one onto the other and nothing else: no I/O, no state, so it is tested
without a network. The proxy calls, per classic request the engine serves::

    body, _ = decode_request(ApiKey.JOIN_GROUP, v, buf)
    request = join_group_request(body, v, client_id=..., client_host=...)
    response, effects = classic.join_group(request, now_ms)      # None: held (see the engine)
    encode_response(11, v, join_group_response(response, v))

and the same for SyncGroup, Heartbeat and LeaveGroup (a held JoinGroup is answered later from
its ``JoinCompleted`` effect with :func:`join_group_response` at the held request's version).

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

Version rules applied here (the engine's own rules, such as MEMBER_ID_REQUIRED for v4+
JoinGroups, are the engine's):

* JoinGroup: v0 has no rebalance timeout (-1: the engine uses the session timeout); v5+
  ``group_instance_id``; v8+ ``reason``. Response: ``protocol_type`` v7+; ``protocol_name``
  is "" instead of null before v7 and null instead of "" from v7 (Kafka's
  ``JoinGroupResponse``); ``skip_assignment`` v9+ (always false: no member is leader);
  ``leader`` "" and no ``members``; ``throttle_time_ms`` 0 (v2+).
* SyncGroup: v3+ ``group_instance_id``; v5+ ``protocol_type``/``protocol_name`` in the
  request and in the response. The request's ``assignments`` are ignored: every classic
  member of an engine group is a follower.
* Heartbeat: v3+ ``group_instance_id``.
* LeaveGroup: v0-v2 name one member (``member_id``), whose error is the response's top-level
  error code; v3+ batch ``members`` (``reason`` v5+) answered member by member.

Fields a version does not have are forced to their defaults, so a hand-built dict carrying
them changes nothing. A request dict without the shape its schema gives (a missing key, a
value of the wrong type) raises :class:`BridgeError`; dicts from the codec always have it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.messages import decode_data, encode_data, supported_versions
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

SUBSCRIPTION_SCHEMA = "ConsumerProtocolSubscription"
ASSIGNMENT_SCHEMA = "ConsumerProtocolAssignment"
MAX_CONSUMER_PROTOCOL_VERSION = 3
"""Newest ``ConsumerProtocolSubscription``/``ConsumerProtocolAssignment`` version known."""

Partitions = tuple[tuple[str, tuple[int, ...]], ...]


class BridgeError(ValueError):
    """A request dict without the shape its schema gives, or an unsupported API version."""


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


def classic_protocols(
    protocol_type: str, protocols: Sequence[Mapping[str, Any]]
) -> tuple[ClassicProtocol, ...]:
    """JoinGroup protocols (``{"name", "metadata"}`` dicts) with their parsed subscriptions.

    In the order the client sent them (its preference). Subscriptions are parsed only for the
    ``consumer`` protocol type; other types' protocols carry None.
    """
    consumer = protocol_type == CONSUMER_PROTOCOL_TYPE
    out: list[ClassicProtocol] = []
    for i, protocol in enumerate(_list(protocols, "protocols")):
        where = f"protocols[{i}]"
        p = _mapping(protocol, where)
        name = _str(p, "name", where)
        metadata = _field(p, "metadata", where)
        out.append(ClassicProtocol(name, parse_subscription(metadata) if consumer else None))
    return tuple(out)


def encode_assignment(assignment: ClassicAssignment) -> bytes:
    """The engine's assignment as ``ConsumerProtocolAssignment`` bytes, without userData.

    Encoded at ``assignment.version`` clamped to 0-3 (Kafka's ``checkAssignmentVersion``).
    """
    version = max(0, min(assignment.version, MAX_CONSUMER_PROTOCOL_VERSION))
    return encode_data(
        ASSIGNMENT_SCHEMA,
        version,
        {
            "assigned_partitions": [
                {"topic": topic, "partitions": list(partitions)}
                for topic, partitions in assignment.partitions
            ],
            "user_data": None,
        },
    )


def parse_assignment(
    data: bytes | bytearray | memoryview,
) -> tuple[ClassicAssignment, bytes | None]:
    """``ConsumerProtocolAssignment`` bytes as ``(assignment, userData)``.

    For reading assignments the broker handed out (a classic group being converted). Raises
    :class:`BridgeError` when the bytes do not parse; empty bytes (a member that never
    synced) are the caller's to treat as "no assignment" before calling this.
    """
    try:
        wire_version, value = decode_data(ASSIGNMENT_SCHEMA, _contiguous(data))
    except (CodecError, TypeError, ValueError, BufferError) as err:
        raise BridgeError(f"malformed {ASSIGNMENT_SCHEMA}: {err}") from err
    user_data = value["user_data"]
    assignment = ClassicAssignment(
        min(wire_version, MAX_CONSUMER_PROTOCOL_VERSION),
        _partitions(value["assigned_partitions"]),
    )
    return assignment, None if user_data is None else bytes(user_data)


def _contiguous(data: object) -> object:
    """A strided memoryview copied into bytes (the codec reads contiguous buffers only)."""
    if isinstance(data, memoryview) and not data.c_contiguous:
        return data.tobytes()
    return data


def _partitions(items: Sequence[Mapping[str, Any]]) -> Partitions:
    return tuple((tp["topic"], tuple(tp["partitions"])) for tp in items)


# ---- requests: wire dict -> engine -----------------------------------------------------------


def join_group_request(
    value: Mapping[str, Any],
    api_version: int,
    *,
    client_id: str | None = "",
    client_host: str = "",
) -> JoinGroupRequest:
    """The engine's request for a decoded JoinGroup request body (v0-v9)."""
    _check_version(ApiKey.JOIN_GROUP, "JoinGroup", api_version)
    v = _mapping(value, "JoinGroup request")
    protocol_type = _str(v, "protocol_type")
    return JoinGroupRequest(
        group_id=_str(v, "group_id"),
        member_id=_str(v, "member_id"),
        protocol_type=protocol_type,
        protocols=classic_protocols(protocol_type, _list(_field(v, "protocols"), "protocols")),
        session_timeout_ms=_int(v, "session_timeout_ms"),
        rebalance_timeout_ms=_int(v, "rebalance_timeout_ms") if api_version >= 1 else -1,
        group_instance_id=_opt_str(v, "group_instance_id") if api_version >= 5 else None,
        reason=_opt_str(v, "reason") if api_version >= 8 else None,
        api_version=api_version,
        client_id=client_id or "",
        client_host=client_host,
    )


def sync_group_request(value: Mapping[str, Any], api_version: int) -> SyncGroupRequest:
    """The engine's request for a decoded SyncGroup request body (v0-v5)."""
    _check_version(ApiKey.SYNC_GROUP, "SyncGroup", api_version)
    v = _mapping(value, "SyncGroup request")
    return SyncGroupRequest(
        group_id=_str(v, "group_id"),
        member_id=_str(v, "member_id"),
        generation_id=_int(v, "generation_id"),
        group_instance_id=_opt_str(v, "group_instance_id") if api_version >= 3 else None,
        protocol_type=_opt_str(v, "protocol_type") if api_version >= 5 else None,
        protocol_name=_opt_str(v, "protocol_name") if api_version >= 5 else None,
        api_version=api_version,
    )


def heartbeat_request(value: Mapping[str, Any], api_version: int) -> HeartbeatRequest:
    """The engine's request for a decoded Heartbeat request body (v0-v4)."""
    _check_version(ApiKey.HEARTBEAT, "Heartbeat", api_version)
    v = _mapping(value, "Heartbeat request")
    return HeartbeatRequest(
        group_id=_str(v, "group_id"),
        member_id=_str(v, "member_id"),
        generation_id=_int(v, "generation_id"),
        group_instance_id=_opt_str(v, "group_instance_id") if api_version >= 3 else None,
        api_version=api_version,
    )


def leave_group_request(value: Mapping[str, Any], api_version: int) -> LeaveGroupRequest:
    """The engine's request for a decoded LeaveGroup request body (v0-v5).

    v0-v2 name one member by ``member_id``; v3+ list ``members`` (possibly none: the engine
    answers an empty batch with no member responses).
    """
    _check_version(ApiKey.LEAVE_GROUP, "LeaveGroup", api_version)
    v = _mapping(value, "LeaveGroup request")
    group_id = _str(v, "group_id")
    if api_version < 3:
        return LeaveGroupRequest(
            group_id, (LeavingMember(_str(v, "member_id")),), api_version=api_version
        )
    members: list[LeavingMember] = []
    for i, item in enumerate(_list(_field(v, "members"), "members")):
        where = f"members[{i}]"
        m = _mapping(item, where)
        members.append(
            LeavingMember(
                member_id=_str(m, "member_id", where),
                group_instance_id=_opt_str(m, "group_instance_id", where),
                reason=_opt_str(m, "reason", where) if api_version >= 5 else None,
            )
        )
    return LeaveGroupRequest(group_id, tuple(members), api_version=api_version)


# ---- responses: engine -> wire dict ----------------------------------------------------------


def join_group_response(response: JoinGroupResponse, api_version: int) -> dict[str, Any]:
    """The JoinGroup response body (for ``encode_response(11, api_version, ...)``)."""
    _check_version(ApiKey.JOIN_GROUP, "JoinGroup", api_version)
    protocol_name = response.protocol_name
    if api_version < 7:
        protocol_name = protocol_name or ""
    elif protocol_name == "":
        protocol_name = None
    out: dict[str, Any] = {
        "error_code": response.error_code,
        "generation_id": response.generation_id,
        "protocol_name": protocol_name,
        "leader": response.leader,
        "member_id": response.member_id,
        "members": [],
    }
    if api_version >= 2:
        out["throttle_time_ms"] = response.throttle_time_ms
    if api_version >= 7:
        out["protocol_type"] = response.protocol_type
    if api_version >= 9:
        out["skip_assignment"] = response.skip_assignment
    return out


def sync_group_response(response: SyncGroupResponse, api_version: int) -> dict[str, Any]:
    """The SyncGroup response body (for ``encode_response(14, api_version, ...)``).

    The assignment is :func:`encode_assignment` of the engine's; empty bytes with an error. A
    success without an assignment (not something the engine returns) is an empty v0
    assignment, which every client reads as "no partitions".
    """
    _check_version(ApiKey.SYNC_GROUP, "SyncGroup", api_version)
    if response.error_code != 0:
        assignment = b""
    elif response.assignment is None:
        assignment = encode_assignment(ClassicAssignment(0, ()))
    else:
        assignment = encode_assignment(response.assignment)
    out: dict[str, Any] = {"error_code": response.error_code, "assignment": assignment}
    if api_version >= 1:
        out["throttle_time_ms"] = response.throttle_time_ms
    if api_version >= 5:
        out["protocol_type"] = response.protocol_type
        out["protocol_name"] = response.protocol_name
    return out


def heartbeat_response(response: HeartbeatResponse, api_version: int) -> dict[str, Any]:
    """The Heartbeat response body (for ``encode_response(12, api_version, ...)``)."""
    _check_version(ApiKey.HEARTBEAT, "Heartbeat", api_version)
    out: dict[str, Any] = {"error_code": response.error_code}
    if api_version >= 1:
        out["throttle_time_ms"] = response.throttle_time_ms
    return out


def leave_group_response(response: LeaveGroupResponse, api_version: int) -> dict[str, Any]:
    """The LeaveGroup response body (for ``encode_response(13, api_version, ...)``).

    v0-v2: the top-level error code only, the single member's when the top level has none
    (Kafka's ``LeaveGroupResponse``); v3+: the top-level code and one entry per member.
    """
    _check_version(ApiKey.LEAVE_GROUP, "LeaveGroup", api_version)
    error_code = response.error_code
    if api_version < 3:
        if error_code == 0 and response.members:
            error_code = response.members[0].error_code
        out: dict[str, Any] = {"error_code": error_code}
    else:
        out = {
            "error_code": error_code,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "error_code": m.error_code,
                }
                for m in response.members
            ],
        }
    if api_version >= 1:
        out["throttle_time_ms"] = response.throttle_time_ms
    return out


# ---- shape checks ----------------------------------------------------------------------------


def _check_version(api_key: int, name: str, api_version: int) -> None:
    lo, hi = supported_versions(api_key)
    if isinstance(api_version, bool) or not isinstance(api_version, int):
        raise BridgeError(f"{name}: api version {api_version!r} is not an integer")
    if not lo <= api_version <= hi:
        raise BridgeError(f"{name} v{api_version} is not supported (valid {lo}-{hi})")


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BridgeError(f"{where}: expected a dict, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise BridgeError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _field(value: Mapping[str, Any], key: str, where: str = "") -> Any:
    try:
        return value[key]
    except KeyError:
        raise BridgeError(f"{where or 'request'}: missing {key!r}") from None


def _str(value: Mapping[str, Any], key: str, where: str = "") -> str:
    x = _field(value, key, where)
    if not isinstance(x, str):
        raise BridgeError(f"{where or 'request'}: {key!r} is not a string: {x!r}")
    return x


def _opt_str(value: Mapping[str, Any], key: str, where: str = "") -> str | None:
    x = value.get(key)
    if x is not None and not isinstance(x, str):
        raise BridgeError(f"{where or 'request'}: {key!r} is not a string or null: {x!r}")
    return x


def _int(value: Mapping[str, Any], key: str, where: str = "") -> int:
    x = _field(value, key, where)
    if isinstance(x, bool) or not isinstance(x, int):
        raise BridgeError(f"{where or 'request'}: {key!r} is not an integer: {x!r}")
    return x
