"""Heartbeats whose answers the client did not read: the next one goes on with the epoch the
client was given, so a member whose heartbeats queued up behind a slow coordinator is not
fenced (:mod:`proxy.coordination.heartbeat_answers`)."""

from __future__ import annotations

import uuid
from typing import Any

import trio
import trio.testing

from proxy.coordination.heartbeat_answers import MAX_MEMBERS, HeartbeatAnswers
from translation.topics import TopicMetadata, TopicsImage

from .helpers import TOPIC, TOPIC_ID, coordinate, exchange, make_service, request, router

OTHER = "payments"
OTHER_ID = uuid.UUID("1c7a0b5d-2e3f-4a4b-8c9d-0e1f2a3b4c5d")
HEARTBEAT = 68


def _heartbeat(member: str, epoch: int, topic: str = TOPIC,
               owned: list[int] | None = None) -> dict[str, Any]:
    topic_id = TOPIC_ID if topic == TOPIC else OTHER_ID
    return {"group_id": "g", "member_id": member, "member_epoch": epoch,
            "rebalance_timeout_ms": 10_000 if epoch == 0 else -1,
            "subscribed_topic_names": [topic] if epoch == 0 else None,
            "topic_partitions": ([] if owned is None else
                                 [{"topic_id": topic_id, "partitions": owned}])}


class _Forgetful(HeartbeatAnswers):
    """Remembers nothing: every heartbeat goes on with the epoch it carries."""

    def catch_up(self, request: dict[str, Any]) -> int | None:
        return None


async def _queued_heartbeats_of_a_member_while_others_join(catch_up: bool) -> list[int]:
    """Member ``a`` owns the four partitions of its topic; members of another topic join
    one by one, and between joins ``a``'s heartbeats carry the epoch it had before the first
    (their answers are never read, as after client-side timeouts). The error codes of its
    heartbeats, in order."""
    service = make_service()
    service.engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 4),
                                                 TopicMetadata(OTHER_ID, OTHER, 2)]), 0)
    coordinate(service, "g")
    a, others = router(service), router(service)
    if not catch_up:
        a.chain.decoder.answers = _Forgetful()  # type: ignore[attr-defined]
    correlation = iter(range(1, 1000))

    async def send(r: Any, value: dict[str, Any]) -> dict[str, Any]:
        answer = (await exchange(r, request(HEARTBEAT, 1, value, next(correlation)))).response
        assert answer is not None
        return answer

    errors: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        answer = await send(a, _heartbeat("a", 0))
        for _ in range(3):  # to the group's assignment, and reports owning it
            await trio.sleep(1)
            if answer["assignment"] is not None:
                assigned = answer["assignment"]["topic_partitions"][0]["partitions"]
            answer = await send(a, _heartbeat("a", answer["member_epoch"], owned=assigned))
        assert answer["error_code"] == 0 and sorted(assigned) == [0, 1, 2, 3]
        epoch = answer["member_epoch"]
        for other in ("b", "c", "d"):
            await send(others, _heartbeat(other, 0, topic=OTHER))
            await trio.sleep(1)  # the target assignment of the new group epoch is computed
            answer = await send(a, _heartbeat("a", epoch, owned=[0, 1, 2, 3]))
            errors.append(answer["error_code"])
            assert answer["error_code"] or answer["member_epoch"] > epoch
        nursery.cancel_scope.cancel()
    return errors


async def test_a_member_whose_answers_queued_up_is_not_fenced(
        autojump_clock: trio.testing.MockClock) -> None:
    assert await _queued_heartbeats_of_a_member_while_others_join(catch_up=True) == [0, 0, 0]


async def test_without_catching_up_the_same_member_is_fenced(
        autojump_clock: trio.testing.MockClock) -> None:
    """What the sidecar prevents: the third heartbeat's epoch is two behind (FENCED_MEMBER_
    EPOCH, 110)."""
    errors = await _queued_heartbeats_of_a_member_while_others_join(catch_up=False)
    assert errors[:2] == [0, 0] and errors[2] == 110


def test_joins_leaves_errors_and_read_answers_change_nothing() -> None:
    answers = HeartbeatAnswers()
    answers.answered(0, {"member_id": "m", "member_epoch": 0},
                     {"error_code": 0, "member_id": "m", "member_epoch": 5})
    assert answers.catch_up({"member_id": "m", "member_epoch": 0}) is None  # a join again
    answers.answered(5, {"member_id": "m", "member_epoch": 5},
                     {"error_code": 0, "member_id": "m", "member_epoch": 6})
    assert answers.catch_up({"member_id": "m", "member_epoch": 5}) == 6
    assert answers.catch_up({"member_id": "m", "member_epoch": 6}) is None  # it read it
    assert answers.catch_up({"member_id": "m", "member_epoch": -1}) is None  # a leave
    assert answers.catch_up({"member_id": "other", "member_epoch": 5}) is None
    answers.answered(5, {"member_id": "m", "member_epoch": 6},
                     {"error_code": 0, "member_id": "m", "member_epoch": 7})
    assert answers.catch_up({"member_id": "m", "member_epoch": 5}) == 7  # still unread
    answers.answered(5, {"member_id": "m", "member_epoch": 7},
                     {"error_code": 110, "member_id": "m", "member_epoch": 0})
    assert answers.catch_up({"member_id": "m", "member_epoch": 5}) is None  # fenced stays


def test_members_per_connection_are_bounded() -> None:
    answers = HeartbeatAnswers()
    for i in range(MAX_MEMBERS + 5):
        answers.answered(1, {"member_id": f"m{i}", "member_epoch": 1},
                         {"error_code": 0, "member_id": f"m{i}", "member_epoch": 2})
    assert len(answers) == MAX_MEMBERS
    assert answers.catch_up({"member_id": "m0", "member_epoch": 1}) is None
    assert answers.catch_up({"member_id": f"m{MAX_MEMBERS + 4}", "member_epoch": 1}) == 2
