"""The KIP-848 case studies (Basic; Incremental Revocation & Assignment; Member Failure;
Partition Added), replayed heartbeat by heartbeat with the epochs, assignments and pending
partitions the KIP gives.

The KIP narrates a member's join, the target computation and the member's first reconciling
heartbeat as three steps; the engine, like Kafka, does all three in the joining heartbeat,
so the states are checked after that heartbeat. "pending-partitions" in the KIP are the target
partitions a member does not have yet (:func:`helpers.pending`).
"""

from __future__ import annotations

from translation.group import GroupState
from translation.member import MemberState

from .helpers import (
    FOO,
    ScriptedAssignor,
    assignment,
    hb,
    held,
    image,
    join,
    make_engine,
    parts,
    pending,
    revoking,
    seed,
    target,
    target_of,
)

G = "grp"


def test_basic() -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 3)), assignor)

    # Member A joins: group epoch 1, target (epoch 1) gives A everything, A moves to epoch 1.
    assignor.next = target(A={FOO: [0, 1, 2]})
    resp, _ = engine.heartbeat(join(G, "A"), 0)
    group = engine.groups[G]
    assert group.group_epoch == 1 and group.target.epoch == 1
    assert target_of(group) == {"A": {FOO: [0, 1, 2]}}
    a = group.members["A"]
    assert (resp.member_epoch, assignment(resp)) == (1, {FOO: [0, 1, 2]})
    assert (a.member_epoch, parts(a), pending(group, "A")) == (1, {FOO: [0, 1, 2]}, {})
    assert group.state is GroupState.STABLE

    # Member B joins: group epoch 2, target epoch 2: A=[0,1], B=[2]. B moves to epoch 2 but
    # cannot get foo-2 until A revokes it.
    assignor.next = target(A={FOO: [0, 1]}, B={FOO: [2]})
    resp, _ = engine.heartbeat(join(G, "B"), 10)
    b = group.members["B"]
    assert group.group_epoch == 2 and group.target.epoch == 2
    assert target_of(group) == {"A": {FOO: [0, 1]}, "B": {FOO: [2]}}
    assert (a.member_epoch, parts(a), pending(group, "A")) == (1, {FOO: [0, 1, 2]}, {})
    assert (b.member_epoch, parts(b), pending(group, "B")) == (2, {}, {FOO: [2]})
    assert resp.member_epoch == 2 and assignment(resp) == {}
    assert b.state is MemberState.UNRELEASED_PARTITIONS
    assert group.state is GroupState.RECONCILING

    # A heartbeats: told to revoke foo-2 (stays at epoch 1).
    resp, _ = engine.heartbeat(hb(G, "A", 1, {FOO: [0, 1, 2]}), 20)
    assert (resp.member_epoch, assignment(resp)) == (1, {FOO: [0, 1]})
    assert a.state is MemberState.UNREVOKED_PARTITIONS and revoking(a) == {FOO: [2]}

    # A acknowledges the revocation: epoch 2, foo-2 released.
    resp, _ = engine.heartbeat(hb(G, "A", 1, {FOO: [0, 1]}), 30)
    assert (resp.member_epoch, resp.assignment) == (2, None)
    assert (a.member_epoch, parts(a), pending(group, "A")) == (2, {FOO: [0, 1]}, {})
    assert (b.member_epoch, parts(b), pending(group, "B")) == (2, {}, {FOO: [2]})

    # B heartbeats and now gets foo-2.
    resp, _ = engine.heartbeat(hb(G, "B", 2, {}), 40)
    assert (resp.member_epoch, assignment(resp)) == (2, {FOO: [2]})
    assert (b.member_epoch, parts(b), pending(group, "B")) == (2, {FOO: [2]}, {})
    assert group.state is GroupState.STABLE

    # Member C joins: group epoch 3, target A=[0], B=[2], C=[1]. C moves to epoch 3 but
    # cannot get foo-1 yet.
    assignor.next = target(A={FOO: [0]}, B={FOO: [2]}, C={FOO: [1]})
    resp, _ = engine.heartbeat(join(G, "C"), 50)
    c = group.members["C"]
    assert group.group_epoch == 3 and group.target.epoch == 3
    assert target_of(group) == {"A": {FOO: [0]}, "B": {FOO: [2]}, "C": {FOO: [1]}}
    assert (a.member_epoch, parts(a), pending(group, "A")) == (2, {FOO: [0, 1]}, {})
    assert (b.member_epoch, parts(b)) == (2, {FOO: [2]})
    assert (c.member_epoch, parts(c), pending(group, "C")) == (3, {}, {FOO: [1]})

    # B heartbeats: nothing to revoke, straight to epoch 3.
    resp, _ = engine.heartbeat(hb(G, "B", 2), 60)
    assert (resp.member_epoch, resp.assignment) == (3, None)
    assert (b.member_epoch, parts(b), pending(group, "B")) == (3, {FOO: [2]}, {})

    # A heartbeats: revoke foo-1; then acknowledges: epoch 3, foo-1 released.
    resp, _ = engine.heartbeat(hb(G, "A", 2), 70)
    assert (resp.member_epoch, assignment(resp)) == (2, {FOO: [0]})
    resp, _ = engine.heartbeat(hb(G, "A", 2, {FOO: [0]}), 80)
    assert (a.member_epoch, parts(a), pending(group, "A")) == (3, {FOO: [0]}, {})

    # C heartbeats and gets foo-1: everybody is at the group epoch 3.
    resp, _ = engine.heartbeat(hb(G, "C", 3), 90)
    assert (resp.member_epoch, assignment(resp)) == (3, {FOO: [1]})
    assert (c.member_epoch, parts(c), pending(group, "C")) == (3, {FOO: [1]}, {})
    assert group.state is GroupState.STABLE
    assert {m.member_epoch for m in group.members.values()} == {3}


