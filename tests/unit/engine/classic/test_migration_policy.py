"""Which JoinGroups the engine takes, converting a broker's classic group (upgrade) and handing
a group back (downgrade), under each migration policy."""

from __future__ import annotations

import pytest

from translation.classic.messages import (
    ClassicAssignment,
    ClassicProtocol,
    JoinGroupRequest,
    LeavingMember,
)
from translation.classic.migration import (
    ClassicGroupMemberSnapshot,
    ClassicGroupSnapshot,
    convert_classic_group,
)
from translation.classic.routing import JoinRoute, classify_classic_join
from translation.config import MigrationPolicy
from translation.effects import GroupHandedBack
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from ..helpers import FOO, ScriptedAssignor, image, join, target
from .helpers import Classic, G, join_req, subscription


def fresh(**config: object) -> Classic:
    return Classic.of(image(foo=(FOO, 4)), ScriptedAssignor(), **config)


@pytest.mark.parametrize(
    ("request_", "route"),
    [
        (join_req("m1"), JoinRoute.ENGINE),
        (join_req("m1", protocols=("cooperative-sticky", "range")), JoinRoute.ENGINE),
        (join_req("m1", protocol_type="connect"), JoinRoute.BROKER),
        (join_req("m1", protocols=("stream",)), JoinRoute.BROKER),  # Kafka Streams
        (join_req("m1", protocols=("my-assignor", "range")), JoinRoute.BROKER),
        (
            JoinGroupRequest(G, "m1", "consumer", [ClassicProtocol("range", None)], 10_000),
            JoinRoute.BROKER,
        ),
        (JoinGroupRequest(G, "m1", "consumer", [], 10_000), JoinRoute.BROKER),
    ],
)
def test_classify_a_join_for_a_group_nobody_serves(
    request_: JoinGroupRequest, route: JoinRoute
) -> None:
    c = fresh()
    assert classify_classic_join(c.engine, request_).route is route


def test_subscription_user_data_of_the_sticky_assignors_is_fine() -> None:
    c = fresh()
    sub = subscription(("foo",), user_data=b"\x00\x00\x00\x05")
    request = JoinGroupRequest(
        G, "", "consumer", [ClassicProtocol("cooperative-sticky", sub)], 10_000
    )
    assert classify_classic_join(c.engine, request).to_engine


def test_a_group_the_engine_serves_takes_every_join_and_answers_errors_itself() -> None:
    c = fresh()
    c.engine.heartbeat(join(G, "n1"), 0)
    connect = join_req("w1", protocol_type="connect")
    assert classify_classic_join(c.engine, connect).to_engine
    response = c.join(connect)
    assert response is not None and response.error_code == 23  # INCONSISTENT_GROUP_PROTOCOL


def test_live_broker_group_and_kafka_mode_stay_with_the_broker() -> None:
    c = fresh()
    assert not classify_classic_join(c.engine, join_req("m1"), broker_group_active=True).to_engine
    kafka_mode = fresh(adopt_classic_groups=False)
    routing = classify_classic_join(kafka_mode.engine, join_req("m1"))
    assert routing.route is JoinRoute.BROKER and "classic-only" in routing.reason


def snapshot(**overrides: object) -> ClassicGroupSnapshot:
    members = overrides.pop(
        "members",
        [
            ClassicGroupMemberSnapshot(
                "c1",
                [ClassicProtocol("range", subscription(("foo",)))],
                ClassicAssignment(1, [("foo", [0, 1])]),
            ),
            ClassicGroupMemberSnapshot(
                "c2",
                [ClassicProtocol("range", subscription(("foo",)))],
                ClassicAssignment(1, [("foo", [2, 3])]),
            ),
        ],
    )
    fields: dict[str, object] = {
        "group_id": G,
        "generation_id": 7,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "members": members,
    }
    fields.update(overrides)
    return ClassicGroupSnapshot(**fields)  # type: ignore[arg-type]


