"""Offsets of bridged members: the KIP-848 clients the proxy runs as classic members of a broker
group (:mod:`..bridged`, groups in the broker phase).

No engine validates them: the group's coordinator is the broker's, and the member the broker
knows is the bridged one. So where the engine's commit validation decides a coordinated group's
member (:mod:`.handlers`), the bridges' book decides a bridged client's, with Kafka's rules:

* OffsetCommit / TxnOffsetCommit (member fields): the commit is stamped once with its bridged
  member's broker member id and generation, after checking that its epoch is the member's at
  that generation and its partitions are the member's (else STALE_MEMBER_EPOCH, or the retriable
  COORDINATOR_LOAD_IN_PROGRESS while the member rejoins); a broker refusal of the stamped
  generation becomes COORDINATOR_LOAD_IN_PROGRESS, and the member is told it moved on.
* OffsetFetch v9+: the member's epoch is checked, and the member fields are stripped as for a
  coordinated group's member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.coordination.handler import Answer, GroupRequest, Outcome, Upstream, Value
from proxy.coordination.membership import MEMBERSHIP_LOST
from proxy.coordination.offsets.answers import commit_error, partition_errors, trace
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService


def bridged_commit(service: CoordinatorService, request: GroupRequest, member_fields_from: int
                   ) -> Outcome | None:
    """A commit of a bridged KIP-848 client: stamped once with its bridged member's broker
    member id and generation, or failed (STALE_MEMBER_EPOCH when its epoch or partitions are
    not the member's now); None: not a bridged member's (``member_fields_from``: the first
    version of the API carrying member fields)."""
    value = request.value
    group_id, member_id = value["group_id"], value.get("member_id") or ""
    if not member_id or request.version < member_fields_from:
        return None
    bridges = service.bridges
    target = bridges.commit_target(
        group_id, member_id, value.get("generation_id_or_member_epoch", -1),
        [(t.get("name"), t.get("topic_id"), p["partition_index"])
         for t in value["topics"] for p in t["partitions"]])
    if target is None:
        return None
    if isinstance(target, ErrorCode):
        trace("bridged commit refused", request, error=target)
        return Answer(commit_error(value, int(target)))
    broker_member_id, generation = target
    stamped = dict(value, member_id=broker_member_id,
                   generation_id_or_member_epoch=generation)
    trace("bridged commit stamped", request, generation=generation)

    def on_response(response: Value) -> Value:
        if partition_errors(response) & MEMBERSHIP_LOST:
            # the broker's group moved on (or dropped the member): the client retries
            # once its heartbeat told it where its member is now
            bridges.commit_refused(group_id, member_id, generation)
            for t in response["topics"]:
                for p in t["partitions"]:
                    if p["error_code"] in MEMBERSHIP_LOST:
                        p["error_code"] = int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return response

    return Upstream(stamped, on_response)


def bridged_fetch_error(service: CoordinatorService, group_id: str, member_id: str | None,
                        epoch: int) -> ErrorCode | None:
    """The member check of an OffsetFetch group of a bridged member; None: no bridged
    member's (forwarded untouched)."""
    if member_id and epoch >= 0:
        return service.bridges.fetch_error(group_id, member_id, epoch)
    return None
