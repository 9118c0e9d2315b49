"""The ``uniform`` server-side assignor: balance first, then stickiness.

Behaves like Kafka's ``UniformAssignor`` (the default assignor of KIP-848 groups):

* Homogeneous groups (everyone subscribes to the same topics) are treated as one pool of ``P``
  partitions shared by ``M`` members: every member gets ``P // M`` partitions and ``P % M`` of them
  one more. Members keep what they currently own up to their quota; the extra slots go first to
  members that already own more than the minimum (so they lose nothing); the surplus and the
  never-assigned partitions are handed out in contiguous runs to members under quota. Work is
  ``O(P + M log M)`` and done with set operations on plain ints; unchanged members reuse their
  frozensets.
* Heterogeneous groups: partitions of topics a member no longer subscribes to are revoked, the
  unassigned partitions are handed out topic by topic to the least loaded subscribers, then a
  bounded balancing pass moves partitions from the most to the least loaded subscriber of each
  topic, moving partitions that changed hands in this round before ones a member already owned.

The result is deterministic: members are visited in member-id order and topics in topic-id
order, whatever the iteration order of the input mappings. Rack ids are ignored, as in Kafka.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping
from typing import Final

from translation.assignors.base import (
    Assignment,
    AssignorError,
    GroupSpec,
    MemberSubscription,
    looks_homogeneous,
)
from translation.topics import SubscribedTopicDescriber, TopicId

__all__ = ["UniformAssignor"]

MAX_BALANCE_ROUNDS: Final = 16
"""Rounds over all topics in the heterogeneous balancing pass (Kafka uses the same bound)."""


def _partition_counts(
    topic_ids: frozenset[TopicId] | set[TopicId], topics: SubscribedTopicDescriber
) -> dict[TopicId, int]:
    counts: dict[TopicId, int] = {}
    for topic_id in sorted(topic_ids):
        n = topics.partition_count(topic_id)
        if n < 0:
            raise AssignorError(f"members are subscribed to unknown topic {topic_id}")
        counts[topic_id] = n
    return counts


def _clean_current(
    group: GroupSpec, order: list[str], counts: Mapping[TopicId, int]
) -> dict[str, dict[TopicId, frozenset[int]]]:
    """Current assignments with out-of-range and doubly owned partitions removed.

    Only used when the input is inconsistent (which a correct engine never produces): the first
    member in member-id order keeps a partition claimed twice.
    """
    seen: dict[TopicId, set[int]] = {t: set() for t in counts}
    cleaned: dict[str, dict[TopicId, frozenset[int]]] = {}
    for member_id in order:
        out: dict[TopicId, frozenset[int]] = {}
        for topic_id, parts in group.members[member_id].assigned_partitions.items():
            taken = seen.get(topic_id)
            if taken is None:
                out[topic_id] = parts  # not a topic of interest; the caller drops it
                continue
            n = counts[topic_id]
            ok = frozenset(p for p in parts if 0 <= p < n and p not in taken)
            taken |= ok
            if ok:
                out[topic_id] = ok
        cleaned[member_id] = out
    return cleaned


class UniformAssignor:
    """Kafka's ``uniform`` assignor: balanced first, then sticky."""

    @property
    def name(self) -> str:
        return "uniform"

    def assign(
        self, group: GroupSpec, topics: SubscribedTopicDescriber
    ) -> dict[str, dict[TopicId, frozenset[int]]]:
        members = group.members
        if not members:
            return {}
        if looks_homogeneous(group):
            first = next(iter(members.values())).subscribed_topic_ids
            return _assign_homogeneous(group, first, topics)
        return _HeterogeneousBuilder(group, topics).build()


# --------------------------------------------------------------------------------------------
# Homogeneous


