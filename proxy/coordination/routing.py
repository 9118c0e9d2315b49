"""The connection router when the proxy coordinates groups: one handler per group API.

:class:`CoordinatingRouter` is a :class:`~proxy.router.ForwardingRouter` that examines the
group APIs and forwards everything else untouched. Each examined API has one handler object
(:class:`~proxy.coordination.handler.ApiHandler`) in one table, :func:`handler_table`:

* ConsumerGroupHeartbeat, ConsumerGroupDescribe (:mod:`.consumer_group`): always (v0-v1);
* JoinGroup, SyncGroup, Heartbeat, LeaveGroup (:mod:`.classic`): the engine serves the group;
* OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete (:mod:`.offsets`): the group is
  coordinated;
* ListGroups, DescribeGroups, DeleteGroups (:mod:`.listing`): any group, or a group the
  request names, is coordinated.

The connection classifies these APIs EXAMINE from the header alone (so a large one is read
whole, never streamed past), and calls :meth:`CoordinatingRouter.decide` once the proxy's
earlier answers on that connection are complete (Kafka's per-connection order). ``decide``
decodes the request, asks its handler, and turns the outcome into the connection's decision:
forward as is, forward rewritten (the response goes through the handler's filter), or answer
locally. Whatever goes wrong inside a handler is answered with that API's failure response
(UNKNOWN_SERVER_ERROR) and a log line; it never reaches the connection or the process.

Several sidecars, one group (:mod:`proxy.coordination.fleet`): before its handler, a request
naming groups this sidecar does not hold is routed (:class:`~.peers.Routes`): relayed to the
sidecar that holds them (on this connection's own link to it, :class:`~.peers.ConnectionLinks`,
with no later request of the connection passing it), looked up at the broker first, refused
with COORDINATOR_NOT_AVAILABLE (a groupgate without fleet support holds it), or decided here.
A relayed request arriving from another sidecar is never relayed again: if its groups are not
held here it is answered NOT_COORDINATOR, and that sidecar looks again. What its mark says of
the application (client id, host, listener, software, principal) is believed only on a
connection that proved it comes from a sidecar (the connection's
:class:`~proxy.security.session.Session`, ``fleet_peer``); anywhere else a client id that
looks like a mark is just a client id.

A KIP-848 client whose heartbeats queued up behind a slow coordinator and whose answers it
did not read (they timed out on its side) sends the epoch it had: on its own connection, the
heartbeat goes on with the epoch the client was last given (:mod:`.heartbeat_answers`), so the
coordinator does not fence a member that was never gone.

Authorization (:mod:`.authorization`): a request the proxy will answer or relay, in part or
whole, first passes the authorization stage, before the fleet route and the handler, so that
nothing the proxy does as itself (a lookup, a takeover, a relay, a commit it sends for another
sidecar's client) is started by a client that may not use the group. The stage asks the broker
on this connection what the client may do (:mod:`proxy.security.rights`, cached per
connection) and lets through only the authorized part; what it refused is put back into the
answer when it is encoded (:meth:`CoordinatingRouter._encode`). Relayed requests arriving on
the fleet listener were authorized by the sidecar their client is connected to.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from proxy import apiversions, metrics
from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.header import parse_request_header, response_header_for
from proxy.connection import (
    EXAMINE,
    FORWARD,
    Decision,
    Local,
    Prepare,
    ProbeFailed,
    RejectRequest,
    RequestInfo,
    Rewrite,
)
from proxy.coordination import (
    classic,
    commit_retries,
    consumer_group,
    listing,
    offsets,
    release,
    tickets,
    upgrade,
)
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.fleet import mark_forwarded, unmark
from proxy.coordination.fleet_control import FLEET_CONTROL, FLEET_CONTROL_VERSION
from proxy.coordination.handler import (
    ApiHandler,
    GroupRequest,
    Outcome,
    Pass,
    Upstream,
    Value,
)
from proxy.coordination.heartbeat_answers import HeartbeatAnswers
from proxy.coordination.inside import held_while_inside
from proxy.coordination.membership import MEMBERSHIP_LOST
from proxy.coordination.peek import group_id_of
from proxy.coordination.peers import LOCAL, LOOKUP, RELAY, FleetSide, Route
from proxy.coordination.service import CoordinatorService
from proxy.journal.clients import ClientSoftwareDirectory
from proxy.metrics import RequestCounters
from proxy.rewrite import AddressMap
from proxy.router import ForwardingRouter, body_offset
from proxy.security.rights import AuthorizerCheck, Fact, Needs, ProbeSend, Unanswerable
from proxy.security.session import Session
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.pod_liveness import ConnectionWatch

log = logging.getLogger("groupgate.coordination")

UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)
NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)
UNKNOWN_MEMBER_ID = int(ErrorCode.UNKNOWN_MEMBER_ID)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
_MEMBER_APIS = frozenset({ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT, ApiKey.HEARTBEAT,
                          ApiKey.SYNC_GROUP, ApiKey.JOIN_GROUP})
"""Requests that carry a member id the broker checks: passed to the broker for a group the
engine no longer serves, an engine member's would be refused UNKNOWN_MEMBER_ID."""
_MOVED = frozenset({NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE})
MAX_COMMITTERS_PER_CONNECTION = 64
"""Group members one connection's commits are remembered for (a client commits as one)."""


