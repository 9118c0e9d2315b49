"""What a client may do, asked of the broker on the client's own connection.

The proxy answers some group APIs itself (KIP-848 heartbeats, the classic APIs of the groups
its engine coordinates, parts of the listing APIs) and relays others to the sidecar that
coordinates a group. Kafka authorizes every one of those requests as the client's principal;
the proxy cannot compute that itself (OAUTHBEARER, GSSAPI and delegation tokens hide the
principal, a custom principal builder or authorizer maps it, ACLs may be prefixed, wildcard
or DENY). So it asks the broker, on the client's own authenticated connection, with requests
whose answers say what that principal may do (``Connection.probe``: the client never sees
them):

* READ on a group: Heartbeat with no member (``generation_id`` -1, ``member_id`` empty).
  Kafka checks READ before anything else and answers GROUP_AUTHORIZATION_FAILED without it;
  any other answer (UNKNOWN_MEMBER_ID, NOT_COORDINATOR...) means READ, and changes nothing.
  Any broker answers it, coordinator or not.
* DESCRIBE on groups: DescribeGroups v5 with ``include_authorized_operations``:
  GROUP_AUTHORIZATION_FAILED means no DESCRIBE; a described group carries its operations
  bitfield (for the answers the proxy gives that include them).
* DELETE on a group: OffsetDelete v0 with no topics. Kafka checks DELETE on the group before
  anything else (GROUP_AUTHORIZATION_FAILED without it); any other answer means DELETE, and
  with no partitions the coordinator deletes nothing. Asked on its own, not read from the
  DescribeGroups bitfield: a DENY of DESCRIBE with an ALLOW of DELETE refuses DescribeGroups
  but allows DeleteGroups, and a broker that does not coordinate the group still answers it.
* DESCRIBE and READ on topics, DESCRIBE on the cluster: Metadata v10 with
  ``include_topic_authorized_operations`` and ``include_cluster_authorized_operations``
  (TOPIC_AUTHORIZATION_FAILED: no DESCRIBE; otherwise the topic's operations; the cluster's
  are 0 without DESCRIBE CLUSTER).
* WRITE on a transactional id (TxnOffsetCommit): AddOffsetsToTxn v3 with producer id -1.
  Kafka checks WRITE on the transactional id first and answers
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED without it; any other answer means WRITE. With it, the
  transaction coordinator answers INVALID_PRODUCER_ID_MAPPING (no transaction has producer
  id -1; NOT_COORDINATOR on another broker): nothing is added to any transaction.

Answers are facts (resource, name, operation) -> allowed, kept per connection in a bounded
cache for ``ttl`` seconds (:class:`Rights`). A right removed while a member is in its group is
therefore refused at the member's first request after the answer expired; Kafka checks every
request.

Whether to ask at all (:class:`AuthorizerCheck`): without an authorizer on the brokers every
principal may do everything, so with ``authorize-clients auto`` the proxy asks the cluster
once (DescribeAcls on its own link: SECURITY_DISABLED means no authorizer) and, while none is
configured, never probes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import trio
from cachetools import TTLCache

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.router import body_offset
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.security")

# Kafka's AclOperation codes (org.apache.kafka.common.acl.AclOperation); an authorized
# operations bitfield has bit ``1 << code`` set for each allowed operation.
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
OPS_OMITTED = -(1 << 31)
"""The schema's default for an authorized operations field the broker did not fill in."""

PROBE_SECONDS = 10.0
"""How long a probe's answer is waited for before the request it was for fails (retriable)."""
MAX_FACTS = 1024
"""Facts one connection keeps (each a resource name and an operation; fed by the client's
requests, so bounded; docs/decisions/0008)."""
PROBES_PER_KIND = 16
"""Probes of one kind (one per group or transactional id) in flight at once for a request: a
DeleteGroups naming thousands of groups asks them a few at a time, not all at once."""
AUTHORIZER_RECHECK_SECONDS = 60.0
"""How long the answer "no authorizer" is believed before the cluster is asked again."""

GROUP_AUTHORIZATION_FAILED = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
TOPIC_AUTHORIZATION_FAILED = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
SECURITY_DISABLED = 54

Kind = Literal["group", "topic", "cluster", "transactional_id"]
Fact = tuple[Kind, str, int]
"""(resource type, resource name, operation)."""
ProbeSend = Callable[[int, int, Callable[[int], bytes], float], Awaitable[bytes]]
"""``Connection.probe``: api key, version, encoder of header and body given a correlation
id, timeout -> the broker's response payload."""