def _assign_homogeneous(
    group: GroupSpec, subscribed: frozenset[TopicId], topics: SubscribedTopicDescriber
) -> dict[str, dict[TopicId, frozenset[int]]]:
    members = group.members
    order = sorted(members)
    counts = _partition_counts(subscribed, topics)
    total = sum(counts.values())
    if total == 0:
        return {member_id: {} for member_id in order}

    current: Mapping[str, Assignment] = {m: members[m].assigned_partitions for m in order}

    # Pass 1: what everybody owns on the subscribed topics, and whether the input is consistent.
    owned: dict[TopicId, set[int]] = {t: set() for t in counts}
    claimed = dict.fromkeys(counts, 0)
    for member_id in order:
        for topic_id, parts in current[member_id].items():
            taken = owned.get(topic_id)
            if taken is not None and parts:
                taken |= parts
                claimed[topic_id] += len(parts)
    dirty = any(
        len(owned[t]) != claimed[t] or (owned[t] and (min(owned[t]) < 0 or max(owned[t]) >= n))
        for t, n in counts.items()
    )
    if dirty:
        current = _clean_current(group, order, counts)
        owned = {t: set() for t in counts}
        for member_id in order:
            for topic_id, parts in current[member_id].items():
                taken = owned.get(topic_id)
                if taken is not None:
                    taken |= parts

    # Pass 2: per-member owned counts on subscribed topics; whether the mapping can be reused.
    owned_count: list[int] = []
    reusable: list[bool] = []
    for member_id in order:
        n_owned = 0
        clean = True
        for topic_id, parts in current[member_id].items():
            if topic_id in counts and parts:
                n_owned += len(parts)
            else:
                clean = False
        owned_count.append(n_owned)
        reusable.append(clean)

    # Quotas: min_quota for everyone, +1 for `extra` members, preferring those that own more
    # than the minimum (they keep that partition instead of giving it up).
    n_members = len(order)
    min_quota, extra = divmod(total, n_members)
    quota = [min_quota] * n_members
    if extra:
        for i in range(n_members):
            if owned_count[i] > min_quota:
                quota[i] += 1
                extra -= 1
                if not extra:
                    break
        if extra:
            for i in range(n_members):
                if quota[i] == min_quota:
                    quota[i] += 1
                    extra -= 1
                    if not extra:
                        break

    # Pass 3: keep up to quota, revoke the surplus, note who is short.
    result: dict[str, dict[TopicId, frozenset[int]]] = {}
    short: list[tuple[str, int]] = []
    for i, member_id in enumerate(order):
        have = owned_count[i]
        q = quota[i]
        assignment = current[member_id]
        if have <= q:
            if reusable[i]:
                result[member_id] = dict(assignment)
            else:
                result[member_id] = {t: ps for t, ps in assignment.items() if ps and t in counts}
            if have < q:
                short.append((member_id, q - have))
            continue
        # Over quota: keep whole topics in topic-id order, the lowest partitions of the last one.
        room = q
        kept: dict[TopicId, frozenset[int]] = {}
        for topic_id in sorted(t for t, ps in assignment.items() if ps and t in counts):
            parts = assignment[topic_id]
            if room >= len(parts):
                kept[topic_id] = parts
                room -= len(parts)
                continue
            ordered = sorted(parts)
            if room:
                kept[topic_id] = frozenset(ordered[:room])
            owned[topic_id].difference_update(ordered[room:])
            room = 0
        result[member_id] = kept

    if not short:
        return result

    # Pass 4: hand the unassigned partitions out in contiguous runs, topic by topic.
    pools: list[tuple[TopicId, list[int]]] = []
    for topic_id, n in counts.items():
        taken = owned[topic_id]
        if len(taken) < n:
            free = sorted(set(range(n)).difference(taken)) if taken else list(range(n))
            pools.append((topic_id, free))
    pool_index = 0
    pos = 0
    for member_id, need in short:
        target = result[member_id]
        while need:
            topic_id, free = pools[pool_index]
            run = free[pos : pos + need]
            pos += len(run)
            need -= len(run)
            have_parts = target.get(topic_id)
            target[topic_id] = have_parts.union(run) if have_parts is not None else frozenset(run)
            if pos == len(free):
                pool_index += 1
                pos = 0
    return result


# --------------------------------------------------------------------------------------------
# Heterogeneous


