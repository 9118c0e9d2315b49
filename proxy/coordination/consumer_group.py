"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: the KIP-848 APIs the proxy always serves.

A classic broker has no KIP-848 coordinator, so these go upstream only for a group handed to
Kafka 4.x's own coordinator (below); otherwise the engine answers
them (through the coordinator service, which may first take the broker's group over or wait
for topic metadata), and ApiVersions advertises them as v0-v1 whatever the broker says. A group
in the broker phase (its members bridged into the broker's classic group, :mod:`.bridged`) is
described as Kafka 4.x describes a classic group: GROUP_ID_NOT_FOUND, with a message saying so.
A group handed to Kafka 4.x's own KIP-848 coordinator (:mod:`.native_exit`) is the broker's:
its requests go there untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.codec.api_keys import ApiKey
from proxy.coordination import convert, native_exit
from proxy.coordination.handler import Answer, ApiHandler, GroupRequest, Outcome, Value
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

VERSIONS = (0, 1)
"""What the proxy advertises for both."""


class ConsumerGroupHeartbeatHandler(ApiHandler):
    api_key = ApiKey.CONSUMER_GROUP_HEARTBEAT
    served_versions = VERSIONS

    def decide(self, request: GroupRequest) -> Outcome:
        if (native := native_exit.heartbeat_outcome(self.service, request)) is not None:
            return native  # the group is the broker's KIP-848 coordinator's
        return Answer(self._heartbeat(request))

    async def _heartbeat(self, request: GroupRequest) -> Value:
        engine_request = convert.consumer_group_heartbeat_request(
            request.value, request.version, client_id=request.client_id,
            client_host=request.client_host, topic_rights=request.topic_rights)
        response = await self.service.heartbeat(engine_request)
        return convert.consumer_group_heartbeat_response(response)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return convert.consumer_group_heartbeat_error(error, "internal error in groupgate")


class ConsumerGroupDescribeHandler(ApiHandler):
    api_key = ApiKey.CONSUMER_GROUP_DESCRIBE
    served_versions = VERSIONS

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        return tuple(request.value["group_ids"])

    def decide(self, request: GroupRequest) -> Outcome:
        if (native := native_exit.describe_outcome(self.service, request)) is not None:
            return native
        value = convert.consumer_group_describe_response(
            self.service.engine.describe(request.value["group_ids"]))
        bridges = self.service.bridges
        for group in value["groups"]:
            group_id = group["group_id"]
            if bridges.has_group(group_id) and group_id not in self.service.engine.groups:
                # a classic group at the broker: Kafka 4.x answers the same for one
                group.update(error_code=int(ErrorCode.GROUP_ID_NOT_FOUND), members=[],
                             error_message=bridged_description(group_id,
                                                               bridges.group_size(group_id)))
        return Answer(value)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"groups": [{"error_code": error, "group_id": g, "members": []}
                           for g in request.value["group_ids"]]}


def bridged_description(group_id: str, members: int) -> str:
    """What ConsumerGroupDescribe says of a group in the broker phase."""
    return (f"Group {group_id} is not a consumer group: it is a classic group coordinated by "
            f"the broker, where clients connected straight to it are members; {members} "
            "KIP-848 member(s) behind this groupgate take part in it as classic members "
            "(client id gg3|...); DescribeGroups shows them all")


HANDLERS: tuple[Callable[[CoordinatorService], ApiHandler], ...] = (
    ConsumerGroupHeartbeatHandler, ConsumerGroupDescribeHandler)
