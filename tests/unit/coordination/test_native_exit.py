"""The exit to Kafka 4.x's own KIP-848 coordinator (``release --to native``), on trio's mock
clock with a scripted broker: the anchor, the members told to rejoin there, the requests that
pass to the broker, the check before a takeover, the command in front of a 3.x broker."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from proxy.codec.api_keys import ApiKey
from proxy.coordination.handler import PASS, Answer, GroupRequest, Upstream
from proxy.coordination.native_exit import (
    ANCHOR_CLIENT_ID,
    CONSUMER_MEMBER_TYPE,
    describe_outcome,
    heartbeat_outcome,
)
from proxy.coordination.release import (
    GROUP_RESOURCE,
    NO_KIP848,
    RELEASE_CONFIG,
    ReleaseCommandHandler,
    ReleaseTarget,
    release_targets,
)
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from .helpers import TOPIC_ID, coordinate, coordinator_found, make_service
from .helpers import joining_heartbeat as _hb


class Broker4:
    """A Kafka 4.x broker as the exit sees it: the coordinator found, the anchor's heartbeats
    answered, ConsumerGroupDescribe showing ``others`` consumer-protocol members once
    ``joined_others`` is set."""

    def __init__(self) -> None:
        self.heartbeats: list[dict[str, Any]] = []
        self.describe_error = int(ErrorCode.GROUP_ID_NOT_FOUND)
        self.others = False

    def __call__(self, key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.FIND_COORDINATOR:
            return coordinator_found(version, value, "10.0.0.1", 9092)
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            self.heartbeats.append(value)
            if value["member_epoch"] == -1:
                return {"error_code": 0, "member_id": value["member_id"], "member_epoch": -1,
                        "heartbeat_interval_ms": 0}
            return {"error_code": 0, "member_id": value["member_id"], "member_epoch": 5,
                    "heartbeat_interval_ms": 1000, "assignment": None}
        if key == ApiKey.CONSUMER_GROUP_DESCRIBE:
            members = [{"member_id": "other", "member_type": CONSUMER_MEMBER_TYPE}] \
                if self.others else []
            return {"groups": [{"error_code": self.describe_error, "group_id": "g",
                                "members": members}]}
        return {"error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE), "coordinators": []}


def _owned(member: str, epoch: int, partitions: list[int]) -> ConsumerGroupHeartbeatRequest:
    return ConsumerGroupHeartbeatRequest(group_id="g", member_id=member, member_epoch=epoch,
                                         topic_partitions=[(TOPIC_ID, partitions)])


def _heartbeat_request(member: str, epoch: int) -> GroupRequest:
    return GroupRequest(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, 3, "c", "/h", None, b"",
                        {"group_id": "g", "member_id": member, "member_epoch": epoch})


async def _kip848() -> bool:
    return True


async def test_a_native_release_anchors_the_group_and_sends_its_members_to_the_broker(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker4()
    service = make_service(broker, migration_policy="downgrade")
    service.exits.broker_has_kip848 = _kip848  # type: ignore[method-assign]
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        joined = await service.heartbeat(_hb("m1", 0))
        epoch = joined.member_epoch
        await service.heartbeat(_owned("m1", epoch, [0, 1, 2, 3]))
        assert service.start_release("g", "groupgate release --to native",
                                     ReleaseTarget.NATIVE) is None
        told = await service.heartbeat(_owned("m1", epoch, [0, 1, 2, 3]))
        assert told.assignment == []  # it gives everything up first, as in any release
        await service.heartbeat(_owned("m1", epoch, []))
        await trio.sleep(0.5)
        assert membership.leaves == 1 and service.released("g")
        # the anchor joined the Empty broker group with an empty subscription ...
        join = broker.heartbeats[0]
        assert join["member_epoch"] == 0 and join["subscribed_topic_names"] == []
        assert "g" in service.exits.anchors
        # ... the KIP-848 member is not carried over: told once to rejoin at the broker
        assert service.bridges.member("g", "m1") is None
        first = heartbeat_outcome(service, _heartbeat_request("m1", epoch))
        assert isinstance(first, Answer)
        assert first.value["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID  # type: ignore[index]
        assert heartbeat_outcome(service, _heartbeat_request("m1", epoch)) is PASS
        assert heartbeat_outcome(service, _heartbeat_request("m1", 0)) is PASS
        assert heartbeat_outcome(service, _heartbeat_request("stranger", 3)) is PASS
        describe = GroupRequest(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, 3, "c", "/h", None, b"",
                                {"group_ids": ["g"]})
        assert describe_outcome(service, describe) is PASS
        # a consumer-protocol member is in: the anchor leaves
        broker.others = True
        await trio.sleep(3.0)
        assert "g" not in service.exits.anchors
        assert broker.heartbeats[-1]["member_epoch"] == -1
        # and the group is never taken over again here
        assert service.releases.native("g", trio.current_time()) is not None
        nursery.cancel_scope.cancel()


async def test_the_anchor_leaves_when_the_sidecar_stops(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker4()
    service = make_service(broker)
    async with trio.open_nursery() as nursery:
        joined = service.exits.start_anchor("g", nursery)
        await joined.wait()
        await trio.sleep(5.0)
        assert [h["member_epoch"] for h in broker.heartbeats][:2] == [0, 5]
        service.exits.stop_anchors()
        await trio.sleep(0.1)
        assert broker.heartbeats[-1]["member_epoch"] == -1 and not service.exits.anchors


async def test_a_group_the_brokers_kip848_coordinator_has_is_never_taken_over(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker4()
    broker.describe_error = 0  # the broker describes it: a consumer group
    service = make_service(broker)
    service.exits.broker_has_kip848 = _kip848  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        answer = await service.heartbeat(_hb("m1", 0))
        assert answer.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert "g" not in service.memberships
        # remembered: the member's next heartbeat goes to the broker untouched
        assert heartbeat_outcome(service, _heartbeat_request("m1", 0)) is PASS
        # a classic group at the broker (or none): taken over as always
        broker.describe_error = int(ErrorCode.GROUP_ID_NOT_FOUND)
        assert await service._native_at_broker("other") is None
        nursery.cancel_scope.cancel()


def _command(group: str, value: str) -> GroupRequest:
    return GroupRequest(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, 3, "admin", "/127.0.0.1", None, b"", {
        "resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group,
                       "configs": [{"name": RELEASE_CONFIG, "config_operation": 0,
                                    "value": value}]}],
        "validate_only": False})


async def test_the_exit_is_refused_in_front_of_a_broker_without_a_kip848_coordinator(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(Broker4(), migration_policy="downgrade")  # ApiVersions: 3.x
    coordinate(service, "g")
    handler = ReleaseCommandHandler(service)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        await service.heartbeat(_hb("m1", 0))
        outcome = handler.decide(_command("g", "native"))
        assert isinstance(outcome, Answer)
        probe = await outcome.value  # type: ignore[misc]
        assert isinstance(probe, Upstream) and probe.value["validate_only"] is True
        answer = probe.on_response({"throttle_time_ms": 0, "responses": [
            {"error_code": int(ErrorCode.INVALID_CONFIG), "error_message": "x",
             "resource_type": GROUP_RESOURCE, "resource_name": "g"}]})
        resource = answer["responses"][0]
        assert resource["error_code"] == ErrorCode.INVALID_REQUEST
        assert resource["error_message"] == NO_KIP848
        assert service.releases.phase("g", trio.current_time()) is None
        # a value groupgate does not take is refused too
        bad = handler.decide(_command("g", "elsewhere"))
        assert isinstance(bad, Upstream)
        answer = bad.on_response({"throttle_time_ms": 0, "responses": [
            {"error_code": int(ErrorCode.INVALID_CONFIG), "error_message": "x",
             "resource_type": GROUP_RESOURCE, "resource_name": "g"}]})
        assert answer["responses"][0]["error_code"] == ErrorCode.INVALID_REQUEST
        nursery.cancel_scope.cancel()


def test_the_config_value_names_the_coordinator() -> None:
    def value(v: str) -> dict[str, Any]:
        return _command("g", v).value

    assert release_targets(value("true")) == {"g": ReleaseTarget.CLASSIC}
    assert release_targets(value("Classic")) == {"g": ReleaseTarget.CLASSIC}
    assert release_targets(value("native")) == {"g": ReleaseTarget.NATIVE}
    assert release_targets(value("")) == {"g": None}
    assert ANCHOR_CLIENT_ID == "groupgate-exit-anchor"
