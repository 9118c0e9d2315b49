"""The authorization stage: what the proxy answers or relays is authorized as the client's.

A scripted broker answers the probes on the client's connection from an ACL table, as Kafka's
``KafkaApis`` would for that client's principal (Heartbeat: READ first; DescribeGroups:
DESCRIBE, then the operations bitfield; Metadata: TOPIC_AUTHORIZATION_FAILED without
DESCRIBE, else the topic's operations). Each test checks what the client is told and that
nothing behind the stage (the engine, a takeover, a relay, a commit) was started for a client
that may not use the group.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.header import parse_request_header
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.coordination.service import CoordinatorService
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import parse_table
from proxy.security.rights import (
    DELETE,
    DESCRIBE,
    PROBES_PER_KIND,
    READ,
    SECURITY_DISABLED,
    AuthorizerCheck,
    Rights,
)
from proxy.security.session import Session
from translation.topics import TopicMetadata, TopicsImage

from .helpers import TOPIC, TOPIC_ID, coordinate, exchange, make_service, request

GROUP_AUTH, TOPIC_AUTH, TXN_AUTH = 30, 29, 53
GROUP_OPS = (1 << READ) | (1 << DESCRIBE) | (1 << DELETE)


@dataclass
class Acls:
    """What the client's principal may do, as the broker's authorizer would answer."""

    groups: dict[str, set[int]] = field(default_factory=dict)
    topics: dict[str, set[int]] = field(default_factory=dict)
    cluster_describe: bool = False
    transactional_ids: set[str] = field(default_factory=set)
    """The transactional ids the principal may WRITE."""
    denied: dict[str, set[int]] = field(default_factory=dict)
    """Group operations DENY ACLs refuse (over any ALLOW, and over an implied DESCRIBE)."""
    probes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def group(self, name: str, op: int) -> bool:
        if op in self.denied.get(name, set()):
            return False
        ops = self.groups.get(name, set())
        return op in ops or (op == DESCRIBE and bool(ops & {READ, DELETE}))

    def topic(self, name: str, op: int) -> bool:
        ops = self.topics.get(name, set())
        return op in ops or (op == DESCRIBE and READ in ops)

    async def send(self, api_key: int, version: int, encode: Callable[[int], bytes],
                   timeout: float) -> bytes:
        payload = encode(-5)
        header = parse_request_header(payload)
        assert header.correlation_id == -5
        value, _ = messages.decode_request(api_key, version, payload, header.header_length)
        self.probes.append((api_key, value))
        answer = self.answer(api_key, value)
        head = struct.pack(">i", -5) + (b"\x00" if messages.response_header_version(
            api_key, version) == 1 else b"")
        return head + messages.encode_response(api_key, version, answer)

    def answer(self, api_key: int, value: dict[str, Any]) -> dict[str, Any]:
        if api_key == 12:  # Heartbeat: READ before anything else
            allowed = self.group(value["group_id"], READ)
            return {"error_code": 25 if allowed else GROUP_AUTH}
        if api_key == 15:  # DescribeGroups
            groups = []
            for name in value["groups"]:
                if not self.group(name, DESCRIBE):
                    groups.append({"group_id": name, "error_code": GROUP_AUTH,
                                   "group_state": "", "protocol_type": "",
                                   "protocol_data": "", "members": []})
                    continue
                ops = sum(1 << op for op in (READ, DESCRIBE, DELETE) if self.group(name, op))
                groups.append({"group_id": name, "error_code": 0, "group_state": "Dead",
                               "protocol_type": "", "protocol_data": "", "members": [],
                               "authorized_operations": ops})
            return {"groups": groups}
        if api_key == 3:  # Metadata v10
            topics = []
            for t in value["topics"]:
                name = t["name"]
                if not self.topic(name, DESCRIBE):
                    topics.append({"name": name, "error_code": TOPIC_AUTH, "partitions": []})
                else:
                    ops = sum(1 << op for op in (READ, DESCRIBE) if self.topic(name, op))
                    topics.append({"name": name, "error_code": 0, "partitions": [],
                                   "topic_authorized_operations": ops})
            cluster = (1 << DESCRIBE) if self.cluster_describe else 0
            return {"brokers": [], "topics": topics, "cluster_authorized_operations":
                    cluster if value["include_cluster_authorized_operations"] else -(1 << 31)}
        if api_key == 47:  # OffsetDelete: DELETE on the group before anything else
            allowed = self.group(value["group_id"], DELETE)
            return {"error_code": 16 if allowed else GROUP_AUTH, "topics": []}
        if api_key == 25:  # AddOffsetsToTxn: WRITE on the transactional id, then READ group
            if value["transactional_id"] not in self.transactional_ids:
                return {"error_code": TXN_AUTH}
            if not self.group(value["group_id"], READ):
                return {"error_code": GROUP_AUTH}
            return {"error_code": 49}  # INVALID_PRODUCER_ID_MAPPING: producer id -1
        raise AssertionError(f"unexpected probe {api_key}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def authorizing_router(service: CoordinatorService, acls: Acls, clock: Clock | None = None,
                       ttl: float = 5.0, authorizer: AuthorizerCheck | None = None
                       ) -> CoordinatingRouter:
    rights = Rights(acls.send, ttl=ttl, timer=clock or Clock())
    return CoordinatingRouter(DictAddressMap({}), RequestCounters("test"), parse_table(),
                              handler_table(service), 1, "/10.0.0.7", claims=service.claims,
                              session=Session("test"),
                              authorization=AuthorizationStage(rights, service),
                              authorizer=authorizer)


def heartbeat(group: str, topics: list[str] | None = None, epoch: int = 0,
              member: str = "") -> dict[str, Any]:
    return {"group_id": group, "member_id": member, "member_epoch": epoch,
            "rebalance_timeout_ms": 30_000, "subscribed_topic_names": topics,
            "topic_partitions": [] if epoch == 0 else None}


def commit(group: str, member: str = "m", epoch: int = 1,
           topics: tuple[str, ...] = (TOPIC,)) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": epoch, "member_id": member,
            "topics": [{"name": t, "partitions": [{"partition_index": 0,
                                                    "committed_offset": 1}]} for t in topics]}


def partition_errors(response: dict[str, Any]) -> dict[str, set[int]]:
    return {t["name"]: {p["error_code"] for p in t["partitions"]} for t in response["topics"]}


# -- KIP-848 ---------------------------------------------------------------------------------


async def test_a_heartbeat_without_read_on_the_group_is_refused_before_anything_starts(
        ) -> None:
    service = make_service()
    acls = Acls(groups={"g": {DESCRIBE}}, topics={TOPIC: {READ}})
    result = await exchange(authorizing_router(service, acls), request(
        68, 0, heartbeat("g", [TOPIC])))
    assert result.response is not None and result.response["error_code"] == GROUP_AUTH
    # nothing the proxy does as itself: no broker membership, no lookup, no engine group
    assert not service.memberships and service.engine.group("g") is None
    assert not service.pool.fake.requests  # type: ignore[attr-defined]


async def test_a_heartbeat_naming_a_topic_without_describe_fails_as_a_whole() -> None:
    service = make_service()
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {READ}})
    result = await exchange(authorizing_router(service, acls), request(
        68, 0, heartbeat("g", [TOPIC, "secret"])))
    assert result.response is not None and result.response["error_code"] == TOPIC_AUTH
    assert service.engine.group("g") is None


async def test_answers_are_trusted_for_the_ttl_then_asked_again() -> None:
    """A member's heartbeats within the answers' lifetime cost no probe; after it, the broker
    is asked again, and a right removed meanwhile refuses the member."""
    service = make_service()
    coordinate(service, "g")
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {READ}})
    clock = Clock()
    r = authorizing_router(service, acls, clock)
    first = await exchange(r, request(68, 0, heartbeat("g", [TOPIC])))
    assert first.response is not None and first.response["error_code"] == 0
    member = first.response["member_id"]
    asked = len(acls.probes)
    assert asked == 2  # READ on the group and the topics, pipelined
    clock.now = 4.0
    again = await exchange(r, request(68, 0, heartbeat("g", None, epoch=1, member=member)))
    assert again.response is not None and again.response["error_code"] == 0
    assert len(acls.probes) == asked
    acls.groups["g"] = set()  # the ACL is removed while the member is in the group
    clock.now = 5.5
    refused = await exchange(r, request(68, 0, heartbeat("g", None, epoch=1, member=member)))
    assert refused.response is not None and refused.response["error_code"] == GROUP_AUTH
    assert len(acls.probes) == asked + 1


async def test_no_probe_while_the_brokers_have_no_authorizer() -> None:
    service = make_service()
    acls = Acls()
    asked: list[int] = []

    async def describe_acls() -> dict[str, Any]:
        asked.append(1)
        return {"error_code": SECURITY_DISABLED}

    clock = Clock()
    authorizer = AuthorizerCheck(describe_acls, timer=clock)
    r = authorizing_router(service, acls, authorizer=authorizer)
    for _ in range(3):
        result = await exchange(r, request(69, 0, {"group_ids": ["g"]}))
        assert result.response is not None
    assert asked == [1] and not acls.probes and authorizer.present is False


async def test_an_authorizer_check_that_fails_authorizes_and_is_not_repeated_at_once() -> None:
    service = make_service()
    acls = Acls()

    async def unreachable() -> dict[str, Any]:
        raise OSError("no route")

    authorizer = AuthorizerCheck(unreachable, timer=Clock())
    r = authorizing_router(service, acls, authorizer=authorizer)
    result = await exchange(r, request(69, 0, {"group_ids": ["g"]}))
    assert result.response is not None
    assert result.response["groups"][0]["error_code"] == GROUP_AUTH
    assert authorizer.in_force and not authorizer.due()


async def test_consumer_group_describe_refuses_groups_and_hides_groups_with_secret_topics(
        ) -> None:
    service = make_service()
    coordinate(service, "open")
    coordinate(service, "mixed")
    acls = Acls(groups={"open": {READ}, "mixed": {READ}}, topics={TOPIC: {READ}})
    r = authorizing_router(service, acls)
    # members in both groups: "mixed" is assigned the topic the client may not describe
    joined = await exchange(r, request(68, 0, heartbeat("open", [TOPIC])))
    assert joined.response is not None and joined.response["error_code"] == 0
    joined = await exchange(r, request(68, 0, heartbeat("mixed", [TOPIC])))
    assert joined.response is not None and joined.response["error_code"] == 0
    acls.topics[TOPIC] = set()  # now the client may not describe it
    acls.probes.clear()
    r2 = authorizing_router(service, acls)
    result = await exchange(r2, request(69, 0, {"group_ids": ["secret", "open"],
                                                 "include_authorized_operations": True}))
    assert result.response is not None
    groups = result.response["groups"]
    assert [(g["group_id"], g["error_code"]) for g in groups] == [
        ("secret", GROUP_AUTH), ("open", TOPIC_AUTH)]
    assert groups[1]["members"] == []


async def test_a_regex_member_is_assigned_only_the_matching_topics_it_may_describe() -> None:
    """Kafka keeps of a regex's matches those the triggering member may DESCRIBE: the regex
    matches two topics, the client may describe one; it is assigned that one only, and its
    steady heartbeats ask nothing more."""
    service = make_service()
    coordinate(service, "g")
    other = uuid.UUID(int=0x07)
    service.engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 4),
                                                 TopicMetadata(other, "ordersecret", 2)]), 0)
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {READ}})
    r = authorizing_router(service, acls)
    member = "m-regex"
    value = dict(heartbeat("g", member=member), subscribed_topic_regex="order.*")
    first = await exchange(r, request(68, 1, value))
    assert first.response is not None and first.response["error_code"] == 0
    assert service.engine.group("g").resolved_regex == {"order.*": frozenset({TOPIC})}
    metadata = [v for key, v in acls.probes if key == 3]
    assert [sorted(t["name"] for t in v["topics"]) for v in metadata] == [
        [TOPIC, "ordersecret"]]
    assigned: set[Any] = set()
    for _ in range(3):
        beat = await exchange(r, request(68, 1, heartbeat("g", None, 1, member)))
        assert beat.response is not None and beat.response["error_code"] == 0
        for tp in (beat.response.get("assignment") or {}).get("topic_partitions", ()):
            assigned.add(tp["topic_id"])
    assigned |= {tp["topic_id"] for tp in
                 (first.response.get("assignment") or {}).get("topic_partitions", ())}
    assert assigned == {TOPIC_ID}  # progress: the topic it may describe, never the other
    assert len([k for k, _ in acls.probes if k == 3]) == 1


# -- classic ---------------------------------------------------------------------------------


async def test_classic_join_without_read_is_refused_before_the_engine_may_take_it() -> None:
    service = make_service(classic_translation=True)
    acls = Acls(groups={"c": {DESCRIBE}})
    join = {"group_id": "c", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
            "member_id": "", "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": messages.encode_data(
                "ConsumerProtocolSubscription", 0, {"topics": [TOPIC]})}]}
    result = await exchange(authorizing_router(service, acls), request(11, 5, join))
    assert result.response is not None
    assert result.response["error_code"] == GROUP_AUTH and result.response["member_id"] == ""
    assert not service.memberships and service.engine.group("c") is None


# -- offsets ---------------------------------------------------------------------------------


async def test_a_commit_without_read_on_the_group_is_refused_before_the_engine_validates(
        ) -> None:
    """The engine would answer this made-up member STALE/UNKNOWN_MEMBER_ID; Kafka answers
    GROUP_AUTHORIZATION_FAILED first, for every partition."""
    service = make_service()
    coordinate(service, "g")
    acls = Acls(groups={"g": {DESCRIBE}}, topics={TOPIC: {READ}})
    result = await exchange(authorizing_router(service, acls), request(8, 9, commit("g")))
    assert result.action == "local" and result.response is not None
    assert partition_errors(result.response) == {TOPIC: {GROUP_AUTH}}


async def test_a_commit_goes_on_with_the_topics_the_client_may_read(monkeypatch: Any) -> None:
    service = make_service()
    coordinate(service, "g")
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {READ}, "other": {DESCRIBE}})
    monkeypatch.setattr(service.engine, "validate_offset_commit",
                        lambda *args, **kwargs: 0)
    r = authorizing_router(service, acls)

    def broker(key: int, version: int, sent: dict[str, Any]) -> dict[str, Any]:
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": 0}
            for p in t["partitions"]]} for t in sent["topics"]]}

    result = await exchange(r, request(8, 9, commit("g", topics=(TOPIC, "other"))), broker)
    assert result.action == "rewrite" and result.sent is not None
    assert [t["name"] for t in result.sent["topics"]] == [TOPIC]  # "other" never sent
    assert result.response is not None
    assert partition_errors(result.response) == {"other": {TOPIC_AUTH}, TOPIC: {0}}


async def test_a_commit_of_topics_the_client_may_not_read_never_reaches_the_engine() -> None:
    service = make_service()
    coordinate(service, "g")
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {DESCRIBE}})
    result = await exchange(authorizing_router(service, acls), request(8, 9, commit("g")))
    assert result.action == "local" and result.response is not None
    assert partition_errors(result.response) == {TOPIC: {TOPIC_AUTH}}


async def test_a_txn_commit_needs_write_on_its_transactional_id_first(
        monkeypatch: Any) -> None:
    """Kafka checks WRITE on the transactional id before READ on the group: without it every
    partition is TRANSACTIONAL_ID_AUTHORIZATION_FAILED (not the group's error, nor the engine's
    verdict), and nothing reaches the engine or the broker; with it, the commit goes on."""
    service = make_service()
    coordinate(service, "g")
    verdicts: list[Any] = []
    monkeypatch.setattr(service.engine, "validate_offset_commit",
                        lambda *args, **kwargs: verdicts.append(args) or 0)
    txn = dict(commit("g"), transactional_id="app-txn", producer_id=7, producer_epoch=0)
    acls = Acls(groups={"g": {DESCRIBE}}, topics={TOPIC: {READ}})
    result = await exchange(authorizing_router(service, acls), request(28, 3, txn))
    assert result.action == "local" and result.response is not None
    assert partition_errors(result.response) == {TOPIC: {TXN_AUTH}}
    acls.groups["g"] = {READ}
    result = await exchange(authorizing_router(service, acls), request(28, 3, txn))
    assert partition_errors(result.response or {}) == {TOPIC: {TXN_AUTH}}
    assert not verdicts
    probe = next(v for key, v in acls.probes if key == 25)
    assert probe["transactional_id"] == "app-txn" and probe["producer_id"] == -1
    acls.transactional_ids.add("app-txn")  # progress: with WRITE it goes on

    def broker(key: int, version: int, sent: dict[str, Any]) -> dict[str, Any]:
        return {"topics": [{"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": 0}
            for p in t["partitions"]]} for t in sent["topics"]]}

    result = await exchange(authorizing_router(service, acls), request(28, 3, txn), broker)
    assert result.action == "rewrite" and len(verdicts) == 1
    assert partition_errors(result.response or {}) == {TOPIC: {0}}


async def test_offset_fetch_and_delete_follow_kafkas_checks() -> None:
    service = make_service()
    coordinate(service, "g")
    acls = Acls(groups={"g": {DESCRIBE}}, topics={TOPIC: {DESCRIBE}})
    r = authorizing_router(service, acls)
    fetch = {"groups": [{"group_id": "g", "member_id": None, "member_epoch": -1,
                         "topics": [{"name": TOPIC, "partition_indexes": [0]},
                                    {"name": "secret", "partition_indexes": [1]}]}]}

    def fetched(key: int, version: int, sent: dict[str, Any]) -> dict[str, Any]:
        return {"groups": [{"group_id": g["group_id"], "error_code": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p, "committed_offset": 5, "metadata": "",
                 "error_code": 0} for p in t["partition_indexes"]]}
            for t in g["topics"]]} for g in sent["groups"]]}

    result = await exchange(r, request(9, 9, fetch), fetched)
    assert result.sent is not None and [t["name"] for t in result.sent["groups"][0]["topics"]] \
        == [TOPIC]
    assert result.response is not None
    topics = {t["name"]: t["partitions"][0] for t in result.response["groups"][0]["topics"]}
    assert topics["secret"]["error_code"] == TOPIC_AUTH
    assert topics["secret"]["committed_offset"] == -1 and topics[TOPIC]["committed_offset"] == 5
    delete = {"group_id": "g", "topics": [{"name": "other", "partitions": [
        {"partition_index": 0}]}]}
    refused = await exchange(r, request(47, 0, delete))
    assert refused.response is not None and refused.response["error_code"] == GROUP_AUTH


# -- listing ---------------------------------------------------------------------------------


async def test_describe_and_delete_groups_refuse_per_group_in_kafkas_order() -> None:
    service = make_service()
    coordinate(service, "mine")
    membership = coordinate(service, "kept")
    acls = Acls(groups={"mine": {DESCRIBE}, "kept": {READ}})
    r = authorizing_router(service, acls)
    described = await exchange(r, request(15, 5, {"groups": ["mine", "hidden"],
                                                   "include_authorized_operations": True}))
    assert described.response is not None
    groups = described.response["groups"]
    assert [(g["group_id"], g["error_code"]) for g in groups] == [("hidden", GROUP_AUTH),
                                                                  ("mine", 0)]
    assert groups[1]["authorized_operations"] == 1 << DESCRIBE  # the client's own
    deleted = await exchange(r, request(42, 2, {"groups_names": ["kept"]}))
    assert deleted.response is not None
    assert [(g["group_id"], g["error_code"]) for g in deleted.response["results"]] == [
        ("kept", GROUP_AUTH)]
    assert membership.leaves == 0 and service.claims("kept")


async def test_deny_describe_with_allow_delete_deletes_as_kafka_does() -> None:
    """Kafka checks each API's own operation: with DESCRIBE denied and DELETE allowed on a
    group, DescribeGroups is refused and DeleteGroups and OffsetDelete go on (the DescribeGroups
    bitfield, refused too, cannot tell DELETE)."""
    service = make_service()
    membership = coordinate(service, "g")
    acls = Acls(groups={"g": {DELETE}}, topics={TOPIC: {READ}}, denied={"g": {DESCRIBE}})
    r = authorizing_router(service, acls)
    described = await exchange(r, request(15, 5, {"groups": ["g"],
                                                   "include_authorized_operations": True}))
    assert described.response is not None
    assert [g["error_code"] for g in described.response["groups"]] == [GROUP_AUTH]
    offsets = await exchange(r, request(47, 0, {"group_id": "g", "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0}]}]}),
        lambda k, v, sent: {"error_code": 0, "topics": [
            {"name": t["name"], "partitions": [{"partition_index": 0, "error_code": 0}]}
            for t in sent["topics"]]})
    assert offsets.response is not None and offsets.response["error_code"] == 0
    deleted = await exchange(r, request(42, 2, {"groups_names": ["g"]}),
                             lambda k, v, sent: {"results": [
                                 {"group_id": g, "error_code": 0}
                                 for g in sent["groups_names"]]})
    assert deleted.response is not None
    assert [(g["group_id"], g["error_code"]) for g in deleted.response["results"]] == [
        ("g", 0)]
    assert membership.leaves == 1 and not service.claims("g")  # progress: deleted


async def test_list_groups_shows_only_the_coordinated_groups_the_client_may_describe() -> None:
    service = make_service()
    for group in ("seen", "unseen"):
        coordinate(service, group)
    acls = Acls(groups={"seen": {READ}, "unseen": set()}, topics={TOPIC: {READ}})
    r = authorizing_router(service, Acls(groups={"seen": {READ}, "unseen": {READ}},
                                         topics={TOPIC: {READ}}))
    for group in ("seen", "unseen"):  # a member each, so the engine lists them
        joined = await exchange(r, request(68, 0, heartbeat(group, [TOPIC])))
        assert joined.response is not None and joined.response["error_code"] == 0
    listed = await exchange(authorizing_router(service, acls), request(16, 4, {}),
                            lambda k, v, sent: {"error_code": 0, "groups": [
                                {"group_id": "broker-group", "protocol_type": "consumer",
                                 "group_state": "Stable", "group_type": "classic"}]})
    assert listed.response is not None
    assert sorted(g["group_id"] for g in listed.response["groups"]) == ["broker-group", "seen"]
    acls.cluster_describe = True
    listed = await exchange(authorizing_router(service, acls), request(16, 4, {}),
                            lambda k, v, sent: {"error_code": 0, "groups": []})
    assert listed.response is not None
    assert sorted(g["group_id"] for g in listed.response["groups"]) == ["seen", "unseen"]


# -- several sidecars ------------------------------------------------------------------------


@pytest.mark.parametrize("key,value", [
    (68, heartbeat("remote", [TOPIC], epoch=3, member="m")),
    (8, commit("remote")),
    (12, {"group_id": "remote", "generation_id": 1, "member_id": "m"}),
])
async def test_a_follower_relays_nothing_for_a_client_the_broker_would_refuse(
        key: int, value: dict[str, Any]) -> None:
    """Relayed requests reach the broker as the coordinating sidecar's identity: the follower
    checks its own client first, on the client's own connection."""
    from proxy.coordination.fleet import Card, Holder
    from proxy.coordination.peers import ConnectionLinks, FleetSide

    service = make_service(classic_translation=True)
    service.directory._views["remote"] = Holder("sidecar", Card(("10.0.0.9", 9095), "0.3.0"),
                                                "lock-member")
    acls = Acls(groups={"remote": {DESCRIBE}}, topics={TOPIC: {READ}})
    rights = Rights(acls.send, ttl=5.0, timer=Clock())
    r = CoordinatingRouter(
        DictAddressMap({}), RequestCounters("test"), parse_table(), handler_table(service), 1,
        "/10.0.0.7", claims=service.claims,
        fleet=FleetSide(service.routes, ConnectionLinks(service.pool), False,
                        service.broker_of),
        session=Session("test"), authorization=AuthorizationStage(rights, service))
    version = {68: 0, 8: 9, 12: 4}[key]
    result = await exchange(r, request(key, version, value))
    assert result.action == "local" and result.response is not None
    errors = {p["error_code"] for t in result.response.get("topics", ()) for p in t["partitions"]}
    assert (errors or {result.response["error_code"]}) == {GROUP_AUTH}
    assert not service.pool.fake.requests  # type: ignore[attr-defined]  # nothing relayed


