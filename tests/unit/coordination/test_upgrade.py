"""Upgrade without a stop (:mod:`proxy.coordination.upgrade`), against scripted brokers.

A classic group of the broker whose members are all behind this sidecar moves to the engine:
forwarded joins carry the member mark, the leader's join answer makes the group a candidate,
and a candidate seen Stable on two polls is converted (hold, snapshot, LeaveGroup for every
member back to back with the lock's JoinGroup, adopted by the engine) so that every member's
next Heartbeat, SyncGroup and commit are answered by the engine at the generation it had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from proxy.codec import messages
from proxy.codec.header import parse_request_header
from proxy.connection import Local, Prepare, Rewrite
from proxy.coordination import upgrade
from proxy.coordination.convert import encode_assignment
from proxy.coordination.upgrade import all_marked, member_mark, read_mark
from tests.unit.coordination.test_fuzz_requests import stub_broker
from translation.classic.messages import ClassicAssignment, HeartbeatRequest, SyncGroupRequest
from translation.errors import ErrorCode

from .helpers import TOPIC, FakeLink, exchange, make_service, request, router

GROUP = "orders-app"
GENERATION = 5
A = member_mark("127.0.0.1:9092", "app-a") + "-1b4e28ba-2fa1-11d2-883f-0016d3cca427"
B = member_mark("127.0.0.1:9092", "app-b") + "-6fa459ea-ee8a-3ca4-894e-db77e160355e"
DIRECT = "app-c-1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"
ELSEWHERE = member_mark("10.0.0.9:9095", "app-d") + "-0f8fad5b-d9cb-469f-a165-70867728950e"
OWNED = {A: (0, 1), B: (2, 3)}


def _subscription() -> bytes:
    return messages.encode_data("ConsumerProtocolSubscription", 1,
                                {"topics": [TOPIC], "owned_partitions": []})


def _join(member: str = "", client: str = "app-a") -> dict[str, Any]:
    return {"group_id": GROUP, "session_timeout_ms": 10_000, "rebalance_timeout_ms": 20_000,
            "member_id": member, "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "cooperative-sticky", "metadata": _subscription()}]}


def _join_answer(member: str, leader: str, members: list[str]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "error_code": 0, "generation_id": GENERATION,
            "protocol_type": "consumer", "protocol_name": "cooperative-sticky",
            "leader": leader, "skip_assignment": False, "member_id": member,
            "members": [{"member_id": m, "group_instance_id": None,
                         "metadata": _subscription()} for m in members]
            if member == leader else []}


def _described(members: list[str], state: str = "Stable") -> dict[str, Any]:
    return {"throttle_time_ms": 0, "groups": [{
        "error_code": 0, "group_id": GROUP, "group_state": state,
        "protocol_type": "consumer", "protocol_data": "cooperative-sticky",
        "members": [{"member_id": m, "group_instance_id": None,
                     "client_id": m.rsplit("-", 5)[0], "client_host": "/10.0.0.7",
                     "member_metadata": _subscription(),
                     "member_assignment": encode_assignment(ClassicAssignment(
                         1, ((TOPIC, OWNED.get(m, ())),)))}
                    for m in members],
        "authorized_operations": -2147483648}]}


class Broker(FakeLink):
    """The broker's group of ``members`` (Stable), then whatever the lock does; LeaveGroup
    waits for ``gate`` when one is set."""

    def __init__(self, members: list[str]) -> None:
        super().__init__(self._answer)
        self.members = members
        self.gate: trio.Event | None = None
        self.leaving: list[str] = []

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        if api_key == 13 and self.gate is not None:
            await self.gate.wait()
        return await super().request(api_key, version, value, timeout=timeout,
                                     client_id=client_id)

    def _answer(self, key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == 15:  # DescribeGroups
            return _described(self.members)
        if key == 13 and value["members"] and value["members"][0]["member_id"] != (
                "proxy-member-1"):
            self.leaving = [m["member_id"] for m in value["members"]]
            self.members = []
        return stub_broker(key, version, value)


def _service(broker: Broker | None = None, **settings: Any) -> Any:
    """A sidecar that found the broker's group held by clients (its joins are forwarded);
    the tests poll its candidates themselves."""
    service = make_service(**settings)
    service.upgrades.run = _no_polls
    if broker is not None:
        service.pool.fake = broker
    service._broker_active[GROUP] = True
    return service


async def _forward_join(service: Any, member: str, leader: str, members: list[str]) -> None:
    """A member's JoinGroup through the router, answered by the broker."""
    await exchange(router(service), request(11, 5, _join(member)),
                   lambda k, v, sent: _join_answer(member, leader, members))