HANDLERS = (*consumer_group.HANDLERS, *classic.HANDLERS, *offsets.HANDLERS, *listing.HANDLERS,
            release.ReleaseCommandHandler)
"""Every examined API's handler class: adding an API is one handler and one entry here."""


def handler_table(service: CoordinatorService) -> dict[int, ApiHandler]:
    """One handler per examined API key."""
    table: dict[int, ApiHandler] = {}
    for make in HANDLERS:
        handler = make(service)
        assert handler.api_key not in table, handler.api_key
        table[handler.api_key] = handler
    return table


def served_versions(handlers: dict[int, ApiHandler]) -> dict[int, tuple[int, int]]:
    """The APIs the proxy serves itself and the versions it advertises for them."""
    return {key: h.served_versions for key, h in handlers.items()
            if h.served_versions is not None}


class CoordinatingRouter(ForwardingRouter):
    """Per-connection routing with the coordinator service behind it."""

    __slots__ = ("_authorization", "_authorizer", "_caught_up", "_claims", "_client_host",
                 "_committers", "_fleet", "_handlers", "_heartbeat_answers", "_node_id",
                 "_session", "_software", "_stale_acknowledged", "liveness")

    def __init__(self, address_map: AddressMap, counters: RequestCounters,
                 accepted: dict[int, tuple[int, int]], handlers: dict[int, ApiHandler],
                 node_id: int | None, client_host: str,
                 claims: Callable[[str], bool] = lambda _group_id: True,
                 fleet: FleetSide | None = None,
                 software: ClientSoftwareDirectory | None = None,
                 session: Session | None = None,
                 authorization: AuthorizationStage | None = None,
                 authorizer: AuthorizerCheck | None = None) -> None:
        """``authorization``: the authorization stage of this connection (None: requests are
        not authorized by the proxy); ``authorizer``: whether the brokers have an authorizer
        (None: assume so)."""
        super().__init__(address_map, counters, accepted, served_versions(handlers),
                         {k: v for k, v in apiversions.BRIDGED.items() if k in handlers})
        self._handlers = handlers
        self._node_id = node_id
        self._client_host = client_host
        self._claims = claims
        """Whether the proxy coordinates (or is taking over) a group."""
        self._fleet = fleet
        """This connection's place among several sidecars (None: this proxy decides all)."""
        self._software = software
        """Where the client software named in ApiVersions (KIP-511) is noted (the journal)."""
        self._session = session if session is not None else Session("")
        """What is known of the connection's authentication (filled as it authenticates)."""
        self._committers: set[tuple[str, str]] = set()
        """Group members that committed on this connection: disrupted when it closes."""
        self._stale_acknowledged: dict[int, list[Value]] = {}
        """By correlation id: partitions of a commit acknowledged as stale retries
        (:mod:`.commit_retries`), added to its answer."""
        self._heartbeat_answers = HeartbeatAnswers()
        """The epochs this connection's KIP-848 members were last given
        (:mod:`.heartbeat_answers`)."""
        self._caught_up: dict[int, int] = {}
        """By correlation id: the epoch a heartbeat carried as its client sent it, where it
        goes on with the epoch the client was last given; dropped when it is answered."""
        self.liveness: ConnectionWatch | None = None
        """Pod-local liveness hook (:mod:`.pod_liveness`): told the connection's ApiVersions
        and group requests; set by the router factory on client-facing connections."""
        inbound = fleet is not None and fleet.inbound
        self._authorization = None if inbound else authorization
        self._authorizer = authorizer

    def attach(self, send: ProbeSend) -> None:
        """The connection's way to ask the broker on the client's own connection."""
        if self._authorization is not None:
            self._authorization.rights.attach(send)

    async def aclose(self) -> None:
        """The client's connection closed: its commits still on their way are retried by the
        client (:mod:`.commit_retries`); close the links it opened."""
        if self._committers:
            retries = self._handlers[ApiKey.OFFSET_COMMIT].service.commit_retries
            for group_id, member_id in self._committers:
                retries.disrupted(group_id, member_id)
            self._committers.clear()
        if self._fleet is not None:
            await self._fleet.links.aclose()

    def decide_oversized(self, request: RequestInfo) -> int:
        if request.api_key not in self._handlers:
            return super().decide_oversized(request)
        group_id = group_id_of(request.frame, request.api_key, request.api_version)
        if group_id is None:
            raise RejectRequest("its group cannot be read from its first bytes")
        if self._claims(group_id):
            raise RejectRequest(f"its group {group_id[:100]!r} is coordinated by the proxy")
        if self._fleet is not None and self._fleet.routes.route([group_id]).kind == RELAY:
            raise RejectRequest(f"its group {group_id[:100]!r} is coordinated by another "
                                "sidecar")
        # The broker's group, or one whose holder is not known yet: the broker answers, as it
        # would without the proxy (a commit for a group a sidecar holds carries no member of
        # the broker's group and is refused there).
        return FORWARD

    def classify(self, request: RequestInfo) -> int:
        if request.api_key == ApiKey.API_VERSIONS and request.complete:
            if self._software is not None:
                self._software.note_request(self._client_host, request.frame,
                                            request.api_version)
            if self.liveness is not None:  # pod-local liveness hook
                self.liveness.api_versions(request.frame, request.api_version)
        action = super().classify(request)
        if action == FORWARD and request.api_key in self._handlers:
            return EXAMINE
        return action

    def decide(self, request: RequestInfo) -> Decision:
        handler = self._handlers.get(request.api_key)
        if handler is None:
            return super().decide(request)  # ApiVersions newer than the proxy knows
        return self._bridge(request, self._decide(handler, request,
                                                  self._decode(handler, request), None))

    def _bridge(self, request: RequestInfo, decision: Decision) -> Decision:
        """A request passed to the broker as the client sent it, at a bridged version this
        connection's broker lacks (:data:`~proxy.apiversions.BRIDGED`), goes as the older
        version: the same bytes relabelled, its answer unchanged."""
        if isinstance(decision, Prepare):
            return Prepare(self._bridge_later(request, decision.decision))
        if decision == FORWARD:
            version = self.broker_version(request.api_key, request.api_version)
            if version != request.api_version:
                return Rewrite(apiversions.downgraded(request.frame, version), _unchanged_bytes)
        return decision

    async def _bridge_later(self, request: RequestInfo,
                            decision: Awaitable[int | Rewrite | Local]) -> int | Rewrite | Local:
        bridged = self._bridge(request, await decision)
        assert not isinstance(bridged, Prepare)
        return bridged

    def _decode(self, handler: ApiHandler, request: RequestInfo) -> GroupRequest:
        key, version = request.api_key, request.api_version
        frame = request.frame
        try:
            header = parse_request_header(frame)
            value, _ = messages.decode_request(key, version, frame, header.header_length)
        except CodecError as exc:
            raise RejectRequest(f"malformed request (api key {key} v{version}): {exc}") from exc
        fleet = self._fleet
        session = self._session
        client_id, client_host, node_id = header.client_id, self._client_host, self._node_id
        principal = session.principal
        relayed = (unmark(client_id) if fleet is not None and fleet.inbound
                   and session.fleet_peer else None)
        relayed_by = None
        if relayed is not None:
            relayed_by = relayed.follower or f"0.2.0@{client_host}"
            client_id, client_host, node_id, principal = (
                relayed.client_id, relayed.client_host, relayed.node_id, relayed.principal)
            if relayed.software is not None and self._software is not None:
                self._software.note(client_host, client_id, *relayed.software)
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT and self._client_facing:
            given = self._heartbeat_answers.catch_up(value)
            if given is not None:
                log.debug("member %s carries epoch %d whose answer it has not read: it goes "
                          "on with epoch %d", value.get("member_id"), value["member_epoch"],
                          given)
                self._caught_up[request.correlation_id] = value["member_epoch"]
                value = dict(value, member_epoch=given)
        return GroupRequest(handler.api_key, version, request.correlation_id, client_id,
                            client_host, node_id, bytes(frame[:header.header_length]), value,
                            principal, relayed_by=relayed_by)

    def _decide(self, handler: ApiHandler, request: RequestInfo, group_request: GroupRequest,
                route: Route | None, authorized: bool = False) -> Decision:
        """Decide ``group_request``; ``route``: where its groups go, when a lookup found out;
        ``authorized``: it passed the authorization stage (and is what the stage let through)."""
        if self.liveness is not None and route is None and not authorized:
            self.liveness.group_request(group_request)  # pod-local liveness hook
        try:
            fleet = self._fleet
            groups = handler.group_ids(group_request) if fleet is not None else ()
            if not authorized and self._authorization is not None:
                checked = self._authorize(handler, request, group_request, groups, route)
                if not isinstance(checked, GroupRequest):
                    return checked
                if checked is not group_request:
                    group_request = checked
                    groups = handler.group_ids(group_request) if fleet is not None else ()
                authorized = True
            upgrades = handler.service.upgrades
            if self._client_facing and upgrades.converting and (hold := upgrades.holding(
                    handler.group_ids(group_request))) is not None:
                # the group is being moved to the engine (.upgrade): decided once it is
                return Prepare(self._after_hold(handler, request, hold))
            if fleet is not None and not fleet.inbound:
                route = route or fleet.routes.route(groups)
                if route.kind == LOOKUP:
                    # ask the broker first; the decoded request is not kept meanwhile (it is
                    # decoded and authorized again after, from the answers kept)
                    return Prepare(self._after_lookup(handler, request, groups))
            if (group_request.api_key == ApiKey.OFFSET_COMMIT and self._client_facing
                    and isinstance(handler, offsets.OffsetCommitHandler)):
                # the engine first: a commit it refuses gets its error, never a stale-retry
                # acknowledgement (:mod:`.commit_retries`)
                verdict = (handler.verdict(group_request)
                           if route is None or route.kind == LOCAL else None)
                if verdict in (None, ErrorCode.NONE):
                    group_request = self._without_stale_retries(handler, group_request,
                                                                verdict is None)
                if not group_request.value["topics"]:
                    return Local(self._encode(handler, group_request,
                                              {"throttle_time_ms": 0, "topics": []}))
            if fleet is not None:
                if fleet.inbound:
                    if group_request.relayed_by is not None:  # who relays for the groups
                        handler.service.relayers.note(groups, group_request.relayed_by)
                    # relayed by another sidecar: decided here or refused, never passed on
                    # again
                    if not all(self._claims(g) for g in groups):
                        return Local(self._encode(handler, group_request, handler.failure(
                            group_request, NOT_COORDINATOR)))
                else:
                    assert route is not None
                    if route.kind == RELAY:
                        if (isinstance(handler, offsets.OffsetCommitHandler)
                                and route.protocol >= tickets.TICKET_PROTOCOL):
                            # the holder validates, this sidecar sends it on the client's
                            # own connection (:mod:`.tickets`)
                            return Local(self._ticketed(handler, group_request, groups, route),
                                         holds_later=True)
                        return Local(self._relay(handler, group_request, groups, route),
                                     holds_later=True)
                    if route.kind != LOCAL:
                        fleet.routes.note_refused(groups, route.reason)
                        error = (UNKNOWN_MEMBER_ID
                                 if route.let_go and not _is_join(group_request)
                                 else COORDINATOR_NOT_AVAILABLE)
                        return Local(self._encode(handler, group_request,
                                                  handler.failure(group_request, error)))
            if (group_request.api_key in _MEMBER_APIS
                    and handler.service.stepped_down_from(
                        group_request.value.get("group_id") or "",
                        group_request.value.get("member_id") or "")):
                return Local(self._encode(handler, group_request, handler.failure(
                    group_request, COORDINATOR_NOT_AVAILABLE)))
            outcome = handler.decide(group_request)
            return held_while_inside(handler.service, group_request,
                                     self._decision(handler, group_request, outcome))
        except Exception:
            log.exception("deciding api key %d v%d failed", request.api_key,
                          request.api_version)
            return Local(self._encode(handler, group_request,
                                      handler.failure(group_request, UNKNOWN_SERVER_ERROR)))

    # -- authorization ------------------------------------------------------------------------

    def _authorize(self, handler: ApiHandler, request: RequestInfo, group_request: GroupRequest,
                   groups: tuple[str, ...], route: Route | None) -> GroupRequest | Decision:
        """The authorization stage: the request to go on with (what the client may do of
        it), or the decision answering it; a :class:`Prepare` when the broker must be asked
        first."""
        stage = self._authorization
        assert stage is not None
        fleet = self._fleet
        if fleet is not None and route is None:
            route = fleet.routes.route(groups)
        if not stage.applies(group_request, route is not None and route.kind != LOCAL):
            return group_request
        authorizer = self._authorizer
        if authorizer is not None:
            if authorizer.due():
                return Prepare(self._after_authorizer_check(handler, request, route))
            if not authorizer.in_force:
                return group_request
        needs = stage.missing(group_request)
        if needs:
            return Prepare(self._after_asking(handler, request, needs, route,
                                              group_request.client_id))
        return self._authorized(handler, group_request, stage.decide(
            handler, group_request, stage.known()))

    def _authorized(self, handler: ApiHandler, group_request: GroupRequest,
                    outcome: GroupRequest | Value) -> GroupRequest | Decision:
        if isinstance(outcome, GroupRequest):
            return outcome
        return Local(self._encode(handler, group_request, outcome))

    async def _after_authorizer_check(self, handler: ApiHandler, request: RequestInfo,
                                      route: Route | None) -> int | Rewrite | Local:
        assert self._authorizer is not None
        await self._authorizer.check()
        return await self._settled(self._decide(handler, request, self._decode(handler, request),
                                                route))

    async def _after_asking(self, handler: ApiHandler, request: RequestInfo, needs: Needs,
                            route: Route | None, client_id: str | None
                            ) -> int | Rewrite | Local:
        """Ask the broker on this connection what the client may do, then decide (the
        request's frame is still valid: the connection reads nothing else meanwhile)."""
        stage = self._authorization
        assert stage is not None
        learnt: dict[Fact, bool] | None = None
        error = COORDINATOR_NOT_AVAILABLE
        try:  # the decoded request is not kept while the broker is asked (a large commit)
            learnt = await stage.rights.ask(needs, client_id)
        except ProbeFailed as exc:
            log.info("authorizing api key %d: %s", request.api_key, exc)
        except Unanswerable as exc:
            error = exc.error
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise  # the connection is going: it closes as for any failed send
        except Exception:  # an answer the proxy cannot read: refused, never let through
            log.exception("authorizing api key %d v%d failed", request.api_key,
                          request.api_version)
            error = UNKNOWN_SERVER_ERROR
        group_request = self._decode(handler, request)
        if learnt is None:
            return Local(self._encode(handler, group_request,
                                      handler.failure(group_request, error)))
        checked = self._authorized(handler, group_request, stage.decide(
            handler, group_request, stage.known(learnt)))
        if not isinstance(checked, GroupRequest):
            assert not isinstance(checked, Prepare)
            return checked
        decision = self._decide(handler, request, checked, route, authorized=True)
        del group_request, checked  # not kept while a lookup is waited for
        return await self._settled(decision)

    @staticmethod
    async def _settled(decision: Decision) -> int | Rewrite | Local:
        return await decision.decision if isinstance(decision, Prepare) else decision

    async def _recheck(self, handler: ApiHandler, request: GroupRequest, value: Value) -> Value:
        """The checks of the authorization stage that need the answer (the topics it shows)."""
        completion = request.completion
        if completion is None or completion.recheck is None:
            return value
        try:
            return await completion.recheck(value)
        except (ProbeFailed, Unanswerable) as exc:
            log.info("authorizing the answer to api key %d: %s", request.api_key, exc)
            return handler.failure(dataclasses.replace(request, completion=None),
                                   COORDINATOR_NOT_AVAILABLE)

    async def _after_hold(self, handler: ApiHandler, request: RequestInfo, hold: trio.Event
                          ) -> int | Rewrite | Local:
        """A request of a group being converted (:mod:`.upgrade`): decided again once the
        conversion is over, or after :data:`~.upgrade.HOLD_SECONDS` (by then the group's
        takeover is registered, and the request waits for it in the service)."""
        with trio.move_on_after(upgrade.HOLD_SECONDS):
            await hold.wait()
        return await self._settled(self._decide(handler, request,
                                                self._decode(handler, request), None))

    # -- other sidecars -----------------------------------------------------------------------

    async def _after_lookup(self, handler: ApiHandler, request: RequestInfo,
                            groups: tuple[str, ...]) -> int | Rewrite | Local:
        """Where the request's groups are coordinated was not known: ask the broker, then
        decide the request again (its frame is still valid: the connection reads nothing
        else meanwhile); the authorization stage decides it again too, from the answers the
        connection keeps (or asks again if they expired meanwhile; the route is known now, so
        nothing is looked up twice)."""
        assert self._fleet is not None
        route = await self._fleet.routes.lookup(groups)
        return await self._settled(self._decide(handler, request,
                                                self._decode(handler, request), route))

    async def _relay(self, handler: ApiHandler, request: GroupRequest,
                     groups: tuple[str, ...], route: Route) -> bytes:
        assert self._fleet is not None and route.address is not None
        address = route.address
        try:
            value = await self._fleet.links.request(
                address, request.api_key, request.version, request.value,
                self._mark(request, route), to_peer=True)
        except UpstreamError as exc:
            log.info("relaying api key %d for %s to %s:%d failed: %s", request.api_key,
                     ",".join(groups), *address, exc)
            self._fleet.routes.forget(groups)
            metrics.FLEET_RELAYS.labels("failed").inc()
            value = handler.failure(request, NOT_COORDINATOR)
        else:
            if value.get("error_code") in _MOVED:
                self._fleet.routes.forget(groups)
            metrics.FLEET_RELAYS.labels("answered").inc()
            value = await self._recheck(handler, request, value)
        return self._encode(handler, request, value)

    def _mark(self, request: GroupRequest, route: Route) -> str:
        return mark_forwarded(request.client_id, request.client_host, request.node_id,
                              self._software.lookup(request.client_host,
                                                    request.client_id or "")
                              if self._software is not None else None,
                              request.principal, route.protocol,
                              self._fleet.routes.own_fleet_address if self._fleet else None)

    async def _ticketed(self, handler: offsets.OffsetCommitHandler, request: GroupRequest,
                        groups: tuple[str, ...], route: Route) -> bytes | Rewrite:
        """A commit of a group another sidecar holds: validated there, which answers a
        ticket (:mod:`.tickets`), then stamped and sent here, on the client's own connection,
        so that the broker authorizes it as the client's."""
        assert self._fleet is not None and route.address is not None
        address = route.address
        value = request.value
        asked = dict(value, topics=[  # the holder validates partitions, not their metadata
            dict(t, partitions=[dict(p, committed_metadata=None) for p in t["partitions"]])
            for t in value["topics"]])
        body = tickets.ask_body(request.api_key, request.version, self._mark(request, route),
                                messages.encode_request(request.api_key, request.version,
                                                        asked))
        del asked
        try:
            reply = tickets.read_reply(await self._fleet.links.control(
                address, FLEET_CONTROL, FLEET_CONTROL_VERSION, body))
        except (UpstreamError, ValueError) as exc:
            log.info("asking %s:%d for a commit ticket for %s failed: %s", *address,
                     ",".join(groups), exc)
            self._fleet.routes.forget(groups)
            metrics.FLEET_RELAYS.labels("failed").inc()
            return self._encode(handler, request, handler.failure(request, NOT_COORDINATOR))
        if reply is None:  # a holder without tickets: it commits as the proxy
            metrics.COMMIT_TICKETS.labels("relayed").inc()
            return await self._relay(handler, request, groups, route)
        metrics.FLEET_RELAYS.labels("answered").inc()
        ticket = reply.ticket
        if ticket is None:
            if reply.error in _MOVED:
                self._fleet.routes.forget(groups)
            metrics.COMMIT_TICKETS.labels("refused").inc()
            return self._encode(handler, request, handler.failure(request, reply.error))
        group_id = value["group_id"]
        service = handler.service
        if (request.node_id is not None and ticket.coordinator is not None
                and request.node_id != ticket.coordinator):
            # the client sent it to a broker that does not coordinate the group: as Kafka
            if ticket.member_id is not None:
                service.tickets.report(address, group_id, ticket.ticket_id, [])
            return self._encode(handler, request, handler.failure(request, NOT_COORDINATOR))
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

        return self._rewrite(handler, request, Upstream(
            ticket.stamped(value), on_response, lambda: report([]), ticket.version))

    def commit_tickets(self, body: dict[str, Any]) -> bytes | Awaitable[bytes]:
        """At the holder, on the fleet listener: a follower's ``CommitTicket`` (decided
        without being sent) or ``CommitDone`` (:mod:`.tickets`); the answer's body."""
        service = self._handlers[ApiKey.OFFSET_COMMIT].service
        if body.get("type") == tickets.COMMIT_DONE:
            try:
                group_id, ticket_id, errors = tickets.read_done(body)
            except ValueError:
                return tickets.reply_body(tickets.Reply(int(ErrorCode.INVALID_REQUEST)))
            known = service.tickets.book.done(group_id, ticket_id, errors)
            return tickets.reply_body(tickets.Reply(0 if known else UNKNOWN_MEMBER_ID))
        return self._ticket_answer(service, body)

    async def _ticket_answer(self, service: CoordinatorService, body: dict[str, Any]
                             ) -> bytes:
        return tickets.reply_body(await self._ticket_reply(service, body))

    async def _ticket_reply(self, service: CoordinatorService, body: dict[str, Any]
                            ) -> tickets.Reply:
        invalid = tickets.Reply(int(ErrorCode.INVALID_REQUEST))
        try:
            api_key, version, mark, payload = tickets.read_ask(body)
            handler = self._handlers.get(api_key)
            relayed = unmark(mark)
            if (not isinstance(handler, offsets.OffsetCommitHandler) or relayed is None
                    or not self._session.fleet_peer):
                return invalid
            value, _ = messages.decode_request(api_key, version, payload, 0)
        except (ValueError, CodecError):
            return invalid
        request = GroupRequest(handler.api_key, version, 0, relayed.client_id,
                               relayed.client_host, relayed.node_id, b"", value,
                               relayed.principal)
        if not all(self._claims(g) for g in handler.group_ids(request)):
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
            return tickets.Reply(_refusal(result) or _first_error(result)
                                 or UNKNOWN_SERVER_ERROR)
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
            ticket_id, stamped.get("member_id") or "", generation, result.version,
            coordinator))

    async def _upstream_via_link(self, handler: ApiHandler, request: GroupRequest,
                                 upstream: Upstream) -> bytes:
        """On the fleet listener: ``upstream`` goes to the group's broker coordinator on this
        connection's own link to it (the connection's upstream socket leads to a bootstrap
        server, which need not be the group's coordinator). Requests of one relayed client
        connection arrive one at a time, so they reach the broker in the client's order.

        The wait for the broker ends when this sidecar's lease on the group is cut off (the
        broker did not answer for a whole session, :meth:`CoordinatorService.lease_cut_off`):
        the request is then answered UNKNOWN_MEMBER_ID if its member is to let go of its
        partitions, else NOT_COORDINATOR, and the link is reset (the request is never
        carried out later under the new holder: it bears the lost membership's generation).
        The member's later requests wait behind it at the relaying sidecar: without the
        bound, a member whose commit reached a holder cut off from the broker heard nothing
        until the broker answered again, while another sidecar gave its partitions away."""
        assert self._fleet is not None
        answered = False
        try:
            groups = handler.group_ids(request)
            address = self._fleet.broker_of(groups)
            if address is None:
                value = handler.failure(request, NOT_COORDINATOR)
            else:
                try:
                    response = await self._until_cut_off(
                        handler.service, groups[0], self._fleet.links.request(
                            address, request.api_key,
                            request.version if upstream.version is None else upstream.version,
                            upstream.value, request.client_id or ""))
                except UpstreamError as exc:
                    log.info("api key %d to the group's broker %s:%d failed: %s",
                             request.api_key, *address, exc)
                    value = handler.failure(request, NOT_COORDINATOR)
                else:
                    if response is None:
                        member_id = request.value.get("member_id") or ""
                        lost = handler.service.to_let_go(groups[0], member_id)
                        log.info("api key %d of group %s: the lease was cut off before the "
                                 "group's broker answered", request.api_key, groups[0])
                        value = handler.failure(request, UNKNOWN_MEMBER_ID if lost
                                                else NOT_COORDINATOR)
                    else:
                        answered = True
                        value = upstream.on_response(response)
        except Exception:
            log.exception("answering api key %d v%d failed", request.api_key, request.version)
            value = handler.failure(request, UNKNOWN_SERVER_ERROR)
        finally:
            if not answered and upstream.release is not None:
                upstream.release()
        return self._encode(handler, request, value)

    @staticmethod
    async def _until_cut_off(service: CoordinatorService, group_id: str,
                             sent: Awaitable[Value]) -> Value | None:
        """``sent``'s answer, or None once the lease on ``group_id`` is cut off first
        (``sent`` is then cancelled)."""
        answer: Value | None = None

        async def watch(scope: trio.CancelScope) -> None:
            await service.lease_cut_off(group_id)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            answer = await sent
            nursery.cancel_scope.cancel()
        return answer

    # -- outcomes to decisions ----------------------------------------------------------------

    def _decision(self, handler: ApiHandler, request: GroupRequest, outcome: Outcome
                  ) -> Decision:
        if isinstance(outcome, Pass):
            tracked = (handler.service.upgrades.tracked(request, handler.group_ids(request))
                       if self._client_facing else None)  # online upgrade (.upgrade)
            return FORWARD if tracked is None else self._rewrite(handler, request, tracked)
        if isinstance(outcome, Upstream):
            if self._fleet is not None and self._fleet.inbound:
                return Local(self._upstream_via_link(handler, request, outcome),
                             holds_later=True)
            return self._rewrite(handler, request, outcome)
        answer = outcome.value
        completion = request.completion
        rechecked = (completion is not None and completion.recheck is not None
                     and completion.recheck_here)
        if isinstance(answer, dict):
            if rechecked:  # asks the broker: nothing may pass it meanwhile
                return Local(self._later(handler, request, _ready(answer)), holds_later=True)
            return Local(self._encode(handler, request, answer))
        return Local(self._later(handler, request, answer),
                     holds_later=handler.answers_upstream_later or rechecked)

    async def _later(self, handler: ApiHandler, request: GroupRequest,
                     answer: Awaitable[Value | Upstream]) -> bytes | Rewrite:
        try:
            result = await answer
            if isinstance(result, Upstream):
                if self._fleet is not None and self._fleet.inbound:
                    return await self._upstream_via_link(handler, request, result)
                return self._rewrite(handler, request, result)
            completion = request.completion
            if completion is not None and completion.recheck_here:
                result = await self._recheck(handler, request, result)
        except Exception:  # answer with an error rather than leave the client waiting
            log.exception("answering api key %d v%d failed", request.api_key, request.version)
            result = handler.failure(request, UNKNOWN_SERVER_ERROR)
        return self._encode(handler, request, result)

    def _rewrite(self, handler: ApiHandler, request: GroupRequest, upstream: Upstream
                 ) -> Rewrite:
        key = request.api_key
        version = (upstream.version if upstream.version is not None
                   else self.broker_version(key, request.version))
        sent = request.header if upstream.header is None else upstream.header
        header = (sent if version == request.version
                  else apiversions.downgraded(sent, version))
        payload = header + messages.encode_request(key, version, upstream.value)
        header_version = messages.response_header_version(key, version)

        def on_response(response: memoryview) -> bytes:
            try:
                start = body_offset(response, header_version)
                value, _ = messages.decode_response(key, version, response, start)
                value = upstream.on_response(value)
            except Exception:
                log.exception("the broker's answer to api key %d v%d could not be mapped",
                              key, version)
                value = handler.failure(request, UNKNOWN_SERVER_ERROR)
            return self._encode(handler, request, value)

        return Rewrite(payload, on_response, upstream.release)

    # -- commits a newer commit overtook -------------------------------------------------------

    @property
    def _client_facing(self) -> bool:
        """The application's own connection (not a relay from another sidecar)."""
        return self._fleet is None or not self._fleet.inbound

    def _without_stale_retries(self, handler: ApiHandler, request: GroupRequest,
                               unvalidated: bool) -> GroupRequest:
        """``request`` without the partitions that retry a commit a newer one of the same
        member overtook; they are acknowledged in its answer (:mod:`.commit_retries`).
        ``unvalidated``: no engine here validated it (it is decided elsewhere): only retries
        under the epoch of that newer commit count, and they share the error of the rest."""
        value = request.value
        epoch = value.get("generation_id_or_member_epoch", -1) if unvalidated else None
        retries = handler.service.commit_retries
        group_id, member_id = value["group_id"], value.get("member_id") or ""
        if not member_id:
            return request
        if len(self._committers) < MAX_COMMITTERS_PER_CONNECTION:
            self._committers.add((group_id, member_id))
        kept: list[Value] = []
        acknowledged: list[Value] = []
        for topic in value["topics"]:
            key = commit_retries.topic_key(topic)
            fresh = [p for p in topic["partitions"] if not retries.stale(
                group_id, member_id, (key, p["partition_index"]), p["committed_offset"],
                epoch)]
            stale = [p for p in topic["partitions"] if p not in fresh]
            if fresh:
                kept.append(dict(topic, partitions=fresh))
            if stale:
                acknowledged.append(dict(_topic_names(topic), partitions=[
                    {"partition_index": p["partition_index"], "error_code": 0} for p in stale]))
        if not acknowledged:
            return request
        count = sum(len(t["partitions"]) for t in acknowledged)
        retries.acknowledged += count
        metrics.STALE_COMMIT_RETRIES.inc(count)
        log.debug("group %s member %s: %d partition(s) of a retried commit acknowledged without "
                  "being written: a newer commit of the member stands", group_id, member_id,
                  count)
        self._stale_acknowledged[request.correlation_id] = acknowledged
        return dataclasses.replace(request, value=dict(value, topics=kept))

    def _observe_commit(self, handler: ApiHandler, request: GroupRequest, value: Value
                        ) -> Value:
        """Note what the client is told of its commit; add the partitions acknowledged as
        stale retries."""
        try:
            handler.service.commit_retries.observe(
                request.value["group_id"], request.value.get("member_id") or "", request.value,
                value)
        except (KeyError, TypeError):  # an answer without per-partition errors
            log.debug("commit answer without partitions: %r", value)
        acknowledged = self._stale_acknowledged.pop(request.correlation_id, None)
        if acknowledged:
            refused = _refusal(value)
            if refused:  # the coordinator refused the member: so are its stale partitions
                acknowledged = [dict(t, partitions=[dict(p, error_code=refused)
                                                    for p in t["partitions"]])
                                for t in acknowledged]
            value = dict(value, topics=[*value.get("topics", ()), *acknowledged])
        return value

    def _encode(self, handler: ApiHandler, request: GroupRequest, value: Value) -> bytes:
        """The response payload for ``value``, or the API's failure if it cannot be encoded
        (e.g. a value too long for the client's version). What the authorization stage refused
        of the request is put back into the answer here."""
        if request.completion is not None:
            value = request.completion.merge(value)
        if request.api_key == ApiKey.OFFSET_COMMIT and self._client_facing:
            value = self._observe_commit(handler, request, value)
        elif request.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT and self._client_facing:
            carried = self._caught_up.pop(request.correlation_id,
                                          request.value.get("member_epoch", 0))
            self._heartbeat_answers.answered(carried, request.value, value)
        key, version = request.api_key, request.version
        header = response_header_for(key, version, request.correlation_id)
        try:
            return header + messages.encode_response(key, version, value)
        except CodecError:
            log.exception("encoding the answer to api key %d v%d failed", key, version)
            failure = handler.failure(request, UNKNOWN_SERVER_ERROR)
            return header + messages.encode_response(key, version, failure)



