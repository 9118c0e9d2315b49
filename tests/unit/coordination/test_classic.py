"""Classic members through the coordinator service and the router (``classic-translation``):
which classic requests the engine takes, held JoinGroups, failed takeovers, offset commits."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest
import trio
import trio.testing

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from proxy.connection import EXAMINE, FORWARD, Local, RequestInfo, Rewrite
from proxy.coordination import offsets
from proxy.coordination.fleet import Holder
from translation.classic.messages import ClassicProtocol, ClassicSubscription, JoinGroupRequest

from .helpers import TOPIC, FakeMembership, coordinate, exchange, make_service, router

MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE = 79, 27, 15
ILLEGAL_GENERATION = 22


def _join(member: str = "", *, rebalance_ms: int = 10_000, assignor: str = "range",
          protocol_type: str = "consumer") -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id="g", member_id=member, protocol_type=protocol_type,
        protocols=[ClassicProtocol(assignor, ClassicSubscription(1, [TOPIC]))],
        session_timeout_ms=10_000, rebalance_timeout_ms=rebalance_ms, api_version=5)


def _wire(key: int, version: int, value: dict[str, Any]) -> RequestInfo:
    payload = (encode_request_header(key, version, 3, "client-1")
               + messages.encode_request(key, version, value))
    return RequestInfo(key, version, 3, memoryview(payload))


def _join_wire(member: str = "", protocol_type: str = "consumer",
               assignor: str = "range") -> RequestInfo:
    metadata = messages.encode_data("ConsumerProtocolSubscription", 1,
                                    {"topics": [TOPIC], "owned_partitions": []})
    return _wire(11, 5, {"group_id": "g", "session_timeout_ms": 10_000,
                         "rebalance_timeout_ms": 10_000, "member_id": member,
                         "group_instance_id": None, "protocol_type": protocol_type,
                         "protocols": [{"name": assignor, "metadata": metadata}]})


async def _action(service: Any, info: RequestInfo) -> str:
    """What the router does with ``info`` (forward / local / rewrite), without waiting for a
    local answer."""
    r = router(service)
    if r.classify(info) != EXAMINE:
        return "forward"
    decision = r.decide(info)
    if decision == FORWARD or isinstance(decision, Rewrite):
        return "forward"  # a forwarded JoinGroup carries the member mark (a Rewrite)
    assert isinstance(decision, Local)
    if isinstance(decision.answer, Coroutine):
        decision.answer.close()  # never started: the handler's own coroutine is dropped too
    return "answered"


async def _member(service: Any) -> str:
    """A classic member that joined with the id the engine gave it."""
    first = await service.join_group(_join())
    assert first.error_code == MEMBER_ID_REQUIRED
    return str(first.member_id)


async def test_held_join_is_answered_when_the_assignment_timer_fires(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(classic_translation=True)
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        a = await _member(service)
        first = await service.join_group(_join(a))
        assert first.error_code == 0 and first.generation_id == 1 and first.leader == ""
        b = await _member(service)
        answers: list[Any] = []

        async def join_b() -> None:
            answers.append(await service.join_group(_join(b)))

        start = trio.current_time()
        nursery.start_soon(join_b)
        await trio.sleep(0.01)
        assert not answers and ("g", b) in service.held_joins  # the target is being batched
        while not answers:
            await trio.sleep(0.05)
        # completed by the assignment timer (1 s interval), from the timer task's effects
        assert 0.9 <= trio.current_time() - start <= 1.2
        assert answers[0].error_code == 0 and answers[0].member_id == b
        assert answers[0].generation_id == service.engine.groups["g"].members[b].member_epoch
        assert not service.held_joins
        nursery.cancel_scope.cancel()


async def test_held_join_gives_up_at_the_rebalance_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(classic_translation=True)
    coordinate(service, "g")
    # no timer task: nothing completes the held join
    a = await _member(service)
    assert (await service.join_group(_join(a))).error_code == 0
    b = await _member(service)
    start = trio.current_time()
    answer = await service.join_group(_join(b, rebalance_ms=4_000))
    assert answer.error_code == REBALANCE_IN_PROGRESS and answer.member_id == b
    assert 3.9 <= trio.current_time() - start <= 4.1
    assert not service.held_joins


async def test_a_second_join_answers_the_held_one_first(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(classic_translation=True)
    coordinate(service, "g")
    a = await _member(service)
    assert (await service.join_group(_join(a))).error_code == 0
    b = await _member(service)
    answers: list[Any] = []

    async def join_b() -> None:
        answers.append(await service.join_group(_join(b)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(join_b)
        await trio.sleep(0.01)
        nursery.start_soon(join_b)
        await trio.sleep(0.01)
        assert [r.error_code for r in answers] == [REBALANCE_IN_PROGRESS]
        assert ("g", b) in service.held_joins  # the new request is the held one now
        nursery.cancel_scope.cancel()


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_failed_takeover_sends_the_next_joins_to_the_broker(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(classic_translation=True)
    refused = FakeMembership("g", service.pool)
    refused.failure = "the broker's group g has members connected straight to the broker"
    refused.failure_kind = "refused"
    service.memberships["g"] = refused
    assert await _action(service, _join_wire()) == "answered"
    answer = await service.join_group(_join())
    assert answer.error_code == COORDINATOR_NOT_AVAILABLE
    assert service.broker_group_active("g") and "g" not in service.engine.groups
    # the client retries: the broker's group
    assert await _action(service, _join_wire()) == "forward"
    await trio.sleep(10.1)
    assert not service.broker_group_active("g")
    # tried again once the memory is gone
    assert await _action(service, _join_wire()) == "answered"


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
@pytest.mark.parametrize("kind", ["lost-election", "unavailable"])
async def test_a_takeover_lost_to_another_member_never_sends_joins_to_the_broker(
        kind: str, autojump_clock: trio.testing.MockClock) -> None:
    """Two sidecars joined the free broker group at once and the other leads it (or the
    broker could not be asked): the client retries, and its next JoinGroup is looked up and
    relayed, or tried here again; passed to the broker, it would join the broker's group as a
    member of a second coordinator, next to the sidecar that holds it."""
    service = make_service(classic_translation=True)
    lost = FakeMembership("g", service.pool)
    lost.failure = "another sidecar holds the broker's group g"
    lost.failure_kind = kind
    service.memberships["g"] = lost
    answer = await service.join_group(_join())
    assert answer.error_code == COORDINATOR_NOT_AVAILABLE
    assert not service.broker_group_active("g") and "g" not in service.memberships
    assert await _action(service, _join_wire()) == "answered"


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_a_group_the_broker_s_own_members_hold_sends_joins_to_the_broker() -> None:
    """The directory saw clients connected straight to the broker holding the group (members
    of another protocol): joins go to the broker, without the proxy joining (and so
    disturbing) their group first."""
    service = make_service(classic_translation=True)
    service.directory._views["g"] = Holder("broker")
    assert service.broker_group_active("g")
    assert await _action(service, _join_wire()) == "forward"


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited")
async def test_which_classic_requests_the_engine_takes() -> None:
    off = make_service(classic_translation=False)
    assert await _action(off, _join_wire()) == "forward"
    service = make_service(classic_translation=True)
    assert await _action(service, _join_wire()) == "answered"
    assert await _action(service, _join_wire(protocol_type="connect")) == "forward"
    assert await _action(service, _join_wire(assignor="stream")) == "forward"
    # a member id the engine never handed out: a member of the broker's own group
    assert await _action(service, _join_wire("broker-member-1")) == "forward"
    heartbeat = {"group_id": "g", "generation_id": 1, "member_id": "m",
                 "group_instance_id": None}
    # not the engine's group
    assert await _action(service, _wire(12, 3, heartbeat)) == "forward"
    coordinate(service, "g")
    assert await _action(service, _wire(12, 3, heartbeat)) == "answered"
    assert await _action(service, _join_wire("broker-member-1")) == "answered"
    sync = {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None,
            "assignments": []}
    assert await _action(service, _wire(14, 3, sync)) == "answered"
    leave = {"group_id": "g", "members": [{"member_id": "m", "group_instance_id": None}]}
    assert await _action(service, _wire(13, 3, leave)) == "answered"


async def test_router_answers_classic_requests_on_the_wire() -> None:
    service = make_service(classic_translation=True)
    coordinate(service, "g")
    r = router(service)

    async def ask(request: RequestInfo) -> dict[str, Any]:
        result = await exchange(r, request)
        assert result.action == "local" and result.response is not None
        return result.response

    first = await ask(_join_wire())
    assert first["error_code"] == MEMBER_ID_REQUIRED
    member = first["member_id"]
    joined = await ask(_join_wire(member))
    assert joined["error_code"] == 0 and joined["leader"] == "" and joined["members"] == []
    synced = await ask(_wire(14, 3, {"group_id": "g", "generation_id": joined["generation_id"],
                                     "member_id": member, "group_instance_id": None,
                                     "assignments": []}))
    assert synced["error_code"] == 0
    _, assignment = messages.decode_data("ConsumerProtocolAssignment",
                                         memoryview(synced["assignment"]))
    assert [(t["topic"], sorted(t["partitions"])) for t in assignment["assigned_partitions"]] \
        == [(TOPIC, [0, 1, 2, 3])]
    beat = await ask(_wire(12, 3, {"group_id": "g", "generation_id": joined["generation_id"],
                                   "member_id": member, "group_instance_id": None}))
    assert beat["error_code"] == 0
    left = await ask(_wire(13, 3, {"group_id": "g", "members": [
        {"member_id": member, "group_instance_id": None}]}))
    assert left["error_code"] == 0 and left["members"][0]["error_code"] == 0
    assert not service.engine.groups["g"].members


async def test_classic_commit_is_checked_against_the_member_epoch() -> None:
    service = make_service(classic_translation=True)
    membership = coordinate(service, "g")
    first = await service.join_group(_join())
    member = first.member_id
    joined = await service.join_group(_join(member))
    commit = {"group_id": "g", "member_id": member, "group_instance_id": None,
              "generation_id_or_member_epoch": joined.generation_id + 1,
              "topics": [{"name": TOPIC, "partitions": [
                  {"partition_index": 0, "committed_offset": 5, "committed_metadata": ""}]}]}
    stale = await exchange(router(service), _wire(8, 7, commit))
    assert stale.response is not None
    assert stale.response["topics"][0]["partitions"][0]["error_code"] == ILLEGAL_GENERATION

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return offsets.commit_error(value, 0)

    ok = await exchange(router(service), _wire(
        8, 7, dict(commit, generation_id_or_member_epoch=joined.generation_id)), broker)
    assert ok.response is not None and ok.sent is not None
    assert ok.response["topics"][0]["partitions"][0]["error_code"] == 0
    # written under the proxy's own membership in the broker's group
    assert ok.sent["member_id"] == membership.member_id
    assert ok.sent["generation_id_or_member_epoch"] == membership.generation


async def test_a_classic_session_a_failover_outlasts_is_logged_with_a_fleet(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    """A classic member brings its own session: with a fleet, one shorter than
    broker-session-timeout-ms + the takeover + the follower wait (+ margin: 17 s with the
    6 s default) is accepted as Kafka accepts it and logged once for the group, naming the
    client's session.timeout.ms; a long enough one, or no fleet, is not."""
    caplog.set_level("WARNING", logger="groupgate.coordination")
    for fleet, session_ms, logged in ((("10.0.0.5", 9191), 10_000, True),
                                      (("10.0.0.5", 9191), 17_000, False),
                                      (None, 10_000, False)):
        caplog.clear()
        service = make_service(classic_translation=True, fleet_listen=fleet)
        coordinate(service, "g")
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status, s=service: s.run(
                watch_topics=False, task_status=task_status))
            for _ in range(2):
                first = await service.join_group(JoinGroupRequest(
                    group_id="g", member_id="", protocol_type="consumer",
                    protocols=[ClassicProtocol("range", ClassicSubscription(1, [TOPIC]))],
                    session_timeout_ms=session_ms, rebalance_timeout_ms=10_000,
                    api_version=5))
                assert first.error_code == MEMBER_ID_REQUIRED  # accepted, as Kafka would
            nursery.cancel_scope.cancel()
        notes = [r.getMessage() for r in caplog.records
                 if "session.timeout.ms=" in r.getMessage()]
        assert len(notes) == (1 if logged else 0), (fleet, session_ms, notes)
        if logged:
            assert "session.timeout.ms=10000" in notes[0] and "17000 ms" in notes[0]