def test_incremental_revocation_and_assignment() -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 6)), assignor)
    group = seed(
        engine,
        G,
        group_epoch=21,
        target_epoch=21,
        members={"A": (21, {FOO: [0, 1, 2]}), "B": (21, {FOO: [3, 4, 5]})},
        targets={"A": {FOO: [0, 1, 2]}, "B": {FOO: [3, 4, 5]}},
    )
    a, b = group.members["A"], group.members["B"]
    assert group.state is GroupState.STABLE

    # C joins: epoch 22, target A=[0,1] B=[3,4] C=[2,5]; C at epoch 22 with nothing yet.
    assignor.next = target(A={FOO: [0, 1]}, B={FOO: [3, 4]}, C={FOO: [2, 5]})
    resp, _ = engine.heartbeat(join(G, "C"), 0)
    c = group.members["C"]
    assert group.group_epoch == 22 and group.target.epoch == 22
    assert (resp.member_epoch, assignment(resp)) == (22, {})
    assert (a.member_epoch, parts(a)) == (21, {FOO: [0, 1, 2]})
    assert (b.member_epoch, parts(b)) == (21, {FOO: [3, 4, 5]})
    assert (c.member_epoch, parts(c), pending(group, "C")) == (22, {}, {FOO: [2, 5]})

    # A is told to revoke foo-2, B to revoke foo-5, C gets nothing new.
    resp, _ = engine.heartbeat(hb(G, "A", 21), 10)
    assert (resp.member_epoch, assignment(resp)) == (21, {FOO: [0, 1]})
    resp, _ = engine.heartbeat(hb(G, "B", 21), 20)
    assert (resp.member_epoch, assignment(resp)) == (21, {FOO: [3, 4]})
    resp, _ = engine.heartbeat(hb(G, "C", 22), 30)
    assert (resp.member_epoch, resp.assignment) == (22, None)

    # A acknowledges: epoch 22, foo-2 released. (The KIP lists C with foo-2 already here;
    # C only receives it on its next heartbeat, which is the KIP's next sentence.)
    resp, _ = engine.heartbeat(hb(G, "A", 21, {FOO: [0, 1]}), 40)
    assert (a.member_epoch, parts(a), pending(group, "A")) == (22, {FOO: [0, 1]}, {})
    # B still holds foo-5 (assigned [3, 4] plus foo-5 pending revocation).
    assert (b.member_epoch, held(b), revoking(b)) == (21, {FOO: [3, 4, 5]}, {FOO: [5]})

    # C heartbeats: gets foo-2, still waits for foo-5.
    resp, _ = engine.heartbeat(hb(G, "C", 22), 50)
    assert (resp.member_epoch, assignment(resp)) == (22, {FOO: [2]})
    assert (c.member_epoch, parts(c), pending(group, "C")) == (22, {FOO: [2]}, {FOO: [5]})

    # B acknowledges: epoch 22, foo-5 released.
    resp, _ = engine.heartbeat(hb(G, "B", 21, {FOO: [3, 4]}), 60)
    assert (b.member_epoch, parts(b), pending(group, "B")) == (22, {FOO: [3, 4]}, {})

    # C heartbeats: gets foo-2 and foo-5.
    resp, _ = engine.heartbeat(hb(G, "C", 22, {FOO: [2]}), 70)
    assert (resp.member_epoch, assignment(resp)) == (22, {FOO: [2, 5]})
    assert (c.member_epoch, parts(c), pending(group, "C")) == (22, {FOO: [2, 5]}, {})
    assert group.state is GroupState.STABLE


