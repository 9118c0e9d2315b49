"""Pod-local liveness in the proxy (docs/decisions/0020-pod-local-liveness.md): from a
client's connections to a member fenced with reason pod-local, here as the holder or at
another sidecar over the fleet listener (FleetControl MemberGone)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, cast

import pytest
import trio
import trio.testing

from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.connection import Connection, Local, RejectRequest, RequestInfo
from proxy.coordination.fleet_control import FLEET_CONTROL, FleetControlRouter
from proxy.coordination.peers import RELAY, ConnectionLinks, FleetSide, Route
from proxy.coordination.pod_liveness import PodLiveness, member_gone_body
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.coordination.service import CoordinatorService
from proxy.liveness import Outcome, SeenMember
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import parse_table
from proxy.security.session import Session
from translation.effects import Effect, MemberFenced

from .helpers import TOPIC, coordinate, exchange, make_service, request

LOOPBACK = "/127.0.0.1"
JOIN = {"group_id": "g", "member_id": "", "member_epoch": 0, "instance_id": None,
        "rack_id": None, "rebalance_timeout_ms": 30000, "subscribed_topic_names": [TOPIC],
        "server_assignor": None, "topic_partitions": []}


@dataclass
class Closed:
    """How a connection ended, as :class:`Connection` says it."""

    closing_reason: str | None = "client closed the connection"
    bad_input: bool = False
    draining: bool = False
    name: str = "127.0.0.1:50000 -> node 1"


BY_CLIENT = cast(Connection, Closed())
RESET_BY_CLIENT = cast(Connection, Closed("client connection failed: ConnectionResetError()"))
BY_BROKER = cast(Connection, Closed("upstream broker closed the connection"))


def client_router(service: CoordinatorService, liveness: PodLiveness,
                  host: str = LOOPBACK) -> CoordinatingRouter:
    """A client-facing connection's router as the router factory makes it."""
    made = CoordinatingRouter(DictAddressMap({}), RequestCounters("test"), parse_table(),
                              handler_table(service), 1, host, claims=service.claims,
                              fleet=FleetSide(service.routes, ConnectionLinks(service.pool),
                                              False, service.broker_of),
                              session=Session("test"))
    made.liveness = liveness.watch(host)
    api_versions = request(ApiKey.API_VERSIONS, 3,
                           {"client_software_name": "librdkafka",
                            "client_software_version": "2.6.1"}, client_id="rdkafka")
    made.classify(api_versions)
    return made


async def heartbeat(made: CoordinatingRouter, value: dict[str, Any]) -> dict[str, Any]:
    result = await exchange(made, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, value,
                                          client_id="rdkafka"))
    assert result.response is not None and result.response["error_code"] == 0, result
    return result.response


class Recorded:
    """The engine effects the service applies."""

    def __init__(self, service: CoordinatorService) -> None:
        self.effects: list[Effect] = []
        apply = service.apply

        def recording(effects: list[Effect]) -> None:
            self.effects.extend(effects)
            apply(effects)

        service.apply = recording  # type: ignore[method-assign]

    def fenced(self) -> list[MemberFenced]:
        return [e for e in self.effects if isinstance(e, MemberFenced)]


async def member_with_connections(service: CoordinatorService, liveness: PodLiveness,
                                  n: int = 3, instance_id: str | None = None,
                                  host: str = LOOPBACK) -> tuple[str, list[CoordinatingRouter]]:
    """A member whose client has ``n`` connections; the first carries its heartbeats."""
    routers = [client_router(service, liveness, host) for _ in range(n)]
    joined = await heartbeat(routers[0], {**JOIN, "instance_id": instance_id})
    member_id = joined["member_id"]
    await heartbeat(routers[0], {**JOIN, "member_id": member_id, "instance_id": instance_id,
                                 "member_epoch": joined["member_epoch"],
                                 "subscribed_topic_names": None, "topic_partitions": None,
                                 "rebalance_timeout_ms": -1})
    return member_id, routers


async def running(service: CoordinatorService, liveness: PodLiveness,
                  nursery: trio.Nursery) -> None:
    await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                        task_status=task_status))
    await nursery.start(liveness.run)


