"""Group requests of members behind a follower that reach the broker as the client's own.

A follower sidecar relays its clients' group requests to the sidecar that coordinates the
group (the holder), which decides them with its engine. What of them goes to the broker must
still be authorized there as the client's, so the follower sends it on the client's own
connection, after the holder decided what is the engine's (decision record 0018, section 3;
decision record 0019): one ``FleetControl`` request to the holder, on the link the follower
relays that client connection's requests on (so it reaches the holder after them), then the
client's own connection.

* OffsetCommit, TxnOffsetCommit: a commit ticket (:mod:`.tickets`): the holder validates the
  commit and answers the lock member's id and generation; the follower sends the stamped
  commit.
* OffsetFetch, OffsetDelete, DescribeGroups, DeleteGroups: a remainder (:mod:`.remainders`):
  the holder answers the engine's entries and the rest of the request; the follower sends the
  rest and merges the answers.
* ConsumerGroupHeartbeat: the heartbeat goes inside ``FleetControl``
  (:mod:`.regex_rights`), so that the holder can ask for the member's DESCRIBE rights on the
  topics its group's regexes match before it resolves them, and the follower asks the broker
  on the client's connection and sends the heartbeat again with them.

:func:`on_client_connection` is the follower's hook in the router's fleet route,
:func:`answer` the holder's for these ``FleetControl`` messages on its fleet listener. A holder
built before one of them answers without a body (INVALID_REQUEST or UNSUPPORTED_VERSION), and
the follower relays the request as before; holders of fleet protocol 2 are never asked.
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
from proxy.connection import ProbeFailed, Rewrite
from proxy.coordination import offsets, regex_rights, remainders, tickets
from proxy.coordination.fleet import unmark
from proxy.coordination.fleet_control import FLEET_CONTROL, FLEET_CONTROL_VERSION
from proxy.coordination.handler import ApiHandler, GroupRequest, Pass, Upstream, Value
from proxy.coordination.membership import MEMBERSHIP_LOST
from proxy.coordination.peers import RELAY_HEARTBEAT_SECONDS, Route
from proxy.security.rights import DESCRIBE, Unanswerable
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode
from translation.regex import TopicRights

if TYPE_CHECKING:
    from proxy.coordination.routing import CoordinatingRouter
    from proxy.coordination.service import CoordinatorService

log = logging.getLogger("groupgate.coordination")

NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)
UNKNOWN_MEMBER_ID = int(ErrorCode.UNKNOWN_MEMBER_ID)
INVALID_REQUEST = int(ErrorCode.INVALID_REQUEST)
MOVED = frozenset({NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE})
TYPES = frozenset({tickets.COMMIT_TICKET, tickets.COMMIT_DONE, remainders.REMAINDER,
                   regex_rights.HEARTBEAT})
"""The ``FleetControl`` types :func:`answer` answers."""


# -- at the follower --------------------------------------------------------------------------

def on_client_connection(router: CoordinatingRouter, handler: ApiHandler,
                         request: GroupRequest, groups: tuple[str, ...], route: Route
                         ) -> Awaitable[bytes | Rewrite] | None:
    """The answer to a request the router would relay to the holder at ``route``, when its
    broker part is sent on the client's connection instead; None: relay it."""
    if route.protocol < tickets.TICKET_PROTOCOL:
        return None
    if isinstance(handler, offsets.OffsetCommitHandler):
        return _ticketed(router, handler, request, groups, route)
    if request.api_key in remainders.APIS:
        return _remainder(router, handler, request, groups, route)
    if (request.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT and route.address is not None
            and handler.service.tickets.takes_heartbeats(route.address)):
        return _heartbeat(router, handler, request, groups, route)
    return None


async def _control(router: CoordinatingRouter, request: GroupRequest, groups: tuple[str, ...],
                   route: Route, body: bytes, timeout: float | None = None) -> bytes | None:
    """Send ``body`` to the holder; None (logged, the groups looked up again) if it failed."""
    fleet = router._fleet
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


def _failed(router: CoordinatingRouter, handler: ApiHandler, request: GroupRequest,
            groups: tuple[str, ...], error: int) -> bytes:
    """The request answered ``error`` (the groups looked up again if they moved)."""
    fleet = router._fleet
    if error in MOVED and fleet is not None:
        fleet.routes.forget(groups)
    return router._encode(handler, request, handler.failure(request, error))


