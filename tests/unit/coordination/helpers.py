"""Fakes for the coordination unit tests: a broker membership that never touches the network,
a link pool that records requests and answers from a script, and :func:`exchange`, which
drives the coordinating router through one request the way a connection does."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header, parse_request_header, response_header_for
from proxy.codec.schema import struct_default
from proxy.config import ProxyConfig
from proxy.connection import EXAMINE, FORWARD, Local, Prepare, RequestInfo, Rewrite
from proxy.coordination import convert
from proxy.coordination.membership import BrokerMembership
from proxy.coordination.peers import ConnectionLinks, FleetSide
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.coordination.service import CoordinatorService
from proxy.kafka_client.links import LinkPool
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import body_offset, parse_table
from proxy.security.session import Session
from translation.heartbeat import ConsumerGroupHeartbeatRequest
from translation.topics import TopicMetadata, TopicsImage

TOPIC = "orders"
TOPIC_ID = uuid.UUID("0b6f9a4c-1d2e-4f3a-9b8c-7d6e5f4a3b2c")
COORDINATOR = ("10.0.0.1", 9092)

Answer = Callable[[int, int, dict[str, Any]], dict[str, Any]]


def coordinator_found(version: int, value: dict[str, Any], host: str, port: int,
                      node_id: int = 1, error_code: int = 0) -> dict[str, Any]:
    """A FindCoordinator answer naming one broker for the key asked (v3) or for every key
    asked (v4+, ``coordinator_keys``)."""
    found = {"error_code": error_code, "error_message": None, "node_id": node_id,
             "host": host, "port": port}
    if version < 4:
        return {"throttle_time_ms": 0, **found}
    return {"throttle_time_ms": 0,
            "coordinators": [{"key": key, **found} for key in value["coordinator_keys"]]}


class FakeMembership(BrokerMembership):
    """Established at once (member ``proxy-member``, generation 7); records leaving."""

    def __init__(self, group_id: str, pool: LinkPool) -> None:
        super().__init__(group_id, pool, [("127.0.0.1", 1)], connect_timeout=1)
        self.member_id = "proxy-member"
        self.generation = 7
        self.coordinator = COORDINATOR
        self.coordinator_node = 1
        self.stable = True
        self.settled.set()
        self.leaves = 0

    async def run(self) -> None:
        return None

    async def leave(self) -> None:
        self.leaves += 1
        self.left = True

    def hold(self, stable: bool) -> None:
        """The broker's group is lost (False: the broker restarted, the coordinator moved) or
        held again (True)."""
        self._set_stable(stable)


class FakeLink:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[int, int, dict[str, Any]]] = []
        self.client_ids: list[str | None] = []
        self.timeouts: list[float | None] = []
        self.controls: list[bytes] = []

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        if api_key == 18:  # ApiVersions (proxy.coordination.native_exit): a 3.x broker
            return {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}
        self.requests.append((api_key, version, value))
        self.client_ids.append(client_id)
        self.timeouts.append(timeout)
        if api_key == 12:  # a broker membership's heartbeat: paced like a broker's answers
            await trio.sleep(0.001)
        return self.answer(api_key, version, value)

    async def exchange_raw(self, api_key: int, version: int, body: bytes, *,
                           timeout: float | None = None) -> bytes:
        """A ``FleetControl`` request: answered as a sidecar that takes no commit tickets
        (INVALID_REQUEST, no body), so commits are relayed (``test_tickets`` has holders
        that take them)."""
        self.controls.append(body)
        return struct.pack(">h", 42)

    async def aclose(self) -> None:
        return None


class FakePool(LinkPool):
    def __init__(self, answer: Answer) -> None:
        super().__init__(connect_timeout=1, request_timeout=1, max_frame_bytes=1 << 20)
        self.fake = FakeLink(answer)
        self.addresses: list[tuple[str, int]] = []

    def link(self, address: tuple[str, int]) -> Any:
        self.addresses.append(address)
        return self.fake

    def dedicated(self, address: tuple[str, int], request_timeout: float) -> Any:
        self.addresses.append(address)
        return self.fake

    def peer(self, address: tuple[str, int], request_timeout: float) -> Any:
        self.addresses.append(address)
        return self.fake


def make_service(answer: Answer | None = None, **settings: Any) -> CoordinatorService:
    """A service whose broker links are ``answer``; the state log is off unless asked for
    (it has links of its own: see ``test_durability``)."""
    settings.setdefault("state_log", False)
    config = ProxyConfig(upstream=(("127.0.0.1", 1),), group_heartbeat_interval_ms=500,
                         group_session_timeout_ms=6000, **settings)
    service = CoordinatorService(config)
    service.pool = FakePool(answer or (lambda k, v, value: {}))
    service.engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 4)]), 0)
    return service


def coordinate(service: CoordinatorService, group_id: str) -> FakeMembership:
    membership = FakeMembership(group_id, service.pool)
    service.adopt(membership)
    return membership


# -- driving the router the way a connection does -------------------------------------------


def request(key: int, version: int, value: dict[str, Any], correlation: int = 7,
            client_id: str = "client-1") -> RequestInfo:
    """A request frame (header and body) as a client would send it."""
    payload = (encode_request_header(key, version, correlation, client_id)
               + messages.encode_request(key, version, value))
    return RequestInfo(key, version, correlation, memoryview(payload))


def router(service: CoordinatorService, node_id: int | None = 1, *,
           fleet: bool = False, inbound: bool = False,
           session: Session | None = None) -> CoordinatingRouter:
    """A connection's router; ``fleet``: routing between sidecars on, as ``groupgate run``
    builds it (relays go through the service's pool); ``inbound``: a connection on the fleet
    listener, from another sidecar unless ``session`` says otherwise."""
    side = (FleetSide(service.routes, ConnectionLinks(service.pool), inbound, service.broker_of)
            if fleet or inbound else None)
    if session is None:
        session = Session("fleet", fleet_peer=True) if inbound else Session("test")
    return CoordinatingRouter(DictAddressMap({}), RequestCounters("test"), parse_table(),
                              handler_table(service), node_id, "/10.0.0.7",
                              claims=service.claims, fleet=side, session=session)


@dataclass
class Exchange:
    """What happened to one request: ``forward`` (untouched), ``local`` (answered by the
    proxy) or ``rewrite`` (sent upstream changed: ``sent``); ``response`` is what the client
    got (None when forwarded untouched)."""

    action: str
    response: dict[str, Any] | None = None
    sent: dict[str, Any] | None = None
    abandon: Callable[[], None] | None = None


async def exchange(router: CoordinatingRouter, info: RequestInfo,
                   broker: Answer | None = None) -> Exchange:
    """Classify and decide ``info``, answer a rewritten request with ``broker`` and pass the
    answer through the router's response filter."""
    key, version = info.api_key, info.api_version
    if router.classify(info) != EXAMINE:
        return Exchange("forward")
    decision = router.decide(info)
    if isinstance(decision, Prepare):  # the connection awaits it, reading nothing else
        decision = await decision.decision
    if decision == FORWARD:
        return Exchange("forward")
    if isinstance(decision, Local):
        answer = decision.answer
        if not isinstance(answer, bytes | bytearray | memoryview):
            answer = await answer
        if not isinstance(answer, Rewrite):
            start = body_offset(memoryview(answer), messages.response_header_version(key,
                                                                                     version))
            (correlation,) = struct.unpack_from(">i", answer, 0)
            assert correlation == info.correlation_id
            return Exchange("local", messages.decode_response(key, version, answer, start)[0])
        decision = answer
    assert isinstance(decision, Rewrite)
    header = parse_request_header(decision.payload)
    assert header.correlation_id == info.correlation_id
    sent, _ = messages.decode_request(key, version, decision.payload, header.header_length)
    if broker is None:
        return Exchange("rewrite", None, sent, decision.on_abandon)
    reply = (response_header_for(key, version, info.correlation_id)
             + messages.encode_response(key, version, broker(key, version, sent)))
    out = decision.on_response(memoryview(reply))
    assert out is not None
    start = body_offset(memoryview(out), messages.response_header_version(key, version))
    return Exchange("rewrite", messages.decode_response(key, version, out, start)[0], sent)


def consumer_heartbeat(value: dict[str, Any], *, client_id: str | None, client_host: str,
                       api_version: int) -> ConsumerGroupHeartbeatRequest:
    """The engine's request for a hand-written ConsumerGroupHeartbeat body: fields it leaves out
    take their schema defaults, as in a decoded request."""
    full = struct_default(messages.schema(ApiKey.CONSUMER_GROUP_HEARTBEAT).struct, api_version)
    full.update(value)
    return convert.consumer_group_heartbeat_request(full, api_version, client_id=client_id,
                                                    client_host=client_host)


def joining_heartbeat(member: str, epoch: int) -> ConsumerGroupHeartbeatRequest:
    """Member ``member``'s heartbeat to group ``g``: a join (subscribing to :data:`TOPIC`) at
    epoch 0, else a plain heartbeat at ``epoch``."""
    return consumer_heartbeat(
        {"group_id": "g", "member_id": member, "member_epoch": epoch,
         "rebalance_timeout_ms": 10_000 if epoch == 0 else -1,
         "subscribed_topic_names": [TOPIC] if epoch == 0 else None,
         "topic_partitions": [] if epoch == 0 else None},
        client_id="c", client_host="/h", api_version=1)
