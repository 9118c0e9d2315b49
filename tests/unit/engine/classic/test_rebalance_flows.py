"""Classic members through whole rebalances: eager vs cooperative, static bounces, a member
stuck in revocation, assignments filtered to the subscription."""

from __future__ import annotations

from translation.classic.messages import HeldRequest
from translation.effects import GroupEpochBumped, MemberReplaced
from translation.member import MemberState

from ..helpers import BAR, FOO, ScriptedAssignor, image, join, parts, target
from .helpers import Classic, E, G, join_req, names


def start(c: Classic, a: ScriptedAssignor) -> None:
    """m1 alone owns foo-0..3 (Stable, epoch 1)."""
    a.next = target(m1={FOO: [0, 1, 2, 3]})
    r = c.joined(join_req("m1"))
    assert names(c.sync("m1", r.generation_id)) == {"foo": [0, 1, 2, 3]}


def test_eager_member_revokes_everything_and_moves_in_one_join() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a)
    start(c, a)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    assert c.joined(join_req("m2")).generation_id == 2
    assert c.beat("m1", 1) == E.REBALANCE_IN_PROGRESS
    # Eager: onPartitionsRevoked for everything, JoinGroup without owned partitions.
    r = c.joined(join_req("m1", owned={}))
    assert r.generation_id == 2  # no UNREVOKED_PARTITIONS detour
    assert names(c.sync("m1", 2)) == {"foo": [0, 1]}
    assert c.engine.groups[G].owners.owner(FOO, 2) is None
    assert c.beat("m2", 2) == E.REBALANCE_IN_PROGRESS
    c.joined(join_req("m2"))
    assert names(c.sync("m2", 2)) == {"foo": [2, 3]}


def test_cooperative_member_goes_through_unrevoked_partitions() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a)
    start(c, a)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    c.joined(join_req("m2"))
    assert c.beat("m1", 1) == E.REBALANCE_IN_PROGRESS
    # Cooperative: JoinGroup with what it owns; stays at epoch 1 until it revokes.
    r = c.joined(join_req("m1", owned={"foo": [0, 1, 2, 3]}))
    m1 = c.engine.groups[G].members["m1"]
    assert r.generation_id == 1 and m1.state is MemberState.UNREVOKED_PARTITIONS
    assert names(c.sync("m1", 1)) == {"foo": [0, 1]}  # keeps 0,1; must revoke 2,3
    assert c.engine.groups[G].owners.owner(FOO, 2) == "m1"
    # It revoked foo-2,3 and rejoins at once (cooperative protocol).
    r = c.joined(join_req("m1", owned={"foo": [0, 1]}))
    assert r.generation_id == 2 and m1.state is MemberState.STABLE
    assert names(c.sync("m1", 2)) == {"foo": [0, 1]}
    assert c.engine.groups[G].owners.owner(FOO, 2) is None


def test_static_member_bounce_gets_its_partitions_back_without_a_group_rebalance() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, member_id_factory=iter(["s1", "d2", "s1b"]).__next__)
    a.next = target(s1={FOO: [0, 1, 2, 3]})
    r = c.joined(join_req("", instance_id="i1"))
    assert r.member_id == "s1"
    c.sync("s1", r.generation_id)
    a.next = target(s1={FOO: [0, 1]}, d2={FOO: [2, 3]})
    c.join(join_req(""))  # MEMBER_ID_REQUIRED -> d2
    c.joined(join_req("d2"))
    c.beat("s1", 1)
    c.joined(join_req("s1", owned={}, instance_id="i1"))
    c.sync("s1", 2, instance_id="i1")
    c.beat("d2", 2)
    c.joined(join_req("d2"))
    c.sync("d2", 2)
    group = c.engine.groups[G]
    epoch, calls = group.group_epoch, len(a.calls)

    # s1's process restarts: no LeaveGroup (static), JoinGroup with no member id.
    c.effects.clear()
    r = c.joined(join_req("", instance_id="i1"), now=1000)
    assert r.member_id == "s1b" and r.generation_id == 2
    assert MemberReplaced(G, "s1", "s1b", "i1") in c.effects
    assert not any(isinstance(e, GroupEpochBumped) for e in c.effects)
    assert group.group_epoch == epoch and len(a.calls) == calls  # no new target
    assert names(c.sync("s1b", 2, instance_id="i1")) == {"foo": [0, 1]}
    assert c.beat("d2", 2) == E.NONE  # the other member notices nothing
    # The old incarnation is fenced.
    assert c.beat("s1", 2, instance_id="i1") == E.FENCED_INSTANCE_ID


