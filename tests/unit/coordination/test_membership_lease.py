"""The proxy's member in the broker's group is its lease on the group: its session timeout is
how soon a dead proxy's hold ends. It asks for ``broker-session-timeout-ms`` (Kafka's minimum,
6 s, by default), doubles it while a broker refuses it, and heartbeats at a third of it."""

from __future__ import annotations

from typing import Any

import trio

from proxy.coordination.fleet import PROTOCOL_NAME, Card, subscription_metadata
from proxy.coordination.membership import BrokerMembership
from tests.unit.coordination.test_fuzz_requests import stub_broker

from .helpers import FakeLink, FakePool

INVALID_SESSION_TIMEOUT = 26
MEMBER_ID_REQUIRED = 79
REBALANCE_IN_PROGRESS = 27


def broker(min_session_ms: int, sent: list[tuple[int, dict[str, Any]]]) -> Any:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        sent.append((key, value))
        if key == 11 and value["session_timeout_ms"] < min_session_ms:
            return {"throttle_time_ms": 0, "error_code": INVALID_SESSION_TIMEOUT,
                    "generation_id": -1, "protocol_type": None, "protocol_name": None,
                    "leader": "", "skip_assignment": False, "member_id": "", "members": []}
        return stub_broker(key, version, value)
    return answer


