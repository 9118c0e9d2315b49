"""Deterministic assignor workloads, shaped after Kafka's assignor JMH benchmark.

A workload is ``members`` x ``partitions_per_member`` partitions spread evenly over ``topics``
topics. Homogeneous: everyone subscribes to every topic. Heterogeneous: member ``i`` subscribes
to the topics ``t`` with ``t % 3 != i % 3`` (two thirds of them, overlapping). Topic ids and
member ids come from a seeded RNG, so the same parameters always give the same input.

*Incremental* cases start from a stable target (the full assignment computed by groupgate's
assignor of the same name) and add one member with nothing assigned. Both the Python side and
the Java harness read exactly that input: the text format written by :func:`write_case` is what
``AssignorBench.java`` parses.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from translation.assignors import GroupSpec, MemberSubscription, SubscriptionType
from translation.topics import TopicId, TopicMetadata, TopicsImage

__all__ = [
    "ImageDescriber",
    "Workload",
    "assignment_digest",
    "build_workload",
    "moved_partitions",
    "with_new_member",
    "write_case",
]


class ImageDescriber:
    """``SubscribedTopicDescriber`` over a :class:`TopicsImage`."""

    def __init__(self, image: TopicsImage) -> None:
        self._counts = {t: m.partitions for t, m in image.by_id.items()}

    def partition_count(self, topic_id: TopicId) -> int:
        return self._counts.get(topic_id, -1)


@dataclass(frozen=True, slots=True)
class Workload:
    group: GroupSpec
    image: TopicsImage
    topic_order: tuple[TopicId, ...]


def _uuid(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def build_workload(
    members: int,
    partitions_per_member: int,
    topics: int,
    *,
    homogeneous: bool,
    seed: int = 848,
) -> Workload:
    """A group with no current assignment (the *full* case)."""
    rng = random.Random(f"{seed}:{members}:{partitions_per_member}:{topics}:{homogeneous}")
    total = members * partitions_per_member
    per_topic, extra = divmod(total, topics)
    metas = [
        TopicMetadata(_uuid(rng), f"topic-{t}", per_topic + (1 if t < extra else 0))
        for t in range(topics)
    ]
    topic_ids = tuple(m.topic_id for m in metas)
    everything = frozenset(topic_ids)
    patterns = [frozenset(t for k, t in enumerate(topic_ids) if k % 3 != j) for j in range(3)]
    subs: dict[str, MemberSubscription] = {}
    for i in range(members):
        member_id = str(_uuid(rng))
        # Each member gets its own set object, as an engine building them per member would.
        shared = everything if homogeneous or topics < 3 else patterns[i % 3]
        subscribed = frozenset(set(shared))
        subs[member_id] = MemberSubscription(member_id, None, None, subscribed, {})
    kind = SubscriptionType.HOMOGENEOUS if homogeneous else SubscriptionType.HETEROGENEOUS
    return Workload(GroupSpec(subs, kind), TopicsImage.of(metas), topic_ids)


def with_new_member(
    workload: Workload,
    target: Mapping[str, Mapping[TopicId, frozenset[int]]],
    *,
    seed: int = 1,
) -> Workload:
    """The *incremental* case: ``target`` as everyone's current assignment, plus one member."""
    rng = random.Random(f"new-member:{seed}")
    members = dict(workload.group.members)
    subs: dict[str, MemberSubscription] = {}
    for member_id, m in members.items():
        subs[member_id] = MemberSubscription(
            member_id, m.instance_id, m.rack_id, m.subscribed_topic_ids, dict(target[member_id])
        )
    newcomer = str(_uuid(rng))
    template = next(iter(members.values()))
    subs[newcomer] = MemberSubscription(newcomer, None, None, template.subscribed_topic_ids, {})
    group = GroupSpec(subs, workload.group.subscription_type)
    return Workload(group, workload.image, workload.topic_order)


def _ranges(parts: Iterable[int]) -> str:
    """``0-3,7,9-10`` for {0,1,2,3,7,9,10}."""
    out: list[str] = []
    ordered = sorted(parts)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def write_case(workload: Workload, path: Path) -> None:
    """Write the workload in the harness's text format.

    ::

        type HOMOGENEOUS
        topics <T>
        <topic uuid> <partitions>                       (T lines; index = line number)
        members <M>
        <member id> <instance id or -> <topic indices a,b,c or -> <assignment or ->
        assignment = <topic index>:<ranges>;<topic index>:<ranges>   ranges = 0-3,7
    """
    index = {t: k for k, t in enumerate(workload.topic_order)}
    lines = [f"type {workload.group.subscription_type.name}", f"topics {len(index)}"]
    for t in workload.topic_order:
        lines.append(f"{t} {workload.image.by_id[t].partitions}")
    members = workload.group.members
    lines.append(f"members {len(members)}")
    subs_text: dict[frozenset[TopicId], str] = {}
    for member_id, m in members.items():
        subs = subs_text.get(m.subscribed_topic_ids)
        if subs is None:
            subs = ",".join(str(k) for k in sorted(index[t] for t in m.subscribed_topic_ids))
            subs_text[m.subscribed_topic_ids] = subs
        assigned = ";".join(
            f"{index[t]}:{_ranges(ps)}"
            for t, ps in sorted(m.assigned_partitions.items(), key=lambda kv: index[kv[0]])
            if ps
        )
        lines.append(f"{member_id} {m.instance_id or '-'} {subs or '-'} {assigned or '-'}")
    path.write_text("\n".join(lines) + "\n")


def assignment_digest(assignment: Mapping[str, Mapping[TopicId, frozenset[int]]]) -> str:
    """A digest of an assignment that the Java harness computes the same way.

    SHA-256 over the sorted lines ``<member id> <topic uuid> <ranges>`` (non-empty entries),
    each followed by a newline; the first 16 hex digits.
    """
    rows = sorted(
        f"{member_id} {t} {_ranges(ps)}"
        for member_id, per_topic in assignment.items()
        for t, ps in per_topic.items()
        if ps
    )
    h = hashlib.sha256()
    for row in rows:
        h.update(row.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def moved_partitions(
    group: GroupSpec, assignment: Mapping[str, Mapping[TopicId, frozenset[int]]]
) -> int:
    """Partitions whose owner differs from the group's current assignment (previously unowned
    partitions count when they get an owner)."""
    before: dict[TopicId, dict[int, str]] = {}
    for member_id, m in group.members.items():
        for t, ps in m.assigned_partitions.items():
            owners = before.setdefault(t, {})
            for p in ps:
                owners[p] = member_id
    moved = 0
    for member_id, per_topic in assignment.items():
        for t, ps in per_topic.items():
            owners = before.get(t, {})
            moved += sum(1 for p in ps if owners.get(p) != member_id)
    return moved