def test_a_member_stuck_in_revocation_does_not_hold_back_the_others() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 6)), a)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    r1 = c.joined(join_req("m1"))
    r2 = c.joined(join_req("m2"))
    c.beat("m1", r1.generation_id)
    c.joined(join_req("m1"))
    c.sync("m1", 2)
    c.sync("m2", r2.generation_id)
    # m3 joins: m1 gives up foo-2 (to m3) and m2 gives up foo-5 (to m3) as well.
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]}, n1={})
    c.joined(join_req("m3"))
    # m1 is cooperative and stuck in its revocation callback: it rejoined but never again.
    assert c.beat("m1", 2) == E.REBALANCE_IN_PROGRESS
    c.joined(join_req("m1", owned={"foo": [0, 1, 2]}))
    # A new-protocol member joins too; everyone else converges within their next request.
    resp, _ = c.engine.heartbeat(join(G, "n1"), 10)
    assert resp.member_epoch == 4
    assert c.beat("m2", 2) == E.REBALANCE_IN_PROGRESS
    assert c.joined(join_req("m2", owned={})).generation_id == 4
    assert names(c.sync("m2", 4)) == {"foo": [3, 4]}
    # m3 rejoins; its SyncGroup waits for foo-2 only until m1 has known for SLOW_HOLDER_MS
    # (told at 0), then m3 gets foo-5 while foo-2 stays with the stuck m1 (never handed out
    # twice).
    m3 = c.engine.groups[G].members["m3"]
    c.beat("m3", m3.member_epoch)
    c.joined(join_req("m3"), now=20)
    assert isinstance(c.sync("m3", 4, now=20), HeldRequest)
    c.tick(499)
    assert "m3" not in c.synced()
    c.tick(500)
    assert names(c.synced()["m3"]) == {"foo": [5]}
    assert c.engine.groups[G].owners.owner(FOO, 2) == "m1"
    assert c.engine.groups[G].members["n1"].member_epoch == 4


def test_assignment_is_filtered_to_the_subscription() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 2), bar=(BAR, 2)), a, assignment_interval_ms=10_000)
    a.next = target(m1={FOO: [0, 1], BAR: [0, 1]})
    r = c.joined(join_req("m1", topics=("foo", "bar")))
    assert names(c.sync("m1", r.generation_id)) == {"bar": [0, 1], "foo": [0, 1]}
    c.engine.heartbeat(join(G, "n1", topics=("bar",)), 1)  # target computation is batched
    # m1 drops bar while the target still gives it bar (the next computation is 10 s away):
    # it must not be handed bar partitions, or it would rejoin forever.
    c.engine.config.defer_classic_join = False
    r = c.joined(join_req("m1", topics=("foo",), owned={"foo": [0, 1], "bar": [0, 1]}), now=2)
    group = c.engine.groups[G]
    assert group.target.of("m1") == {FOO: frozenset({0, 1}), BAR: frozenset({0, 1})}
    m1 = group.members["m1"]
    assert m1.state is MemberState.UNREVOKED_PARTITIONS
    assert names(c.sync("m1", r.generation_id, now=3)) == {"foo": [0, 1]}
    c.joined(join_req("m1", topics=("foo",), owned={"foo": [0, 1]}), now=4)
    assert parts(m1) == {FOO: [0, 1]} and group.owners.owner(BAR, 0) is None
