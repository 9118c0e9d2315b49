"""Which member currently holds each partition (the coordinator's side of ownership).

A partition is *held* by a member from the moment it is added to the member's assigned
partitions until the member has revoked it (it stays held while pending revocation).
Reconciliation hands a target partition to its new owner only once nobody holds it, which is
what guarantees that no two members ever own a partition at once. Kafka keeps this as a
partition -> owner-epoch map; here the map stores the owner's member id and the owner epoch
is read from the member, so that bumping a member's epoch does not rewrite its partitions.
"""

from __future__ import annotations

from collections.abc import Iterable

from translation.topics import TopicId


class OwnershipError(AssertionError):
    """An internal invariant broke: a partition would be held by two members."""


class PartitionOwners:
    __slots__ = ("_owners",)

    def __init__(self) -> None:
        self._owners: dict[TopicId, dict[int, str]] = {}

    def owner(self, topic_id: TopicId, partition: int) -> str | None:
        ps = self._owners.get(topic_id)
        return None if ps is None else ps.get(partition)

    def add(self, member_id: str, topic_id: TopicId, partitions: Iterable[int]) -> None:
        ps = self._owners.get(topic_id)
        if ps is None:
            ps = self._owners[topic_id] = {}
        for p in partitions:
            prev = ps.get(p)
            if prev is not None and prev != member_id:
                raise OwnershipError(
                    f"partition {topic_id}-{p} given to {member_id} while {prev} still holds it"
                )
            ps[p] = member_id

    def remove(self, member_id: str, topic_id: TopicId, partitions: Iterable[int]) -> None:
        ps = self._owners.get(topic_id)
        if ps is None:
            return
        for p in partitions:
            prev = ps.get(p)
            if prev == member_id:
                del ps[p]
            elif prev is not None:
                raise OwnershipError(f"{member_id} releases {topic_id}-{p} which is held by {prev}")
        if not ps:
            del self._owners[topic_id]

    def items(self) -> Iterable[tuple[TopicId, int, str]]:
        for topic_id, ps in self._owners.items():
            for p, member_id in ps.items():
                yield topic_id, p, member_id

    def __len__(self) -> int:
        return sum(len(ps) for ps in self._owners.values())
