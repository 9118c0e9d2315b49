"""Durable group state in the engine: which records each kind of call drains, and a group
loaded from them (translation.durable): same group, timers re-armed from the loading engine's
clock, no epoch bump, no target computed because of the load, and refusals of records that do
not make a group."""

from __future__ import annotations

import pytest

from translation.assignors.uniform import UniformAssignor
from translation.coordinator import GroupCoordinator
from translation.durable import StateLoadError
from translation.effects import GroupEpochBumped, GroupLoaded, TimerArmed
from translation.member import MemberState
from translation.records import (
    AssignmentValue,
    GroupValue,
    MemberValue,
    RecordKey,
    RecordKind,
    StateRecord,
    decode_record,
    encode_record,
    fold,
)
from translation.simulation.invariants import group_differences
from translation.timers import TimerKey, TimerKind
from translation.topics import TopicsImage

from .helpers import BAR, FOO, ScriptedAssignor, hb, image, join, make_engine, target

G = "g"
WALL = 1_700_000_000_000
TOPICS = image(foo=(FOO, 6), bar=(BAR, 3))


def shape(records: list[StateRecord]) -> list[tuple[str, str, str]]:
    """(kind, member id, value type or 'tombstone') per record, in order."""
    return [(r.key.kind.name, r.key.member_id,
             "tombstone" if r.value is None else type(r.value).__name__) for r in records]


def durable_engine(*assignors: object, topics: TopicsImage = TOPICS,
                   **config: object) -> GroupCoordinator:
    return make_engine(topics, *(assignors or (UniformAssignor(),)), durable_state=True,
                       **config)  # type: ignore[arg-type]


def stable_pair(engine: GroupCoordinator) -> dict[str, int]:
    """Two members, m1 on foo and bar, m2 on foo, reconciled; returns their epochs."""
    r1, _ = engine.heartbeat(join(G, "m1", topics=["foo", "bar"]), 0)
    r2, _ = engine.heartbeat(join(G, "m2", topics=["foo"]), 10)
    m1 = engine.groups[G].members["m1"]
    owned = {t: set(ps) for t, ps in m1.assigned.items()}
    r1, _ = engine.heartbeat(hb(G, "m1", r1.member_epoch, owned), 20)
    owned = {t: set(ps) for t, ps in m1.assigned.items()}
    r1, _ = engine.heartbeat(hb(G, "m1", r1.member_epoch, owned), 30)
    r2, _ = engine.heartbeat(hb(G, "m2", r2.member_epoch, {}), 40)
    group = engine.groups[G]
    assert all(m.state is MemberState.STABLE for m in group.members.values())
    assert all(m.member_epoch == group.target.epoch for m in group.members.values())
    return {"m1": r1.member_epoch, "m2": r2.member_epoch}


def reload(engine: GroupCoordinator, records: list[StateRecord], now: int,
           **config: object) -> tuple[GroupCoordinator, list[object]]:
    fresh = durable_engine(topics=engine.image, **config)
    effects = fresh.load_group(G, records, now, WALL + now)
    return fresh, list(effects)


# ------------------------------------------------------------------------------ dirty tracking

def test_a_join_drains_the_group_record_and_both_records_of_the_member() -> None:
    engine = durable_engine()
    engine.heartbeat(join(G, "m1"), 0)
    assert shape(engine.drain_records(WALL)) == [
        ("GROUP", "", "GroupValue"), ("MEMBER", "m1", "MemberValue"),
        ("ASSIGNMENT", "m1", "AssignmentValue")]
    assert engine.drain_records(WALL) == []


def test_steady_heartbeats_drain_nothing_even_with_client_id_and_host_every_time() -> None:
    engine = durable_engine()
    epochs = stable_pair(engine)
    engine.drain_records(WALL)
    for now in range(100, 2000, 100):
        for member_id, epoch in epochs.items():
            response, _ = engine.heartbeat(
                hb(G, member_id, epoch, client_id="app-1", client_host="/10.0.0.1"), now)
            assert response.error_code == 0
        if now == 100:
            # The first heartbeat brought a client id and host the member did not have.
            assert shape(engine.drain_records(WALL)) == [
                ("MEMBER", "m1", "MemberValue"), ("MEMBER", "m2", "MemberValue")]
        else:
            assert engine.drain_records(WALL) == []
    engine.tick(2000)
    assert engine.drain_records(WALL) == []


