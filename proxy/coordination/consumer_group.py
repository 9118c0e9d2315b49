"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: the KIP-848 APIs the proxy always serves.

A classic broker has no KIP-848 coordinator, so these never go upstream: the engine answers
them (through the coordinator service, which may first take the broker's group over or wait
for topic metadata), and ApiVersions advertises them as v0-v1 whatever the broker says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.codec.api_keys import ApiKey
from proxy.coordination import convert
from proxy.coordination.handler import Answer, ApiHandler, GroupRequest, Outcome, Value

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

VERSIONS = (0, 1)
"""What the proxy advertises for both."""


class ConsumerGroupHeartbeatHandler(ApiHandler):
    api_key = ApiKey.CONSUMER_GROUP_HEARTBEAT
    served_versions = VERSIONS

    def decide(self, request: GroupRequest) -> Outcome:
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
        return Answer(convert.consumer_group_describe_response(
            self.service.engine.describe(request.value["group_ids"])))

    def failure(self, request: GroupRequest, error: int) -> Value:
        return {"groups": [{"error_code": error, "group_id": g, "members": []}
                           for g in request.value["group_ids"]]}


HANDLERS: tuple[Callable[[CoordinatorService], ApiHandler], ...] = (
    ConsumerGroupHeartbeatHandler, ConsumerGroupDescribeHandler)
