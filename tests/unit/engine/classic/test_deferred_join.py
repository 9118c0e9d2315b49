"""Deferred JoinGroup: held while the target waits for the assignment interval, completed by
whatever computes the target (timer, another member's request), or failed when the member goes."""

from __future__ import annotations

from translation.classic.member import ClassicMemberState
from translation.classic.messages import HeldRequest, JoinGroupResponse, LeavingMember
from translation.effects import JoinCompleted

from ..helpers import FOO, ScriptedAssignor, image, join, target
from .helpers import Classic, E, G, join_req, names


def batched() -> tuple[Classic, ScriptedAssignor]:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, assignment_interval_ms=1000)
    a.next = target(m1={FOO: [0, 1, 2, 3]})
    r = c.joined(join_req("m1"), now=0)  # first computation runs at once
    c.sync("m1", r.generation_id)
    return c, a


def test_join_is_held_until_the_assignment_timer_computes_the_target() -> None:
    c, a = batched()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    # held: the proxy holds the request
    assert isinstance(c.join(join_req("m2"), now=100), HeldRequest)
    meta = c.engine.groups[G].members["m2"].classic
    assert meta is not None and meta.state is ClassicMemberState.PREPARE_REBALANCE
    assert c.engine.next_deadline() == 1000
    effects = c.tick(1000)
    done = [e for e in effects if isinstance(e, JoinCompleted)]
    assert len(done) == 1 and done[0].member_id == "m2"
    response = done[0].response
    assert response.error_code == 0 and response.generation_id == 2
    assert response.protocol_name == "range"
    assert meta.state is ClassicMemberState.COMPLETING_REBALANCE
    # One loop: m2's SyncGroup is held until m1 lets go of foo-2,3, then answered with them.
    assert isinstance(c.sync("m2", 2, now=1001), HeldRequest)
    assert c.beat("m2", 2, now=1002) == E.NONE  # heartbeats while held keep the session
    assert c.beat("m1", 1, now=1003) == E.REBALANCE_IN_PROGRESS
    assert "m2" not in c.synced()
    c.joined(join_req("m1", owned={"foo": [0, 1]}), now=1004)
    assert names(c.synced()["m2"]) == {"foo": [2, 3]}
    assert meta.state is ClassicMemberState.STABLE


def test_another_members_request_completes_the_held_join() -> None:
    c, a = batched()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    assert isinstance(c.join(join_req("m2"), now=100), HeldRequest)
    c.effects.clear()
    assert c.beat("m1", 1, now=1500) == E.REBALANCE_IN_PROGRESS  # computes the target
    assert c.completed()["m2"].generation_id == 2


def test_new_protocol_heartbeat_completes_the_held_join() -> None:
    c, a = batched()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]}, n1={})
    assert isinstance(c.join(join_req("m2"), now=100), HeldRequest)
    _, effects = c.engine.heartbeat(join(G, "n1"), 1200)
    assert [e.member_id for e in effects if isinstance(e, JoinCompleted)] == ["m2"]


def test_a_held_join_fails_when_its_member_is_removed() -> None:
    c, _a = batched()
    assert isinstance(c.join(join_req("m2", session_timeout_ms=6000), now=100), HeldRequest)
    c.effects.clear()
    c.leave(LeavingMember("m2"), now=200)
    assert c.completed()["m2"].error_code == E.UNKNOWN_MEMBER_ID
    c.effects.clear()
    c.tick(1000)
    assert "m2" not in c.completed()


def test_a_second_join_answers_the_first_one() -> None:
    c, _a = batched()
    assert isinstance(c.join(join_req("m2"), now=100), HeldRequest)
    c.effects.clear()
    assert isinstance(c.join(join_req("m2"), now=200), HeldRequest)
    assert c.completed()["m2"].error_code == E.REBALANCE_IN_PROGRESS
    c.effects.clear()
    c.tick(1000)
    assert c.completed()["m2"].error_code == 0


def test_deferral_can_be_switched_off() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, assignment_interval_ms=1000, defer_classic_join=False)
    c.joined(join_req("m1"))
    r = c.joined(join_req("m2"), now=100)
    assert r.generation_id == 1  # the old target's epoch; it will be asked to rejoin later
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    c.tick(1000)
    assert c.beat("m2", 1, now=1001) == E.REBALANCE_IN_PROGRESS


def test_a_failing_assignor_never_strands_a_join() -> None:
    class Failing(ScriptedAssignor):
        def assign(self, group, topics):  # type: ignore[no-untyped-def]
            from translation.assignors.base import AssignorError

            raise AssignorError("boom")

    c = Classic.of(image(foo=(FOO, 4)), Failing(), assignment_interval_ms=0)
    r = c.join(join_req("m1"))
    # answered at the current (failed) target
    assert isinstance(r, JoinGroupResponse) and r.error_code == 0


def test_completed_join_clears_the_join_timer() -> None:
    c, a = batched()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    assert isinstance(c.join(join_req("m2"), now=100), HeldRequest)
    # A SyncGroup while the join is held (a confused client) is told to rejoin, without
    # starting a join timer that would outlive the held join.
    assert c.sync("m2", 0, now=150).error_code == E.REBALANCE_IN_PROGRESS
    assert c.beat("m2", 0, now=160) == E.NONE
    c.tick(1000)
    assert c.completed()["m2"].error_code == 0
    from translation.timers import TimerKey, TimerKind

    assert TimerKey(TimerKind.CLASSIC_JOIN, G, "m2") not in c.engine.timers


def test_a_held_join_fails_when_a_new_protocol_member_takes_its_instance_id() -> None:
    a = ScriptedAssignor()
    c = Classic.of(
        image(foo=(FOO, 4)), a, assignment_interval_ms=1000, member_id_factory=lambda: "s1"
    )
    c.joined(join_req("m1"))
    assert isinstance(c.join(join_req("", instance_id="i1"), now=100), HeldRequest)
    c.effects.clear()
    _, effects = c.engine.heartbeat(join(G, "n1", instance_id="i1"), 200)
    done = [e for e in effects if isinstance(e, JoinCompleted)]
    assert [(e.member_id, e.response.error_code) for e in done] == [("s1", E.UNKNOWN_MEMBER_ID)]
    assert "s1" not in c.engine.groups[G].members and G in c.engine.groups
