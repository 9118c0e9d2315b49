"""``dev/bench routing``: what the per-API routing costs per request, in process.

Times the coordinating router the way a connection drives it (``classify``, then ``decide``
for the APIs it examines), with no socket and no broker: a forwarded Produce (classified only),
an OffsetCommit and a classic Heartbeat of a group the proxy does not coordinate (decoded,
handed to their handler, passed to the broker), a ListGroups (decoded, its handler rewrites
it), a ConsumerGroupHeartbeat (decoded, answered by the engine) without and with the
authorization stage (the client's rights already known on the connection: what a member's
heartbeat costs within ``authorization-ttl-ms``; the broker's answer when it is not known is
one round trip on the client's connection, measured by ``dev/bench passthrough``'s ``rtt``
figures), an OffsetCommit of a coordinated group (validated by the engine, checked for stale
retries, stamped, the broker's answer mapped back), a ConsumerGroupHeartbeat of a group another
sidecar holds (relayed: the fleet route and the relay's start, not the peer's answer) and one
arriving from another sidecar on the fleet listener, the construction of a router (once per
client connection), and a member's steady ConsumerGroupHeartbeat answered by the coordinator
service itself (its request funnel, the engine, the write barrier's and the lease's checks; no
state log), which the router's cases leave out. A member's steady heartbeat behind a follower
is also timed end to end, both sidecars' routers with the link between them played by a
function call (no socket): relayed as a ConsumerGroupHeartbeat request, and inside
``FleetControl`` (decision record 0019: the way that lets the holder ask for the member's
rights; the steady heartbeat asks nothing). Prints microseconds per call, wall-clock and CPU
time of this process, median of ``--repeat`` runs; ``--json`` writes them with the machine
and its load average.
``--calls`` also counts each case's Python function calls (cProfile), which the load of a shared
machine does not move.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import trio
import trio.testing

from proxy.codec import messages
from proxy.codec.header import encode_request_header, response_header_for
from proxy.commands import machine
from proxy.connection import Local, RequestInfo, Rewrite
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.fleet import Card, Holder, mark_forwarded
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import body_offset, parse_table
from proxy.security.rights import DESCRIBE, READ, Rights
from proxy.security.session import Session
from tests.unit.coordination.helpers import (
    TOPIC,
    consumer_heartbeat,
    coordinate,
    joining_heartbeat,
    make_service,
    request,
    router,
)

PEER = ("10.233.0.3", 9191)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--json", metavar="FILE", type=Path)
    parser.add_argument("--calls", action="store_true",
                        help="also count the Python function calls of each case (cProfile, "
                             "100 calls): a figure the machine's load does not move")


def cases() -> dict[str, Callable[[], object]]:
    service = make_service()
    r = router(service)
    produce = request(0, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 1000,
                             "topic_data": []})
    commit = request(8, 9, {"group_id": "broker-group", "generation_id_or_member_epoch": 3,
                            "member_id": "m", "group_instance_id": None, "topics": [
                                {"name": "orders", "partitions": [
                                    {"partition_index": 0, "committed_offset": 42,
                                     "committed_leader_epoch": -1,
                                     "committed_metadata": None}]}]})
    heartbeat = request(12, 4, {"group_id": "broker-group", "generation_id": 3,
                                "member_id": "m", "group_instance_id": None})
    listing = request(16, 4, {"states_filter": []})
    beat = request(68, 0, {"group_id": "kip848", "member_id": "m", "member_epoch": 3,
                           "rebalance_timeout_ms": -1, "subscribed_topic_names": None,
                           "topic_partitions": None})
    # the facts a member's heartbeats need, already known on the connection
    rights = Rights(None, ttl=1e9, timer=time.monotonic)
    rights.note({("group", "kip848", READ): True, ("topic", "orders", DESCRIBE): True})
    authorized = CoordinatingRouter(
        DictAddressMap({}), RequestCounters("test"), parse_table(), handler_table(service), 1,
        "/10.0.0.7", claims=service.claims, session=Session("test"),
        authorization=AuthorizationStage(rights, service))

    def answered(on: Any, info: Any) -> Callable[[], object]:
        def call() -> object:
            on.classify(info)
            decision = on.decide(info)
            assert isinstance(decision, Local)
            decision.answer.close()  # type: ignore[union-attr]  # the engine's part: not timed
            return decision
        return call

    def routed(info: Any) -> Callable[[], object]:
        def call() -> object:
            r.classify(info)
            return r.decide(info)
        return call

    # a group this sidecar coordinates, with one member; one another sidecar holds
    fleet_service = make_service()
    coordinate(fleet_service, "g")
    joined, _ = fleet_service.engine.heartbeat(consumer_heartbeat(
        {"group_id": "g", "member_id": "m1", "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1), 0)
    fleet_service.directory._views["held-elsewhere"] = Holder("sidecar", Card(PEER, "0.3.0"),
                                                              "m9")
    member = router(fleet_service)
    follower = router(fleet_service, fleet=True)
    inbound = router(fleet_service, inbound=True)
    coordinated = request(8, 9, {"group_id": "g", "member_id": "m1",
                                 "generation_id_or_member_epoch": joined.member_epoch,
                                 "group_instance_id": None, "topics": [
                                     {"name": TOPIC, "partitions": [
                                         {"partition_index": 0, "committed_offset": 42,
                                          "committed_leader_epoch": -1,
                                          "committed_metadata": None}]}]})
    broker_answer = memoryview(
        response_header_for(8, 9, coordinated.correlation_id)
        + messages.encode_response(8, 9, {"throttle_time_ms": 0, "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": 0, "error_code": 0}]}]}))
    relayed = request(68, 0, {"group_id": "held-elsewhere", "member_id": "m",
                              "member_epoch": 3, "rebalance_timeout_ms": -1,
                              "subscribed_topic_names": None, "topic_partitions": None})
    # (a member the engine does not know: never held inside, as the answer is not awaited)
    from_peer = request(68, 0, {"group_id": "g", "member_id": "m", "member_epoch": 3,
                                "rebalance_timeout_ms": -1, "subscribed_topic_names": None,
                                "topic_partitions": None},
                        client_id=mark_forwarded("app", "/10.233.0.9", 1))

    def committed() -> object:
        member.classify(coordinated)
        decision = member.decide(coordinated)
        assert isinstance(decision, Rewrite)
        return decision.on_response(broker_answer)

    return {
        "forwarded Produce (classify)": lambda: r.classify(produce),
        "OffsetCommit of a broker group (classify + decide)": routed(commit),
        "classic Heartbeat of a broker group (classify + decide)": routed(heartbeat),
        "ListGroups (classify + decide, rewritten)": routed(listing),
        "ConsumerGroupHeartbeat (classify + decide)": answered(r, beat),
        "ConsumerGroupHeartbeat, authorized, rights known": answered(authorized, beat),
        "OffsetCommit of a coordinated group (classify + decide + answer)": committed,
        "ConsumerGroupHeartbeat relayed to the holder (classify + decide)": answered(
            follower, relayed),
        "ConsumerGroupHeartbeat from another sidecar (classify + decide)": answered(
            inbound, from_peer),
        "router for a new connection": lambda: router(service),
    }


class _HolderLink:
    """The follower's link to the holder's fleet listener, as function calls into the
    holder's fleet-listener routers."""

    def __init__(self, holder: Any) -> None:
        from proxy.coordination.fleet_control import FleetControlRouter

        self.inbound = router(holder, None, inbound=True)
        self.fleet = FleetControlRouter(router(holder, None, inbound=True), {},
                                        Session("fleet", fleet_peer=True), "follower")

    @staticmethod
    async def _answer(on: Any, info: RequestInfo) -> bytes:
        on.classify(info)
        decision = on.decide(info)
        assert isinstance(decision, Local)
        answer = decision.answer
        if not isinstance(answer, bytes | bytearray | memoryview):
            answer = await answer
        assert isinstance(answer, bytes | bytearray | memoryview)
        return bytes(answer)

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        payload = (encode_request_header(api_key, version, 3, client_id)
                   + messages.encode_request(api_key, version, value))
        answer = memoryview(await self._answer(self.inbound, RequestInfo(
            api_key, version, 3, memoryview(payload))))
        start = body_offset(answer, messages.response_header_version(api_key, version))
        return messages.decode_response(api_key, version, answer, start)[0]

    async def exchange_raw(self, api_key: int, version: int, body: bytes, *,
                           timeout: float | None = None) -> bytes:
        payload = encode_request_header(api_key, version, 3, "f", flexible=False) + body
        answer = await self._answer(self.fleet, RequestInfo(api_key, version, 3,
                                                            memoryview(payload)))
        return answer[4:]

    async def aclose(self) -> None:
        return None


