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
from collections.abc import Callable

import trio

from proxy.codec.api_keys import ApiKey
from proxy.config import ProxyConfig, resolve_fleet
from proxy.connection import ListenerError, Router
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.fleet_control import FleetControlRouter
from proxy.coordination.peers import ConnectionLinks, FleetSide
from proxy.coordination.pod_liveness import PodLiveness
from proxy.coordination.routing import CoordinatingRouter, handler_table
from proxy.coordination.service import CoordinatorService
from proxy.health import serve_health
from proxy.kafka_client.metadata import fetch_brokers
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
from proxy.upstream import UpstreamError

log = logging.getLogger("groupgate")
lifecycle = logging.getLogger(LIFECYCLE)

REFRESH_SECONDS = 30.0
READY_WITHIN_SECONDS = 3 * REFRESH_SECONDS


class Readiness:
    """Ready: the upstream cluster answered recently. ``details`` adds lines to the answer
    that never fail it (a group whose coordinating sidecar cannot be followed from here is
    the fleet's problem, not this pod's: restarting it would not help)."""

    def __init__(self, details: Callable[[], list[str]] | None = None) -> None:
        self.last_success: float | None = None
        self.last_error = "no upstream contact yet"
        self.details = details

    def check(self) -> tuple[bool, str]:
        if self.last_success is None:
            ok, why = False, self.last_error
        else:
            age = time.monotonic() - self.last_success
            if age > READY_WITHIN_SECONDS:
                ok, why = False, f"no upstream contact for {age:.0f}s: {self.last_error}"
            else:
                ok, why = True, "ok"
        lines = self.details() if self.details is not None else []
        return ok, "\n".join([why, *lines])


CLASSIC_HEARTBEAT_MS = 3_000
"""The heartbeat interval classic clients use by default (Java, librdkafka, kafka-python)."""


def hand_off_seconds(config: ProxyConfig) -> float:
    """How long a graceful stop waits for every member to hear that it must let go: one
    heartbeat interval (the proxy's for new-protocol members, the clients' default for
    classic ones) and a second to spare; bounded by ``shutdown-grace``."""
    return (max(config.group_heartbeat_interval_ms, CLASSIC_HEARTBEAT_MS) + 1_000) / 1000


def make_router_factory(config: ProxyConfig, service: CoordinatorService | None = None,
                        liveness: PodLiveness | None = None) -> RouterFactory:
    """Routers of new connections; with a coordinator service, group requests of coordinated
    groups are answered by it (:mod:`proxy.coordination.routing`); with ``liveness``, client
    connections feed pod-local liveness; the fleet listener answers ``FleetControl``
    (:mod:`proxy.coordination.fleet_control`)."""
    accepted = parse_table(fetch_node_endpoints=config.fetch_node_endpoints)
    handlers = handler_table(service) if service is not None else {}
    control = dict(service.upgrades.control_handlers(service)) if service is not None else {}
    if service is not None:
        control.update(service.fleet_release.handlers())  # the hand-back in a fleet
    if liveness is not None:
        control["MemberGone"] = liveness.on_member_gone
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
            fleet = FleetSide(service.routes,
                              ConnectionLinks(service.pool, service.routes.problems), inbound,
                              service.broker_of)
            stage = (AuthorizationStage(Rights(None, ttl=ttl), service)
                     if mode != "off" and not inbound else None)
            router = CoordinatingRouter(server, counters, accepted, handlers,
                                        None if inbound else node_id, client_host,
                                        claims=service.claims, fleet=fleet,
                                        software=service.software, session=session,
                                        authorization=stage, authorizer=authorizer)
            if inbound:
                return FleetControlRouter(router, control, session, client_host)
            if liveness is not None:
                router.liveness = liveness.watch(client_host)
            return router
        return ForwardingRouter(server, counters, accepted)

    return factory


async def _stopping(service: CoordinatorService, liveness: PodLiveness | None,
                    hand_off_s: float) -> None:
    """A graceful stop begins: nothing more is declared gone (the drain closes connections
    itself), then the service lets its groups go."""
    if liveness is not None:
        liveness.silence()
    await service.let_go(hand_off_s)


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
    config = resolve_fleet(config)
    if config.fleet_note:
        log.warning("%s", config.fleet_note)
    security = Security(config)
    service = CoordinatorService(config, security) if config.coordinate_groups else None
    liveness = (PodLiveness(service, window_ms=config.liveness_window_ms,
                            grace_ms=config.liveness_grace_ms)
                if service is not None and config.pod_local_liveness else None)
    server = ProxyServer(config, make_router_factory(config, service, liveness), security)
    if liveness is not None:
        server.connection_closed = liveness.connection_closed
        server.connection_refused = liveness.connection_refused
    readiness = Readiness(service.routes.problems.summary if service is not None else None)
    async with trio.open_nursery() as nursery:
        if service is not None:
            service.node_address = lambda node_id: upstream_of(server, node_id)
            await nursery.start(service.run)
            hand_off_s = min(config.shutdown_grace, hand_off_seconds(config))
            if liveness is not None:
                await nursery.start(liveness.run)
            server.before_drain = lambda: _stopping(service, liveness, hand_off_s)
        await nursery.start(server.run)
        if service is not None and config.advertised_fleet_address is None:
            # no fleet listener: member marks name the client listener (its bound port)
            service.upgrades.mark_address = f"{config.client_host}:{server.bootstrap_port}"
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