def test_member_failure() -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 6)), assignor, session_timeout_ms=45_000)
    group = seed(
        engine,
        G,
        group_epoch=22,
        target_epoch=22,
        members={"A": (22, {FOO: [0, 1]}), "B": (22, {FOO: [3, 4]}), "C": (22, {FOO: [2, 5]})},
        targets={"A": {FOO: [0, 1]}, "B": {FOO: [3, 4]}, "C": {FOO: [2, 5]}},
    )
    b, c = group.members["B"], group.members["C"]
    # B and C keep heartbeating, A does not.
    engine.heartbeat(hb(G, "B", 22), 30_000)
    engine.heartbeat(hb(G, "C", 22), 30_000)
    assert engine.tick(44_999) == []

    # A's session expires: A is removed and the group epoch bumped to 23.
    engine.tick(45_000)
    assert "A" not in group.members
    assert group.group_epoch == 23 and group.target.epoch == 22
    assert group.state is GroupState.ASSIGNING
    # Kafka drops A's target entry with the member (the KIP's listing still shows it).
    assert target_of(group) == {"B": {FOO: [3, 4]}, "C": {FOO: [2, 5]}}
    assert (b.member_epoch, parts(b)) == (22, {FOO: [3, 4]})
    assert (c.member_epoch, parts(c)) == (22, {FOO: [2, 5]})

    # The next heartbeat computes the new target; B and C transition to epoch 23.
    assignor.next = target(B={FOO: [3, 4, 0]}, C={FOO: [2, 5, 1]})
    resp, _ = engine.heartbeat(hb(G, "B", 22), 46_000)
    assert group.target.epoch == 23
    assert target_of(group) == {"B": {FOO: [0, 3, 4]}, "C": {FOO: [1, 2, 5]}}
    assert (resp.member_epoch, assignment(resp)) == (23, {FOO: [0, 3, 4]})
    resp, _ = engine.heartbeat(hb(G, "C", 22), 46_100)
    assert (resp.member_epoch, assignment(resp)) == (23, {FOO: [1, 2, 5]})
    assert (b.member_epoch, parts(b), pending(group, "B")) == (23, {FOO: [0, 3, 4]}, {})
    assert (c.member_epoch, parts(c), pending(group, "C")) == (23, {FOO: [1, 2, 5]}, {})
    assert group.state is GroupState.STABLE


def test_partition_added() -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 1)), assignor)
    group = seed(
        engine,
        G,
        group_epoch=22,
        target_epoch=22,
        members={"A": (22, {FOO: [0]}), "B": (22, {})},
        targets={"A": {FOO: [0]}, "B": {}},
    )
    a, b = group.members["A"], group.members["B"]

    # foo-1 is created: the group epoch is bumped to 23, the target stays at 22.
    engine.update_topics(image(foo=(FOO, 2)), 100)
    assert group.group_epoch == 23 and group.target.epoch == 22
    assert group.subscription_metadata == {FOO: 2}

    # The next heartbeat computes the new target: A=[foo-0], B=[foo-1]; both reach 23.
    assignor.next = target(A={FOO: [0]}, B={FOO: [1]})
    resp, _ = engine.heartbeat(hb(G, "A", 22), 200)
    assert group.target.epoch == 23
    assert target_of(group) == {"A": {FOO: [0]}, "B": {FOO: [1]}}
    assert (resp.member_epoch, resp.assignment) == (23, None)
    resp, _ = engine.heartbeat(hb(G, "B", 22), 300)
    assert (resp.member_epoch, assignment(resp)) == (23, {FOO: [1]})
    assert (a.member_epoch, parts(a), pending(group, "A")) == (23, {FOO: [0]}, {})
    assert (b.member_epoch, parts(b), pending(group, "B")) == (23, {FOO: [1]}, {})
    assert group.state is GroupState.STABLE