def test_an_acknowledged_revocation_drains_that_members_assignment_record_only() -> None:
    engine = durable_engine()
    r1, _ = engine.heartbeat(join(G, "m1", topics=["foo"]), 0)
    engine.heartbeat(join(G, "m2", topics=["foo"]), 10)
    engine.drain_records(WALL)
    # m1 still owns all of foo, half of which now is m2's: it must revoke first.
    engine.heartbeat(hb(G, "m1", r1.member_epoch, {FOO: range(6)}), 20)
    records = engine.drain_records(WALL)
    assert shape(records) == [("ASSIGNMENT", "m1", "AssignmentValue")]
    value = records[0].value
    assert isinstance(value, AssignmentValue) and value.state is MemberState.UNREVOKED_PARTITIONS
    assert value.pending_revocation  # with the epochs they were assigned at
    kept = {FOO: set(engine.groups[G].members["m1"].assigned[FOO])}
    engine.heartbeat(hb(G, "m1", r1.member_epoch, kept), 30)
    assert shape(engine.drain_records(WALL)) == [("ASSIGNMENT", "m1", "AssignmentValue")]


def test_a_target_computation_rewrites_only_the_members_whose_target_changed() -> None:
    scripted = ScriptedAssignor("scripted")
    engine = durable_engine(scripted)
    scripted.next = target(m1={FOO: range(6)})
    engine.heartbeat(join(G, "m1"), 0)
    scripted.next = target(m1={FOO: range(6)}, m2={})
    engine.heartbeat(join(G, "m2"), 10)
    scripted.next = target(m1={FOO: range(6)}, m2={}, m3={BAR: [0]})
    engine.drain_records(WALL)
    engine.heartbeat(join(G, "m3", topics=["foo", "bar"]), 20)
    # m1's and m2's targets are unchanged: the computation rewrites neither of them.
    assert shape(engine.drain_records(WALL)) == [
        ("GROUP", "", "GroupValue"), ("MEMBER", "m3", "MemberValue"),
        ("ASSIGNMENT", "m3", "AssignmentValue")]


def test_a_subscription_change_drains_the_member_record_and_the_bumped_group() -> None:
    engine = durable_engine()
    epochs = stable_pair(engine)
    engine.drain_records(WALL)
    engine.heartbeat(hb(G, "m2", epochs["m2"], subscribed_topic_names=["foo", "bar"]), 100)
    kinds = shape(engine.drain_records(WALL))
    assert kinds[:2] == [("GROUP", "", "GroupValue"), ("MEMBER", "m2", "MemberValue")]
    assert set(kinds[2:]) <= {("ASSIGNMENT", "m1", "AssignmentValue"),
                              ("ASSIGNMENT", "m2", "AssignmentValue")}


def test_changes_between_two_drains_are_written_once_per_key() -> None:
    engine = durable_engine()
    r1, _ = engine.heartbeat(join(G, "m1", topics=["foo"]), 0)
    for now in (10, 20, 30):
        engine.heartbeat(hb(G, "m1", r1.member_epoch, {}, rack_id=f"rack-{now}"), now)
    records = engine.drain_records(WALL)
    assert shape(records) == [("GROUP", "", "GroupValue"), ("MEMBER", "m1", "MemberValue"),
                              ("ASSIGNMENT", "m1", "AssignmentValue")]
    member = records[1].value
    assert isinstance(member, MemberValue) and member.rack_id == "rack-30"


def test_a_leave_drains_tombstones_and_an_empty_group_carries_when_it_emptied() -> None:
    engine = durable_engine(empty_group_expiry_ms=60_000)
    _r1, _ = engine.heartbeat(join(G, "m1"), 0)
    engine.drain_records(WALL)
    engine.heartbeat(hb(G, "m1", -1), 100)
    records = engine.drain_records(WALL + 100)
    assert shape(records) == [("GROUP", "", "GroupValue"), ("ASSIGNMENT", "m1", "tombstone"),
                              ("MEMBER", "m1", "tombstone")]
    value = records[0].value
    assert isinstance(value, GroupValue) and value.empty_since_wall_ms == WALL + 100
    # Still empty at the next change: the time it became empty stays.
    engine.update_topics(image(foo=(FOO, 8)), 200)
    records = engine.drain_records(WALL + 200)
    assert isinstance(records[0].value, GroupValue)
    assert records[0].value.empty_since_wall_ms == WALL + 100


