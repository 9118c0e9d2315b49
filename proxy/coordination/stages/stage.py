"""The router's stages: what one stage is, a request's passage through them, and the chain.

A connection's :class:`~proxy.coordination.routing.CoordinatingRouter` decodes each request of an
examined API once and sends it through one list of :class:`Stage` s, in the connection's request
order (:mod:`proxy.coordination.stages` lists both lists). Each stage either lets the request go
on, returning None (having narrowed ``passage.request`` or noted ``passage.route``), or ends it
with the connection's :data:`~proxy.connection.Decision`. The last stage, the dispatch to the
API's handler, always decides. Every answer of the request, whichever stage made it, then passes
each stage's :meth:`Stage.answer`, the last stage's first, before :meth:`Chain.encode` writes it
at the client's version: there stages note what the client is told and put back what they took
out.

A stage that must first learn something (the client's rights, where a group is coordinated, the
end of a conversion) returns a :class:`~proxy.connection.Prepare`. Its awaitable runs the chain
again from decoding (:meth:`Chain.decide`) with what it learnt: the decoded request is not kept
while the connection waits, and the stages before it decide again from what they keep. Stages
start no background tasks: whatever they wait for is awaited in the connection's own task (a
task a wait needs lives in a nursery of that call, over when it returns).

Like a Kroxylicious filter chain, a stage sees requests on the way in and answers on the way
out; unlike one, it names the APIs it sees (:attr:`Stage.apis`), and a connection's
:class:`Chain` keeps, per API key, only the stages that see it. What the stages ask of the
coordinator service is :class:`RouterCalls`, all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from proxy.codec import messages
from proxy.codec.errors import CodecError
from proxy.codec.header import response_header_for
from proxy.connection import Decision, Local, Prepare, RequestInfo, Rewrite
from proxy.coordination.handler import ApiHandler, GroupRequest, Value
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.commit_retries import CommitRetries
    from proxy.coordination.membership import BrokerMembership
    from proxy.coordination.peers import FleetSide, Route
    from proxy.coordination.release_fleet import Relayers
    from proxy.coordination.tickets import Tickets
    from proxy.coordination.upgrade import Upgrades
    from proxy.journal.clients import ClientSoftwareDirectory
    from proxy.security.session import Session

log = logging.getLogger("groupgate.coordination")

UNKNOWN_SERVER_ERROR = int(ErrorCode.UNKNOWN_SERVER_ERROR)

AnswerHook = Callable[[GroupRequest, Value], Value]


class RouterCalls(Protocol):
    """Everything the router's stages ask of the coordinator service
    (:class:`~proxy.coordination.service.CoordinatorService`); the handlers ask it the rest."""

    upgrades: Upgrades
    """Groups being converted (their requests wait) and requests counted at the broker."""
    commit_retries: CommitRetries
    """What this sidecar's clients were told of their commits."""
    tickets: Tickets
    """Commit tickets, given out as a holder and reported as a follower."""
    relayers: Relayers
    """The sidecars that relayed each group's requests here (a hand-back tells them)."""

    def membership(self, group_id: str) -> BrokerMembership | None:
        """The established broker membership of a group this sidecar holds."""
        ...

    def stepped_down_from(self, group_id: str, member_id: str) -> bool:
        """Whether a member's request is answered COORDINATOR_NOT_AVAILABLE (stepping down)."""
        ...

    def to_let_go(self, group_id: str, member_id: str) -> bool:
        """Whether the member must drop its partitions (the group's lease was cut off)."""
        ...

    async def lease_cut_off(self, group_id: str) -> None:
        """Return once the lease held now on the group is cut off."""
        ...

    def request_arrived(self, group_id: str, member_id: str) -> bool:
        """A member's request starts waiting here (its session stops, :mod:`..inside`)."""
        ...

    def request_left(self, group_id: str, member_id: str) -> None:
        """... and its answer left."""
        ...


class Stage:
    """One stage of a connection's chain (see the module docstring)."""

    __slots__ = ()

    apis: ClassVar[frozenset[int] | None] = None
    """The API keys whose requests the stage sees (None: all examined APIs)."""

    def request(self, passage: Passage) -> Decision | None:
        """The decision ending the request here, or None: it goes on to the next stage."""
        return None

    def answer(self, request: GroupRequest, value: Value) -> Value:
        """An answer to ``request`` on its way to the client (any stage's)."""
        return value

    def closed(self) -> None:
        """The client's connection closed."""
        return None


class Decoder(Stage):
    """The chain's head: a request's frame to the :class:`GroupRequest` the stages pass on
    (:meth:`Stage.request` is not called on it; its :meth:`Stage.answer` is, last)."""

    __slots__ = ()

    def decode(self, handler: ApiHandler, request: RequestInfo) -> GroupRequest:
        raise NotImplementedError


