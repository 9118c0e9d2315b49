"""FindCoordinator when ``fleet-routing`` is ``redirect``: clients go to the coordinating sidecar.

With the default ``forward`` routing FindCoordinator is not examined: the broker's answer is
forwarded with its address rewritten to this sidecar's listener, and group requests of groups
another sidecar holds are relayed there (:mod:`proxy.coordination.peers`). With ``redirect``
this handler answers FindCoordinator for groups itself:

* a group another fleet sidecar holds: that sidecar's fleet listener, under a node id no Kafka
  broker has (:func:`~proxy.coordination.fleet.redirect_node_id`), so that clients open a
  connection of its own for it (librdkafka and the Java client key connections by node id);
* any other group: the listener of this sidecar for the group's broker coordinator, as the
  forwarded answer would say;
* a group whose holder cannot be told (a groupgate without fleet support, the broker does not
  answer): COORDINATOR_NOT_AVAILABLE, which clients retry.

Transaction and share-group coordinators pass to the broker untouched. Decision record 0014
compares the two routings.
"""

from __future__ import annotations

from typing import Any

from proxy.codec.api_keys import ApiKey
from proxy.coordination.fleet import Address, redirect_node_id
from proxy.coordination.handler import PASS, Answer, ApiHandler, GroupRequest, Outcome, Value
from proxy.coordination.peers import LOCAL, RELAY
from translation.errors import ErrorCode

GROUP_KEY_TYPE = 0
BATCHED_FROM = 4
"""FindCoordinator v4+ asks for several keys at once (KIP-699)."""


class FindCoordinatorHandler(ApiHandler):
    api_key = ApiKey.FIND_COORDINATOR

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        return ()  # never relayed: every sidecar answers it

    def decide(self, request: GroupRequest) -> Outcome:
        if request.value.get("key_type", GROUP_KEY_TYPE) != GROUP_KEY_TYPE:
            return PASS
        return Answer(self._answer(request))

    def failure(self, request: GroupRequest, error: int) -> Value:
        return _response(request, {key: _error(error) for key in _keys(request)})

    async def _answer(self, request: GroupRequest) -> Value:
        answers: dict[str, dict[str, Any]] = {}
        for key in _keys(request):
            answers[key] = await self._coordinator(key)
        return _response(request, answers)

    async def _coordinator(self, group_id: str) -> dict[str, Any]:
        service = self.service
        membership = service.membership(group_id)
        if (membership is not None and membership.coordinator is not None
                and membership.coordinator_node is not None):
            return self._local(membership.coordinator_node, membership.coordinator)
        routes = service.routes
        holder = routes.directory.view(group_id) or await routes.directory.lookup(group_id)
        route = routes.route_for(holder)
        if route.kind == RELAY and route.address is not None:
            return _found(redirect_node_id(route.address), route.address)
        if route.kind == LOCAL and holder.coordinator is not None:
            node, address = holder.coordinator
            return self._local(node, address)
        return _error(int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                      route.reason or f"cannot tell who coordinates group {group_id}")

    def _local(self, node: int, upstream: Address) -> dict[str, Any]:
        address_map = self.service.address_map
        if address_map is None:
            return _error(int(ErrorCode.COORDINATOR_NOT_AVAILABLE), "no listeners yet")
        return _found(node, address_map.lookup(node, *upstream))


def _keys(request: GroupRequest) -> list[str]:
    value = request.value
    if request.version >= BATCHED_FROM:
        return list(value.get("coordinator_keys") or [])
    return [value.get("key") or ""]


def _found(node_id: int, address: Address) -> dict[str, Any]:
    return {"node_id": node_id, "host": address[0], "port": address[1], "error_code": 0,
            "error_message": None}


def _error(error: int, message: str | None = None) -> dict[str, Any]:
    return {"node_id": -1, "host": "", "port": -1, "error_code": error,
            "error_message": message}


def _response(request: GroupRequest, answers: dict[str, dict[str, Any]]) -> Value:
    if request.version >= BATCHED_FROM:
        return {"throttle_time_ms": 0,
                "coordinators": [dict(answer, key=key) for key, answer in answers.items()]}
    (answer,) = answers.values() if answers else (_error(int(ErrorCode.INVALID_REQUEST)),)
    return dict(answer, throttle_time_ms=0)


HANDLERS = (FindCoordinatorHandler,)
