"""The observer's events for scripted engine calls: the KIP's basic case study, fencing,
expiry, deletion, static members, conversion from and hand-back to the broker's classic group,
groups passed through, snapshots and client software."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from proxy.journal import observer as observer_mod
from proxy.journal.observer import JournalObserver
from proxy.journal.schema import Event, EventType, check
from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import ClassicAssignment, ClassicProtocol
from translation.classic.migration import (
    ClassicGroupMemberSnapshot,
    ClassicGroupSnapshot,
    convert_classic_group,
)
from translation.config import MigrationPolicy
from translation.coordinator import GroupCoordinator
from translation.effects import Effect
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from ..engine.classic.helpers import join_req, subscription
from ..engine.helpers import FOO, ScriptedAssignor, hb, image, join, make_engine, target

G = "grp"
T0 = 1_700_000_000_000


class Journaled:
    """An engine with an observer attached; every call's events are kept."""

    def __init__(self, engine: GroupCoordinator, **observer_args: Any) -> None:
        self.engine = engine
        self.observer = JournalObserver(source="proxy-a:9092", **observer_args)
        self.observer.attach(engine)
        self.events: list[Event] = []

    def observe(self, effects: list[Effect], wall: int) -> list[Event]:
        batch = self.observer.observe(effects, wall)
        for event in batch:
            assert check(event.to_value()) == [], event
        self.events.extend(batch)
        return batch

    def heartbeat(self, request: ConsumerGroupHeartbeatRequest, now: int) -> list[Event]:
        _, effects = self.engine.heartbeat(request, now)
        return self.observe(effects, T0 + now)

    def tick(self, now: int) -> list[Event]:
        return self.observe(self.engine.tick(now), T0 + now)


def kinds(events: list[Event]) -> list[str]:
    return [e.type.value for e in events]


def one(events: list[Event], event_type: EventType) -> dict[str, Any]:
    found = [e for e in events if e.type is event_type]
    assert len(found) == 1, kinds(events)
    return dict(found[0].fields)


def test_basic_case_study() -> None:
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 3)), assignor))

    assignor.next = target(A={FOO: [0, 1, 2]})
    events = j.heartbeat(join(G, "A"), 0)
    assert kinds(events) == ["group_created", "member_joined", "epoch_bumped",
                             "target_computed", "assignment", "group_state"]
    assert all(e.ts == T0 and e.group == G and e.source == "proxy-a:9092" for e in events)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert one(events, EventType.GROUP_CREATED) == {"group_epoch": 0, "converted": False}
    joined = one(events, EventType.MEMBER_JOINED)
    assert (joined["member"], joined["protocol"], joined["topics"], joined["assigned"]) == \
        ("A", "consumer", ["foo"], {})
    assert one(events, EventType.EPOCH_BUMPED)["group_epoch"] == 1
    assert one(events, EventType.ASSIGNMENT)["assigned"] == {"foo": [0, 1, 2]}
    assert one(events, EventType.GROUP_STATE) == {
        "state": "Stable", "group_epoch": 1, "assignment_epoch": 1, "member_count": 1}

    # B joins: A keeps everything for now, B waits for foo-2.
    assignor.next = target(A={FOO: [0, 1]}, B={FOO: [2]})
    events = j.heartbeat(join(G, "B"), 10)
    assert kinds(events) == ["member_joined", "epoch_bumped", "target_computed", "assignment",
                             "group_state"]
    assert one(events, EventType.ASSIGNMENT) == {
        "member": "B", "member_epoch": 2, "state": "unreleased_partitions", "assigned": {},
        "revoked": {}, "released": {}, "revoking": {}}
    assert one(events, EventType.GROUP_STATE)["state"] == "Reconciling"

    # A is told to revoke foo-2, then acknowledges; B gets it.
    events = j.heartbeat(hb(G, "A", 1, {FOO: [0, 1, 2]}), 20)
    assert one(events, EventType.ASSIGNMENT) == {
        "member": "A", "member_epoch": 1, "state": "unrevoked_partitions", "assigned": {},
        "revoked": {"foo": [2]}, "released": {}, "revoking": {"foo": [2]}}
    events = j.heartbeat(hb(G, "A", 1, {FOO: [0, 1]}), 30)
    assert one(events, EventType.ASSIGNMENT)["released"] == {"foo": [2]}
    assert "group_state" not in kinds(events)  # still Reconciling: B waits
    events = j.heartbeat(hb(G, "B", 2, {}), 40)
    assert one(events, EventType.ASSIGNMENT)["assigned"] == {"foo": [2]}
    assert one(events, EventType.GROUP_STATE)["state"] == "Stable"
    assert j.events[-1].ts == T0 + 40

    # Steady heartbeats: nothing.
    assert j.heartbeat(hb(G, "A", 2, {FOO: [0, 1]}), 50) == []
    assert j.heartbeat(hb(G, "B", 2, {FOO: [2]}), 60) == []


