"""Group requests of members behind a follower that reach the broker as the client's own.

A follower sidecar relays its clients' group requests to the sidecar that coordinates the
group (the holder), which decides them with its engine. What of them goes to the broker must
still be authorized there as the client's, so the follower sends it on the client's own
connection, after the holder decided what is the engine's (decision record 0018, section 3;
decision record 0019): one ``FleetControl`` request to the holder, on the link the follower
relays that client connection's requests on (so it reaches the holder after them), then the
client's own connection.

* OffsetCommit, TxnOffsetCommit: a commit ticket (:mod:`.tickets`,
  :mod:`.offsets.ticketed`): the holder validates the commit and answers the lock member's id
  and generation; the follower sends the stamped commit.
* OffsetFetch, OffsetDelete, DescribeGroups, DeleteGroups: a remainder (:mod:`.remainders`):
  the holder answers the engine's entries and the rest of the request; the follower sends the
  rest and merges the answers.
* ConsumerGroupHeartbeat: the heartbeat goes inside ``FleetControl``
  (:mod:`.regex_rights`), so that the holder can ask for the member's DESCRIBE rights on the
  topics its group's regexes match before it resolves them, and the follower asks the broker
  on the client's connection and sends the heartbeat again with them.

:func:`remainder` and :class:`RelayedHeartbeats` are ways of the relay stage
(:mod:`.stages.relay`, beside :func:`~.offsets.ticketed.commit_ticket`), :func:`answer` the
holder's for these ``FleetControl`` messages on its fleet listener. A holder built before one
of them answers without a body (INVALID_REQUEST or UNSUPPORTED_VERSION), and the follower
relays the request as before; holders of fleet protocol 2 are never asked.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from proxy import metrics
from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.connection import Local, ProbeFailed, RequestInfo, Rewrite
from proxy.coordination import regex_rights, remainders, tickets
from proxy.coordination.fleet import unmark
from proxy.coordination.fleet_control import FLEET_CONTROL, FLEET_CONTROL_VERSION
from proxy.coordination.handler import ApiHandler, GroupRequest, Upstream, Value
from proxy.coordination.offsets import ticketed
from proxy.coordination.peers import RELAY_HEARTBEAT_SECONDS, Route
from proxy.coordination.stages.dispatch import rewrite
from proxy.coordination.stages.relay import MOVED, mark, relay
from proxy.coordination.stages.stage import Chain, Passage, settled
from proxy.router import body_offset
from proxy.security.rights import DESCRIBE, Unanswerable
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode
from translation.regex import TopicRights

if TYPE_CHECKING:
    from proxy.coordination.authorization import AuthorizationStage

log = logging.getLogger("groupgate.coordination")

NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)
INVALID_REQUEST = int(ErrorCode.INVALID_REQUEST)


# -- at the follower --------------------------------------------------------------------------

async def _control(chain: Chain, request: GroupRequest, groups: tuple[str, ...], route: Route,
                   body: bytes, timeout: float | None = None) -> bytes | None:
    """Send ``body`` to the holder; None (logged, the groups looked up again) if it failed."""
    fleet = chain.fleet
    assert fleet is not None and route.address is not None
    try:
        return await fleet.links.control(route.address, FLEET_CONTROL, FLEET_CONTROL_VERSION,
                                         body, timeout=timeout)
    except UpstreamError as exc:
        log.info("asking %s:%d about api key %d of %s failed: %s", *route.address,
                 request.api_key, ",".join(groups), exc)
        fleet.routes.forget(groups)
        metrics.FLEET_RELAYS.labels("failed").inc()
        return None


def _failed(chain: Chain, handler: ApiHandler, request: GroupRequest, groups: tuple[str, ...],
            error: int) -> bytes:
    """The request answered ``error`` (the groups looked up again if they moved)."""
    if error in MOVED and chain.fleet is not None:
        chain.fleet.routes.forget(groups)
    return chain.encode(handler, request, handler.failure(request, error))


def remainder(chain: Chain, handler: ApiHandler, request: GroupRequest,
              groups: tuple[str, ...], route: Route) -> Awaitable[bytes | Rewrite] | None:
    """The relay stage's way for OffsetFetch, OffsetDelete, DescribeGroups and DeleteGroups
    (see the module docstring); None: another API, or a holder of fleet protocol 2."""
    if request.api_key in remainders.APIS and route.protocol >= tickets.TICKET_PROTOCOL:
        return _remainder(chain, handler, request, groups, route)
    return None


async def _remainder(chain: Chain, handler: ApiHandler, request: GroupRequest,
                     groups: tuple[str, ...], route: Route) -> bytes | Rewrite:
    """An offset fetch or delete, a describe or delete of groups another sidecar holds: the
    holder answers the engine's part (:mod:`.remainders`), the rest is sent here, on the
    client's own connection, so that the broker authorizes it as the client's."""
    assert route.address is not None
    key, version, value = request.api_key, request.version, request.value
    body = remainders.ask_body(key, version, mark(chain, request, route),
                               messages.encode_request(key, version, value))
    raw = await _control(chain, request, groups, route, body)
    try:
        reply = None if raw is None else remainders.read_reply(key, version, raw)
    except (ValueError, CodecError) as exc:
        log.info("an unreadable remainder from %s:%d: %s", *route.address, exc)
        raw = None
    if raw is None:
        return _failed(chain, handler, request, groups, NOT_COORDINATOR)
    if reply is None:  # a holder without remainders: it sends the rest as the proxy
        metrics.REMAINDERS.labels("relayed").inc()
        return await relay(chain, handler, request, groups, route)
    metrics.FLEET_RELAYS.labels("answered").inc()
    split = reply.split
    if split is None:
        metrics.REMAINDERS.labels("refused").inc()
        return _failed(chain, handler, request, groups, reply.error)
    if split.rest is None:
        metrics.REMAINDERS.labels("whole").inc()
        return chain.encode(handler, request, remainders.whole(key, split))
    metrics.REMAINDERS.labels("sent").inc()

    def on_response(response: Value) -> Value:
        return remainders.merged(key, value, split, response)

    return rewrite(chain, handler, request, Upstream(split.rest, on_response))


class RelayedHeartbeats:
    """The relay stage's way for ConsumerGroupHeartbeat, one per client connection (it asks
    the client's rights on that connection, with the connection's authorization stage; None:
    not in force)."""

    __slots__ = ("_authorization",)

    def __init__(self, authorization: AuthorizationStage | None) -> None:
        self._authorization = authorization

    def __call__(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                 groups: tuple[str, ...], route: Route) -> Awaitable[bytes] | None:
        if (request.api_key != ApiKey.CONSUMER_GROUP_HEARTBEAT
                or route.protocol < tickets.TICKET_PROTOCOL or route.address is None
                or not handler.service.tickets.takes_heartbeats(route.address)):
            return None
        return self._heartbeat(chain, handler, request, groups, route)

    async def _heartbeat(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                         groups: tuple[str, ...], route: Route) -> bytes:
        """The heartbeat inside ``FleetControl`` (:mod:`.regex_rights`): if the holder answers
        that the group's regexes are due for a resolution, the member's DESCRIBE rights on
        their matches are asked of the broker on the client's connection and the heartbeat is
        sent again with them."""
        assert route.address is not None
        version, stage = request.version, self._authorization
        encoded = messages.encode_request(request.api_key, version, request.value)
        marked = mark(chain, request, route)
        rights: TopicRights | None = None
        for _ in range(2):
            body = regex_rights.ask_body(version, marked, encoded, rights,
                                         can_ask=stage is not None)
            raw = await _control(chain, request, groups, route, body, RELAY_HEARTBEAT_SECONDS)
            try:
                reply = None if raw is None else regex_rights.read_reply(version, raw)
            except (ValueError, CodecError) as exc:
                log.info("an unreadable heartbeat answer from %s:%d: %s", *route.address, exc)
                raw = None
            if raw is None:
                return _failed(chain, handler, request, groups, NOT_COORDINATOR)
            if reply is None:  # a holder that takes no heartbeats in FleetControl
                metrics.REGEX_RIGHTS.labels("plain").inc()
                handler.service.tickets.relay_heartbeats(route.address)
                return await relay(chain, handler, request, groups, route)
            metrics.FLEET_RELAYS.labels("answered").inc()
            answer = reply.response
            if answer is not None:
                if answer.get("error_code") in MOVED and chain.fleet is not None:
                    chain.fleet.routes.forget(groups)
                return chain.encode(handler, request, answer)
            if reply.check is None or rights is not None or stage is None:
                # refused as a whole, or asked again for rights it brought (or cannot ask)
                return _failed(chain, handler, request, groups,
                               reply.error or COORDINATOR_NOT_AVAILABLE)
            # the holder resolves the group's regexes at this heartbeat: under this member's
            # rights, asked of the broker on the client's own connection
            checked = frozenset(reply.check)
            try:
                needs = stage.rights.missing({}, checked)
                learnt = await stage.rights.ask(needs, request.client_id) if needs else {}
            except (ProbeFailed, Unanswerable) as exc:
                log.info("asking the rights of a relayed heartbeat's member: %s", exc)
                return _failed(chain, handler, request, groups, COORDINATOR_NOT_AVAILABLE)
            known = stage.known(learnt)
            rights = TopicRights(checked, frozenset(t for t in checked
                                                    if known("topic", t, DESCRIBE)))
            metrics.REGEX_RIGHTS.labels("brought").inc()
        return _failed(chain, handler, request, groups, COORDINATOR_NOT_AVAILABLE)


# -- at the holder ----------------------------------------------------------------------------

def answer(chain: Chain, body: dict[str, Any]) -> bytes | Awaitable[bytes]:
    """On the fleet listener: a follower's ``Remainder`` or ``Heartbeat``, or its commit
    tickets' messages (:func:`~.offsets.ticketed.commit_tickets`); the answer's body after
    its correlation id."""
    kind = body.get("type")
    if kind == remainders.REMAINDER:
        if not chain.session.fleet_peer:
            return remainders.reply_body(0, 0, remainders.Reply(INVALID_REQUEST))
        return _remainder_answer(chain, body)
    if kind == regex_rights.HEARTBEAT:
        if not chain.session.fleet_peer:
            return regex_rights.reply_body(0, regex_rights.Reply(INVALID_REQUEST))
        return _heartbeat_answer(chain, body)
    return ticketed.commit_tickets(chain, body)


def _relayed_request(chain: Chain, api_key: int, version: int, mark_: str, payload: bytes
                     ) -> tuple[ApiHandler, GroupRequest] | None:
    """The relayed request a ``FleetControl`` body carries (None: not one this sidecar
    decides). Raises ValueError or CodecError if it cannot be read."""
    handler = chain.handlers.get(api_key)
    relayed = unmark(mark_)
    if handler is None or relayed is None:
        return None
    value, _ = messages.decode_request(api_key, version, payload, 0)
    if relayed.software is not None and chain.software is not None:
        chain.software.note(relayed.client_host, relayed.client_id, *relayed.software)
    request = GroupRequest(handler.api_key, version, 0, relayed.client_id, relayed.client_host,
                           relayed.node_id, b"", value, relayed.principal,
                           relayed_by=relayed.follower)
    if relayed.follower is not None:  # who relays for the group: a hand-back tells it
        chain.service.relayers.note(handler.group_ids(request), relayed.follower)
    return handler, request


async def _remainder_answer(chain: Chain, body: dict[str, Any]) -> bytes:
    """The engine's part of a relayed request and the rest, for the follower to send."""
    try:
        api_key, version, mark_, payload = remainders.read_ask(body)
        decoded = _relayed_request(chain, api_key, version, mark_, payload)
    except (ValueError, CodecError):
        decoded = None
    if decoded is None:
        return remainders.reply_body(0, 0, remainders.Reply(INVALID_REQUEST))
    handler, request = decoded
    if not all(chain.claims(g) for g in handler.group_ids(request)):
        return remainders.reply_body(api_key, version, remainders.Reply(NOT_COORDINATOR))
    try:
        split = handler.split(request)  # type: ignore[attr-defined]  # remainders.APIS
        if split is not None and not isinstance(split, remainders.Split):
            split = await split
        if split is None:  # all the broker's
            split = remainders.Split({}, request.value)
        answered = remainders.reply_body(api_key, version, remainders.Reply(0, split))
    except Exception:
        log.exception("deciding a remainder (api key %d v%d) failed", api_key, version)
        return remainders.reply_body(api_key, version,
                                     remainders.Reply(UNKNOWN_SERVER_ERROR))
    metrics.REMAINDERS.labels("split").inc()
    return answered


