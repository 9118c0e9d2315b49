"""Classic group requests answered by the proxy: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

With ``classic-translation`` on, :class:`~proxy.coordination.routing.CoordinatingRouter` sends
the classic requests of groups the engine serves here (and the JoinGroups the engine may take,
see :meth:`~proxy.coordination.service.CoordinatorService.takes_join`). Each function maps the
decoded wire value onto the engine's classic dataclasses with :mod:`proxy.classic_bridge`,
calls the service (which runs the engine's
:class:`~translation.classic.coordinator.ClassicGroupCoordinator` and handles its effects) and
maps the answer back to a response value at the client's version. JoinGroup may wait for the
takeover of the broker's group, a topic metadata refresh, or a held (deferred) join; SyncGroup
for the release of the partitions its member waits for (a held sync).

:func:`failure` gives the UNKNOWN_SERVER_ERROR response of each API for a handler that failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy import classic_bridge as bridge
from proxy.coordination import wire
from translation.classic.messages import (
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupResponse,
    SyncGroupResponse,
)

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
CLASSIC_KEYS = frozenset({JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP})


def join_request(version: int, client_id: str | None, value: dict[str, Any]
                 ) -> JoinGroupRequest:
    return bridge.join_group_request(value, version, client_id=client_id,
                                     client_host=wire.UNKNOWN_CLIENT_HOST)


def is_local(service: CoordinatorService, key: int, version: int, client_id: str | None,
             value: dict[str, Any]) -> bool:
    """Whether the engine answers this classic request (False: forward it untouched)."""
    if service.classic is None:
        return False
    if key == JOIN_GROUP:
        try:
            request = join_request(version, client_id, value)
        except bridge.BridgeError:
            return False
        return service.takes_join(request)
    return service.serves_classic(value["group_id"])


async def answer(service: CoordinatorService, key: int, version: int, client_id: str | None,
                 value: dict[str, Any]) -> dict[str, Any]:
    if key == JOIN_GROUP:
        response = await service.join_group(join_request(version, client_id, value))
        return bridge.join_group_response(response, version)
    if key == SYNC_GROUP:
        return bridge.sync_group_response(
            await service.sync_group(bridge.sync_group_request(value, version)), version)
    if key == HEARTBEAT:
        return bridge.heartbeat_response(
            service.classic_heartbeat(bridge.heartbeat_request(value, version)), version)
    return bridge.leave_group_response(
        service.leave_group(bridge.leave_group_request(value, version)), version)


def failure(key: int, version: int, value: dict[str, Any], error: int) -> dict[str, Any]:
    """The response of a classic request failing with ``error``."""
    if key == JOIN_GROUP:
        return bridge.join_group_response(
            JoinGroupResponse(error_code=error, member_id=value.get("member_id", "")), version)
    if key == SYNC_GROUP:
        return bridge.sync_group_response(SyncGroupResponse(error_code=error), version)
    if key == HEARTBEAT:
        return bridge.heartbeat_response(HeartbeatResponse(error_code=error), version)
    return bridge.leave_group_response(LeaveGroupResponse(error_code=error), version)