async def _ticketed(router: CoordinatingRouter, handler: offsets.OffsetCommitHandler,
                    request: GroupRequest, groups: tuple[str, ...], route: Route
                    ) -> bytes | Rewrite:
    """A commit of a group another sidecar holds: validated there, which answers a ticket
    (:mod:`.tickets`), then stamped and sent here, on the client's own connection, so that
    the broker authorizes it as the client's."""
    assert route.address is not None
    address = route.address
    value = request.value
    asked = dict(value, topics=[  # the holder validates partitions, not their metadata
        dict(t, partitions=[dict(p, committed_metadata=None) for p in t["partitions"]])
        for t in value["topics"]])
    body = tickets.ask_body(request.api_key, request.version, router._mark(request, route),
                            messages.encode_request(request.api_key, request.version, asked))
    del asked
    raw = await _control(router, request, groups, route, body)
    try:
        reply = None if raw is None else tickets.read_reply(raw)
    except ValueError as exc:
        log.info("an unreadable commit ticket from %s:%d: %s", *address, exc)
        raw = None
    if raw is None:
        return _failed(router, handler, request, groups, NOT_COORDINATOR)
    if reply is None:  # a holder without tickets: it commits as the proxy
        metrics.COMMIT_TICKETS.labels("relayed").inc()
        return await router._relay(handler, request, groups, route)
    metrics.FLEET_RELAYS.labels("answered").inc()
    ticket = reply.ticket
    if ticket is None:
        metrics.COMMIT_TICKETS.labels("refused").inc()
        return _failed(router, handler, request, groups, reply.error)
    group_id = value["group_id"]
    service = handler.service
    if (request.node_id is not None and ticket.coordinator is not None
            and request.node_id != ticket.coordinator):
        # the client sent it to a broker that does not coordinate the group: as Kafka
        if ticket.member_id is not None:
            service.tickets.report(address, group_id, ticket.ticket_id, [])
        return router._encode(handler, request, handler.failure(request, NOT_COORDINATOR))
    reported = ticket.member_id is None  # nothing stamped: nothing to report

    def report(errors: list[int]) -> None:
        nonlocal reported
        if not reported:
            reported = True
            service.tickets.report(address, group_id, ticket.ticket_id, errors)

    def on_response(response: Value) -> Value:
        errors = [p["error_code"] for t in response["topics"] for p in t["partitions"]]
        report(errors)
        for t in response["topics"]:
            for p in t["partitions"]:
                if p["error_code"] in MEMBERSHIP_LOST:
                    # the holder's membership moved on: it rejoins, the client retries
                    p["error_code"] = int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return response

    return router._rewrite(handler, request, Upstream(
        ticket.stamped(value), on_response, lambda: report([]), ticket.version))


async def _remainder(router: CoordinatingRouter, handler: ApiHandler, request: GroupRequest,
                     groups: tuple[str, ...], route: Route) -> bytes | Rewrite:
    """An offset fetch or delete, a describe or delete of groups another sidecar holds: the
    holder answers the engine's part (:mod:`.remainders`), the rest is sent here, on the
    client's own connection, so that the broker authorizes it as the client's."""
    assert route.address is not None
    key, version, value = request.api_key, request.version, request.value
    body = remainders.ask_body(key, version, router._mark(request, route),
                               messages.encode_request(key, version, value))
    raw = await _control(router, request, groups, route, body)
    try:
        reply = None if raw is None else remainders.read_reply(key, version, raw)
    except (ValueError, CodecError) as exc:
        log.info("an unreadable remainder from %s:%d: %s", *route.address, exc)
        raw = None
    if raw is None:
        return _failed(router, handler, request, groups, NOT_COORDINATOR)
    if reply is None:  # a holder without remainders: it sends the rest as the proxy
        metrics.REMAINDERS.labels("relayed").inc()
        return await router._relay(handler, request, groups, route)
    metrics.FLEET_RELAYS.labels("answered").inc()
    split = reply.split
    if split is None:
        metrics.REMAINDERS.labels("refused").inc()
        return _failed(router, handler, request, groups, reply.error)
    if split.rest is None:
        metrics.REMAINDERS.labels("whole").inc()
        return router._encode(handler, request, remainders.whole(key, split))
    metrics.REMAINDERS.labels("sent").inc()

    def on_response(response: Value) -> Value:
        return remainders.merged(key, value, split, response)

    return router._rewrite(handler, request, Upstream(split.rest, on_response))


