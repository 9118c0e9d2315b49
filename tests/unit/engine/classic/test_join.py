"""Classic JoinGroup on the engine: member ids, protocol checks, the response, timers."""

from __future__ import annotations

from translation.classic.member import ClassicMemberState
from translation.classic.messages import ClassicProtocol, JoinGroupRequest, JoinGroupResponse
from translation.effects import MemberFenced
from translation.member import MemberProtocol
from translation.timers import TimerKey, TimerKind

from ..helpers import FOO, ScriptedAssignor, image, join, target
from .helpers import Classic, E, G, join_req


def engine(**config: object) -> tuple[Classic, ScriptedAssignor]:
    a = ScriptedAssignor()
    return Classic.of(image(foo=(FOO, 4)), a, **config), a


def test_v4_dynamic_member_without_id_gets_member_id_required_and_no_state() -> None:
    c, _ = engine(member_id_factory=lambda: "gen-1")
    r = c.join(join_req(""))
    assert isinstance(r, JoinGroupResponse)
    assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id == "gen-1"
    assert G not in c.engine.groups


def test_v3_dynamic_member_without_id_joins_at_once_with_a_generated_id() -> None:
    c, a = engine(member_id_factory=lambda: "gen-1")
    a.next = target(**{"gen-1": {FOO: [0, 1]}})
    r = c.joined(join_req("", version=3))
    assert r.member_id == "gen-1" and r.generation_id == 1


def test_static_member_without_id_is_not_asked_for_one() -> None:
    c, _ = engine(member_id_factory=lambda: "gen-1")
    r = c.joined(join_req("", instance_id="i1"))
    assert r.member_id == "gen-1"
    assert c.engine.groups[G].static_members == {"i1": "gen-1"}


def test_response_is_a_follower_response_at_the_member_epoch() -> None:
    c, a = engine()
    a.next = target(m1={FOO: [0, 1, 2, 3]})
    r = c.joined(join_req("m1", protocols=("cooperative-sticky", "range")))
    group = c.engine.groups[G]
    member = group.members["m1"]
    assert (r.generation_id, r.protocol_type, r.protocol_name) == (
        1,
        "consumer",
        "cooperative-sticky",
    )
    assert r.leader == "" and r.members == [] and r.member_id == "m1"
    assert r.generation_id == member.member_epoch == group.group_epoch
    assert member.protocol is MemberProtocol.CLASSIC
    assert (
        member.classic is not None
        and member.classic.state is ClassicMemberState.COMPLETING_REBALANCE
    )
    # The member's own session timeout, and the sync timer at its rebalance timeout.
    timers = c.engine.timers
    assert timers.deadline(TimerKey(TimerKind.SESSION, G, "m1")) == 10_000
    assert timers.deadline(TimerKey(TimerKind.CLASSIC_SYNC, G, "m1")) == 30_000


def test_v0_join_uses_the_session_timeout_as_rebalance_timeout() -> None:
    c, _ = engine()
    c.joined(join_req("m1", version=0, rebalance_timeout_ms=-1, session_timeout_ms=7000))
    assert c.engine.groups[G].members["m1"].rebalance_timeout_ms == 7000


def test_protocol_type_other_than_consumer_is_inconsistent() -> None:
    c, _ = engine()
    r = c.join(join_req("m1", protocol_type="connect"))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert G not in c.engine.groups


def test_protocol_names_must_be_shared_with_every_other_classic_member() -> None:
    c, _ = engine()
    c.joined(join_req("m1", protocols=("range", "roundrobin")))
    bad = c.join(join_req("m2", protocols=("sticky",)))
    assert bad is not None and bad.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert "m2" not in c.engine.groups[G].members
    ok = c.joined(join_req("m2", protocols=("roundrobin",)))
    assert ok.protocol_name == "roundrobin"
    # m3 must share a name with both m1 (range, roundrobin) and m2 (roundrobin).
    r = c.join(join_req("m3", protocols=("range",)))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.INCONSISTENT_GROUP_PROTOCOL


def test_a_rejoining_member_may_change_its_own_protocols() -> None:
    c, _ = engine()
    c.joined(join_req("m1", protocols=("range",)))
    r = c.joined(join_req("m1", protocols=("cooperative-sticky",)))
    assert r.protocol_name == "cooperative-sticky"


def test_new_protocol_members_do_not_constrain_classic_protocols() -> None:
    c, _ = engine()
    c.engine.heartbeat(join(G, "n1"), 0)
    c.joined(join_req("m1", protocols=("sticky",)))


