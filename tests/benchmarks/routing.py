"""``dev/bench routing``: what the per-API routing costs per request, in process.

Times the coordinating router the way a connection drives it (``classify``, then ``decide``
for the APIs it examines), with no socket and no broker: a forwarded Produce (classified only),
an OffsetCommit and a classic Heartbeat of a group the proxy does not coordinate (decoded,
handed to their handler, passed to the broker), a ListGroups (decoded, its handler rewrites
it), a ConsumerGroupHeartbeat (decoded, answered by the engine) without and with the
authorization stage (the client's rights already known on the connection: what a member's
heartbeat costs within ``authorization-ttl-ms``; the broker's answer when it is not known is
one round trip on the client's connection, measured by ``dev/bench passthrough``'s ``rtt``
figures), the construction of a router (once per client connection), and a member's steady
ConsumerGroupHeartbeat answered by the coordinator service itself (its request funnel, the
engine, the write barrier's and the lease's checks; no state log), which the router's cases
leave out. A member's heartbeat behind a follower sidecar is timed end to end in process, both
sidecars' routers with the link between them played by a function call (no socket): relayed
as a ConsumerGroupHeartbeat request, and inside ``FleetControl`` (decision record 0019: the
way that lets the holder ask for the member's rights; the steady heartbeat asks nothing).
Prints microseconds per call, median of ``--repeat`` runs; ``--json`` writes them with the
machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import trio

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from proxy.commands import machine
from proxy.connection import Local, RequestInfo
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.fleet import mark_forwarded
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import body_offset, parse_table
from proxy.security.rights import DESCRIBE, READ, Rights
from proxy.security.session import Session
from tests.unit.coordination.helpers import (
    coordinate,
    joining_heartbeat,
    make_service,
    request,
    router,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--json", metavar="FILE", type=Path)


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

    return {
        "forwarded Produce (classify)": lambda: r.classify(produce),
        "OffsetCommit of a broker group (classify + decide)": routed(commit),
        "classic Heartbeat of a broker group (classify + decide)": routed(heartbeat),
        "ListGroups (classify + decide, rewritten)": routed(listing),
        "ConsumerGroupHeartbeat (classify + decide)": answered(r, beat),
        "ConsumerGroupHeartbeat, authorized, rights known": answered(authorized, beat),
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
    from proxy.coordination.fleet import Card, Holder

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
    # inside trio's loop, as a connection's router runs: the commit-retry book reads trio's
    # clock (outside it every OffsetCommit case only timed a logged RuntimeError)
    return trio.run(_measure, args)


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


async def _measure(args: argparse.Namespace) -> int:
    results: dict[str, float] = {}
    timed = cases()
    timed["ConsumerGroupHeartbeat answered by the service (funnel + engine)"] = (
        await service_case())
    for name, call in timed.items():
        call()
        runs = timeit.repeat(call, number=args.number, repeat=args.repeat)
        results[name] = statistics.median(runs) / args.number * 1e6
        print(f"{name:<74} {results[name]:8.2f} us")
    number = max(args.number // 10, 1)
    for name, beats in relayed_cases().items():
        runs = [await beats(number) for _ in range(args.repeat)]
        results[name] = statistics.median(runs) / number * 1e6
        print(f"{name:<74} {results[name]:8.2f} us")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "routing", "machine": machine.machine_info(),
                                         "us_per_call": results, "number": args.number,
                                         "repeat": args.repeat}, indent=2) + "\n")
    return 0
