"""The ``uniform`` assignor: balance bounds, stickiness under membership changes, examples."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.unit.assignors.strategies import (
    Topics,
    check_valid,
    groups,
    sizes,
    topic_id,
    with_current,
)
from translation.assignors import (
    AssignorError,
    GroupSpec,
    MemberSubscription,
    SubscriptionType,
    UniformAssignor,
)
from translation.topics import TopicId

UNIFORM = UniformAssignor()
HOMO = SubscriptionType.HOMOGENEOUS
HETERO = SubscriptionType.HETEROGENEOUS
T0, T1, T2 = topic_id(0), topic_id(1), topic_id(2)


def member(
    member_id: str,
    topics: set[TopicId],
    current: dict[TopicId, frozenset[int]] | None = None,
    instance_id: str | None = None,
) -> MemberSubscription:
    return MemberSubscription(member_id, instance_id, None, frozenset(topics), current or {})


def spec(kind: SubscriptionType, *members: MemberSubscription) -> GroupSpec:
    return GroupSpec({m.member_id: m for m in members}, kind)


@settings(max_examples=300, deadline=None)
@given(case=groups(homogeneous=True))
def test_homogeneous_sizes_differ_by_at_most_one(case: tuple[GroupSpec, Topics]) -> None:
    group, topics = case
    result = UNIFORM.assign(group, topics)
    counts = sizes(result)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert sum(counts.values()) == sum(
        topics.counts[t] for t in next(iter(group.members.values())).subscribed_topic_ids
    )


@settings(max_examples=300, deadline=None)
@given(case=groups(homogeneous=False))
def test_heterogeneous_no_topic_can_improve_balance(case: tuple[GroupSpec, Topics]) -> None:
    """For each topic, no subscriber holding one of its partitions has two more partitions in
    total than another subscriber (moving one would improve the balance)."""
    group, topics = case
    result = UNIFORM.assign(group, topics)
    counts = sizes(result)
    subscribers: dict[TopicId, list[str]] = {}
    for m, s in group.members.items():
        for t in s.subscribed_topic_ids:
            subscribers.setdefault(t, []).append(m)
    for t, subs in subscribers.items():
        least = min(counts[m] for m in subs)
        for m in subs:
            if t in result[m]:
                assert counts[m] - least <= 1, (t, m, counts)


@settings(max_examples=300, deadline=None)
@given(case=groups(homogeneous=False, with_current=False))
def test_heterogeneous_with_identical_subscriptions_is_fully_balanced(
    case: tuple[GroupSpec, Topics],
) -> None:
    """Flagged heterogeneous but everyone subscribes to the same topics: the balance pass must
    reach the homogeneous bound."""
    group, topics = case
    common = next(iter(group.members.values())).subscribed_topic_ids
    assume(common)
    group = GroupSpec(
        {m: member(m, set(common), instance_id=s.instance_id) for m, s in group.members.items()},
        HETERO,
    )
    counts = sizes(UNIFORM.assign(group, topics))
    assert max(counts.values()) - min(counts.values()) <= 1


@settings(max_examples=300, deadline=None)
@given(case=groups(homogeneous=True, with_current=False), newcomer=st.text("xyz", min_size=5))
def test_homogeneous_adding_a_member_moves_only_what_it_receives(
    case: tuple[GroupSpec, Topics], newcomer: str
) -> None:
    group, topics = case
    stable = UNIFORM.assign(group, topics)
    subscribed = next(iter(group.members.values())).subscribed_topic_ids
    grown = dict(with_current(group, stable).members)
    grown[newcomer] = member(newcomer, set(subscribed))
    result = UNIFORM.assign(GroupSpec(grown, HOMO), topics)
    check_valid(GroupSpec(grown, HOMO), topics, result)
    total = sum(topics.counts[t] for t in subscribed)
    assert sizes(result)[newcomer] in {total // len(grown), -(-total // len(grown))}
    for m, before in stable.items():
        for t, parts in result[m].items():
            assert parts <= before.get(t, frozenset()), f"{m} received {t}"


@settings(max_examples=300, deadline=None)
@given(case=groups(homogeneous=True, with_current=False), data=st.data())
def test_homogeneous_removing_a_member_moves_only_its_partitions(
    case: tuple[GroupSpec, Topics], data: st.DataObject
) -> None:
    group, topics = case
    assume(len(group.members) >= 2)
    stable = UNIFORM.assign(group, topics)
    gone = data.draw(st.sampled_from(sorted(group.members)))
    shrunk = {m: s for m, s in with_current(group, stable).members.items() if m != gone}
    result = UNIFORM.assign(GroupSpec(shrunk, HOMO), topics)
    for m in shrunk:
        for t, parts in stable[m].items():
            assert parts <= result[m].get(t, frozenset()), f"{m} lost part of {t}"
    moved = sum(
        len(parts - stable[m].get(t, frozenset()))
        for m, per_topic in result.items()
        for t, parts in per_topic.items()
    )
    assert moved == sum(len(ps) for ps in stable[gone].values())


@settings(max_examples=200, deadline=None)
@given(case=groups(homogeneous=False, with_current=False), data=st.data())
def test_heterogeneous_unsubscribing_revokes_only_that_topic(
    case: tuple[GroupSpec, Topics], data: st.DataObject
) -> None:
    """A member dropping a topic loses exactly that topic's partitions; everything it holds of
    its other topics stays unless the balance pass needs it elsewhere."""
    group, topics = case
    stable = UNIFORM.assign(group, topics)
    candidates = sorted((m, t) for m, s in group.members.items() for t in s.subscribed_topic_ids)
    assume(candidates)
    m, t = data.draw(st.sampled_from(candidates))
    changed = dict(with_current(group, stable).members)
    old = changed[m]
    changed[m] = member(m, set(old.subscribed_topic_ids - {t}), dict(old.assigned_partitions))
    result = UNIFORM.assign(GroupSpec(changed, HETERO), topics)
    check_valid(GroupSpec(changed, HETERO), topics, result)
    assert t not in result[m]


def test_homogeneous_example_keeps_current_up_to_quota() -> None:
    topics = Topics({T0: 6})
    group = spec(
        HOMO,
        member("a", {T0}, {T0: frozenset({0, 1, 2, 3})}),
        member("b", {T0}, {T0: frozenset({4, 5})}),
        member("c", {T0}),
    )
    result = UNIFORM.assign(group, topics)
    assert result["a"] == {T0: frozenset({0, 1})}
    assert result["b"] == {T0: frozenset({4, 5})}
    assert result["c"] == {T0: frozenset({2, 3})}


def test_extra_partition_goes_to_a_member_that_already_holds_it() -> None:
    # 7 partitions, 3 members: quotas 3, 2, 2. "c" owns 3, so it keeps the extra slot.
    topics = Topics({T0: 7})
    group = spec(
        HOMO,
        member("a", {T0}, {T0: frozenset({0, 1})}),
        member("b", {T0}, {T0: frozenset({2, 3})}),
        member("c", {T0}, {T0: frozenset({4, 5, 6})}),
    )
    result = UNIFORM.assign(group, topics)
    assert result == {
        "a": {T0: frozenset({0, 1})},
        "b": {T0: frozenset({2, 3})},
        "c": {T0: frozenset({4, 5, 6})},
    }


def test_unchanged_members_reuse_their_frozensets() -> None:
    topics = Topics({T0: 4, T1: 4})
    a_parts = frozenset({0, 1, 2, 3})
    group = spec(
        HOMO,
        member("a", {T0, T1}, {T0: a_parts}),
        member("b", {T0, T1}, {T1: frozenset({0, 1, 2, 3})}),
    )
    result = UNIFORM.assign(group, topics)
    assert result["a"][T0] is a_parts


def test_heterogeneous_example() -> None:
    # a: T0 (6 partitions); b: T0 and T1 (2 partitions); c: T1.
    topics = Topics({T0: 6, T1: 2})
    group = spec(HETERO, member("a", {T0}), member("b", {T0, T1}), member("c", {T1}))
    result = UNIFORM.assign(group, topics)
    check_valid(group, topics, result)
    assert sorted(sizes(result).values()) == [2, 3, 3]
    assert len(result["c"][T1]) >= 1


def test_heterogeneous_keeps_partitions_and_revokes_unsubscribed_topic() -> None:
    topics = Topics({T0: 4, T1: 4})
    group = spec(
        HETERO,
        member("a", {T0}, {T0: frozenset({0, 1}), T1: frozenset({0, 1})}),
        member("b", {T0, T1}, {T0: frozenset({2, 3}), T1: frozenset({2, 3})}),
    )
    result = UNIFORM.assign(group, topics)
    check_valid(group, topics, result)
    # "a" loses T1; balance (4 and 4) then moves T0 2-3 from "b" to "a", "b" keeps T1 2-3.
    assert result["a"] == {T0: frozenset({0, 1, 2, 3})}
    assert result["b"] == {T1: frozenset({0, 1, 2, 3})}


def test_balance_pass_moves_newly_assigned_partitions_before_owned_ones() -> None:
    # "a" owns T0:3 and receives T0:0,2 (least loaded when T0 is handed out), then all of T1
    # ("c" is loaded with T2). Balancing T0 then moves two partitions from "a" to "b": the two
    # it just received, not the one it already owned.
    t3 = topic_id(3)
    topics = Topics({T0: 4, T1: 4, T2: 10, t3: 1})
    group = spec(
        HETERO,
        member("a", {T0, T1}, {T0: frozenset({3})}),
        member("b", {T0, t3}, {T0: frozenset({1}), t3: frozenset({0})}),
        member("c", {T1, T2}, {T2: frozenset(range(10))}),
    )
    result = UNIFORM.assign(group, topics)
    check_valid(group, topics, result)
    assert result["a"] == {T0: frozenset({3}), T1: frozenset({0, 1, 2, 3})}
    assert result["b"] == {T0: frozenset({0, 1, 2}), t3: frozenset({0})}
    assert result["c"] == {T2: frozenset(range(10))}


def test_duplicate_ownership_in_input_is_resolved() -> None:
    topics = Topics({T0: 4})
    for kind in (HOMO, HETERO):
        group = spec(
            kind,
            member("a", {T0}, {T0: frozenset({0, 1, 7})}),
            member("b", {T0}, {T0: frozenset({1, 2})}),
        )
        result = UNIFORM.assign(group, topics)
        check_valid(group, topics, result)
        assert 0 in result["a"][T0]
        assert 2 in result["b"][T0]


def test_no_partitions_and_no_members() -> None:
    assert UNIFORM.assign(GroupSpec({}, HOMO), Topics({})) == {}
    group = spec(HOMO, member("a", {T0}), member("b", {T0}))
    assert UNIFORM.assign(group, Topics({T0: 0})) == {"a": {}, "b": {}}


@pytest.mark.parametrize("kind", [HOMO, HETERO])
def test_unknown_topic_is_an_error(kind: SubscriptionType) -> None:
    group = spec(kind, member("a", {T2}))
    with pytest.raises(AssignorError):
        UNIFORM.assign(group, Topics({T0: 3}))


def test_large_homogeneous_increment_moves_only_to_the_newcomer() -> None:
    topics = Topics({topic_id(k): 1000 for k in range(10)})
    tids = set(topics.counts)
    group = GroupSpec({f"m{i:04d}": member(f"m{i:04d}", tids) for i in range(1000)}, HOMO)
    stable = UNIFORM.assign(group, topics)
    grown = dict(with_current(group, stable).members)
    grown["new"] = member("new", tids)
    result = UNIFORM.assign(GroupSpec(grown, HOMO), topics)
    assert sizes(result)["new"] == 10000 // 1001
    assert all(result[m][t] <= stable[m][t] for m in stable for t in result[m])


def test_mislabelled_homogeneous_group_still_respects_subscriptions() -> None:
    topics = Topics({T0: 2, T1: 2})
    group = spec(HOMO, member("a", {T0}), member("b", {T0, T1}))
    result = UNIFORM.assign(group, topics)
    check_valid(group, topics, result)
    assert T1 not in result["a"]
