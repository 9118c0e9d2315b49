"""The router's two stage lists: what each connection's requests pass, in which order, and that
every answer goes back through the answer hooks whichever stage made it
(:mod:`proxy.coordination.stages`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.codec.api_keys import ApiKey
from proxy.connection import ProbeFailed
from proxy.coordination.authorization import AuthorizationStage
from proxy.coordination.offsets.retries import StaleRetries
from proxy.coordination.peers import ConnectionLinks, FleetSide
from proxy.coordination.routing import CoordinatingRouter, handler_table
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
from proxy.coordination.stages.stepped_down import SteppedDown
from proxy.metrics import RequestCounters
from proxy.rewrite import DictAddressMap
from proxy.router import parse_table
from proxy.security.rights import Rights
from proxy.security.session import Session
from translation.errors import ErrorCode

from .helpers import TOPIC, coordinate, exchange, make_service, request, router

COORDINATOR_NOT_AVAILABLE = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)


def _authorizing(service: CoordinatorService, send: Any, *, fleet: bool = False
                 ) -> CoordinatingRouter:
    side = (FleetSide(service.routes, ConnectionLinks(service.pool), False, service.broker_of)
            if fleet else None)
    return CoordinatingRouter(
        DictAddressMap({}), RequestCounters("test"), parse_table(), handler_table(service), 1,
        "/10.0.0.7", claims=service.claims, fleet=side, session=Session("test"),
        authorization=AuthorizationStage(Rights(send, ttl=5.0, timer=lambda: 0.0), service))


def _kinds(stages: Any) -> list[type]:
    return [type(s) for s in stages]


def test_an_application_s_requests_pass_authorization_and_the_fleet_route_before_the_handler(
) -> None:
    service = make_service()
    r = _authorizing(service, None, fleet=True)
    assert isinstance(r.chain.decoder, ClientDecoder)
    assert _kinds(r.chain.stages) == [Authorize, ConversionHold, FleetRoute, StaleRetries, Relay,
                                      SteppedDown, Dispatch]
    r.liveness = object()  # type: ignore[assignment]  # a watch: the hook goes first
    assert _kinds(r.chain.stages)[:2] == [PodLiveness, Authorize]
    r.liveness = None
    assert PodLiveness not in _kinds(r.chain.stages)
    # one proxy without a fleet and without authorization: nothing to route or ask
    assert _kinds(router(service).chain.stages) == [ConversionHold, StaleRetries, SteppedDown,
                                                    Dispatch]


def test_a_relayed_request_is_decided_here_or_refused_never_routed_or_authorized_again(
) -> None:
    service = make_service()
    inbound = router(service, inbound=True)
    assert isinstance(inbound.chain.decoder, RelayedDecoder)
    assert _kinds(inbound.chain.stages) == [NoteRelayers, HeldHere, SteppedDown,
                                            DispatchRelayed]


def test_each_api_passes_only_the_stages_that_see_it() -> None:
    service = make_service()
    chain = _authorizing(service, None, fleet=True).chain

    def passed(key: int) -> list[type]:
        return _kinds(chain.for_api(key)[0])

    assert passed(ApiKey.OFFSET_COMMIT) == [Authorize, ConversionHold, FleetRoute, StaleRetries,
                                            Relay, SteppedDown, Dispatch]
    assert passed(ApiKey.CONSUMER_GROUP_HEARTBEAT) == [Authorize, ConversionHold, FleetRoute,
                                                       Relay, Dispatch]
    assert passed(ApiKey.HEARTBEAT) == [Authorize, ConversionHold, FleetRoute, Relay,
                                        SteppedDown, Dispatch]

    def hooks(key: int) -> list[type]:
        return [type(h.__self__) for h in chain.for_api(key)[1]]  # type: ignore[attr-defined]

    # answers go back last stage first: the guard notes the commit's answer, then what the
    # authorization stage refused is put back; heartbeats' epochs are noted last
    assert hooks(ApiKey.OFFSET_COMMIT) == [StaleRetries, Authorize]
    assert hooks(ApiKey.CONSUMER_GROUP_HEARTBEAT) == [Authorize, ClientDecoder]
    assert hooks(ApiKey.LIST_GROUPS) == [Authorize]


async def test_an_answer_a_stage_before_the_guard_made_is_still_noted_by_it() -> None:
    """A commit the authorization stage answers itself (the probe on the client's connection
    failed: COORDINATOR_NOT_AVAILABLE, an error clients retry) is an answer the client gets
    like any other: the stale-retry guard notes it, and the member may send retries from
    now on."""
    service = make_service()
    coordinate(service, "g")

    async def broken(api_key: int, version: int, encode: Callable[[int], bytes],
                     timeout: float) -> bytes:
        raise ProbeFailed("the connection to the broker broke")

    value = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": "m",
             "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                 {"partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                  "committed_metadata": ""}]}]}
    assert not service.commit_retries.knows("g", "m")
    result = await exchange(_authorizing(service, broken), request(8, 9, value))
    assert result.action == "local" and result.response is not None
    assert {p["error_code"] for t in result.response["topics"] for p in t["partitions"]} == {
        COORDINATOR_NOT_AVAILABLE}
    assert service.commit_retries.knows("g", "m")  # noted: disrupted, its window opened
