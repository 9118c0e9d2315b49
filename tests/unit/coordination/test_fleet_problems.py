"""A follower that cannot follow the sidecar coordinating its group says so: a WARNING naming
the settings to check (once per case a minute), a counter with bounded labels, and a line in
``/readyz``'s answer that does not fail the probe."""

from __future__ import annotations

import logging
import time
from functools import partial

import pytest
import trio

from proxy import metrics
from proxy.app import Readiness
from proxy.codec.api_keys import ApiKey
from proxy.config import load
from proxy.coordination.fleet import Card, Holder
from proxy.coordination.peers import (
    LOCAL,
    NO_ADDRESS,
    PROBLEM_SECONDS,
    UNREACHABLE,
    ConnectionLinks,
    FleetProblems,
)
from proxy.kafka_client.links import LinkPool
from proxy.security.policy import Security
from proxy.upstream import UpstreamError
from tests.unit.coordination.test_fleet import routes


def _count(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value(
        "groupgate_fleet_unfollowable_total", {"reason": reason}) or 0.0


async def test_a_holder_without_a_fleet_address_is_warned_about_counted_and_reported(
        autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="groupgate.coordination")
    table = routes(set(), {"orders": Holder("sidecar", Card(None, "0.2.0"), "m2")})
    before = _count(NO_ADDRESS)
    for _ in range(3):
        assert table.route(["orders"]).kind == LOCAL  # take over once it is gone
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once, though every request meets it
    assert "orders" in warnings[0].getMessage() and "fleet-listen" in warnings[0].getMessage()
    assert _count(NO_ADDRESS) == before + 3
    (line,) = table.problems.summary()
    assert line.startswith("fleet no-address:") and "orders" in line
    await trio.sleep(PROBLEM_SECONDS + 1)
    assert table.problems.summary() == []  # the case is over
    table.directory._views["orders"] = Holder("sidecar", Card(None, "0.2.0"), "m2")
    table.route(["orders"])
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2  # again


async def test_a_followable_holder_is_no_problem(autojump_clock: trio.abc.Clock) -> None:
    table = routes(set(), {"orders": Holder("sidecar", Card(("10.233.0.3", 9191), "0.2.0"), "m")})
    table.route(["orders"])
    assert table.problems.summary() == []


async def test_a_holder_s_fleet_address_that_does_not_answer_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    security = Security(load(None, {"GROUPGATE_UPSTREAM": "127.0.0.1:9092"}))
    pool = LinkPool(connect_timeout=2, request_timeout=2, max_frame_bytes=1 << 20,
                    security=security)
    with trio.socket.socket() as unused:  # a port nobody listens on
        await unused.bind(("127.0.0.1", 0))
        address = ("127.0.0.1", unused.getsockname()[1])
    problems = FleetProblems()
    links = ConnectionLinks(pool, problems)
    before = _count(UNREACHABLE)
    for _ in range(2):
        with pytest.raises(UpstreamError):
            await links.request(address, ApiKey.JOIN_GROUP, 5, {}, "app", to_peer=True)
    await links.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{address[0]}:{address[1]}" in warnings[0]
    assert "fleet-address" in warnings[0] and "NetworkPolicies" in warnings[0]
    assert _count(UNREACHABLE) == before + 2
    assert [line.split(":")[0] for line in problems.summary()] == ["fleet unreachable"]


async def test_a_holder_that_closes_an_established_link_is_no_settings_problem(
        caplog: pytest.LogCaptureFixture) -> None:
    """A coordinating sidecar that stops (a rollout) closes its fleet connections: the
    follower reached it, so its settings are fine. Before, every rollout logged a WARNING to
    check fleet-address and NetworkPolicies and counted ``unreachable`` (what operators alert
    on) on every follower that had a request on its way."""
    security = Security(load(None, {"GROUPGATE_UPSTREAM": "127.0.0.1:9092"}))
    pool = LinkPool(connect_timeout=2, request_timeout=2, max_frame_bytes=1 << 20,
                    security=security)
    problems = FleetProblems()
    links = ConnectionLinks(pool, problems)
    before = _count(UNREACHABLE)

    async def stopping_holder(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)  # the relayed request, then the holder goes away
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            partial(trio.serve_tcp, stopping_holder, 0, host="127.0.0.1"))
        address = ("127.0.0.1", listener.socket.getsockname()[1])
        with pytest.raises(UpstreamError, match="closed the connection"):
            await links.request(address, ApiKey.JOIN_GROUP, 5, {}, "app", to_peer=True)
        nursery.cancel_scope.cancel()
    await links.aclose()
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert _count(UNREACHABLE) == before
    assert problems.summary() == []


def test_readiness_carries_the_fleet_s_problems_without_failing() -> None:
    readiness = Readiness(lambda: ["fleet no-address: group orders ..."])
    ok, why = readiness.check()
    assert not ok and why.splitlines()[0] == "no upstream contact yet"
    readiness.last_success = time.monotonic()
    ok, why = readiness.check()
    assert ok and why.splitlines() == ["ok", "fleet no-address: group orders ..."]


async def test_readyz_answers_200_with_the_fleet_s_problems_below_ok() -> None:
    from proxy.health import serve_health

    problems = FleetProblems()
    readiness = Readiness(problems.summary)
    readiness.last_success = time.monotonic()
    problems.no_address("orders", Holder("sidecar", Card(None, "0.2.0"), "m2"))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_health, "127.0.0.1", 0, readiness.check)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some(4096):
            answer += chunk
        nursery.cancel_scope.cancel()
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200 OK")
    first, second = body.splitlines()
    assert first == "ok" and second.startswith("fleet no-address: group orders")
