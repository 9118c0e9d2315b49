"""What the proxy does with each frame: the forwarding policy between codec and connection.

:class:`ForwardingRouter` is the :class:`proxy.connection.Router` of every client connection.
Requests: an API key no broker serves, or a version outside what the proxy advertises, closes
the connection (as a broker would); ApiVersions newer than the proxy parses gets the KIP-511
answer locally; Produce with ``acks=0`` is forwarded without reserving a response slot;
everything else is forwarded as opaque bytes. Responses: only ApiVersions (capped to what the
proxy can parse) and the responses that carry broker addresses (Metadata, FindCoordinator,
DescribeCluster, Produce v10+ and Fetch v16+ node endpoints) are decoded; the rest pass through.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from proxy import apiversions
from proxy.codec import messages
from proxy.codec._runtime import r_uv, s_tags
from proxy.codec.api_index import ApiInfo, api_index
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.connection import (
    EXAMINE,
    FORWARD,
    FORWARD_NO_RESPONSE,
    Decision,
    IncompleteHeader,
    Local,
    RejectRequest,
    RequestInfo,
)
from proxy.metrics import RequestCounters
from proxy.rewrite import AddressMap, needs_rewrite, rewrite_response

_INT16 = struct.Struct(">h")

Rewriter = Callable[[memoryview], bytes | None]


FETCH_WITHOUT_NODE_ENDPOINTS = 15
"""Fetch v16 added KIP-951 node endpoints, which must be found at the end of the response."""
SASL_HANDSHAKE_MIN_VERSION = 1
"""SaslHandshake v0 is followed by raw SASL tokens without Kafka framing, which the proxy
cannot carry."""
_PRODUCE, _API_VERSIONS = ApiKey.PRODUCE, ApiKey.API_VERSIONS
"""Bound once for the per-request paths: an enum attribute costs a metaclass lookup."""
NOT_FORWARDED = frozenset({ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_DESCRIBE,
                           ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE})
"""Share groups (KIP-932): ShareFetch and ShareAcknowledge responses carry broker addresses
(NodeEndpoints) that no rewriter handles yet, so the share-group APIs are not offered."""


def parse_table(*, fetch_node_endpoints: bool = False) -> dict[int, tuple[int, int]]:
    """Versions the proxy accepts per API key: decoded APIs capped by their schemas, the
    others by the API index (old versions below the index minimum stay forwardable).

    Without ``fetch_node_endpoints`` Fetch is capped at v15: its responses then carry no broker
    address and stream through the proxy unexamined (see docs/decisions/0005-fetch-cut-through.md).
    """
    table = {key: (0, info.max_version) for key, info in api_index().items()
             if key not in NOT_FORWARDED}
    table.update(apiversions.default_parse_table())
    lo, hi = table[ApiKey.SASL_HANDSHAKE]
    table[ApiKey.SASL_HANDSHAKE] = (max(lo, SASL_HANDSHAKE_MIN_VERSION), hi)
    if not fetch_node_endpoints:
        lo, hi = table[ApiKey.FETCH]
        table[ApiKey.FETCH] = (lo, min(hi, FETCH_WITHOUT_NODE_ENDPOINTS))
    return table


class ForwardingRouter:
    """Per-connection routing decisions; shares the address map of the whole server."""

    __slots__ = ("_accepted", "_address_map", "_bridged", "_broker_newest", "_counters",
                 "_index", "_served")

    def __init__(self, address_map: AddressMap, counters: RequestCounters,
                 accepted: dict[int, tuple[int, int]],
                 served: dict[int, tuple[int, int]] | None = None,
                 bridged: dict[int, int] | None = None) -> None:
        """``served``: APIs the proxy answers itself, advertised with these version ranges
        whatever the broker says; ``bridged``: APIs offered one version beyond the broker's
        (see :func:`proxy.apiversions.client_view`), which the subclass must then send as the
        older version where the broker lacks the newer (:meth:`broker_version`)."""
        self._address_map = address_map
        self._counters = counters
        self._accepted = accepted
        self._served = served or {}
        self._bridged = bridged or {}
        self._broker_newest: dict[int, int] = {}
        """The newest version of each API the broker behind this connection said it serves
        (its ApiVersions answer to the client; empty before it)."""
        self._index = api_index()

    # -- requests ---------------------------------------------------------------------------

    def classify(self, request: RequestInfo) -> int:
        key = request.api_key
        self._counters.inc(key)
        versions = self._accepted.get(key)
        if versions is None:
            raise RejectRequest(f"unknown API key {key}")
        if not versions[0] <= request.api_version <= versions[1]:
            if key == _API_VERSIONS and request.api_version > versions[1]:
                return EXAMINE
            info = self._index.get(key)
            name = info.name if info else str(key)
            raise RejectRequest(f"unsupported version {request.api_version} of {name} "
                                f"(api key {key}); the proxy accepts {versions[0]}-{versions[1]}")
        if key == _PRODUCE and produce_acks(request, self._index[_PRODUCE]) == 0:
            return FORWARD_NO_RESPONSE
        return FORWARD

    def decide(self, request: RequestInfo) -> Decision:
        # Only ApiVersions newer than the proxy knows is classified EXAMINE here.
        return Local(apiversions.unsupported_version_response(request.correlation_id))

    def broker_version(self, api_key: int, version: int) -> int:
        """The version to send a request of ``version`` as to this connection's broker: the
        older one of a :data:`~proxy.apiversions.BRIDGED` API where the broker said it lacks
        ``version``, else ``version``."""
        older = self._bridged.get(api_key)
        if older is None or version != older + 1:
            return version
        newest = self._broker_newest.get(api_key)
        return older if newest is not None and newest < version else version

    def decide_oversized(self, request: RequestInfo) -> int:
        raise RejectRequest("the proxy must answer it itself")

    # -- responses --------------------------------------------------------------------------

    def response_rewriter(self, api_key: int, api_version: int) -> Rewriter | None:
        if api_key == _API_VERSIONS:
            return lambda payload: self._rewrite_api_versions(api_version, payload)
        if needs_rewrite(api_key, api_version):
            return lambda payload: self._rewrite_addresses(api_key, api_version, payload)
        return None

    def _rewrite_addresses(self, api_key: int, api_version: int, payload: memoryview
                           ) -> bytes | None:
        start = body_offset(payload, messages.response_header_version(api_key, api_version))
        body = payload[start:]
        new_body = rewrite_response(api_key, api_version, body, self._address_map)
        if new_body is body:
            return None
        return bytes(payload[:start]) + bytes(new_body)

    def _rewrite_api_versions(self, api_version: int, payload: memoryview) -> bytes | None:
        # ApiVersions responses use header v0; a non-zero error code means a v0 body (KIP-511).
        body = payload[4:]
        if len(body) >= 2 and _INT16.unpack_from(body, 0)[0] != 0:
            return None
        value, _ = messages.decode_response(ApiKey.API_VERSIONS, api_version, body)
        if self._bridged:
            self._broker_newest = {e["api_key"]: e["max_version"] for e in value["api_keys"]}
        view = apiversions.client_view(value, self._accepted, self._served, self._bridged)
        view["api_keys"] = [e for e in view["api_keys"] if e["api_key"] in self._accepted]
        return bytes(payload[:4]) + messages.encode_response(ApiKey.API_VERSIONS, api_version, view)


def body_offset(payload: memoryview, header_version: int) -> int:
    if header_version == 0:
        return 4
    try:
        return s_tags(payload, 4)
    except (IndexError, ValueError, struct.error) as exc:
        raise CodecError(f"bad response header tagged fields: {exc}") from exc


def produce_acks(request: RequestInfo, info: ApiInfo) -> int:
    """The ``acks`` of a Produce request, read from the raw frame without decoding it."""
    frame = request.frame
    version = request.api_version
    try:
        (client_id_len,) = _INT16.unpack_from(frame, 8)
        pos = 10 + max(client_id_len, 0)
        if info.is_flexible(version):
            pos = s_tags(frame, pos)
        if version >= 3:  # transactional_id comes first
            if info.is_flexible(version):
                length, pos = r_uv(frame, pos)
                pos += max(length - 1, 0)
            else:
                (length,) = _INT16.unpack_from(frame, pos)
                pos += 2 + max(length, 0)
        (acks,) = _INT16.unpack_from(frame, pos)
    except (struct.error, IndexError, ValueError) as exc:
        if not request.complete:
            raise IncompleteHeader from exc
        raise RejectRequest(f"malformed Produce request header: {exc}") from exc
    return int(acks)