async def hold(membership: BrokerMembership, seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_the_member_asks_for_the_configured_session_and_heartbeats_at_a_third(
        autojump_clock: trio.abc.Clock) -> None:
    sent: list[tuple[int, dict[str, Any]]] = []
    membership = BrokerMembership("g", FakePool(broker(6000, sent)), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000)
    await hold(membership, 20)
    joins = [v for k, v in sent if k == 11]
    assert [(j["session_timeout_ms"], j["rebalance_timeout_ms"]) for j in joins] == [
        (6000, 6000)]
    assert membership.failure is None and membership.stable
    heartbeats = [v for k, v in sent if k == 12]
    assert 9 <= len(heartbeats) <= 11  # one every 2 s for 20 s


async def test_a_broker_with_a_higher_minimum_gets_the_session_doubled_until_it_accepts(
        autojump_clock: trio.abc.Clock) -> None:
    sent: list[tuple[int, dict[str, Any]]] = []
    membership = BrokerMembership("g", FakePool(broker(30_000, sent)), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000)
    await hold(membership, 1)
    joins = [v["session_timeout_ms"] for k, v in sent if k == 11]
    assert joins == [6000, 12_000, 24_000, 48_000]
    assert membership.failure is None and membership.stable
    assert membership.session_timeout_ms == 48_000


async def test_every_commit_waiting_for_a_rejoin_is_woken_when_it_is_done(
        autojump_clock: trio.abc.Clock) -> None:
    """Commits relayed from several client connections wait at once for a planned rejoin
    (after a takeover, the membership rejoins to advertise the loaded group's topics). Each
    waiter used to put an event of its own in place of the shared one, so only the last to
    arrive was woken and the others waited their whole 15 s (their clients' heartbeats queued
    behind them, and a classic client's own session ran out: seen in a SIGKILL soak)."""
    membership = BrokerMembership("g", FakePool(broker(6000, [])), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000)
    membership._set_stable(False)
    woken: list[tuple[int, bool, float]] = []

    async def commit(n: int) -> None:
        woken.append((n, await membership.wait_stable(15.0), trio.current_time()))

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(commit, n)
        await trio.sleep(1)
        membership._set_stable(True)
    assert sorted(n for n, _, _ in woken) == [0, 1, 2]
    assert all(stable and at < 2 for _, stable, at in woken)


async def test_commits_waiting_for_a_membership_that_ends_are_told_at_once(
        autojump_clock: trio.abc.Clock) -> None:
    membership = BrokerMembership("g", FakePool(broker(6000, [])), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000)
    membership._set_stable(False)
    woken: list[tuple[bool, float]] = []

    async def commit() -> None:
        woken.append((await membership.wait_stable(15.0), trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit)
        nursery.start_soon(commit)
        await trio.sleep(1)
        membership.fail("the task ended")
    assert [stable for stable, _ in woken] == [False, False]
    assert all(at < 2 for _, at in woken)


async def test_requests_waiting_for_a_takeover_are_answered_when_it_is_given_up(
        autojump_clock: trio.abc.Clock) -> None:
    """A sidecar stopping (SIGTERM) while it takes a group over leaves the broker's group
    before its first join was decided. The requests waiting for that takeover (a follower's
    relayed commit ticket or heartbeat) used to wait out their own 10 s takeover wait, their
    clients' heartbeats queued behind them at the follower, which went on relaying to the
    stopping sidecar: a classic member behind it timed its session out although another
    sidecar held the group 6 s before (seen in the 19 s sessions soak, two coordinators
    killed within a broker session, then a third restarted)."""
    membership = BrokerMembership("g", FakePool(broker(6000, [])), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000)
    start = trio.current_time()
    woken: list[tuple[str | None, float]] = []

    async def waiting_for_the_takeover() -> None:
        await membership.settled.wait()
        woken.append((membership.failure_kind, trio.current_time() - start))

    with trio.move_on_after(30):  # the takeover wait of the waiting requests, and more
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting_for_the_takeover)
            nursery.start_soon(waiting_for_the_takeover)
            await trio.sleep(1)
            await membership.leave()
    assert woken == [("unavailable", 1.0), ("unavailable", 1.0)]
    assert not membership.established and membership.failure is not None


async def test_the_lock_assigns_itself_its_card_as_user_data(
        autojump_clock: trio.abc.Clock) -> None:
    """Kafka 4.x will not convert a group whose assignments carry user data, so a direct
    KIP-848 client cannot join a group the engine coordinates (decision record 0018)."""
    from proxy.codec import messages
    from proxy.coordination.fleet import Card

    sent: list[tuple[int, dict[str, Any]]] = []
    card = Card(("10.0.0.5", 9095), "0.3.0")
    membership = BrokerMembership("g", FakePool(broker(6000, sent)), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000, card=card)
    await hold(membership, 1)
    (sync,) = [v for k, v in sent if k == 14]
    (own,) = [a for a in sync["assignments"] if a["member_id"] == membership.member_id]
    _version, decoded = messages.decode_data("ConsumerProtocolAssignment", own["assignment"])
    assert decoded["assigned_partitions"] == [] and Card.decode(decoded["user_data"]) == card


def _racing_broker(sent: list[tuple[int, dict[str, Any]]], held_by: bytes | None) -> Any:
    """A broker whose group another sidecar formed while this one was on its way: the first
    JoinGroup (no member id) asks for one, DescribeGroups shows the group Stable with the
    other sidecar's member (``held_by``: its JoinGroup metadata; None: the group is still
    free)."""
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        sent.append((key, value))
        if key == 11 and not value["member_id"]:
            return {"throttle_time_ms": 0, "error_code": MEMBER_ID_REQUIRED,
                    "generation_id": -1, "protocol_type": None, "protocol_name": None,
                    "leader": "", "skip_assignment": False, "member_id": "pending-1",
                    "members": []}
        if key == 15:
            members = [] if held_by is None else [{
                "member_id": "other-sidecar", "group_instance_id": None,
                "client_id": "groupgate", "client_host": "/10.233.0.2",
                "member_metadata": held_by, "member_assignment": b""}]
            return {"throttle_time_ms": 0, "groups": [{
                "error_code": 0, "group_id": "g",
                "group_state": "Stable" if members else "Empty",
                "protocol_type": "consumer" if members else "",
                "protocol_data": PROTOCOL_NAME if members else "", "members": members,
                "authorized_operations": -2147483648}]}
        return stub_broker(key, version, value)
    return answer


async def test_a_sidecar_that_finds_the_group_held_by_another_before_joining_it_does_not_join(
        autojump_clock: trio.abc.Clock) -> None:
    """Two sidecars whose members asked for a new group at the same moment both looked it up
    free and took it over. The second one's JoinGroup used to land tens of milliseconds after
    the first had formed the group (seen in the fleet soak: 44 ms after the holder's first
    JoinGroup), which made the broker rebalance the holder's group twice (the join, then the
    leave after the lost election), each time at the holder's next heartbeat, up to 2 s
    later. Between the JoinGroup that asks for a member id and the one that joins, it now
    looks at the group: held by another sidecar, it loses the election without joining
    (and leaves its pending member id)."""
    sent: list[tuple[int, dict[str, Any]]] = []
    other = subscription_metadata(["t"], Card(("10.233.0.2", 9191), "0.2.0"))
    membership = BrokerMembership("g", FakePool(_racing_broker(sent, other)), [("b", 1)],
                                  connect_timeout=5, session_timeout_ms=6000,
                                  card=Card(("10.233.0.3", 9191), "0.2.0"))
    await hold(membership, 1)
    assert membership.failure_kind == "lost-election" and not membership.established
    assert [k for k, _v in sent if k in (11, 13, 15)] == [11, 15, 13]  # no second JoinGroup
    assert [v["members"][0]["member_id"] for k, v in sent if k == 13] == ["pending-1"]


async def test_a_sidecar_that_finds_the_group_free_or_held_by_its_former_self_joins_it(
        autojump_clock: trio.abc.Clock) -> None:
    own = Card(("10.233.0.3", 9191), "0.2.0")
    for held_by in (None, subscription_metadata(["t"], own)):
        sent: list[tuple[int, dict[str, Any]]] = []
        membership = BrokerMembership("g", FakePool(_racing_broker(sent, held_by)),
                                      [("b", 1)], connect_timeout=5, session_timeout_ms=6000,
                                      card=own)
        await hold(membership, 1)
        assert membership.failure is None and membership.stable
        assert [k for k, _v in sent if k in (11, 15)] == [11, 15, 11]


async def test_a_group_formed_twice_while_taking_it_over_had_no_holder_before(
        autojump_clock: trio.abc.Clock) -> None:
    """Two sidecars take a new group over at about the same moment: the first joins
    (generation 1), the second's join comes before the first's SyncGroup, which fails with
    REBALANCE_IN_PROGRESS, and the first holds the group at generation 2. Nobody held the
    group before it: its generation before the first join is 0, so no takeover wait (seen in
    the fleet's SIGKILL test: the holder took generation 1 for an earlier coordinator and made
    its members wait 20 s for partitions, so the state log had nothing when it was killed)."""
    sent: list[tuple[int, dict[str, Any]]] = []
    syncs = 0

    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        nonlocal syncs
        sent.append((key, value))
        if key == 11:
            joined = stub_broker(key, version, value)
            return dict(joined, generation_id=1 + syncs)
        if key == 14:
            syncs += 1
            if syncs == 1:
                return {"throttle_time_ms": 0, "error_code": REBALANCE_IN_PROGRESS,
                        "protocol_type": None, "protocol_name": None, "assignment": b""}
        return stub_broker(key, version, value)

    membership = BrokerMembership("g", FakePool(answer), [("b", 1)], connect_timeout=5,
                                  session_timeout_ms=6000)
    await hold(membership, 1)
    assert membership.stable and membership.generation == 2
    assert membership.previous_generation == 0


class _SlowLink(FakeLink):
    """A loaded broker: every request is answered ``delay_s`` after it was sent."""

    def __init__(self, answer: Any, delay_s: float) -> None:
        super().__init__(answer)
        self.delay_s = delay_s

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        await trio.sleep(self.delay_s)
        return await super().request(api_key, version, value, timeout=timeout,
                                     client_id=client_id)


async def test_a_holder_frozen_past_its_lease_but_not_its_session_holds_the_group_again_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    """The sidecar frozen (SIGSTOP) for half a session right before a heartbeat, on a broker
    answering in 0.4 s: on waking its lease has run out (80% of a session after the last
    answered heartbeat was sent) and 0.7 s of the session are left. It stops acting, and the
    heartbeat it sends on waking holds the group again. It used to cancel that heartbeat at
    the lease's end (resetting the connection) and rejoin: FindCoordinator and JoinGroup
    took the rest of the session, so it lost the broker's group, and its members were told
    to let go (seen in the pod test bed's half-session freeze, under load)."""
    sent: list[tuple[int, dict[str, Any]]] = []
    pool = FakePool(broker(6000, sent))
    pool.fake = _SlowLink(pool.fake.answer, 0.4)
    membership = BrokerMembership("g", pool, [("b", 1)], connect_timeout=5,
                                  session_timeout_ms=6000)
    lost: list[str] = []
    interrupted: list[tuple[float, bool]] = []
    membership.on_lost = lost.append
    membership.on_interrupted = lambda now: interrupted.append((trio.current_time(), now))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        await trio.sleep(5)
        joins = len([k for k, _v in sent if k == 11])
        last = membership.lease.last_sent
        await trio.sleep_until(last + 2.3)  # the next heartbeat goes at last + 2.4
        autojump_clock.jump(3.0)  # frozen: no task runs meanwhile
        woke = trio.current_time()
        assert woke > membership.lease_deadline and woke < membership.session_deadline - 0.6
        await trio.sleep(0)
        assert membership.lease_expired() and membership.interrupted  # not acting
        await trio.sleep(1)
        assert not lost and not membership.cut_off and not membership.left
        assert membership.stable and not membership.interrupted
        assert not membership.lease_expired()
        assert len([k for k, _v in sent if k == 11]) == joins  # no rejoin
        assert [now for _t, now in interrupted] == [True, False]
        assert all(woke <= t < woke + 0.5 for t, _now in interrupted), interrupted
        nursery.cancel_scope.cancel()


async def test_a_heartbeat_unanswered_for_a_whole_session_cuts_the_lease_off(
        autojump_clock: trio.testing.MockClock) -> None:
    """A broker that takes the heartbeat but never answers it: the sidecar stops acting at
    the lease's end and loses the group at the session's end, not later."""
    pool = FakePool(broker(6000, []))
    slow = pool.fake = _SlowLink(pool.fake.answer, 0.01)
    membership = BrokerMembership("g", pool, [("b", 1)], connect_timeout=5,
                                  session_timeout_ms=6000)
    lost: list[float] = []
    membership.on_lost = lambda _reason: lost.append(trio.current_time())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        await trio.sleep(3)
        slow.delay_s = 3600
        session = membership.session_deadline
        lease = membership.lease_deadline
        await trio.sleep_until(lease + 0.01)
        assert membership.interrupted and not membership.stable and not lost
        await trio.sleep_until(session + 0.01)
        assert len(lost) == 1 and abs(lost[0] - session) < 1e-6
        assert membership.cut_off and membership.left
        nursery.cancel_scope.cancel()