def test_a_fenced_member_drains_tombstones() -> None:
    engine = durable_engine(session_timeout_ms=6_000)
    stable_pair(engine)
    engine.heartbeat(hb(G, "m1", engine.groups[G].members["m1"].member_epoch), 3_000)
    engine.drain_records(WALL)
    engine.tick(6_040)  # m2's session (its last heartbeat was at 40)
    assert shape(engine.drain_records(WALL)) == [
        ("GROUP", "", "GroupValue"), ("ASSIGNMENT", "m2", "tombstone"),
        ("MEMBER", "m2", "tombstone")]
    assert "m2" not in engine.groups[G].members


def test_an_expired_group_drains_the_tombstones_of_everything_it_wrote() -> None:
    engine = durable_engine(empty_group_expiry_ms=60_000)
    engine.heartbeat(join(G, "m1"), 0)
    engine.heartbeat(join(G, "m2"), 0)
    engine.heartbeat(hb(G, "m1", -1), 10)
    engine.heartbeat(hb(G, "m2", -1), 10)
    engine.tick(60_010)
    assert G not in engine.groups
    assert shape(engine.drain_records(WALL)) == [
        ("ASSIGNMENT", "m1", "tombstone"), ("MEMBER", "m1", "tombstone"),
        ("ASSIGNMENT", "m2", "tombstone"), ("MEMBER", "m2", "tombstone"),
        ("GROUP", "", "tombstone")]


def test_a_group_deleted_and_created_again_before_a_drain_tombstones_the_old_members() -> None:
    engine = durable_engine()
    engine.heartbeat(join(G, "old"), 0)
    engine.drain_records(WALL)
    engine.heartbeat(hb(G, "old", -1), 10)
    assert engine.delete_group(G)[0] == 0
    engine.heartbeat(join(G, "new"), 20)
    records = engine.drain_records(WALL)
    assert shape(records) == [
        ("GROUP", "", "GroupValue"), ("MEMBER", "new", "MemberValue"),
        ("ASSIGNMENT", "new", "AssignmentValue"), ("ASSIGNMENT", "old", "tombstone"),
        ("MEMBER", "old", "tombstone")]
    assert fold(records).keys() == {r.key for r in engine.group_records(G, WALL)}


def test_a_lost_group_drains_nothing_not_even_its_pending_changes() -> None:
    engine = durable_engine()
    engine.heartbeat(join(G, "m1"), 0)
    engine.forget(G, "lease lost")
    assert engine.drain_records(WALL) == []


def test_a_static_leave_drains_the_assignment_record_only() -> None:
    engine = durable_engine()
    _r, _ = engine.heartbeat(join(G, "m1", instance_id="i1"), 0)
    engine.drain_records(WALL)
    engine.heartbeat(hb(G, "m1", -2, instance_id="i1"), 10)
    records = engine.drain_records(WALL)
    assert shape(records) == [("ASSIGNMENT", "m1", "AssignmentValue")]
    assert isinstance(records[0].value, AssignmentValue)
    assert records[0].value.member_epoch == -2


def test_new_partitions_drain_the_group_record() -> None:
    engine = durable_engine()
    stable_pair(engine)
    engine.drain_records(WALL)
    engine.update_topics(image(foo=(FOO, 8), bar=(BAR, 3)), 100)
    records = engine.drain_records(WALL)
    assert shape(records) == [("GROUP", "", "GroupValue")]
    assert isinstance(records[0].value, GroupValue)
    assert (FOO, 8) in records[0].value.subscription_metadata


def test_without_durable_state_nothing_is_tracked_and_drain_refuses() -> None:
    engine = make_engine(TOPICS, UniformAssignor())
    engine.heartbeat(join(G, "m1"), 0)
    assert engine.groups[G].changes is None and engine.journal is None
    with pytest.raises(RuntimeError, match="durable_state"):
        engine.drain_records(WALL)