async def _no_polls(service: Any) -> None:
    await trio.sleep_forever()


# ---- marks -----------------------------------------------------------------------------------


async def test_a_forwarded_join_carries_the_member_mark_and_its_answer_is_unchanged() -> None:
    service = _service()
    r = router(service)
    info = request(11, 5, _join(), client_id="rdkafka")
    decision = r.decide(info)
    assert isinstance(decision, Rewrite)
    header = parse_request_header(decision.payload)
    assert header.client_id == f"gg3|{service.upgrades.mark_address}|-|rdkafka"
    assert header.correlation_id == info.correlation_id
    sent, _ = messages.decode_request(11, 5, decision.payload, header.header_length)
    assert sent == messages.decode_request(11, 5, info.frame,
                                           parse_request_header(info.frame).header_length)[0]
    answer = _join_answer(A, A, [A])
    done = await exchange(r, request(11, 5, _join(), client_id="rdkafka"),
                          lambda k, v, value: answer)
    assert done.response == dict(answer, protocol_type=None)  # (v7+ carries it)


def test_marks_are_read_back_from_client_ids_and_member_ids() -> None:
    mark = read_mark(A)
    assert mark is not None and mark.address == "127.0.0.1:9092"
    assert mark.kip848_member_id is None and mark.client_id.startswith("app-a-")
    bridged = read_mark(member_mark("10.0.0.2:9095", "app", "kip848-member"))
    assert bridged is not None and bridged.kip848_member_id == "kip848-member"
    assert read_mark(DIRECT) is None
    assert read_mark("groupgate-fleet3|1|h|s|p|a|v|c") is None  # a relay mark, not a member's
    assert all_marked([A, B]) and not all_marked([A, DIRECT]) and not all_marked([])
    assert all_marked([A, B], "127.0.0.1:9092") and not all_marked([A, ELSEWHERE],
                                                                    "127.0.0.1:9092")


async def test_other_protocol_types_are_forwarded_untouched() -> None:
    connect = dict(_join(), protocol_type="connect")
    assert (await exchange(router(_service()), request(11, 5, connect))).action == "forward"


# ---- detection -------------------------------------------------------------------------------


async def test_the_leaders_answer_with_only_marked_members_makes_a_candidate() -> None:
    service = _service()
    await _forward_join(service, B, A, [A, B])  # a follower's answer names nobody
    assert GROUP not in service.upgrades.candidates
    assert (GROUP, B) in service.upgrades.joins
    await _forward_join(service, A, A, [A, B])
    candidate = service.upgrades.candidates[GROUP]
    assert (candidate.generation, candidate.member_ids) == (GENERATION, frozenset({A, B}))
    seen = service.upgrades.joins[(GROUP, A)]
    assert (seen.session_timeout_ms, seen.rebalance_timeout_ms) == (10_000, 20_000)