class Passage:
    """One request's way through the chain: what the stages learnt of it so far."""

    __slots__ = ("_grouped", "_groups", "authorized", "chain", "handler", "info", "request",
                 "route")

    def __init__(self, chain: Chain, handler: ApiHandler, info: RequestInfo,
                 request: GroupRequest, route: Route | None = None) -> None:
        self.chain = chain
        self.handler = handler
        self.info = info
        """The request as the connection holds it (its frame stays valid while it is decided)."""
        self.request = request
        """The decoded request as it goes on (what the authorization stage let through, without
        the partitions acknowledged as stale retries)."""
        self.route = route
        """Where its groups go among the sidecars, once known (a lookup, the fleet route)."""
        self.authorized = False
        """It passed the authorization stage (and is what the stage let through)."""
        self._grouped: GroupRequest | None = None
        self._groups: tuple[str, ...] = ()

    def groups(self) -> tuple[str, ...]:
        """The groups whose coordinator must decide the request as it is now."""
        if self._grouped is not self.request:
            self._groups = self.handler.group_ids(self.request)
            self._grouped = self.request
        return self._groups


class Chain:
    """One connection's stage list and what its stages share of the connection."""

    __slots__ = ("_hooks", "_stages", "broker_version", "claims", "decoder", "fleet", "handlers",
                 "service", "session", "software", "stages")

    def __init__(self, decoder: Decoder, stages: Sequence[Stage], *,
                 handlers: dict[int, ApiHandler], service: RouterCalls,
                 claims: Callable[[str], bool], fleet: FleetSide | None, session: Session,
                 software: ClientSoftwareDirectory | None,
                 broker_version: Callable[[int, int], int]) -> None:
        self.decoder = decoder
        self.stages = tuple(stages)
        self.handlers = handlers
        self.service = service
        self.claims = claims
        """Whether this sidecar coordinates (or is taking over) a group."""
        self.fleet = fleet
        """The connection's place among several sidecars (None: this proxy decides all)."""
        self.session = session
        self.software = software
        self.broker_version = broker_version
        """The version to send a request as to this connection's broker."""
        self._stages: dict[int, tuple[Stage, ...]] = {}
        """Per API key: the stages that see it, in order (filled as keys are first seen)."""
        self._hooks: dict[int, tuple[AnswerHook, ...]] = {}
        """Per API key: the answer hooks its answers pass, the last stage's first."""

    def with_stage_first(self, stage: Stage | None, kind: type[Stage]) -> None:
        """Put ``stage`` first in the list in place of any of ``kind`` (None: only remove)."""
        kept = [s for s in self.stages if not isinstance(s, kind)]
        self.stages = tuple([stage, *kept] if stage is not None else kept)
        self._stages.clear()
        self._hooks.clear()

    def for_api(self, key: int) -> tuple[tuple[Stage, ...], tuple[AnswerHook, ...]]:
        """The stages that see ``key`` and the answer hooks its answers pass, in order."""
        seeing = [s for s in self.stages if s.apis is None or key in s.apis]
        hooks = [s.answer for s in reversed([self.decoder, *seeing])
                 if type(s).answer is not Stage.answer and (s.apis is None or key in s.apis)]
        self._stages[key], self._hooks[key] = stages, answer_hooks = tuple(seeing), tuple(hooks)
        return stages, answer_hooks

    # -- requests --------------------------------------------------------------------------

    def decide(self, handler: ApiHandler, info: RequestInfo, route: Route | None = None,
               passage: Passage | None = None) -> Decision:
        """Decode ``info`` and pass it through every stage that sees its API, until one
        decides (``route``: where its groups go, when a lookup found out; ``passage``: one
        decoded and taken through some stages already, :meth:`passage`). Whatever goes wrong
        in a stage is answered with the API's failure (UNKNOWN_SERVER_ERROR) and a log line;
        it never reaches the connection."""
        if passage is None:
            passage = Passage(self, handler, info, self.decoder.decode(handler, info), route)
        key = handler.api_key
        try:
            try:
                stages = self._stages[key]
            except KeyError:
                stages = self.for_api(key)[0]
            for stage in stages:
                decision = stage.request(passage)
                if decision is not None:
                    return decision
            raise AssertionError(f"no stage decided api key {key}")
        except Exception:
            log.exception("deciding api key %d v%d failed", info.api_key, info.api_version)
            request = passage.request
            return Local(self.encode(handler, request,
                                     handler.failure(request, UNKNOWN_SERVER_ERROR)))

    def passage(self, handler: ApiHandler, info: RequestInfo, route: Route | None = None
                ) -> Passage:
        """``info`` decoded, to be taken through some stages before :meth:`decide`."""
        return Passage(self, handler, info, self.decoder.decode(handler, info), route)

    # -- answers ---------------------------------------------------------------------------

    def encode(self, handler: ApiHandler, request: GroupRequest, value: Value) -> bytes:
        """The response payload for ``value``, after every answer hook, or the API's failure
        if it cannot be encoded (e.g. a value too long for the client's version)."""
        key, version = request.api_key, request.version
        try:
            hooks = self._hooks[key]
        except KeyError:
            hooks = self.for_api(key)[1]
        for hook in hooks:
            value = hook(request, value)
        header = response_header_for(key, version, request.correlation_id)
        try:
            return header + messages.encode_response(key, version, value)
        except CodecError:
            log.exception("encoding the answer to api key %d v%d failed", key, version)
            failure = handler.failure(request, UNKNOWN_SERVER_ERROR)
            return header + messages.encode_response(key, version, failure)

    def closed(self) -> None:
        for stage in self.stages:
            stage.closed()


async def settled(decision: Decision) -> int | Rewrite | Local:
    """A decision once a :class:`Prepare` in it is decided."""
    return await decision.decision if isinstance(decision, Prepare) else decision


async def ready(value: Value) -> Value:
    return value

