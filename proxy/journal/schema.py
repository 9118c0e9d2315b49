"""The journal's events: types, fields, and their JSON encoding (schema versions 1 and 2).

One event is one Kafka record: key = the group id (UTF-8), timestamp = the event time (wall
clock, ms since the epoch), value = one compact JSON object (no spaces, UTF-8, fields whose
value is null or empty left out). Every value carries the common fields, so a file of values
(JSON lines) is the journal too:

``v``       schema version: 1, or 2 for the event types added with fleet protocol 3
            (:data:`TYPE_VERSIONS`: ``group_converted``, ``conversion_aborted``,
            ``group_released``); an event type
            that existed in version 1 keeps version 1, so a reader of version 1 reads every
            event it knows and skips the new ones
``type``    one of :class:`EventType`
``ts``      event time, wall clock ms (the record timestamp)
``group``   group id (the record key)
``source``  which proxy wrote it (``host:port`` of its listener unless configured)
``seq``     the source's event counter: orders a source's events with equal ``ts``, and
            ``(source, seq)`` identifies an event

The other fields of each type are listed in :data:`FIELDS`; a field has one kind everywhere
(:class:`Kind`), so a reader can use one wide schema (``proxy.report`` does). Partitions are
maps of topic name to sorted partition numbers (a topic the proxy no longer knows by name is
given as its topic id). Within a group, events are in the order the engine made the changes;
``docs/pipeline.md`` describes each type and what it means for the report.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
"""The version of every event type that existed before fleet protocol 3."""
SCHEMA_VERSIONS = frozenset({1, 2})
"""The versions this module reads."""

COMMON = ("v", "type", "ts", "group", "source", "seq")


class EventType(enum.StrEnum):
    GROUP_CREATED = "group_created"
    """The engine started coordinating the group (``converted``: adopted from the broker's
    classic group at its generation, with its members and their assignment)."""
    GROUP_EXPIRED = "group_expired"
    """Empty past the expiry delay: forgotten, the proxy left the broker's group."""
    GROUP_DELETED = "group_deleted"
    """Deleted on request (DeleteGroups)."""
    GROUP_HANDED_BACK = "group_handed_back"
    """Given back to the broker's classic coordinator (downgrade); ``members`` rejoin there."""
    GROUP_DROPPED = "group_dropped"
    """Forgotten another way (``how``: the engine's name for it, e.g. ``lost``)."""
    GROUP_PASSED_THROUGH = "group_passed_through"
    """A group the proxy leaves to the broker (``reason``); written once per group and reason
    within the observer's repeat interval, not for every request."""
    GROUP_STATE = "group_state"
    """The group's state changed (Empty, Assigning, Reconciling, Stable), or it became Stable
    at a new epoch within one engine call."""
    GROUP_SNAPSHOT = "group_snapshot"
    """Periodic: every member with its assignment (``part`` of ``parts`` for big groups)."""
    EPOCH_BUMPED = "epoch_bumped"
    """The group epoch moved on: the assignor's input changed (``reason``)."""
    TARGET_COMPUTED = "target_computed"
    """A target assignment was computed for ``assignment_epoch``."""
    TARGET_FAILED = "target_failed"
    """The assignor failed; the previous target stays."""
    MEMBER_JOINED = "member_joined"
    MEMBER_LEFT = "member_left"
    """Left on its own (``static``: a static member's temporary leave; it keeps its
    partitions, unconsumed, until it comes back or its session expires)."""
    MEMBER_FENCED = "member_fenced"
    """Removed by a timeout (``reason``)."""
    MEMBER_REPLACED = "member_replaced"
    """A static member came back under a new member id (``replaced``: the old one) and took
    over its partitions, possibly speaking the other protocol (``replaced_protocol``)."""
    GROUP_CONVERTED = "group_converted"
    """(Version 2.) The broker's classic group moved to the engine online (decision record
    0018): every member (``member_ids``, by their broker member ids) kept its generation
    (``group_epoch``) and partitions; ``assignor``: the group's classic protocol."""
    CONVERSION_ABORTED = "conversion_aborted"
    """(Version 2.) An online upgrade of the broker's group was refused or failed
    (``reason``); the group stays the broker's and is tried again later."""
    GROUP_RELEASED = "group_released"
    """(Version 2.) The group was handed back to the broker's classic coordinator (decision
    record 0018, the hand-back: ``groupgate release`` or the downgrade policy; ``reason``):
    its members (``member_ids``) rejoin the broker's group, classic ones themselves, KIP-848
    ones as bridged members with the partitions they own; ``assignor``: the protocol the
    broker's group selects."""
    ASSIGNMENT = "assignment"
    """A member's assignment moved: partitions ``revoked`` (it must stop consuming them),
    ``released`` (it no longer holds them), then ``assigned`` (it may consume them now; the
    same name can be in both when a topic was deleted and created again)."""


