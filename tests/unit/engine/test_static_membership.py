"""Static membership: epoch -2 leave, replacement under a new member id, the errors."""

from __future__ import annotations

from dataclasses import replace

from translation.effects import MemberFenced, MemberLeft, MemberReplaced
from translation.errors import ErrorCode
from translation.group import GroupState

from .helpers import FOO, ScriptedAssignor, assignment, hb, image, join, make_engine, parts, target

G = "g"


def setup():  # type: ignore[no-untyped-def]
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), a, session_timeout_ms=45_000)
    a.next = target(s1={FOO: [0, 1]}, d1={FOO: [2, 3]})
    engine.heartbeat(join(G, "s1", instance_id="i1"), 0)
    engine.heartbeat(join(G, "d1"), 0)
    group = engine.groups[G]
    engine.heartbeat(replace(hb(G, "s1", group.members["s1"].member_epoch), instance_id="i1"), 1)
    return engine, a, group


def static_leave(member_id: str, instance_id: str):  # type: ignore[no-untyped-def]
    return replace(hb(G, member_id, -2), instance_id=instance_id)


def test_static_leave_keeps_the_partitions_and_does_not_bump() -> None:
    engine, _a, group = setup()
    epoch = group.group_epoch
    resp, effects = engine.heartbeat(static_leave("s1", "i1"), 10)
    assert (resp.error_code, resp.member_epoch) == (0, -2)
    assert MemberLeft(G, "s1", static=True) in effects
    s1 = group.members["s1"]
    assert s1.member_epoch == -2 and parts(s1) == {FOO: [0, 1]}
    assert group.group_epoch == epoch
    assert group.owners.owner(FOO, 0) == "s1"  # nobody else can get them


def test_static_member_rejoins_under_a_new_member_id_and_inherits_its_assignment() -> None:
    engine, _a, group = setup()
    epoch = group.group_epoch
    engine.heartbeat(static_leave("s1", "i1"), 10)
    resp, effects = engine.heartbeat(join(G, "s2", instance_id="i1"), 20)
    assert resp.error_code == 0
    assert (resp.member_epoch, assignment(resp)) == (epoch, {FOO: [0, 1]})
    assert MemberReplaced(G, "s1", "s2", "i1") in effects
    assert "s1" not in group.members and group.static_members == {"i1": "s2"}
    assert group.group_epoch == epoch  # no rebalance for a bounce
    assert group.target.of("s2") == {FOO: frozenset({0, 1})}
    # Relaxed fencing: the new member holds them from epoch 0; the old member id is gone.
    assert group.members["s2"].assignment_epoch(FOO, 0) == 0
    assert engine.validate_offset_commit(G, "s2", epoch, [(FOO, 0)]) is ErrorCode.NONE
    assert engine.validate_offset_commit(G, "s1", epoch, [(FOO, 0)]) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.state is GroupState.STABLE


def test_unreleased_instance_id() -> None:
    engine, _a, group = setup()
    resp, _ = engine.heartbeat(join(G, "s2", instance_id="i1"), 20)
    assert resp.error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    assert "s2" not in group.members and group.static_members == {"i1": "s1"}


def test_unknown_and_fenced_instance_ids() -> None:
    engine, _a, group = setup()
    epoch = group.members["s1"].member_epoch
    resp, _ = engine.heartbeat(replace(hb(G, "s1", epoch), instance_id="other"), 20)
    assert resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    resp, _ = engine.heartbeat(replace(hb(G, "zz", epoch), instance_id="i1"), 20)
    assert resp.error_code == ErrorCode.FENCED_INSTANCE_ID
    resp, _ = engine.heartbeat(static_leave("zz", "i1"), 20)
    assert resp.error_code == ErrorCode.FENCED_INSTANCE_ID
    resp, _ = engine.heartbeat(static_leave("s1", "nope"), 20)
    assert resp.error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_that_does_not_come_back_expires() -> None:
    engine, _a, group = setup()
    epoch = group.group_epoch
    engine.heartbeat(static_leave("s1", "i1"), 10)
    engine.heartbeat(hb(G, "d1", group.members["d1"].member_epoch), 40_000)
    assert engine.tick(45_009) == []
    effects = engine.tick(45_010)
    assert MemberFenced(G, "s1", "session-timeout") in effects
    assert "s1" not in group.members and group.static_members == {}
    assert group.group_epoch == epoch + 1 and group.owners.owner(FOO, 0) is None


def test_static_member_can_leave_for_good_with_minus_one() -> None:
    engine, _a, group = setup()
    resp, _ = engine.heartbeat(replace(hb(G, "s1", -1), instance_id="i1"), 10)
    assert resp.error_code == 0 and "s1" not in group.members and group.static_members == {}
    resp, _ = engine.heartbeat(join(G, "s2", instance_id="i1"), 20)
    assert resp.error_code == 0


def test_a_dynamic_member_rejoining_with_an_instance_id_becomes_static() -> None:
    engine, _, group = setup()
    resp, _ = engine.heartbeat(join(G, "d1", instance_id="i9"), 30)
    assert resp.error_code == 0
    assert group.members["d1"].instance_id == "i9" and group.static_members["i9"] == "d1"
    resp, _ = engine.heartbeat(join(G, "other", instance_id="i9"), 31)
    assert resp.error_code == ErrorCode.UNRELEASED_INSTANCE_ID
