"""The ``range`` assignor: contiguous ranges, co-partitioning, static-first ordering."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tests.unit.assignors.strategies import Topics, groups, topic_id, with_current
from translation.assignors import (
    AssignorError,
    GroupSpec,
    MemberSubscription,
    RangeAssignor,
    SubscriptionType,
)
from translation.assignors.range import range_member_order
from translation.topics import TopicId

RANGE = RangeAssignor()
HOMO = SubscriptionType.HOMOGENEOUS
HETERO = SubscriptionType.HETEROGENEOUS
T0, T1, T2 = topic_id(0), topic_id(1), topic_id(2)


def member(
    member_id: str,
    topics: set[TopicId],
    instance_id: str | None = None,
    current: dict[TopicId, frozenset[int]] | None = None,
) -> MemberSubscription:
    return MemberSubscription(member_id, instance_id, None, frozenset(topics), current or {})


def spec(kind: SubscriptionType, *members: MemberSubscription) -> GroupSpec:
    return GroupSpec({m.member_id: m for m in members}, kind)


def fs(*parts: int) -> frozenset[int]:
    return frozenset(parts)


@settings(max_examples=300, deadline=None)
@given(case=groups())
def test_each_topic_is_split_into_contiguous_ranges_in_member_order(
    case: tuple[GroupSpec, Topics],
) -> None:
    group, topics = case
    result = RANGE.assign(group, topics)
    order = range_member_order(group)
    subscribed = {t for m in group.members.values() for t in m.subscribed_topic_ids}
    for t in subscribed:
        subs = [m for m in order if t in group.members[m].subscribed_topic_ids]
        n = topics.counts[t]
        quota, extra = divmod(n, len(subs))
        start = 0
        for index, m in enumerate(subs):
            size = quota + (1 if index < extra else 0)
            assert result[m].get(t, frozenset()) == frozenset(range(start, start + size))
            start += size


@settings(max_examples=200, deadline=None)
@given(case=groups(homogeneous=True))
def test_output_ignores_the_current_assignment(case: tuple[GroupSpec, Topics]) -> None:
    group, topics = case
    assert RANGE.assign(group, topics) == RANGE.assign(with_current(group, {}), topics)


def test_co_partitioning_in_homogeneous_groups() -> None:
    # Kafka's javadoc example: M0 and M1, T1 and T2 with 3 partitions each.
    topics = Topics({T0: 3, T1: 3})
    group = spec(HOMO, member("m0", {T0, T1}), member("m1", {T0, T1}))
    assert RANGE.assign(group, topics) == {
        "m0": {T0: fs(0, 1), T1: fs(0, 1)},
        "m1": {T0: fs(2), T1: fs(2)},
    }


def test_co_partitioning_with_many_members_and_topics() -> None:
    topics = Topics({topic_id(k): 7 for k in range(4)})
    tids = set(topics.counts)
    group = GroupSpec({f"m{i}": member(f"m{i}", tids) for i in range(5)}, HOMO)
    result = RANGE.assign(group, topics)
    for per_topic in result.values():
        assert len({ps for ps in per_topic.values()}) <= 1  # same numbers from every topic
    assert [len(next(iter(result[f"m{i}"].values()), fs())) for i in range(5)] == [2, 2, 1, 1, 1]


def test_static_members_first_by_instance_id_then_dynamic_by_member_id() -> None:
    topics = Topics({T0: 4})
    group = spec(
        HOMO,
        member("a", {T0}),
        member("z", {T0}, instance_id="i2"),
        member("b", {T0}),
        member("y", {T0}, instance_id="i1"),
    )
    assert range_member_order(group) == ["y", "z", "a", "b"]
    assert RANGE.assign(group, topics) == {
        "y": {T0: fs(0)},
        "z": {T0: fs(1)},
        "a": {T0: fs(2)},
        "b": {T0: fs(3)},
    }


def test_static_member_rejoining_with_a_new_member_id_keeps_its_ranges() -> None:
    topics = Topics({T0: 6, T1: 6})
    before = spec(
        HOMO,
        member("m-1", {T0, T1}, instance_id="i0"),
        member("m-2", {T0, T1}, instance_id="i1"),
        member("m-3", {T0, T1}, instance_id="i2"),
    )
    after = spec(
        HOMO,
        member("m-9", {T0, T1}, instance_id="i0"),  # i0 restarted; its new id sorts last
        member("m-2", {T0, T1}, instance_id="i1"),
        member("m-3", {T0, T1}, instance_id="i2"),
    )
    first, second = RANGE.assign(before, topics), RANGE.assign(after, topics)
    assert first["m-1"] == second["m-9"]
    assert first["m-2"] == second["m-2"]


def test_heterogeneous_each_topic_over_its_own_subscribers() -> None:
    topics = Topics({T0: 3, T1: 2, T2: 5})
    group = spec(
        HETERO,
        member("a", {T0, T2}),
        member("b", {T0, T1}),
        member("c", {T1, T2}),
        member("d", set()),
    )
    assert RANGE.assign(group, topics) == {
        "a": {T0: fs(0, 1), T2: fs(0, 1, 2)},
        "b": {T0: fs(2), T1: fs(0)},
        "c": {T1: fs(1), T2: fs(3, 4)},
        "d": {},
    }


def test_more_members_than_partitions_leaves_the_last_members_empty() -> None:
    topics = Topics({T0: 2})
    group = spec(HOMO, member("a", {T0}), member("b", {T0}), member("c", {T0}))
    assert RANGE.assign(group, topics) == {"a": {T0: fs(0)}, "b": {T0: fs(1)}, "c": {}}


def test_mislabelled_homogeneous_group_still_respects_subscriptions() -> None:
    topics = Topics({T0: 2, T1: 2})
    group = spec(HOMO, member("a", {T0}), member("b", {T0, T1}))
    assert RANGE.assign(group, topics) == {"a": {T0: fs(0)}, "b": {T0: fs(1), T1: fs(0, 1)}}


@pytest.mark.parametrize("kind", [HOMO, HETERO])
def test_unknown_topic_is_an_error(kind: SubscriptionType) -> None:
    with pytest.raises(AssignorError):
        RANGE.assign(spec(kind, member("a", {T2})), Topics({T0: 1}))


def test_no_members() -> None:
    assert RANGE.assign(GroupSpec({}, HOMO), Topics({})) == {}
