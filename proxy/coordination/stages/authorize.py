"""Authorization, on the client-facing list before the fleet route: the client's rights first.

A request the proxy will answer or relay, in part or whole, is authorized as the client's before
anything is done for it (a lookup, a takeover, a relay, a commit sent for another sidecar's
client), so nothing the proxy does as itself is started by a client that may not use the group.
What is asked and what each API's refusal looks like is the policy of
:class:`~proxy.coordination.authorization.AuthorizationStage`; this stage runs it: from the
connection's cached answers when it holds them all, else after asking the broker on the
client's own connection (a :class:`~proxy.connection.Prepare`; the request is decided again
from decoding, with what was learnt). Only the authorized part goes on; what was refused is put
back into the answer on its way out (:meth:`Authorize.answer`), and checks that need the answer
first (the topics it shows) run on answers that did not come from the broker on this connection
(:func:`recheck`). Requests relayed here by another sidecar were authorized by the sidecar
their client is connected to: the fleet listener's list has no such stage.
"""

from __future__ import annotations

import dataclasses
import logging

import trio

from proxy.connection import Decision, Local, Prepare, ProbeFailed, RequestInfo, Rewrite
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.handler import ApiHandler, GroupRequest, Value
from proxy.coordination.peers import LOCAL, Route
from proxy.coordination.stages.stage import Chain, Passage, Stage, settled
from proxy.security.rights import AuthorizerCheck, Fact, Needs, Unanswerable
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)


class Authorize(Stage):
    """The connection's authorization stage (``policy``: what it asks and refuses)."""

    __slots__ = ("authorizer", "policy")

    def __init__(self, policy: AuthorizationStage, authorizer: AuthorizerCheck | None) -> None:
        """``authorizer``: whether the brokers have an authorizer (None: assume so)."""
        self.policy = policy
        self.authorizer = authorizer

    def request(self, passage: Passage) -> Decision | None:
        if passage.authorized:
            return None
        chain, handler, request = passage.chain, passage.handler, passage.request
        route = passage.route
        fleet = chain.fleet
        if fleet is not None and route is None:
            route = fleet.routes.route(passage.groups())
        policy = self.policy
        if policy.applies(request, route is not None and route.kind != LOCAL):
            authorizer = self.authorizer
            if authorizer is not None and authorizer.due():
                return Prepare(self._after_authorizer_check(chain, handler, passage.info,
                                                            route))
            if authorizer is None or authorizer.in_force:
                needs = policy.missing(request)
                if needs:  # the broker is asked first
                    return Prepare(self._after_asking(chain, handler, passage.info, needs,
                                                      route, request.client_id))
                checked = _authorized(chain, handler, request,
                                      policy.decide(handler, request, policy.known()))
                if not isinstance(checked, GroupRequest):
                    return checked
                passage.request = checked
        passage.authorized = True
        return None

    def answer(self, request: GroupRequest, value: Value) -> Value:
        completion = request.completion
        return value if completion is None else completion.merge(value)

    async def _after_authorizer_check(self, chain: Chain, handler: ApiHandler,
                                      info: RequestInfo, route: Route | None
                                      ) -> int | Rewrite | Local:
        assert self.authorizer is not None
        await self.authorizer.check()
        return await settled(chain.decide(handler, info, route))

    async def _after_asking(self, chain: Chain, handler: ApiHandler, info: RequestInfo,
                            needs: Needs, route: Route | None, client_id: str | None
                            ) -> int | Rewrite | Local:
        """Ask the broker on this connection what the client may do, then decide (the
        request's frame is still valid: the connection reads nothing else meanwhile)."""
        policy = self.policy
        learnt: dict[Fact, bool] | None = None
        error = COORDINATOR_NOT_AVAILABLE
        try:  # the decoded request is not kept while the broker is asked (a large commit)
            learnt = await policy.rights.ask(needs, client_id)
        except ProbeFailed as exc:
            log.info("authorizing api key %d: %s", info.api_key, exc)
        except Unanswerable as exc:
            error = exc.error
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise  # the connection is going: it closes as for any failed send
        except Exception:  # an answer the proxy cannot read: refused, never let through
            log.exception("authorizing api key %d v%d failed", info.api_key, info.api_version)
            error = UNKNOWN_SERVER_ERROR
        passage = chain.passage(handler, info, route)
        request = passage.request
        if learnt is None:
            return Local(chain.encode(handler, request, handler.failure(request, error)))
        checked = _authorized(chain, handler, request,
                              policy.decide(handler, request, policy.known(learnt)))
        if not isinstance(checked, GroupRequest):
            assert not isinstance(checked, Prepare)
            return checked
        passage.request = checked
        passage.authorized = True
        decision = chain.decide(handler, info, passage=passage)
        del passage, request, checked  # not kept while a lookup is waited for
        return await settled(decision)


def _authorized(chain: Chain, handler: ApiHandler, request: GroupRequest,
                outcome: GroupRequest | Value) -> GroupRequest | Decision:
    if isinstance(outcome, GroupRequest):
        return outcome
    return Local(chain.encode(handler, request, outcome))


async def recheck(handler: ApiHandler, request: GroupRequest, value: Value) -> Value:
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
