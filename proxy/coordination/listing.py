"""ListGroups and DescribeGroups with coordinated groups next to the broker's own groups.

The broker knows a coordinated group only as the classic group the proxy holds for it
(protocol ``groupgate-coordinated``); the engine knows the real one. So:

* ListGroups asks the broker for all its groups (without filters, which it could not apply
  to the engine's states and types), drops the broker's entries for coordinated groups, adds
  the engine's groups (type ``consumer``, KIP-848 states: Empty, Assigning, Reconciling,
  Stable) on the connection of the broker that coordinates them (admin clients ask every
  broker and concatenate the answers, so listing them everywhere would duplicate them), then
  applies the request's state and type filters (case-insensitive, as Kafka does) to the
  merged list;
* DescribeGroups answers a coordinated group as Kafka 4.x answers it for a consumer-protocol
  group (it is not a classic group): GROUP_ID_NOT_FOUND with a message from v6, state Dead
  with no error before; other groups of the same request are described by the broker. Admin
  clients describe consumer groups with ConsumerGroupDescribe first and fall back to
  DescribeGroups only for classic groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.coordination.links import Address
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

LIST_GROUPS, DESCRIBE_GROUPS = 16, 15


def engine_listing(service: CoordinatorService, node_id: int | None) -> list[dict[str, Any]]:
    """The engine's groups coordinated through broker ``node_id`` (None: all of them)."""
    out = []
    for g in service.engine.list_groups():
        membership = service.membership(g.group_id)
        if membership is None:
            continue
        if node_id is not None and membership.coordinator_node != node_id:
            continue
        out.append({"group_id": g.group_id, "protocol_type": g.protocol_type,
                    "group_state": g.group_state, "group_type": g.group_type})
    return out


def merge_listing(broker_groups: list[dict[str, Any]], engine_groups: list[dict[str, Any]],
                  coordinated: set[str], states: list[str], types: list[str]
                  ) -> list[dict[str, Any]]:
    """Broker entries minus coordinated ids, plus the engine's, filtered (sans-I/O)."""
    merged = [g for g in broker_groups if g["group_id"] not in coordinated] + engine_groups
    wanted_states = {s.lower() for s in states}
    wanted_types = {t.lower() for t in types}
    return [g for g in merged
            if (not wanted_states or str(g.get("group_state", "")).lower() in wanted_states)
            and (not wanted_types or str(g.get("group_type", "")).lower() in wanted_types)]


async def list_groups(service: CoordinatorService, version: int, value: dict[str, Any],
                      node_id: int | None, address: Address) -> dict[str, Any]:
    upstream = dict(value, states_filter=[], types_filter=[])
    try:
        response = await service.pool.link(address).request(LIST_GROUPS, version, upstream)
    except UpstreamError:
        return {"throttle_time_ms": 0, "error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                "groups": []}
    coordinated = {gid for gid in service.memberships if service.coordinates(gid)}
    response["groups"] = merge_listing(response["groups"], engine_listing(service, node_id),
                                       coordinated, value.get("states_filter") or [],
                                       value.get("types_filter") or [])
    return response


def not_classic(group_id: str, version: int) -> dict[str, Any]:
    """DescribeGroups entry for a group that is not a classic group (Kafka 4.x)."""
    if version >= 6:
        return {"error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                "error_message": f"Group {group_id} is not a classic group.",
                "group_id": group_id, "group_state": "Dead", "protocol_type": "",
                "protocol_data": "", "members": []}
    return {"error_code": 0, "group_id": group_id, "group_state": "Dead", "protocol_type": "",
            "protocol_data": "", "members": []}


async def describe_groups(service: CoordinatorService, version: int, value: dict[str, Any],
                          address: Address) -> dict[str, Any]:
    requested: list[str] = value["groups"]
    rest = [g for g in requested if not service.coordinates(g)]
    described: dict[str, dict[str, Any]] = {}
    if rest:
        try:
            response = await service.pool.link(address).request(
                DESCRIBE_GROUPS, version, dict(value, groups=rest))
            described = {g["group_id"]: g for g in response["groups"]}
        except UpstreamError:
            described = {g: {"error_code": int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                             "group_id": g, "group_state": "", "protocol_type": "",
                             "protocol_data": "", "members": []} for g in rest}
    groups = [described[g] if g in described else not_classic(g, version) for g in requested]
    return {"throttle_time_ms": 0, "groups": groups}
