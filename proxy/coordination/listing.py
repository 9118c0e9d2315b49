"""ListGroups, DescribeGroups and DeleteGroups with coordinated groups next to the broker's own.

The broker knows a coordinated group only as the classic group the proxy holds for it
(protocol ``groupgate-coordinated``, one member); the engine knows the real one. So, through
the proxy:

* ListGroups goes to the broker without filters (it could not apply them to the engine's
  states), its entries for coordinated groups are replaced by the engine's (type ``consumer``,
  KIP-848 states: Empty, Assigning, Reconciling, Stable) on the connection of the broker that
  coordinates them (admin clients ask every broker and concatenate the answers, so listing
  them everywhere would duplicate them), and the request's state and type filters
  (case-insensitive, as Kafka does) are applied to the merged list;
* DescribeGroups describes a coordinated group from the engine in the classic shape, at every
  version, so that tools that only speak DescribeGroups (kafka-consumer-groups of Kafka 3.x,
  lag exporters) see its real members and assignments: protocol type ``consumer``, protocol
  the server-side assignor, state Stable / PreparingRebalance (target being computed) /
  CompletingRebalance (members reconciling) / Empty, and per member its subscription and
  assignment encoded in the consumer protocol. Other groups of the same request are described
  by the broker;
* DeleteGroups of a coordinated group is refused with NON_EMPTY_GROUP while the engine's group
  has members (as Kafka does for any group); an empty one is forgotten by the engine, the
  proxy leaves the broker's group, and the broker deletes the group and its offsets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.coordination import remainders
from proxy.coordination.handler import (
    PASS,
    Answer,
    ApiHandler,
    GroupRequest,
    Outcome,
    Upstream,
    Value,
)
from proxy.coordination.remainders import Split
from translation.describe import DescribedGroup, DescribedTopicPartitions
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

CLASSIC_STATES = {"Empty": "Empty", "Assigning": "PreparingRebalance",
                  "Reconciling": "CompletingRebalance", "Stable": "Stable", "Dead": "Dead"}
"""The classic state a tool reading DescribeGroups is shown for each KIP-848 group state."""


def engine_listing(service: CoordinatorService, node_id: int | None) -> list[Value]:
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


def merge_listing(broker_groups: list[Value], engine_groups: list[Value],
                  coordinated: set[str], states: list[str], types: list[str]) -> list[Value]:
    """Broker entries minus coordinated ids, plus the engine's, filtered (sans-I/O)."""
    merged = [g for g in broker_groups if g["group_id"] not in coordinated] + engine_groups
    wanted_states = {s.lower() for s in states}
    wanted_types = {t.lower() for t in types}
    return [g for g in merged
            if (not wanted_states or str(g.get("group_state", "")).lower() in wanted_states)
            and (not wanted_types or str(g.get("group_type", "")).lower() in wanted_types)]


class ListGroupsHandler(ApiHandler):
    api_key = ApiKey.LIST_GROUPS

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        return ()

    def decide(self, request: GroupRequest) -> Outcome:
        service = self.service
        if not service.has_groups:
            return PASS
        value = request.value
        states = value.get("states_filter") or []
        types = value.get("types_filter") or []

        def on_response(response: Value) -> Value:
            coordinated = {gid for gid in service.memberships if service.coordinates(gid)}
            response["groups"] = merge_listing(
                response["groups"], engine_listing(service, request.node_id), coordinated,
                states, types)
            return response

        return Upstream(dict(value, states_filter=[], types_filter=[]), on_response)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"error_code": error, "groups": []}


def _consumer_protocol_partitions(items: list[DescribedTopicPartitions]) -> list[Value]:
    return [{"topic": tp.topic_name, "partitions": list(tp.partitions)} for tp in items
            if tp.topic_name]