def relayed_cases() -> dict[str, Callable[[int], Awaitable[float]]]:
    """A member's steady ConsumerGroupHeartbeat behind a follower, through both sidecars'
    routers in process: seconds for ``number`` of them (set up first, not timed)."""
    from proxy.coordination import tickets

    plain = hasattr(tickets.Tickets, "relay_heartbeats")  # else: relayed as a request only

    def case(enveloped: bool) -> Callable[[int], Awaitable[float]]:
        async def beats(number: int) -> float:
            holder, follower = make_service(), make_service()
            coordinate(holder, "g")
            address = ("10.0.0.9", 9095)
            follower.directory._views["g"] = Holder("sidecar", Card(address, "0.3.0"),
                                                    "lock-member")
            link = _HolderLink(holder)
            follower.pool.peer = lambda _address, _timeout: link  # type: ignore[method-assign]
            if plain and not enveloped:
                follower.tickets.relay_heartbeats(address)
            on = router(follower, fleet=True)
            joined = await link.request(68, 0, {
                "group_id": "g", "member_id": str(uuid.uuid4()), "member_epoch": 0,
                "rebalance_timeout_ms": 30_000, "subscribed_topic_names": ["orders"],
                "topic_partitions": []}, client_id=mark_forwarded("app", "/h"))
            assert joined["error_code"] == 0, joined
            beat = request(68, 0, {"group_id": "g", "member_id": joined["member_id"],
                                   "member_epoch": joined["member_epoch"],
                                   "rebalance_timeout_ms": -1,
                                   "subscribed_topic_names": None, "topic_partitions": None})

            async def once() -> None:
                on.classify(beat)
                decision = on.decide(beat)
                assert isinstance(decision, Local)
                answer = decision.answer
                assert not isinstance(answer, bytes | bytearray | memoryview)
                await answer

            for _ in range(10):  # warm up
                await once()
            start = time.perf_counter()
            for _ in range(number):
                await once()
            return time.perf_counter() - start
        return beats

    out = {"ConsumerGroupHeartbeat behind a follower, relayed (both sidecars)": case(False)}
    if plain:
        out["ConsumerGroupHeartbeat behind a follower, in FleetControl (both sidecars)"] = (
            case(True))
    return out


