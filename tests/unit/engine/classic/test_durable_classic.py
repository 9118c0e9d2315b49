"""Classic members in durable group state: what their calls drain, and classic members loaded
by a coordinator taking the group over, wherever they stood (stable, quietly advanced, told to
rejoin, joined but not synced, a JoinGroup or a SyncGroup held by the old coordinator)."""

from __future__ import annotations

from dataclasses import replace

from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.member import ClassicMemberState, Held
from translation.classic.messages import ClassicAssignment, ClassicProtocol, HeldRequest
from translation.classic.migration import (
    ClassicGroupMemberSnapshot,
    ClassicGroupSnapshot,
    convert_classic_group,
)
from translation.effects import Effect, MemberFenced, TimerArmed
from translation.records import AssignmentValue, MemberValue, StateRecord
from translation.simulation.invariants import group_differences
from translation.timers import TimerKey, TimerKind

from ..helpers import FOO, ScriptedAssignor, image, make_engine, target
from .helpers import Classic, E, G, join_req, names, subscription

WALL = 1_700_000_000_000


def shape(records: list[StateRecord]) -> list[tuple[str, str, str]]:
    return [(r.key.kind.name, r.key.member_id,
             "tombstone" if r.value is None else type(r.value).__name__) for r in records]


def durable(**config: object) -> tuple[Classic, ScriptedAssignor]:
    a = ScriptedAssignor()
    return Classic.of(image(foo=(FOO, 6)), a, durable_state=True, **config), a


def stable_pair(**config: object) -> tuple[Classic, ScriptedAssignor]:
    """m1 holds foo-0,1,2 at generation 1 and m2 foo-3,4,5 at generation 2, both stable."""
    c, a = durable(**config)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    r1 = c.joined(join_req("m1"))
    assert names(c.sync("m1", r1.generation_id)) == {"foo": [0, 1, 2]}
    r2 = c.joined(join_req("m2"))
    assert names(c.sync("m2", r2.generation_id)) == {"foo": [3, 4, 5]}
    assert c.beat("m1", 1) == E.NONE and c.beat("m2", 2) == E.NONE
    return c, a


def take_over(c: Classic, now: int, records: list[StateRecord] | None = None,
              **config: object) -> tuple[Classic, list[Effect]]:
    """A new engine loaded from everything ``c`` drained (or ``records``); both sides'
    scripted assignors give the same targets from here on."""
    if records is None:
        records = c.engine.drain_records(WALL)
    assignor = ScriptedAssignor()
    engine = make_engine(c.engine.image, assignor, durable_state=True, **config)  # type: ignore[arg-type]
    fresh = Classic(engine, ClassicGroupCoordinator(engine))
    effects = list(engine.load_group(G, records, now, WALL + now))
    old = c.engine.groups[G]
    assert group_differences(engine.groups[G], old) == []
    return fresh, effects


def test_a_classic_join_drains_its_protocols_and_position_and_a_sync_its_position() -> None:
    c, a = durable()
    a.next = target(m1={FOO: [0, 1]})
    c.engine.drain_records(WALL)
    sub = subscription(user_data=b"\x01\x02")
    request = replace(join_req("m1"), protocols=[
        ClassicProtocol(name, sub) for name in ("range", "cooperative-sticky")])
    r = c.joined(request)
    records = c.engine.drain_records(WALL)
    assert shape(records) == [("GROUP", "", "GroupValue"), ("MEMBER", "m1", "MemberValue"),
                              ("ASSIGNMENT", "m1", "AssignmentValue")]
    member, position = records[1].value, records[2].value
    assert isinstance(member, MemberValue) and member.classic is not None
    assert member.classic.protocols == ("range", "cooperative-sticky")
    assert member.classic.user_data == b"\x01\x02"
    assert member.session_timeout_ms == member.classic.session_timeout_ms == 10_000
    assert isinstance(position, AssignmentValue)
    assert position.classic_state is ClassicMemberState.COMPLETING_REBALANCE
    assert position.classic_generation == r.generation_id
    c.sync("m1", r.generation_id)
    records = c.engine.drain_records(WALL)
    assert shape(records) == [("ASSIGNMENT", "m1", "AssignmentValue")]
    assert isinstance(records[0].value, AssignmentValue)
    assert records[0].value.classic_state is ClassicMemberState.STABLE
    for now in (100, 200):
        assert c.beat("m1", r.generation_id, now=now) == E.NONE
    assert c.engine.drain_records(WALL) == []
    # The same JoinGroup again changes no member fact: only the position is rewritten.
    c.joined(request)
    assert shape(c.engine.drain_records(WALL)) == [("ASSIGNMENT", "m1", "AssignmentValue")]


