"""The router's authorization stage: the group APIs the proxy answers, authorized as Kafka would.

Kafka authorizes every group request as the client's principal before its group coordinator
sees it (``KafkaApis``, 4.4). The proxy answers some of these requests itself, relays others to
the sidecar that coordinates the group (which sends what goes to the broker as the proxy's own
identity), and acts as itself for a group it takes over. So before the fleet route and the
API's handler, a request the proxy will answer or relay, in part or whole, passes this stage,
on the sidecar the client is connected to, with the client's own rights asked of the broker
on the client's own connection (:mod:`proxy.security.rights`):

=========================  =================================================================
ConsumerGroupHeartbeat     READ group, else GROUP_AUTHORIZATION_FAILED; DESCRIBE on every
                           subscribed topic name, else TOPIC_AUTHORIZATION_FAILED (the whole
                           request); when the group's regexes are to be resolved, DESCRIBE on
                           their matches: the engine keeps only those allowed (Kafka 4.x
                           filters a resolution by the triggering member's DESCRIBE)
ConsumerGroupDescribe      DESCRIBE per group (refused ones first); a group whose members'
                           assignments name a topic without DESCRIBE is replaced by
                           TOPIC_AUTHORIZATION_FAILED (KAFKA-18813)
Join/Sync/Heartbeat/Leave  READ group, else GROUP_AUTHORIZATION_FAILED (SyncGroup v5+ without
                           protocol type or name: INCONSISTENT_GROUP_PROTOCOL first)
OffsetCommit,              (TxnOffsetCommit: WRITE on the transactional id first, else every
TxnOffsetCommit            partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED) READ group, else
                           every partition GROUP_AUTHORIZATION_FAILED; READ per topic, else
                           its partitions TOPIC_AUTHORIZATION_FAILED; nothing left: answered
                           without the engine
OffsetFetch (v8+)          DESCRIBE per group, else the group's error; DESCRIBE per requested
                           topic, else its partitions TOPIC_AUTHORIZATION_FAILED (offset -1);
                           all topics of a relayed group: filtered by DESCRIBE
OffsetDelete               DELETE group, else GROUP_AUTHORIZATION_FAILED; READ per topic,
                           else TOPIC_AUTHORIZATION_FAILED
DescribeGroups             DESCRIBE per group (refused ones first); authorized operations are
                           the client's
ListGroups                 DESCRIBE CLUSTER, else the coordinated groups filtered by DESCRIBE
DeleteGroups               DELETE per group (refused ones last)
=========================  =================================================================

A stage decision is synchronous when the connection's cache holds every answer it needs (the
common case: a member's heartbeats within the answers' lifetime); else the router asks the
broker first (:meth:`AuthorizationStage.wants`, :meth:`Rights.ask`) and decides then. The
result is the request to go on with (only its authorized part) plus a
:class:`~.handler.Completion` putting the refused parts back into the answer, or the whole
answer when nothing is left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from proxy.codec.api_keys import ApiKey
from proxy.coordination import convert
from proxy.coordination.handler import ApiHandler, Completion, GroupRequest, Value
from proxy.coordination.listing import engine_listing
from proxy.coordination.offsets import commit_error
from proxy.coordination.remainders import merge_in_order
from proxy.security.rights import DELETE, DESCRIBE, READ, WRITE, Fact, Kind, Needs, Rights
from translation.errors import ErrorCode
from translation.regex import TopicRights
from translation.topics import TopicsImage

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

GROUP_AUTHORIZATION_FAILED = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
TOPIC_AUTHORIZATION_FAILED = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
INCONSISTENT_GROUP_PROTOCOL = int(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
DESCRIBED_TOPICS_REFUSED = ("The group has described topic(s) that the client is not "
                            "authorized to describe.")
"""Kafka's message for a ConsumerGroupDescribe group replaced under KAFKA-18813."""

