"""The journal schema: one kind per field, compact JSON values, and what a reader refuses."""

from __future__ import annotations

import json

import pytest

from proxy.journal.schema import (
    COMMON,
    FIELD_KINDS,
    FIELDS,
    SCHEMA_VERSION,
    Event,
    EventType,
    SchemaError,
    check,
    decode,
)


def test_every_field_has_a_kind_and_every_type_its_fields() -> None:
    assert set(FIELDS) == set(EventType)
    for event_type, names in FIELDS.items():
        assert len(set(names)) == len(names), event_type
        for name in names:
            assert name in FIELD_KINDS and name not in COMMON, (event_type, name)
    used = {n for names in FIELDS.values() for n in names} | set(COMMON)
    assert used == set(FIELD_KINDS)


def test_encoding_is_compact_and_leaves_out_empty_fields() -> None:
    event = Event(EventType.ASSIGNMENT, "orders", 1_700_000_000_123, "p1:9092", 42, {
        "member": "m-1", "member_epoch": 3, "state": "stable", "assigned": {"t": [0, 2]},
        "revoked": {}, "released": None, "revoking": {}})
    raw = event.encode()
    assert raw == (b'{"v":1,"type":"assignment","ts":1700000000123,"group":"orders",'
                   b'"source":"p1:9092","seq":42,"member":"m-1","member_epoch":3,'
                   b'"state":"stable","assigned":{"t":[0,2]}}')
    back = decode(raw)
    assert back.type is EventType.ASSIGNMENT and back.group == "orders"
    assert back.fields == {"member": "m-1", "member_epoch": 3, "state": "stable",
                           "assigned": {"t": [0, 2]}}
    assert event.key == b"orders"


def test_non_ascii_group_ids_stay_utf8() -> None:
    event = Event(EventType.GROUP_EXPIRED, "grüppe", 1, "s", 1, {})
    assert "grüppe".encode() in event.encode()
    assert decode(event.encode()).group == "grüppe"


@pytest.mark.parametrize(("value", "problem"), [
    ({"v": 2, "type": "group_expired"}, "schema version 2"),
    ({"v": SCHEMA_VERSION, "type": "group_exploded"}, "unknown event type"),
    ({"v": 1, "type": "group_expired", "ts": 1, "group": "g", "source": "s"}, "missing seq"),
    ({"v": 1, "type": "group_expired", "ts": 1, "group": "g", "source": "s", "seq": 1,
      "member": "m"}, "has no field member"),
    ({"v": 1, "type": "assignment", "ts": 1, "group": "g", "source": "s", "seq": 1,
      "assigned": {"t": ["0"]}}, "assigned is not of kind partitions"),
    ({"v": 1, "type": "member_left", "ts": 1, "group": "g", "source": "s", "seq": 1,
      "static": 1}, "static is not of kind bool"),
    ({"v": 1, "type": "group_state", "ts": True, "group": "g", "source": "s", "seq": 1},
     "ts is not of kind int"),
    ({"v": 1, "type": "group_snapshot", "ts": 1, "group": "g", "source": "s", "seq": 1,
      "members": [{"member": "m", "color": "red"}]}, "members member has no field color"),
])
def test_refused(value: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in check(value)), check(value)
    with pytest.raises(SchemaError):
        decode(json.dumps(value))


def test_not_json_is_refused() -> None:
    with pytest.raises(SchemaError):
        decode(b"\xff{")
    with pytest.raises(SchemaError):
        decode(b"[1, 2]")


def test_new_event_types_are_version_2_and_old_ones_stay_version_1() -> None:
    converted = Event(EventType.GROUP_CONVERTED, "orders", 1, "s", 1, {
        "group_epoch": 5, "assignor": "range", "member_count": 2, "member_ids": ["a", "b"]})
    value = json.loads(converted.encode())
    assert value["v"] == 2
    assert decode(converted.encode()).fields["member_ids"] == ["a", "b"]
    aborted = Event(EventType.CONVERSION_ABORTED, "orders", 1, "s", 2,
                    {"group_epoch": 5, "reason": "a member is direct"})
    assert json.loads(aborted.encode())["v"] == 2
    released = Event(EventType.GROUP_RELEASED, "orders", 1, "s", 4, {
        "reason": "groupgate release", "assignor": "range", "member_count": 1,
        "member_ids": ["a"]})
    assert json.loads(released.encode())["v"] == 2
    assert json.loads(Event(EventType.GROUP_EXPIRED, "g", 1, "s", 3, {}).encode())["v"] == 1
    # a version-1 reader skips them: they are not version-1 events
    assert check(dict(value, v=1))
