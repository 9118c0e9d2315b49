"""Stepped down, on both lists: a member of a group this sidecar let go waits for the next one.

A sidecar that is stopping writes its groups' state and leaves them for the next coordinator to
load. A request of a member of such a group (an engine member's id, not a broker's) is answered
COORDINATOR_NOT_AVAILABLE, never passed to the broker, whose group of that id is the fleet's lock
and would answer UNKNOWN_MEMBER_ID: the client keeps its partitions until it reaches the next
coordinator (:meth:`~..service.CoordinatorService.stepped_down_from`).
"""

from __future__ import annotations

from proxy.codec.api_keys import ApiKey
from proxy.connection import Decision, Local
from proxy.coordination.stages.stage import Passage, Stage
from translation.errors import ErrorCode

COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)


class SteppedDown(Stage):
    """Answers a stepped-down group's member COORDINATOR_NOT_AVAILABLE."""

    __slots__ = ()

    apis = frozenset({ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT, ApiKey.HEARTBEAT,
                      ApiKey.SYNC_GROUP, ApiKey.JOIN_GROUP})
    """Requests that carry a member id the broker checks: passed to the broker for a group the
    engine no longer serves, an engine member's would be refused UNKNOWN_MEMBER_ID."""

    def request(self, passage: Passage) -> Decision | None:
        value = passage.request.value
        if passage.chain.service.stepped_down_from(value.get("group_id") or "",
                                                   value.get("member_id") or ""):
            handler, request = passage.handler, passage.request
            return Local(passage.chain.encode(handler, request, handler.failure(
                request, COORDINATOR_NOT_AVAILABLE)))
        return None
