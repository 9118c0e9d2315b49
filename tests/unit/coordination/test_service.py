"""The coordinator service's timers and group lifecycle, on trio's mock clock."""

from __future__ import annotations

import trio
import trio.testing

from .helpers import FakeMembership, coordinate, make_service
from .helpers import joining_heartbeat as _hb


async def test_session_timeout_fences_and_empty_group_expires(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(group_empty_expiry_ms=60_000)
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        response = await service.heartbeat(_hb("m1", 0))
        assert response.error_code == 0 and response.heartbeat_interval_ms == 500
        assert service.coordinates("g")
        await trio.sleep(5.9)
        assert "m1" in service.engine.groups["g"].members
        await trio.sleep(0.2)  # past the 6 s session timeout: fenced by the timer task
        assert not service.engine.groups["g"].members
        assert membership.leaves == 0
        await trio.sleep(60.1)  # empty past the expiry delay: deleted, broker group left
        assert "g" not in service.engine.groups and "g" not in service.memberships
        assert membership.leaves == 1
        assert not service.coordinates("g")
        nursery.cancel_scope.cancel()


async def test_failed_takeover_answers_retriably_and_is_retried(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    refused = FakeMembership("g", service.pool)
    refused.failure = "the broker's group g has members connected straight to the broker"
    service.memberships["g"] = refused
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        response = await service.heartbeat(_hb("m1", 0))
        assert response.error_code == 15  # COORDINATOR_NOT_AVAILABLE
        assert "connected straight" in (response.error_message or "")
        assert "g" not in service.memberships and "g" not in service.engine.groups
        coordinate(service, "g")  # the direct members are gone: the next join succeeds
        assert (await service.heartbeat(_hb("m1", 0))).error_code == 0
        nursery.cancel_scope.cancel()


async def test_shutdown_leaves_every_broker_group() -> None:
    service = make_service()
    a, b = coordinate(service, "a"), coordinate(service, "b")
    await service.aclose()
    assert (a.leaves, b.leaves) == (1, 1) and not service.memberships


async def test_heartbeat_for_a_forgotten_group_asks_the_member_to_rejoin(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        response = await service.heartbeat(_hb("m1", 4))  # e.g. after a proxy restart
        assert response.error_code == 25  # UNKNOWN_MEMBER_ID: rejoin with epoch 0
        assert not service.memberships and not service.engine.groups
        nursery.cancel_scope.cancel()


async def test_a_slow_takeover_is_answered_retriably_while_it_continues(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    pending = FakeMembership("g", service.pool)
    pending.settled = trio.Event()  # the broker has not let the proxy in yet
    service.memberships["g"] = pending
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        response = await service.heartbeat(_hb("m1", 0))
        assert response.error_code == 14  # COORDINATOR_LOAD_IN_PROGRESS
        assert service.memberships["g"] is pending and "g" not in service.engine.groups
        pending.settled.set()
        assert (await service.heartbeat(_hb("m1", 0))).error_code == 0
        nursery.cancel_scope.cancel()


async def test_remembered_member_ids_expire_and_stay_bounded(
        autojump_clock: trio.testing.MockClock) -> None:
    """Member ids handed out with MEMBER_ID_REQUIRED come from client requests: a flood of
    them must not grow the proxy's memory, and each is forgotten after ISSUED_ID_SECONDS."""
    from proxy.coordination import service as service_mod

    service = make_service()
    for i in range(service_mod.REMEMBERED_MAX + 5_000):
        service._remember_issued("g", f"m{i}")
    assert len(service._issued_ids) == service_mod.REMEMBERED_MAX
    assert not service._issued("g", "m0")  # the oldest went first
    assert service._issued("g", f"m{service_mod.REMEMBERED_MAX + 4_999}")
    await trio.sleep(service_mod.ISSUED_ID_SECONDS + 0.1)
    assert not service._issued("g", f"m{service_mod.REMEMBERED_MAX + 4_999}")


async def test_while_the_broker_group_is_not_held_members_wait_and_nobody_is_fenced(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    membership = coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        joined = await service.heartbeat(_hb("m1", 0))
        assert joined.error_code == 0
        membership.hold(False)  # e.g. the broker restarted
        response = await service.heartbeat(_hb("m1", joined.member_epoch))
        assert response.error_code == 15  # COORDINATOR_NOT_AVAILABLE: find it again
        await trio.sleep(30)  # five session timeouts without a heartbeat
        assert "m1" in service.engine.groups["g"].members
        membership.hold(True)
        await trio.sleep(5.9)  # a full session timeout from the moment it is held again
        assert "m1" in service.engine.groups["g"].members
        response = await service.heartbeat(_hb("m1", joined.member_epoch))
        assert response.error_code == 0
        await trio.sleep(6.1)
        assert "m1" not in service.engine.groups["g"].members  # timers run again
        nursery.cancel_scope.cancel()


async def test_letting_go_tells_every_member_to_drop_its_partitions(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        epochs = {m: (await service.heartbeat(_hb(m, 0))).member_epoch for m in ("m1", "m2")}
        finished: list[float] = []

        async def let_go() -> None:
            await service.let_go(10.0)
            finished.append(trio.current_time())

        started = trio.current_time()
        nursery.start_soon(let_go)
        await trio.sleep(1)
        assert (await service.heartbeat(_hb("m1", epochs["m1"]))).error_code == 25
        assert not finished  # m2 has not heard yet
        joining = await service.heartbeat(_hb("m3", 0))
        assert joining.error_code == 15  # a new member is told to retry elsewhere
        assert (await service.heartbeat(_hb("m2", epochs["m2"]))).error_code == 25
        await trio.testing.wait_all_tasks_blocked()
        assert finished and finished[0] - started < 2  # did not wait for the bound
        nursery.cancel_scope.cancel()


async def test_letting_go_is_bounded_when_a_member_is_silent(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        await service.heartbeat(_hb("m1", 0))
        started = trio.current_time()
        await service.let_go(4.0)
        assert trio.current_time() - started == 4.0
        nursery.cancel_scope.cancel()


async def test_a_join_that_waited_through_the_start_of_a_stop_is_not_served(
        autojump_clock: trio.testing.MockClock) -> None:
    """A join waiting for the broker's group when the proxy begins to stop must not be given
    partitions by a coordinator that is about to let the group go."""
    service = make_service()
    slow = FakeMembership("g", service.pool)
    slow.settled = trio.Event()  # the broker has not let the proxy in yet
    service.adopt(slow)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        answers: list[int] = []

        async def joining() -> None:
            answers.append((await service.heartbeat(_hb("m1", 0))).error_code)

        nursery.start_soon(joining)  # waits half a heartbeat interval (0.25 s) at most
        await trio.sleep(0.1)
        nursery.start_soon(service.let_go, 5.0)
        await trio.sleep(0.05)
        slow.settled.set()  # the broker lets the proxy in, during the hand-off
        await trio.sleep(1)
        assert answers == [15]  # COORDINATOR_NOT_AVAILABLE: find the next coordinator
        assert not service.engine.groups.get("g") or not service.engine.groups["g"].members
        nursery.cancel_scope.cancel()


async def test_a_heartbeat_waits_half_a_heartbeat_interval_for_a_takeover_at_most(
        autojump_clock: trio.testing.MockClock) -> None:
    """librdkafka times a ConsumerGroupHeartbeat out after one heartbeat interval and then
    backs off reconnecting: a takeover taking longer (the broker waits for a killed sidecar's
    member to time out) is answered with the retriable COORDINATOR_LOAD_IN_PROGRESS after
    half an interval, while the takeover goes on; the retry is served once it is done."""
    service = make_service()  # heartbeat interval 500 ms
    slow = FakeMembership("g", service.pool)
    slow.settled = trio.Event()
    service.adopt(slow)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        start = trio.current_time()
        first = await service.heartbeat(_hb("m1", 0))
        assert first.error_code == 14 and trio.current_time() - start <= 0.25
        assert service.memberships["g"] is slow  # the takeover goes on
        slow.settled.set()
        again = await service.heartbeat(_hb("m1", 0))
        assert again.error_code == 0 and again.assignment is not None
        nursery.cancel_scope.cancel()
