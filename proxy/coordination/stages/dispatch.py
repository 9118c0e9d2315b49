"""Dispatch, last on both lists: the API's handler decides, and its outcome becomes the decision.

The handler (:mod:`..handler`) returns values, never bytes: PASS (the client's bytes go to the
broker), an :class:`~..handler.Upstream` (a changed request goes upstream and its answer is
mapped back) or an :class:`~..handler.Answer` (now, or an awaitable that may end upstream).
Here they become the connection's decisions, encoded with the client's header and version
(:meth:`~.stage.Chain.encode`), with the member held inside this sidecar until it is answered
(:mod:`..inside`). On an application's connection (:class:`Dispatch`) the changed request goes
on the client's own connection to its broker, and a forwarded request of a group about to be
converted is counted while it is at the broker (:meth:`~..upgrade.Upgrades.tracked`). On the
fleet listener (:class:`DispatchRelayed`) the connection leads to a bootstrap broker, so a
changed request goes to the group's broker coordinator on the connection's own link to it,
and its wait ends when this sidecar's lease on the group is cut off.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import trio

from proxy import apiversions
from proxy.codec import messages
from proxy.connection import FORWARD, Decision, Local, Rewrite
from proxy.coordination.handler import ApiHandler, GroupRequest, Pass, Upstream, Value
from proxy.coordination.inside import held_while_inside
from proxy.coordination.stages.authorize import recheck
from proxy.coordination.stages.stage import Chain, Passage, RouterCalls, Stage, ready
from proxy.router import body_offset
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)
NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)
UNKNOWN_MEMBER_ID = int(ErrorCode.UNKNOWN_MEMBER_ID)


class Dispatch(Stage):
    """An application's request to its handler; changed requests go on its own connection."""

    __slots__ = ()

    def request(self, passage: Passage) -> Decision | None:
        chain, handler, request = passage.chain, passage.handler, passage.request
        outcome = handler.decide(request)
        decision: Decision
        if isinstance(outcome, Pass):
            decision = self.passed(chain, handler, request)
        elif isinstance(outcome, Upstream):
            decision = self.upstream(chain, handler, request, outcome)
        else:
            answer = outcome.value
            completion = request.completion
            rechecked = (completion is not None and completion.recheck is not None
                         and completion.recheck_here)
            if isinstance(answer, dict):
                decision = (  # a recheck asks the broker: nothing may pass it meanwhile
                    Local(self._later(chain, handler, request, ready(answer)), holds_later=True)
                    if rechecked else Local(chain.encode(handler, request, answer)))
            else:
                decision = Local(self._later(chain, handler, request, answer),
                                 holds_later=handler.answers_upstream_later or rechecked)
        return held_while_inside(chain.service, request, decision)

    def passed(self, chain: Chain, handler: ApiHandler, request: GroupRequest) -> Decision:
        """The handler passes the request: forwarded as the client sent it (counted while
        at the broker if its group is a conversion candidate, and its answer through the
        conversion's safety net, :mod:`..upgrade`)."""
        tracked = chain.service.upgrades.tracked(  # its answer through the safety net
            request, handler.group_ids(request), lambda code: handler.failure(request, code))
        return FORWARD if tracked is None else rewrite(chain, handler, request, tracked)

    def upstream(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                 upstream: Upstream) -> Decision:
        return rewrite(chain, handler, request, upstream)

    async def upstream_later(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                             upstream: Upstream) -> bytes | Rewrite:
        return rewrite(chain, handler, request, upstream)

    async def _later(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                     answer: Awaitable[Value | Upstream]) -> bytes | Rewrite:
        try:
            result = await answer
            if isinstance(result, Upstream):
                return await self.upstream_later(chain, handler, request, result)
            completion = request.completion
            if completion is not None and completion.recheck_here:
                result = await recheck(handler, request, result)
        except Exception:  # answer with an error rather than leave the client waiting
            log.exception("answering api key %d v%d failed", request.api_key, request.version)
            result = handler.failure(request, UNKNOWN_SERVER_ERROR)
        return chain.encode(handler, request, result)


class DispatchRelayed(Dispatch):
    """A relayed request to its handler; changed requests go to the group's broker on this
    connection's own link to it."""

    __slots__ = ()

    def passed(self, chain: Chain, handler: ApiHandler, request: GroupRequest) -> Decision:
        return FORWARD

    def upstream(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                 upstream: Upstream) -> Decision:
        return Local(self.upstream_later(chain, handler, request, upstream), holds_later=True)

    async def upstream_later(self, chain: Chain, handler: ApiHandler, request: GroupRequest,
                             upstream: Upstream) -> bytes:
        """``upstream`` to the group's broker coordinator on this connection's own link to it
        (the connection's upstream socket leads to a bootstrap server, which need not be the
        group's coordinator). Requests of one relayed client connection arrive one at a
        time, so they reach the broker in the client's order.

        The wait for the broker ends when this sidecar's lease on the group is cut off (the
        broker did not answer for a whole session,
        :meth:`~..service.CoordinatorService.lease_cut_off`): the request is then answered
        UNKNOWN_MEMBER_ID if its member is to let go of its partitions, else NOT_COORDINATOR,
        and the link is reset (the request is never carried out later under the new holder:
        it bears the lost membership's generation). The member's later requests wait behind
        it at the relaying sidecar: without the bound, a member whose commit reached a holder
        cut off from the broker heard nothing until the broker answered again, while another
        sidecar gave its partitions away."""
        fleet = chain.fleet
        assert fleet is not None
        answered = False
        try:
            groups = handler.group_ids(request)
            address = fleet.broker_of(groups)
            if address is None:
                value = handler.failure(request, NOT_COORDINATOR)
            else:
                try:
                    response = await _until_cut_off(
                        chain.service, groups[0], fleet.links.request(
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
                        lost = chain.service.to_let_go(groups[0], member_id)
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
        return chain.encode(handler, request, value)


async def _until_cut_off(service: RouterCalls, group_id: str, sent: Awaitable[Value]
                         ) -> Value | None:
    """``sent``'s answer, or None once the lease on ``group_id`` is cut off first (``sent``
    is then cancelled). The watch is a task of this call's own nursery, over when it
    returns."""
    answer: Value | None = None

    async def watch(scope: trio.CancelScope) -> None:
        await service.lease_cut_off(group_id)
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        answer = await sent
        nursery.cancel_scope.cancel()
    return answer


def rewrite(chain: Chain, handler: ApiHandler, request: GroupRequest, upstream: Upstream
            ) -> Rewrite:
    """``upstream`` sent on the client's own connection, at the version the broker behind it
    serves, and the broker's answer mapped back and encoded for the client."""
    key = request.api_key
    version = (upstream.version if upstream.version is not None
               else chain.broker_version(key, request.version))
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
        return chain.encode(handler, request, value)

    return Rewrite(payload, on_response, upstream.release)