async def test_a_failed_takeover_nobody_waits_for_is_dropped(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover lost to another sidecar after whoever started it stopped waiting (a
    heartbeat waits half an interval, a client may close its connection): the failed
    membership used to stay until the group's next join, claiming the group, so that every
    classic heartbeat and commit of it was answered COORDINATOR_NOT_AVAILABLE here instead of
    being looked up and relayed to the holder (a librdkafka member gave its partitions up
    after 19 s of that in a soak run). Dropped when it fails, the group is looked up again."""
    from proxy.coordination import service as service_module
    from proxy.coordination.membership import BrokerMembership

    class LostLater(BrokerMembership):
        async def run(self) -> None:
            await trio.sleep(1)
            self.failure = "another sidecar holds the broker's group g"
            self.failure_kind = "lost-election"
            self.settled.set()

    monkeypatch.setattr(service_module, "BrokerMembership", LostLater)
    service = make_service(classic_translation=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        service.directory._views["g"] = Holder("free")
        with trio.move_on_after(0.5):
            await service._take_over("g", [TOPIC])
        assert service.claims("g")  # being taken over
        await trio.sleep(1)
        assert not service.claims("g") and "g" not in service.memberships
        assert service.directory.view("g") is None  # looked up again on the next request
        heartbeat = {"group_id": "g", "generation_id": 3, "member_id": "m",
                     "group_instance_id": None}
        assert await _action(service, _wire(12, 3, heartbeat)) == "forward"
        nursery.cancel_scope.cancel()
