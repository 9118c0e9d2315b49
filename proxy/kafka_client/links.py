"""The proxy's own request/response connections to brokers, shared by the coordination tasks.

A :class:`BrokerLink` wraps one :class:`~proxy.upstream.UpstreamClient` to one broker address
behind a lock (the client sends one request at a time and counts its own correlation ids, so
these connections never mix with client connections). It connects lazily, and after any
transport error it drops the connection so that the next request reconnects. A connection with a
request that failed, timed out or was abandoned (cancelled) before its answer came is reset
(SO_LINGER 0), never closed gracefully: the other end must not read that request later and
carry it out after newer ones (a commit relayed for a client that gave up on it).
:class:`LinkPool` keeps one link per broker address.

Security. A pool (or link) given a :class:`~proxy.security.policy.Security` opens every link
as the cluster wants it: TLS, then SASL with the proxy's own identity. A link leads either to a
broker or to another sidecar's fleet listener, which have different certificates and
authentication (``fleet-auth``): :meth:`LinkPool.link` and :meth:`LinkPool.dedicated` lead to
brokers, :meth:`LinkPool.peer` to a sidecar.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import trio

from proxy.upstream import UpstreamClient, UpstreamError

if TYPE_CHECKING:
    from proxy.security.policy import Security

log = logging.getLogger("groupgate.coordination")

Address = tuple[str, int]
T = TypeVar("T")

BROKER: Final = "broker"
PEER: Final = "peer"
"""What a link leads to: a broker, or another sidecar's fleet listener."""
PEER_CONNECT_SECONDS: Final = 2.0
"""Longest a connect to another sidecar's fleet listener may take (at most ``connect-timeout``):
sidecars of one group share a cluster network, and a relay waiting longer would keep the
member's request from the coordinating sidecar (docs/operations.md, "How long a request can
wait")."""


class BrokerLink:
    """One lazily opened connection to ``address``; requests are serialized."""

    def __init__(self, address: Address, *, connect_timeout: float, request_timeout: float,
                 max_frame_bytes: int, security: Security | None = None,
                 leads_to: str = BROKER) -> None:
        self.address = address
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._max_frame_bytes = max_frame_bytes
        self._client: UpstreamClient | None = None
        self._lock = trio.Lock()
        self._security = security
        self.leads_to = leads_to
        """:data:`BROKER` or :data:`PEER`."""

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        """Send one request and return the decoded response; UpstreamError on any failure."""
        def send(client: UpstreamClient) -> Awaitable[dict[str, Any]]:
            return (client.request(api_key, version, value) if client_id is None
                    else client.request(api_key, version, value, client_id))

        return await self._call(api_key, version, timeout, send)

    async def exchange_raw(self, api_key: int, version: int, body: bytes, *,
                           timeout: float | None = None) -> bytes:
        """Send one request whose body the codec does not know (the fleet's ``FleetControl``)
        and return its response body; UpstreamError on any failure."""
        return await self._call(api_key, version, timeout,
                                lambda client: client.exchange_raw(api_key, version, body))

    async def _call(self, api_key: int, version: int, timeout: float | None,
                    send: Callable[[UpstreamClient], Awaitable[T]]) -> T:
        async with self._lock:
            if self._client is None:
                self._client = await UpstreamClient.connect(
                    self.address, timeout=self._connect_timeout,
                    max_frame_bytes=self._max_frame_bytes, security=self._security,
                    peer=self.leads_to == PEER)
            client = self._client
            ok = False
            try:
                with trio.fail_after(timeout or self._request_timeout):
                    response = await send(client)
                ok = True
                return response
            except trio.TooSlowError as exc:
                raise UpstreamError(f"{self.address[0]}:{self.address[1]}: request "
                                    f"{api_key} v{version} timed out") from exc
            finally:
                if not ok:
                    # Failed, timed out or abandoned (the client connection it was relayed for
                    # closed, cancelling it): the request may sit unread at the other end. Reset
                    # the connection so that it is never carried out later, after requests the
                    # client sends meanwhile on another connection (a commit it gave up on
                    # landing after its newer ones; see :func:`~proxy.upstream.reset_on_close`).
                    self._client = None
                    with trio.CancelScope(shield=True):
                        await client.reset()

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


class LinkPool:
    """One :class:`BrokerLink` per broker address."""

    def __init__(self, *, connect_timeout: float, request_timeout: float,
                 max_frame_bytes: int, security: Security | None = None) -> None:
        self._links: dict[Address, BrokerLink] = {}
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._max_frame_bytes = max_frame_bytes
        self._security = security

    def _new(self, address: Address, request_timeout: float, leads_to: str) -> BrokerLink:
        connect_timeout = (min(self._connect_timeout, PEER_CONNECT_SECONDS) if leads_to == PEER
                           else self._connect_timeout)
        return BrokerLink(address, connect_timeout=connect_timeout,
                          request_timeout=request_timeout, max_frame_bytes=self._max_frame_bytes,
                          security=self._security, leads_to=leads_to)

    def link(self, address: Address) -> BrokerLink:
        """The shared link to the broker at ``address``."""
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = self._new(address, self._request_timeout, BROKER)
        return link

    def dedicated(self, address: Address, request_timeout: float) -> BrokerLink:
        """A link of its own (not shared) to the broker at ``address``, e.g. for requests
        that may block for long."""
        return self._new(address, request_timeout, BROKER)

    def peer(self, address: Address, request_timeout: float) -> BrokerLink:
        """A link of its own to another sidecar's fleet listener."""
        return self._new(address, request_timeout, PEER)

    async def aclose(self) -> None:
        for link in self._links.values():
            await link.aclose()
        self._links.clear()