async def _heartbeat(router: CoordinatingRouter, handler: ApiHandler, request: GroupRequest,
                     groups: tuple[str, ...], route: Route) -> bytes:
    """A ConsumerGroupHeartbeat of a group another sidecar holds, inside ``FleetControl``
    (:mod:`.regex_rights`): if the holder answers that the group's regexes are due for a
    resolution, the member's DESCRIBE rights on their matches are asked of the broker on the
    client's connection and the heartbeat is sent again with them."""
    assert route.address is not None
    version = request.version
    stage = router._authorization
    encoded = messages.encode_request(request.api_key, version, request.value)
    mark = router._mark(request, route)
    rights: TopicRights | None = None
    for _ in range(2):
        body = regex_rights.ask_body(version, mark, encoded, rights, can_ask=stage is not None)
        raw = await _control(router, request, groups, route, body, RELAY_HEARTBEAT_SECONDS)
        try:
            reply = None if raw is None else regex_rights.read_reply(version, raw)
        except (ValueError, CodecError) as exc:
            log.info("an unreadable heartbeat answer from %s:%d: %s", *route.address, exc)
            raw = None
        if raw is None:
            return _failed(router, handler, request, groups, NOT_COORDINATOR)
        if reply is None:  # a holder that takes no rights: relayed as before
            metrics.REGEX_RIGHTS.labels("plain").inc()
            handler.service.tickets.relay_heartbeats(route.address)
            return await router._relay(handler, request, groups, route)
        metrics.FLEET_RELAYS.labels("answered").inc()
        answer = reply.response
        if answer is not None:
            if answer.get("error_code") in MOVED:
                fleet = router._fleet
                assert fleet is not None
                fleet.routes.forget(groups)
            return router._encode(handler, request, answer)
        if reply.check is None or rights is not None or stage is None:
            # refused as a whole, or asked again for rights it brought (or cannot ask)
            return _failed(router, handler, request, groups,
                           reply.error or COORDINATOR_NOT_AVAILABLE)
        # the holder resolves the group's regexes at this heartbeat: under this member's
        # rights, asked of the broker on the client's own connection
        checked = frozenset(reply.check)
        try:
            needs = stage.rights.missing({}, checked)
            learnt = await stage.rights.ask(needs, request.client_id) if needs else {}
        except (ProbeFailed, Unanswerable) as exc:
            log.info("asking the rights of a relayed heartbeat's member: %s", exc)
            return _failed(router, handler, request, groups, COORDINATOR_NOT_AVAILABLE)
        known = stage.known(learnt)
        rights = TopicRights(checked, frozenset(t for t in checked
                                                if known("topic", t, DESCRIBE)))
        metrics.REGEX_RIGHTS.labels("brought").inc()
    return _failed(router, handler, request, groups, COORDINATOR_NOT_AVAILABLE)


# -- at the holder ----------------------------------------------------------------------------

def answer(router: CoordinatingRouter, body: dict[str, Any]) -> bytes | Awaitable[bytes]:
    """On the fleet listener: a follower's ``CommitTicket`` (decided without being sent),
    ``CommitDone``, ``Remainder`` or ``Heartbeat``; the answer's body after its correlation
    id."""
    kind = body.get("type")
    service = router._handlers[ApiKey.OFFSET_COMMIT].service
    if kind == tickets.COMMIT_DONE:
        try:
            group_id, ticket_id, errors = tickets.read_done(body)
        except ValueError:
            return tickets.reply_body(tickets.Reply(INVALID_REQUEST))
        known = service.tickets.book.done(group_id, ticket_id, errors)
        return tickets.reply_body(tickets.Reply(0 if known else UNKNOWN_MEMBER_ID))
    if not router._session.fleet_peer:
        return tickets.reply_body(tickets.Reply(INVALID_REQUEST))
    if kind == remainders.REMAINDER:
        return _remainder_answer(router, body)
    if kind == regex_rights.HEARTBEAT:
        return _heartbeat_answer(router, body)
    return _ticket_answer(router, service, body)


def _relayed_request(router: CoordinatingRouter, api_key: int, version: int, mark: str,
                     payload: bytes) -> tuple[ApiHandler, GroupRequest] | None:
    """The relayed request a ``FleetControl`` body carries (None: not one this sidecar
    decides). Raises ValueError or CodecError if it cannot be read."""
    handler = router._handlers.get(api_key)
    relayed = unmark(mark)
    if handler is None or relayed is None:
        return None
    value, _ = messages.decode_request(api_key, version, payload, 0)
    if relayed.software is not None and router._software is not None:
        router._software.note(relayed.client_host, relayed.client_id, *relayed.software)
    return handler, GroupRequest(handler.api_key, version, 0, relayed.client_id,
                                 relayed.client_host, relayed.node_id, b"", value,
                                 relayed.principal)


