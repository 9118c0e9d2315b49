"""Taking a group over to load a member's state (state log on, several sidecars): only a
group the broker shows a sidecar may have held is taken over for a member's request, a
takeover whose load finds no member gives the broker's group back at once whatever API started
it, and a loaded group's topics are advertised in the broker's group (KIP-211) at once."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import trio

from proxy import metrics
from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.schema import struct_default
from proxy.coordination.convert import parse_subscription
from proxy.coordination.service import CoordinatorService
from tests.unit.coordination.test_durability import (
    JOIN,
    FakeStateLog,
    Log,
    heartbeat,
    started,
)
from tests.unit.coordination.test_fuzz_requests import stub_broker
from translation.topics import TopicMetadata, TopicsImage

from .helpers import TOPIC, TOPIC_ID, exchange, make_service, request, router

UNKNOWN_MEMBER_ID, NONE = 25, 0
PAYMENTS = "payments"
PAYMENTS_ID = uuid.UUID("5c0e1d2a-3b4f-4a5b-8c6d-7e8f9a0b1c2d")
MADE_UP = "x"
CLASSIC_ID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
"""A member id of the shape the engine gives classic members (a bare UUID)."""

NEVER_USED = {"error_code": 0, "group_state": "Dead", "protocol_type": "",
              "protocol_data": "", "members": [], "authorized_operations": -2147483648}
"""DescribeGroups of a group id the broker never saw (or whose offsets are gone)."""
EMPTIED = dict(NEVER_USED, group_state="Empty", protocol_type="consumer")
"""DescribeGroups of a group whose sidecar's member left or was dropped."""


def broker_showing(described: dict[str, Any]) -> Callable[[int, int, dict[str, Any]],
                                                            dict[str, Any]]:
    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"throttle_time_ms": 0,
                    "groups": [dict(described, group_id=g) for g in value["groups"]]}
        return stub_broker(key, version, value)
    return broker


def durable(log: Log, described: dict[str, Any]) -> CoordinatorService:
    service = make_service(broker_showing(described), state_log=True)
    assert service.durability is not None
    service.durability.log = FakeStateLog(log)  # type: ignore[assignment]
    service.engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 4),
                                                 TopicMetadata(PAYMENTS_ID, PAYMENTS, 2)]), 0)
    return service


def sent(service: CoordinatorService, key: int) -> list[dict[str, Any]]:
    return [value for k, _v, value in service.pool.fake.requests  # type: ignore[attr-defined]
            if k == key]


