"""Relayed heartbeats that bring their member's rights: regexes resolved as Kafka resolves them.

Kafka 4.x resolves a group's regular expressions under the rights of the member whose
heartbeat triggered the resolution (a regex new to the group, or topics created since),
keeping only the topics that member may DESCRIBE. The engine resolves them at a heartbeat
that brings the member's rights (:class:`~translation.regex.TopicRights`, asked of the broker
on the client's connection by the authorization stage, :mod:`.authorization`); only the
coordinating sidecar (the holder) knows when a resolution is due and what the regexes match,
and only the follower a member is connected to can ask about its rights.

So a follower sends its members' ConsumerGroupHeartbeats to a holder of fleet protocol 3
inside ``FleetControl`` (:data:`HEARTBEAT`): the heartbeat as the client sent it, the relay
mark, the rights when it brings them, and whether it can ask them (its authorization stage is
in force). The holder decides it as a relayed heartbeat, under those rights; but when the
heartbeat would resolve its group's regexes, brings no rights and its follower can ask them, it
answers the topics to ask about instead (every match of the group's regexes and the
heartbeat's, :meth:`~translation.coordinator.GroupCoordinator.regex_topics_to_check`), decides
nothing, and the follower asks the broker (one Metadata probe on the client's connection, the
connection's cache of answers) and sends the heartbeat again with them: a member's heartbeat
costs one more round trip to the holder only when its group's regexes are due. A heartbeat
that arrives from a follower that cannot ask (no authorization in force there; 0.2.0
followers relaying as before) is resolved as before authorization: over every topic.

A holder built before this answers UNSUPPORTED_VERSION with no body: the follower relays the
heartbeat as before, and remembers the holder for :data:`PLAIN_SECONDS` (at most
:data:`MAX_PLAIN` holders).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.coordination import fleet_answers
from proxy.coordination.handler import Value
from translation.errors import ErrorCode
from translation.regex import TopicRights

HEARTBEAT: Final = "Heartbeat"
"""The ``FleetControl`` message type of a relayed ConsumerGroupHeartbeat."""
PLAIN_SECONDS: Final = 300.0
"""How long a follower relays heartbeats plainly to a holder that took none in ``FleetControl``."""
MAX_PLAIN: Final = 64
_KEY = ApiKey.CONSUMER_GROUP_HEARTBEAT


def ask_body(version: int, mark: str, request: bytes, rights: TopicRights | None, *,
             can_ask: bool) -> bytes:
    """A :data:`HEARTBEAT` body: the heartbeat's version, encoded body, relay mark, the
    member's rights (None: not brought) and whether the follower can ask them."""
    return json.dumps({
        "type": HEARTBEAT, "version": version, "mark": mark,
        "request": base64.b64encode(request).decode(), "can_ask": can_ask,
        "rights": None if rights is None else {"checked": sorted(rights.checked),
                                               "allowed": sorted(rights.allowed)},
    }, separators=(",", ":")).encode()


def read_ask(body: dict[str, Any]) -> tuple[int, str, bytes, TopicRights | None, bool]:
    """(version, mark, encoded heartbeat, rights, can ask) of a :data:`HEARTBEAT` body;
    ValueError if it does not say them."""
    version, mark, request = body.get("version"), body.get("mark"), body.get("request")
    can_ask, rights = body.get("can_ask"), body.get("rights")
    if not (isinstance(version, int) and isinstance(mark, str) and isinstance(request, str)
            and isinstance(can_ask, bool)):
        raise ValueError("not a Heartbeat")
    brought: TopicRights | None = None
    if rights is not None:
        if not isinstance(rights, dict):
            raise ValueError("unreadable rights")
        checked, allowed = rights.get("checked"), rights.get("allowed")
        if not (isinstance(checked, list) and isinstance(allowed, list)
                and all(isinstance(t, str) for t in checked)
                and all(isinstance(t, str) for t in allowed)):
            raise ValueError("unreadable rights")
        brought = TopicRights(frozenset(checked), frozenset(allowed) & frozenset(checked))
    return version, mark, base64.b64decode(request, validate=True), brought, can_ask


@dataclass(frozen=True, slots=True)
class Reply:
    """The holder's answer: an error, the heartbeat's answer, or the topics to ask about."""

    error: int = 0
    response: Value | None = None
    """The heartbeat's answer (at the follower, decoded)."""
    check: list[str] | None = None
    """The topics whose DESCRIBE the heartbeat must bring (it was not decided)."""


def reply_body(version: int, reply: Reply, response: bytes | None = None) -> bytes:
    """The answer's body after its correlation id: the error code, then JSON with the
    heartbeat's answer (``response``: its encoded body, base64) or the topics to check."""
    if response is not None:
        return fleet_answers.encode(reply.error,
                                    {"response": base64.b64encode(response).decode()})
    if reply.check is not None:
        return fleet_answers.encode(reply.error, {"check": reply.check})
    return fleet_answers.encode(reply.error, {})


def read_reply(version: int, raw: bytes) -> Reply | None:
    """The holder's answer; None when it takes no heartbeats in ``FleetControl``
    (UNSUPPORTED_VERSION or INVALID_REQUEST, no body). ValueError (or a codec error) if it
    cannot be read."""
    error, body = fleet_answers.read(raw, "a heartbeat answer")
    if body is None:
        if error in fleet_answers.NOT_TAKEN:
            return None
        return Reply(error or int(ErrorCode.UNKNOWN_SERVER_ERROR))
    if "response" in body:
        encoded = body["response"]
        if not isinstance(encoded, str):
            raise ValueError("unreadable heartbeat answer")
        value, _ = messages.decode_response(_KEY, version,
                                            base64.b64decode(encoded, validate=True), 0)
        return Reply(error, response=value)
    check = body.get("check")
    if check is not None:
        if not (isinstance(check, list) and all(isinstance(t, str) for t in check)):
            raise ValueError("unreadable topics to check")
        return Reply(error, check=check)
    return Reply(error or int(ErrorCode.UNKNOWN_SERVER_ERROR))
