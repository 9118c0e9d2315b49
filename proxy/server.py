"""The proxy server: listeners, the broker directory, accepting and shutting down.

``ProxyServer`` owns one bootstrap listener and one listener per upstream broker. Broker
listeners are opened on demand: whenever a response reveals a broker (Metadata,
FindCoordinator, DescribeCluster, KIP-951 node endpoints), the rewriter asks the server's
:meth:`ProxyServer.lookup` for that broker's proxy address; the first time a node id is seen its
listener is bound right there (synchronously, so the port handed to the client is already
accepting) and its accept loop started. Broker N listens on ``broker-port-base + N``; the
upstream address of each node is updated from every response that mentions it, so a broker
that moves is followed.

Security (:mod:`proxy.security`). Each accepted connection gets its listener's policy: with
listener TLS the client must start TLS and the proxy terminates it with its own certificate
(a plaintext client is closed with a log line; without listener TLS a client that starts TLS
is closed the same way); on a SASL cluster its router is wrapped in a
:class:`~proxy.security.gate.SaslGate`, and its upstream connection is made with TLS as the
cluster wants. Every connection has a :class:`~proxy.security.session.Session` saying what is
known of its authentication, handed to the router factory.

Shutdown (SIGTERM or SIGINT): stop accepting, close the listeners, let every connection's
outstanding requests finish within ``shutdown-grace`` seconds, then close what is left. A
second signal cancels at once.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from proxy import metrics
from proxy.budget import ByteBudget
from proxy.config import ProxyConfig
from proxy.connection import TLS_HANDSHAKE, Connection, ListenerError, Router
from proxy.logs import LIFECYCLE
from proxy.orderer import HeldBytes
from proxy.security.gate import SaslGate
from proxy.security.policy import ListenerPolicy, Security
from proxy.security.session import Session
from proxy.security.tls import TlsError, handshake_server, peer_subject

log = logging.getLogger("groupgate.server")
RETRY_BIND_SECONDS = 10.0
REFUSAL_LOG_SECONDS = 10.0
"""At most one log line this often about connections refused at max-connections."""
lifecycle = logging.getLogger(LIFECYCLE)


RouterFactory = Callable[["ProxyServer", "int | None", str, Session], Router]
"""Builds the :class:`Router` of each new connection from its listener's node id (None: the
bootstrap listener, :data:`FLEET_NODE`: the fleet listener), the client's host as Kafka
reports it (``/10.0.0.7``) and the connection's :class:`Session` (what is known of its
authentication; it fills as the client authenticates)."""

FLEET_NODE = -1
"""The node id of connections on the fleet listener, where other sidecars relay the group
requests of groups this one coordinates (no Kafka node has a negative id). Like the bootstrap
listener's, their own upstream connection goes to a bootstrap server."""


@dataclass
class BrokerEntry:
    node_id: int
    upstream: tuple[str, int]
    listener: trio.SocketListener
    port: int
    connections: int = 0