def classic_description(group: DescribedGroup, version: int) -> Value:
    """A DescribeGroups entry for an engine group (see the module docstring)."""
    if group.error_code:
        return unknown_group(group.group_id, version)
    members = []
    for m in group.members:
        metadata = messages.encode_data("ConsumerProtocolSubscription", 0, {
            "topics": list(m.subscribed_topic_names)})
        assignment = messages.encode_data("ConsumerProtocolAssignment", 0, {
            "assigned_partitions": _consumer_protocol_partitions(m.assignment)})
        members.append({"member_id": m.member_id, "group_instance_id": m.instance_id,
                        "client_id": m.client_id, "client_host": m.client_host,
                        "member_metadata": metadata, "member_assignment": assignment})
    return {"error_code": 0, "group_id": group.group_id,
            "group_state": CLASSIC_STATES.get(group.group_state, group.group_state),
            "protocol_type": "consumer", "protocol_data": group.assignor_name,
            "members": members}


def unknown_group(group_id: str, version: int) -> Value:
    """The entry Kafka gives a group it does not know (v6+ with a message)."""
    if version >= 6:
        return {"error_code": int(ErrorCode.GROUP_ID_NOT_FOUND),
                "error_message": f"Group {group_id} not found.", "group_id": group_id,
                "group_state": "Dead", "protocol_type": "", "protocol_data": "", "members": []}
    return {"error_code": 0, "group_id": group_id, "group_state": "Dead", "protocol_type": "",
            "protocol_data": "", "members": []}


class DescribeGroupsHandler(ApiHandler):
    api_key = ApiKey.DESCRIBE_GROUPS

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        return tuple(request.value["groups"])

    def decide(self, request: GroupRequest) -> Outcome:
        return remainders.outcome(self.api_key, request.value, self.split(request))

    def split(self, request: GroupRequest) -> Split | None:
        """The coordinated groups (described by the engine) and the rest, described by the
        broker; None: no group is coordinated here."""
        service = self.service
        requested: list[str] = request.value["groups"]
        local = {i: classic_description(service.engine.describe([g])[0], request.version)
                 for i, g in enumerate(requested) if service.coordinates(g)}
        if not local:
            return None
        rest = [g for i, g in enumerate(requested) if i not in local]
        return Split(local, dict(request.value, groups=rest) if rest else None)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"groups": [{"error_code": error, "group_id": g, "group_state": "",
                            "protocol_type": "", "protocol_data": "", "members": []}
                           for g in request.value["groups"]]}


class DeleteGroupsHandler(ApiHandler):
    api_key = ApiKey.DELETE_GROUPS

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        return tuple(request.value["groups_names"])
    answers_upstream_later = True

    def decide(self, request: GroupRequest) -> Outcome:
        split = self.split(request)
        if split is None:
            return PASS
        return Answer(remainders.later(self.api_key, request.value, split))

    def split(self, request: GroupRequest) -> Awaitable[Split] | None:
        """The engine's groups, forgotten unless they have members (NON_EMPTY_GROUP), and the
        rest (with the groups forgotten: the broker deletes them and their offsets); None:
        no group is the engine's."""
        service = self.service
        requested: list[str] = request.value["groups_names"]
        mine = [i for i, g in enumerate(requested)
                if service.coordinates(g) or service.engine.group(g) is not None]
        if not mine:
            return None
        return self._delete(request, requested, mine)

    async def _delete(self, request: GroupRequest, requested: list[str], mine: list[int]
                      ) -> Split:
        local: dict[int, Value] = {}
        for index in mine:
            group_id = requested[index]
            error = await self.service.delete_group(group_id)
            if error != ErrorCode.NONE:
                local[index] = _deleted(group_id, int(error), request.version)
        rest = [g for i, g in enumerate(requested) if i not in local]
        return Split(local, dict(request.value, groups_names=rest) if rest else None)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"throttle_time_ms": 0, "results": [
            _deleted(g, error, request.version) for g in request.value["groups_names"]]}


def _deleted(group_id: str, error: int, version: int) -> Value:
    entry: dict[str, Any] = {"group_id": group_id, "error_code": error}
    if version >= 3 and error == int(ErrorCode.NON_EMPTY_GROUP):
        entry["error_message"] = "The group has members."
    return entry


HANDLERS: tuple[Callable[[CoordinatorService], ApiHandler], ...] = (
    ListGroupsHandler, DescribeGroupsHandler, DeleteGroupsHandler)