_REFUSALS = frozenset(int(e) for e in (
    ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.STALE_MEMBER_EPOCH, ErrorCode.FENCED_MEMBER_EPOCH,
    ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID,
    ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.GROUP_AUTHORIZATION_FAILED))
"""Commit errors that refuse the member (or its epoch) rather than one partition."""


def _refusal(value: Value) -> int:
    """The member-refusing error a commit answer carries (0: none)."""
    for topic in value.get("topics", ()):
        for partition in topic.get("partitions", ()):
            if partition.get("error_code") in _REFUSALS:
                return int(partition["error_code"])
    return 0


def _first_error(value: Value) -> int:
    """The first partition error of a commit answer (0: none)."""
    for topic in value.get("topics", ()):
        for partition in topic.get("partitions", ()):
            if partition.get("error_code"):
                return int(partition["error_code"])
    return 0


def _topic_names(topic: Value) -> dict[str, Any]:
    """The fields naming a request topic (its name, or its id from v10 on)."""
    return {k: topic[k] for k in ("name", "topic_id") if k in topic}


async def _ready(value: Value) -> Value:
    return value


def _unchanged_bytes(_response: memoryview) -> None:
    """A response filter passing the broker's answer on as it is."""
    return None


def _is_join(request: GroupRequest) -> bool:
    """A member asking to join (it holds nothing of the group yet)."""
    value = request.value
    if request.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        return bool(value.get("member_epoch", 0) == 0)
    if request.api_key == ApiKey.JOIN_GROUP:
        return not value.get("member_id")
    return False
