"""The ``range`` server-side assignor: contiguous partition ranges per topic.

Behaves like the ``RangeAssignor`` of Kafka's group coordinator (4.x):

* Members are ordered static first (by instance id), then dynamic ones (by member id). A static
  member that restarts under a new member id keeps its place, hence its ranges.
* For every topic, its subscribers in that order receive contiguous ranges: ``n // s``
  partitions each and the first ``n % s`` subscribers one more.
* In a homogeneous group every topic is split over the same ordered member list, so topics with
  equal partition counts are co-partitioned: a member gets the same partition numbers of each.

Like Kafka's 4.x assignor it does not look at the current assignment: the output depends only
on subscriptions, instance ids, member ids and partition counts. (Kafka's pre-4.0 server-side
range assignor also kept previously owned partitions up to the quota; the one shipped in
kafka-group-coordinator 4.4.0 does not, and neither does this one.) The work is
``O(M log M + T + P)``: only members that receive something are visited per topic, and
identical ranges share one frozenset. Rack ids are ignored, as in Kafka.
"""

from __future__ import annotations

from translation.assignors.base import AssignorError, GroupSpec, looks_homogeneous
from translation.topics import SubscribedTopicDescriber, TopicId

__all__ = ["RangeAssignor", "range_member_order"]


def range_member_order(group: GroupSpec) -> list[str]:
    """Member ids static first (ordered by instance id), then dynamic (ordered by member id)."""
    members = group.members
    static = sorted(
        (m.instance_id, member_id) for member_id, m in members.items() if m.instance_id is not None
    )
    dynamic = sorted(member_id for member_id, m in members.items() if m.instance_id is None)
    return [member_id for _, member_id in static] + dynamic


class RangeAssignor:
    """Kafka's ``range`` assignor: per-topic contiguous ranges, co-partitioned when possible."""

    @property
    def name(self) -> str:
        return "range"

    def assign(
        self, group: GroupSpec, topics: SubscribedTopicDescriber
    ) -> dict[str, dict[TopicId, frozenset[int]]]:
        members = group.members
        if not members:
            return {}
        order = range_member_order(group)
        result: dict[str, dict[TopicId, frozenset[int]]] = {m: {} for m in order}

        # Members sharing a subscription set are handled together, and so are topics with the
        # same partition count and the same subscribers: they get identical ranges. Per member,
        # a whole class of topics is written with dict.fromkeys over a dict of those topics,
        # which reuses the stored key hashes (hashing a uuid.UUID runs Python code).
        if looks_homogeneous(group):
            first = members[order[0]].subscribed_topic_ids
            shared: dict[frozenset[TopicId], list[str]] = {first: order}
        else:
            shared = {}
            for member_id in order:
                shared.setdefault(members[member_id].subscribed_topic_ids, []).append(member_id)
        subscription_lists = list(shared.values())
        topic_subscriptions: dict[TopicId, list[int]] = {}
        for s, topic_set in enumerate(shared):
            for topic_id in topic_set:
                topic_subscriptions.setdefault(topic_id, []).append(s)

        classes: dict[tuple[int, tuple[int, ...]], dict[TopicId, None]] = {}
        for topic_id in sorted(topic_subscriptions):
            n = topics.partition_count(topic_id)
            if n < 0:
                raise AssignorError(f"members are subscribed to unknown topic {topic_id}")
            key = (n, tuple(topic_subscriptions[topic_id]))
            classes.setdefault(key, {})[topic_id] = None

        position = {member_id: i for i, member_id in enumerate(order)}
        ranges: dict[tuple[int, int], frozenset[int]] = {}
        for (n, subscription_ids), class_topics in classes.items():
            if len(subscription_ids) == 1:
                subs = subscription_lists[subscription_ids[0]]
            else:
                subs = sorted(
                    (m for s in subscription_ids for m in subscription_lists[s]),
                    key=position.__getitem__,
                )
            quota, extra = divmod(n, len(subs))
            start = 0
            for index in range(min(n, len(subs))):
                end = start + quota + (1 if index < extra else 0)
                parts = ranges.get((start, end))
                if parts is None:
                    parts = ranges[(start, end)] = frozenset(range(start, end))
                target = result[subs[index]]
                if target:
                    target.update(dict.fromkeys(class_topics, parts))
                else:
                    result[subs[index]] = dict.fromkeys(class_topics, parts)
                start = end
        return result