def test_a_member_fenced_pod_local_is_journaled_with_its_reason() -> None:
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 2)), assignor, session_timeout_ms=60_000))
    assignor.next = target(A={FOO: [0, 1]})
    j.heartbeat(join(G, "A"), 0)
    error, effects = j.engine.fence_member(G, "A", 1, "pod-local", 100)
    assert error == 0
    events = j.observe(effects, T0 + 100)
    fenced = one(events, EventType.MEMBER_FENCED)
    assert (fenced["member"], fenced["reason"], fenced["released"]) == \
        ("A", "pod-local", {"foo": [0, 1]})


def test_fenced_member_and_group_expiry() -> None:
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 2)), assignor, session_timeout_ms=1_000,
                              empty_group_expiry_ms=5_000))
    assignor.next = target(A={FOO: [0, 1]})
    j.heartbeat(join(G, "A"), 0)
    events = j.tick(1_000)
    assert kinds(events) == ["epoch_bumped", "member_fenced", "group_state"]
    fenced = one(events, EventType.MEMBER_FENCED)
    assert (fenced["member"], fenced["reason"], fenced["revoked"], fenced["released"]) == \
        ("A", "session-timeout", {"foo": [0, 1]}, {"foo": [0, 1]})
    assert one(events, EventType.GROUP_STATE)["state"] == "Empty"
    assert kinds(j.tick(6_000)) == ["group_expired"]
    assert G not in j.engine.groups


def test_leave_and_delete() -> None:
    j = Journaled(make_engine(image(foo=(FOO, 2)), ScriptedAssignor()))
    j.heartbeat(join(G, "A"), 0)
    events = j.heartbeat(ConsumerGroupHeartbeatRequest(G, "A", -1), 10)
    left = one(events, EventType.MEMBER_LEFT)
    assert (left["member"], left["static"]) == ("A", False)
    code, effects = j.engine.delete_group(G)
    assert code == 0
    assert kinds(j.observe(effects, T0 + 20)) == ["group_deleted"]


def test_static_member_leaves_for_a_while_and_comes_back_under_a_new_id() -> None:
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 2)), assignor))
    assignor.next = target(A={FOO: [0, 1]})
    j.heartbeat(join(G, "A", instance_id="i-1"), 0)
    events = j.heartbeat(ConsumerGroupHeartbeatRequest(G, "A", -2, instance_id="i-1"), 10)
    left = one(events, EventType.MEMBER_LEFT)
    assert (left["static"], left["revoked"], left["released"]) == (True, {"foo": [0, 1]}, {})
    events = j.heartbeat(join(G, "A2", instance_id="i-1"), 20)
    replaced = one(events, EventType.MEMBER_REPLACED)
    assert (replaced["member"], replaced["replaced"], replaced["instance"],
            replaced["assigned"], replaced["replaced_protocol"]) == \
        ("A2", "A", "i-1", {"foo": [0, 1]}, "consumer")
    assert "member_joined" not in kinds(events)


def test_static_member_back_in_place_consumes_again() -> None:
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 2)), assignor))
    assignor.next = target(A={FOO: [0, 1]})
    j.heartbeat(join(G, "A", instance_id="i-1"), 0)
    j.heartbeat(ConsumerGroupHeartbeatRequest(G, "A", -2, instance_id="i-1"), 10)
    events = j.heartbeat(join(G, "A", instance_id="i-1"), 20)
    assert one(events, EventType.ASSIGNMENT)["assigned"] == {"foo": [0, 1]}


def classic_snapshot() -> ClassicGroupSnapshot:
    return ClassicGroupSnapshot(G, 7, "consumer", "range", [
        ClassicGroupMemberSnapshot("c1", [ClassicProtocol("range", subscription(("foo",)))],
                                   ClassicAssignment(1, [("foo", [0, 1])]), client_id="app"),
        ClassicGroupMemberSnapshot("c2", [ClassicProtocol("range", subscription(("foo",)))],
                                   ClassicAssignment(1, [("foo", [2, 3])])),
    ])


def test_a_converted_classic_group() -> None:
    engine = make_engine(image(foo=(FOO, 4)), ScriptedAssignor())
    ClassicGroupCoordinator(engine)
    j = Journaled(engine)
    refusal, effects = convert_classic_group(engine, classic_snapshot(), 0)
    assert refusal is None
    events = j.observe(effects, T0)
    assert kinds(events) == ["group_created", "member_joined", "member_joined", "group_state"]
    assert one(events, EventType.GROUP_CREATED) == {"group_epoch": 7, "converted": True}
    c1 = next(e.fields for e in events if e.fields.get("member") == "c1")
    assert (c1["protocol"], c1["assignor"], c1["client_id"], c1["assigned"],
            c1["member_epoch"]) == ("classic", "range", "app", {"foo": [0, 1]}, 7)
    assert one(events, EventType.GROUP_STATE)["state"] == "Stable"