def test_every_drained_record_encodes_and_decodes() -> None:
    engine = durable_engine()
    stable_pair(engine)
    engine.heartbeat(hb(G, "m2", -1), 100)
    for record in engine.drain_records(WALL):
        assert decode_record(*encode_record(record)) == record


# ------------------------------------------------------------------------------ load

def test_a_loaded_group_is_the_group_and_answers_the_next_heartbeats_the_same() -> None:
    engine = durable_engine()
    epochs = stable_pair(engine)
    records = engine.drain_records(WALL)
    fresh, effects = reload(engine, records, 50)
    assert group_differences(fresh.groups[G], engine.groups[G]) == []
    assert GroupLoaded(G, engine.groups[G].group_epoch, engine.groups[G].target.epoch, 2) \
        in effects
    for now in (60, 70):
        for member_id, epoch in epochs.items():
            assert fresh.heartbeat(hb(G, member_id, epoch), now) == \
                engine.heartbeat(hb(G, member_id, epoch), now)
    assert fresh.drain_records(WALL) == []  # what was loaded is already written


def test_load_arms_a_full_session_and_the_rebalance_timer_from_the_new_clock() -> None:
    engine = durable_engine()
    r1, _ = engine.heartbeat(join(G, "m1", topics=["foo"], rebalance_timeout_ms=7000), 0)
    engine.heartbeat(join(G, "m2", topics=["foo"]), 10)
    engine.heartbeat(hb(G, "m1", r1.member_epoch, {FOO: range(6)}), 20)
    assert engine.groups[G].members["m1"].state is MemberState.UNREVOKED_PARTITIONS
    # The new coordinator's monotonic clock has nothing to do with the old one's.
    fresh, effects = reload(engine, engine.drain_records(WALL), 5_000_000)
    session = fresh.config.session_timeout_ms
    armed = {e.key: e.deadline_ms for e in effects if isinstance(e, TimerArmed)}
    assert armed == {
        TimerKey(TimerKind.SESSION, G, "m1"): 5_000_000 + session,
        TimerKey(TimerKind.SESSION, G, "m2"): 5_000_000 + session,
        TimerKey(TimerKind.REBALANCE, G, "m1"): 5_000_000 + 7000,
    }
    assert fresh.timers.payload(TimerKey(TimerKind.REBALANCE, G, "m1")) == r1.member_epoch
    assert fresh.next_deadline() == 5_007_000
    fenced = fresh.tick(5_007_000)
    assert "m1" not in fresh.groups[G].members, fenced


def test_an_empty_group_expires_by_the_wall_clock_time_it_became_empty() -> None:
    engine = durable_engine(empty_group_expiry_ms=60_000)
    engine.heartbeat(join(G, "m1"), 0)
    engine.heartbeat(hb(G, "m1", -1), 10)
    records = engine.drain_records(WALL)
    fresh = durable_engine(empty_group_expiry_ms=60_000)
    # Loaded 45 s (wall clock) after it became empty: 15 s are left.
    effects = fresh.load_group(G, records, 900, WALL + 45_000)
    assert TimerArmed(TimerKey(TimerKind.GROUP_EXPIRY, G), 900 + 15_000) in effects
    fresh.tick(900 + 15_000)
    assert G not in fresh.groups


def test_load_bumps_no_epoch_and_computes_no_target() -> None:
    scripted = ScriptedAssignor("scripted")
    engine = durable_engine(scripted)
    scripted.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    r1, _ = engine.heartbeat(join(G, "m1"), 0)
    _r2, _ = engine.heartbeat(join(G, "m2"), 0)
    records = engine.drain_records(WALL)
    fresh_assignor = ScriptedAssignor("scripted")
    fresh = durable_engine(fresh_assignor)
    effects = fresh.load_group(G, records, 100, WALL)
    assert not [e for e in effects if isinstance(e, GroupEpochBumped)]
    response, effects = fresh.heartbeat(hb(G, "m1", r1.member_epoch, {FOO: [0, 1, 2]}), 110)
    assert response.error_code == 0 and not fresh_assignor.calls
    assert fresh.groups[G].group_epoch == engine.groups[G].group_epoch


