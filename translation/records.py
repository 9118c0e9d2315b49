"""Durable group state as records: the model, and its encoding to bytes.

The coordinating engine's state is written to a compacted Kafka topic as records keyed the way
Kafka's group coordinator keys its records in ``__consumer_offsets``: one record per group and
two per member, never a whole-group blob, so a heartbeat that moves one member rewrites that
member's records only, and compaction keeps the latest value of every key.

Record kinds (:class:`RecordKind`, the key's first field):

* ``GROUP`` (key: group id) -> :class:`GroupValue`: group epoch, assignment epoch, the preferred
  server assignor, the subscription metadata the target was computed from (partition count per
  subscribed topic id), and the wall-clock time the group became empty (None while it has
  members). Kafka splits this over ConsumerGroupMetadata, ConsumerGroupPartitionMetadata and
  ConsumerGroupTargetAssignmentMetadata.
* ``MEMBER`` (key: group id, member id) -> :class:`MemberValue`: what the member *is* and
  subscribes to: instance id, rack, client id and host, subscribed names and regex, server
  assignor, rebalance and session timeouts, protocol, and for a classic member its
  :class:`ClassicMemberValue` (session timeout, protocol names in preference order,
  subscription version, userData). Kafka's ConsumerGroupMemberMetadata.
* ``ASSIGNMENT`` (key: group id, member id) -> :class:`AssignmentValue`: where the member
  *stands*: member epoch, previous member epoch, reconciliation state, assigned partitions and
  partitions pending revocation each with its assignment epoch, the member's target partitions,
  and for a classic member its position in the classic state machine and the generation it was
  given. Kafka's ConsumerGroupCurrentMemberAssignment and ConsumerGroupTargetAssignmentMember in
  one record: both change together on every rebalance step of the member, and the classic
  position changes with them, so the member record (subscriptions, protocol names: the bigger
  one) is rewritten only when the member changes what it asks for.

A value of None is a tombstone: the member left (both member keys) or the group is gone (every
key of the group). Requests the engine holds (a deferred JoinGroup, a held SyncGroup) are not
state: the client's request dies with the coordinator's connection and the client sends it
again, so a loaded classic member holds nothing.

Times: only the time a group became empty is stored, in wall-clock milliseconds passed in by the
driver, since the group's expiry must survive a restart; every other deadline (sessions,
rebalance timeouts, classic join/sync timers) is re-armed on load from the loading engine's
``now_ms``.

Encoding (decision record 0012): a key is ``kind:int16`` then length-prefixed UTF-8 strings
(group id, then member id for member kinds), so equal keys are equal bytes, as compaction needs.
A value is ``version:int16`` then a compact JSON array of the fields in a fixed order (topic
ids as 32 hex digits, partitions as flat ``[partition, epoch, ...]`` lists). A reader accepts
the versions it knows and refuses a newer one, an unknown kind, or a malformed record with
:class:`RecordError`.
"""

from __future__ import annotations

import base64
import enum
import functools
import json
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from translation.classic.member import ClassicMemberState
from translation.member import MemberProtocol, MemberState
from translation.topics import TopicId


class RecordError(ValueError):
    """A record that cannot be encoded or read: unknown kind, newer version, malformed."""


class RecordKind(enum.IntEnum):
    GROUP = 1
    MEMBER = 2
    ASSIGNMENT = 3


VALUE_VERSION = 1
"""The value version this code writes; it reads every version up to it."""

PartitionEpochList = tuple[tuple[TopicId, tuple[tuple[int, int], ...]], ...]
"""``((topic id, ((partition, assignment epoch), ...)), ...)``, both levels sorted."""
PartitionList = tuple[tuple[TopicId, tuple[int, ...]], ...]
"""``((topic id, (partition, ...)), ...)``, both levels sorted."""


@dataclass(frozen=True, slots=True)
class RecordKey:
    kind: RecordKind
    group_id: str
    member_id: str = ""
    """Empty for ``GROUP``."""