def test_stable_classic_members_heartbeat_on_at_the_new_coordinator() -> None:
    c, _a = stable_pair()
    fresh, effects = take_over(c, 9_000)
    armed = {e.key for e in effects if isinstance(e, TimerArmed)}
    assert armed == {TimerKey(TimerKind.SESSION, G, "m1"), TimerKey(TimerKind.SESSION, G, "m2")}
    assert fresh.beat("m1", 1, now=9_100) == E.NONE
    assert fresh.beat("m2", 2, now=9_100) == E.NONE
    assert fresh.engine.drain_records(WALL) == []


def test_a_quietly_advanced_member_keeps_the_generation_it_was_given() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4]}, m3={FOO: [5]})
    c.joined(join_req("m3"))
    assert c.beat("m1", 1) == E.NONE  # advanced in place, still at generation 1
    fresh, _ = take_over(c, 5_000)
    m1 = fresh.engine.groups[G].members["m1"]
    assert m1.classic is not None and m1.classic.generation == 1 and m1.member_epoch == 3
    assert fresh.beat("m1", 1, now=5_100) == E.NONE
    assert fresh.engine.validate_offset_commit(G, "m1", 1, [(FOO, 0)]) == E.NONE


def test_a_member_told_to_rejoin_must_rejoin_within_its_rebalance_timeout_from_the_load() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]})
    c.joined(join_req("m3"))
    assert c.beat("m2", 2) == E.REBALANCE_IN_PROGRESS
    fresh, effects = take_over(c, 50_000)
    key = TimerKey(TimerKind.CLASSIC_JOIN, G, "m2")
    assert TimerArmed(key, 50_000 + 30_000) in effects
    a2 = fresh.engine.assignors["scripted"]
    assert isinstance(a2, ScriptedAssignor)
    a2.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]})
    r2 = fresh.joined(join_req("m2", owned={"foo": [3, 4]}), now=50_100)
    assert names(fresh.sync("m2", r2.generation_id, now=50_100)) == {"foo": [3, 4]}
    assert key not in fresh.engine.timers


def test_a_member_that_joined_but_did_not_sync_gets_its_sync_timer_again() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]}, m3={})
    r3 = c.joined(join_req("m3", session_timeout_ms=60_000))
    fresh, effects = take_over(c, 1_000)
    key = TimerKey(TimerKind.CLASSIC_SYNC, G, "m3")
    assert TimerArmed(key, 1_000 + 30_000) in effects
    assert MemberFenced(G, "m3", "sync-timeout") in fresh.tick(31_000)
    # Had it sent its SyncGroup, the timer would have been cancelled.
    fresh, _ = take_over(c, 1_000, c.engine.group_records(G, WALL))
    assert fresh.sync("m3", r3.generation_id, now=1_100).error_code == E.NONE  # type: ignore[union-attr]
    assert key not in fresh.engine.timers


def test_requests_the_old_coordinator_held_are_sent_again_and_answered() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]})
    r3 = c.joined(join_req("m3", session_timeout_ms=10_000), now=100)
    assert isinstance(c.sync("m3", r3.generation_id, now=100), HeldRequest)
    m3 = c.engine.groups[G].members["m3"]
    assert m3.classic is not None and m3.classic.held is Held.SYNC
    fresh, _effects = take_over(c, 2_000)
    loaded = fresh.engine.groups[G].members["m3"]
    assert loaded.classic is not None and loaded.classic.held is Held.NOTHING
    assert loaded.classic.state is ClassicMemberState.COMPLETING_REBALANCE
    assert not fresh.classic.held_syncs(G)
    # The client sends its SyncGroup again; it is held at the new coordinator until m1 and m2
    # let go, as it was at the old one.
    assert isinstance(fresh.sync("m3", r3.generation_id, now=2_100), HeldRequest)
    assert fresh.beat("m1", 1, now=2_200) == E.REBALANCE_IN_PROGRESS
    fresh.joined(join_req("m1", owned={}), now=2_210)
    assert fresh.beat("m2", 2, now=2_300) == E.REBALANCE_IN_PROGRESS
    fresh.joined(join_req("m2", owned={"foo": [3, 4]}), now=2_310)
    assert names(fresh.synced()["m3"]) == {"foo": [2, 5]}