def test_a_preferred_assignor_left_stale_by_a_leave_is_loaded_as_stored() -> None:
    """After a leave the preferred assignor is not recomputed until the next membership
    change; recomputing it at load would bump the epoch on the first heartbeat."""
    engine = durable_engine(UniformAssignor(), ScriptedAssignor("range"))
    _a, _ = engine.heartbeat(join(G, "a", assignor="range"), 0)
    _b, _ = engine.heartbeat(join(G, "b"), 0)
    engine.heartbeat(hb(G, "a", -1), 10)
    assert engine.groups[G].preferred_assignor == "range"
    fresh = durable_engine(UniformAssignor(), ScriptedAssignor("range"))
    fresh.load_group(G, engine.drain_records(WALL), 20, WALL)
    assert fresh.groups[G].preferred_assignor == "range"
    mine = fresh.heartbeat(hb(G, "b", fresh.groups[G].members["b"].member_epoch), 30)
    theirs = engine.heartbeat(hb(G, "b", engine.groups[G].members["b"].member_epoch), 30)
    assert mine == theirs


def test_a_topic_changed_while_nobody_watched_bumps_the_epoch_once_at_load() -> None:
    engine = durable_engine()
    stable_pair(engine)
    records = engine.drain_records(WALL)
    fresh = durable_engine(topics=image(foo=(FOO, 9), bar=(BAR, 3)))
    effects = fresh.load_group(G, records, 100, WALL)
    bumps = [e for e in effects if isinstance(e, GroupEpochBumped)]
    assert [b.reason for b in bumps] == ["subscribed topic metadata changed"]
    assert fresh.groups[G].group_epoch == engine.groups[G].group_epoch + 1
    assert shape(fresh.drain_records(WALL)) == [("GROUP", "", "GroupValue")]


def test_records_of_other_groups_are_skipped_and_a_deleted_group_is_not_loaded() -> None:
    engine = durable_engine(empty_group_expiry_ms=1)
    engine.heartbeat(join(G, "m1"), 0)
    engine.heartbeat(join("other", "x"), 0)
    engine.heartbeat(hb("other", "x", -1), 1)
    first = engine.drain_records(WALL)
    engine.tick(10)
    second = engine.drain_records(WALL)
    fresh = durable_engine()
    fresh.load_group(G, first + second, 100, WALL)
    assert set(fresh.groups) == {G}
    assert fresh.load_group("other", first + second, 100, WALL) == []
    assert "other" not in fresh.groups
    everything = durable_engine()
    everything.load(first, 100, WALL)
    assert set(everything.groups) == {G, "other"}


def _records_without(records: list[StateRecord], kind: RecordKind) -> list[StateRecord]:
    return [r for r in records if r.key.kind is not kind or r.key.member_id != "m2"]


def test_records_that_do_not_make_a_group_are_refused_and_nothing_is_loaded() -> None:
    engine = durable_engine()
    stable_pair(engine)
    records = engine.drain_records(WALL)
    for broken in (_records_without(records, RecordKind.ASSIGNMENT),
                   _records_without(records, RecordKind.MEMBER),
                   [r for r in records if r.key.kind is not RecordKind.GROUP]):
        fresh = durable_engine()
        with pytest.raises(StateLoadError):
            fresh.load_group(G, broken, 0, WALL)
        assert G not in fresh.groups and not fresh.timers
    # Two members holding one partition.
    m1 = next(r for r in records if r.key == RecordKey(RecordKind.ASSIGNMENT, G, "m1"))
    m2 = next(r for r in records if r.key == RecordKey(RecordKind.ASSIGNMENT, G, "m2"))
    assert isinstance(m1.value, AssignmentValue) and isinstance(m2.value, AssignmentValue)
    clash = StateRecord(m2.key, AssignmentValue(
        m2.value.member_epoch, m2.value.previous_member_epoch, m2.value.state,
        m1.value.assigned, (), m2.value.target))
    fresh = durable_engine()
    with pytest.raises(StateLoadError, match="still holds"):
        fresh.load_group(G, [*records, clash], 0, WALL)
    assert G not in fresh.groups
    # A group already served here.
    with pytest.raises(StateLoadError, match="already served"):
        engine.load_group(G, records, 0, WALL)