def bind_listener(host: str, port: int) -> tuple[trio.SocketListener, int]:
    """Bind and listen synchronously (numeric hosts only), returning the listener and its port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(512)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock)), bound_port


class ProxyServer:
    def __init__(self, config: ProxyConfig, router_factory: RouterFactory,
                 security: Security | None = None) -> None:
        self.config = config
        self.router_factory = router_factory
        self.security = security if security is not None else Security(config)
        self.brokers: dict[int, BrokerEntry] = {}
        self.active: set[Connection] = set()
        """Open client connections, drained on shutdown."""
        self.bootstrap_port = 0
        self.fleet_port = 0
        self._nursery: trio.Nursery | None = None
        self._connections: trio.Nursery | None = None
        self._open = 0
        """Client connections being served (counted against max-connections)."""
        self._refused = 0
        self._refusal_logged = -REFUSAL_LOG_SECONDS
        self.examined_budget = ByteBudget(config.examined_bytes_in_flight)
        self.held = HeldBytes(config.held_response_bytes)
        self._bind_failures: dict[int, float] = {}
        self._listeners: list[trio.SocketListener] = []
        self._stop = trio.Event()
        self.stopped = trio.Event()
        self.before_drain: Callable[[], Awaitable[None]] | None = None
        """Run when a graceful stop begins, before connections are drained (the coordinator
        service tells its members to let go of their partitions then)."""
        self.connection_closed: Callable[[Router, Connection], None] | None = None
        """Told of every served connection when it ends, with the router the factory made
        (pod-local liveness: :mod:`proxy.coordination.pod_liveness`)."""
        self.connection_refused: Callable[[], None] | None = None
        """Told when a new connection is closed at once (``max-connections``, no broker)."""

    # -- broker directory (the rewriters' AddressMap) ----------------------------------------

    def lookup(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """Record broker ``node_id`` at ``host:port`` upstream; return its proxy address.

        If the broker's listener cannot be bound (port taken, out of range), the error is logged
        and retried at most every ``RETRY_BIND_SECONDS``; meanwhile clients are handed the
        listener's address anyway and find it refusing connections, so they retry, and the
        other brokers in the same response stay usable. A broker's real address is never
        handed out.
        """
        entry = self.brokers.get(node_id)
        if entry is None:
            try:
                entry = self._open_broker_listener(node_id, (host, port))
            except ListenerError as exc:
                now = time.monotonic()
                if now - self._bind_failures.get(node_id, -RETRY_BIND_SECONDS) >= \
                        RETRY_BIND_SECONDS:
                    log.error("%s", exc)
                    self._bind_failures[node_id] = now
                return self.config.client_host, self.config.broker_port(node_id)
        elif entry.upstream != (host, port):
            log.info("broker %d moved from %s:%d to %s:%d", node_id, *entry.upstream, host, port)
            entry.upstream = (host, port)
        return self.config.client_host, entry.port

    def _open_broker_listener(self, node_id: int, upstream: tuple[str, int]) -> BrokerEntry:
        if self._nursery is None:
            raise ListenerError(f"broker {node_id} appeared while the proxy is not accepting")
        listen_host = self.config.listen[0]
        port = self.config.broker_port(node_id)
        if not 0 <= port <= 65535:
            raise ListenerError(f"broker {node_id}: port {port} is outside 0-65535; "
                                "lower broker-port-base")
        try:
            listener, bound = bind_listener(listen_host, port)
        except OSError as exc:
            raise ListenerError(
                f"cannot listen for broker {node_id} on {listen_host}:{port}: {exc}"
            ) from exc
        entry = BrokerEntry(node_id, upstream, listener, bound)
        self.brokers[node_id] = entry
        self._listeners.append(listener)
        self._nursery.start_soon(self._accept_loop, listener, node_id)
        lifecycle.info("broker %d: listening on %s:%d for upstream %s:%d",
                 node_id, listen_host, bound, *upstream)
        return entry

    # -- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[ProxyServer] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as connections:
            self._connections = connections
            async with trio.open_nursery() as accepting:
                self._nursery = accepting
                listener, self.bootstrap_port = bind_listener(*self.config.listen)
                self._listeners.append(listener)
                accepting.start_soon(self._accept_loop, listener, None)
                lifecycle.info("bootstrap listener on %s:%d, upstream %s", self.config.listen[0],
                         self.bootstrap_port,
                         ",".join(f"{h}:{p}" for h, p in self.config.upstream))
                if self.config.fleet_listen is not None:
                    fleet, self.fleet_port = bind_listener(*self.config.fleet_listen)
                    self._listeners.append(fleet)
                    accepting.start_soon(self._accept_loop, fleet, FLEET_NODE)
                    lifecycle.info("fleet listener on %s:%d (other sidecars reach it at %s:%d)",
                                   self.config.fleet_listen[0], self.fleet_port,
                                   *(self.config.advertised_fleet_address or ("-", 0)))
                task_status.started(self)
                await self._stop.wait()
                self._nursery = None
                accepting.cancel_scope.cancel()
            if self.before_drain is not None:
                await self.before_drain()
            await self._shutdown()
            connections.cancel_scope.cancel()
        self.stopped.set()

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stop.set()

    async def watch_signals(self) -> None:
        """Graceful stop on the first SIGTERM/SIGINT; immediate exit on the second."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if not self._stop.is_set():
                    log.info("received %s: shutting down (grace %.1fs)",
                             signal.Signals(signum).name, self.config.shutdown_grace)
                    self.stop()
                else:
                    log.warning("second signal: exiting now")
                    raise KeyboardInterrupt

    async def _shutdown(self) -> None:
        for listener in self._listeners:
            await listener.aclose()
        active = list(self.active)
        if active:
            log.info("draining %d connections", len(active))
            async with trio.open_nursery() as nursery:
                for conn in active:
                    nursery.start_soon(conn.drain, self.config.shutdown_grace)
        log.info("stopped")

    async def _accept_loop(self, listener: trio.SocketListener, node_id: int | None) -> None:
        assert self._connections is not None
        while True:
            try:
                stream = await listener.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            except OSError as exc:  # e.g. EMFILE: back off instead of spinning
                log.warning("accept failed on %s: %s", _describe(node_id), exc)
                await trio.sleep(0.1)
                continue
            metrics.CONNECTIONS.labels(node_label(node_id)).inc()
            if self._open >= self.config.max_connections:
                self._refuse(stream, node_id)
                continue
            self._open += 1
            self._connections.start_soon(self._serve, stream, node_id)

    def _refuse(self, stream: trio.SocketStream, node_id: int | None) -> None:
        """Close a connection beyond ``max-connections`` at once (a reset, no handshake)."""
        metrics.REFUSED_CONNECTIONS.labels(node_label(node_id)).inc()
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_SECONDS:
            log.warning("max-connections (%d) open: closed %d new connection(s) on %s since "
                        "the last report", self.config.max_connections, self._refused,
                        _describe(node_id))
            self._refusal_logged, self._refused = now, 0
        with contextlib.suppress(OSError):
            stream.socket.close()
        if self.connection_refused is not None:
            self.connection_refused()

    async def _serve(self, client: trio.SocketStream, node_id: int | None) -> None:
        try:
            await self._serve_open(client, node_id)
        finally:
            self._open -= 1

    async def _serve_open(self, accepted: trio.SocketStream, node_id: int | None) -> None:
        peer = _peer(accepted)
        name = f"{peer} -> {_describe(node_id)}"
        policy = self.security.listener(node_id == FLEET_NODE)
        session = Session(node_label(node_id))
        client: trio.abc.Stream = accepted
        if policy.tls is not None:
            terminated = await self._terminate_tls(accepted, policy, name)
            if terminated is None:
                metrics.TLS_REFUSED.labels(node_label(node_id)).inc()
                await accepted.aclose()
                return
            client = terminated
            session.tls, session.tls_subject = True, peer_subject(terminated)
        session.fleet_peer = node_id == FLEET_NODE and policy.fleet_peer
        try:
            upstream = await self._connect_upstream(node_id, peer)
        except Exception:
            log.exception("%s: connecting upstream failed unexpectedly", peer)
            upstream = None
        if upstream is None:
            await client.aclose()
            if self.connection_refused is not None:
                self.connection_refused()
            return
        router = made = self.router_factory(self, node_id, _client_host(accepted), session)
        if policy.sasl:
            router = SaslGate(router, session, name=name,
                              is_fleet_user=(self.security.is_fleet_user
                                             if node_id == FLEET_NODE else None),
                              fleet_only=policy.fleet_users is not None)
        conn = Connection(
            client,
            upstream,
            router,
            max_frame_bytes=self.config.max_frame_bytes,
            max_in_flight=self.config.max_in_flight,
            name=name,
            max_held_response_bytes=self.config.max_held_response_bytes,
            max_examined_request_bytes=self.config.max_examined_request_bytes,
            examined_budget=self.examined_budget,
            held=self.held,
            examined_read_seconds=self.config.examined_read_timeout,
            splice=self.config.splice,
            traffic=metrics.traffic(node_label(node_id)),
        )
        self.active.add(conn)
        active = metrics.ACTIVE_CONNECTIONS.labels(node_label(node_id))
        active.inc()
        try:
            await conn.run()
        except Exception:
            # A bug on one connection must not take the others down with the server's nursery.
            log.exception("%s: connection failed unexpectedly; closed", name)
        finally:
            active.dec()
            self.active.discard(conn)
            if self.connection_closed is not None:
                self.connection_closed(made, conn)
            if conn.bad_input:
                metrics.CLOSED_BAD_INPUT.labels(node_label(node_id)).inc()

    async def _terminate_tls(self, accepted: trio.SocketStream, policy: ListenerPolicy,
                             name: str) -> trio.abc.Stream | None:
        """The client's TLS, terminated with the listener's certificate; None (logged) when
        the client sends plaintext or the handshake fails."""
        assert policy.tls is not None
        with trio.move_on_after(self.config.connect_timeout):
            try:
                first = await accepted.socket.recv(1, socket.MSG_PEEK)
            except OSError as exc:
                log.debug("%s: connection failed before TLS: %r", name, exc)
                return None
            if not first:
                return None
            if first[0] != TLS_HANDSHAKE:
                log.warning("%s: closing connection: plaintext on a TLS listener (the client "
                            "must connect with TLS, security.protocol SSL or SASL_SSL)", name)
                return None
            try:
                return await handshake_server(accepted, policy.tls.current())
            except TlsError as exc:
                log.warning("%s: closing connection: %s", name, exc)
                return None
        log.info("%s: closing connection: no TLS handshake within %.0f s", name,
                 self.config.connect_timeout)
        return None

    async def _connect_upstream(self, node_id: int | None, peer: str
                                ) -> trio.abc.Stream | None:
        if node_id is None or node_id == FLEET_NODE:
            candidates = list(self.config.upstream)
        else:
            entry = self.brokers.get(node_id)
            candidates = [entry.upstream] if entry else []
        errors = []
        for host, port in candidates:
            with trio.move_on_after(self.config.connect_timeout):
                try:
                    return await self.security.open_upstream((host, port), own=False)
                except (OSError, ValueError, TlsError) as exc:  # ValueError: a malformed host
                    errors.append(f"{host}:{port}: {getattr(exc, 'strerror', None) or exc}")
                    continue
            errors.append(f"{host}:{port}: timed out")
        metrics.UPSTREAM_FAILURES.labels(node_label(node_id)).inc()
        log.warning("%s: no upstream connection for %s (%s); closing client", peer,
                    _describe(node_id), "; ".join(errors) or "broker unknown")
        return None


def node_label(node_id: int | None) -> str:
    if node_id is None:
        return "bootstrap"
    return "fleet" if node_id == FLEET_NODE else str(node_id)


def _describe(node_id: int | None) -> str:
    if node_id is None:
        return "bootstrap"
    return "the fleet listener" if node_id == FLEET_NODE else f"broker {node_id}"


def _client_host(stream: trio.SocketStream) -> str:
    try:
        return "/" + str(stream.socket.getpeername()[0])
    except OSError:
        return "/unknown"


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