def test_handed_back_to_the_broker() -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), assignor,
                         migration_policy=MigrationPolicy.BIDIRECTIONAL,
                         adopt_classic_groups=False)
    classic = ClassicGroupCoordinator(engine)
    j = Journaled(engine)
    assignor.next = target(c1={FOO: [0, 1]}, n1={FOO: [2, 3]})
    _, effects = classic.join_group(join_req("c1"), 0)
    j.observe(effects, T0)
    j.heartbeat(join(G, "n1"), 0)
    events = j.heartbeat(ConsumerGroupHeartbeatRequest(G, "n1", -1), 10)
    back = one(events, EventType.GROUP_HANDED_BACK)
    assert back["member_ids"] == ["c1"] and back["reason"]
    assert kinds(events)[-2:] == ["member_left", "group_handed_back"]
    assert [e.seq for e in events] == sorted(e.seq for e in events)


@dataclass(frozen=True, slots=True)
class GroupLost:
    """A way of forgetting a group that this observer has no case for."""

    group_id: str
    reason: str


def test_a_group_forgotten_another_way() -> None:
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 2)), assignor))
    assignor.next = target(A={FOO: [0, 1]})
    j.heartbeat(join(G, "A"), 0)
    effects: list[Effect] = []
    group = j.engine.groups[G]
    j.engine.drop_group(group, GroupLost(G, "lock lost"), effects)  # type: ignore[arg-type]
    dropped = one(j.observe(effects, T0 + 5), EventType.GROUP_DROPPED)
    assert dropped == {"how": "lost", "reason": "lock lost", "member_ids": ["A"],
                       "revoked": {"foo": [0, 1]}}


def test_passed_through_once_per_group_and_reason() -> None:
    j = Journaled(make_engine(image(foo=(FOO, 2)), ScriptedAssignor()),
                  software=lambda host, client: ("apache-kafka-java", "3.9.1"),
                  passed_through_repeat_ms=60_000)
    first = j.observer.passed_through("connect-cluster", "protocol type 'connect'", T0,
                                      protocol_type="connect", client_id="worker-1",
                                      client_host="/10.0.0.5")
    assert one(first, EventType.GROUP_PASSED_THROUGH) == {
        "reason": "protocol type 'connect'", "protocol_type": "connect", "assignor": None,
        "client_id": "worker-1", "client_host": "/10.0.0.5",
        "software_name": "apache-kafka-java", "software_version": "3.9.1"}
    assert j.observer.passed_through("connect-cluster", "protocol type 'connect'",
                                     T0 + 59_999) == []
    assert len(j.observer.passed_through("connect-cluster", "another reason", T0 + 1)) == 1
    assert len(j.observer.passed_through("connect-cluster", "another reason", T0 + 60_001)) == 1


def test_passed_through_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observer_mod, "PASSED_THROUGH_REMEMBERED", 3)
    j = Journaled(make_engine(image(foo=(FOO, 2)), ScriptedAssignor()))
    for i in range(10):
        j.observer.passed_through(f"g{i}", "r", T0)
    assert len(j.observer._passed) == 3
    assert j.observer.passed_through("g0", "r", T0) != []  # forgotten, so written again
    assert j.observer.passed_through("g9", "r", T0) == []


def test_snapshot_in_parts_with_client_software(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observer_mod, "SNAPSHOT_MEMBERS_PER_EVENT", 2)
    software = {("/10.0.0.1", "app"): ("librdkafka", "2.16.1")}
    assignor = ScriptedAssignor()
    j = Journaled(make_engine(image(foo=(FOO, 5)), assignor),
                  software=lambda host, client: software.get((host, client)))
    for i in range(5):
        assignor.next = target(**{f"m{k}": {FOO: [k]} for k in range(i + 1)})
        j.heartbeat(replace(join(G, f"m{i}"), client_id="app", client_host="/10.0.0.1"), i)
    parts = j.observer.snapshot(G, T0 + 100)
    assert [(e.fields["part"], e.fields["parts"]) for e in parts] == [(1, 3), (2, 3), (3, 3)]
    members = [m for e in parts for m in e.fields["members"]]
    assert sorted(m["member"] for m in members) == ["m0", "m1", "m2", "m3", "m4"]
    assert all(m["software_name"] == "librdkafka" and m["software_version"] == "2.16.1"
               and m["protocol"] == "consumer" for m in members)
    m0 = next(m for m in members if m["member"] == "m0")
    assert m0["assigned"] == {"foo": [0]}
    assert all(e.fields["member_count"] == 5 and e.type is EventType.GROUP_SNAPSHOT
               for e in parts)
    assert all(check(e.to_value()) == [] for e in parts)
    assert j.observer.snapshot("no-such-group", T0) == []


def test_released_to_the_broker() -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), assignor)
    classic = ClassicGroupCoordinator(engine)
    j = Journaled(engine)
    assignor.next = target(c1={FOO: [0, 1]}, n1={FOO: [2, 3]})
    _, effects = classic.join_group(join_req("c1", protocols=("range",)), 0)
    j.observe(effects, T0)
    j.heartbeat(join(G, "n1"), 0)
    _released, effects = classic.release(G, "groupgate release")
    events = j.observe(effects, T0 + 10)
    released = one(events, EventType.GROUP_RELEASED)
    assert released["member_ids"] == ["c1", "n1"] and released["member_count"] == 2
    assert released["assignor"] == "range" and released["reason"] == "groupgate release"
