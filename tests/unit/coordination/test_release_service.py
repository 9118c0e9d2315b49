"""The hand-back in the coordinator service, on trio's mock clock: who is told what while the
group is being released, when the lock leaves, and what the members get afterwards."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from proxy.codec.api_keys import ApiKey
from proxy.coordination.handler import PASS, GroupRequest, Upstream
from proxy.coordination.release import GROUP_RESOURCE, RELEASE_CONFIG, ReleaseCommandHandler
from proxy.coordination.service import Held
from translation.classic.messages import ClassicProtocol, ClassicSubscription, JoinGroupRequest
from translation.durable import release_marker
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest
from translation.records import encode_record

from .helpers import TOPIC, TOPIC_ID, coordinate, make_service
from .helpers import joining_heartbeat as _hb


def _unavailable(api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """Every broker request of the carried-over members fails (retried in the background)."""
    return {"error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE), "coordinators": []}


def _owned(member: str, epoch: int, partitions: list[int]) -> ConsumerGroupHeartbeatRequest:
    return ConsumerGroupHeartbeatRequest(group_id="g", member_id=member, member_epoch=epoch,
                                         topic_partitions=[(TOPIC_ID, partitions)])


async def _started(service: Any, nursery: trio.Nursery) -> None:
    await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                        task_status=task_status))


async def test_kip848_members_give_everything_up_before_the_lock_leaves(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(_unavailable, migration_policy="downgrade")
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        assert joined.error_code == 0
        epoch = joined.member_epoch
        await service.heartbeat(_owned("m1", epoch, [0, 1, 2, 3]))
        assert service.start_release("g", "groupgate release") is None
        assert service.releasing("g")
        # the member is told to give its partitions up, at its epoch; the lock stays meanwhile
        told = await service.heartbeat(_owned("m1", epoch, [0, 1, 2, 3]))
        assert told.error_code == 0 and told.member_epoch == epoch and told.assignment == []
        # a new KIP-848 member waits until the hand-back is done
        waiting = await service.heartbeat(_hb("m2", 0))
        assert waiting.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        await trio.sleep(1.0)
        assert membership.leaves == 0 and service.releasing("g")
        await service.heartbeat(_owned("m1", epoch, []))  # it owns nothing now
        await trio.sleep(0.2)
        assert membership.leaves == 1 and "g" not in service.engine.groups
        assert service.released("g")
        # carried over: the same member id and epoch, owning nothing, in the broker's group
        bridge = service.bridges.member("g", "m1")
        assert bridge is not None and bridge.machine.epoch == epoch
        carried = await service.heartbeat(_owned("m1", epoch, []))
        assert carried.error_code == 0 and carried.member_epoch == epoch
        assert not carried.assignment
        nursery.cancel_scope.cancel()


async def test_classic_members_are_told_illegal_generation_and_their_join_waits(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(_unavailable, migration_policy="downgrade")
    membership = coordinate(service, "g")
    subscription = ClassicSubscription(1, [TOPIC])
    join = JoinGroupRequest("g", "", "consumer", [ClassicProtocol("range", subscription)],
                            6000, rebalance_timeout_ms=6000)
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        first = await service.join_group(join)
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
        member_id = first.member_id
        answered = await service.join_group(JoinGroupRequest(
            "g", member_id, "consumer", [ClassicProtocol("range", subscription)], 6000,
            rebalance_timeout_ms=6000))
        assert answered.error_code == 0
        assert service.start_release("g", "groupgate release") is None
        assert service.releases.classic_member("g", member_id, trio.current_time())
        # (the classic handler answers its Heartbeat ILLEGAL_GENERATION); its JoinGroup owning
        # nothing counts as given up, and then the lock leaves
        assert membership.leaves == 0
        service.releases.gave_up("g", member_id, trio.current_time())
        await trio.sleep(0.2)
        assert membership.leaves == 1 and service.released("g")
        assert service.released_member("g", member_id)
        assert not service.takes_join(JoinGroupRequest(
            "g", member_id, "consumer", [ClassicProtocol("range", subscription)], 6000))
        nursery.cancel_scope.cancel()


async def test_the_downgrade_policy_hands_back_when_the_last_kip848_member_leaves(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(_unavailable, migration_policy="downgrade")
    coordinate(service, "g")
    subscription = ClassicSubscription(1, [TOPIC])
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        # the KIP-848 member first (a group of classic members only would refuse it under
        # this policy, as Kafka's does), then a classic one
        joined = await service.heartbeat(_hb("m1", 0))
        assert joined.error_code == 0, joined
        first = await service.join_group(JoinGroupRequest(
            "g", "", "consumer", [ClassicProtocol("range", subscription)], 6000))
        nursery.start_soon(service.join_group, JoinGroupRequest(
            "g", first.member_id, "consumer", [ClassicProtocol("range", subscription)], 6000))
        await trio.sleep(0.1)
        assert service.releases.phase("g", trio.current_time()) is None
        await service.heartbeat(ConsumerGroupHeartbeatRequest(
            group_id="g", member_id="m1", member_epoch=-1))
        assert service.releasing("g"), joined
        nursery.cancel_scope.cancel()


async def test_the_upgrade_policy_refuses_a_release(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(_unavailable)  # migration-policy upgrade, the default
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        await service.heartbeat(_hb("m1", 0))
        why = service.start_release("g", "groupgate release")
        assert why is not None and "downgrade" in why
        assert service.releases.phase("g", trio.current_time()) is None
        assert service.start_release("other", "groupgate release") is not None
        nursery.cancel_scope.cancel()


def _command(group: str, configs: list[str]) -> GroupRequest:
    return GroupRequest(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, 3, "admin", "/127.0.0.1", None, b"", {
        "resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group,
                       "configs": [{"name": c, "config_operation": 0, "value": "true"}
                                   for c in configs]}],
        "validate_only": False})


def _answer(group: str, error: int) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "responses": [
        {"error_code": error, "error_message": "x", "resource_type": GROUP_RESOURCE,
         "resource_name": group}]}


async def test_the_command_is_authorized_by_the_broker_before_anything_is_done(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(_unavailable, migration_policy="downgrade")
    coordinate(service, "g")
    handler = ReleaseCommandHandler(service)
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        await service.heartbeat(_hb("m1", 0))
        # any other config change of the group is the broker's
        assert handler.decide(_command("g", ["consumer.session.timeout.ms"])) is PASS
        outcome = handler.decide(_command("g", [RELEASE_CONFIG]))
        assert isinstance(outcome, Upstream) and outcome.value["validate_only"] is True
        # the broker refuses the caller: nothing happens, the refusal is the answer
        refused = outcome.on_response(_answer("g", int(ErrorCode.GROUP_AUTHORIZATION_FAILED)))
        assert refused["responses"][0]["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert service.releases.phase("g", trio.current_time()) is None
        # the broker authorized it (and refused the config it does not know): released here
        accepted = outcome.on_response(_answer("g", int(ErrorCode.INVALID_CONFIG)))
        assert accepted["responses"][0]["error_code"] == ErrorCode.NONE
        assert service.releasing("g")
        # a sidecar that does not hold the group says so
        other = handler.decide(_command("other", [RELEASE_CONFIG]))
        assert isinstance(other, Upstream)
        answer = other.on_response(_answer("other", int(ErrorCode.INVALID_CONFIG)))
        assert answer["responses"][0]["error_code"] == ErrorCode.NOT_COORDINATOR
        nursery.cancel_scope.cancel()


async def test_members_owning_nothing_are_not_waited_for_and_held_joins_rejoin(
        autojump_clock: trio.testing.MockClock) -> None:
    """A member the engine gave nothing (yet) has nothing to give up; a JoinGroup the engine
    holds when the hand-back starts is answered ILLEGAL_GENERATION (the member gives up what it
    owns and joins again)."""
    service = make_service(_unavailable, migration_policy="downgrade")
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        assert joined.error_code == 0
        service.held_joins[("g", "waiting")] = held = Held()
        assert service.start_release("g", "groupgate release") is None
        assert held.response is not None
        assert held.response.error_code == ErrorCode.ILLEGAL_GENERATION
        # m1 has not reported any partition as its own yet... but the engine assigned it
        # some: it is waited for; once it owns nothing, the lock leaves
        await service.heartbeat(_owned("m1", joined.member_epoch, []))
        await trio.sleep(0.2)
        assert membership.leaves == 1 and service.released("g")
        nursery.cancel_scope.cancel()


async def test_the_downgrade_policy_refuses_new_kip848_members_of_a_handed_back_group(
        autojump_clock: trio.testing.MockClock) -> None:
    """As Kafka's ``downgrade`` policy refuses a consumer-protocol member into a classic group
    (GROUP_ID_NOT_FOUND); the members carried over by the hand-back take part as before."""
    service = make_service(_unavailable, migration_policy="downgrade")
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        assert service.start_release("g", "groupgate release") is None
        await service.heartbeat(_owned("m1", joined.member_epoch, []))
        await trio.sleep(0.2)
        assert service.released("g") and service.bridges.member("g", "m1") is not None
        refused = await service.heartbeat(_hb("m2", 0))
        assert refused.error_code == ErrorCode.GROUP_ID_NOT_FOUND
        assert "downgrade" in (refused.error_message or "")
        assert service.releases.had_consumer("g", "m1", trio.current_time())
        nursery.cancel_scope.cancel()


class _Log:
    def __init__(self, records: list[tuple[bytes, bytes | None]]) -> None:
        self.records = records
        self.loads = 0

    async def load_group(self, group_id: str) -> Any:
        self.loads += 1
        return type("Loaded", (), {"records": self.records})()


async def test_a_release_the_state_log_remembers_is_not_converted_again(
        autojump_clock: trio.testing.MockClock) -> None:
    """A sidecar restarted since the hand-back (nothing in its book) reads the marker the
    holder left in the state log; under ``upgrade`` (the way back) it is ignored."""
    service = make_service(_unavailable, migration_policy="bidirectional")
    marker = encode_record(release_marker("g", "classic", 9, 1000))
    log_ = _Log([marker])
    service.durability = type("D", (), {"log": log_})()  # type: ignore[assignment]
    assert await service.released_durably("g")
    assert service.released("g")  # remembered: not taken over or converted here meanwhile
    assert await service.released_durably("g") and log_.loads == 1  # (read once a minute)
    log_.records = []
    assert not await service.released_durably("other")
    upgrade = make_service(_unavailable, migration_policy="upgrade")
    upgrade.durability = type("D", (), {"log": _Log([marker])})()  # type: ignore[assignment]
    assert not await upgrade.released_durably("g")


def _join(member_id: str, owned: list[int]) -> GroupRequest:
    from proxy.codec import messages

    metadata = messages.encode_data("ConsumerProtocolSubscription", 1, {
        "topics": [TOPIC], "user_data": None,
        "owned_partitions": [{"topic": TOPIC, "partitions": owned}]})
    return GroupRequest(ApiKey.JOIN_GROUP, 5, 3, "c", "/h", None, b"", {
        "group_id": "g", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
        "member_id": member_id, "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "cooperative-sticky", "metadata": metadata}]})


async def test_a_join_still_owning_partitions_during_a_hand_back_is_told_to_give_them_up(
        autojump_clock: trio.testing.MockClock) -> None:
    """A cooperative member that rejoins with its partitions while the group is handed back
    would otherwise sit in its JoinGroup, never hear its Heartbeat's ILLEGAL_GENERATION, and be
    waited for until the bound."""
    from proxy.coordination.classic import JoinGroupHandler
    from proxy.coordination.handler import Answer

    service = make_service(_unavailable, migration_policy="downgrade")
    coordinate(service, "g")
    handler = JoinGroupHandler(service)
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        await service.heartbeat(_hb("m1", 0))
        assert service.start_release("g", "groupgate release") is None
        owning = handler.decide(_join("c1", [0, 1]))
        assert isinstance(owning, Answer) and isinstance(owning.value, dict)
        assert owning.value["error_code"] == ErrorCode.ILLEGAL_GENERATION
        waiting = handler.decide(_join("c1", []))
        assert isinstance(waiting, Answer) and not isinstance(waiting.value, dict)
        answer = await waiting.value  # type: ignore[misc]  # once the hand-back is over
        assert answer["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS
        nursery.cancel_scope.cancel()
