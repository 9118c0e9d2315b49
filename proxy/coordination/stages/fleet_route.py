"""The fleet route, on the client-facing list: which sidecar decides the request's groups.

Among several sidecars (:mod:`..fleet`), a request naming groups this sidecar does not hold
goes to the sidecar that holds them. This stage finds out where (:class:`~..peers.Routes`: here,
relay, refuse, or not known yet) and notes it in ``passage.route`` for the stages after it; a
group whose holder is not known is looked up at the broker first (a
:class:`~proxy.connection.Prepare`; the request is decided again from decoding, and the
authorization stage decides it again from the answers the connection keeps, or asks again if
they expired meanwhile; the route is known then, so nothing is looked up twice). What is done
with the route is the relay stage's (:mod:`.relay`).
"""

from __future__ import annotations

from proxy.connection import Decision, Local, Prepare, RequestInfo, Rewrite
from proxy.coordination.handler import ApiHandler
from proxy.coordination.peers import LOOKUP
from proxy.coordination.stages.stage import Chain, Passage, Stage, settled


class FleetRoute(Stage):
    """Notes the route of the request's groups; looks a group up first where not known."""

    __slots__ = ()

    def request(self, passage: Passage) -> Decision | None:
        fleet = passage.chain.fleet
        assert fleet is not None
        groups = passage.groups()
        route = passage.route or fleet.routes.route(groups)
        if route.kind == LOOKUP:
            # ask the broker first; the decoded request is not kept meanwhile
            return Prepare(_after_lookup(passage.chain, passage.handler, passage.info, groups))
        passage.route = route
        return None


async def _after_lookup(chain: Chain, handler: ApiHandler, info: RequestInfo,
                        groups: tuple[str, ...]) -> int | Rewrite | Local:
    """Where the request's groups are coordinated was not known: ask the broker, then decide
    the request again (its frame is still valid: the connection reads nothing else
    meanwhile)."""
    assert chain.fleet is not None
    route = await chain.fleet.routes.lookup(groups)
    return await settled(chain.decide(handler, info, route))
