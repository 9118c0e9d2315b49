"""The proxy's member in the broker's group is its lease on the group: its session timeout is
how soon a dead proxy's hold ends. It asks for ``broker-session-timeout-ms`` (Kafka's minimum,
6 s, by default), doubles it while a broker refuses it, and heartbeats at a third of it."""

from __future__ import annotations

from typing import Any

import trio

from proxy.coordination.membership import BrokerMembership
from tests.unit.coordination.test_fuzz_requests import stub_broker

from .helpers import FakePool

INVALID_SESSION_TIMEOUT = 26


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
