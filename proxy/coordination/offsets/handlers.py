"""The offset APIs' handlers: validated by the engine, stored in the broker.

For a group the proxy coordinates, its members' offset requests are decided here and sent on
the client's own connection, so the broker sees them in the order the client sent them (Kafka
handles one connection's requests in order, and pipelined asynchronous commits depend on it):

* OffsetCommit / TxnOffsetCommit: the engine checks the member id and member epoch
  (:meth:`~translation.coordinator.GroupCoordinator.validate_offset_commit`, relaxed fencing by
  default; topic names are mapped to the broker's topic ids through the topics image). A
  rejected request fails every partition with the engine's error (STALE_MEMBER_EPOCH,
  UNKNOWN_MEMBER_ID...). An accepted one is forwarded stamped with the proxy's own member id and
  generation in the broker's classic group (:mod:`proxy.coordination.membership`); while that
  membership is rejoining, the commit waits for it (and so does everything the client sends
  after it). If the broker no longer recognises the stamped membership, the membership rejoins
  and the client gets the retriable COORDINATOR_LOAD_IN_PROGRESS; a commit is never re-stamped.
* OffsetFetch v9+: a member id with an epoch >= 0 must be a member at that epoch (as Kafka
  checks for consumer groups); the request then goes to the broker without member fields,
  which the classic coordinator does not know. Earlier versions carry no member and pass.
* OffsetDelete: partitions of topics the group subscribes to are refused with
  GROUP_SUBSCRIBED_TO_TOPIC; the rest is deleted at the broker.

Bridged members (groups in the broker phase, :mod:`proxy.coordination.bridged`): their commits
and offset fetches are checked by the bridges instead of the engine (:mod:`.bridged`).

Requests for groups the proxy does not coordinate pass untouched.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from proxy.apiversions import BRIDGED
from proxy.codec.api_keys import ApiKey
from proxy.coordination import remainders
from proxy.coordination.handler import (
    PASS,
    Answer,
    ApiHandler,
    GroupRequest,
    Outcome,
    Pass,
    Upstream,
    Value,
)
from proxy.coordination.membership import COORDINATOR_MOVED, MEMBERSHIP_LOST, BrokerMembership
from proxy.coordination.offsets.answers import commit_error, offsets_text, partition_errors, trace
from proxy.coordination.offsets.bridged import bridged_commit, bridged_fetch_error
from proxy.coordination.remainders import Split
from translation.errors import ErrorCode
from translation.topics import TopicId, TopicsImage

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

log = logging.getLogger("groupgate.offsets")

STABLE_WAIT_SECONDS = 15.0
"""How long a commit waits for the proxy's broker-side membership to be usable before it is
answered with the retriable COORDINATOR_LOAD_IN_PROGRESS."""
_UNKNOWN_TOPICS = uuid.UUID("6a1c3f0e-9d43-4b7e-8a53-1f0c2b9e7d10")


def topic_id_of(topic: dict[str, Any], image: TopicsImage) -> TopicId:
    """The broker's topic id of a request topic (v10+ carry it; older ones carry the name).

    A name the image does not know gets a stable id of its own that no member ever holds.
    """
    topic_id = topic.get("topic_id")
    if isinstance(topic_id, uuid.UUID) and topic_id.int:
        return topic_id
    name = topic.get("name") or ""
    meta = image.by_name.get(name)
    return meta.topic_id if meta is not None else uuid.uuid5(_UNKNOWN_TOPICS, name)


def partitions_of(topics: Iterable[dict[str, Any]], image: TopicsImage
                  ) -> list[tuple[TopicId, int]]:
    return [(topic_id_of(t, image), p["partition_index"]) for t in topics
            for p in t["partitions"]]


def _moved(request: GroupRequest, membership: BrokerMembership) -> bool:
    """Whether the commit came in on the listener of a broker that no longer coordinates the
    group at the broker. Kafka accepts a group's commits only at its coordinator, so a client
    whose coordinator moved sends its newer commits to the new one; a commit it sent to the old
    one (held here while the proxy rejoined the broker's group) must fail rather than land
    after them."""
    node = request.node_id
    return (node is not None and membership.coordinator_node is not None
            and node != membership.coordinator_node)


class OffsetCommitHandler(ApiHandler):
    """OffsetCommit: validated by the engine, forwarded under the proxy's membership."""

    api_key = ApiKey.OFFSET_COMMIT
    answers_upstream_later = True
    transactional = False
    member_fields_from = 1
    """The first version carrying member id and generation."""

    def decide(self, request: GroupRequest) -> Outcome:
        group_id = request.value["group_id"]
        if self.service.to_let_go(group_id, request.value.get("member_id") or ""):
            # the group's lease was cut off: the member must let go (told by its next
            # heartbeat; its commits fail meanwhile, as a fenced member's would)
            return Answer(commit_error(request.value, int(ErrorCode.UNKNOWN_MEMBER_ID)))
        if self.service.released_member(group_id, request.value.get("member_id") or ""):
            # a classic member of a group handed back: it rejoins the broker's group first
            # (:mod:`.release`); the broker would refuse the engine's member id
            return Answer(commit_error(request.value, int(ErrorCode.REBALANCE_IN_PROGRESS)))
        if (bridged := bridged_commit(self.service, request,
                                      self.member_fields_from)) is not None:
            return bridged
        membership = self.service.membership(group_id)
        trace("commit", request, offsets=offsets_text(request.value["topics"]),
               held=membership is not None,
               stable=membership is not None and membership.stable)
        if membership is None:
            if (group_id in self.service.memberships
                    or self.service.may_load(group_id, request.value.get("member_id") or "")):
                # being taken over, or a member of a coordinator that is gone whose state
                # the log may hold: the broker would refuse it
                return Answer(self._after_takeover(request))
            return PASS
        if _moved(request, membership):
            return Answer(commit_error(request.value, int(ErrorCode.NOT_COORDINATOR)))
        error = self._validate(request)
        if error != ErrorCode.NONE:
            return Answer(commit_error(request.value, int(error)))
        if (membership.stable and membership.coordinator is not None
                and not membership.lease_expired()):
            return self._stamped(request, membership)
        return Answer(self._when_stable(request, membership))

    def failure(self, request: GroupRequest, error: int) -> Value:
        return commit_error(request.value, error)

    def verdict(self, request: GroupRequest) -> ErrorCode | None:
        """What :meth:`decide` would answer of the commit's member right now: NONE (accepted
        by this sidecar's engine), the error it fails with, or None when the commit is not
        decided here and now (relayed, passed to the broker, or waiting for a takeover)."""
        membership = self.service.membership(request.value["group_id"])
        if membership is None:
            return None
        if _moved(request, membership):
            return ErrorCode.NOT_COORDINATOR
        return self._validate(request)

    def _validate(self, request: GroupRequest) -> ErrorCode:
        value = request.value
        engine = self.service.engine
        error = engine.validate_offset_commit(
            value["group_id"], value.get("member_id") or "",
            value.get("generation_id_or_member_epoch", -1),
            partitions_of(value["topics"], engine.image),
            instance_id=value.get("group_instance_id"), transactional=self.transactional,
            api_version=request.version)
        if error == ErrorCode.GROUP_ID_NOT_FOUND:
            # The proxy holds the broker's group but its engine does not know the group (it
            # took the group over, or restarted): the member must rejoin, as its heartbeats
            # are told. Kafka's coordinators never forget a group, and clients treat
            # GROUP_ID_NOT_FOUND on a commit as final.
            return ErrorCode.UNKNOWN_MEMBER_ID
        return error

    async def _after_takeover(self, request: GroupRequest) -> Value | Upstream:
        """Take the group over (loading its state) or wait for the takeover under way, then
        decide the commit as if it came now."""
        group_id = request.value["group_id"]
        waited = await self.service.load_for_member(group_id,
                                                    request.value.get("member_id") or "")
        trace("commit after a takeover wait", request, error=waited)
        if waited is not None:
            return commit_error(request.value, int(waited))
        if self.service.membership(group_id) is None and group_id in self.service.memberships:
            # still not held (its membership was lost meanwhile): never wait again from here
            return commit_error(request.value, int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        outcome = self.decide(request)
        if isinstance(outcome, Pass):
            return Upstream(request.value, _unchanged)
        if isinstance(outcome, Upstream):
            return outcome
        answer = outcome.value
        return answer if isinstance(answer, dict) else await answer

    async def _when_stable(self, request: GroupRequest, membership: BrokerMembership
                           ) -> Value | Upstream:
        """The membership is rejoining: wait for it, then check and stamp again."""
        stable = await membership.wait_stable(STABLE_WAIT_SECONDS)
        trace("commit after waiting for the membership", request, stable=stable)
        if not stable:
            group_id, member_id = request.value["group_id"], request.value.get("member_id") or ""
            if self.service.to_let_go(group_id, member_id):
                # the lease was cut off meanwhile: the member must let go (as on arrival)
                return commit_error(request.value, int(ErrorCode.UNKNOWN_MEMBER_ID))
            return commit_error(request.value, int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
        if _moved(request, membership):
            return commit_error(request.value, int(ErrorCode.NOT_COORDINATOR))
        error = self._validate(request)
        if error != ErrorCode.NONE:
            return commit_error(request.value, int(error))
        return self._stamped(request, membership)

    def _stamped(self, request: GroupRequest, membership: BrokerMembership) -> Upstream:
        value = request.value
        if request.version < self.member_fields_from:
            return Upstream(value, _unchanged)
        member_id, generation, release = membership.stamp()
        stamped = dict(value, member_id=member_id, generation_id_or_member_epoch=generation,
                       group_instance_id=None)
        trace("commit stamped", request, generation=generation)

        def on_response(response: Value) -> Value:
            trace("commit answered", request, generation=generation,
                   result=offsets_text(response["topics"], "error_code"))
            release()
            check_membership(partition_errors(response), membership, generation)
            _lost_to_retriable(response)
            return response

        # v9 is v8 on the wire, and the stamped commit is the proxy's classic member's: sent
        # as v8, which every broker serves (apiversions.BRIDGED)
        older = BRIDGED.get(self.api_key)
        version = older if older is not None and request.version == older + 1 else None
        return Upstream(stamped, on_response, release, version)


class TxnOffsetCommitHandler(OffsetCommitHandler):
    """TxnOffsetCommit: as OffsetCommit, validated as transactional (member fields v3+)."""

    api_key = ApiKey.TXN_OFFSET_COMMIT
    transactional = True
    member_fields_from = 3


def _unchanged(response: Value) -> Value:
    return response


def check_membership(errors: set[int], membership: BrokerMembership, generation: int) -> None:
    """Errors of a commit stamped with ``generation`` that say the proxy's membership is stale
    (it rejoins) or the coordinator moved (it finds the coordinator again, and so does the
    client)."""
    if errors & MEMBERSHIP_LOST and membership.generation == generation:
        membership.request_rejoin()
    if errors & COORDINATOR_MOVED and membership.generation == generation:
        membership.coordinator = None
        membership.request_rejoin()


def _lost_to_retriable(response: Value) -> None:
    """A stale stamp is the proxy's to repair: the client gets the retriable
    COORDINATOR_LOAD_IN_PROGRESS and commits again once the membership rejoined."""
    for t in response["topics"]:
        for p in t["partitions"]:
            if p["error_code"] in MEMBERSHIP_LOST:
                p["error_code"] = int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)


def fetch_member_error(service: CoordinatorService, group_id: str, member_id: str | None,
                       member_epoch: int) -> ErrorCode:
    """Kafka's OffsetFetch check for consumer groups: epoch < 0 (admin tools) passes."""
    if member_epoch < 0:
        return ErrorCode.NONE
    group = service.engine.group(group_id)
    member = group.members.get(member_id or "") if group is not None else None
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if member.member_epoch != member_epoch:
        return ErrorCode.STALE_MEMBER_EPOCH
    return ErrorCode.NONE


def _fetch_check(service: CoordinatorService, group: Value) -> ErrorCode | None:
    """The member check of one OffsetFetch group: the group is coordinated here, or its
    member is a bridged one (:mod:`.bridged`); None: neither (forwarded untouched)."""
    group_id, member_id = group["group_id"], group.get("member_id")
    epoch = group.get("member_epoch", -1)
    if service.coordinates(group_id):
        return fetch_member_error(service, group_id, member_id, epoch)
    return bridged_fetch_error(service, group_id, member_id, epoch)


class OffsetFetchHandler(ApiHandler):
    """OffsetFetch: member checks for coordinated groups (v9+), member fields stripped."""

    api_key = ApiKey.OFFSET_FETCH

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        """Only the groups whose member is checked (v9+ with a member epoch): offsets are
        the broker's, any sidecar reads them."""
        if request.version < 9:
            return ()
        return tuple(g["group_id"] for g in request.value["groups"]
                     if g.get("member_id") and g.get("member_epoch", -1) >= 0)

    def decide(self, request: GroupRequest) -> Outcome:
        def observe(answer: Value) -> None:
            if log.isEnabledFor(logging.DEBUG):
                trace("offsets fetched", request, result=" ".join(
                    f"{g['group_id']}:{offsets_text(g['topics'])}" for g in answer["groups"]))

        return remainders.outcome(self.api_key, request.value, self.split(request), observe)

    def split(self, request: GroupRequest) -> Split | None:
        """The groups whose member check fails (answered with its error) and the rest, sent
        without member fields; None: no group is checked here (passed untouched)."""
        value = request.value
        if request.version < 8:
            return None  # no member fields; the broker holds the offsets
        service = self.service
        groups: list[Value] = value["groups"]
        errors = [_fetch_check(service, g) for g in groups]
        if all(e is None for e in errors):
            return None
        failed: dict[int, Value] = {}
        forwarded: list[Value] = []
        for index, group in enumerate(groups):
            error = errors[index]
            if error is None:
                forwarded.append(group)
                continue
            if error != ErrorCode.NONE:
                failed[index] = {"group_id": group["group_id"], "topics": [],
                                 "error_code": int(error)}
            else:
                forwarded.append(dict(group, member_id=None, member_epoch=-1))
        return Split(failed, dict(value, groups=forwarded) if forwarded else None)

    def failure(self, request: GroupRequest, error: int) -> Value:
        if request.version < 8:
            return {"topics": [], "error_code": error}
        return {"groups": [{"group_id": g["group_id"], "topics": [], "error_code": error}
                           for g in request.value["groups"]]}


class OffsetDeleteHandler(ApiHandler):
    """OffsetDelete: topics the group subscribes to are refused, the rest deleted."""

    api_key = ApiKey.OFFSET_DELETE

    def decide(self, request: GroupRequest) -> Outcome:
        return remainders.outcome(self.api_key, request.value, self.split(request))

    def split(self, request: GroupRequest) -> Split | None:
        """The subscribed topics (refused) and the rest, deleted at the broker; None: the
        group is not coordinated here (passed untouched)."""
        value = request.value
        group_id = value["group_id"]
        if not self.service.coordinates(group_id):
            return None
        subscribed = self.service.group_topics(group_id)
        subscribed_error = int(ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)
        refused = [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": subscribed_error}
            for p in t["partitions"]]} for t in value["topics"] if t["name"] in subscribed]
        rest = [t for t in value["topics"] if t["name"] not in subscribed]
        return Split(dict(enumerate(refused)), dict(value, topics=rest) if rest else None)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"error_code": error, "throttle_time_ms": 0, "topics": []}


HANDLERS: tuple[Callable[[CoordinatorService], ApiHandler], ...] = (
    OffsetCommitHandler, TxnOffsetCommitHandler, OffsetFetchHandler, OffsetDeleteHandler)
