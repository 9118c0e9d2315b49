"""The lease on a group, as the coordinator service keeps it: nothing is done for a group
whose lease ran out (no timer fences a member, no answer gives or confirms an assignment), and
a sidecar the broker does not answer for a whole session tells the group's members to let go
of their partitions, since another sidecar may hand them out by then."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from proxy.coordination.membership import LEASE_FRACTION, BrokerMembership
from proxy.coordination.service import CoordinatorService
from proxy.upstream import UpstreamError
from tests.unit.coordination.test_fuzz_requests import stub_broker
from translation.classic.messages import (
    ClassicProtocol,
    ClassicSubscription,
    HeartbeatRequest,
    JoinGroupRequest,
    SyncGroupRequest,
)
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from .helpers import (
    TOPIC,
    FakeMembership,
    FakePool,
    consumer_heartbeat,
    coordinate,
    exchange,
    make_service,
    request,
    router,
)

COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 15, 25, 27
COORDINATOR_LOAD_IN_PROGRESS = 14
MEMBER_ID_REQUIRED = 79
FOREVER = float("inf")


def _hb(member: str, epoch: int, topics: tuple[str, ...] = (TOPIC,)
        ) -> ConsumerGroupHeartbeatRequest:
    return consumer_heartbeat(
        {"group_id": "g", "member_id": member, "member_epoch": epoch,
         "rebalance_timeout_ms": 10_000 if epoch == 0 else -1,
         "subscribed_topic_names": list(topics) if epoch == 0 else None,
         "topic_partitions": [] if epoch == 0 else None},
        client_id="c", client_host="/h", api_version=1)


def _join(member: str = "", rebalance_ms: int = 4_000) -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id="g", member_id=member, protocol_type="consumer",
        protocols=[ClassicProtocol("range", ClassicSubscription(1, [TOPIC]))],
        session_timeout_ms=10_000, rebalance_timeout_ms=rebalance_ms, api_version=5)


async def _started(service: CoordinatorService, nursery: trio.Nursery) -> None:
    await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                        task_status=task_status))


def _held_again(membership: FakeMembership) -> None:
    """A heartbeat of the membership is answered again: a new lease."""
    membership.lease_deadline = FOREVER
    membership.hold(True)


# -- nothing acts past the lease ----------------------------------------------------------


async def test_a_lease_that_ran_out_suspends_the_group_before_a_timer_can_fence_anyone(
        autojump_clock: trio.testing.MockClock) -> None:
    """The process was frozen (or starved) past its lease: the membership's task has not
    noticed yet when the timer task wakes, and the members' heartbeats could not get through
    meanwhile. None of them is fenced for that."""
    service = make_service()
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        assert joined.error_code == 0
        membership.lease_deadline = trio.current_time() + 1  # nothing answered since
        await trio.sleep(10)  # the member's 6 s session passes: its timer is due
        assert "m1" in service.engine.groups["g"].members
        assert membership.interrupted
        _held_again(membership)
        assert not membership.interrupted
        await trio.sleep(5.9)  # a full session from the moment it is held again
        assert "m1" in service.engine.groups["g"].members
        assert (await service.heartbeat(_hb("m1", joined.member_epoch))).error_code == 0
        await trio.sleep(6.1)
        assert "m1" not in service.engine.groups["g"].members  # the timers run again
        nursery.cancel_scope.cancel()


async def test_a_lease_that_ran_out_in_a_planned_rejoin_is_resumed_once_held_again(
        autojump_clock: trio.testing.MockClock) -> None:
    """A rejoin the proxy chose (new topics) is not an interruption, but a lease running out
    during it is: the group is suspended, and resumed when the rejoin succeeds."""
    service = make_service()
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        joined = await service.heartbeat(_hb("m1", 0))
        membership._planned = True
        membership.hold(False)
        assert not membership.interrupted
        membership.lease_deadline = trio.current_time() + 1
        await trio.sleep(10)
        assert "m1" in service.engine.groups["g"].members
        membership._planned = False
        _held_again(membership)
        assert (await service.heartbeat(_hb("m1", joined.member_epoch))).error_code == 0
        await trio.sleep(6.1)
        assert "m1" not in service.engine.groups["g"].members  # resumed: timers run
        nursery.cancel_scope.cancel()


async def test_a_join_that_waited_past_the_lease_is_not_served(
        autojump_clock: trio.testing.MockClock) -> None:
    """A joining member naming a topic the proxy does not know waits for a metadata refresh;
    the lease runs out meanwhile: the engine must not take the member in, nor answer it."""
    service = make_service()
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        membership.lease_deadline = trio.current_time() + 0.1
        # waits for the refresh half a heartbeat interval (0.25 s), past the lease
        response = await service.heartbeat(_hb("m1", 0, (TOPIC, "new-topic")))
        assert response.error_code == COORDINATOR_NOT_AVAILABLE
        group = service.engine.groups.get("g")
        assert group is None or "m1" not in group.members
        _held_again(membership)
        response = await service.heartbeat(_hb("m1", 0, (TOPIC, "new-topic")))
        assert response.error_code == 0 and response.member_epoch > 0
        nursery.cancel_scope.cancel()


async def test_a_held_join_is_not_answered_with_an_assignment_past_the_lease(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(classic_translation=True)
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        a = (await service.join_group(_join())).member_id
        assert (await service.join_group(_join(a))).error_code == 0
        b = (await service.join_group(_join())).member_id
        answers: list[Any] = []

        async def join_b() -> None:
            answers.append(await service.join_group(_join(b)))

        nursery.start_soon(join_b)
        await trio.sleep(0.01)
        assert ("g", b) in service.held_joins  # its assignment waits for the 1 s batch
        membership.lease_deadline = trio.current_time() + 0.5
        while not answers:
            await trio.sleep(0.1)
        assert answers[0].error_code in (COORDINATOR_NOT_AVAILABLE, REBALANCE_IN_PROGRESS)
        _held_again(membership)
        again = await service.join_group(_join(b))
        while again.error_code == REBALANCE_IN_PROGRESS:  # progress once held again
            again = await service.join_group(_join(b))
        assert again.error_code == 0 and again.member_id == b
        nursery.cancel_scope.cancel()


# -- cut off from the broker --------------------------------------------------------------


class Broker:
    """A broker that answers like a healthy one, or refuses every connection."""

    def __init__(self) -> None:
        self.silent = False

    def answer(self, key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if self.silent:
            raise UpstreamError("connection refused")
        return stub_broker(key, version, value)


def _session_deadline(membership: BrokerMembership) -> float:
    """One broker session after the send time of the last heartbeat (or SyncGroup) the
    broker answered: the lease runs for :data:`LEASE_FRACTION` of it."""
    return (membership.lease_deadline
            + (1 - LEASE_FRACTION) * membership.session_timeout_ms / 1000)


@asynccontextmanager
async def _running(broker: Broker, **settings: Any
                   ) -> AsyncIterator[tuple[CoordinatorService, trio.Nursery]]:
    """A running service in front of ``broker``, and the nursery it runs in."""
    service = make_service(broker.answer, connect_timeout=2, **settings)
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        yield service, nursery
        nursery.cancel_scope.cancel()


async def _lease_ran_out(broker: Broker, membership: BrokerMembership) -> float:
    """2.5 s on, the broker stops answering; returns just after the lease the membership held
    then ran out, with the end of the broker session it ran for."""
    await trio.sleep(2.5)
    broker.silent = True
    lease, session = membership.lease_deadline, _session_deadline(membership)
    await trio.sleep_until(lease + 0.01)
    return session


def _hb_wire(member: str, epoch: int) -> Any:
    return request(68, 0, {"group_id": "g", "member_id": member, "member_epoch": epoch,
                           "instance_id": None, "rack_id": None, "rebalance_timeout_ms": -1,
                           "subscribed_topic_names": None, "server_assignor": None,
                           "topic_partitions": None})


async def test_a_membership_the_broker_does_not_answer_for_a_session_is_cut_off(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    membership = BrokerMembership("g", FakePool(broker.answer), [("b", 1)], connect_timeout=2,
                                  session_timeout_ms=6000)
    lost: list[float] = []
    membership.on_lost = lambda _reason: lost.append(trio.current_time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        await trio.sleep(3)
        broker.silent = True
        session = _session_deadline(membership)
        await trio.sleep_until(session - 0.01)
        assert not lost and membership.interrupted  # stopped acting, still holding on
        await trio.sleep(0.02)
        assert len(lost) == 1 and abs(lost[0] - session) < 1e-6
        assert membership.cut_off and membership.left
        assert not membership.interrupted and membership.lease_expired()
        nursery.cancel_scope.cancel()


async def test_members_behind_a_cut_off_sidecar_are_told_to_let_go_one_session_after(
        autojump_clock: trio.testing.MockClock) -> None:
    """The broker stops answering: the members wait until a whole broker session has passed
    since the last heartbeat it answered was sent (a heartbeat arriving after the lease ran
    out waits for the session's end); from then on another sidecar may hold the group, and
    each member is told to let go (UNKNOWN_MEMBER_ID) on its next request, also when the
    broker answers again before it heard."""
    broker = Broker()
    async with _running(broker) as (service, _):
        epochs = {m: (await service.heartbeat(_hb(m, 0))).member_epoch
                  for m in ("m1", "m2", "m3")}
        assert all(epochs.values())
        membership = service.memberships["g"]
        session = await _lease_ran_out(broker, membership)
        assert set(service.engine.groups["g"].members) == {"m1", "m2", "m3"}
        # within the session's last fifth: each heartbeat waits half an interval, then hears
        # the retriable COORDINATOR_LOAD_IN_PROGRESS (never COORDINATOR_NOT_AVAILABLE: the
        # client keeps its coordinator), until the session's end: told
        answers: list[tuple[float, int]] = []
        while not answers or answers[-1][1] == COORDINATOR_LOAD_IN_PROGRESS:
            answer = await service.heartbeat(_hb("m1", epochs["m1"]))
            answers.append((trio.current_time(), answer.error_code))
        assert answers[-1] == (session, UNKNOWN_MEMBER_ID), answers
        assert len(answers) > 1 and all(t < session for t, _e in answers[:-1])
        assert "g" not in service.engine.groups and "g" not in service.memberships
        # a member behind this sidecar's fleet routing: decided here, not looked up at the
        # broker that cannot be reached
        told = await exchange(router(service, fleet=True), _hb_wire("m2", epochs["m2"]))
        assert told.action == "local" and told.response is not None
        assert told.response["error_code"] == UNKNOWN_MEMBER_ID
        # told, m1 rejoins holding nothing: retriable while the broker cannot be reached
        retried = await service.heartbeat(_hb("m1", 0))
        assert retried.error_code in (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE)
        assert "g" not in service.engine.groups or "m1" not in service.engine.groups["g"].members
        broker.silent = False
        # the broker answers again: the group starts afresh, nothing of the old one resumes
        for _ in range(20):  # retried as a client does while the takeover completes
            rejoined = await service.heartbeat(_hb("m1", 0))
            if rejoined.error_code != COORDINATOR_LOAD_IN_PROGRESS:
                break
        assert rejoined.error_code == 0 and service.memberships["g"] is not membership
        assert set(service.engine.groups["g"].members) == {"m1"}
        # m3 had not heard yet: it is told now
        assert (await service.heartbeat(_hb("m3", epochs["m3"]))).error_code == \
            UNKNOWN_MEMBER_ID
        assert not service.hand_off.lost  # everyone told: nothing kept


async def test_a_sidecar_whose_broker_answers_again_within_the_session_tells_nobody(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with _running(broker) as (service, _):
        epochs = {m: (await service.heartbeat(_hb(m, 0))).member_epoch for m in ("m1", "m2")}
        membership = service.memberships["g"]
        session = await _lease_ran_out(broker, membership)
        assert (await service.heartbeat(_hb("m1", epochs["m1"]))).error_code == \
            COORDINATOR_LOAD_IN_PROGRESS
        broker.silent = False
        await trio.sleep_until(session + 1)
        assert service.memberships["g"] is membership and membership.stable
        assert not membership.cut_off and not service.hand_off.lost
        for member, epoch in epochs.items():
            assert (await service.heartbeat(_hb(member, epoch))).error_code == 0


async def test_a_classic_member_of_a_cut_off_group_is_told_on_any_request(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with _running(broker, classic_translation=True) as (service, _):
        first = await service.join_group(_join())
        assert first.error_code == MEMBER_ID_REQUIRED
        joined = await service.join_group(_join(first.member_id))
        assert joined.error_code == 0
        membership = service.memberships["g"]
        broker.silent = True
        await trio.sleep_until(_session_deadline(membership) + 0.01)
        assert service.serves_classic("g", joined.member_id)
        assert service.takes_join(_join(joined.member_id))
        answer = await service.join_group(_join(joined.member_id))
        assert answer.error_code == UNKNOWN_MEMBER_ID
        assert not service.hand_off.lost


def _heartbeat(member: str, generation: int) -> HeartbeatRequest:
    return HeartbeatRequest(group_id="g", generation_id=generation, member_id=member,
                            api_version=4)


async def _classic_member(service: CoordinatorService) -> tuple[str, int]:
    """A classic member that joined and synced (member id, generation)."""
    first = await service.join_group(_join())
    assert first.error_code == MEMBER_ID_REQUIRED
    joined = await service.join_group(_join(first.member_id))
    assert joined.error_code == 0
    synced = await service.sync_group(SyncGroupRequest(
        group_id="g", generation_id=joined.generation_id, member_id=joined.member_id,
        api_version=3))
    assert synced.error_code == 0
    return joined.member_id, joined.generation_id


async def test_a_classic_heartbeat_after_the_lease_ran_out_waits_and_is_told_to_let_go(
        autojump_clock: trio.testing.MockClock) -> None:
    """The broker stops answering; a classic member's heartbeat arrives after the lease ran
    out, before the session's end. Answered COORDINATOR_NOT_AVAILABLE, a classic client
    (Java, kafka-python) would mark its coordinator dead and send only FindCoordinator, which
    a sidecar cut off from the broker cannot answer: it would never hear that it must let
    go. The heartbeat waits for the session's end instead and is answered UNKNOWN_MEMBER_ID
    then; the member's next requests are routed afresh."""
    broker = Broker()
    async with _running(broker, classic_translation=True) as (service, _):
        member, generation = await _classic_member(service)
        assert (await service.classic_heartbeat(_heartbeat(member, generation))).error_code == 0
        membership = service.memberships["g"]
        session = await _lease_ran_out(broker, membership)
        answer = await service.classic_heartbeat(_heartbeat(member, generation))
        assert (answer.error_code, trio.current_time()) == (UNKNOWN_MEMBER_ID, session)
        assert membership.cut_off and "g" not in service.engine.groups
        assert not service.hand_off.lost  # its only member was told


async def test_a_classic_heartbeat_waiting_after_the_lease_ran_out_is_served_once_held_again(
        autojump_clock: trio.testing.MockClock) -> None:
    """The same, but the broker answers again before the session's end: the waiting
    heartbeat is answered as usual once the group is held again, and nobody is told
    anything."""
    broker = Broker()
    async with _running(broker, classic_translation=True) as (service, nursery):
        member, generation = await _classic_member(service)
        membership = service.memberships["g"]
        session = await _lease_ran_out(broker, membership)
        answers: list[tuple[float, int]] = []

        async def beat() -> None:
            answer = await service.classic_heartbeat(_heartbeat(member, generation))
            answers.append((trio.current_time(), answer.error_code))

        nursery.start_soon(beat)
        await trio.sleep(0.1)
        assert not answers and membership.undecided()
        broker.silent = False
        while not answers:
            await trio.sleep(0.01)
        (t, error), = answers
        assert t < session and error not in (COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID)
        assert membership.stable and not membership.cut_off and not service.hand_off.lost
        assert service.memberships["g"] is membership


def _commit(member: str, generation: int) -> Any:
    return request(8, 8, {
        "group_id": "g", "generation_id_or_member_epoch": generation, "member_id": member,
        "group_instance_id": None, "retention_time_ms": -1,
        "topics": [{"name": TOPIC, "partitions": [{
            "partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
            "committed_metadata": ""}]}]})


async def test_a_commit_waiting_while_the_lease_is_cut_off_is_told_to_let_go(
        autojump_clock: trio.testing.MockClock) -> None:
    """A classic member's commit that waits for the broker membership when the lease is
    cut off is answered UNKNOWN_MEMBER_ID (the member must let go), not a retriable error
    that would leave it owning its partitions."""
    broker = Broker()
    async with _running(broker, classic_translation=True) as (service, _):
        member, generation = await _classic_member(service)
        membership = service.memberships["g"]
        await _lease_ran_out(broker, membership)
        answered = await exchange(router(service), _commit(member, generation))
        assert answered.response is not None, answered
        (topic,) = answered.response["topics"]
        assert [p["error_code"] for p in topic["partitions"]] == [UNKNOWN_MEMBER_ID]
        assert membership.cut_off


async def test_a_relayed_commit_the_broker_never_answers_is_answered_when_the_lease_is_lost(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder is cut off from the broker (nothing comes back: every request to it hangs)
    while a commit relayed by another sidecar is on its way to the broker. The relaying
    sidecar holds the member's later requests (its heartbeats) behind that commit, so it
    must not wait for the broker for ever: once the lease is lost (a whole session after the
    last answered heartbeat was sent), the commit is answered UNKNOWN_MEMBER_ID, and the
    member lets go."""
    broker = Broker()
    service = make_service(broker.answer, connect_timeout=2, classic_translation=True)
    link = service.pool.fake
    answer = link.request
    cut = False

    async def partitioned(api_key: int, version: int, value: dict[str, Any],
                          **kwargs: Any) -> dict[str, Any]:
        if cut:
            await trio.sleep_forever()
        if api_key == 8:  # OffsetCommit: every partition written
            return {"throttle_time_ms": 0, "topics": [
                {"name": t["name"], "partitions": [
                    {"partition_index": p["partition_index"], "error_code": 0}
                    for p in t["partitions"]]} for t in value["topics"]]}
        return await answer(api_key, version, value, **kwargs)

    monkeypatch.setattr(link, "request", partitioned)
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        member, generation = await _classic_member(service)
        relayed = router(service, None, inbound=True)
        written = (await exchange(relayed, _commit(member, generation))).response
        assert written is not None
        assert [p["error_code"] for t in written["topics"] for p in t["partitions"]] == [0]
        membership = service.memberships["g"]
        await trio.sleep(0.5)
        cut = True
        session = _session_deadline(membership)
        with trio.fail_after(60):  # virtual time: the broker's answer never comes
            answered = await exchange(relayed, _commit(member, generation))
        assert answered.response is not None
        (topic,) = answered.response["topics"]
        assert [p["error_code"] for p in topic["partitions"]] == [UNKNOWN_MEMBER_ID]
        assert trio.current_time() == session and membership.cut_off
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def _running_durable(broker: Broker
                           ) -> AsyncIterator[tuple[CoordinatorService, trio.Nursery]]:
    """:func:`_running` with the state log on (a log in memory)."""
    from tests.unit.coordination.test_durability import FakeStateLog, Log

    service = make_service(broker.answer, connect_timeout=2, state_log=True)
    assert service.durability is not None
    service.durability.log = FakeStateLog(Log())  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        await _started(service, nursery)
        await service.durability.started.wait()
        yield service, nursery
        nursery.cancel_scope.cancel()


async def test_members_told_to_let_go_are_not_kept_when_the_sidecar_loads_the_group_again(
        autojump_clock: trio.testing.MockClock) -> None:
    """The lease is cut off and the members are told to let go as they are heard; the broker
    answers again and this sidecar takes the group back, loading it from the state log
    (written before the cut). The members already told are fenced at the load (reason
    ``let-go``), those told later when they are told: each has dropped its partitions and
    rejoins (a classic one under a new member id), so the engine does not keep partitions for
    them until their sessions end. A member not told yet keeps its place meanwhile."""
    broker = Broker()
    async with _running_durable(broker) as (service, _):
        fenced: list[tuple[str, str]] = []
        apply = service.apply

        def watching(effects: Any) -> None:
            fenced.extend((e.member_id, e.reason) for e in effects
                          if type(e).__name__ == "MemberFenced")
            apply(effects)

        service.apply = watching  # type: ignore[method-assign]
        epochs = {m: (await service.heartbeat(_hb(m, 0))).member_epoch
                  for m in ("m1", "m2", "m3")}
        for member in epochs:  # each reconciled to the same group epoch: all in the log
            for _ in range(4):
                answer = await service.heartbeat(_hb(member, epochs[member]))
                epochs[member] = answer.member_epoch
        membership = service.memberships["g"]
        session = await _lease_ran_out(broker, membership)
        await trio.sleep_until(session + 0.01)
        assert membership.cut_off and "g" not in service.engine.groups
        told = await service.heartbeat(_hb("m1", epochs["m1"]))
        assert told.error_code == UNKNOWN_MEMBER_ID
        broker.silent = False
        for _ in range(20):  # m1 rejoins; its heartbeat starts the takeover and the load
            rejoined = await service.heartbeat(_hb("m1", 0))
            if rejoined.error_code != COORDINATOR_LOAD_IN_PROGRESS:
                break
        assert rejoined.error_code == 0 and service.memberships["g"] is not membership
        assert ("m1", "let-go") in fenced, fenced
        group = service.engine.groups["g"]
        assert {"m2", "m3"} <= set(group.members), set(group.members)  # not told yet
        assert group.members["m1"].member_epoch == rejoined.member_epoch  # afresh
        # m2 is told now, and the engine lets it go at once
        assert (await service.heartbeat(_hb("m2", epochs["m2"]))).error_code == \
            UNKNOWN_MEMBER_ID
        assert ("m2", "let-go") in fenced and "m2" not in group.members
        assert "m3" in group.members and ("m3", "let-go") not in fenced
        assert all(reason == "let-go" for _m, reason in fenced), fenced