_HEARTBEAT_VERSION = 4
_DESCRIBE_GROUPS_VERSION = 5
_METADATA_VERSION = 10
_ADD_OFFSETS_TO_TXN_VERSION = 3
_OFFSET_DELETE_VERSION = 0
_NO_TOPIC_ID = uuid.UUID(int=0)


class Unanswerable(Exception):
    """The broker's answer does not say whether the client may (a DescribeGroups answer that
    leaves a group out); ``error`` is the error code for the client."""

    def __init__(self, error: int, what: str) -> None:
        super().__init__(what)
        self.error = error


def has(ops: int, op: int) -> bool:
    return ops != OPS_OMITTED and bool(ops & (1 << op))


@dataclass(slots=True)
class Needs:
    """Facts a decision needs that the cache does not hold: what to ask the broker."""

    groups: dict[int, set[str]] = field(default_factory=dict)
    """Operation -> group names."""
    topics: set[str] = field(default_factory=set)
    cluster: bool = False
    transactional_ids: set[str] = field(default_factory=set)
    """Transactional ids whose WRITE is asked."""

    def __bool__(self) -> bool:
        return bool(self.groups or self.topics or self.cluster or self.transactional_ids)


class Rights:
    """One client connection's answers from the broker, cached; see the module docstring."""

    __slots__ = ("_facts", "_group_ops", "_send", "asked", "ttl")

    def __init__(self, send: ProbeSend | None, *, ttl: float, maxsize: int = MAX_FACTS,
                 timer: Callable[[], float] = trio.current_time) -> None:
        self._send = send
        self.ttl = ttl
        self._facts: TTLCache[Fact, bool] = TTLCache(maxsize=maxsize, ttl=ttl, timer=timer)
        self._group_ops: TTLCache[str, int] = TTLCache(maxsize=maxsize, ttl=ttl, timer=timer)
        """Operations bitfields of described groups (for ``include_authorized_operations``
        in the answers the proxy gives)."""
        self.asked = 0
        """Probes sent on this connection (for tests and the benchmark)."""

    def attach(self, send: ProbeSend) -> None:
        self._send = send

    def __len__(self) -> int:
        return len(self._facts) + len(self._group_ops)

    # -- what is known ----------------------------------------------------------------------

    def known(self, kind: Kind, name: str, op: int) -> bool | None:
        return self._facts.get((kind, name, op))

    def group_ops(self, name: str) -> int | None:
        return self._group_ops.get(name)

    def missing(self, groups: Mapping[int, Iterable[str]] | None = None,
                topics: Iterable[str] = (), cluster: bool = False,
                transactional_ids: Iterable[str] = ()) -> Needs:
        """What of ``groups`` (operation -> names), ``topics`` (READ and DESCRIBE), the
        cluster's DESCRIBE and ``transactional_ids`` (WRITE) the cache does not know."""
        needs = Needs()
        for op, names in (groups or {}).items():
            unknown = {n for n in names if ("group", n, op) not in self._facts}
            if unknown:
                needs.groups[op] = unknown
        needs.topics = {t for t in topics if ("topic", t, DESCRIBE) not in self._facts}
        needs.cluster = cluster and ("cluster", "", DESCRIBE) not in self._facts
        needs.transactional_ids = {t for t in transactional_ids
                                   if ("transactional_id", t, WRITE) not in self._facts}
        return needs

    # -- asking the broker ------------------------------------------------------------------

    async def ask(self, needs: Needs, client_id: str | None) -> dict[Fact, bool]:
        """Probe the broker for ``needs`` (in one round trip: the probes are pipelined) and
        return the facts learnt (also cached). Raises ``ProbeFailed`` (the connection's) or
        :class:`Unanswerable`."""
        learnt: dict[Fact, bool] = {}
        failures: list[BaseException] = []

        async def run(probe: Awaitable[None], limiter: trio.CapacityLimiter | None = None
                      ) -> None:
            try:
                if limiter is None:
                    await probe
                else:
                    async with limiter:
                        await probe
            except Exception as exc:  # re-raised below, the first one
                failures.append(exc)

        per_group = trio.CapacityLimiter(PROBES_PER_KIND)
        per_transaction = trio.CapacityLimiter(PROBES_PER_KIND)
        async with trio.open_nursery() as nursery:
            for name in sorted(needs.groups.get(READ, ())):
                nursery.start_soon(run, self._heartbeat_probe(name, client_id, learnt),
                                   per_group)
            if described := needs.groups.get(DESCRIBE):
                nursery.start_soon(run, self._describe_probe(sorted(described), client_id,
                                                             learnt))
            for name in sorted(needs.groups.get(DELETE, ())):
                nursery.start_soon(run, self._delete_probe(name, client_id, learnt),
                                   per_group)
            if needs.topics or needs.cluster:
                nursery.start_soon(run, self._metadata_probe(sorted(needs.topics),
                                                             needs.cluster, client_id, learnt))
            for name in sorted(needs.transactional_ids):
                nursery.start_soon(run, self._transaction_probe(name, client_id, learnt),
                                   per_transaction)
        if failures:
            raise failures[0]
        self.note(learnt)
        return learnt

    def note(self, facts: Mapping[Fact, bool]) -> None:
        """Keep ``facts`` for the answers' lifetime."""
        for fact, allowed in facts.items():
            self._facts[fact] = allowed

    async def _exchange(self, api_key: int, version: int, value: dict[str, Any],
                        client_id: str | None) -> dict[str, Any]:
        assert self._send is not None, "no connection to ask on"

        def encode(correlation_id: int) -> bytes:
            return (encode_request_header(api_key, version, correlation_id, client_id)
                    + messages.encode_request(api_key, version, value))

        self.asked += 1
        payload = memoryview(await self._send(api_key, version, encode, PROBE_SECONDS))
        start = body_offset(payload, messages.response_header_version(api_key, version))
        answer, _ = messages.decode_response(api_key, version, payload, start)
        return answer

    async def _heartbeat_probe(self, group: str, client_id: str | None,
                               learnt: dict[Fact, bool]) -> None:
        answer = await self._exchange(ApiKey.HEARTBEAT, _HEARTBEAT_VERSION, {
            "group_id": group, "generation_id": -1, "member_id": "",
            "group_instance_id": None}, client_id)
        learnt[("group", group, READ)] = answer["error_code"] != GROUP_AUTHORIZATION_FAILED

    async def _transaction_probe(self, transactional_id: str, client_id: str | None,
                                 learnt: dict[Fact, bool]) -> None:
        answer = await self._exchange(ApiKey.ADD_OFFSETS_TO_TXN, _ADD_OFFSETS_TO_TXN_VERSION, {
            # group id empty: READ on it is checked next, which most principals lack, so the
            # request mostly stops at the authorizer, before the transaction coordinator
            "transactional_id": transactional_id, "producer_id": -1, "producer_epoch": -1,
            "group_id": ""}, client_id)
        learnt[("transactional_id", transactional_id, WRITE)] = (
            answer["error_code"] != TRANSACTIONAL_ID_AUTHORIZATION_FAILED)

    async def _describe_probe(self, groups: list[str], client_id: str | None,
                              learnt: dict[Fact, bool]) -> None:
        answer = await self._exchange(ApiKey.DESCRIBE_GROUPS, _DESCRIBE_GROUPS_VERSION, {
            "groups": groups, "include_authorized_operations": True}, client_id)
        for entry in answer["groups"]:
            name, error = entry["group_id"], entry["error_code"]
            ops = entry.get("authorized_operations", OPS_OMITTED)
            if error == GROUP_AUTHORIZATION_FAILED:
                learnt[("group", name, DESCRIBE)] = False
                self._group_ops[name] = 0
            else:
                # described (or an error after the DESCRIBE check: NOT_COORDINATOR...)
                learnt[("group", name, DESCRIBE)] = True
                if ops != OPS_OMITTED:
                    self._group_ops[name] = ops
        if any(("group", n, DESCRIBE) not in learnt for n in groups):
            raise Unanswerable(int(ErrorCode.UNKNOWN_SERVER_ERROR),
                               "DescribeGroups did not answer every group")

    async def _delete_probe(self, group: str, client_id: str | None,
                            learnt: dict[Fact, bool]) -> None:
        answer = await self._exchange(ApiKey.OFFSET_DELETE, _OFFSET_DELETE_VERSION, {
            "group_id": group, "topics": []}, client_id)
        learnt[("group", group, DELETE)] = answer["error_code"] != GROUP_AUTHORIZATION_FAILED

    async def _metadata_probe(self, topics: list[str], cluster: bool, client_id: str | None,
                              learnt: dict[Fact, bool]) -> None:
        answer = await self._exchange(ApiKey.METADATA, _METADATA_VERSION, {
            "topics": [{"topic_id": _NO_TOPIC_ID, "name": t} for t in topics],
            "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": cluster,
            "include_topic_authorized_operations": bool(topics)}, client_id)
        for entry in answer["topics"]:
            name = entry["name"]
            ops = entry.get("topic_authorized_operations", OPS_OMITTED)
            if entry["error_code"] == TOPIC_AUTHORIZATION_FAILED or ops == OPS_OMITTED:
                learnt[("topic", name, DESCRIBE)] = learnt[("topic", name, READ)] = False
            else:
                learnt[("topic", name, DESCRIBE)] = has(ops, DESCRIBE)
                learnt[("topic", name, READ)] = has(ops, READ)
        for name in topics:  # a topic the answer left out is not one the client may use
            learnt.setdefault(("topic", name, DESCRIBE), False)
            learnt.setdefault(("topic", name, READ), False)
        if cluster:
            ops = answer.get("cluster_authorized_operations", OPS_OMITTED)
            learnt[("cluster", "", DESCRIBE)] = has(ops, DESCRIBE)


