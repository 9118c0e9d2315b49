"""What one group API does in the proxy: the handler interface and the outcomes it returns.

The coordinating router (:mod:`proxy.coordination.routing`) decodes every request of an API
it examines into a :class:`GroupRequest` and hands it to that API's :class:`ApiHandler`, one
object per API in one table. The handler returns one outcome, in values, never bytes:

* :data:`PASS`: forward the client's frame untouched (e.g. a commit for a group the proxy
  does not coordinate);
* :class:`Answer`: the proxy answers, with a response value now or an awaitable producing one
  (or producing an :class:`Upstream` once something it waited for is done);
* :class:`Upstream`: forward a changed request on the client's own connection (in order with
  everything else the client sent) and pass the broker's response value through
  ``on_response`` (e.g. a commit stamped with the proxy's broker-side member id, whose
  membership errors are translated back).

The router turns outcomes into the connection's decisions, encodes values with the client's
header and version, and answers with the handler's :meth:`ApiHandler.failure` if a handler
raises: a failure stays with the request that caused it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from proxy.codec.api_keys import ApiKey

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService
    from translation.regex import TopicRights

Value = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """A decoded request of an examined API, with what the router knows of its connection."""

    api_key: ApiKey
    version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    """The client's address as Kafka reports it (``/10.0.0.7``)."""
    node_id: int | None
    """The broker behind the listener the request came in on (None: the bootstrap one)."""
    header: bytes
    """The request header as the client sent it (kept when the request is rewritten)."""
    value: Value
    principal: str | None = None
    """The principal the application authenticated as (``User:name``), when the proxy can know
    it: from its SASL exchange on this connection, or from the mark of a relay that another
    sidecar sent (docs/security.md). Carried for the logs; the authorization itself asks the
    broker (:mod:`proxy.coordination.authorization`)."""
    completion: Completion | None = None
    """What the authorization stage refused of the request (the request is what remains), to
    be put back into its answer."""
    topic_rights: TopicRights | None = None
    """ConsumerGroupHeartbeat: what the client may DESCRIBE of the topics its group's regexes
    match, when the authorization stage asked (the engine resolves the regexes under them)."""
    relayed_by: str | None = None
    """A request relayed by another sidecar: its fleet address (protocol-3 mark), or
    ``0.2.0@<host>`` for a sidecar whose mark does not say (protocol 1 or 2); None: not
    relayed."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The parts of a request the authorization stage refused, put back into the answer
    (:mod:`proxy.coordination.authorization`)."""

    merge: Callable[[Value], Value]
    """The answer to what remained -> the answer to the whole request."""
    recheck: Callable[[Value], Awaitable[Value]] | None = None
    """Checks that need the answer first (the topics it reveals), asking the broker on the
    client's connection; run on answers that did not come from the broker on that connection:
    relayed ones always, this sidecar's own when ``recheck_here``."""
    recheck_here: bool = False


class Pass:
    """Forward the client's request untouched."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PASS"


PASS: Final = Pass()


@dataclass(frozen=True, slots=True)
class Upstream:
    """Forward ``value`` (the request, changed) and map the broker's answer with
    ``on_response`` (response value in, response value out)."""

    value: Value
    on_response: Callable[[Value], Value]
    release: Callable[[], None] | None = None
    """Called instead of ``on_response`` if no answer will ever come (the client's
    connection closed first)."""
    version: int | None = None
    """Send it as this version of the API (the broker's answer is read at it and given to
    the client at the client's version); None: the client's version."""
    header: bytes | None = None
    """The request header to send instead of the client's (a forwarded JoinGroup's member
    mark, :mod:`proxy.coordination.upgrade`); None: the client's."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The proxy answers: a response value, or an awaitable of one (or of an
    :class:`Upstream` to send when it is ready)."""

    value: Value | Awaitable[Value | Upstream]


Outcome = Pass | Upstream | Answer


class ApiHandler:
    """One group API: how the proxy decides its requests and how it fails them."""

    api_key: ClassVar[ApiKey]
    served_versions: ClassVar[tuple[int, int] | None] = None
    """The versions ApiVersions advertises for an API the proxy always serves itself,
    whatever the broker says (the KIP-848 APIs); None: the broker's, capped by the codec."""
    answers_upstream_later: ClassVar[bool] = False
    """Whether an awaitable :class:`Answer` of this API may end in an :class:`Upstream`
    request: requests after it on the connection then wait for it, forwarded ones included,
    so that its request reaches the broker before theirs (as at a Kafka broker, which
    handles one request of a connection at a time)."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service

    def group_ids(self, request: GroupRequest) -> tuple[str, ...]:
        """The groups whose coordinator must decide ``request`` (routing between sidecars,
        :mod:`proxy.coordination.peers`); none: any sidecar decides it."""
        return (request.value["group_id"],)

    def decide(self, request: GroupRequest) -> Outcome:
        """What to do with ``request``; called in the connection's request order."""
        raise NotImplementedError

    def failure(self, request: GroupRequest, error: int) -> Value:
        """The response failing all of ``request`` with ``error``."""
        raise NotImplementedError