async def _ticket_answer(router: CoordinatingRouter, service: CoordinatorService,
                         body: dict[str, Any]) -> bytes:
    return tickets.reply_body(await _ticket_reply(router, service, body))


async def _ticket_reply(router: CoordinatingRouter, service: CoordinatorService,
                        body: dict[str, Any]) -> tickets.Reply:
    invalid = tickets.Reply(INVALID_REQUEST)
    try:
        decoded = _relayed_request(router, *tickets.read_ask(body))
    except (ValueError, CodecError):
        return invalid
    if decoded is None or not isinstance(decoded[0], offsets.OffsetCommitHandler):
        return invalid
    handler, request = decoded
    if not all(router._claims(g) for g in handler.group_ids(request)):
        return tickets.Reply(NOT_COORDINATOR)
    try:
        outcome = handler.decide(request)
        if isinstance(outcome, Pass):
            return tickets.Reply(NOT_COORDINATOR)
        if isinstance(outcome, Upstream):
            result: Value | Upstream = outcome
        else:
            answered = outcome.value
            result = answered if isinstance(answered, dict) else await answered
    except Exception:
        log.exception("deciding a commit ticket (api key %d v%d) failed", request.api_key,
                      request.version)
        return tickets.Reply(UNKNOWN_SERVER_ERROR)
    if not isinstance(result, Upstream):
        metrics.COMMIT_TICKETS.labels("refused").inc()
        return tickets.Reply(offsets.refusal(result) or offsets.first_error(result)
                             or UNKNOWN_SERVER_ERROR)
    value = request.value
    group_id = value["group_id"]
    membership = service.membership(group_id)
    coordinator = membership.coordinator_node if membership is not None else None
    if result.release is None or membership is None:
        # nothing stamped (a version without member fields): sent as the client sent it
        return tickets.Reply(0, tickets.Ticket(0, None, -1, result.version, coordinator))
    stamped = result.value
    generation = stamped.get("generation_id_or_member_epoch", -1)

    def on_errors(errors: set[int]) -> None:
        offsets.check_membership(errors, membership, generation)

    ticket_id = service.tickets.issue(group_id, result.release, on_errors)
    if ticket_id is None:
        metrics.COMMIT_TICKETS.labels("full").inc()
        return tickets.Reply(int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    metrics.COMMIT_TICKETS.labels("issued").inc()
    return tickets.Reply(0, tickets.Ticket(
        ticket_id, stamped.get("member_id") or "", generation, result.version, coordinator))


async def _remainder_answer(router: CoordinatingRouter, body: dict[str, Any]) -> bytes:
    """The engine's part of a relayed request and the rest, for the follower to send."""
    try:
        api_key, version, mark, payload = remainders.read_ask(body)
        decoded = _relayed_request(router, api_key, version, mark, payload)
    except (ValueError, CodecError):
        decoded = None
    if decoded is None:
        return remainders.reply_body(0, 0, remainders.Reply(INVALID_REQUEST))
    handler, request = decoded
    if not all(router._claims(g) for g in handler.group_ids(request)):
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


async def _heartbeat_answer(router: CoordinatingRouter, body: dict[str, Any]) -> bytes:
    """A relayed ConsumerGroupHeartbeat: decided as a relayed one, under the rights it
    brings; or, when it would resolve its group's regexes and brings none but its follower
    can ask them, the topics to ask about (:mod:`.regex_rights`)."""
    try:
        version, mark, payload, rights, can_ask = regex_rights.read_ask(body)
        decoded = _relayed_request(router, ApiKey.CONSUMER_GROUP_HEARTBEAT, version, mark,
                                   payload)
    except (ValueError, CodecError):
        decoded = None
    if decoded is None:
        return regex_rights.reply_body(0, regex_rights.Reply(INVALID_REQUEST))
    handler, request = decoded
    value = request.value
    check = handler.service.engine.regex_topics_to_check(
        value["group_id"], value.get("subscribed_topic_regex"))
    if rights is None and can_ask and check is not None and router._claims(value["group_id"]):
        metrics.REGEX_RIGHTS.labels("asked").inc()
        return regex_rights.reply_body(version, regex_rights.Reply(check=sorted(check)))
    if rights is not None:
        # only what the group's regexes match is kept (the rights a group keeps are bounded
        # by the topics image, whatever a follower sends)
        rights = (None if check is None else
                  TopicRights(rights.checked & check, rights.allowed & check))
    response = await router.decide_relayed(handler, dataclasses.replace(request,
                                                                        topic_rights=rights))
    return regex_rights.reply_body(version, regex_rights.Reply(), response)