class AuthorizerCheck:
    """Whether the brokers have an authorizer, asked once (and again after
    :data:`AUTHORIZER_RECHECK_SECONDS` while the answer is "none")."""

    def __init__(self, ask: Callable[[], Awaitable[dict[str, Any]]],
                 timer: Callable[[], float] = trio.current_time) -> None:
        """``ask``: DescribeAcls on the proxy's own link (any filter; only its error code
        counts)."""
        self._ask = ask
        self._timer = timer
        self.present: bool | None = None
        """None: not known (the proxy authorizes meanwhile)."""
        self._checked_at: float | None = None
        self._lock = trio.Lock()

    @property
    def in_force(self) -> bool:
        """Whether clients' requests are to be authorized (yes unless the brokers said they
        have no authorizer)."""
        return self.present is not False

    def due(self) -> bool:
        """Whether :meth:`check` must run before a request is decided: never asked, or the
        last answer ("none", or no answer) is older than :data:`AUTHORIZER_RECHECK_SECONDS`."""
        if self.present:
            return False
        return (self._checked_at is None
                or self._timer() - self._checked_at >= AUTHORIZER_RECHECK_SECONDS)

    async def check(self) -> None:
        async with self._lock:
            if not self.due():
                return
            self._checked_at = self._timer()
            try:
                answer = await self._ask()
            except Exception as exc:
                log.info("cannot tell whether the brokers have an authorizer (%s): the group "
                         "requests the proxy answers are authorized as each client's", exc)
                return
            present = answer.get("error_code") != SECURITY_DISABLED
            if present != self.present:
                log.info("the brokers %s: the group requests the proxy answers %s",
                         "have an authorizer" if present else "have no authorizer",
                         "are authorized as each client's" if present
                         else "need no authorization")
            self.present = present