def test_rights_are_bounded_per_connection() -> None:
    rights = Rights(None, ttl=5.0, maxsize=8, timer=Clock())
    rights.note({("group", f"g{i}", READ): True for i in range(100)})
    assert len(rights) <= 8


def test_topic_ids_of_v10_commits_are_named_from_the_topics_image() -> None:
    service = make_service()
    stage = AuthorizationStage(Rights(None, ttl=1.0), service)
    groups, topics, _ = stage.wants(_group_request(8, 10, {
        "group_id": "g", "topics": [{"topic_id": TOPIC_ID, "partitions": []}]}))
    assert topics == {TOPIC} and groups == {READ: {"g"}}


def _group_request(key: int, version: int, value: dict[str, Any]) -> Any:
    from proxy.codec.api_keys import ApiKey
    from proxy.coordination.handler import GroupRequest

    return GroupRequest(ApiKey(key), version, 1, "c", "/h", 1, b"", value)


async def test_a_stale_retry_is_not_acknowledged_to_a_client_without_read() -> None:
    """A commit retry that a newer commit of the member overtook is acknowledged without being
    written (commit_retries), only for a client that may commit at all: Kafka checks READ on
    the group before anything, so a client whose READ was removed gets
    GROUP_AUTHORIZATION_FAILED, for a group of the broker's own too."""
    service = make_service()
    acls = Acls(groups={"broker-group": {READ}}, topics={TOPIC: {READ}})
    newer = commit("broker-group", member="m", epoch=5)
    newer["topics"][0]["partitions"][0]["committed_offset"] = 78
    first = await exchange(authorizing_router(service, acls), request(8, 9, newer),
                           lambda k, v, sent: {"topics": [{"name": TOPIC, "partitions": [
                               {"partition_index": 0, "error_code": 0}]}]})
    # a broker's group: forwarded; what the client was told is noted by this sidecar
    assert first.action in ("forward", "rewrite")
    service.commit_retries.observe("broker-group", "m", newer, {"topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "error_code": 0}]}]})
    retry = commit("broker-group", member="m", epoch=5)  # offset 1 < 78: a stale retry
    acls.groups["broker-group"] = set()
    result = await exchange(authorizing_router(service, acls), request(8, 9, retry))
    assert result.response is not None
    assert partition_errors(result.response) == {TOPIC: {GROUP_AUTH}}
    assert service.commit_retries.acknowledged == 0


async def test_a_regex_matching_nothing_yet_is_resolved_under_rights_when_topics_appear(
        ) -> None:
    """The member joins before the proxy's metadata has the topics: the regex matches nothing
    then, and the topics appearing later are resolved only under the rights its next
    heartbeat brings."""
    service = make_service()
    coordinate(service, "g")
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {READ}})
    r = authorizing_router(service, acls)
    member = "m-regex"
    first = await exchange(r, request(68, 1, dict(heartbeat("g", member=member),
                                                  subscribed_topic_regex="x.*")))
    assert first.response is not None and first.response["error_code"] == 0
    group = service.engine.group("g")
    assert group is not None and group.resolved_regex == {"x.*": frozenset()}
    service.engine.update_topics(TopicsImage.of([
        TopicMetadata(TOPIC_ID, TOPIC, 4), TopicMetadata(uuid.UUID(int=8), "xopen", 1),
        TopicMetadata(uuid.UUID(int=9), "xsecret", 1)]), 10)
    assert group.resolved_regex == {"x.*": frozenset()}  # nothing checked yet
    acls.topics["xopen"] = {READ}
    beat = await exchange(r, request(68, 1, heartbeat("g", None, 1, member)))
    assert beat.response is not None and beat.response["error_code"] == 0
    assert group.resolved_regex == {"x.*": frozenset({"xopen"})}