async def test_a_direct_member_or_the_policy_makes_none_another_sidecars_member_does() -> None:
    service = _service()
    await _forward_join(service, A, A, [A, B])
    await _forward_join(service, A, A, [A, B, DIRECT])  # a direct member joined since
    assert GROUP not in service.upgrades.candidates
    # a member behind another sidecar: a candidate too (the conversion is announced to it)
    await _forward_join(service, A, A, [A, B, ELSEWHERE])
    assert GROUP in service.upgrades.candidates
    assert service.upgrades.peers(service.upgrades.candidates[GROUP]) == ["10.0.0.9:9095"]
    disabled = _service(migration_policy="disabled")
    await _forward_join(disabled, A, A, [A, B])
    assert GROUP not in disabled.upgrades.candidates


async def test_what_detection_remembers_is_bounded_and_expires() -> None:
    upgrades = _service().upgrades
    for cache, most, ttl in ((upgrades.joins, upgrade.JOINS_MAX, upgrade.JOINS_SECONDS),
                             (upgrades.candidates, upgrade.CANDIDATES_MAX,
                              upgrade.CANDIDATE_SECONDS)):
        assert (cache.maxsize, cache.ttl) == (most, ttl)


# ---- conversion ------------------------------------------------------------------------------


@asynccontextmanager
async def _noted(broker: Broker, service: Any = None, joined: tuple[str, ...] = (B, A)
                 ) -> AsyncIterator[tuple[Any, Any, trio.Nursery]]:
    """A running sidecar (``service``, else a new one) in front of ``broker`` whose group became
    a candidate (the ``joined`` members' JoinGroups forwarded, A leading the broker's members)
    and was seen Stable on one poll (noted: the next poll, ``POLL_SECONDS`` on, converts it);
    the service, the candidate and the nursery the service runs in."""
    service = service or _service(broker)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                             task_status=task_status))
        for member in joined:
            await _forward_join(service, member, A, broker.members)
        candidate = service.upgrades.candidates[GROUP]
        await service.upgrades.poll(service, GROUP, candidate)
        yield service, candidate, nursery
        nursery.cancel_scope.cancel()