DESCRIBE_ACLS_VERSION = 3
NOTHING_FILTER: dict[str, Any] = {
    "resource_type_filter": 3,  # GROUP
    "resource_name_filter": "groupgate-authorizer-check", "pattern_type_filter": 3,  # LITERAL
    "principal_filter": None, "host_filter": None, "operation": 1,  # ANY
    "permission_type": 1}  # ANY
"""A DescribeAcls filter: only whether the broker answers SECURITY_DISABLED matters."""


def authorization_mode(config: Any) -> str:
    """``authorize-clients`` resolved for ``config`` (a ProxyConfig): ``off``, ``on``, or
    ``auto`` (on while the brokers have an authorizer, :class:`AuthorizerCheck`).

    ``auto`` is off where every client's connection acts as the same principal as the
    proxy's own (PLAINTEXT: ANONYMOUS both; SSL without a proxy certificate, or with it on the
    clients' connections too): what the proxy does as itself is then exactly what each client
    may do."""
    mode = str(config.authorize_clients)
    if mode != "auto":
        return mode
    protocol = str(config.security_protocol).upper()
    if protocol.startswith("SASL_"):
        return "auto"
    if protocol == "SSL" and config.tls_cert_file and not config.tls_cert_for_clients:
        return "auto"
    return "off"