def test_malformed_subscription_is_inconsistent_group_protocol() -> None:
    c, _ = engine()
    request = JoinGroupRequest(G, "m1", "consumer", [ClassicProtocol("range", None)], 10_000)
    r = c.join(request)
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.INCONSISTENT_GROUP_PROTOCOL


def test_session_timeout_outside_the_configured_range() -> None:
    c, _ = engine()
    r = c.join(join_req("m1", session_timeout_ms=1000))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.INVALID_SESSION_TIMEOUT


def test_a_new_protocol_member_id_cannot_join_as_classic() -> None:
    c, _ = engine()
    c.engine.heartbeat(join(G, "n1"), 0)
    r = c.join(join_req("n1"))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.UNKNOWN_MEMBER_ID


def test_group_max_size() -> None:
    c, _ = engine(max_group_size=1)
    c.joined(join_req("m1"))
    r = c.join(join_req("m2"))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.GROUP_MAX_SIZE_REACHED
    c.joined(join_req("m1"))  # a known member may rejoin


def test_known_member_id_of_a_static_member_that_is_unknown() -> None:
    c, _ = engine()
    r = c.join(join_req("m1", instance_id="i1"))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.UNKNOWN_MEMBER_ID


def test_subscription_change_bumps_the_group_epoch_and_same_subscription_does_not() -> None:
    c, _ = engine()
    c.joined(join_req("m1"))
    group = c.engine.groups[G]
    epoch = group.group_epoch
    c.joined(join_req("m1"))
    assert group.group_epoch == epoch
    c.joined(join_req("m1", topics=("foo", "bar")))
    assert group.group_epoch == epoch + 1


def test_no_sync_within_the_rebalance_timeout_fences_the_member() -> None:
    c, a = engine()
    a.next = target(m1={FOO: [0, 1]})
    c.joined(join_req("m1", rebalance_timeout_ms=5000))
    c.engine.heartbeat(join(G, "n1"), 0)
    effects = c.tick(5000)
    assert MemberFenced(G, "m1", "sync-timeout") in effects
    assert "m1" not in c.engine.groups[G].members


def test_sync_cancels_the_sync_timer() -> None:
    c, _ = engine()
    r = c.joined(join_req("m1", rebalance_timeout_ms=5000))
    assert c.sync("m1", r.generation_id, 100).error_code == 0
    assert TimerKey(TimerKind.CLASSIC_SYNC, G, "m1") not in c.engine.timers
    assert not any(isinstance(e, MemberFenced) for e in c.tick(6000))


def test_static_member_with_its_own_member_id_rejoins_in_place() -> None:
    c, _ = engine(member_id_factory=lambda: "s1")
    r = c.joined(join_req("", instance_id="i1"))
    again = c.joined(join_req("s1", instance_id="i1"))
    assert again.member_id == "s1" and again.generation_id == r.generation_id


def test_static_member_with_another_member_id_is_fenced_at_join() -> None:
    c, _ = engine(member_id_factory=lambda: "s1")
    c.joined(join_req("", instance_id="i1"))
    r = c.join(join_req("zombie", instance_id="i1"))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.FENCED_INSTANCE_ID


def test_classic_static_member_replaces_a_live_new_protocol_one_and_back() -> None:
    """A rolling downgrade/upgrade of one static instance: either protocol takes over the
    instance id at once from the other (Kafka checks UNRELEASED_INSTANCE_ID only between two
    new-protocol members), keeping the partitions."""
    c, a = engine(member_id_factory=lambda: "classic-1")
    a.next = target(n1={FOO: [0, 1, 2, 3]})
    c.engine.heartbeat(join(G, "n1", instance_id="i1"), 0)
    group = c.engine.groups[G]
    r = c.joined(join_req("", instance_id="i1"), now=10)
    assert r.member_id == "classic-1" and "n1" not in group.members
    assert group.members["classic-1"].protocol is MemberProtocol.CLASSIC
    assert c.sync("classic-1", r.generation_id, instance_id="i1").assignment is not None
    resp, _ = c.engine.heartbeat(join(G, "n2", instance_id="i1"), 20)
    assert resp.error_code == 0 and "classic-1" not in group.members
    assert group.members["n2"].protocol is MemberProtocol.CONSUMER
    assert resp.member_epoch == r.generation_id


def test_blank_group_id_and_blank_instance_id() -> None:
    c, _ = engine()
    r = c.join(join_req("m1", group_id=" "))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.INVALID_GROUP_ID
    r = c.join(join_req("m1", instance_id=""))
    assert isinstance(r, JoinGroupResponse) and r.error_code == E.INVALID_REQUEST
    assert not c.engine.groups
