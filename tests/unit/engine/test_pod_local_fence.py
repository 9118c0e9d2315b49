"""fence_member: a member fenced as at its session timeout, for a reason (pod-local liveness,
docs/decisions/0020-pod-local-liveness.md), only at the epoch observed."""

from __future__ import annotations

from translation.effects import MemberFenced
from translation.errors import ErrorCode

from .helpers import FOO, ScriptedAssignor, hb, image, join, make_engine, target

G = "g"


def test_fenced_at_the_observed_epoch_and_its_partitions_move() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=60_000)
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(join(G, "m1"), 0)
    engine.heartbeat(hb(G, "m1", 1), 10)
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 20)
    error, effects = engine.fence_member(G, "m1", 1, "pod-local", 30)
    assert error is ErrorCode.NONE
    assert MemberFenced(G, "m1", "pod-local") in effects
    group = engine.groups[G]
    assert "m1" not in group.members
    # progress: the survivor gets everything at its next heartbeat, long before a session
    a.next = target(m2={FOO: [0, 1]})
    response, _ = engine.heartbeat(hb(G, "m2", 2), 40)
    assert response.error_code == 0
    assert group.owners.owner(FOO, 0) == "m2" and group.owners.owner(FOO, 1) == "m2"


def test_a_member_that_moved_on_is_not_fenced() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=60_000)
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(join(G, "m1"), 0)  # epoch 1
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 10)  # group epoch 2
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 20)  # revoking foo-1
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 30)  # epoch 2
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m3"), 40)  # group epoch 3
    response, _ = engine.heartbeat(hb(G, "m1", 2, {FOO: [0]}), 50)
    assert response.member_epoch == 3
    # observed at epoch 1, the member has sent two heartbeats since: it moved on
    error, effects = engine.fence_member(G, "m1", 1, "pod-local", 60)
    assert error is ErrorCode.FENCED_MEMBER_EPOCH and effects == []
    assert "m1" in engine.groups[G].members
    # the heartbeat whose answer moved it on is the last observation: still fenced
    error, effects = engine.fence_member(G, "m1", 2, "pod-local", 70)
    assert error is ErrorCode.NONE and MemberFenced(G, "m1", "pod-local") in effects
    error, _ = engine.fence_member(G, "nobody", 1, "pod-local", 20)
    assert error is ErrorCode.UNKNOWN_MEMBER_ID


def test_static_members_and_suspended_groups_are_not_fenced() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=60_000)
    a.next = target(s={FOO: [0, 1]})
    engine.heartbeat(join(G, "s", instance_id="i-1"), 0)
    error, _ = engine.fence_member(G, "s", 1, "pod-local", 10)
    assert error is ErrorCode.FENCED_INSTANCE_ID and "s" in engine.groups[G].members
    a.next = target(s={FOO: [0]}, m={FOO: [1]})
    engine.heartbeat(join(G, "m"), 20)
    engine.suspend(G)
    error, _ = engine.fence_member(G, "m", 2, "pod-local", 30)
    assert error is ErrorCode.COORDINATOR_NOT_AVAILABLE and "m" in engine.groups[G].members
    engine.resume(G, 40)
    error, effects = engine.fence_member(G, "m", 2, "pod-local", 50)
    assert error is ErrorCode.NONE and MemberFenced(G, "m", "pod-local") in effects


def test_a_member_whose_request_is_inside_the_proxy_is_not_fenced() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=60_000)
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(join(G, "m1"), 0)
    engine.request_arrived(G, "m1", 5)
    error, _ = engine.fence_member(G, "m1", 1, "pod-local", 10)
    assert error is ErrorCode.REBALANCE_IN_PROGRESS
    engine.request_left(G, "m1", 15)
    error, _ = engine.fence_member(G, "m1", 1, "pod-local", 20)
    assert error is ErrorCode.NONE
