"""The connection router when the proxy coordinates groups: one handler per group API, reached
through a chain of small stages.

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
passes the request through the connection's stage list (:mod:`.stages`), which decodes it,
decides it on the way to its handler and encodes the answer; a request the broker gets as the
client sent it, at a version this connection's broker lacks, goes as the older one.

This module composes the two lists (:func:`client_facing`, :func:`from_a_sidecar`):

    an application's connection:  decode ─ pod-local liveness ─ authorization ─ conversion
                                  hold ─ fleet route ─ stale retries ─ relay ─ stepped down ─
                                  dispatch ─ (answers back through them) ─ encode
    a relay from another sidecar: decode the relay mark ─ relayers noted ─ held here ─
                                  stepped down ─ dispatch to the group's broker ─ encode

A relayed request arriving from another sidecar is never relayed again. Its mark (client id,
host, listener, software, principal) is believed only on a connection that proved it comes
from a sidecar (the connection's :class:`~proxy.security.session.Session`, ``fleet_peer``);
anywhere else a client id that looks like a mark is just a client id. On the fleet listener
the connection also answers what followers ask for their members' requests that reach the
broker as the client's own (:meth:`CoordinatingRouter.commit_tickets`: commit tickets,
:mod:`.offsets.ticketed`; remainders and heartbeats with their member's rights,
:mod:`.as_the_client`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from proxy import apiversions
from proxy.codec.api_keys import ApiKey
from proxy.connection import (
    EXAMINE,
    FORWARD,
    Decision,
    Local,
    Prepare,
    RejectRequest,
    RequestInfo,
    Rewrite,
)
from proxy.coordination import as_the_client, classic, consumer_group, listing, offsets, release
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.handler import ApiHandler
from proxy.coordination.offsets import ticketed
from proxy.coordination.offsets.retries import StaleRetries
from proxy.coordination.peek import group_id_of
from proxy.coordination.peers import RELAY, FleetSide
from proxy.coordination.service import CoordinatorService
from proxy.coordination.stages.authorize import Authorize
from proxy.coordination.stages.conversion import ConversionHold
from proxy.coordination.stages.decode import ClientDecoder, RelayedDecoder
from proxy.coordination.stages.dispatch import Dispatch, DispatchRelayed
from proxy.coordination.stages.fleet_route import FleetRoute
from proxy.coordination.stages.held_here import HeldHere
from proxy.coordination.stages.liveness import PodLiveness
from proxy.coordination.stages.relay import Relay
from proxy.coordination.stages.relayers import NoteRelayers
from proxy.coordination.stages.stage import Chain, Decoder, Stage
from proxy.coordination.stages.stepped_down import SteppedDown
from proxy.journal.clients import ClientSoftwareDirectory
from proxy.metrics import RequestCounters
from proxy.rewrite import AddressMap
from proxy.router import ForwardingRouter
from proxy.security.rights import AuthorizerCheck, ProbeSend
from proxy.security.session import Session

if TYPE_CHECKING:
    from proxy.coordination.pod_liveness import ConnectionWatch


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


# -- the two stage lists ----------------------------------------------------------------------

CONVERSION_HOLD = ConversionHold()
FLEET_ROUTE = FleetRoute()
NOTE_RELAYERS = NoteRelayers()
SENT_HERE = (ticketed.commit_ticket, as_the_client.remainder)
"""The relay stage's ways to the broker as the client's own that keep nothing of a
connection (the relayed heartbeats' keeps the connection's authorization stage)."""
HELD_HERE = HeldHere()
STEPPED_DOWN = SteppedDown()
DISPATCH = Dispatch()
DISPATCH_RELAYED = DispatchRelayed()
"""The stages that keep nothing of a connection, shared by all."""


def client_facing(service: CoordinatorService, node_id: int | None, client_host: str,
                  session: Session, fleet: FleetSide | None,
                  authorization: AuthorizationStage | None, authorizer: AuthorizerCheck | None
                  ) -> tuple[Decoder, list[Stage]]:
    """An application's own connection: its requests are authorized as its own, routed among
    the sidecars, guarded against stale commit retries, and decided by their handler here or
    relayed (pod-local liveness goes first once the connection's watch is set,
    :attr:`CoordinatingRouter.liveness`). Without a fleet, every group is decided here."""
    stages: list[Stage | None] = [
        Authorize(authorization, authorizer) if authorization is not None else None,
        CONVERSION_HOLD,
        FLEET_ROUTE if fleet is not None else None,
        StaleRetries(service.commit_retries),
        # relayed heartbeats bring the member's rights, asked on this connection
        (Relay(sent_here=(*SENT_HERE, as_the_client.RelayedHeartbeats(authorization)))
         if fleet is not None else None),
        STEPPED_DOWN,
        DISPATCH,
    ]
    return ClientDecoder(node_id, client_host, session), [s for s in stages if s is not None]


def from_a_sidecar(node_id: int | None, client_host: str, session: Session,
                   software: ClientSoftwareDirectory | None) -> tuple[Decoder, list[Stage]]:
    """A connection on the fleet listener: requests another sidecar relayed, authorized there,
    decided here or refused, never relayed again."""
    return (RelayedDecoder(node_id, client_host, session, software),
            [NOTE_RELAYERS, HELD_HERE, STEPPED_DOWN, DISPATCH_RELAYED])


# -- the router ---------------------------------------------------------------------------------

class CoordinatingRouter(ForwardingRouter):
    """Per-connection routing with the coordinator service behind it."""

    __slots__ = ("_authorization", "_chain", "_claims", "_client_host", "_fleet", "_handlers",
                 "_liveness", "_software")

    def __init__(self, address_map: AddressMap, counters: RequestCounters,
                 accepted: dict[int, tuple[int, int]], handlers: dict[int, ApiHandler],
                 node_id: int | None, client_host: str,
                 claims: Callable[[str], bool] = lambda _group_id: True,
                 fleet: FleetSide | None = None,
                 software: ClientSoftwareDirectory | None = None,
                 session: Session | None = None,
                 authorization: AuthorizationStage | None = None,
                 authorizer: AuthorizerCheck | None = None) -> None:
        """``fleet``: this connection's place among several sidecars (None: this proxy
        decides all; ``fleet.inbound``: a connection on the fleet listener); ``claims``:
        whether the proxy coordinates (or is taking over) a group; ``software``: where the
        client software named in ApiVersions (KIP-511) is noted (the journal);
        ``session``: what is known of the connection's authentication (filled as it
        authenticates); ``authorization``: the authorization stage of this connection (None:
        requests are not authorized by the proxy); ``authorizer``: whether the brokers have
        an authorizer (None: assume so)."""
        super().__init__(address_map, counters, accepted, served_versions(handlers),
                         {k: v for k, v in apiversions.BRIDGED.items() if k in handlers})
        self._handlers = handlers
        self._client_host = client_host
        self._claims = claims
        self._fleet = fleet
        self._software = software
        self._liveness: ConnectionWatch | None = None
        session = session if session is not None else Session("")
        service = next(iter(handlers.values())).service
        inbound = fleet is not None and fleet.inbound
        self._authorization = None if inbound else authorization
        decoder, stages = (from_a_sidecar(node_id, client_host, session, software) if inbound
                           else client_facing(service, node_id, client_host, session, fleet,
                                              self._authorization, authorizer))
        self._chain = Chain(decoder, stages, handlers=handlers, service=service, claims=claims,
                            fleet=fleet, session=session, software=software,
                            broker_version=self.broker_version)

    @property
    def chain(self) -> Chain:
        """This connection's stage list."""
        return self._chain

    @property
    def liveness(self) -> ConnectionWatch | None:
        """Pod-local liveness hook (:mod:`.pod_liveness`): told the connection's ApiVersions
        and group requests; set by the router factory on client-facing connections."""
        return self._liveness

    @liveness.setter
    def liveness(self, watch: ConnectionWatch | None) -> None:
        self._liveness = watch
        self._chain.with_stage_first(PodLiveness(watch) if watch is not None else None,
                                     PodLiveness)

    def attach(self, send: ProbeSend) -> None:
        """The connection's way to ask the broker on the client's own connection."""
        if self._authorization is not None:
            self._authorization.rights.attach(send)

    async def aclose(self) -> None:
        """The client's connection closed: the stages let go of it (its commits still on
        their way are retried by the client, :mod:`.offsets.retries`); close the links it
        opened."""
        self._chain.closed()
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
            if self._liveness is not None:  # pod-local liveness hook
                self._liveness.api_versions(request.frame, request.api_version)
        action = super().classify(request)
        if action == FORWARD and request.api_key in self._handlers:
            return EXAMINE
        return action

    def decide(self, request: RequestInfo) -> Decision:
        handler = self._handlers.get(request.api_key)
        if handler is None:
            return super().decide(request)  # ApiVersions newer than the proxy knows
        return self._bridge(request, self._chain.decide(handler, request))

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

    def commit_tickets(self, body: dict[str, Any]) -> bytes | Awaitable[bytes]:
        """At the holder, on the fleet listener: a follower's ``CommitTicket`` or
        ``CommitDone`` (:mod:`.offsets.ticketed`), ``Remainder`` or ``Heartbeat``
        (:mod:`.as_the_client`); the answer's body."""
        return as_the_client.answer(self._chain, body)


def _unchanged_bytes(_response: memoryview) -> None:
    """A response filter passing the broker's answer on as it is."""
    return None
