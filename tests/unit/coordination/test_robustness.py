"""Nothing a client sends can end the proxy, and a join the engine refuses starts nothing.

The coordinator service with its real broker memberships (no fakes for them) against a pool
whose broker answers as the test says: a task started on a client's behalf that fails stays
with that client; refused joins take nothing over; every quantity a join carries is bounded.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from proxy.coordination.convert import join_group_request
from proxy.coordination.service import CoordinatorService
from tests.unit.coordination.test_convert_classic import subscription_bytes
from translation.classic.routing import classify_classic_join
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from .helpers import TOPIC, consumer_heartbeat, coordinate, make_service

COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST, INVALID_GROUP_ID = 15, 42, 24
INVALID_REGULAR_EXPRESSION = 128


def join(group: str, member: str = "m1", **fields: Any) -> ConsumerGroupHeartbeatRequest:
    value = {"group_id": group, "member_id": member, "member_epoch": 0,
             "rebalance_timeout_ms": 10_000, "subscribed_topic_names": [TOPIC],
             "topic_partitions": [], **fields}
    return consumer_heartbeat(value, client_id="c", client_host="/h", api_version=1)


async def running(service: CoordinatorService, nursery: trio.Nursery) -> None:
    await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                        task_status=task_status))


async def test_a_broker_membership_that_fails_unexpectedly_fails_alone(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    """The broker answers FindCoordinator with something the membership cannot read (a bug's
    stand-in): the member that started it gets a retriable error, the service runs on."""
    service = make_service(lambda key, version, value: {})  # no error_code, no node
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        response = await service.heartbeat(join("g"))
        assert response.error_code == COORDINATOR_NOT_AVAILABLE
        assert "unexpected KeyError" in (response.error_message or "")
        assert "g" not in service.memberships and "g" not in service.engine.groups
        coordinate(service, "other")  # another group, held fine, is served as before
        assert (await service.heartbeat(join("other"))).error_code == 0
        nursery.cancel_scope.cancel()
    assert "membership in the broker's group failed unexpectedly" in caplog.text


async def test_a_group_id_too_long_for_the_proxys_own_requests_is_refused_up_front(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        response = await service.heartbeat(join("g" * 40_000))
        assert response.error_code == INVALID_GROUP_ID
        assert not service.memberships and not service.engine.groups
        nursery.cancel_scope.cancel()


async def test_rejected_joins_take_nothing_over(autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        for i in range(2001):
            bad = (join(f"g{i}", subscribed_topic_names=None, subscribed_topic_regex="(")
                   if i % 2 else join(f"g{i}", rebalance_timeout_ms=-1))
            response = await service.heartbeat(bad)
            assert response.error_code in (INVALID_REQUEST, INVALID_REGULAR_EXPRESSION)
        assert not service.memberships and not service.engine.groups
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("fields", "error"), [
    ({"subscribed_topic_names": [f"t{i}" for i in range(11)]}, INVALID_REQUEST),
    ({"subscribed_topic_names": ["x" * 250]}, INVALID_REQUEST),
    ({"subscribed_topic_names": ["no spaces"]}, INVALID_REQUEST),
    ({"subscribed_topic_names": None, "subscribed_topic_regex": "a" * 65},
     INVALID_REGULAR_EXPRESSION),
    ({"instance_id": "i" * 250}, INVALID_REQUEST),
], ids=["too-many-topics", "topic-too-long", "illegal-topic", "regex-too-long",
        "instance-id-too-long"])
async def test_what_a_join_carries_is_bounded(autojump_clock: trio.testing.MockClock,
                                              fields: dict[str, Any], error: int) -> None:
    service = make_service(max_subscription_topics=10, max_regex_bytes=64)
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        response = await service.heartbeat(join("g", **fields))
        assert response.error_code == error, response.error_message
        assert not service.memberships and not service.engine.groups
        nursery.cancel_scope.cancel()


async def test_groups_and_members_of_the_proxy_are_bounded(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(max_groups=2, max_members=3)
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        for group in ("a", "b"):
            coordinate(service, group)
        assert (await service.heartbeat(join("a", "m1"))).error_code == 0
        assert (await service.heartbeat(join("a", "m2"))).error_code == 0
        third = await service.heartbeat(join("c", "m3"))  # a third group
        assert third.error_code == COORDINATOR_NOT_AVAILABLE
        assert "max-groups" in (third.error_message or "") and "c" not in service.memberships
        assert (await service.heartbeat(join("b", "m3"))).error_code == 0
        full = await service.heartbeat(join("b", "m4"))  # a fourth member anywhere
        assert full.error_code == COORDINATOR_NOT_AVAILABLE
        assert "maximum of 3 members" in (full.error_message or "")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("change", "reason"), [
    ({"topics": ["a", "b", "c"]}, "at most 2"),
    ({"group_id": "g" * 40_000}, "at most 32767"),
    ({"group_instance_id": "i" * 250}, "not a legal name"),
    ({"session_timeout_ms": 1}, "out of range"),
], ids=["too-many-topics", "group-id-too-long", "instance-id-too-long", "session-timeout"])
async def test_a_classic_join_the_engine_would_refuse_goes_to_the_broker(
        change: dict[str, Any], reason: str) -> None:
    """Forwarded untouched, so nothing is taken over: the broker answers it, as it would
    without the proxy."""
    service = make_service(max_subscription_topics=2)
    subscription = subscription_bytes(1, change.pop("topics", [TOPIC]))
    value = {"group_id": "g", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
             "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
             "protocols": [{"name": "range", "metadata": subscription}], **change}
    request = join_group_request(value, 5)
    routing = classify_classic_join(service.engine, request)
    assert not routing.to_engine and reason in routing.reason
    assert not service.takes_join(request)
    ok = join_group_request(dict(value, group_id="g", group_instance_id=None,
                                 session_timeout_ms=10_000,
                                 protocols=[{"name": "range",
                                             "metadata": subscription_bytes(1, [TOPIC])}]), 5)
    assert classify_classic_join(service.engine, ok).to_engine


async def test_a_failing_service_task_is_started_again(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    service = make_service()
    calls: list[float] = []
    tick = service.engine.tick

    def failing_once(now_ms: int) -> Any:
        calls.append(trio.current_time())
        if len(calls) == 1:
            raise RuntimeError("a bug in the timer task")
        return tick(now_ms)

    service.engine.tick = failing_once  # type: ignore[method-assign]
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        await service.heartbeat(join("g"))
        await trio.sleep(60)  # the session timeout passes: the timer task fences m1
        assert "m1" not in service.engine.groups["g"].members
        nursery.cancel_scope.cancel()
    assert len(calls) >= 2 and "the timer task failed unexpectedly" in caplog.text


async def test_a_classic_member_of_a_proxy_that_is_gone_rejoins_here(
        autojump_clock: trio.testing.MockClock) -> None:
    """After a proxy is killed, its classic members come back with the ids it gave them. Their
    joins must not reach the broker's group, which a proxy holds and would refuse with the
    fatal INCONSISTENT_GROUP_PROTOCOL: they are told to join afresh, and nothing is taken
    over for them. Ids a broker gives (client id, dash, UUID) still go to the broker."""
    import uuid

    service = make_service()
    value = {"group_id": "g", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
             "member_id": str(uuid.uuid4()), "group_instance_id": None,
             "protocol_type": "consumer",
             "protocols": [{"name": "range", "metadata": subscription_bytes(1, [TOPIC])}]}
    orphan = join_group_request(value, 5)
    assert service.takes_join(orphan)
    async with trio.open_nursery() as nursery:
        await running(service, nursery)
        response = await service.join_group(orphan)
        assert response.error_code == 25  # UNKNOWN_MEMBER_ID: rejoin without an id
        assert not service.memberships and not service.engine.groups
        nursery.cancel_scope.cancel()
    broker_member = join_group_request(dict(value, member_id=f"rdkafka-{uuid.uuid4()}"), 5)
    assert not service.takes_join(broker_member)