def run(args: argparse.Namespace) -> int:
    # trio's clock stands still (a MockClock at rate 0): the fleet's views of who holds a
    # group never expire while the cases are timed
    wall, cpu = trio.run(_measure, args, clock=trio.testing.MockClock())
    out: dict[str, Any] = {"benchmark": "routing", "machine": machine.machine_info(),
                           "us_per_call": wall, "cpu_us_per_call": cpu, "number": args.number,
                           "repeat": args.repeat, "load_average": os.getloadavg()}
    if args.calls:
        out["python_calls_per_call"] = trio.run(_count_calls, clock=trio.testing.MockClock())
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _driven(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a service call that never waits to its end, without the event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("the service call waited")


async def service_case() -> Callable[[], object]:
    """A member's steady heartbeat answered by the service (its request funnel, the engine and
    the answer's checks): the part the router's cases leave out."""
    service = make_service()
    coordinate(service, "g")
    member = str(uuid.uuid4())
    joined = await service.heartbeat(joining_heartbeat(member, 0))
    beat = joining_heartbeat(member, joined.member_epoch)
    assert _driven(service.heartbeat(beat)).error_code == 0
    return lambda: _driven(service.heartbeat(beat))


async def _all_cases() -> dict[str, Callable[[], object]]:
    timed = cases()
    timed["ConsumerGroupHeartbeat answered by the service (funnel + engine)"] = (
        await service_case())
    return timed


async def _count_calls() -> dict[str, float]:
    """Python function calls (and calls of C functions) per call of each case, as cProfile
    counts them."""
    counts: dict[str, float] = {}
    for name, call in (await _all_cases()).items():
        call()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            call()
        profile.disable()
        counts[name] = pstats.Stats(profile).total_calls / 100
        print(f"{name:<66} {counts[name]:8.1f} calls")
    return counts


async def _measure(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    """Every case, timed inside trio as a connection calls the router (the fleet's views
    keep trio's clock), without yielding to it: wall-clock and this process's CPU time per
    call (the CPU time counts only what the call costs, not the time other processes of a
    shared machine took the core meanwhile)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for name, call in (await _all_cases()).items():
        call()
        runs = [_timed(call, args.number) for _ in range(args.repeat)]
        wall[name] = statistics.median(w for w, _ in runs) / args.number * 1e6
        cpu[name] = statistics.median(c for _, c in runs) / args.number * 1e6
        print(f"{name:<66} {wall[name]:8.2f} us ({cpu[name]:.2f} us CPU)")
    number = max(args.number // 10, 1)
    for name, beats in relayed_cases().items():
        runs = []
        for _ in range(args.repeat):
            started = time.process_time()
            runs.append((await beats(number), time.process_time() - started))
        wall[name] = statistics.median(w for w, _ in runs) / number * 1e6
        cpu[name] = statistics.median(c for _, c in runs) / number * 1e6
        print(f"{name:<66} {wall[name]:8.2f} us ({cpu[name]:.2f} us CPU)")
    return wall, cpu


def _timed(call: Callable[[], object], number: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``number`` calls (the loop is timeit's)."""
    calls = itertools.repeat(None, number)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in calls:
        call()
    return time.perf_counter() - wall, time.process_time() - cpu
