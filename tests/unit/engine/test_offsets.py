"""Offset-commit fencing: strict and relaxed rules, transactional commits, epoch -1."""

from __future__ import annotations

from dataclasses import replace

from translation.config import OffsetCommitRule
from translation.errors import ErrorCode
from translation.member import MemberProtocol

from .helpers import FOO, ScriptedAssignor, hb, image, join, make_engine, target

G = "g"
E = ErrorCode


def running(rule: OffsetCommitRule = OffsetCommitRule.RELAXED, **kwargs: object):  # type: ignore[no-untyped-def]
    """m1 holds foo-0 from epoch 1 and foo-1 from epoch 3; member epoch 3 (4 partitions)."""
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), a, rule=rule, **kwargs)
    a.next = target(m1={FOO: [0]}, m2={FOO: [2, 3]})
    engine.heartbeat(join(G, "m1"), 0)  # epoch 1: foo-0
    a.next = target(m1={FOO: [0]}, m2={FOO: [1, 2, 3]})
    engine.heartbeat(join(G, "m2"), 0)  # epoch 2: m2 gets foo-1..3
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 1)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]}, m3={})
    engine.heartbeat(join(G, "m3"), 2)  # epoch 3: foo-1 moves from m2 to m1
    engine.heartbeat(hb(G, "m2", 2, {FOO: [1, 2, 3]}), 3)
    engine.heartbeat(hb(G, "m2", 2, {FOO: [2, 3]}), 4)
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 5)
    member = engine.groups[G].members["m1"]
    assert member.member_epoch == 3 and member.assigned == {FOO: {0: 1, 1: 3}}
    return engine


def commit(engine, epoch: int, *parts: int, member: str = "m1", **kw: object) -> ErrorCode:  # type: ignore[no-untyped-def]
    return engine.validate_offset_commit(G, member, epoch, [(FOO, p) for p in parts], **kw)


def test_strict_rule_needs_the_exact_member_epoch() -> None:
    engine = running(OffsetCommitRule.STRICT)
    assert commit(engine, 3, 0, 1) is E.NONE
    assert commit(engine, 2, 0) is E.STALE_MEMBER_EPOCH
    assert commit(engine, 4, 0) is E.STALE_MEMBER_EPOCH
    assert commit(engine, 2, 0, transactional=True) is E.ILLEGAL_GENERATION


def test_relaxed_rule_checks_each_partition_assignment_epoch() -> None:
    engine = running()
    assert commit(engine, 3, 0, 1) is E.NONE
    assert commit(engine, 2, 0) is E.NONE  # foo-0 held since epoch 1 <= 2 <= 3
    assert commit(engine, 1, 0) is E.NONE
    assert commit(engine, 2, 1) is E.STALE_MEMBER_EPOCH  # foo-1 only since epoch 3
    assert commit(engine, 2, 0, 1) is E.STALE_MEMBER_EPOCH  # one bad partition fails all
    assert commit(engine, 4, 0) is E.STALE_MEMBER_EPOCH  # from the future
    assert commit(engine, 2, 3) is E.STALE_MEMBER_EPOCH  # not held by m1 at all
    assert commit(engine, 2, 1, transactional=True) is E.ILLEGAL_GENERATION
    assert commit(engine, 2, 0, transactional=True) is E.NONE


def test_zombie_commit_for_a_partition_that_moved_on() -> None:
    engine = running()
    # m2 owned foo-1 at epoch 2; it now belongs to m1.
    assert commit(engine, 2, 1, member="m2") is E.STALE_MEMBER_EPOCH


def test_commit_for_a_partition_another_member_holds_at_the_current_epoch() -> None:
    """The zombie case the simulator found: a member revokes foo-3 but stays at its old epoch
    because the target moved on and it now has foo-2 to revoke; foo-3 goes to m2. Kafka
    accepts m1's commit for foo-3 at m1's (still current) epoch; this engine rejects it."""
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), a)
    a.next = target(m1={FOO: [0, 1, 2, 3]})
    engine.heartbeat(join(G, "m1"), 0)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3]})
    engine.heartbeat(join(G, "m2"), 1)
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1, 2, 3]}), 2)  # m1 must revoke foo-3
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3]}, m3={FOO: [2]})
    engine.heartbeat(join(G, "m3"), 3)
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1, 2]}), 4)  # foo-3 released; now foo-2 to go
    _resp, _ = engine.heartbeat(hb(G, "m2", 2, {}), 5)
    group = engine.groups[G]
    m1 = group.members["m1"]
    assert (m1.member_epoch, m1.state.name) == (1, "UNREVOKED_PARTITIONS")
    assert group.owners.owner(FOO, 3) == "m2"
    assert commit(engine, 1, 3) is E.STALE_MEMBER_EPOCH
    assert commit(engine, 1, 0) is E.NONE
    kafka_like = make_engine(image(foo=(FOO, 4)), a, fence_partitions_held_by_others=False)
    kafka_like.groups[G] = group
    assert commit(kafka_like, 1, 3) is E.NONE


def test_unknown_member_and_old_offset_commit_versions() -> None:
    engine = running()
    assert commit(engine, 3, 0, member="ghost") is E.UNKNOWN_MEMBER_ID
    assert commit(engine, 3, 0, api_version=8) is E.UNSUPPORTED_VERSION
    assert commit(engine, 3, 0, api_version=8, transactional=True) is E.NONE
    engine.groups[G].members["m1"].protocol = MemberProtocol.CLASSIC
    assert commit(engine, 3, 0, api_version=8) is E.NONE
    assert commit(engine, 4, 0) is E.ILLEGAL_GENERATION


def test_generation_minus_one() -> None:
    engine = running()
    # Group with members: an admin-style commit is not accepted.
    assert commit(engine, -1, 0, member="") is E.UNKNOWN_MEMBER_ID
    # Transactional commit without member id, generation and instance id passes.
    assert commit(engine, -1, 0, member="", transactional=True) is E.NONE
    # Unknown group: -1 passes, a real epoch does not.
    assert engine.validate_offset_commit("other", "", -1, [(FOO, 0)]) is E.NONE
    assert engine.validate_offset_commit("other", "m", 3, [(FOO, 0)]) is E.GROUP_ID_NOT_FOUND
    assert (
        engine.validate_offset_commit("other", "m", 3, [(FOO, 0)], api_version=8)
        is E.ILLEGAL_GENERATION
    )
    # Empty group: -1 passes.
    for m in ("m1", "m2", "m3"):
        engine.heartbeat(replace(hb(G, m, -1)), 10)
    assert commit(engine, -1, 0, member="") is E.NONE