async def _heartbeat_answer(chain: Chain, body: dict[str, Any]) -> bytes:
    """A relayed ConsumerGroupHeartbeat: decided as a relayed one, under the rights it
    brings (kept only for what its group's regexes match); or, when it would resolve its
    group's regexes, brings no rights and its follower can ask them, the topics to ask about
    (:mod:`.regex_rights`)."""
    try:
        version, mark_, payload, rights, can_ask = regex_rights.read_ask(body)
        decoded = _relayed_request(chain, ApiKey.CONSUMER_GROUP_HEARTBEAT, version, mark_,
                                   payload)
    except (ValueError, CodecError):
        decoded = None
    if decoded is None:
        return regex_rights.reply_body(0, regex_rights.Reply(INVALID_REQUEST))
    handler, request = decoded
    value = request.value
    check = handler.service.engine.regex_topics_to_check(
        value["group_id"], value.get("subscribed_topic_regex"))
    if rights is None and can_ask and check is not None and chain.claims(value["group_id"]):
        metrics.REGEX_RIGHTS.labels("asked").inc()
        return regex_rights.reply_body(version, regex_rights.Reply(check=sorted(check)))
    if rights is not None:
        # only what the group's regexes match is kept (the rights a group keeps are bounded
        # by the topics image, whatever a follower sends)
        rights = (None if check is None else
                  TopicRights(rights.checked & check, rights.allowed & check))
    response = await _decided_here(chain, handler, dataclasses.replace(
        request, topic_rights=rights))
    return regex_rights.reply_body(version, regex_rights.Reply(), response)


async def _decided_here(chain: Chain, handler: ApiHandler, request: GroupRequest) -> bytes:
    """``request`` decided through this fleet-listener connection's stages, as if it had come
    relayed on it; its answer's body."""
    info = RequestInfo(request.api_key, request.version, request.correlation_id,
                       memoryview(b""))
    decision = await settled(chain.decide(handler, info, passage=Passage(chain, handler, info,
                                                                         request)))
    payload: Any = decision.answer if isinstance(decision, Local) else None
    if payload is not None and not isinstance(payload, bytes | bytearray | memoryview):
        payload = await payload
    if not isinstance(payload, bytes | bytearray | memoryview):  # never sent upstream
        log.error("a relayed api key %d was not answered here", request.api_key)
        payload = chain.encode(handler, request, handler.failure(request,
                                                                 UNKNOWN_SERVER_ERROR))
    view = memoryview(payload)
    return bytes(view[body_offset(view, messages.response_header_version(
        request.api_key, request.version)):])