def wire(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    full = struct_default(messages.schema(key).struct, version)
    full.update(value)
    return full


def member_requests(group_id: str, member_id: str) -> dict[str, tuple[int, int, dict[str, Any]]]:
    """Every API's request of a member of ``group_id`` that a takeover may be started for."""
    commit_topics = [{"name": TOPIC, "partitions": [
        {"partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
         "committed_metadata": ""}]}]
    return {
        "Heartbeat": (ApiKey.HEARTBEAT, 4, wire(ApiKey.HEARTBEAT, 4, {
            "group_id": group_id, "generation_id": 3, "member_id": member_id})),
        "SyncGroup": (ApiKey.SYNC_GROUP, 5, wire(ApiKey.SYNC_GROUP, 5, {
            "group_id": group_id, "generation_id": 3, "member_id": member_id,
            "protocol_type": "consumer", "protocol_name": "range", "assignments": []})),
        "LeaveGroup": (ApiKey.LEAVE_GROUP, 4, wire(ApiKey.LEAVE_GROUP, 4, {
            "group_id": group_id,
            "members": [{"member_id": member_id, "group_instance_id": None}]})),
        "OffsetCommit": (ApiKey.OFFSET_COMMIT, 8, wire(ApiKey.OFFSET_COMMIT, 8, {
            "group_id": group_id, "generation_id_or_member_epoch": 3, "member_id": member_id,
            "topics": commit_topics})),
        "ConsumerGroupHeartbeat": (ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, dict(
            JOIN, group_id=group_id, member_id=member_id, member_epoch=3,
            rebalance_timeout_ms=-1, subscribed_topic_names=None, topic_partitions=None)),
    }


def error_of(response: dict[str, Any]) -> int:
    """The member's error in any of these responses."""
    if "topics" in response:  # OffsetCommit: per partition
        return int(response["topics"][0]["partitions"][0]["error_code"])
    return int(response["error_code"])


def joins_sent() -> float:
    return sum(metrics.REGISTRY.get_sample_value(
        "groupgate_broker_group_joins_total", {"reason": reason}) or 0.0
        for reason in ("takeover", "rejoin"))


async def test_made_up_members_take_no_never_used_group_over(
        autojump_clock: trio.abc.Clock) -> None:
    """Requests naming member ids nobody issued, for group ids the broker never saw, pass to
    the broker (which answers them as it would without the proxy): no JoinGroup, no group
    held, nothing left behind that fences the broker's own members or fills max-groups."""
    service = durable(Log(), NEVER_USED)
    before = joins_sent()
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        for index, (api, (key, version, value)) in enumerate(
                member_requests("made-up", MADE_UP).items()):
            group_id = f"made-up-{index}"
            value = dict(value, group_id=group_id)
            result = await exchange(router(service, fleet=True),
                                    request(key, version, value, index))
            # progress: the broker answers it (a new-protocol heartbeat is always the
            # proxy's, which tells the member to join afresh)
            assert result.action == "forward" or (
                result.response is not None
                and error_of(result.response) == UNKNOWN_MEMBER_ID), api
            assert group_id not in service.memberships, api
        nursery.cancel_scope.cancel()
    assert sent(service, ApiKey.DESCRIBE_GROUPS)  # each group was looked up...
    assert sent(service, ApiKey.JOIN_GROUP) == [] and service.memberships == {}  # ...not held
    assert joins_sent() == before


async def test_a_takeover_to_load_that_finds_no_member_gives_the_broker_group_back(
        autojump_clock: trio.abc.Clock) -> None:
    """The broker's group was held by a sidecar, but the state log has no member of it: the
    takeover each API's request started leaves the broker's group at once and the member is
    told to join afresh (UNKNOWN_MEMBER_ID)."""
    service = durable(Log(), EMPTIED)
    requests = member_requests("g", CLASSIC_ID)
    join_metadata = messages.encode_data("ConsumerProtocolSubscription", 1,
                                         {"topics": [TOPIC], "owned_partitions": []})
    requests["JoinGroup"] = (ApiKey.JOIN_GROUP, 5, wire(ApiKey.JOIN_GROUP, 5, {
        "group_id": "g", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
        "member_id": CLASSIC_ID, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": join_metadata}]}))
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        for index, (api, (key, version, value)) in enumerate(requests.items()):
            group_id = f"emptied-{index}"
            value = dict(value, group_id=group_id)
            joins, leaves = len(sent(service, ApiKey.JOIN_GROUP)), len(
                sent(service, ApiKey.LEAVE_GROUP))
            result = await exchange(router(service, fleet=True),
                                    request(key, version, value, index))
            assert result.action == "local" and result.response is not None, api
            assert error_of(result.response) == UNKNOWN_MEMBER_ID, api
            assert len(sent(service, ApiKey.JOIN_GROUP)) > joins, api  # it was taken over
            left = sent(service, ApiKey.LEAVE_GROUP)[leaves:]
            assert [m["group_id"] for m in left] == [group_id], api  # and given back
            assert group_id not in service.memberships and not service.claims(group_id), api
        nursery.cancel_scope.cancel()
    assert service.memberships == {} and service.durability is not None
    assert service.durability.groups == {}  # no writer left open


async def _member_of_a_loaded_group(log: Log) -> tuple[str, int]:
    """A coordinator (gone afterwards) wrote a group whose member subscribes to two topics."""
    first = durable(log, EMPTIED)
    async with trio.open_nursery() as nursery:
        await started(first, nursery)
        await first._take_over("g", ())
        joined = await heartbeat(first, dict(JOIN, subscribed_topic_names=[TOPIC, PAYMENTS]))
        assert joined["error_code"] == NONE and joined["member_epoch"] > 0
        nursery.cancel_scope.cancel()
    return joined["member_id"], joined["member_epoch"]


async def test_a_member_the_state_log_knows_still_loads_its_group(
        autojump_clock: trio.abc.Clock) -> None:
    log = Log()
    member_id, epoch = await _member_of_a_loaded_group(log)
    second = durable(log, EMPTIED)  # the first coordinator is gone (SIGKILL)
    async with trio.open_nursery() as nursery:
        await started(second, nursery)
        again = await exchange(router(second, fleet=True), request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
            dict(JOIN, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=-1,
                 subscribed_topic_names=None, topic_partitions=None)))
        assert again.response is not None and again.response["error_code"] == NONE
        assert again.response["member_epoch"] == epoch  # goes on: no rejoin
        assert second.coordinates("g") and sent(second, ApiKey.LEAVE_GROUP) == []
        nursery.cancel_scope.cancel()


async def test_after_loading_a_group_the_broker_s_group_advertises_its_topics(
        autojump_clock: trio.abc.Clock) -> None:
    """The takeover's JoinGroup names no topics (a member's heartbeat carries none, and the
    state is loaded only once the group is held); the loaded group's topics are advertised
    right after, so that the broker keeps the offsets of every topic the group subscribes to
    (KIP-211), also of a topic nobody commits to for a while."""
    log = Log()
    member_id, epoch = await _member_of_a_loaded_group(log)
    second = durable(log, EMPTIED)
    async with trio.open_nursery() as nursery:
        await started(second, nursery)
        again = await exchange(router(second, fleet=True), request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
            dict(JOIN, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=-1,
                 subscribed_topic_names=None, topic_partitions=None)))
        assert again.response is not None and again.response["error_code"] == NONE
        membership = second.memberships["g"]
        for _ in range(100):
            if membership.advertised == (TOPIC, PAYMENTS) and membership.stable:
                break
            await trio.sleep(0.1)
        assert membership.advertised == (TOPIC, PAYMENTS) and membership.stable
        last_join = sent(second, ApiKey.JOIN_GROUP)[-1]
        subscription = parse_subscription(last_join["protocols"][0]["metadata"])
        assert subscription is not None and set(subscription.topics) == {TOPIC, PAYMENTS}
        assert sent(second, ApiKey.LEAVE_GROUP) == []
        nursery.cancel_scope.cancel()


async def test_the_broker_s_description_tells_a_group_a_sidecar_may_have_held() -> None:
    from proxy.coordination.fleet import read_holder

    assert read_holder(dict(NEVER_USED, group_id="g")).kind == "unused"
    assert read_holder(dict(NEVER_USED, group_id="g", group_state="Empty")).kind == "unused"
    assert read_holder(dict(EMPTIED, group_id="g")).kind == "free"
    service = durable(Log(), NEVER_USED)
    for described, loads in ((NEVER_USED, False), (EMPTIED, True)):
        service.directory._views["g"] = read_holder(dict(described, group_id="g"))
        assert service.may_load("g", MADE_UP) is loads
        assert service.routes.route(["g"]).kind == "local"  # the same route either way
