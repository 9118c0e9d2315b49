"""Hypothesis strategies and checks shared by the assignor tests.

Groups are small (a handful of topics and members) so that hypothesis explores many shapes:
empty topics, more members than partitions, members with no subscription, static members, and
arbitrary (also inconsistent) current assignments.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from hypothesis import strategies as st

from translation.assignors import GroupSpec, MemberSubscription, SubscriptionType
from translation.topics import TopicId

Result = Mapping[str, Mapping[TopicId, frozenset[int]]]


class Topics:
    """A ``SubscribedTopicDescriber`` over a plain dict."""

    def __init__(self, counts: Mapping[TopicId, int]) -> None:
        self.counts = dict(counts)

    def partition_count(self, topic_id: TopicId) -> int:
        return self.counts.get(topic_id, -1)


def topic_id(k: int) -> TopicId:
    return uuid.UUID(int=(k * 0x9E3779B97F4A7C15 + 1) % (1 << 128))


@st.composite
def topic_sets(draw: st.DrawFn) -> Topics:
    n = draw(st.integers(1, 5))
    return Topics({topic_id(k): draw(st.integers(0, 12)) for k in range(n)})


@st.composite
def groups(
    draw: st.DrawFn,
    *,
    homogeneous: bool | None = None,
    with_current: bool = True,
    max_members: int = 8,
) -> tuple[GroupSpec, Topics]:
    """A group and its topics. ``homogeneous=None`` draws either kind."""
    topics = draw(topic_sets())
    tids = sorted(topics.counts)
    if homogeneous is None:
        homogeneous = draw(st.booleans())
    n_members = draw(st.integers(1, max_members))
    member_ids = draw(
        st.lists(
            st.text("abcdefgh0123", min_size=1, max_size=4),
            min_size=n_members,
            max_size=n_members,
            unique=True,
        )
    )
    common = frozenset(draw(st.lists(st.sampled_from(tids), min_size=1, unique=True)))
    members: dict[str, MemberSubscription] = {}
    instance_pool = iter(range(1000))
    for member_id in member_ids:
        subscribed = (
            common if homogeneous else frozenset(draw(st.lists(st.sampled_from(tids), unique=True)))
        )
        instance = f"i{next(instance_pool)}" if draw(st.booleans()) else None
        current: dict[TopicId, frozenset[int]] = {}
        if with_current:
            for t in draw(st.lists(st.sampled_from(tids), unique=True)):
                hi = topics.counts[t] + 1  # one past the end: inconsistent input on purpose
                parts = draw(st.frozensets(st.integers(0, hi), max_size=6))
                if parts:
                    current[t] = parts
        members[member_id] = MemberSubscription(member_id, instance, None, subscribed, current)
    kind = SubscriptionType.HOMOGENEOUS if homogeneous else SubscriptionType.HETEROGENEOUS
    return GroupSpec(members, kind), topics


def check_valid(group: GroupSpec, topics: Topics, result: Result) -> None:
    """Every subscribed partition goes to exactly one subscriber; nothing else is assigned."""
    assert set(result) == set(group.members)
    owner: dict[tuple[TopicId, int], str] = {}
    for member_id, per_topic in result.items():
        subscribed = group.members[member_id].subscribed_topic_ids
        for t, parts in per_topic.items():
            assert t in subscribed, f"{member_id} got unsubscribed topic {t}"
            assert parts, "empty partition sets are left out"
            assert isinstance(parts, frozenset)
            for p in parts:
                assert 0 <= p < topics.counts[t]
                assert (t, p) not in owner, f"{t}:{p} assigned twice"
                owner[(t, p)] = member_id
    wanted = {t for m in group.members.values() for t in m.subscribed_topic_ids}
    for t in wanted:
        for p in range(topics.counts[t]):
            assert (t, p) in owner, f"{t}:{p} left unassigned"


def sizes(result: Result) -> dict[str, int]:
    return {m: sum(len(ps) for ps in per_topic.values()) for m, per_topic in result.items()}


def with_current(group: GroupSpec, current: Result) -> GroupSpec:
    """The same group with ``current`` as every member's current assignment."""
    members = {
        m: MemberSubscription(
            m, s.instance_id, s.rack_id, s.subscribed_topic_ids, dict(current.get(m, {}))
        )
        for m, s in group.members.items()
    }
    return GroupSpec(members, group.subscription_type)


def reversed_group(group: GroupSpec) -> GroupSpec:
    """The same group with members (and each member's topics) in reverse insertion order."""
    members = {
        m: MemberSubscription(
            s.member_id,
            s.instance_id,
            s.rack_id,
            s.subscribed_topic_ids,
            dict(reversed(list(s.assigned_partitions.items()))),
        )
        for m, s in reversed(list(group.members.items()))
    }
    return GroupSpec(members, group.subscription_type)