def test_conversion_keeps_every_assignment_and_epoch() -> None:
    c = fresh()
    refusal, _ = convert_classic_group(c.engine, snapshot(), 0)
    assert refusal is None
    group = c.engine.groups[G]
    assert (group.group_epoch, group.target.epoch, group.state.value) == (7, 7, "Stable")
    assert c.beat("c1", 7) == 0 and c.beat("c2", 7) == 0
    # Encoded at the version of the member's subscription (3 here).
    assert c.sync("c1", 7).assignment == ClassicAssignment(3, [("foo", [0, 1])])


def test_conversion_of_a_rebalancing_group_starts_a_new_rebalance() -> None:
    c = fresh()
    convert_classic_group(c.engine, snapshot(stable=False), 0)
    assert c.beat("c1", 7) == 27  # REBALANCE_IN_PROGRESS


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"protocol_type": "connect"}, "protocol type"),
        ({"protocol_name": "stream"}, "assignor"),
        (
            {
                "members": [
                    ClassicGroupMemberSnapshot(
                        "c1",
                        [ClassicProtocol("range", subscription(("foo",)))],
                        ClassicAssignment(1, [("foo", [0])]),
                        assignment_user_data=b"x",
                    )
                ]
            },
            "userData",
        ),
        (
            {"members": [ClassicGroupMemberSnapshot("c1", [ClassicProtocol("range", None)], None)]},
            "subscription",
        ),
        (
            {
                "members": [
                    ClassicGroupMemberSnapshot(
                        m,
                        [ClassicProtocol("range", subscription(("foo",)))],
                        ClassicAssignment(1, [("foo", [0])]),
                    )
                    for m in ("c1", "c2")
                ]
            },
            "two members",
        ),
    ],
)
def test_conversion_refusals(change: dict[str, object], reason: str) -> None:
    c = fresh()
    refusal, effects = convert_classic_group(c.engine, snapshot(**change), 0)
    assert refusal is not None and reason in refusal
    assert G not in c.engine.groups and effects == []


@pytest.mark.parametrize("policy", [MigrationPolicy.DOWNGRADE, MigrationPolicy.DISABLED])
def test_upgrade_needs_the_policy(policy: MigrationPolicy) -> None:
    c = fresh(migration_policy=policy)
    refusal, _ = convert_classic_group(c.engine, snapshot(), 0)
    assert refusal == "the migration policy does not allow upgrades"


def mixed(policy: MigrationPolicy, adopt: bool) -> Classic:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, migration_policy=policy, adopt_classic_groups=adopt)
    if policy.upgrade_enabled:
        a.next = target(c1={FOO: [0, 1]}, n1={FOO: [2, 3]})
        c.joined(join_req("c1"))
        c.engine.heartbeat(join(G, "n1"), 0)
        return c
    # the consumer-protocol member first: a group of classic members only refuses it
    a.next = target(n1={FOO: [0, 1, 2, 3]})
    c.engine.heartbeat(join(G, "n1"), 0)
    a.next = target(c1={FOO: [0, 1]}, n1={FOO: [2, 3]})
    c.joined(join_req("c1"), now=1000)
    return c


@pytest.mark.parametrize(
    ("policy", "accepted"),
    [(MigrationPolicy.BIDIRECTIONAL, True), (MigrationPolicy.UPGRADE, True),
     (MigrationPolicy.DOWNGRADE, False), (MigrationPolicy.DISABLED, False)])