async def test_a_stable_candidate_moves_to_the_engine_and_nobody_notices(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker([A, B])
    async with _noted(broker) as (service, candidate, _):
        assert service.engine.group(GROUP) is None  # noted only
        await trio.sleep(upgrade.POLL_SECONDS)
        await service.upgrades.poll(service, GROUP, candidate)  # still Stable: converted
        # the members were removed by one LeaveGroup, sent just before the lock's JoinGroup
        keys = [k for k, _, _ in broker.requests]
        leave = keys.index(13)
        assert keys[leave + 1] == 11 and sorted(broker.leaving) == [A, B]
        assert service.coordinates(GROUP)
        group = service.engine.group(GROUP)
        assert group is not None
        for member_id, partitions in OWNED.items():
            member = group.members[member_id]
            assert member.member_epoch == GENERATION
            assert tuple(sorted(p for ps in member.assigned.values() for p in ps)) == partitions
            assert member.session_timeout_ms == 10_000
            assert member.client_id.startswith("app-")  # the application's, not the mark
        # each member's next requests at its generation are answered as if nothing happened
        for member_id, partitions in OWNED.items():
            beat = await service.classic_heartbeat(HeartbeatRequest(
                GROUP, member_id, GENERATION, api_version=4))
            assert beat.error_code == ErrorCode.NONE
            sync = await service.sync_group(SyncGroupRequest(
                GROUP, member_id, GENERATION, api_version=5))
            assert sync.error_code == ErrorCode.NONE and sync.assignment is not None
            assert [(t, tuple(ps)) for t, ps in sync.assignment.partitions] == [
                (TOPIC, partitions)]
        assert GROUP not in service.upgrades.candidates


async def test_bridged_members_not_yet_at_the_generation_are_waited_for_poll_by_poll(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """This sidecar's own bridged members whose clients have not heartbeated at the
    generation yet (they do once a heartbeat interval): no conversion is tried, none aborted
    and put off for ``RETRY_SECONDS``; the first poll after they have converts the group."""
    broker = Broker([A, B])
    async with _noted(broker) as (service, candidate, _):
        behind = ["the client of bridged member x has not heartbeated at epoch 1 yet"]
        monkeypatch.setattr(service.bridges, "unconvertible",
                            lambda group_id, generation: behind[0] if behind else None)
        for _ in range(3):
            await trio.sleep(upgrade.POLL_SECONDS)
            await service.upgrades.poll(service, GROUP, candidate)
            assert service.engine.group(GROUP) is None and broker.leaving == []
            assert candidate.not_before == 0.0  # nothing refused, no retry put off
        behind.clear()
        await trio.sleep(upgrade.POLL_SECONDS)
        await service.upgrades.poll(service, GROUP, candidate)
        assert service.engine.group(GROUP) is not None and sorted(broker.leaving) == [A, B]


async def test_requests_of_the_group_wait_for_the_conversion_and_reach_the_engine(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker([A, B])
    broker.gate = trio.Event()
    async with _noted(broker) as (service, candidate, nursery):
        await trio.sleep(upgrade.POLL_SECONDS)
        nursery.start_soon(service.upgrades.poll, service, GROUP, candidate)
        await trio.testing.wait_all_tasks_blocked()
        assert service.upgrades.converting  # held at the LeaveGroup
        beat = request(12, 4, {"group_id": GROUP, "generation_id": GENERATION,
                               "member_id": A, "group_instance_id": None})
        decision = router(service).decide(beat)
        assert isinstance(decision, Prepare)  # not forwarded to the emptied broker group
        answered: list[Any] = []

        async def settle() -> None:
            answered.append(await decision.decision)

        nursery.start_soon(settle)
        await trio.testing.wait_all_tasks_blocked()
        assert not answered
        broker.gate.set()
        while not answered:
            await trio.sleep(0.01)
        local = answered[0]
        assert isinstance(local, Local)
        payload = local.answer
        if not isinstance(payload, bytes | bytearray | memoryview):
            payload = await payload
        assert isinstance(payload, bytes | bytearray)
        response, _ = messages.decode_response(12, 4, payload, 5)
        assert response["error_code"] == ErrorCode.NONE
        assert 12 not in [k for k, _, value in broker.requests if value.get("member_id") == A]


async def test_a_group_that_changed_since_the_candidate_is_not_converted(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker([A, B])
    async with _noted(broker) as (service, candidate, _):
        broker.members = [A, B, DIRECT]  # a direct client joined
        await trio.sleep(upgrade.POLL_SECONDS)
        await service.upgrades.poll(service, GROUP, candidate)
        assert candidate.stable_since is None
        assert 13 not in [k for k, _, _ in broker.requests]
        assert service.engine.group(GROUP) is None


async def test_a_refused_snapshot_leaves_the_brokers_group_alone(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker([A, B])
    OWNED[B] = (1, 3)  # partition 1 owned twice: the engine refuses the snapshot
    try:
        async with _noted(broker) as (service, candidate, _):
            await trio.sleep(upgrade.POLL_SECONDS)
            await service.upgrades.poll(service, GROUP, candidate)
            assert 13 not in [k for k, _, _ in broker.requests]
            assert service.engine.group(GROUP) is None and not service.claims(GROUP)
            assert candidate.not_before > trio.current_time()  # tried again later
    finally:
        OWNED[B] = (2, 3)


# ---- members behind other sidecars: the announcement ---------------------------------------


class Peers:
    """The other sidecars as FleetControl reaches them: each answers as scripted (an error
    code and a body, or an exception), and every message is recorded."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.told: list[tuple[str, str]] = []

    async def send(self, address: tuple[str, int], body: dict[str, Any], *, security: Any,
                   timeout: float) -> tuple[int, dict[str, Any] | None]:
        self.told.append((f"{address[0]}:{address[1]}", body["type"]))
        answer = self.answers.get(body["type"], (0, None))
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


async def _converted_with_a_peer(peers: Peers) -> tuple[Any, Broker]:
    broker = Broker([A, ELSEWHERE])
    service = _service(broker)
    service.upgrades.send = peers.send
    async with _noted(broker, service, joined=(A,)) as (_, candidate, _):
        await trio.sleep(upgrade.POLL_SECONDS)
        await service.upgrades.poll(service, GROUP, candidate)
    return service, broker


async def test_members_behind_another_sidecar_convert_once_it_holds_their_requests(
        autojump_clock: trio.testing.MockClock) -> None:
    peers = Peers(GroupConverting=(0, {"members": {ELSEWHERE: [7_000, 21_000],
                                                   "someone-else": [1, 1]}}))
    service, broker = await _converted_with_a_peer(peers)
    # told before the broker's group was emptied, and told how it ended
    assert peers.told == [("10.0.0.9:9095", "GroupConverting"),
                          ("10.0.0.9:9095", "GroupConverted")]
    assert sorted(broker.leaving) == sorted([A, ELSEWHERE])
    group = service.engine.group(GROUP)
    assert group is not None and set(group.members) == {A, ELSEWHERE}
    # the other sidecar's member keeps the session its own JoinGroup asked for
    assert group.members[ELSEWHERE].session_timeout_ms == 7_000
    assert group.members[A].session_timeout_ms == 10_000


async def test_a_sidecar_that_refuses_or_cannot_be_reached_aborts_the_conversion(
        autojump_clock: trio.testing.MockClock) -> None:
    from proxy.upstream import UpstreamError

    for answer in ((int(ErrorCode.REBALANCE_IN_PROGRESS), None),
                   UpstreamError("connection refused")):
        peers = Peers(GroupConverting=answer)
        service, broker = await _converted_with_a_peer(peers)
        # told how it ended all the same (an acknowledgement may have been lost)
        assert peers.told == [("10.0.0.9:9095", "GroupConverting"),
                              ("10.0.0.9:9095", "ConversionAborted")]
        assert 13 not in [k for k, _, _ in broker.requests]  # the broker's group untouched
        assert service.engine.group(GROUP) is None and not service.claims(GROUP)
        assert service.upgrades.candidates[GROUP].not_before > trio.current_time()


async def test_a_conversion_aborted_after_the_announcement_is_said_to_those_told(
        autojump_clock: trio.testing.MockClock) -> None:
    peers = Peers()
    OWNED[ELSEWHERE] = (0, 3)  # partition 0 owned twice: the engine refuses the snapshot
    try:
        service, broker = await _converted_with_a_peer(peers)
    finally:
        del OWNED[ELSEWHERE]
    assert peers.told == [("10.0.0.9:9095", "GroupConverting"),
                          ("10.0.0.9:9095", "ConversionAborted")]
    assert 13 not in [k for k, _, _ in broker.requests]
    assert service.engine.group(GROUP) is None


async def _held(service: Any, info: Any) -> bool:
    """Whether the router holds ``info`` (decides it later) rather than passing it on."""
    decision = router(service).decide(info)
    if isinstance(decision, Prepare):
        with trio.move_on_after(0):  # started, and given up at its first wait
            await decision.decision
        return True
    if isinstance(decision, Rewrite) and decision.on_abandon is not None:
        decision.on_abandon()  # passed on (and counted as at the broker): never sent here
    return False


def _control(service: Any, body: dict[str, Any]) -> Any:
    handlers = service.upgrades.control_handlers(service)
    return handlers[body["type"]](body, "the sidecar at /10.0.0.9")


async def test_a_sidecar_told_of_a_conversion_holds_the_groups_requests_until_it_ends(
        autojump_clock: trio.testing.MockClock) -> None:
    service = _service()
    await _forward_join(service, A, B, [A, B])  # its member A; the leader is elsewhere
    # a member session long enough not to bound the hold (test_a_hold_is_bounded_by_...)
    seen = service.upgrades.joins[(GROUP, A)]
    service.upgrades.joins[(GROUP, A)] = dataclasses.replace(seen, session_timeout_ms=60_000)
    forgotten: list[list[str]] = []
    service.routes.forget = forgotten.append
    beat = request(12, 4, {"group_id": GROUP, "generation_id": GENERATION, "member_id": A,
                           "group_instance_id": None})
    converting = {"type": "GroupConverting", "group": GROUP, "generation": GENERATION,
                  "converter": "10.0.0.9:9095", "members": [A, B]}
    converted = {"type": "GroupConverted", "group": GROUP, "converter": "10.0.0.9:9095"}
    assert not await _held(service, beat)
    error, body = await _control(service, converting)
    assert error == ErrorCode.NONE and body == {"members": {A: [60_000, 20_000]}}
    assert await _held(service, beat)
    # only the sidecar that announced it ends it
    assert _control(service, dict(converted, converter="10.0.0.8:9095")) == \
        ErrorCode.INVALID_REQUEST
    assert await _held(service, beat)
    assert _control(service, converted) == ErrorCode.NONE
    assert forgotten == [[GROUP]]  # who holds it is looked up again
    assert not service.upgrades.converting and not await _held(service, beat)

    # an announcement nobody ends: once the hold ran out, the broker's group decides
    outcome: list[bool | None] = [None]

    async def broker_says(_service: Any, _group_id: str) -> bool | None:
        return outcome[0]

    service.upgrades._outcome = broker_says
    assert (await _control(service, converting))[0] == ErrorCode.NONE
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.upgrades.sweep, service)
        await trio.sleep(upgrade.PEER_HOLD_SECONDS + 1)
        assert await _held(service, beat)  # the broker's group is between owners: held
        outcome[0] = True  # the lock holds it: converted
        await trio.sleep(2 * upgrade.SWEEP_SECONDS)
        assert not await _held(service, beat) and forgotten == [[GROUP], [GROUP]]
        # one that never settles is given up after PEER_HOLD_MAX_SECONDS
        outcome[0] = None
        assert (await _control(service, converting))[0] == ErrorCode.NONE
        await trio.sleep(upgrade.PEER_HOLD_MAX_SECONDS + 1)
        assert not await _held(service, beat)
        # its late GroupConverted is still heard
        assert _control(service, converted) == ErrorCode.NONE
        assert forgotten == [[GROUP], [GROUP], [GROUP], [GROUP]]
        nursery.cancel_scope.cancel()
    # malformed, a group this sidecar coordinates, and a policy without upgrades
    assert _control(service, {"type": "GroupConverted"}) == ErrorCode.INVALID_REQUEST
    service._broker_active.pop(GROUP, None)
    service.engine_claims = lambda group_id: True
    assert (await _control(service, converting)) == ErrorCode.REBALANCE_IN_PROGRESS
    disabled = _service(migration_policy="disabled")
    assert (await _control(disabled, converting)) == ErrorCode.GROUP_ID_NOT_FOUND


async def test_a_sidecar_whose_forwarded_requests_are_still_out_refuses(
        autojump_clock: trio.testing.MockClock) -> None:
    service = _service()
    await _forward_join(service, A, B, [A, B])
    release = service.upgrades._track(GROUP)  # a forwarded heartbeat still at the broker
    assert release is not None
    converting = {"type": "GroupConverting", "group": GROUP, "generation": GENERATION,
                  "converter": "10.0.0.9:9095"}
    assert (await _control(service, converting)) == ErrorCode.REBALANCE_IN_PROGRESS
    assert trio.current_time() == upgrade.PEER_DRAIN_SECONDS
    assert not service.upgrades.converting  # not held
    release()
    assert (await _control(service, converting))[0] == ErrorCode.NONE


KIP848 = member_mark("127.0.0.1:9092", "appk", "kip848m1") + "-2c4e28ba-2fa1-11d2-883f-0016d3cca427"
"""A bridged member: the classic member a sidecar runs for KIP-848 client ``kip848m1``."""


async def test_a_bridged_member_is_adopted_under_its_clients_member_id(
        autojump_clock: trio.testing.MockClock) -> None:
    from .helpers import TOPIC_ID, consumer_heartbeat

    broker = Broker([A, KIP848])
    OWNED[KIP848] = (2, 3)
    try:
        async with _noted(broker, joined=(A,)) as (service, candidate, _):
            await trio.sleep(upgrade.POLL_SECONDS)
            await service.upgrades.poll(service, GROUP, candidate)
            assert sorted(broker.leaving) == sorted([A, KIP848])
            group = service.engine.group(GROUP)
            assert group is not None and set(group.members) == {A, "kip848m1"}
            beat = consumer_heartbeat(
                {"group_id": GROUP, "member_id": "kip848m1", "member_epoch": GENERATION,
                 "topic_partitions": [{"topic_id": TOPIC_ID, "partitions": [2, 3]}]},
                client_id="appk", client_host="/10.0.0.7", api_version=1)
            answer = await service.heartbeat(beat)
            assert answer.error_code == ErrorCode.NONE
            assert answer.member_epoch == GENERATION
            assert group.group_epoch == GENERATION  # nothing moved
    finally:
        del OWNED[KIP848]


# ---- the safety net (0018): late broker answers are not passed on ----------------------------


def _beat(member: str = A) -> Any:
    return request(12, 4, {"group_id": GROUP, "generation_id": GENERATION, "member_id": member,
                           "group_instance_id": None})


def _broker_says(code: int) -> Any:
    def answer(key: int, version: int, sent: dict[str, Any]) -> dict[str, Any]:
        if key == 8:
            return {"throttle_time_ms": 0, "topics": [
                {"name": t["name"], "partitions": [
                    {"partition_index": p["partition_index"], "error_code": code}
                    for p in t["partitions"]]} for t in sent["topics"]]}
        return {"throttle_time_ms": 0, "error_code": code}
    return answer


async def test_a_late_answer_is_turned_back_and_the_group_looked_up_again(
        autojump_clock: trio.testing.MockClock) -> None:
    """Around a conversion (here: a hold that ran out without word), a forwarded heartbeat the
    broker answers UNKNOWN_MEMBER_ID (a group the lock may hold now) reaches the client as
    NOT_COORDINATOR, and who holds the group is looked up again; the same member's next such
    answer is the broker's (it was looked at again)."""
    service = _service()
    await _forward_join(service, A, B, [A, B])  # a marked member: the group is forwarded
    forgotten: list[list[str]] = []
    service.routes.forget = forgotten.append
    service.upgrades.control_handlers(service)
    # outside a conversion the broker phase's own answers pass untouched
    plain = await exchange(router(service), _beat(), _broker_says(22))
    assert plain.response is not None
    assert plain.response["error_code"] == ErrorCode.ILLEGAL_GENERATION and forgotten == []
    service.upgrades._unsettled[GROUP] = True  # a hold that ended undecided
    got = await exchange(router(service), _beat(), _broker_says(25))
    assert got.response is not None and got.response["error_code"] == ErrorCode.NOT_COORDINATOR
    assert forgotten == [[GROUP]]
    again = await exchange(router(service), _beat(), _broker_says(25))
    assert again.response is not None
    assert again.response["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
    # another member's, and a commit whose every partition has the error, are turned back too
    other = await exchange(router(service), _beat(B), _broker_says(22))
    assert other.response is not None
    assert other.response["error_code"] == ErrorCode.NOT_COORDINATOR
    commit = request(8, 8, {
        "group_id": GROUP, "generation_id_or_member_epoch": GENERATION,
        "member_id": "commit-member", "group_instance_id": None, "topics": [
            {"name": TOPIC, "partitions": [
                {"partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                 "committed_metadata": ""}]}]})
    committed = await exchange(router(service), commit, _broker_says(25))
    assert committed.response is not None
    assert [p["error_code"] for t in committed.response["topics"] for p in t["partitions"]] \
        == [ErrorCode.NOT_COORDINATOR]
    # a JoinGroup the broker answers UNKNOWN_MEMBER_ID (its member removed by a LeaveGroup)
    joined = await exchange(router(service), request(11, 5, _join("gone-member")),
                            _broker_says(25))
    assert joined.response is not None
    assert joined.response["error_code"] == ErrorCode.NOT_COORDINATOR
    assert len(forgotten) == 4


async def test_a_rebalance_answer_and_a_group_said_not_converted_are_the_brokers(
        autojump_clock: trio.testing.MockClock) -> None:
    """REBALANCE_IN_PROGRESS is the broker's own (a group the lock took answers a removed
    member UNKNOWN_MEMBER_ID first): passed on, around a conversion too. A hold the broker's
    group said was not converted leaves the group the broker's: its answers pass."""
    service = _service()
    await _forward_join(service, A, B, [A, B])
    service.upgrades.control_handlers(service)
    forgotten: list[list[str]] = []
    service.routes.forget = forgotten.append
    service.upgrades._unsettled[GROUP] = True
    got = await exchange(router(service), _beat(), _broker_says(27))
    assert got.response is not None
    assert got.response["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS and not forgotten
    del service.upgrades._unsettled[GROUP]
    outcome: list[bool | None] = [False]  # the broker's group: Stable in its own protocol

    async def broker_says(_service: Any, _group_id: str) -> bool | None:
        return outcome[0]

    service.upgrades._outcome = broker_says
    converting = {"type": "GroupConverting", "group": GROUP, "generation": GENERATION,
                  "converter": "10.0.0.9:9095", "members": [A, B]}
    assert (await _control(service, converting))[0] == ErrorCode.NONE
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.upgrades.sweep, service)
        await trio.sleep(upgrade.PEER_HOLD_SECONDS + 1)
        nursery.cancel_scope.cancel()
    assert not service.upgrades.converting and GROUP not in service.upgrades._unsettled
    forgotten.clear()
    plain = await exchange(router(service), _beat(), _broker_says(25))
    assert plain.response is not None
    assert plain.response["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID and not forgotten


async def test_a_hold_is_bounded_by_half_the_shortest_member_session(
        autojump_clock: trio.testing.MockClock) -> None:
    """A hold that outlived a member's broker session would have the broker remove the held
    member (and form a generation without it while its client still consumes): with 10 s
    sessions a converter that never says how it ended is given up on after 5 s, even with
    the broker's group between owners."""
    service = _service()
    await _forward_join(service, A, B, [A, B])  # A's session: 10 s
    service.routes.forget = lambda groups: None
    assert service.upgrades.hold_bound(GROUP) == 5.0

    async def between_owners(_service: Any, _group_id: str) -> bool | None:
        return None

    service.upgrades._outcome = between_owners
    converting = {"type": "GroupConverting", "group": GROUP, "generation": GENERATION,
                  "converter": "10.0.0.9:9095", "members": [A, B]}
    assert (await _control(service, converting))[0] == ErrorCode.NONE
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.upgrades.sweep, service)
        await trio.sleep(4.5)
        assert await _held(service, _beat())
        await trio.sleep(1.0)
        assert not await _held(service, _beat())
        nursery.cancel_scope.cancel()
    assert GROUP in service.upgrades._unsettled  # undecided: its late answers are turned back


def test_what_the_safety_net_remembers_is_bounded_and_expires() -> None:
    upgrades = upgrade.Upgrades(upgrade.MigrationPolicy.UPGRADE, "127.0.0.1:9092")
    assert upgrades._turned_back.maxsize == upgrade.JOINS_MAX
    assert upgrades._turned_back.ttl == upgrade.SAFETY_NET_SECONDS
