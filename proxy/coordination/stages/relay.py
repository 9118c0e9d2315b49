"""The relay, on the client-facing list after the fleet route: to the holder, or refused.

A request whose groups another sidecar holds (``passage.route`` is RELAY) is relayed to that
sidecar's fleet listener on this connection's own link to it (:class:`~..peers.ConnectionLinks`),
marked with the application's client id, address, listener, software and principal
(:func:`~..fleet.mark_forwarded`); no later request of the connection passes it. An API with a
ticketed way (:class:`Ticketed`: OffsetCommit and TxnOffsetCommit, :mod:`..offsets.ticketed`) is
instead validated by the holder and sent here on the client's own connection, when the holder
speaks a fleet protocol that has tickets. A request whose groups cannot be followed (REFUSE) is
answered COORDINATOR_NOT_AVAILABLE, or UNKNOWN_MEMBER_ID for a member that must also let go.
Requests of groups decided here (LOCAL) go on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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


class Ticketed(Protocol):
    """An API whose requests of a group another sidecar holds are not relayed: the holder
    decides them, and this sidecar carries them out on the client's own connection."""

    def takes(self, handler: ApiHandler, route: Route) -> bool:
        """Whether ``handler``'s requests go this way to the holder ``route`` leads to."""
        ...

    async def send(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                   groups: tuple[str, ...], route: Route) -> bytes | Rewrite | None:
        """The answer, or the request to send upstream; None: the holder does not take this
        way (relay the request instead)."""
        ...


class Relay(Stage):
    """Relays, sends ticketed, or refuses a request another sidecar decides."""

    __slots__ = ("_ticketed",)

    def __init__(self, ticketed: Sequence[Ticketed] = ()) -> None:
        self._ticketed = tuple(ticketed)

    def request(self, passage: Passage) -> Decision | None:
        route = passage.route
        assert route is not None
        if route.kind == LOCAL:
            return None
        chain, handler, request = passage.chain, passage.handler, passage.request
        groups = passage.groups()
        if route.kind == RELAY:
            for way in self._ticketed:
                if way.takes(handler, route):
                    return Local(_ticketed(way, chain, handler, request, groups, route),
                                 holds_later=True)
            return Local(relay(chain, handler, request, groups, route), holds_later=True)
        assert chain.fleet is not None
        chain.fleet.routes.note_refused(groups, route.reason)
        error = (UNKNOWN_MEMBER_ID if route.let_go and not _is_join(request)
                 else COORDINATOR_NOT_AVAILABLE)
        return Local(chain.encode(handler, request, handler.failure(request, error)))


async def _ticketed(way: Ticketed, chain: Chain, handler: ApiHandler, request: GroupRequest,
                    groups: tuple[str, ...], route: Route) -> bytes | Rewrite:
    answer = await way.send(chain, handler, request, groups, route)
    if answer is None:  # a holder without tickets
        return await relay(chain, handler, request, groups, route)
    return answer


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
    fleet protocol reads it."""
    software = chain.software
    return mark_forwarded(request.client_id, request.client_host, request.node_id,
                          software.lookup(request.client_host, request.client_id or "")
                          if software is not None else None,
                          request.principal, route.protocol)


def _is_join(request: GroupRequest) -> bool:
    """A member asking to join (it holds nothing of the group yet)."""
    value = request.value
    if request.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        return bool(value.get("member_epoch", 0) == 0)
    if request.api_key == ApiKey.JOIN_GROUP:
        return not value.get("member_id")
    return False