def test_a_consumer_member_joining_a_classic_group_is_an_upgrade(
        policy: MigrationPolicy, accepted: bool) -> None:
    """Kafka's rule for a live classic group (``validateOnlineUpgrade``): under ``disabled``
    and ``downgrade`` a consumer-protocol member's first heartbeat is GROUP_ID_NOT_FOUND, and
    the classic member goes on as before."""
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, migration_policy=policy)
    a.next = target(c1={FOO: [0, 1, 2, 3]})
    generation = c.joined(join_req("c1")).generation_id
    a.next = target(c1={FOO: [0, 1]}, n1={FOO: [2, 3]})
    response, _ = c.engine.heartbeat(join(G, "n1"), 2000)
    if accepted:
        assert response.error_code == 0 and "n1" in c.engine.groups[G].members
        return
    assert response.error_code == 69  # GROUP_ID_NOT_FOUND
    assert set(c.engine.groups[G].members) == {"c1"}
    assert c.beat("c1", generation, 3000) == 0
    # a group with a consumer-protocol member already is a consumer group: joins go on
    c2 = mixed(policy, False)
    response, _ = c2.engine.heartbeat(join(G, "n2"), 3000)
    assert response.error_code == 0


@pytest.mark.parametrize(
    ("policy", "adopt", "handed_back"),
    [
        (MigrationPolicy.BIDIRECTIONAL, False, True),
        (MigrationPolicy.DOWNGRADE, False, True),
        (MigrationPolicy.UPGRADE, False, False),
        (MigrationPolicy.DISABLED, False, False),
        (MigrationPolicy.BIDIRECTIONAL, True, False),
    ],
)
def test_downgrade_when_the_last_new_protocol_member_leaves(
    policy: MigrationPolicy, adopt: bool, handed_back: bool
) -> None:
    c = mixed(policy, adopt)
    _, effects = c.engine.heartbeat(ConsumerGroupHeartbeatRequest(G, "n1", -1), 10)
    backs = [e for e in effects if isinstance(e, GroupHandedBack)]
    if handed_back:
        assert len(backs) == 1 and list(backs[0].members) == [("c1", None)]
        assert G not in c.engine.groups
        assert c.engine.next_deadline() is None  # no timer left for the group
    else:
        assert backs == [] and "c1" in c.engine.groups[G].members


def test_a_classic_member_leaving_never_hands_the_group_back() -> None:
    c = mixed(MigrationPolicy.BIDIRECTIONAL, False)
    c.joined(join_req("c2"))
    c.leave(LeavingMember("c2"))
    assert not any(isinstance(e, GroupHandedBack) for e in c.effects)
    assert G in c.engine.groups


def test_session_timeout_of_the_last_new_protocol_member_hands_back_too() -> None:
    c = mixed(MigrationPolicy.BIDIRECTIONAL, False)
    # n1's arrival left c1's partitions alone: c1 is advanced without a rejoin.
    generation = 1
    synced = c.sync("c1", generation)
    assert synced is not None and synced.error_code == 0
    assert c.beat("c1", generation) == 0
    for now in range(5_000, 45_000, 5_000):
        assert c.beat("c1", generation, now=now) == 0
        assert not any(isinstance(e, GroupHandedBack) for e in c.tick(now))
    effects = c.tick(45_000)  # n1's session (45 s) runs out
    assert any(isinstance(e, GroupHandedBack) for e in effects)



@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_sticky_assignors_state_in_the_assignment_does_not_refuse_a_conversion(
        name: str) -> None:
    """librdkafka's (cooperative-)sticky assignor writes its stickiness state into each
    member's assignment userData; the engine needs none of it (range: refused, above)."""
    c = fresh()
    members = [ClassicGroupMemberSnapshot(
        m, [ClassicProtocol(name, subscription(("foo",)))],
        ClassicAssignment(1, [("foo", ps)]), assignment_user_data=b"state")
        for m, ps in (("c1", [0, 1]), ("c2", [2, 3]))]
    refusal, _ = convert_classic_group(c.engine, snapshot(protocol_name=name,
                                                          members=members), 0)
    assert refusal is None
    assert {m: sorted(p for ps in member.assigned.values() for p in ps)
            for m, member in c.engine.groups[G].members.items()} == {"c1": [0, 1],
                                                                     "c2": [2, 3]}
