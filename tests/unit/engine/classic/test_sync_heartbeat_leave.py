"""Classic SyncGroup, Heartbeat and LeaveGroup: validation, REBALANCE_IN_PROGRESS rules,
assignment encoding, timers."""

from __future__ import annotations

from translation.classic.member import ClassicMemberState
from translation.classic.messages import LeavingMember
from translation.effects import MemberFenced
from translation.member import MemberState
from translation.timers import TimerKey, TimerKind

from ..helpers import BAR, FOO, ScriptedAssignor, image, join, target
from .helpers import Classic, E, G, join_req, names


def two_members() -> tuple[Classic, ScriptedAssignor]:
    """m1 (classic) holds foo-0,1; m2 (classic) holds foo-2,3; both Stable at epoch 2."""
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4), bar=(BAR, 2)), a)
    a.next = target(m1={FOO: [0, 1, 2, 3]})
    r1 = c.joined(join_req("m1"))
    assert names(c.sync("m1", r1.generation_id)) == {"foo": [0, 1, 2, 3]}
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    r2 = c.joined(join_req("m2"))
    assert r2.generation_id == 2
    assert c.beat("m1", 1) == E.REBALANCE_IN_PROGRESS
    r1 = c.joined(join_req("m1", owned={"foo": [0, 1]}))
    assert r1.generation_id == 2
    assert names(c.sync("m1", 2)) == {"foo": [0, 1]}
    assert c.beat("m2", 2) == E.REBALANCE_IN_PROGRESS  # foo-2,3 are free now
    c.joined(join_req("m2"))
    assert names(c.sync("m2", 2)) == {"foo": [2, 3]}
    return c, a


def test_sync_validation_errors() -> None:
    c, _ = two_members()
    assert c.sync("nobody", 2).error_code == E.UNKNOWN_MEMBER_ID
    assert c.sync("m1", 1).error_code == E.ILLEGAL_GENERATION
    assert c.sync("m1", 2, protocol_name="roundrobin").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert c.sync("m1", 2, protocol_name="range").error_code == 0
    c.engine.heartbeat(join(G, "n1"), 0)
    assert c.sync("n1", 3).error_code == E.UNKNOWN_MEMBER_ID  # a new-protocol member


def test_sync_to_a_missing_group_is_unknown_member() -> None:
    c = Classic.of(image(foo=(FOO, 1)), ScriptedAssignor())
    assert c.sync("m1", 1).error_code == E.UNKNOWN_MEMBER_ID
    assert c.beat("m1", 1) == E.UNKNOWN_MEMBER_ID


def test_sync_says_rebalance_in_progress_when_the_target_moved_on() -> None:
    c, a = two_members()
    a.next = target(m1={FOO: [0]}, m2={FOO: [2, 3]}, m3={FOO: [1]})
    c.joined(join_req("m3"))
    r = c.sync("m1", 2)
    assert r.error_code == E.REBALANCE_IN_PROGRESS and r.assignment is None
    assert TimerKey(TimerKind.CLASSIC_JOIN, G, "m1") in c.engine.timers


def test_assignment_is_encoded_at_the_subscription_version_with_names() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4), bar=(BAR, 2)), a)
    a.next = target(m1={FOO: [3, 1], BAR: [0]})
    r = c.joined(join_req("m1", topics=("foo", "bar"), sub_version=1))
    s = c.sync("m1", r.generation_id)
    assert s.assignment is not None and s.assignment.version == 1
    assert s.assignment.partitions == [("bar", [0]), ("foo", [1, 3])]
    assert (s.protocol_type, s.protocol_name) == ("consumer", "range")


def test_heartbeat_is_none_when_stable_and_rearms_the_member_session() -> None:
    c, _ = two_members()
    assert c.beat("m1", 2, now=100) == E.NONE
    assert c.engine.timers.deadline(TimerKey(TimerKind.SESSION, G, "m1")) == 100 + 10_000
    assert c.beat("m1", 1) == E.ILLEGAL_GENERATION
    assert c.beat("zz", 2) == E.UNKNOWN_MEMBER_ID


def test_heartbeat_rebalance_when_the_member_must_revoke() -> None:
    c, a = two_members()
    a.next = target(m1={FOO: [0]}, m2={FOO: [2, 3]}, m3={FOO: [1]})
    r3 = c.joined(join_req("m3"))
    assert (
        r3.generation_id == 3
        and c.engine.groups[G].members["m3"].state is MemberState.UNRELEASED_PARTITIONS
    )
    # m3 waits for foo-1 held by m1: not yet worth a rejoin.
    assert c.beat("m3", 3) == E.NONE
    # m1 (cooperative) rejoins with what it owns: UNREVOKED_PARTITIONS at its old epoch.
    assert c.beat("m1", 2) == E.REBALANCE_IN_PROGRESS
    r1 = c.joined(join_req("m1", owned={"foo": [0, 1]}))
    assert r1.generation_id == 2
    assert c.engine.groups[G].members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    assert names(c.sync("m1", 2)) == {"foo": [0]}  # revoking partition not included
    assert c.beat("m1", 2) == E.REBALANCE_IN_PROGRESS
    r1 = c.joined(join_req("m1", owned={"foo": [0]}))
    assert r1.generation_id == 3
    # foo-1 is free now: m3 is told to come and collect it.
    assert c.beat("m3", 3) == E.REBALANCE_IN_PROGRESS
    c.joined(join_req("m3"))
    assert names(c.sync("m3", 3)) == {"foo": [1]}
    assert c.beat("m3", 3) == E.NONE
    # m2 keeps foo-2,3 through epoch 3: advanced in place, it keeps its generation 2.
    assert c.beat("m2", 2) == E.NONE
    m2 = c.engine.groups[G].members["m2"]
    assert m2.member_epoch == 3 and m2.classic is not None and m2.classic.generation == 2