class Kind(enum.Enum):
    STRING = "string"
    INT = "int"
    """A 64-bit integer."""
    BOOL = "bool"
    STRINGS = "strings"
    PARTITIONS = "partitions"
    """``{"topic": [0, 1, ...]}``"""
    MEMBERS = "members"
    """A list of :data:`MEMBER_FIELDS` objects."""


MEMBER_FIELDS: dict[str, Kind] = {
    "member": Kind.STRING,
    "instance": Kind.STRING,
    "protocol": Kind.STRING,
    "assignor": Kind.STRING,
    "client_id": Kind.STRING,
    "client_host": Kind.STRING,
    "software_name": Kind.STRING,
    "software_version": Kind.STRING,
    "member_epoch": Kind.INT,
    "state": Kind.STRING,
    "assigned": Kind.PARTITIONS,
    "revoking": Kind.PARTITIONS,
}
"""A member as a snapshot lists it."""

_IDENTITY = ("member", "instance", "protocol", "assignor", "client_id", "client_host",
             "software_name", "software_version")

FIELD_KINDS: dict[str, Kind] = {
    **{name: MEMBER_FIELDS[name] for name in _IDENTITY},
    "v": Kind.INT,
    "type": Kind.STRING,
    "ts": Kind.INT,
    "group": Kind.STRING,
    "source": Kind.STRING,
    "seq": Kind.INT,
    "group_epoch": Kind.INT,
    "assignment_epoch": Kind.INT,
    "member_epoch": Kind.INT,
    "converted": Kind.BOOL,
    "how": Kind.STRING,
    "reason": Kind.STRING,
    "members": Kind.MEMBERS,
    "member_ids": Kind.STRINGS,
    "member_count": Kind.INT,
    "changed_members": Kind.INT,
    "state": Kind.STRING,
    "part": Kind.INT,
    "parts": Kind.INT,
    "static": Kind.BOOL,
    "replaced": Kind.STRING,
    "replaced_protocol": Kind.STRING,
    "topics": Kind.STRINGS,
    "regex": Kind.STRING,
    "rack": Kind.STRING,
    "protocol_type": Kind.STRING,
    "rebalance_timeout_ms": Kind.INT,
    "session_timeout_ms": Kind.INT,
    "assigned": Kind.PARTITIONS,
    "revoked": Kind.PARTITIONS,
    "released": Kind.PARTITIONS,
    "revoking": Kind.PARTITIONS,
}
"""Every field of every event type, with its one kind."""

FIELDS: dict[EventType, tuple[str, ...]] = {
    EventType.GROUP_CREATED: ("group_epoch", "converted"),
    EventType.GROUP_EXPIRED: (),
    EventType.GROUP_DELETED: (),
    EventType.GROUP_HANDED_BACK: ("reason", "member_ids", "revoked"),
    EventType.GROUP_DROPPED: ("how", "reason", "member_ids", "revoked"),
    EventType.GROUP_PASSED_THROUGH: ("reason", "protocol_type", "assignor", "client_id",
                                     "client_host", "software_name", "software_version"),
    EventType.GROUP_STATE: ("state", "group_epoch", "assignment_epoch", "member_count"),
    EventType.GROUP_SNAPSHOT: ("state", "group_epoch", "assignment_epoch", "member_count",
                               "part", "parts", "members"),
    EventType.EPOCH_BUMPED: ("group_epoch", "reason"),
    EventType.TARGET_COMPUTED: ("assignment_epoch", "assignor", "changed_members",
                                "member_count"),
    EventType.TARGET_FAILED: ("group_epoch", "assignor", "reason"),
    EventType.MEMBER_JOINED: (*_IDENTITY, "member_epoch", "group_epoch", "topics", "regex",
                              "rack", "rebalance_timeout_ms", "session_timeout_ms", "assigned"),
    EventType.MEMBER_LEFT: ("member", "instance", "protocol", "static", "member_epoch",
                            "revoked", "released"),
    EventType.MEMBER_FENCED: ("member", "instance", "protocol", "reason", "member_epoch",
                              "revoked", "released"),
    EventType.MEMBER_REPLACED: (*_IDENTITY, "replaced", "replaced_protocol", "member_epoch",
                                "assigned", "released"),
    EventType.ASSIGNMENT: ("member", "member_epoch", "state", "assigned", "revoked",
                           "released", "revoking"),
}
"""The fields of each event type besides :data:`COMMON` (any may be absent: null or empty)."""
FIELDS[EventType.GROUP_CONVERTED] = ("group_epoch", "assignor", "member_count", "member_ids")
FIELDS[EventType.CONVERSION_ABORTED] = ("group_epoch", "reason")
FIELDS[EventType.GROUP_RELEASED] = ("reason", "assignor", "member_count", "member_ids")

