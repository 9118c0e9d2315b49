"""A member whose request waits inside the coordinating sidecar is not fenced for it
(:mod:`proxy.coordination.inside`): a commit waiting for the proxy's broker membership to be
stable again (a planned rejoin), and the member's heartbeats queued behind it on the same
connection, take longer than the member's session; the member keeps its partitions, and its
session runs again, from what it had left, once the commit is answered."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from proxy.codec.api_keys import ApiKey
from tests.unit.coordination.test_lease import _hb, _started

from .helpers import TOPIC, coordinate, exchange, make_service, request, router


def _commit(member: str, epoch: int) -> dict[str, Any]:
    return {"group_id": "g", "generation_id_or_member_epoch": epoch, "member_id": member,
            "group_instance_id": None, "retention_time_ms": -1,
            "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": 0, "committed_offset": 10, "committed_leader_epoch": -1,
                 "committed_metadata": None}]}]}


def _accepted(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "topics": [
        {"name": t["name"], "partitions": [{"partition_index": p["partition_index"],
                                            "error_code": 0} for p in t["partitions"]]}
        for t in value["topics"]]}


async def test_a_commit_waiting_for_a_planned_rejoin_does_not_fence_its_member(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()  # member sessions of 6 s
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        assert joined.error_code == 0 and joined.member_epoch > 0
        await trio.sleep(4)  # 2 s of the member's session left
        membership._planned = True  # the proxy rejoins the broker's group (new topics)
        membership.hold(False)
        answers: list[Any] = []

        async def commit() -> None:
            info = request(ApiKey.OFFSET_COMMIT, 9, _commit("m1", joined.member_epoch))
            answers.append(await exchange(router(service), info, _accepted))

        nursery.start_soon(commit)
        await trio.sleep(10)  # the commit waits 10 s: five times what the session had left
        assert "m1" in service.engine.groups["g"].members
        assert not answers
        membership._planned = False
        membership.hold(True)  # held again: the commit is stamped and answered
        await trio.sleep(0.1)
        assert answers and answers[0].response["topics"][0]["partitions"][0]["error_code"] == 0
        assert answers[0].sent["member_id"] == "proxy-member"
        await trio.sleep(1.8)  # the 2 s it had left, less the 0.1 s above
        assert "m1" in service.engine.groups["g"].members
        await trio.sleep(0.2)
        assert "m1" not in service.engine.groups["g"].members  # its session ran out after all
        nursery.cancel_scope.cancel()


async def test_without_a_wait_the_session_runs_as_before(
        autojump_clock: trio.testing.MockClock) -> None:
    """A commit answered at once does not stop the session: a member that only commits and
    never heartbeats is fenced on time."""
    service = make_service()
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        for _ in range(5):
            await trio.sleep(1)
            info = request(ApiKey.OFFSET_COMMIT, 9, _commit("m1", joined.member_epoch))
            answered = await exchange(router(service), info, _accepted)
            assert answered.response["topics"][0]["partitions"][0]["error_code"] == 0
        await trio.sleep(1.1)
        assert "m1" not in service.engine.groups["g"].members
        assert len(service.engine.groups["g"].held_sessions) == 0
        nursery.cancel_scope.cancel()
