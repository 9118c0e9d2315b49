"""The hand-back in a fleet (``GroupReleasing`` / ``GroupReleased``), two services on trio's
mock clock with FleetControl delivered in process: who is told, what a follower does
meanwhile and after, and when the holder does not hand back at all."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from proxy.coordination import release_fleet
from proxy.coordination.release import ReleasePhase
from proxy.coordination.release_fleet import Relayers
from proxy.coordination.service import CoordinatorService
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from .helpers import TOPIC_ID, coordinate, coordinator_found, make_service
from .helpers import joining_heartbeat as _hb

HOLDER = "10.0.0.1:9094"
FOLLOWER = "10.0.0.2:9094"


def _unavailable(api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    return {"error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE), "coordinators": []}


def _owned(member: str, epoch: int, partitions: list[int]) -> ConsumerGroupHeartbeatRequest:
    return ConsumerGroupHeartbeatRequest(group_id="g", member_id=member, member_epoch=epoch,
                                         topic_partitions=[(TOPIC_ID, partitions)])


def _pair(monkeypatch: pytest.MonkeyPatch, refuse: bool = False
          ) -> tuple[CoordinatorService, CoordinatorService, list[str]]:
    holder = make_service(_unavailable, migration_policy="downgrade",
                          fleet_listen=("0.0.0.0", 9094), fleet_address=("10.0.0.1", 9094))
    follower = make_service(_unavailable, migration_policy="downgrade",
                            fleet_listen=("0.0.0.0", 9094), fleet_address=("10.0.0.2", 9094))
    sent: list[str] = []

    async def send(address: Any, body: dict[str, Any], **_: Any) -> tuple[int, None]:
        assert f"{address[0]}:{address[1]}" == FOLLOWER
        sent.append(body["type"])
        if refuse:
            return int(ErrorCode.REBALANCE_IN_PROGRESS), None
        answer = follower.fleet_release.handlers()[body["type"]](body, f"the sidecar at "
                                                                  f"{HOLDER}")
        assert isinstance(answer, ErrorCode)
        return int(answer), None

    monkeypatch.setattr(release_fleet.fleet_control, "send", send)
    return holder, follower, sent


async def _run(nursery: trio.Nursery, *services: CoordinatorService) -> None:
    for service in services:
        await nursery.start(lambda task_status, s=service: s.run(
            watch_topics=False, task_status=task_status))


async def test_followers_that_relayed_are_told_before_and_after_the_lock_leaves(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    holder, follower, sent = _pair(monkeypatch)
    membership = coordinate(holder, "g")
    async with trio.open_nursery() as nursery:
        await _run(nursery, holder, follower)
        joined = await holder.heartbeat(_hb("m1", 0))  # relayed by the follower
        holder.relayers.note(["g"], FOLLOWER)
        epoch = joined.member_epoch
        await holder.heartbeat(_owned("m1", epoch, [0, 1]))
        assert holder.start_release("g", "groupgate release") is None
        await trio.sleep(0.1)
        assert sent == ["GroupReleasing"]
        # the follower follows the hand-back: it never takes the group, and what it decides
        # itself meanwhile waits
        release = follower.releases.get("g", trio.current_time())
        assert release is not None and release.peer == HOLDER
        assert release.phase is ReleasePhase.RELEASING and "m1" in release.consumers
        waiting = await follower.heartbeat(_hb("m2", 0))
        assert waiting.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert "g" not in follower.memberships
        await holder.heartbeat(_owned("m1", epoch, []))  # gave everything up
        await trio.sleep(0.5)
        assert membership.leaves == 1 and sent == ["GroupReleasing", "GroupReleased"]
        assert follower.released("g")
        # the KIP-848 member behind the follower rejoins there, as a bridged member (the
        # downgrade policy takes it: it was the group's member)
        assert follower.releases.had_consumer("g", "m1", trio.current_time())
        nursery.cancel_scope.cancel()


async def test_a_follower_that_cannot_be_told_keeps_the_group_in_the_engine(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    holder, _follower, sent = _pair(monkeypatch, refuse=True)
    membership = coordinate(holder, "g")
    async with trio.open_nursery() as nursery:
        await _run(nursery, holder)
        joined = await holder.heartbeat(_hb("m1", 0))
        holder.relayers.note(["g"], FOLLOWER)
        assert holder.start_release("g", "groupgate release") is None
        await trio.sleep(0.2)
        assert sent == ["GroupReleasing"]
        assert holder.releases.get("g", trio.current_time()) is None
        assert membership.leaves == 0 and "g" in holder.engine.groups
        again = await holder.heartbeat(_owned("m1", joined.member_epoch, []))
        assert again.error_code == 0 and again.member_epoch >= joined.member_epoch
        nursery.cancel_scope.cancel()


def _emptied(api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """The broker's group after the lock left: Empty, once held by consumers."""
    if api_key == 10:
        return coordinator_found(version, value, "10.0.0.1", 9092)
    if api_key == 15:
        return {"groups": [{"error_code": 0, "group_id": "g", "group_state": "Empty",
                            "protocol_type": "consumer", "protocol_data": "", "members": []}]}
    return _unavailable(api_key, version, value)