@dataclass(frozen=True, slots=True)
class GroupValue:
    group_epoch: int
    assignment_epoch: int
    preferred_assignor: str
    subscription_metadata: tuple[tuple[TopicId, int], ...]
    """Partition count per subscribed topic id, sorted by topic id."""
    empty_since_wall_ms: int | None
    """Wall-clock time the group became empty; None while it has members."""


@dataclass(frozen=True, slots=True)
class ClassicMemberValue:
    session_timeout_ms: int
    protocols: tuple[str, ...]
    """Protocol names of the last JoinGroup, the first being the one answered with."""
    subscription_version: int
    user_data: bytes | None


@dataclass(frozen=True, slots=True)
class MemberValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    """Sorted."""
    subscribed_topic_regex: str | None
    server_assignor: str | None
    rebalance_timeout_ms: int
    session_timeout_ms: int | None
    protocol: MemberProtocol
    classic: ClassicMemberValue | None


@dataclass(frozen=True, slots=True)
class AssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: PartitionEpochList
    pending_revocation: PartitionEpochList
    target: PartitionList | None
    """The member's entry in the target assignment; None when it has none yet."""
    classic_state: ClassicMemberState | None = None
    """A classic member's position in the classic state machine; None for others."""
    classic_generation: int = -1
    """The generation a classic member was last given (-1: none)."""


StateValue = GroupValue | MemberValue | AssignmentValue

_VALUE_TYPES: dict[RecordKind, type] = {
    RecordKind.GROUP: GroupValue,
    RecordKind.MEMBER: MemberValue,
    RecordKind.ASSIGNMENT: AssignmentValue,
}


class StateRecord(NamedTuple):
    """One record: a key and its value, None for a tombstone."""

    key: RecordKey
    value: StateValue | None


def check_record(record: StateRecord) -> None:
    """Raise :class:`RecordError` unless the value's type is the one its key's kind holds."""
    key, value = record
    if key.kind is RecordKind.GROUP and key.member_id:
        raise RecordError(f"a group key carries a member id: {key!r}")
    if key.kind is not RecordKind.GROUP and not key.member_id:
        raise RecordError(f"a {key.kind.name.lower()} key without a member id: {key!r}")
    if value is not None and not isinstance(value, _VALUE_TYPES[key.kind]):
        raise RecordError(f"a {key.kind.name.lower()} key with a {type(value).__name__}")


# ---------------------------------------------------------------------------------- keys

_KIND = struct.Struct(">h")
_LENGTH = struct.Struct(">I")


def encode_key(key: RecordKey) -> bytes:
    parts = [_KIND.pack(key.kind), _string(key.group_id)]
    if key.kind is not RecordKind.GROUP:
        parts.append(_string(key.member_id))
    return b"".join(parts)