async def test_a_crashed_member_is_fenced_pod_local_within_the_grace(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    liveness = PodLiveness(service, window_ms=200, grace_ms=400)
    recorded = Recorded(service)
    async with trio.open_nursery() as nursery:
        await running(service, liveness, nursery)
        member_id, routers = await member_with_connections(service, liveness)
        for made in routers:  # the process died: the kernel closed every socket at once
            liveness.connection_closed(made, RESET_BY_CLIENT)
        await trio.sleep(0.3)
        assert member_id in service.engine.groups["g"].members  # within the grace
        await trio.sleep(0.2)
        assert recorded.fenced() == [MemberFenced("g", member_id, "pod-local")]
        assert member_id not in service.engine.groups["g"].members
        nursery.cancel_scope.cancel()


async def test_a_client_that_comes_back_within_the_grace_keeps_its_member(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    liveness = PodLiveness(service, window_ms=200, grace_ms=400)
    recorded = Recorded(service)
    async with trio.open_nursery() as nursery:
        await running(service, liveness, nursery)
        member_id, routers = await member_with_connections(service, liveness)
        for made in routers:
            liveness.connection_closed(made, BY_CLIENT)
        await trio.sleep(0.1)
        client_router(service, liveness)  # reconnected: ApiVersions of the same client
        await trio.sleep(2)  # grace 0.4 s; session 6 s
        assert recorded.fenced() == [] and member_id in service.engine.groups["g"].members
        assert liveness.tracker.counts[Outcome.RETURNED] == 1
        nursery.cancel_scope.cancel()


async def test_closes_the_proxy_made_and_a_lone_group_connection_are_silent(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    liveness = PodLiveness(service, window_ms=200, grace_ms=400)
    recorded = Recorded(service)
    async with trio.open_nursery() as nursery:
        await running(service, liveness, nursery)
        member_id, routers = await member_with_connections(service, liveness)
        liveness.connection_closed(routers[0], BY_CLIENT)  # the group connection alone
        await trio.sleep(2)  # grace 0.4 s; session 6 s
        other_id, others = await member_with_connections(service, liveness, host="/127.0.0.2")
        for made in others:  # a broker restart passed on to the client
            liveness.connection_closed(made, BY_BROKER)
        await trio.sleep(2)
        assert recorded.fenced() == []
        assert {member_id, other_id} <= set(service.engine.groups["g"].members)
        assert liveness.tracker.counts[Outcome.SUSPECTED] == 0
        nursery.cancel_scope.cancel()


async def test_static_members_and_interrupted_groups_are_not_fenced(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    membership = coordinate(service, "g")
    liveness = PodLiveness(service, window_ms=200, grace_ms=400)
    recorded = Recorded(service)
    async with trio.open_nursery() as nursery:
        await running(service, liveness, nursery)
        static_id, routers = await member_with_connections(service, liveness,
                                                           instance_id="i-1")
        for made in routers:
            liveness.connection_closed(made, BY_CLIENT)
        await trio.sleep(1)
        member_id, routers = await member_with_connections(service, liveness,
                                                           host="/127.0.0.2")
        membership.hold(False)  # the broker's group is not held: the holder stays silent
        for made in routers:
            liveness.connection_closed(made, BY_CLIENT)
        await trio.sleep(1)
        assert recorded.fenced() == []
        assert {static_id, member_id} <= set(service.engine.groups["g"].members)
        nursery.cancel_scope.cancel()


def body_of(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def control_request(body: bytes, correlation: int = 9) -> RequestInfo:
    payload = encode_request_header(FLEET_CONTROL, 0, correlation, "groupgate",
                                    flexible=False) + body
    return RequestInfo(FLEET_CONTROL, 0, correlation, memoryview(payload))


def control_answer(decision: object) -> tuple[int, int]:
    assert isinstance(decision, Local) and isinstance(decision.answer, bytes)
    return cast(tuple[int, int], struct.unpack(">ih", decision.answer))


async def test_the_holder_answers_member_gone_from_fleet_peers_only(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    liveness = PodLiveness(service, window_ms=200, grace_ms=400)
    recorded = Recorded(service)
    async with trio.open_nursery() as nursery:
        await running(service, liveness, nursery)
        member_id, _ = await member_with_connections(service, liveness)
        epoch = service.engine.groups["g"].members[member_id].member_epoch
        inner = cast(Any, object())
        handlers = {"MemberGone": liveness.on_member_gone}
        stranger = FleetControlRouter(inner, handlers, Session("fleet"), "/10.0.0.9")
        with pytest.raises(RejectRequest):
            stranger.classify(control_request(body_of(member_gone_body("g", member_id, epoch,
                                                                       0))))
        peer = FleetControlRouter(inner, handlers, Session("fleet", fleet_peer=True),
                                  "/10.0.0.9")
        stale = control_request(body_of(member_gone_body("g", member_id, epoch + 7, 0)))
        peer.classify(stale)
        assert control_answer(peer.decide(stale)) == (9, 110)  # FENCED_MEMBER_EPOCH
        assert control_answer(peer.decide(control_request(b"{not json"))) == (9, 42)
        gone = control_request(body_of(member_gone_body("g", member_id, epoch, 0)), 10)
        service.stepping_down = True  # stopping: this sidecar fences nobody
        assert control_answer(peer.decide(gone)) == (10, 15)  # COORDINATOR_NOT_AVAILABLE
        service.stepping_down = False
        assert control_answer(peer.decide(gone)) == (10, 0)
        assert recorded.fenced() == [MemberFenced("g", member_id, "pod-local")]
        nursery.cancel_scope.cancel()


async def test_a_follower_tells_a_protocol_3_holder_and_never_a_protocol_2_one() -> None:
    """Two sidecars: the follower's client dies; the holder, reached over a real socket,
    fences the member; a protocol-2 holder is sent nothing."""
    holder = make_service()
    coordinate(holder, "g")
    holder_liveness = PodLiveness(holder, window_ms=50, grace_ms=100)
    recorded = Recorded(holder)
    follower = make_service()
    follower_liveness = PodLiveness(follower, window_ms=50, grace_ms=100)
    received: list[dict[str, Any]] = []

    async def fleet_listener(stream: trio.SocketStream) -> None:
        """The holder's fleet listener, as far as FleetControl goes."""
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        frame = memoryview(data[4:])
        api_key, version, correlation = struct.unpack_from(">hhi", frame)
        info = RequestInfo(api_key, version, correlation, frame)
        received.append(json.loads(bytes(frame[10 + len("groupgate"):])))
        router = FleetControlRouter(cast(Any, object()),
                                    {"MemberGone": holder_liveness.on_member_gone},
                                    Session("fleet", fleet_peer=True), "/127.0.0.1")
        router.classify(info)
        decision = router.decide(info)
        assert isinstance(decision, Local) and isinstance(decision.answer, bytes)
        await stream.send_all(struct.pack(">i", len(decision.answer)) + decision.answer)

    async with trio.open_nursery() as nursery:
        await running(holder, holder_liveness, nursery)
        listeners = await nursery.start(
            lambda task_status: trio.serve_tcp(fleet_listener, 0, host="127.0.0.1",
                                               task_status=task_status))
        port = listeners[0].socket.getsockname()[1]
        member_id, _ = await member_with_connections(holder, holder_liveness)
        epoch = holder.engine.groups["g"].members[member_id].member_epoch
        await nursery.start(follower_liveness.run)
        routes: list[Route] = [Route(RELAY, ("127.0.0.1", port), protocol=2)]
        follower.routes.route = lambda _groups: routes[0]  # type: ignore[method-assign,assignment]
        follower_liveness.deliver(SeenMember("g", member_id, epoch), 0)
        await trio.sleep(0.2)
        assert received == [] and member_id in holder.engine.groups["g"].members
        routes[0] = Route(RELAY, ("127.0.0.1", port), protocol=3)
        follower_liveness.deliver(SeenMember("g", member_id, epoch), 0)
        with trio.fail_after(5):
            while not recorded.fenced():
                await trio.sleep(0.01)
        assert received[0]["type"] == "MemberGone" and received[0]["member_id"] == member_id
        assert recorded.fenced() == [MemberFenced("g", member_id, "pod-local")]
        routes[0] = Route(RELAY, ("127.0.0.1", 1), protocol=3)  # nobody listens: dropped
        follower_liveness.deliver(SeenMember("g", "m-x", 1), 0)
        with trio.fail_after(5):
            while follower_liveness._sending:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