async def test_a_follower_never_told_the_outcome_asks_the_broker(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    _holder, follower, _sent = _pair(monkeypatch)
    follower.pool.fake.answer = _emptied  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        await _run(nursery, follower)
        answer = follower.fleet_release.on_releasing(
            {"type": "GroupReleasing", "group": "g", "holder": HOLDER, "to": "classic",
             "bound_ms": 3000, "members": ["c1"], "consumers": []}, "the sidecar")
        assert answer == ErrorCode.NONE and follower.releasing("g")
        # the broker's group no longer shows the holder: it was handed back
        await trio.sleep(3.0 + release_fleet.PEER_SLACK_SECONDS + 1.0)
        assert follower.released("g")
        assert follower.releases.classic_member("g", "c1", trio.current_time())
        # a broker that cannot say: forgotten after a few looks (the follower may take it)
        follower.pool.fake.answer = _unavailable  # type: ignore[attr-defined]
        follower.fleet_release.on_releasing(
            {"type": "GroupReleasing", "group": "h", "holder": HOLDER, "to": "classic",
             "bound_ms": 0, "members": [], "consumers": []}, "the sidecar")
        await trio.sleep(release_fleet.PEER_SLACK_SECONDS + 300.0)
        assert follower.releases.get("h", trio.current_time()) is None
        nursery.cancel_scope.cancel()


async def test_a_release_is_refused_while_a_0_2_0_sidecar_relays_for_the_group(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(_unavailable, migration_policy="downgrade")
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _run(nursery, service)
        await service.heartbeat(_hb("m1", 0))
        service.relayers.note(["g"], "0.2.0@/10.0.0.9")
        why = service.start_release("g", "groupgate release")
        assert why is not None and "/10.0.0.9" in why and "roll them first" in why
        nursery.cancel_scope.cancel()


def test_relayers_are_bounded_and_forgotten_after_a_session(
        autojump_clock: trio.testing.MockClock) -> None:
    async def check() -> None:
        relayers = Relayers(6.0, max_entries=3)
        relayers.note(["g", "h"], FOLLOWER)
        relayers.note(["g"], HOLDER)
        assert relayers.of("g") == [HOLDER, FOLLOWER]
        relayers.note(["x"], FOLLOWER)
        assert len(relayers) == 3  # bounded: the oldest went
        await trio.sleep(7.0)
        assert relayers.of("g") == [] and len(relayers) == 0

    trio.run(check, clock=autojump_clock)


def test_malformed_release_messages_are_invalid_requests() -> None:
    service = make_service(_unavailable)
    handlers = service.fleet_release.handlers()
    assert handlers["GroupReleasing"]({"type": "GroupReleasing"}, "x") == \
        ErrorCode.INVALID_REQUEST
    assert handlers["GroupReleased"]({"type": "GroupReleased", "group": 1}, "x") == \
        ErrorCode.INVALID_REQUEST
    assert handlers["GroupReleasing"]({
        "type": "GroupReleasing", "group": "g", "holder": HOLDER, "to": "elsewhere",
        "bound_ms": 1, "members": [], "consumers": []}, "x") == ErrorCode.INVALID_REQUEST