def _string(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return _LENGTH.pack(len(data)) + data


def decode_key(data: bytes) -> RecordKey:
    try:
        (raw_kind,) = _KIND.unpack_from(data, 0)
        try:
            kind = RecordKind(raw_kind)
        except ValueError:
            raise RecordError(f"unknown record kind {raw_kind}") from None
        group_id, offset = _read_string(data, _KIND.size)
        member_id = ""
        if kind is not RecordKind.GROUP:
            member_id, offset = _read_string(data, offset)
    except (struct.error, UnicodeDecodeError) as exc:
        raise RecordError(f"malformed record key: {exc}") from None
    if offset != len(data):
        raise RecordError(f"{len(data) - offset} bytes after the record key")
    return RecordKey(kind, group_id, member_id)


def key_group_id(data: bytes) -> str:
    """The group id an encoded key belongs to (for a loader reading a partition that holds
    many groups); RecordError when it is no key of this module."""
    return decode_key(data).group_id


def _read_string(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = _LENGTH.unpack_from(data, offset)
    start = offset + _LENGTH.size
    end = start + length
    if end > len(data):
        raise RecordError("record key string runs past the end")
    return data[start:end].decode("utf-8", "surrogatepass"), end


# ---------------------------------------------------------------------------------- values

_VERSION = struct.Struct(">h")
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_loads = json.JSONDecoder().decode


def encode_value(value: StateValue | None) -> bytes | None:
    """The value's bytes; None stays None (a tombstone)."""
    if value is None:
        return None
    if isinstance(value, AssignmentValue):
        fields: list[Any] = [
            value.member_epoch,
            value.previous_member_epoch,
            value.state.value,
            _epochs_out(value.assigned),
            _epochs_out(value.pending_revocation),
            None if value.target is None else [[t.hex, list(ps)] for t, ps in value.target],
            None if value.classic_state is None else value.classic_state.value,
            value.classic_generation,
        ]
    elif isinstance(value, MemberValue):
        classic = value.classic
        fields = [
            value.instance_id,
            value.rack_id,
            value.client_id,
            value.client_host,
            list(value.subscribed_topic_names),
            value.subscribed_topic_regex,
            value.server_assignor,
            value.rebalance_timeout_ms,
            value.session_timeout_ms,
            value.protocol.value,
            None if classic is None else [
                classic.session_timeout_ms,
                list(classic.protocols),
                classic.subscription_version,
                None if classic.user_data is None
                else base64.b64encode(classic.user_data).decode("ascii"),
            ],
        ]
    elif isinstance(value, GroupValue):
        fields = [
            value.group_epoch,
            value.assignment_epoch,
            value.preferred_assignor,
            [[t.hex, n] for t, n in value.subscription_metadata],
            value.empty_since_wall_ms,
        ]
    else:
        raise RecordError(f"not a record value: {type(value).__name__}")
    return _VERSION.pack(VALUE_VERSION) + _dumps(fields).encode("utf-8", "surrogatepass")


def _epochs_out(partitions: PartitionEpochList) -> list[Any]:
    out: list[Any] = []
    for topic_id, pairs in partitions:
        flat: list[int] = []
        for p, epoch in pairs:
            flat.append(p)
            flat.append(epoch)
        out.append([topic_id.hex, flat])
    return out


def decode_value(kind: RecordKind, data: bytes | None) -> StateValue | None:
    """The value of a record of ``kind``; None stays None (a tombstone)."""
    if data is None:
        return None
    try:
        (version,) = _VERSION.unpack_from(data, 0)
    except struct.error:
        raise RecordError(f"{kind.name.lower()} value too short for its version") from None
    if version < 1 or version > VALUE_VERSION:
        raise RecordError(
            f"{kind.name.lower()} value version {version}: this groupgate reads versions "
            f"1 to {VALUE_VERSION}")
    try:
        fields = _loads(data[_VERSION.size:].decode("utf-8", "surrogatepass"))
        if kind is RecordKind.ASSIGNMENT:
            return _assignment_in(fields)
        if kind is RecordKind.MEMBER:
            return _member_in(fields)
        return _group_in(fields)
    except RecordError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise RecordError(f"malformed {kind.name.lower()} value: {exc}") from None


def decode_record(key: bytes, value: bytes | None) -> StateRecord:
    """A record as read from the topic: key bytes and value bytes (None: tombstone)."""
    record_key = decode_key(key)
    return StateRecord(record_key, decode_value(record_key.kind, value))


def encode_record(record: StateRecord) -> tuple[bytes, bytes | None]:
    check_record(record)
    return encode_key(record.key), encode_value(record.value)


def record_bytes(record: StateRecord) -> int:
    """The bytes of the record's key and value as written (what a state log's record size
    limit is measured against, :attr:`translation.config.GroupConfig.max_state_record_bytes`)."""
    key, value = encode_record(record)
    return len(key) + (0 if value is None else len(value))


def _int(x: Any) -> int:
    if type(x) is not int:
        raise RecordError(f"expected an integer, got {x!r}")
    return x


def _opt_int(x: Any) -> int | None:
    return None if x is None else _int(x)


def _str(x: Any) -> str:
    if type(x) is not str:
        raise RecordError(f"expected a string, got {x!r}")
    return x


def _opt_str(x: Any) -> str | None:
    return None if x is None else _str(x)


def _list(x: Any, n: int | None = None) -> list[Any]:
    if type(x) is not list or (n is not None and len(x) != n):
        raise RecordError(f"expected a list{'' if n is None else f' of {n}'}, got {x!r}")
    return x


@functools.lru_cache(maxsize=4096)
def _topic_of(text: str) -> TopicId:
    return uuid.UUID(hex=text)


def _topic(x: Any) -> TopicId:
    """A topic id from its 32 hex digits (a group names few topics: parsed once each)."""
    return _topic_of(_str(x))


def _ints(x: Any) -> list[int]:
    items = _list(x)
    for item in items:
        if type(item) is not int:
            raise RecordError(f"expected an integer, got {item!r}")
    return items


def _epochs_in(x: Any) -> PartitionEpochList:
    out: list[tuple[TopicId, tuple[tuple[int, int], ...]]] = []
    for entry in _list(x):
        topic, flat = _list(entry, 2)
        flat = _ints(flat)
        if len(flat) % 2:
            raise RecordError("odd partition/epoch list")
        out.append((_topic(topic), tuple(zip(flat[::2], flat[1::2], strict=True))))
    return tuple(out)


def _assignment_in(fields: Any) -> AssignmentValue:
    (epoch, previous, state, assigned, revoking, target, classic_state,
     generation) = _list(fields, 8)
    return AssignmentValue(
        member_epoch=_int(epoch),
        previous_member_epoch=_int(previous),
        state=MemberState(_str(state)),
        assigned=_epochs_in(assigned),
        pending_revocation=_epochs_in(revoking),
        target=None if target is None else tuple(
            (_topic(t), tuple(_ints(ps))) for t, ps in (_list(e, 2) for e in _list(target))),
        classic_state=None if classic_state is None else ClassicMemberState(_str(classic_state)),
        classic_generation=_int(generation),
    )


def _member_in(fields: Any) -> MemberValue:
    (instance_id, rack_id, client_id, client_host, names, regex, assignor, rebalance,
     session, protocol, classic) = _list(fields, 11)
    classic_value = None
    if classic is not None:
        c_session, protocols, version, user_data = _list(classic, 4)
        classic_value = ClassicMemberValue(
            session_timeout_ms=_int(c_session),
            protocols=tuple(_str(p) for p in _list(protocols)),
            subscription_version=_int(version),
            user_data=None if user_data is None else base64.b64decode(_str(user_data),
                                                                      validate=True),
        )
    return MemberValue(
        instance_id=_opt_str(instance_id),
        rack_id=_opt_str(rack_id),
        client_id=_str(client_id),
        client_host=_str(client_host),
        subscribed_topic_names=tuple(_str(n) for n in _list(names)),
        subscribed_topic_regex=_opt_str(regex),
        server_assignor=_opt_str(assignor),
        rebalance_timeout_ms=_int(rebalance),
        session_timeout_ms=_opt_int(session),
        protocol=MemberProtocol(_str(protocol)),
        classic=classic_value,
    )


def _group_in(fields: Any) -> GroupValue:
    group_epoch, assignment_epoch, assignor, metadata, empty_since = _list(fields, 5)
    return GroupValue(
        group_epoch=_int(group_epoch),
        assignment_epoch=_int(assignment_epoch),
        preferred_assignor=_str(assignor),
        subscription_metadata=tuple(
            (_topic(t), _int(n)) for t, n in (_list(e, 2) for e in _list(metadata))),
        empty_since_wall_ms=_opt_int(empty_since),
    )


def fold(records: Iterable[StateRecord]) -> dict[RecordKey, StateValue]:
    """The state ``records`` leave behind, replayed in order: the last value of each key,
    keys whose last record is a tombstone left out (what compaction converges to)."""
    state: dict[RecordKey, StateValue] = {}
    for key, value in records:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state
