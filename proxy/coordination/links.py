"""The proxy's own request/response connections to brokers, shared by the coordination tasks.

A :class:`BrokerLink` wraps one :class:`~proxy.upstream.UpstreamClient` to one broker address
behind a lock (the client sends one request at a time and counts its own correlation ids, so
these connections never mix with client connections). It connects lazily, and after any
transport error it drops the connection so that the next request reconnects.
:class:`LinkPool` keeps one link per broker address.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from proxy.upstream import UpstreamClient, UpstreamError

log = logging.getLogger("groupgate.coordination")

Address = tuple[str, int]


class BrokerLink:
    """One lazily opened connection to ``address``; requests are serialized."""

    def __init__(self, address: Address, *, connect_timeout: float, request_timeout: float,
                 max_frame_bytes: int) -> None:
        self.address = address
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._max_frame_bytes = max_frame_bytes
        self._client: UpstreamClient | None = None
        self._lock = trio.Lock()

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        """Send one request and return the decoded response; UpstreamError on any failure."""
        async with self._lock:
            if self._client is None:
                self._client = await UpstreamClient.connect(
                    self.address, timeout=self._connect_timeout,
                    max_frame_bytes=self._max_frame_bytes)
            client = self._client
            ok = False
            try:
                with trio.fail_after(timeout or self._request_timeout):
                    response = await (client.request(api_key, version, value)
                                      if client_id is None else
                                      client.request(api_key, version, value, client_id))
                ok = True
                return response
            except trio.TooSlowError as exc:
                raise UpstreamError(f"{self.address[0]}:{self.address[1]}: request "
                                    f"{api_key} v{version} timed out") from exc
            finally:
                if not ok:
                    self._client = None
                    with trio.CancelScope(shield=True):
                        await client.aclose()

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


class LinkPool:
    """One :class:`BrokerLink` per broker address."""

    def __init__(self, *, connect_timeout: float, request_timeout: float,
                 max_frame_bytes: int) -> None:
        self._links: dict[Address, BrokerLink] = {}
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._max_frame_bytes = max_frame_bytes

    def link(self, address: Address) -> BrokerLink:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = BrokerLink(
                address, connect_timeout=self._connect_timeout,
                request_timeout=self._request_timeout, max_frame_bytes=self._max_frame_bytes)
        return link

    def dedicated(self, address: Address, request_timeout: float) -> BrokerLink:
        """A link of its own (not shared), e.g. for requests that may block for long."""
        return BrokerLink(address, connect_timeout=self._connect_timeout,
                          request_timeout=request_timeout,
                          max_frame_bytes=self._max_frame_bytes)

    async def aclose(self) -> None:
        for link in self._links.values():
            await link.aclose()
        self._links.clear()