def test_join_timer_fences_a_member_that_does_not_rejoin() -> None:
    c, a = two_members()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2]}, m3={FOO: [3]})
    c.joined(join_req("m3"))
    assert c.beat("m2", 2, now=1000) == E.REBALANCE_IN_PROGRESS
    c.beat("m1", 2, now=1000)
    c.joined(join_req("m1"), now=1000)
    c.sync("m1", 3, now=1000)
    c.joined(join_req("m3"), now=1000)
    c.sync("m3", 3, now=1000)
    effects = []
    for now in range(9_000, 31_000, 8_000):
        c.beat("m1", 3, now=now)
        c.beat("m3", 3, now=now)
        # m2 keeps heartbeating but never rejoins: told again, the join timer is not reset.
        assert c.beat("m2", 2, now=now) == E.REBALANCE_IN_PROGRESS
        effects += c.tick(now)
    effects += c.tick(31_000)  # m2's rebalance timeout (30 s) after the heartbeat at 1 s
    assert MemberFenced(G, "m2", "join-timeout") in effects


def test_each_member_keeps_its_own_session_timeout() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 2)), a)
    c.joined(join_req("m1", session_timeout_ms=6000))
    c.joined(join_req("m2", session_timeout_ms=20_000))
    fenced = [e.member_id for e in c.tick(6000) if isinstance(e, MemberFenced)]
    assert fenced == ["m1"]
    assert "m2" in c.engine.groups[G].members


def test_static_member_heartbeat_with_another_member_id_is_fenced() -> None:
    c = Classic.of(image(foo=(FOO, 2)), ScriptedAssignor())
    r = c.joined(join_req("", instance_id="i1"))
    assert c.beat("other", r.generation_id, instance_id="i1") == E.FENCED_INSTANCE_ID
    assert c.sync("other", r.generation_id, instance_id="i1").error_code == E.FENCED_INSTANCE_ID
    assert c.beat(r.member_id, r.generation_id, instance_id="i1") == E.NONE


def test_leave_removes_the_member_and_bumps_the_epoch() -> None:
    c, _ = two_members()
    group = c.engine.groups[G]
    epoch = group.group_epoch
    response = c.leave(LeavingMember("m1"), LeavingMember("zz"))
    assert [(m.member_id, m.error_code) for m in response.members] == [
        ("m1", 0),
        ("zz", E.UNKNOWN_MEMBER_ID),
    ]
    assert "m1" not in group.members and group.group_epoch == epoch + 1
    assert group.owners.owner(FOO, 0) is None


def test_leave_v0_reports_the_member_error_at_the_top() -> None:
    c, _ = two_members()
    assert c.leave(LeavingMember("zz"), version=1).error_code == E.UNKNOWN_MEMBER_ID
    assert c.leave(LeavingMember("m1"), version=1).error_code == 0


def test_leave_static_by_instance_id_and_fencing() -> None:
    c = Classic.of(image(foo=(FOO, 2)), ScriptedAssignor())
    r = c.joined(join_req("", instance_id="i1"))
    bad = c.leave(LeavingMember("other", "i1"))
    assert bad.members[0].error_code == E.FENCED_INSTANCE_ID
    admin = c.leave(LeavingMember("", "i1"))  # administrative removal by instance id
    assert admin.members[0].error_code == 0 and admin.members[0].member_id == r.member_id
    assert not c.engine.groups[G].members


def test_leave_of_a_new_protocol_member_is_refused() -> None:
    c, _ = two_members()
    c.engine.heartbeat(join(G, "n1"), 0)
    assert c.leave(LeavingMember("n1")).members[0].error_code == E.UNKNOWN_MEMBER_ID
    assert c.leave(LeavingMember("m1")).members[0].error_code == 0


def test_state_machine_prepare_completing_stable() -> None:
    c, a = two_members()
    meta = c.engine.groups[G].members["m1"].classic
    assert meta is not None and meta.state is ClassicMemberState.STABLE
    a.next = target(m1={FOO: [0]}, m2={FOO: [2, 3]}, m3={FOO: [1]})
    c.joined(join_req("m3"))
    assert c.beat("m1", 2) == E.REBALANCE_IN_PROGRESS
    assert meta.state is ClassicMemberState.PREPARE_REBALANCE
    c.joined(join_req("m1"))
    assert meta.state is ClassicMemberState.COMPLETING_REBALANCE
    c.sync("m1", 3)
    assert meta.state is ClassicMemberState.STABLE


def test_rebalance_timeout_fences_a_cooperative_member_stuck_in_revocation() -> None:
    c, a = two_members()
    a.next = target(m1={FOO: [0]}, m2={FOO: [2, 3]}, m3={FOO: [1]})
    c.joined(join_req("m3"))
    c.joined(join_req("m1", owned={"foo": [0, 1]}, rebalance_timeout_ms=4000), now=100)
    effects = c.tick(4100)
    assert MemberFenced(G, "m1", "rebalance-timeout") in effects