class _HeterogeneousBuilder:
    """State of one heterogeneous assignment.

    Members are numbered in member-id order and topics in topic-id order; inside the builder
    both are plain ints (hashing a ``uuid.UUID`` runs Python code, hashing an int does not).
    Subscriptions are translated once per distinct subscription set.
    """

    def __init__(self, group: GroupSpec, topics: SubscribedTopicDescriber) -> None:
        self.member_ids = sorted(group.members)
        subs: list[MemberSubscription] = [group.members[m] for m in self.member_ids]
        universe: set[TopicId] = set()
        distinct: dict[frozenset[TopicId], frozenset[int]] = {}
        for sub in subs:
            if sub.subscribed_topic_ids not in distinct:
                distinct[sub.subscribed_topic_ids] = frozenset()
                universe.update(sub.subscribed_topic_ids)
        counts = _partition_counts(universe, topics)
        self.topic_ids: list[TopicId] = list(counts)
        self.topic_index: dict[TopicId, int] = {t: k for k, t in enumerate(self.topic_ids)}
        self.counts: list[int] = list(counts.values())
        for topic_set in distinct:
            distinct[topic_set] = frozenset(self.topic_index[t] for t in topic_set)
        self.subscriptions = [distinct[sub.subscribed_topic_ids] for sub in subs]
        # Subscribers per topic in ascending member order, built per distinct subscription.
        by_subscription: dict[frozenset[int], list[int]] = {}
        for i, indices in enumerate(self.subscriptions):
            by_subscription.setdefault(indices, []).append(i)
        self.subscribers: list[list[int]] = [[] for _ in self.topic_ids]
        for indices, member_indices in by_subscription.items():
            for k in indices:
                self.subscribers[k].extend(member_indices)
        if len(by_subscription) > 1:
            for subscribers in self.subscribers:
                subscribers.sort()
        # held[i][k]: frozenset while untouched (shared with the input), set once modified.
        self.held: list[dict[int, frozenset[int] | set[int]]] = []
        # Partitions given to a member in this round, per topic, in the order they were given.
        self.fresh: list[dict[int, list[int]]] = [{} for _ in self.member_ids]
        self.sizes = [0] * len(self.member_ids)
        self.owned: list[set[int]] = [set() for _ in self.topic_ids]
        self._load_current(subs)

    def _load_current(self, subs: list[MemberSubscription]) -> None:
        counts = self.counts
        topic_index = self.topic_index
        owned = self.owned
        sizes = self.sizes
        for i, sub in enumerate(subs):
            mine: dict[int, frozenset[int] | set[int]] = {}
            subscribed = self.subscriptions[i]
            for topic_id, parts in sub.assigned_partitions.items():
                k = topic_index.get(topic_id, -1)
                if not parts or k not in subscribed:
                    continue  # revoked: no longer subscribed
                taken = owned[k]
                n = counts[k]
                if taken.isdisjoint(parts) and min(parts) >= 0 and max(parts) < n:
                    keep: frozenset[int] = parts
                else:
                    keep = frozenset(p for p in parts if 0 <= p < n and p not in taken)
                    if not keep:
                        continue
                taken |= keep
                mine[k] = keep
                sizes[i] += len(keep)
            self.held.append(mine)

    def _topic_order(self, topics: list[int]) -> list[int]:
        """Partitions per subscriber descending, then subscriber count, then topic id."""
        counts = self.counts
        subscribers = self.subscribers

        def key(k: int) -> tuple[float, int, int]:
            s = len(subscribers[k])
            return (-counts[k] / s, s, k)

        return sorted(topics, key=key)

    def _give(self, i: int, k: int, parts: list[int]) -> None:
        mine = self.held[i]
        cur = mine.get(k)
        if cur is None:
            mine[k] = set(parts)
        elif isinstance(cur, set):
            cur.update(parts)
        else:
            mine[k] = set(cur).union(parts)
        fresh = self.fresh[i].get(k)
        if fresh is None:
            self.fresh[i][k] = list(parts)
        else:
            fresh.extend(parts)
        self.sizes[i] += len(parts)

    def _take_one(self, i: int, k: int) -> int:
        """Remove and return one of member ``i``'s partitions of topic ``k``.

        Partitions it received in this round go first (latest first), so that partitions it
        owned before stay with it; otherwise its highest-numbered partition.
        """
        mine = self.held[i]
        cur = mine[k]
        fresh = self.fresh[i].get(k)
        p = fresh.pop() if fresh else max(cur)
        if isinstance(cur, frozenset):
            cur = set(cur)
            mine[k] = cur
        cur.discard(p)
        if not cur:
            del mine[k]
        self.sizes[i] -= 1
        return p

    def _assign_unassigned(self) -> None:
        sizes = self.sizes
        for k in self._topic_order([k for k, s in enumerate(self.subscribers) if s]):
            n = self.counts[k]
            taken = self.owned[k]
            if len(taken) >= n:
                continue
            free = sorted(set(range(n)).difference(taken)) if taken else list(range(n))
            # subscribers[k] is in ascending member order and sorted() is stable, so this is
            # (size, member) order.
            subscribers = sorted(self.subscribers[k], key=sizes.__getitem__)
            pos = 0
            for j, amount in _water_fill([sizes[i] for i in subscribers], len(free)):
                if amount:
                    self._give(subscribers[j], k, free[pos : pos + amount])
                    pos += amount
            taken.update(free)

    def _balance(self) -> None:
        movable = [k for k, s in enumerate(self.subscribers) if len(s) >= 2]
        if not movable:
            return
        order = self._topic_order(movable)
        last_moved = -1
        for _ in range(MAX_BALANCE_ROUNDS):
            for index, k in enumerate(order):
                if index == last_moved:
                    return  # a full round without moves
                if self._balance_topic(k) or last_moved == -1:
                    last_moved = index

    def _balance_topic(self, k: int) -> int:
        sizes = self.sizes
        held = self.held
        subscribers = self.subscribers[k]
        levels = [sizes[i] for i in subscribers]
        if max(levels) - min(levels) <= 1:
            return 0
        low = list(zip(levels, subscribers, strict=True))
        heapq.heapify(low)
        high = [(-sizes[i], i) for i in subscribers if k in held[i]]
        heapq.heapify(high)
        moved = 0
        while high:
            neg, donor = high[0]
            if -neg != sizes[donor] or k not in held[donor]:
                heapq.heappop(high)  # stale: a fresh entry was pushed when it changed
                continue
            while low[0][0] != sizes[low[0][1]]:
                heapq.heappop(low)
            receiver = low[0][1]
            if sizes[donor] - sizes[receiver] <= 1:
                break
            p = self._take_one(donor, k)
            self._give(receiver, k, [p])
            heapq.heapreplace(low, (sizes[receiver], receiver))
            heapq.heappush(low, (sizes[donor], donor))
            heapq.heappop(high)
            if k in held[donor]:
                heapq.heappush(high, (-sizes[donor], donor))
            heapq.heappush(high, (-sizes[receiver], receiver))
            moved += 1
        return moved

    def build(self) -> dict[str, dict[TopicId, frozenset[int]]]:
        self._assign_unassigned()
        self._balance()
        topic_ids = self.topic_ids
        result: dict[str, dict[TopicId, frozenset[int]]] = {}
        for member_id, mine in zip(self.member_ids, self.held, strict=True):
            result[member_id] = {
                topic_ids[k]: ps if isinstance(ps, frozenset) else frozenset(ps)
                for k, ps in sorted(mine.items())
            }
        return result


def _water_fill(levels: list[int], amount: int) -> list[tuple[int, int]]:
    """Spread ``amount`` units over bins with ascending ``levels``, lowest bins first.

    Returns ``(bin index, units)`` pairs: the result raises the lowest bins to a common level
    (give or take one, the extra units going to the earliest bins). ``levels`` must be sorted.
    """
    if not levels or amount <= 0:
        return []
    level = levels[0]
    k = bisect.bisect_right(levels, level)  # bins [0, k) are at ``level``
    remaining = amount
    while k < len(levels):
        step = (levels[k] - level) * k
        if step > remaining:
            break
        remaining -= step
        level = levels[k]
        k = bisect.bisect_right(levels, level, k)
    per, extra = divmod(remaining, k)
    end = k
    if per == 0:
        # Bins already at ``level`` past the first ``extra`` get nothing: leave them out.
        end = max(extra, bisect.bisect_left(levels, level, 0, k))
    return [(j, level - levels[j] + per + (1 if j < extra else 0)) for j in range(end)]
