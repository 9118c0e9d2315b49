"""The relay, on the client-facing list after the fleet route: to the holder, or refused.

A request whose groups another sidecar holds (``passage.route`` is RELAY) is relayed to that
sidecar's fleet listener on this connection's own link to it (:class:`~..peers.ConnectionLinks`),
marked with the application's client id, address, listener, software and principal
(:func:`~..fleet.mark_forwarded`); no later request of the connection passes it. A request with
a way to reach the broker as the client's own (:class:`SentHere`: commit tickets for
OffsetCommit and TxnOffsetCommit, :mod:`..offsets.ticketed`) is instead decided by the holder
and sent here on the client's own connection, when the holder speaks a fleet protocol that
has it. A request whose groups cannot be followed (REFUSE) is
answered COORDINATOR_NOT_AVAILABLE, or UNKNOWN_MEMBER_ID for a member that must also let go.
Requests of groups decided here (LOCAL) go on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import Protocol

from proxy import metrics
from proxy.codec.api_keys import ApiKey
from proxy.connection import Decision, Local, Rewrite
from proxy.coordination.fleet import mark_forwarded
from proxy.coordination.handler import ApiHandler, GroupRequest
from proxy.coordination.peers import LOCAL, RELAY, Route
from proxy.coordination.stages.authorize import recheck
from proxy.coordination.stages.stage import Chain, Passage, Stage
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)
UNKNOWN_MEMBER_ID = int(ErrorCode.UNKNOWN_MEMBER_ID)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
MOVED = frozenset({NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE})
"""A holder's answers that say the group is no longer there: the view of it is dropped."""


class SentHere(Protocol):
    """A way for requests of a group another sidecar holds to reach the broker as the client's
    own: the holder decides what is the engine's (a commit ticket), and this sidecar sends
    the rest on the client's own connection."""

    def __call__(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                 groups: tuple[str, ...], route: Route) -> Awaitable[bytes | Rewrite] | None:
        """The answer to ``request`` (or the request to send upstream) when it goes this way
        to the holder ``route`` leads to; None: relay it."""
        ...


class Relay(Stage):
    """Relays, sends on the client's connection, or refuses a request another sidecar
    decides."""

    __slots__ = ("_ways",)

    def __init__(self, sent_here: Sequence[SentHere] = ()) -> None:
        self._ways = tuple(sent_here)

    def request(self, passage: Passage) -> Decision | None:
        route = passage.route
        assert route is not None
        if route.kind == LOCAL:
            return None
        chain, handler, request = passage.chain, passage.handler, passage.request
        groups = passage.groups()
        if route.kind == RELAY:
            for way in self._ways:
                answer = way(chain, handler, request, groups, route)
                if answer is not None:
                    return Local(answer, holds_later=True)
            return Local(relay(chain, handler, request, groups, route), holds_later=True)
        assert chain.fleet is not None
        chain.fleet.routes.note_refused(groups, route.reason)
        error = (UNKNOWN_MEMBER_ID if route.let_go and not _is_join(request)
                 else COORDINATOR_NOT_AVAILABLE)
        return Local(chain.encode(handler, request, handler.failure(request, error)))


async def relay(chain: Chain, handler: ApiHandler, request: GroupRequest,
                groups: tuple[str, ...], route: Route) -> bytes:
    """``request`` relayed to the sidecar ``route`` leads to; its answer, encoded."""
    fleet = chain.fleet
    assert fleet is not None and route.address is not None
    address = route.address
    try:
        value = await fleet.links.request(
            address, request.api_key, request.version, request.value,
            mark(chain, request, route), to_peer=True)
    except UpstreamError as exc:
        log.info("relaying api key %d for %s to %s:%d failed: %s", request.api_key,
                 ",".join(groups), *address, exc)
        fleet.routes.forget(groups)
        metrics.FLEET_RELAYS.labels("failed").inc()
        value = handler.failure(request, NOT_COORDINATOR)
    else:
        if value.get("error_code") in MOVED:
            fleet.routes.forget(groups)
        metrics.FLEET_RELAYS.labels("answered").inc()
        value = await recheck(handler, request, value)
    return chain.encode(handler, request, value)


def mark(chain: Chain, request: GroupRequest, route: Route) -> str:
    """The client id a relay of ``request`` carries: who the application is, as the holder's
    fleet protocol reads it (protocol 3: and this sidecar's fleet address, so that a
    hand-back of the group tells it, :mod:`..release_fleet`)."""
    software = chain.software
    return mark_forwarded(request.client_id, request.client_host, request.node_id,
                          software.lookup(request.client_host, request.client_id or "")
                          if software is not None else None,
                          request.principal, route.protocol,
                          chain.fleet.routes.own_fleet_address if chain.fleet else None)


def _is_join(request: GroupRequest) -> bool:
    """A member asking to join (it holds nothing of the group yet)."""
    value = request.value
    if request.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        return bool(value.get("member_epoch", 0) == 0)
    if request.api_key == ApiKey.JOIN_GROUP:
        return not value.get("member_id")
    return False