TYPE_VERSIONS: dict[EventType, int] = {EventType.GROUP_CONVERTED: 2,
                                       EventType.CONVERSION_ABORTED: 2,
                                       EventType.GROUP_RELEASED: 2}
"""Event types written at a version other than :data:`SCHEMA_VERSION` (new types only)."""


def version_of(event_type: EventType) -> int:
    """The schema version ``event_type`` is written at."""
    return TYPE_VERSIONS.get(event_type, SCHEMA_VERSION)

Partitions = dict[str, list[int]]


class SchemaError(ValueError):
    """A value that is not an event of a known schema version."""


@dataclass(frozen=True, slots=True)
class Event:
    """One journal event; ``fields`` holds the type's own fields (see :data:`FIELDS`)."""

    type: EventType
    group: str
    ts: int
    source: str
    seq: int
    fields: Mapping[str, Any]

    def to_value(self) -> dict[str, Any]:
        """The JSON object, common fields first, null and empty fields left out."""
        value: dict[str, Any] = {"v": version_of(self.type), "type": self.type.value, "ts": self.ts,
                                 "group": self.group, "source": self.source, "seq": self.seq}
        for name, field_value in self.fields.items():
            if field_value is None or field_value == {} or field_value == []:
                continue
            value[name] = field_value
        return value

    def encode(self) -> bytes:
        return json.dumps(self.to_value(), separators=(",", ":"), ensure_ascii=False).encode()

    @property
    def key(self) -> bytes:
        return self.group.encode()


def decode(value: bytes | str) -> Event:
    """Parse and check one record value; SchemaError if it is not an event of a version this
    module reads."""
    try:
        obj = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchemaError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise SchemaError("not a JSON object")
    problems = check(obj)
    if problems:
        raise SchemaError("; ".join(problems))
    fields = {k: v for k, v in obj.items() if k not in COMMON}
    return Event(EventType(obj["type"]), obj["group"], obj["ts"], obj["source"], obj["seq"],
                 fields)


def check(obj: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``obj`` as an event value (empty: nothing)."""
    problems: list[str] = []
    if obj.get("v") not in SCHEMA_VERSIONS:
        return [f"schema version {obj.get('v')!r}, this reader knows "
                f"{', '.join(map(str, sorted(SCHEMA_VERSIONS)))}"]
    try:
        event_type = EventType(str(obj.get("type")))
    except ValueError:
        return [f"unknown event type {obj.get('type')!r}"]
    if obj.get("v") != version_of(event_type):
        return [f"{event_type.value} is not written at schema version {obj.get('v')!r} (but "
                f"at {version_of(event_type)})"]
    for name in COMMON:
        if name not in obj:
            problems.append(f"missing {name}")
    allowed = set(COMMON) | set(FIELDS[event_type])
    for name, value in obj.items():
        if name not in allowed:
            problems.append(f"{event_type.value} has no field {name}")
            continue
        problem = _check_kind(name, value, FIELD_KINDS[name])
        if problem:
            problems.append(problem)
    return problems


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_kind(name: str, value: object, kind: Kind) -> str | None:
    ok: bool
    if kind is Kind.STRING:
        ok = isinstance(value, str)
    elif kind is Kind.INT:
        ok = _is_int(value)
    elif kind is Kind.BOOL:
        ok = isinstance(value, bool)
    elif kind is Kind.STRINGS:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif kind is Kind.PARTITIONS:
        ok = isinstance(value, dict) and all(
            isinstance(t, str) and isinstance(ps, list) and all(_is_int(p) for p in ps)
            for t, ps in value.items())
    else:
        if not isinstance(value, list):
            return f"{name} is not a list"
        for member in value:
            if not isinstance(member, dict):
                return f"{name} holds a non-object"
            for key, field_value in member.items():
                member_kind = MEMBER_FIELDS.get(key)
                if member_kind is None:
                    return f"{name} member has no field {key}"
                problem = _check_kind(f"{name}.{key}", field_value, member_kind)
                if problem:
                    return problem
        return None
    return None if ok else f"{name} is not of kind {kind.value}: {value!r}"
