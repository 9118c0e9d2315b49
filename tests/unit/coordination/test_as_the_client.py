"""Requests of members behind a follower that reach the broker as the client's own
(:mod:`proxy.coordination.as_the_client`): remainders (OffsetFetch, OffsetDelete,
DescribeGroups, DeleteGroups: the holder answers the engine's part, the follower sends the rest
on the client's connection) and heartbeats that bring their member's rights (the group's
regexes resolved under them).

A follower and a holder, each a service of its own; the follower's link to the holder's fleet
listener is :class:`~tests.unit.coordination.test_tickets.HolderLink`, which records every
relayed request (nothing must be relayed) and hands ``FleetControl`` to the holder's router.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from proxy.codec.api_keys import ApiKey
from proxy.coordination import remainders
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.peers import ConnectionLinks, FleetSide
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.coordination.service import CoordinatorService
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import parse_table
from proxy.security.rights import READ, Rights
from proxy.security.session import Session
from translation.topics import TopicMetadata, TopicsImage

from .helpers import TOPIC, TOPIC_ID, exchange, request, router
from .test_authorization import Acls, Clock
from .test_tickets import HEARTBEAT_V0, fleet_of, member_of

SECRET_ID = uuid.UUID(int=0x5EC)


def upstream_requests(service: CoordinatorService, key: int) -> list[dict[str, Any]]:
    """What ``service`` sent to the broker as the proxy, of API ``key``."""
    fake = service.pool.fake  # type: ignore[attr-defined]
    return [value for k, _v, value in fake.requests if k == key]


def controls(peer: Any, kind: str) -> list[dict[str, Any]]:
    return [body for body in map(json.loads, peer.controls) if body["type"] == kind]


def fetch(member: str, epoch: int) -> dict[str, Any]:
    return {"groups": [{"group_id": "g", "member_id": member, "member_epoch": epoch,
                        "topics": [{"name": TOPIC, "partition_indexes": [0]}]}],
            "require_stable": False}


def fetched(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "groups": [
        {"group_id": g["group_id"], "error_code": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p, "committed_offset": 42, "committed_leader_epoch": -1,
                 "metadata": "", "error_code": 0} for p in t["partition_indexes"]]}
            for t in g["topics"] or ()]} for g in value["groups"]]}


async def test_an_offset_fetch_is_checked_by_the_holder_and_sent_on_the_clients_connection(
        ) -> None:
    """The holder checks the member's epoch; the fetch, without member fields, goes upstream
    on the client's own connection (the broker checks DESCRIBE as the client's), never as the
    proxy; a stale epoch is answered with its error and nothing is sent."""
    holder, follower, peer = fleet_of()
    member, epoch = await member_of(holder)
    result = await exchange(router(follower, fleet=True),
                            request(ApiKey.OFFSET_FETCH, 9, fetch(member, epoch)), fetched)
    assert result.action == "rewrite" and result.sent is not None
    assert (result.sent["groups"][0]["member_id"], result.sent["groups"][0]["member_epoch"]) == (
        None, -1)
    assert result.response is not None
    assert result.response["groups"][0]["topics"][0]["partitions"][0]["committed_offset"] == 42
    assert peer.relayed == [] and not upstream_requests(holder, ApiKey.OFFSET_FETCH)

    stale = await exchange(router(follower, fleet=True),
                           request(ApiKey.OFFSET_FETCH, 9, fetch(member, epoch + 3)))
    assert stale.action == "local" and stale.response is not None
    assert stale.response["groups"][0]["error_code"] == 113  # STALE_MEMBER_EPOCH
    assert peer.relayed == [] and len(controls(peer, remainders.REMAINDER)) == 2


async def test_offset_delete_the_holder_refuses_subscribed_topics_and_the_rest_is_sent_here(
        ) -> None:
    holder, follower, peer = fleet_of()
    await member_of(holder)  # subscribed to TOPIC
    value = {"group_id": "g", "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0}]},
        {"name": "unsubscribed", "partitions": [{"partition_index": 1}]}]}

    def deleted(key: int, version: int, sent: dict[str, Any]) -> dict[str, Any]:
        return {"error_code": 0, "throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": 0}
                for p in t["partitions"]]} for t in sent["topics"]]}

    result = await exchange(router(follower, fleet=True),
                            request(ApiKey.OFFSET_DELETE, 0, value), deleted)
    assert result.action == "rewrite" and result.sent is not None
    assert [t["name"] for t in result.sent["topics"]] == ["unsubscribed"]
    assert result.response is not None
    errors = {t["name"]: t["partitions"][0]["error_code"] for t in result.response["topics"]}
    assert errors == {"unsubscribed": 0, TOPIC: 86}  # GROUP_SUBSCRIBED_TO_TOPIC
    assert peer.relayed == [] and not upstream_requests(holder, ApiKey.OFFSET_DELETE)


async def test_delete_groups_the_holder_forgets_the_group_and_the_broker_deletes_it_as_the_client(
        ) -> None:
    """A group with a member: NON_EMPTY_GROUP from the holder, nothing sent. Once it is empty
    the holder forgets it (and leaves the broker's group), and the follower sends the
    DeleteGroups on the client's connection, where the broker checks DELETE as the client's."""
    holder, follower, peer = fleet_of()
    member, _epoch = await member_of(holder)
    value = {"groups_names": ["g"]}
    busy = await exchange(router(follower, fleet=True),
                          request(ApiKey.DELETE_GROUPS, 2, value))
    assert busy.action == "local" and busy.response is not None
    assert [(r["group_id"], r["error_code"]) for r in busy.response["results"]] == [
        ("g", 68)]  # NON_EMPTY_GROUP
    left = await exchange(router(holder, None, inbound=True), request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, dict(HEARTBEAT_V0, member_id=member,
                                                 member_epoch=-1)))
    assert left.response is not None and left.response["error_code"] == 0
    result = await exchange(router(follower, fleet=True), request(ApiKey.DELETE_GROUPS, 2, value),
                            lambda k, v, sent: {"throttle_time_ms": 0, "results": [
                                {"group_id": g, "error_code": 0} for g in sent["groups_names"]]})
    assert result.action == "rewrite" and result.sent == value
    assert result.response is not None
    assert [(r["group_id"], r["error_code"]) for r in result.response["results"]] == [("g", 0)]
    assert holder.engine.group("g") is None and "g" not in holder.memberships
    assert peer.relayed == [] and not upstream_requests(holder, ApiKey.DELETE_GROUPS)


async def test_describe_groups_of_a_held_group_is_answered_by_the_holder_alone() -> None:
    holder, follower, peer = fleet_of()
    member, _epoch = await member_of(holder)
    result = await exchange(router(follower, fleet=True), request(
        ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["g"], "include_authorized_operations": False}))
    assert result.action == "local" and result.response is not None
    (group,) = result.response["groups"]
    assert group["group_id"] == "g" and [m["member_id"] for m in group["members"]] == [member]
    assert peer.relayed == []


async def test_a_holder_without_remainders_gets_the_request_relayed() -> None:
    holder, follower, peer = fleet_of(takes_tickets=False)
    member, epoch = await member_of(holder)
    result = await exchange(router(follower, fleet=True),
                            request(ApiKey.OFFSET_FETCH, 9, fetch(member, epoch)))
    assert result.action == "local"
    assert [k for k, _ in peer.relayed] == [ApiKey.OFFSET_FETCH]


def test_a_split_travels_at_the_requests_version() -> None:
    split = remainders.Split({1: {"group_id": "b", "error_code": 113, "topics": []}},
                             {"groups": [{"group_id": "a", "member_id": None,
                                          "member_epoch": -1, "topics": None}],
                              "require_stable": True})
    body = remainders.reply_body(ApiKey.OFFSET_FETCH, 9, remainders.Reply(0, split))
    reply = remainders.read_reply(ApiKey.OFFSET_FETCH, 9, body)
    assert reply is not None and reply.split is not None
    assert reply.split.local == {1: {"group_id": "b", "error_code": 113, "topics": []}}
    assert reply.split.rest is not None and reply.split.rest["groups"][0]["group_id"] == "a"
    refused = remainders.read_reply(ApiKey.OFFSET_FETCH, 9, remainders.reply_body(
        0, 0, remainders.Reply(16)))
    assert refused == remainders.Reply(16)
    assert remainders.read_reply(ApiKey.OFFSET_FETCH, 9, b"\x00\x23") is None  # unsupported


# -- regexes under the rights of a member behind a follower ----------------------------------


def authorizing_follower(service: CoordinatorService, acls: Acls) -> CoordinatingRouter:
    rights = Rights(acls.send, ttl=5.0, timer=Clock())
    return CoordinatingRouter(
        DictAddressMap({}), RequestCounters("test"), parse_table(), handler_table(service), 1,
        "/10.0.0.7", claims=service.claims,
        fleet=FleetSide(service.routes, ConnectionLinks(service.pool), False,
                        service.broker_of),
        session=Session("test"), authorization=AuthorizationStage(rights, service))


def regex_join(member: str) -> dict[str, Any]:
    return dict(HEARTBEAT_V0, member_id=member, subscribed_topic_names=None,
                subscribed_topic_regex="order.*")


def with_secret_topic(holder: CoordinatorService) -> None:
    holder.engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 4),
                                                TopicMetadata(SECRET_ID, "ordersecret", 2)]), 0)


async def test_a_regex_member_behind_a_follower_is_resolved_under_its_own_rights() -> None:
    """The regex matches two topics at the holder; the member may describe one. The holder
    asks for its rights before resolving, the follower asks the broker on the client's
    connection and sends the heartbeat again with them: only the describable topic is
    resolved (before: both, as the proxy). Its steady heartbeats ask nothing more."""
    holder, follower, peer = fleet_of()
    with_secret_topic(holder)
    acls = Acls(groups={"g": {READ}}, topics={TOPIC: {READ}})
    r = authorizing_follower(follower, acls)
    member = str(uuid.uuid4())
    joined = await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, regex_join(member)))
    assert joined.response is not None and joined.response["error_code"] == 0, joined.response
    group = holder.engine.group("g")
    assert group is not None and group.resolved_regex == {"order.*": frozenset({TOPIC})}
    sent = controls(peer, "Heartbeat")
    assert [b["rights"] is not None for b in sent] == [False, True]
    assert sent[1]["rights"] == {"checked": [TOPIC, "ordersecret"], "allowed": [TOPIC]}
    probed = [sorted(t["name"] for t in v["topics"]) for k, v in acls.probes if k == 3]
    assert ["ordersecret"] in probed  # asked of the broker on the client's connection
    assert peer.relayed == []
    beat = await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, dict(
        HEARTBEAT_V0, member_id=member, member_epoch=joined.response["member_epoch"],
        subscribed_topic_names=None, rebalance_timeout_ms=-1, topic_partitions=None)))
    assert beat.response is not None and beat.response["error_code"] == 0
    assert len(controls(peer, "Heartbeat")) == 3  # one round trip: nothing was due
    assert group.resolved_regex == {"order.*": frozenset({TOPIC})}


async def test_a_follower_without_authorization_gets_the_regex_resolved_over_every_topic(
        ) -> None:
    holder, follower, peer = fleet_of()
    with_secret_topic(holder)
    joined = await exchange(router(follower, fleet=True),
                            request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1,
                                    regex_join(str(uuid.uuid4()))))
    assert joined.response is not None and joined.response["error_code"] == 0
    group = holder.engine.group("g")
    assert group is not None and group.resolved_regex == {
        "order.*": frozenset({TOPIC, "ordersecret"})}
    assert [b["can_ask"] for b in controls(peer, "Heartbeat")] == [False]


async def test_heartbeats_to_a_holder_that_takes_none_are_relayed_and_it_is_remembered(
        ) -> None:
    _holder, follower, peer = fleet_of(takes_tickets=False)

    async def relayed(api_key: int, version: int, value: dict[str, Any], **_: Any
                      ) -> dict[str, Any]:
        peer.relayed.append((api_key, value))
        return {"error_code": 0, "member_id": "m", "member_epoch": 1,
                "heartbeat_interval_ms": 500}

    peer.request = relayed  # type: ignore[method-assign]
    for _ in range(2):
        joined = await exchange(router(follower, fleet=True),
                                request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0))
        assert joined.action == "local"
    assert [k for k, _ in peer.relayed] == [ApiKey.CONSUMER_GROUP_HEARTBEAT] * 2
    assert len(peer.controls) == 1  # asked once, then relayed


async def test_a_heartbeat_inside_fleet_control_names_its_follower_to_the_holder() -> None:
    """The holder keeps who relays for a group, for a hand-back to tell each of them first
    (:mod:`proxy.coordination.release_fleet`): a KIP-848 heartbeat that reaches it inside
    ``FleetControl`` names the follower as a relayed one does."""
    holder, follower, peer = fleet_of()
    follower.routes.own_fleet_address = "10.0.0.9:9094"
    joined = await exchange(router(follower, fleet=True), request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, dict(HEARTBEAT_V0, member_id=str(uuid.uuid4()))))
    assert joined.response is not None and joined.response["error_code"] == 0, joined.response
    assert controls(peer, "Heartbeat") and peer.relayed == []
    assert holder.relayers.of("g") == ["10.0.0.9:9094"]
