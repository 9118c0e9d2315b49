"""Offset-commit fencing: may an OffsetCommit or TxnOffsetCommit be forwarded?

Offsets stay in the broker; the engine only decides whether the committer is allowed to.
Rules (Kafka's ``ConsumerGroup.validateOffsetCommit`` and the relaxed-fencing design):

* no group: an epoch < 0 commit is accepted (admin tools, ``assign()`` users); otherwise
  GROUP_ID_NOT_FOUND (OffsetCommit v9+) or ILLEGAL_GENERATION (older versions and
  TxnOffsetCommit);
* epoch < 0 and the group has no members: accepted;
* TxnOffsetCommit without member id, generation and instance id: accepted;
* unknown member: UNKNOWN_MEMBER_ID; a consumer-protocol member committing with
  OffsetCommit < v9: UNSUPPORTED_VERSION;
* strict rule: commit epoch == member epoch;
* relaxed rule: commit epoch == member epoch, or commit epoch < member epoch and every
  partition is held by the member (assigned or pending revocation) with
  assignment epoch <= commit epoch. One rejected partition rejects the whole request.

A mismatch is STALE_MEMBER_EPOCH for consumer-protocol members, ILLEGAL_GENERATION for
classic members and for every TxnOffsetCommit.

One deliberate addition to Kafka's rules (``GroupConfig.fence_partitions_held_by_others``,
on by default): a partition currently held by *another* member is rejected even when the
commit epoch equals the member epoch. Kafka (strict and relaxed alike) accepts any partition
at the current member epoch, which lets a zombie commit through in this case, found by the
simulator: member A revokes partition P but stays at its old epoch because it still has other
partitions to revoke (UNREVOKED_PARTITIONS); P is handed to B; a late commit from A for P at
A's (still current) epoch would overwrite B's progress. A correct client only commits
partitions it owns, and a partition a client owns is never held by another member, so no
legitimate commit is rejected by this check.
"""

from __future__ import annotations

from collections.abc import Iterable

from translation.config import OffsetCommitRule
from translation.errors import ErrorCode
from translation.group import ConsumerGroup
from translation.member import MemberProtocol
from translation.topics import TopicId

UNKNOWN_GENERATION_ID = -1


def validate_offset_commit(
    group: ConsumerGroup | None,
    member_id: str,
    member_epoch: int,
    partitions: Iterable[tuple[TopicId, int]],
    *,
    instance_id: str | None,
    transactional: bool,
    api_version: int,
    rule: OffsetCommitRule,
    fence_partitions_held_by_others: bool = True,
) -> ErrorCode:
    if group is None:
        if member_epoch < 0:
            return ErrorCode.NONE
        if not transactional and api_version >= 9:
            return ErrorCode.GROUP_ID_NOT_FOUND
        return ErrorCode.ILLEGAL_GENERATION
    if member_epoch < 0 and not group.members:
        return ErrorCode.NONE
    if (
        transactional
        and member_epoch == UNKNOWN_GENERATION_ID
        and not member_id
        and instance_id is None
    ):
        return ErrorCode.NONE
    member = group.members.get(member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    classic = member.protocol is MemberProtocol.CLASSIC
    if not transactional and not classic and api_version < 9:
        return ErrorCode.UNSUPPORTED_VERSION
    mismatch = (
        ErrorCode.ILLEGAL_GENERATION if transactional or classic else ErrorCode.STALE_MEMBER_EPOCH
    )
    if member_epoch > member.member_epoch:
        return mismatch
    items = partitions if isinstance(partitions, list | tuple) else list(partitions)
    if fence_partitions_held_by_others:
        owner = group.owners.owner
        for topic_id, partition in items:
            holder = owner(topic_id, partition)
            if holder is not None and holder != member_id:
                return mismatch
    if member_epoch == member.member_epoch:
        return ErrorCode.NONE
    if rule is OffsetCommitRule.STRICT:
        return mismatch
    for topic_id, partition in items:
        assignment_epoch = member.assignment_epoch(topic_id, partition)
        if assignment_epoch is None or assignment_epoch > member_epoch:
            return mismatch
    return ErrorCode.NONE
