"""Commit tickets, the OffsetCommit side: a commit of a group another sidecar holds is validated
there and sent here, on the client's own connection (:mod:`proxy.coordination.tickets` has the
messages, the holder's book and the reports).

* At the follower (:func:`commit_ticket`, a way of the relay stage,
  :mod:`proxy.coordination.stages.relay`): OffsetCommit and TxnOffsetCommit to a holder of fleet
  protocol 3 or later ask it for a ticket, then are stamped with the ticket's membership and
  sent upstream, where the broker authorizes them as the client's; the broker's answer is
  reported to the holder, and a refused stamp becomes the retriable
  COORDINATOR_LOAD_IN_PROGRESS. A holder that takes no tickets gets the commit relayed.
* At the holder (:func:`commit_tickets`, answered on the fleet listener): the ticket request is
  decided as a relayed commit would be (:class:`~.handlers.OffsetCommitHandler`), but not sent:
  a refusal comes back as one error code, an accepted commit as a ticket whose stamp counts as
  in flight until the follower reports it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from proxy import metrics
from proxy.codec import messages
from proxy.codec.errors import CodecError
from proxy.connection import Rewrite
from proxy.coordination import tickets
from proxy.coordination.fleet import unmark
from proxy.coordination.fleet_control import FLEET_CONTROL, FLEET_CONTROL_VERSION
from proxy.coordination.handler import ApiHandler, GroupRequest, Pass, Upstream, Value
from proxy.coordination.membership import MEMBERSHIP_LOST
from proxy.coordination.offsets.handlers import OffsetCommitHandler, check_membership
from proxy.coordination.offsets.retries import refusal
from proxy.coordination.peers import Route
from proxy.coordination.stages.dispatch import rewrite
from proxy.coordination.stages.relay import MOVED, mark, relay
from proxy.coordination.stages.stage import Chain, RouterCalls
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)
UNKNOWN_MEMBER_ID = int(ErrorCode.UNKNOWN_MEMBER_ID)
UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)


def commit_ticket(chain: Chain, handler: ApiHandler, request: GroupRequest,
                  groups: tuple[str, ...], route: Route) -> Awaitable[bytes | Rewrite] | None:
    """The relay stage's way for commits (see the module docstring); None: not a commit, or a
    holder of a fleet protocol without tickets (relay it)."""
    if isinstance(handler, OffsetCommitHandler) and route.protocol >= tickets.TICKET_PROTOCOL:
        return _ticketed(chain, handler, request, groups, route)
    return None


async def _ticketed(chain: Chain, handler: OffsetCommitHandler, request: GroupRequest,
                    groups: tuple[str, ...], route: Route) -> bytes | Rewrite:
    """A commit of a group another sidecar holds: validated there, which answers a ticket,
    then stamped and sent here, on the client's own connection, so that the broker authorizes
    it as the client's."""
    fleet = chain.fleet
    assert fleet is not None and route.address is not None
    address = route.address
    value = request.value
    asked = dict(value, topics=[  # the holder validates partitions, not their metadata
        dict(t, partitions=[dict(p, committed_metadata=None) for p in t["partitions"]])
        for t in value["topics"]])
    body = tickets.ask_body(request.api_key, request.version, mark(chain, request, route),
                            messages.encode_request(request.api_key, request.version, asked))
    del asked
    try:
        reply = tickets.read_reply(await fleet.links.control(
            address, FLEET_CONTROL, FLEET_CONTROL_VERSION, body))
    except (UpstreamError, ValueError) as exc:
        log.info("asking %s:%d for a commit ticket for %s failed: %s", *address,
                 ",".join(groups), exc)
        fleet.routes.forget(groups)
        metrics.FLEET_RELAYS.labels("failed").inc()
        return chain.encode(handler, request, handler.failure(request, NOT_COORDINATOR))
    if reply is None:  # a holder without tickets: it commits as the proxy
        metrics.COMMIT_TICKETS.labels("relayed").inc()
        return await relay(chain, handler, request, groups, route)
    metrics.FLEET_RELAYS.labels("answered").inc()
    ticket = reply.ticket
    if ticket is None:
        if reply.error in MOVED:
            fleet.routes.forget(groups)
        metrics.COMMIT_TICKETS.labels("refused").inc()
        return chain.encode(handler, request, handler.failure(request, reply.error))
    group_id = value["group_id"]
    service = chain.service
    if (request.node_id is not None and ticket.coordinator is not None
            and request.node_id != ticket.coordinator):
        # the client sent it to a broker that does not coordinate the group: as Kafka
        if ticket.member_id is not None:
            service.tickets.report(address, group_id, ticket.ticket_id, [])
        return chain.encode(handler, request, handler.failure(request, NOT_COORDINATOR))
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

    return rewrite(chain, handler, request, Upstream(
        ticket.stamped(value), on_response, lambda: report([]), ticket.version))