async def test_topics_the_image_gains_while_the_broker_is_asked_are_asked_next_time(
        ) -> None:
    """The proxy's metadata gains the regex's topics while the stage asks the broker about the
    heartbeat's group (another group's refresh): they were not asked, so they are not taken
    as refused; the member's next heartbeat asks about them and gets the one it may describe
    (before: resolved as refused and never asked again, so the member stayed unassigned)."""
    service = make_service()
    coordinate(service, "g")
    grown = TopicsImage.of([
        TopicMetadata(TOPIC_ID, TOPIC, 4), TopicMetadata(uuid.UUID(int=8), "xopen", 1),
        TopicMetadata(uuid.UUID(int=9), "xsecret", 1)])

    class Growing(Acls):
        def answer(self, api_key: int, value: dict[str, Any]) -> dict[str, Any]:
            if service.engine.image is not grown:
                service.engine.update_topics(grown, 10)
            return super().answer(api_key, value)

    acls = Growing(groups={"g": {READ}}, topics={TOPIC: {READ}, "xopen": {READ}})
    r = authorizing_router(service, acls)
    member = "m-regex"
    first = await exchange(r, request(68, 1, dict(heartbeat("g", member=member),
                                                  subscribed_topic_regex="x.*")))
    assert first.response is not None and first.response["error_code"] == 0
    group = service.engine.group("g")
    assert group is not None and group.resolved_regex == {"x.*": frozenset()}
    beat = await exchange(r, request(68, 1, heartbeat("g", None, 1, member)))
    assert beat.response is not None and beat.response["error_code"] == 0
    assert group.resolved_regex == {"x.*": frozenset({"xopen"})}


async def test_per_group_probes_are_asked_a_few_at_a_time() -> None:
    """A DeleteGroups naming many groups asks DELETE on each (OffsetDelete), at most
    PROBES_PER_KIND in flight at once, and every group is answered."""
    acls = Acls(groups={f"g{i}": {DELETE} for i in range(0, 100, 2)})
    in_flight, most = 0, 0

    async def send(api_key: int, version: int, encode: Callable[[int], bytes],
                   timeout: float) -> bytes:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await trio.sleep(0)
        try:
            return await acls.send(api_key, version, encode, timeout)
        finally:
            in_flight -= 1

    rights = Rights(send, ttl=5.0, timer=Clock())
    learnt = await rights.ask(rights.missing({DELETE: [f"g{i}" for i in range(100)]}), None)
    assert most == PROBES_PER_KIND
    assert sorted(n for (_, n, _), allowed in learnt.items() if allowed) == sorted(
        f"g{i}" for i in range(0, 100, 2))
