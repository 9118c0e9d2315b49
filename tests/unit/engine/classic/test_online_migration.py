"""KIP-848's "Online Migration" case study, replayed step by step.

A classic group at generation 22 (A, B, C) is converted; A comes back with the new protocol
(a static member rolled to the new client replaces its classic self at once), B leaves and
later rejoins with the new protocol, C stays classic and eager throughout. Epochs and
partitions are the KIP's; where the KIP narrates a join, a target computation and the first
reconciliation as separate steps, the engine does them in one request (as Kafka does).
"""

from __future__ import annotations

from translation.classic.member import ClassicMemberState
from translation.classic.messages import ClassicAssignment, ClassicProtocol, LeavingMember
from translation.classic.migration import (
    ClassicGroupMemberSnapshot,
    ClassicGroupSnapshot,
    convert_classic_group,
)
from translation.member import MemberProtocol, MemberState

from ..helpers import FOO, ScriptedAssignor, assignment, hb, image, join, parts, target, target_of
from .helpers import Classic, E, G, join_req, names, subscription


def classic_member(member_id: str, partitions: list[int], instance_id: str | None = None):  # type: ignore[no-untyped-def]
    return ClassicGroupMemberSnapshot(
        member_id=member_id,
        protocols=[ClassicProtocol("range", subscription(("foo",)))],
        assignment=ClassicAssignment(3, [("foo", partitions)]),
        group_instance_id=instance_id,
        session_timeout_ms=45_000,
        rebalance_timeout_ms=300_000,
    )


def test_online_migration_case_study() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 6)), a)
    engine = c.engine

    # Classic group, generation 22: A=[0,1], B=[3,4], C=[2,5]. It is converted: the
    # generation becomes the group epoch and the assignment epoch; nothing moves.
    snapshot = ClassicGroupSnapshot(
        G,
        22,
        "consumer",
        "range",
        [
            classic_member("A", [0, 1], instance_id="a"),
            classic_member("B", [3, 4]),
            classic_member("C", [2, 5]),
        ],
    )
    refusal, _ = convert_classic_group(engine, snapshot, 0)
    assert refusal is None
    group = engine.groups[G]
    assert (group.group_epoch, group.target.epoch) == (22, 22)
    assert target_of(group) == {"A": {FOO: [0, 1]}, "B": {FOO: [3, 4]}, "C": {FOO: [2, 5]}}

    # A rejoins with the new protocol (same instance id): it replaces classic A at once.
    resp, _ = engine.heartbeat(join(G, "A2", instance_id="a"), 10)
    a2 = group.members["A2"]
    assert "A" not in group.members and a2.protocol is MemberProtocol.CONSUMER
    assert (resp.member_epoch, assignment(resp), group.group_epoch) == (22, {FOO: [0, 1]}, 22)
    cm = group.members["C"]
    assert (cm.member_epoch, parts(cm)) == (22, {FOO: [2, 5]})

    # B leaves the group (classic LeaveGroup): epoch 23.
    assert c.leave(LeavingMember("B"), now=20).members[0].error_code == 0
    assert group.group_epoch == 23 and group.owners.owner(FOO, 3) is None

    # The next request computes the target for epoch 23; C's heartbeat triggers its rebalance.
    a.next = target(A2={FOO: [0, 1, 3]}, C={FOO: [2, 5, 4]})
    assert c.beat("C", 22, now=30) == E.REBALANCE_IN_PROGRESS
    assert group.target.epoch == 23
    assert target_of(group) == {"A2": {FOO: [0, 1, 3]}, "C": {FOO: [2, 4, 5]}}
    assert cm.classic is not None and cm.classic.state is ClassicMemberState.PREPARE_REBALANCE

    # C (eager) revoked everything and rejoins: it owns nothing, so it moves to epoch 23
    # with its whole target (foo-4 is free since B left). CompletingRebalance.
    r = c.joined(join_req_c(), now=40)
    assert r.generation_id == 23
    assert (cm.member_epoch, parts(cm)) == (23, {FOO: [2, 4, 5]})
    assert cm.classic.state is ClassicMemberState.COMPLETING_REBALANCE

    # In the meantime A heartbeats and moves to epoch 23 with foo-3.
    resp, _ = engine.heartbeat(hb(G, "A2", 22, {FOO: [0, 1]}), 50)
    assert (resp.member_epoch, assignment(resp)) == (23, {FOO: [0, 1, 3]})

    # C syncs and collects [2, 4, 5]: Stable.
    assert names(c.sync("C", 23, now=60)) == {"foo": [2, 4, 5]}
    assert cm.classic.state is ClassicMemberState.STABLE

    # B rejoins with the new protocol: epoch 24, target A=[0,1], B=[3,4], C=[2,5]. B moves to
    # epoch 24 with nothing yet (foo-3 held by A, foo-4 by C).
    a.next = target(A2={FOO: [0, 1]}, B2={FOO: [3, 4]}, C={FOO: [2, 5]})
    resp, _ = engine.heartbeat(join(G, "B2"), 70)
    b2 = group.members["B2"]
    assert group.group_epoch == 24 and group.target.epoch == 24
    assert (resp.member_epoch, assignment(resp)) == (24, {})
    assert b2.state is MemberState.UNRELEASED_PARTITIONS

    # A heartbeats and is told to revoke foo-3.
    resp, _ = engine.heartbeat(hb(G, "A2", 23, {FOO: [0, 1, 3]}), 80)
    assert (resp.member_epoch, assignment(resp)) == (23, {FOO: [0, 1]})

    # C heartbeats and is told to rebalance; it revokes everything and rejoins: epoch 24,
    # [2, 5]; foo-4 is released.
    assert c.beat("C", 23, now=90) == E.REBALANCE_IN_PROGRESS
    r = c.joined(join_req_c(), now=100)
    assert r.generation_id == 24 and parts(cm) == {FOO: [2, 5]}
    assert group.owners.owner(FOO, 4) is None

    # B heartbeats and collects foo-4 (foo-3 still pending).
    resp, _ = engine.heartbeat(hb(G, "B2", 24, {}), 110)
    assert (resp.member_epoch, assignment(resp)) == (24, {FOO: [4]})

    # C syncs: Stable with [2, 5].
    assert names(c.sync("C", 24, now=120)) == {"foo": [2, 5]}

    # A confirms the revocation of foo-3: epoch 24, foo-3 released.
    resp, _ = engine.heartbeat(hb(G, "A2", 23, {FOO: [0, 1]}), 130)
    assert resp.member_epoch == 24 and group.owners.owner(FOO, 3) is None

    # B heartbeats and gets its whole assignment. Everyone is at epoch 24.
    resp, _ = engine.heartbeat(hb(G, "B2", 24, {FOO: [4]}), 140)
    assert assignment(resp) == {FOO: [3, 4]}
    assert {m.member_id: (m.member_epoch, parts(m)) for m in group.members.values()} == {
        "A2": (24, {FOO: [0, 1]}),
        "B2": (24, {FOO: [3, 4]}),
        "C": (24, {FOO: [2, 5]}),
    }
    assert c.beat("C", 24, now=150) == E.NONE
    assert group.state.value == "Stable"


def join_req_c():  # type: ignore[no-untyped-def]
    return join_req("C", owned={}, session_timeout_ms=45_000, rebalance_timeout_ms=300_000)
