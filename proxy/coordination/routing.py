"""The connection router when the proxy coordinates KIP-848 groups.

:class:`CoordinatingRouter` is a :class:`~proxy.router.ForwardingRouter` that answers group
requests itself when they concern a group the proxy coordinates, and forwards everything else
untouched:

* ConsumerGroupHeartbeat and ConsumerGroupDescribe: always answered by the engine (the broker
  behind the proxy has no KIP-848 coordinator); ApiVersions advertises them as v0-v1;
* OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete and DescribeGroups: answered here
  when they name a coordinated group (:mod:`proxy.coordination.offsets`,
  :mod:`proxy.coordination.listing`);
* ListGroups: merged with the engine's groups while the proxy coordinates any.

A group becomes coordinated when a ConsumerGroupHeartbeat joins it and the proxy could take
the broker's classic group of that id.

Classic-protocol requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup):

* with ``classic-translation`` off they always go to the broker: for a coordinated group the
  broker itself refuses a classic client with INCONSISTENT_GROUP_PROTOCOL, because the proxy's
  member holds the group with a protocol no client offers (what Kafka 4.x does for a consumer
  group when online migration is disabled);
* with it on (:mod:`proxy.coordination.classic`), SyncGroup, Heartbeat and LeaveGroup of a
  group the engine has or the proxy coordinates are answered by the engine's classic-member
  translation, and so is every JoinGroup of such a group plus the JoinGroups
  :func:`~translation.classic.routing.classify_classic_join` lets the engine take (a
  ``consumer`` protocol with a known client assignor, the broker's group not held by direct
  members). The rest (Kafka Connect, custom assignors, members of the broker's own groups)
  is forwarded untouched. A classic JoinGroup that the engine takes for a new group takes the
  broker's group over first, as a first ConsumerGroupHeartbeat does.

The request is decoded in :meth:`classify` (which must decide from the group id) and the
decoded value is kept for the :meth:`answer` call that immediately follows for LOCAL requests;
the answer is an awaitable, so the connection keeps forwarding while the engine or the broker
works on it, and the response orderer keeps the responses in request order.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from proxy.codec import messages
from proxy.codec.errors import CodecError
from proxy.codec.header import parse_request_header, response_header_for
from proxy.connection import FORWARD, LOCAL, LocalAnswer, RejectRequest, RequestInfo
from proxy.coordination import classic, listing, offsets, wire
from proxy.coordination.service import CoordinatorService
from proxy.metrics import RequestCounters
from proxy.rewrite import AddressMap
from proxy.router import ForwardingRouter
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

HEARTBEAT, DESCRIBE = wire.CONSUMER_GROUP_HEARTBEAT, wire.CONSUMER_GROUP_DESCRIBE
OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT, OFFSET_DELETE = 8, 9, 28, 47
LIST_GROUPS, DESCRIBE_GROUPS = 16, 15
SERVED: dict[int, tuple[int, int]] = {HEARTBEAT: (0, 1), DESCRIBE: (0, 1)}
"""APIs the proxy serves itself and the versions it advertises for them."""
EXAMINED = frozenset({HEARTBEAT, DESCRIBE, OFFSET_COMMIT, OFFSET_FETCH, TXN_OFFSET_COMMIT,
                      OFFSET_DELETE, LIST_GROUPS, DESCRIBE_GROUPS}) | classic.CLASSIC_KEYS
UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)

Pending = tuple[int, int, int, str | None, dict[str, Any]]


class CoordinatingRouter(ForwardingRouter):
    """Per-connection routing with the coordinator service behind it."""

    __slots__ = ("_node_id", "_pending", "_service")

    def __init__(self, address_map: AddressMap, counters: RequestCounters,
                 accepted: dict[int, tuple[int, int]], service: CoordinatorService,
                 node_id: int | None) -> None:
        super().__init__(address_map, counters, accepted, SERVED)
        self._service = service
        self._node_id = node_id
        self._pending: Pending | None = None

    def classify(self, request: RequestInfo) -> int:
        action = super().classify(request)
        key = request.api_key
        if action != FORWARD or key not in EXAMINED:
            return action
        version = request.api_version
        try:
            header = parse_request_header(request.frame)
            value, _ = messages.decode_request(key, version, request.frame, header.header_length)
        except CodecError as exc:
            raise RejectRequest(f"malformed request (api key {key} v{version}): {exc}") from exc
        if key in classic.CLASSIC_KEYS:
            if not classic.is_local(self._service, key, version, header.client_id, value):
                return FORWARD
        elif not self._is_local(key, version, value):
            return FORWARD
        self._pending = (request.correlation_id, key, version, header.client_id, value)
        return LOCAL

    def _is_local(self, key: int, version: int, value: dict[str, Any]) -> bool:
        service = self._service
        if key in (HEARTBEAT, DESCRIBE):
            return True
        if key in (OFFSET_COMMIT, TXN_OFFSET_COMMIT, OFFSET_DELETE):
            return service.coordinates(value["group_id"])
        if key == OFFSET_FETCH:
            if version < 8:
                return service.coordinates(value["group_id"])
            return any(service.coordinates(g["group_id"]) for g in value["groups"])
        if key == DESCRIBE_GROUPS:
            return any(service.coordinates(g) for g in value["groups"])
        if key == LIST_GROUPS:
            return service.has_groups
        return False

    def answer(self, request: RequestInfo) -> LocalAnswer:
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != request.correlation_id:
            return super().answer(request)  # ApiVersions newer than the proxy knows
        return self._respond(*pending)

    async def _respond(self, correlation_id: int, key: int, version: int,
                       client_id: str | None, value: dict[str, Any]) -> bytes:
        header = response_header_for(key, version, correlation_id)
        try:
            body = await self._handle(key, version, client_id, value)
            return header + messages.encode_response(key, version, body)
        except Exception:  # answer with an error rather than leave the client waiting
            log.exception("answering api key %d v%d failed", key, version)
            return header + messages.encode_response(key, version,
                                                     _failure(key, version, value))

    def _handle(self, key: int, version: int, client_id: str | None, value: dict[str, Any]
                ) -> Awaitable[dict[str, Any]]:
        service = self._service
        address = service.node_address(self._node_id)
        if key in classic.CLASSIC_KEYS:
            return classic.answer(service, key, version, client_id, value)
        if key == HEARTBEAT:
            return self._heartbeat(version, client_id, value)
        if key == DESCRIBE:
            return _ready(wire.describe_response(service.engine.describe(value["group_ids"])))
        if key == OFFSET_COMMIT:
            return offsets.offset_commit(service, version, value)
        if key == TXN_OFFSET_COMMIT:
            return offsets.txn_offset_commit(service, version, value)
        if key == OFFSET_FETCH:
            return offsets.offset_fetch(service, version, value, address)
        if key == OFFSET_DELETE:
            return offsets.offset_delete(service, version, value)
        if key == LIST_GROUPS:
            return listing.list_groups(service, version, value, self._node_id, address)
        return listing.describe_groups(service, version, value, address)

    async def _heartbeat(self, version: int, client_id: str | None, value: dict[str, Any]
                         ) -> dict[str, Any]:
        request = wire.heartbeat_request(value, client_id=client_id,
                                         client_host=wire.UNKNOWN_CLIENT_HOST,
                                         api_version=version)
        return wire.heartbeat_response(await self._service.heartbeat(request))


async def _ready(value: dict[str, Any]) -> dict[str, Any]:
    return value


def _failure(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """An UNKNOWN_SERVER_ERROR response for a request whose handler failed."""
    error = UNKNOWN_SERVER_ERROR
    if key in classic.CLASSIC_KEYS:
        return classic.failure(key, version, value, error)
    if key == HEARTBEAT:
        return wire.heartbeat_error(error, "internal error in groupgate")
    if key == DESCRIBE:
        return {"groups": [{"error_code": error, "group_id": g, "members": []}
                           for g in value["group_ids"]]}
    if key in (OFFSET_COMMIT, TXN_OFFSET_COMMIT):
        return offsets.commit_error(value, error)
    if key == OFFSET_FETCH:
        if version < 8:
            return {"topics": [], "error_code": error}
        return {"groups": [{"group_id": g["group_id"], "topics": [], "error_code": error}
                           for g in value["groups"]]}
    if key == OFFSET_DELETE:
        return {"error_code": error, "topics": []}
    if key == LIST_GROUPS:
        return {"error_code": error, "groups": []}
    return {"groups": [{"error_code": error, "group_id": g, "group_state": "",
                        "protocol_type": "", "protocol_data": "", "members": []}
                       for g in value["groups"]]}

