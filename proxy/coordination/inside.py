"""While a member's request is inside this sidecar, its session does not run.

The engine keeps the rule (:mod:`translation.held_sessions`); this module tells it when a
member's request starts waiting here and when its answer leaves. It wraps the decision the
router made for a request of a known member of a group this sidecar's engine has:

* answered at once (bytes): nothing to do, the request never waited;
* answered later (an awaitable): the member is held from now until the awaitable is done,
  or, if it ends in a request sent upstream (a stamped commit), until the broker's answer
  comes back or the connection drops it;
* sent upstream at once (a :class:`~proxy.connection.Rewrite`): held until its answer or
  abandonment.

A request queued behind a held one on the same connection waits too; it belongs to the
same client, which is the member being held, so the member's session is stopped for it as
well (librdkafka and the Java client send a member's heartbeats and commits on one
coordinator connection). Requests relayed by another sidecar are held here the same way
when they arrive; the time they spend at the follower is the network's, as for Kafka.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from proxy.codec.api_keys import ApiKey
from proxy.connection import Local, Rewrite
from proxy.coordination.handler import GroupRequest

if TYPE_CHECKING:
    from proxy.connection import Decision, Payload
    from proxy.coordination.stages.stage import RouterCalls

MEMBER_APIS = frozenset({
    ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.HEARTBEAT, ApiKey.SYNC_GROUP, ApiKey.JOIN_GROUP,
    ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT})
"""APIs whose requests name one member of one group (``group_id``, ``member_id``)."""


def held_while_inside(service: RouterCalls, request: GroupRequest,
                      decision: Decision) -> Decision:
    """``decision``, changed so that the member it is for is held until it is answered."""
    if request.api_key not in MEMBER_APIS or isinstance(decision, int):
        return decision
    if isinstance(decision, Local) and isinstance(decision.answer, bytes | bytearray
                                                  | memoryview):
        return decision
    group_id = request.value.get("group_id")
    member_id = request.value.get("member_id")
    if not isinstance(group_id, str) or not isinstance(member_id, str) or not member_id:
        return decision
    if not service.request_arrived(group_id, member_id):
        return decision
    done = False

    def left() -> None:
        nonlocal done
        if not done:
            done = True
            service.request_left(group_id, member_id)

    if isinstance(decision, Rewrite):
        return _released_by(decision, left)
    if isinstance(decision, Local):
        answer = decision.answer
        assert not isinstance(answer, bytes | bytearray | memoryview)
        return dataclasses.replace(decision, answer=_then_left(answer, left))
    left()  # a Prepare: decided again once its lookup is done (held then, if at all)
    return decision


def _released_by(rewrite: Rewrite, left: Callable[[], None]) -> Rewrite:
    on_response, on_abandon = rewrite.on_response, rewrite.on_abandon

    def answered(response: memoryview) -> Payload | None:
        try:
            return on_response(response)
        finally:
            left()

    def abandoned() -> None:
        try:
            if on_abandon is not None:
                on_abandon()
        finally:
            left()

    return Rewrite(rewrite.payload, answered, abandoned)


async def _then_left(answer: Awaitable[Payload | Rewrite], left: Callable[[], None]
                     ) -> Payload | Rewrite:
    handed_on = False
    try:
        result = await answer
        if isinstance(result, Rewrite):
            handed_on = True
            return _released_by(result, left)
        return result
    finally:
        if not handed_on:
            left()
