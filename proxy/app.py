"""Wires the running proxy together: server, routers, broker refresh, health, signals.

:func:`serve` is what ``groupgate run`` runs inside ``trio.run``. Besides the server it keeps
the coordinator service of KIP-848 groups (:mod:`proxy.coordination`, unless
``coordinate-groups`` is off; it leaves the broker's groups after the server has drained) and
one background task that asks the upstream cluster for its brokers every
``REFRESH_SECONDS`` (so every broker's listener is open before a client needs it, also after a
restart of the proxy) and whose success is the readiness signal.
"""

from __future__ import annotations

import logging
import time

import trio

from proxy.codec.api_keys import ApiKey
from proxy.config import ProxyConfig
from proxy.connection import ListenerError, Router
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.peers import ConnectionLinks, FleetSide
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.coordination.service import CoordinatorService
from proxy.health import serve_health
from proxy.logs import LIFECYCLE
from proxy.metrics import RequestCounters
from proxy.router import ForwardingRouter, parse_table
from proxy.security.policy import Security
from proxy.security.rights import (
    DESCRIBE_ACLS_VERSION,
    NOTHING_FILTER,
    AuthorizerCheck,
    Rights,
    authorization_mode,
)
from proxy.security.session import Session
from proxy.server import FLEET_NODE, ProxyServer, RouterFactory, node_label
from proxy.upstream import UpstreamError, fetch_brokers

log = logging.getLogger("groupgate")
lifecycle = logging.getLogger(LIFECYCLE)

REFRESH_SECONDS = 30.0
READY_WITHIN_SECONDS = 3 * REFRESH_SECONDS


class Readiness:
    def __init__(self) -> None:
        self.last_success: float | None = None
        self.last_error = "no upstream contact yet"

    def check(self) -> tuple[bool, str]:
        if self.last_success is None:
            return False, self.last_error
        age = time.monotonic() - self.last_success
        if age > READY_WITHIN_SECONDS:
            return False, f"no upstream contact for {age:.0f}s: {self.last_error}"
        return True, "ok"


CLASSIC_HEARTBEAT_MS = 3_000
"""The heartbeat interval classic clients use by default (Java, librdkafka, kafka-python)."""


def hand_off_seconds(config: ProxyConfig) -> float:
    """How long a graceful stop waits for every member to hear that it must let go: one
    heartbeat interval (the proxy's for new-protocol members, the clients' default for
    classic ones) and a second to spare; bounded by ``shutdown-grace``."""
    return (max(config.group_heartbeat_interval_ms, CLASSIC_HEARTBEAT_MS) + 1_000) / 1000


def make_router_factory(config: ProxyConfig, service: CoordinatorService | None = None
                        ) -> RouterFactory:
    """Routers of new connections; with a coordinator service, group requests of coordinated
    groups are answered by it (:mod:`proxy.coordination.routing`)."""
    accepted = parse_table(fetch_node_endpoints=config.fetch_node_endpoints)
    handlers = handler_table(service) if service is not None else {}
    mode = authorization_mode(config)
    authorizer: AuthorizerCheck | None = None
    if service is not None and mode == "auto":
        pool, first = service.pool, config.upstream[0]
        authorizer = AuthorizerCheck(lambda: pool.link(first).request(
            ApiKey.DESCRIBE_ACLS, DESCRIBE_ACLS_VERSION, NOTHING_FILTER))
    ttl = config.authorization_ttl_ms / 1000

    def factory(server: ProxyServer, node_id: int | None, client_host: str,
                session: Session) -> Router:
        # ``session``: what is known of the connection's authentication; the coordinating
        # router believes relay marks only from a fleet peer and carries the principal
        counters = RequestCounters(node_label(node_id))
        if handlers:
            assert service is not None
            inbound = node_id == FLEET_NODE
            fleet = FleetSide(service.routes, ConnectionLinks(service.pool), inbound,
                              service.broker_of)
            stage = (AuthorizationStage(Rights(None, ttl=ttl), service)
                     if mode != "off" and not inbound else None)
            return CoordinatingRouter(server, counters, accepted, handlers,
                                      None if inbound else node_id, client_host,
                                      claims=service.claims, fleet=fleet,
                                      software=service.software, session=session,
                                      authorization=stage, authorizer=authorizer)
        return ForwardingRouter(server, counters, accepted)

    return factory


def upstream_of(server: ProxyServer, node_id: int | None) -> tuple[str, int]:
    """The broker address behind a listener (the first bootstrap server for the bootstrap)."""
    entry = server.brokers.get(node_id) if node_id is not None else None
    return entry.upstream if entry is not None else server.config.upstream[0]


async def refresh_brokers(server: ProxyServer, readiness: Readiness,
                          first_done: trio.Event) -> None:
    config = server.config
    while True:
        for address in config.upstream:
            try:
                brokers = await fetch_brokers(address, timeout=config.connect_timeout,
                                              max_frame_bytes=config.max_frame_bytes,
                                              security=server.security)
            except UpstreamError as exc:
                readiness.last_error = str(exc)
                log.warning("broker refresh via %s:%d failed: %s", *address, exc)
                continue
            try:
                for node_id, host, port in brokers:
                    server.lookup(node_id, host, port)
            except ListenerError as exc:
                readiness.last_error = str(exc)
                log.error("%s", exc)
                break
            readiness.last_success = time.monotonic()
            break
        first_done.set()
        await trio.sleep(REFRESH_SECONDS)


async def serve(config: ProxyConfig, *,
                task_status: trio.TaskStatus[ProxyServer] = trio.TASK_STATUS_IGNORED) -> None:
    security = Security(config)
    service = CoordinatorService(config, security) if config.coordinate_groups else None
    server = ProxyServer(config, make_router_factory(config, service), security)
    readiness = Readiness()
    async with trio.open_nursery() as nursery:
        if service is not None:
            service.node_address = lambda node_id: upstream_of(server, node_id)
            await nursery.start(service.run)
            hand_off_s = min(config.shutdown_grace, hand_off_seconds(config))
            server.before_drain = lambda: service.let_go(hand_off_s)
        await nursery.start(server.run)
        nursery.start_soon(server.watch_signals)
        if config.metrics_listen is not None:
            await nursery.start(serve_health, *config.metrics_listen, readiness.check)
        first_refresh = trio.Event()
        nursery.start_soon(refresh_brokers, server, readiness, first_refresh)
        with trio.move_on_after(config.connect_timeout):
            await first_refresh.wait()
        ok, why = readiness.check()
        lifecycle.info("ready: bootstrap %s:%d (%s)", config.client_host, server.bootstrap_port,
                 "upstream reachable" if ok else f"upstream not reachable yet: {why}")
        task_status.started(server)
        await server.stopped.wait()
        if service is not None:
            await service.aclose()
        nursery.cancel_scope.cancel()