Known = Callable[[Kind, str, int], bool | None]
"""A fact: allowed, refused, or None (not asked)."""
Wants = tuple[dict[int, set[str]], set[str], bool]
"""Group operation -> names, topic names, the cluster's DESCRIBE (transactional ids:
:meth:`AuthorizationStage.transactional_ids`)."""
Outcome = GroupRequest | Value
"""The request to go on with, or the whole answer."""


class AuthorizationStage:
    """One connection's authorization stage (see the module docstring)."""

    __slots__ = ("rights", "service")

    def __init__(self, rights: Rights, service: CoordinatorService) -> None:
        self.rights = rights
        self.service = service

    # -- whether the stage runs ---------------------------------------------------------------

    def applies(self, request: GroupRequest, relayed_or_unknown: bool) -> bool:
        """Whether the proxy answers or relays any part of ``request`` (else the broker gets
        the client's own request on the client's own connection and authorizes it there).
        ``relayed_or_unknown``: the fleet route is not this sidecar's."""
        key, value, service = request.api_key, request.value, self.service
        if key == ApiKey.INCREMENTAL_ALTER_CONFIGS:
            # the release command: its validate-only copy goes to the broker on the client's
            # own connection, which authorizes ALTER_CONFIGS on the group (:mod:`.release`)
            return False
        if key in (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE):
            return True
        if relayed_or_unknown:
            return True
        if key == ApiKey.LIST_GROUPS:
            return service.has_groups
        if key == ApiKey.OFFSET_FETCH:
            return request.version >= 8 and any(service.claims(g["group_id"])
                                                for g in value["groups"])
        if key in (ApiKey.DESCRIBE_GROUPS, ApiKey.DELETE_GROUPS):
            names = value["groups"] if key == ApiKey.DESCRIBE_GROUPS else value["groups_names"]
            return any(service.claims(g) for g in names)
        group_id, member_id = value["group_id"], _member_of(request)
        if key == ApiKey.JOIN_GROUP:
            return service.classic is not None  # the engine may take any join
        if key in (ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP):
            return service.serves_classic(group_id, member_id)
        # commits: the engine's, a takeover's, or a stale retry the proxy would acknowledge
        return (service.claims(group_id) or service.to_let_go(group_id, member_id)
                or service.may_load(group_id, member_id)
                or service.commit_retries.knows(group_id, member_id))

    # -- what it needs to know ----------------------------------------------------------------

    def wants(self, request: GroupRequest) -> Wants:
        key, value = request.api_key, request.value
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            topics = set(value.get("subscribed_topic_names") or ())
            return {READ: {value["group_id"]}}, topics | (self._regex_matches(value) or set()), \
                False
        if key == ApiKey.CONSUMER_GROUP_DESCRIBE:
            return {DESCRIBE: set(value["group_ids"])}, set(), False
        if key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP):
            return {READ: {value["group_id"]}}, set(), False
        if key in (ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT):
            return {READ: {value["group_id"]}}, set(self._topic_names(value["topics"])), False
        if key == ApiKey.OFFSET_DELETE:
            return {DELETE: {value["group_id"]}}, {t["name"] for t in value["topics"]}, False
        if key == ApiKey.OFFSET_FETCH:
            groups = value["groups"]
            topics = {n for g in groups for n in self._topic_names(g.get("topics") or ())}
            return {DESCRIBE: {g["group_id"] for g in groups}}, topics, False
        if key == ApiKey.DESCRIBE_GROUPS:
            return {DESCRIBE: set(value["groups"])}, set(), False
        if key == ApiKey.DELETE_GROUPS:
            return {DELETE: set(value["groups_names"])}, set(), False
        if key == ApiKey.LIST_GROUPS:
            if self.rights.known("cluster", "", DESCRIBE):
                return {}, set(), False
            return {DESCRIBE: self._listed(request)}, set(), True
        return {}, set(), False

    @staticmethod
    def transactional_ids(request: GroupRequest) -> set[str]:
        """The transactional ids whose WRITE ``request`` needs (TxnOffsetCommit's)."""
        if request.api_key == ApiKey.TXN_OFFSET_COMMIT:
            return {request.value["transactional_id"]}
        return set()

    def missing(self, request: GroupRequest) -> Needs:
        groups, topics, cluster = self.wants(request)
        return self.rights.missing(groups, topics, cluster, self.transactional_ids(request))

    def known(self, learnt: dict[Fact, bool] | None = None) -> Known:
        rights = self.rights

        def known(kind: Kind, name: str, op: int) -> bool | None:
            if learnt is not None and (kind, name, op) in learnt:
                return learnt[(kind, name, op)]
            return rights.known(kind, name, op)

        return known

    # -- the decision -------------------------------------------------------------------------

    def decide(self, handler: ApiHandler, request: GroupRequest, known: Known) -> Outcome:
        """The request to go on with, or the whole answer; a fact not known counts as
        refused (every one was asked), except a regex match the image gained meanwhile,
        which is left unchecked (:meth:`_heartbeat`)."""

        def allowed(kind: Kind, name: str, op: int) -> bool:
            return bool(known(kind, name, op))

        key = request.api_key
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            return self._heartbeat(request, allowed, known)
        if key == ApiKey.CONSUMER_GROUP_DESCRIBE:
            return self._consumer_group_describe(request, allowed)
        if key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP):
            return self._classic(handler, request, allowed)
        if key in (ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT):
            return self._commit(request, allowed)
        if key == ApiKey.OFFSET_FETCH:
            return self._offset_fetch(request, allowed)
        if key == ApiKey.OFFSET_DELETE:
            return self._offset_delete(request, allowed)
        if key == ApiKey.DESCRIBE_GROUPS:
            return self._describe_groups(request, allowed)
        if key == ApiKey.DELETE_GROUPS:
            return self._delete_groups(request, allowed)
        if key == ApiKey.LIST_GROUPS:
            return self._list_groups(request, allowed)
        return request

    def _heartbeat(self, request: GroupRequest, allowed: Callable[[Kind, str, int], bool],
                   known: Known) -> Outcome:
        value = request.value
        if not allowed("group", value["group_id"], READ):
            return convert.consumer_group_heartbeat_error(GROUP_AUTHORIZATION_FAILED, None)
        names = value.get("subscribed_topic_names") or ()
        if not all(allowed("topic", t, DESCRIBE) for t in names):
            return convert.consumer_group_heartbeat_error(TOPIC_AUTHORIZATION_FAILED, None)
        matches = self._regex_matches(value)
        if matches is None:
            return request
        # only what was asked counts as checked: a topic the image gained while the broker
        # was asked (a refresh meanwhile) is left to the next heartbeat, not taken as refused
        checked = frozenset(t for t in matches if known("topic", t, DESCRIBE) is not None)
        return dataclasses.replace(request, topic_rights=TopicRights(
            checked, frozenset(t for t in checked if allowed("topic", t, DESCRIBE))))

    def _regex_matches(self, value: Value) -> frozenset[str] | None:
        """The topics the group's regexes (and the heartbeat's) match, when the engine will
        resolve them under this client's rights (possibly none: the rights then say that
        nothing was checked); None when it will not (the steady heartbeat asks nothing)."""
        matches = self.service.engine.regex_topics_to_check(
            value["group_id"], value.get("subscribed_topic_regex"))
        if matches is None:  # a bridged member's regex (:mod:`.bridged`)
            matches = self.service.bridges.regex_topics_to_check(
                value["group_id"], value.get("member_id") or "")
        return matches

    def _consumer_group_describe(self, request: GroupRequest,
                                 allowed: Callable[[Kind, str, int], bool]) -> Outcome:
        value = request.value
        requested: list[str] = value["group_ids"]
        refused = [g for g in requested if not allowed("group", g, DESCRIBE)]
        kept = [g for g in requested if g not in refused]
        include_ops = bool(value.get("include_authorized_operations"))
        rights = self.rights
        refused_entries: list[Value] = [
            {"group_id": g, "error_code": GROUP_AUTHORIZATION_FAILED, "error_message": None,
             "members": []} for g in refused]

        def merge(answer: Value) -> Value:
            groups = list(answer.get("groups", ()))
            if include_ops:
                for entry in groups:
                    ops = rights.group_ops(entry["group_id"])
                    if not entry.get("error_code") and ops is not None:
                        entry["authorized_operations"] = ops
            return dict(answer, groups=refused_entries + groups)

        async def recheck(answer: Value) -> Value:
            return await self._described_topics(answer)

        completion = Completion(merge, recheck, recheck_here=True)
        if not kept:
            return merge({"throttle_time_ms": 0, "groups": []})
        return dataclasses.replace(request, value=dict(value, group_ids=kept),
                                   completion=completion)

    async def _described_topics(self, answer: Value) -> Value:
        """KAFKA-18813: a described group whose members' assignments (current or target) name
        a topic the client may not describe is replaced by TOPIC_AUTHORIZATION_FAILED."""
        def topics_of(entry: Value) -> set[str]:
            return {tp.get("topic_name") or "" for m in entry.get("members", ())
                    for which in ("assignment", "target_assignment")
                    for tp in (m.get(which) or {}).get("topic_partitions", ())} - {""}

        names = set().union(*(topics_of(g) for g in answer.get("groups", ())
                              if not g.get("error_code")))
        if not names:
            return answer
        needs = self.rights.missing({}, names)
        learnt = await self.rights.ask(needs, None) if needs else {}
        known = self.known(learnt)
        groups = []
        for entry in answer["groups"]:
            if not entry.get("error_code") and not all(
                    known("topic", t, DESCRIBE) for t in topics_of(entry)):
                entry = {"group_id": entry["group_id"], "error_code": TOPIC_AUTHORIZATION_FAILED,
                         "error_message": DESCRIBED_TOPICS_REFUSED, "members": []}
            groups.append(entry)
        return dict(answer, groups=groups)

    def _classic(self, handler: ApiHandler, request: GroupRequest,
                 allowed: Callable[[Kind, str, int], bool]) -> Outcome:
        value = request.value
        if (request.api_key == ApiKey.SYNC_GROUP and request.version >= 5
                and (value.get("protocol_type") is None or value.get("protocol_name") is None)):
            return handler.failure(request, INCONSISTENT_GROUP_PROTOCOL)
        if allowed("group", value["group_id"], READ):
            return request
        answer = handler.failure(request, GROUP_AUTHORIZATION_FAILED)
        if request.api_key == ApiKey.JOIN_GROUP:
            answer["member_id"] = ""  # Kafka's JoinGroup error response names no member
        return answer

    def _commit(self, request: GroupRequest, allowed: Callable[[Kind, str, int], bool]
                ) -> Outcome:
        value = request.value
        if (request.api_key == ApiKey.TXN_OFFSET_COMMIT
                and not allowed("transactional_id", value["transactional_id"], WRITE)):
            return commit_error(value, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not allowed("group", value["group_id"], READ):
            return commit_error(value, GROUP_AUTHORIZATION_FAILED)
        image = self.service.engine.image
        refused = [t for t in value["topics"]
                   if (name := _name_of(t, image)) is not None
                   and not allowed("topic", name, READ)]
        if not refused:
            return request
        refused_answer = commit_error(dict(value, topics=refused),
                                      TOPIC_AUTHORIZATION_FAILED)["topics"]
        kept = [t for t in value["topics"] if not any(t is r for r in refused)]
        if not kept:
            return {"throttle_time_ms": 0, "topics": refused_answer}

        def merge(answer: Value) -> Value:
            return dict(answer, topics=refused_answer + list(answer.get("topics", ())))

        return dataclasses.replace(request, value=dict(value, topics=kept),
                                   completion=Completion(merge))

    def _offset_fetch(self, request: GroupRequest, allowed: Callable[[Kind, str, int], bool]
                      ) -> Outcome:
        value = request.value
        groups: list[Value] = value["groups"]
        local: dict[int, Value] = {}
        refused_topics: dict[str, list[Value]] = {}
        kept: list[Value] = []
        for index, group in enumerate(groups):
            group_id = group["group_id"]
            if not allowed("group", group_id, DESCRIBE):
                local[index] = {"group_id": group_id, "topics": [],
                                "error_code": GROUP_AUTHORIZATION_FAILED}
                continue
            topics = group.get("topics")
            if topics is None:
                kept.append(group)
                continue
            refused = [t for t in topics if not allowed("topic", t.get("name") or "", DESCRIBE)]
            if refused:
                refused_topics[group_id] = [
                    {"name": t["name"], "partitions": [
                        {"partition_index": p, "committed_offset": -1,
                         "committed_leader_epoch": -1, "metadata": "",
                         "error_code": TOPIC_AUTHORIZATION_FAILED}
                        for p in t["partition_indexes"]]} for t in refused]
            kept.append(dict(group, topics=[t for t in topics if t not in refused]))
        ids = [g["group_id"] for g in groups]

        def merge(answer: Value) -> Value:
            answered = []
            for entry in answer.get("groups", ()):
                extra = refused_topics.get(entry["group_id"])
                if extra and not entry.get("error_code"):
                    entry = dict(entry, topics=list(entry.get("topics", ())) + extra)
                answered.append(entry)
            return dict(answer, groups=merge_in_order(ids, answered, local, "group_id"))

        all_topics = {g["group_id"] for g in kept if g.get("topics") is None}

        async def recheck(answer: Value) -> Value:
            return await self._fetched_topics(answer, all_topics)

        if not kept:
            return merge({"throttle_time_ms": 0, "groups": []})
        if not local and not refused_topics and not all_topics:
            return request
        return dataclasses.replace(request, value=dict(value, groups=kept), completion=(
            Completion(merge, recheck if all_topics else None)))

    async def _fetched_topics(self, answer: Value, all_topics: set[str]) -> Value:
        """The offsets of every topic of a group, fetched by another sidecar as the proxy: only
        the topics the client may describe (as Kafka filters them)."""
        groups = [g for g in answer.get("groups", ()) if g["group_id"] in all_topics]
        names = {t.get("name") or "" for g in groups for t in g.get("topics", ())} - {""}
        if not names:
            return answer
        needs = self.rights.missing({}, names)
        known = self.known(await self.rights.ask(needs, None) if needs else None)
        out = []
        for entry in answer["groups"]:
            if entry["group_id"] in all_topics:
                entry = dict(entry, topics=[t for t in entry.get("topics", ())
                                            if known("topic", t.get("name") or "", DESCRIBE)])
            out.append(entry)
        return dict(answer, groups=out)

    def _offset_delete(self, request: GroupRequest, allowed: Callable[[Kind, str, int], bool]
                       ) -> Outcome:
        value = request.value
        if not allowed("group", value["group_id"], DELETE):
            return {"error_code": GROUP_AUTHORIZATION_FAILED, "throttle_time_ms": 0,
                    "topics": []}
        refused = [t for t in value["topics"] if not allowed("topic", t["name"], READ)]
        if not refused:
            return request
        refused_answer = [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": TOPIC_AUTHORIZATION_FAILED}
            for p in t["partitions"]]} for t in refused]
        kept = [t for t in value["topics"] if t not in refused]
        if not kept:
            return {"error_code": 0, "throttle_time_ms": 0, "topics": refused_answer}

        def merge(answer: Value) -> Value:
            if answer.get("error_code"):
                return answer
            return dict(answer, topics=refused_answer + list(answer.get("topics", ())))

        return dataclasses.replace(request, value=dict(value, topics=kept),
                                   completion=Completion(merge))

    def _describe_groups(self, request: GroupRequest,
                         allowed: Callable[[Kind, str, int], bool]) -> Outcome:
        value = request.value
        requested: list[str] = value["groups"]
        refused = [g for g in requested if not allowed("group", g, DESCRIBE)]
        kept = [g for g in requested if g not in refused]
        include_ops = request.version >= 3 and bool(value.get("include_authorized_operations"))
        rights = self.rights
        refused_entries = [_group_error(g, request.version) for g in refused]

        def merge(answer: Value) -> Value:
            groups = list(answer.get("groups", ()))
            if include_ops:  # the client's, not those of whoever described it
                for entry in groups:
                    ops = rights.group_ops(entry["group_id"])
                    if not entry.get("error_code") and ops is not None:
                        entry["authorized_operations"] = ops
            return dict(answer, groups=refused_entries + groups)

        if not kept:
            return merge({"throttle_time_ms": 0, "groups": []})
        return dataclasses.replace(request, value=dict(value, groups=kept),
                                   completion=Completion(merge))

    def _delete_groups(self, request: GroupRequest, allowed: Callable[[Kind, str, int], bool]
                       ) -> Outcome:
        value = request.value
        requested: list[str] = list(dict.fromkeys(value["groups_names"]))  # as Kafka: once
        refused = [g for g in requested if not allowed("group", g, DELETE)]
        kept = [g for g in requested if g not in refused]
        refused_entries = [{"group_id": g, "error_code": GROUP_AUTHORIZATION_FAILED}
                           for g in refused]

        def merge(answer: Value) -> Value:
            return dict(answer, results=list(answer.get("results", ())) + refused_entries)

        if not kept:
            return merge({"throttle_time_ms": 0, "results": []})
        if not refused and len(requested) == len(value["groups_names"]):
            return request
        return dataclasses.replace(request, value=dict(value, groups_names=kept),
                                   completion=Completion(merge))

    def _list_groups(self, request: GroupRequest, allowed: Callable[[Kind, str, int], bool]
                     ) -> Outcome:
        if allowed("cluster", "", DESCRIBE):
            return request
        service = self.service
        listed = self._listed(request)
        may = {g for g in listed if allowed("group", g, DESCRIBE)}

        def merge(answer: Value) -> Value:
            return dict(answer, groups=[
                g for g in answer.get("groups", ())
                if g["group_id"] in may or (g["group_id"] not in listed
                                            and not service.claims(g["group_id"]))])

        return dataclasses.replace(request, completion=Completion(merge))

    def _listed(self, request: GroupRequest) -> set[str]:
        """The groups of the engine a ListGroups answer on this connection may show."""
        return {g["group_id"] for g in engine_listing(self.service, request.node_id)}

    def _topic_names(self, topics: Iterable[Value]) -> list[str]:
        image = self.service.engine.image
        return [name for t in topics if (name := _name_of(t, image)) is not None]


def _name_of(topic: Value, image: TopicsImage) -> str | None:
    """A request topic's name (v10+ commits carry the topic id: its name in the topics
    image, None when unknown; the broker answers UNKNOWN_TOPIC_ID then)."""
    name = topic.get("name")
    if name:
        return str(name)
    topic_id = topic.get("topic_id")
    if topic_id is None:
        return None
    meta = image.by_id.get(topic_id)
    return meta.name if meta is not None else None


def _member_of(request: GroupRequest) -> str:
    value = request.value
    member_id = value.get("member_id") or ""
    if not member_id and value.get("members"):  # LeaveGroup v3+: a batch of members
        member_id = value["members"][0].get("member_id") or ""
    return str(member_id)


def _group_error(group_id: str, version: int) -> Value:
    """Kafka's DescribeGroups entry for a group the client may not describe."""
    entry: Value = {"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": group_id,
                    "group_state": "", "protocol_type": "", "protocol_data": "",
                    "members": []}
    if version >= 6:
        entry["error_message"] = None
    return entry
