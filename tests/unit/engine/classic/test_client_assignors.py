"""The classic client assignors a bridged leader runs: Kafka's own examples for ``range`` and
``roundrobin`` (RangeAssignorTest / RoundRobinAssignorTest, named per test), and validity,
balance, stickiness and the cooperative rule as properties."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from translation.classic.client_assignors import (
    CLIENT_ASSIGNORS,
    ClassicGroupMember,
    MemberAssignment,
    assign,
    parse_sticky_user_data,
    sticky_target,
    subscription_user_data,
)
from translation.classic.messages import ClassicSubscription


def _m(member_id: str, topics: list[str], instance: str | None = None,
       owned: list[tuple[str, list[int]]] | None = None, generation: int = -1,
       user_data: bytes | None = None) -> ClassicGroupMember:
    return ClassicGroupMember(member_id, instance, ClassicSubscription(
        2, topics, user_data=user_data, owned_partitions=owned or [], generation_id=generation))


# Kafka's RangeAssignorTest ---------------------------------------------------------------


def test_range_two_consumers_one_topic_three_partitions() -> None:
    # RangeAssignorTest.testTwoConsumersOneTopicThreePartitions
    got = assign("range", [_m("consumer1", ["topic"]), _m("consumer2", ["topic"])],
                 {"topic": 3})
    assert got == {"consumer1": {"topic": (0, 1)}, "consumer2": {"topic": (2,)}}


def test_range_multiple_consumers_mixed_topics() -> None:
    # RangeAssignorTest.testMultipleConsumersMixedTopics
    members = [_m("consumer1", ["topic1"]), _m("consumer2", ["topic1", "topic2"]),
               _m("consumer3", ["topic1"])]
    got = assign("range", members, {"topic1": 3, "topic2": 2})
    assert got == {"consumer1": {"topic1": (0,)},
                   "consumer2": {"topic1": (1,), "topic2": (0, 1)},
                   "consumer3": {"topic1": (2,)}}


def test_range_two_consumers_two_topics_six_partitions() -> None:
    # RangeAssignorTest.testTwoConsumersTwoTopicsSixPartitions
    members = [_m("consumer1", ["topic1", "topic2"]), _m("consumer2", ["topic1", "topic2"])]
    got = assign("range", members, {"topic1": 3, "topic2": 3})
    assert got == {"consumer1": {"topic1": (0, 1), "topic2": (0, 1)},
                   "consumer2": {"topic1": (2,), "topic2": (2,)}}


def test_range_only_assigns_partitions_from_subscribed_topics() -> None:
    # RangeAssignorTest.testOnlyAssignsPartitionsFromSubscribedTopics
    got = assign("range", [_m("consumer", ["topic"])], {"topic": 3, "other": 3})
    assert got == {"consumer": {"topic": (0, 1, 2)}}


def test_range_orders_static_members_first_by_instance_id() -> None:
    # MemberInfo.compareTo: instance ids first (in their order), then member ids
    members = [_m("a", ["t"]), _m("z", ["t"], instance="i2"), _m("y", ["t"], instance="i1")]
    got = assign("range", members, {"t": 4})
    assert got == {"y": {"t": (0, 1)}, "z": {"t": (2,)}, "a": {"t": (3,)}}


# Kafka's RoundRobinAssignorTest ------------------------------------------------------------


def test_roundrobin_two_consumers_one_topic_two_partitions() -> None:
    # RoundRobinAssignorTest.testTwoConsumersOneTopicTwoPartitions
    got = assign("roundrobin", [_m("consumer1", ["topic"]), _m("consumer2", ["topic"])],
                 {"topic": 2})
    assert got == {"consumer1": {"topic": (0,)}, "consumer2": {"topic": (1,)}}


def test_roundrobin_multiple_consumers_mixed_topics() -> None:
    # RoundRobinAssignorTest.testMultipleConsumersMixedTopics
    members = [_m("consumer1", ["topic1"]), _m("consumer2", ["topic1", "topic2"]),
               _m("consumer3", ["topic1"])]
    got = assign("roundrobin", members, {"topic1": 3, "topic2": 2})
    assert got == {"consumer1": {"topic1": (0,)},
                   "consumer2": {"topic1": (1,), "topic2": (0, 1)},
                   "consumer3": {"topic1": (2,)}}


def test_roundrobin_two_dynamic_consumers_two_topics_six_partitions() -> None:
    # RoundRobinAssignorTest.testTwoDynamicConsumersTwoTopicsSixPartitions
    members = [_m("consumer1", ["topic1", "topic2"]), _m("consumer2", ["topic1", "topic2"])]
    got = assign("roundrobin", members, {"topic1": 3, "topic2": 3})
    assert got == {"consumer1": {"topic1": (0, 2), "topic2": (1,)},
                   "consumer2": {"topic1": (1,), "topic2": (0, 2)}}


def test_roundrobin_two_static_consumers_two_topics_six_partitions() -> None:
    # RoundRobinAssignorTest.testTwoStaticConsumersTwoTopicsSixPartitions: instance ids rank
    members = [_m("consumer-b", ["topic1", "topic2"], instance="instance1"),
               _m("consumer-a", ["topic1", "topic2"], instance="instance2")]
    got = assign("roundrobin", members, {"topic1": 3, "topic2": 3})
    assert got == {"consumer-b": {"topic1": (0, 2), "topic2": (1,)},
                   "consumer-a": {"topic1": (1,), "topic2": (0, 2)}}


def test_roundrobin_one_static_consumer_and_one_dynamic_consumer() -> None:
    # RoundRobinAssignorTest.testOneStaticConsumerAndOneDynamicConsumerTwoTopicsSixPartitions
    members = [_m("consumer-b", ["topic1", "topic2"], instance="instance1"),
               _m("consumer-a", ["topic1", "topic2"])]
    got = assign("roundrobin", members, {"topic1": 3, "topic2": 3})
    assert got == {"consumer-b": {"topic1": (0, 2), "topic2": (1,)},
                   "consumer-a": {"topic1": (1,), "topic2": (0, 2)}}


def test_roundrobin_static_member_assignment_persistent() -> None:
    # RoundRobinAssignorTest.testStaticMemberRoundRobinAssignmentPersistent
    static = [_m(f"consumer{i}", ["topic1", "topic2"], instance=f"instance{i}")
              for i in (1, 2, 3)]
    expected = {"consumer1": {"topic1": (0,), "topic2": (1,)},
                "consumer2": {"topic1": (1,), "topic2": (2,)},
                "consumer3": {"topic1": (2,)}}
    counts = {"topic1": 3, "topic2": 3}
    got = assign("roundrobin", [*static, _m("consumer4", ["topic1", "topic2"])], counts)
    assert got == {**expected, "consumer4": {"topic2": (0,)}}
    got = assign("roundrobin", [*static, _m("consumer5", ["topic1", "topic2"])], counts)
    assert got == {**expected, "consumer5": {"topic2": (0,)}}


def test_roundrobin_one_consumer_non_existent_topic() -> None:
    # RoundRobinAssignorTest.testOneConsumerNonexistentTopic
    assert assign("roundrobin", [_m("consumer", ["topic"])], {}) == {"consumer": {}}


# Sticky user data --------------------------------------------------------------------------


def test_sticky_user_data_round_trips_and_is_read_for_stickiness() -> None:
    data = subscription_user_data("sticky", [("t", [2, 3])], 7)
    assert data is not None
    assert parse_sticky_user_data(data) == ({"t": {2, 3}}, 7)
    assert parse_sticky_user_data(data[:-4]) == ({"t": {2, 3}}, -1)  # v0: no generation
    assert parse_sticky_user_data(b"\x00\x01") is None
    members = [_m("a", ["t"], user_data=data), _m("b", ["t"], user_data=b"garbage")]
    assert assign("sticky", members, {"t": 4})["a"] == {"t": (2, 3)}
    assert subscription_user_data("cooperative-sticky", [], 5) == b"\x00\x00\x00\x05"
    assert subscription_user_data("range", [], 5) is None


def test_same_generation_double_claim_belongs_to_nobody_and_higher_generation_wins() -> None:
    members = [_m("a", ["t"], owned=[("t", [0, 1])], generation=4),
               _m("b", ["t"], owned=[("t", [0])], generation=5),
               _m("c", ["t"], owned=[("t", [1])], generation=4)]
    target = sticky_target(members, {"t": 3}, "cooperative-sticky")
    assert target["b"]["t"][:1] == (0,)
    got = assign("cooperative-sticky", members, {"t": 3})
    # 0 and 1 are claimed by two members each: withheld from whoever gets them this round
    assert all(p not in (0, 1) for a in got.values() for p in a.get("t", ()))


# Properties --------------------------------------------------------------------------------

TOPICS = ["t0", "t1", "t2"]


@st.composite
def groups(draw: st.DrawFn, homogeneous: bool = False
           ) -> tuple[list[ClassicGroupMember], dict[str, int]]:
    counts = {t: draw(st.integers(0, 7)) for t in TOPICS}
    n = draw(st.integers(1, 6))
    common = draw(st.lists(st.sampled_from(TOPICS), unique=True))
    members = []
    owners: dict[tuple[str, int], str] = {}
    for i in range(n):
        topics = common if homogeneous else draw(st.lists(st.sampled_from(TOPICS), unique=True))
        instance = draw(st.none() | st.sampled_from(["s1", "s2", "s3"]))
        member_id = f"m{i}"
        for t in topics:
            for p in range(counts[t]):
                if (t, p) not in owners and draw(st.booleans()):
                    owners[(t, p)] = member_id
        owned: dict[str, list[int]] = {}
        for (t, p), o in owners.items():
            if o == member_id:
                owned.setdefault(t, []).append(p)
        members.append(_m(member_id, topics, instance=instance,
                          owned=sorted(owned.items()), generation=3))
    # instance ids unique, as the broker guarantees
    seen: set[str] = set()
    fixed = []
    for m in members:
        if m.group_instance_id in seen:
            m = ClassicGroupMember(m.member_id, None, m.subscription)
        if m.group_instance_id is not None:
            seen.add(m.group_instance_id)
        fixed.append(m)
    return fixed, counts


def _check_valid(members: list[ClassicGroupMember], counts: Mapping[str, int],
                 got: Mapping[str, MemberAssignment], complete: bool) -> None:
    assert set(got) == {m.member_id for m in members}
    owner: dict[tuple[str, int], str] = {}
    by_id = {m.member_id: m for m in members}
    for member_id, assignment in got.items():
        for topic, partitions in assignment.items():
            assert topic in by_id[member_id].subscription.topics
            for p in partitions:
                assert 0 <= p < counts[topic]
                assert (topic, p) not in owner
                owner[(topic, p)] = member_id
    if complete:
        wanted = {(t, p) for m in members for t in m.subscription.topics
                  for p in range(counts[t])}
        assert set(owner) == wanted


def _sizes(got: Mapping[str, MemberAssignment]) -> list[int]:
    return [sum(len(p) for p in a.values()) for a in got.values()]


@settings(max_examples=300, deadline=None)
@given(groups(), st.sampled_from(CLIENT_ASSIGNORS))
def test_every_subscribed_partition_has_exactly_one_subscriber(
    group: tuple[list[ClassicGroupMember], dict[str, int]], protocol: str
) -> None:
    members, counts = group
    got = assign(protocol, members, counts)
    _check_valid(members, counts, got, complete=protocol != "cooperative-sticky")
    if protocol == "cooperative-sticky":
        _check_valid(members, counts, sticky_target(members, counts, protocol), complete=True)


@settings(max_examples=300, deadline=None)
@given(groups(homogeneous=True), st.sampled_from(["sticky", "cooperative-sticky", "roundrobin"]))
def test_homogeneous_subscriptions_are_balanced(
    group: tuple[list[ClassicGroupMember], dict[str, int]], protocol: str
) -> None:
    members, counts = group
    got = (assign(protocol, members, counts) if protocol == "roundrobin"
           else sticky_target(members, counts, protocol))
    sizes = _sizes(got)
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=300, deadline=None)
@given(groups(homogeneous=True))
def test_sticky_members_keep_what_they_own_up_to_their_quota(
    group: tuple[list[ClassicGroupMember], dict[str, int]]
) -> None:
    members, counts = group
    got = sticky_target(members, counts, "cooperative-sticky")
    total = sum(counts[t] for t in members[0].subscription.topics)
    quota = -(-total // len(members))
    for m in members:
        owned = {(t, p) for t, ps in m.subscription.owned_partitions for p in ps}
        kept = {(t, p) for t, ps in got[m.member_id].items() for p in ps} & owned
        assert len(kept) >= min(len(owned), quota - 1)
        if len(owned) <= quota - 1:
            assert kept == owned  # under quota: nothing taken away


@settings(max_examples=300, deadline=None)
@given(groups())
def test_cooperative_never_moves_a_partition_directly(
    group: tuple[list[ClassicGroupMember], dict[str, int]]
) -> None:
    members, counts = group
    got = assign("cooperative-sticky", members, counts)
    for m in members:
        for topic, partitions in got[m.member_id].items():
            for p in partitions:
                claimants = {o.member_id for o in members
                             for t, ps in o.subscription.owned_partitions
                             if t == topic and p in ps}
                assert claimants <= {m.member_id}
    # progress: what is withheld is exactly what moves in the target
    target = sticky_target(members, counts, "cooperative-sticky")
    moved = sum(_sizes(target)) - sum(_sizes(got))
    assert moved >= 0
    if all(not m.subscription.owned_partitions for m in members):
        assert got == target


@given(groups())
@settings(max_examples=100, deadline=None)
def test_assignment_does_not_depend_on_member_order(
    group: tuple[list[ClassicGroupMember], dict[str, int]]
) -> None:
    members, counts = group
    for protocol in CLIENT_ASSIGNORS:
        assert assign(protocol, members, counts) == assign(protocol, members[::-1], counts)