# -- at the holder --------------------------------------------------------------------------

def commit_tickets(chain: Chain, body: dict[str, Any]) -> bytes | Awaitable[bytes]:
    """At the holder, on the fleet listener: a follower's ``CommitTicket`` (decided without
    being sent) or ``CommitDone``; the answer's body."""
    service = chain.service
    if body.get("type") == tickets.COMMIT_DONE:
        try:
            group_id, ticket_id, errors = tickets.read_done(body)
        except ValueError:
            return tickets.reply_body(tickets.Reply(int(ErrorCode.INVALID_REQUEST)))
        known = service.tickets.book.done(group_id, ticket_id, errors)
        return tickets.reply_body(tickets.Reply(0 if known else UNKNOWN_MEMBER_ID))
    return _ticket_answer(chain, service, body)


async def _ticket_answer(chain: Chain, service: RouterCalls, body: dict[str, Any]) -> bytes:
    return tickets.reply_body(await _ticket_reply(chain, service, body))


async def _ticket_reply(chain: Chain, service: RouterCalls, body: dict[str, Any]
                        ) -> tickets.Reply:
    invalid = tickets.Reply(int(ErrorCode.INVALID_REQUEST))
    try:
        api_key, version, mark_, payload = tickets.read_ask(body)
        handler = chain.handlers.get(api_key)
        relayed = unmark(mark_)
        if (not isinstance(handler, OffsetCommitHandler) or relayed is None
                or not chain.session.fleet_peer):
            return invalid
        value, _ = messages.decode_request(api_key, version, payload, 0)
    except (ValueError, CodecError):
        return invalid
    request = GroupRequest(handler.api_key, version, 0, relayed.client_id,
                           relayed.client_host, relayed.node_id, b"", value,
                           relayed.principal)
    if not all(chain.claims(g) for g in handler.group_ids(request)):
        return tickets.Reply(NOT_COORDINATOR)
    try:
        outcome = handler.decide(request)
        if isinstance(outcome, Pass):
            return tickets.Reply(NOT_COORDINATOR)
        if isinstance(outcome, Upstream):
            result: Value | Upstream = outcome
        else:
            answer = outcome.value
            result = answer if isinstance(answer, dict) else await answer
    except Exception:
        log.exception("deciding a commit ticket (api key %d v%d) failed", api_key, version)
        return tickets.Reply(UNKNOWN_SERVER_ERROR)
    if not isinstance(result, Upstream):
        metrics.COMMIT_TICKETS.labels("refused").inc()
        return tickets.Reply(refusal(result) or _first_error(result) or UNKNOWN_SERVER_ERROR)
    group_id = value["group_id"]
    membership = service.membership(group_id)
    coordinator = membership.coordinator_node if membership is not None else None
    if result.release is None or membership is None:
        # nothing stamped (a version without member fields): sent as the client sent it
        return tickets.Reply(0, tickets.Ticket(0, None, -1, result.version, coordinator))
    stamped = result.value
    generation = stamped.get("generation_id_or_member_epoch", -1)

    def on_errors(errors: set[int]) -> None:
        check_membership(errors, membership, generation)

    ticket_id = service.tickets.issue(group_id, result.release, on_errors)
    if ticket_id is None:
        metrics.COMMIT_TICKETS.labels("full").inc()
        return tickets.Reply(int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    metrics.COMMIT_TICKETS.labels("issued").inc()
    return tickets.Reply(0, tickets.Ticket(
        ticket_id, stamped.get("member_id") or "", generation, result.version, coordinator))


def _first_error(value: Value) -> int:
    """The first partition error of a commit answer (0: none)."""
    for topic in value.get("topics", ()):
        for partition in topic.get("partitions", ()):
            if partition.get("error_code"):
                return int(partition["error_code"])
    return 0