def test_a_held_join_is_sent_again_to_the_new_coordinator() -> None:
    c, a = durable(assignment_interval_ms=1_000)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    r1 = c.joined(join_req("m1", session_timeout_ms=60_000), now=0)
    c.sync("m1", r1.generation_id, now=0)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    held = c.join(join_req("m2", session_timeout_ms=60_000), now=500)  # within the interval
    assert isinstance(held, HeldRequest)
    fresh, effects = take_over(c, 3_000, assignment_interval_ms=1_000)
    assert TimerArmed(TimerKey(TimerKind.CLASSIC_JOIN, G, "m2"), 3_000 + 30_000) in effects
    assert not fresh.classic.held_joins(G)
    a2 = fresh.engine.assignors["scripted"]
    assert isinstance(a2, ScriptedAssignor)
    a2.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    # The group is behind and has never computed here: the join is answered at once.
    r2 = fresh.joined(join_req("m2", session_timeout_ms=60_000), now=3_100)
    assert r2.generation_id == fresh.engine.groups[G].target.epoch == 2
    assert TimerKey(TimerKind.CLASSIC_JOIN, G, "m2") not in fresh.engine.timers


def test_a_converted_classic_group_is_drained_whole_and_loads_as_converted() -> None:
    c, _ = durable()
    snapshot = ClassicGroupSnapshot(G, 22, "consumer", "range", [
        ClassicGroupMemberSnapshot(
            member_id=m, protocols=[ClassicProtocol("range", subscription(("foo",)))],
            assignment=ClassicAssignment(3, [("foo", ps)]), session_timeout_ms=45_000)
        for m, ps in (("A", [0, 1]), ("B", [3, 4]), ("C", [2, 5]))])
    refusal, _ = convert_classic_group(c.engine, snapshot, 0)
    assert refusal is None
    fresh, _ = take_over(c, 7_000)
    assert shape(c.engine.group_records(G, WALL)) == [
        ("GROUP", "", "GroupValue"),
        *[(kind, m, value) for m in "ABC"
          for kind, value in (("MEMBER", "MemberValue"), ("ASSIGNMENT", "AssignmentValue"))]]
    for member_id in "ABC":
        assert fresh.beat(member_id, 22, now=7_100) == E.NONE


def test_a_converted_group_taken_over_after_the_write_keeps_the_adopted_generations() -> None:
    """A converter killed after the state-log write (0018, step 4): the next holder loads the
    converted group; a member adopted at *g* and quietly advanced since still has *g* as the
    generation its client was given, so its heartbeats and commits at *g* pass there."""
    c, a = durable()
    snapshot = ClassicGroupSnapshot(G, 22, "consumer", "range", [
        ClassicGroupMemberSnapshot(
            member_id=m, protocols=[ClassicProtocol("range", subscription(("foo",)))],
            assignment=ClassicAssignment(3, [("foo", ps)]), session_timeout_ms=45_000)
        for m, ps in (("A", [0, 1]), ("B", [2, 3]), ("C", [4, 5]))])
    assert convert_classic_group(c.engine, snapshot, 0)[0] is None
    a.next = target(A={FOO: [0, 1]}, B={FOO: [2, 3]}, C={FOO: [4]}, D={FOO: [5]})
    first = c.join(join_req("", protocols=("range",)), now=1000)
    assert not isinstance(first, HeldRequest)
    c.join(join_req(first.member_id, protocols=("range",)), now=1001)
    assert c.beat("A", 22, 2000) == E.NONE  # advanced in place: its target did not change
    assert c.engine.groups[G].members["A"].member_epoch == 23
    fresh, _ = take_over(c, 3000)
    assert fresh.beat("A", 22, now=3100) == E.NONE
    assert fresh.engine.validate_offset_commit(G, "A", 22, [(FOO, 0), (FOO, 1)],
                                               instance_id=None, api_version=7) == E.NONE
