"""Upgrade without a stop: a live classic group of the broker moves to the engine once no
member is connected straight to the broker (decision record 0018, section 1).

While any member of a group is *direct* (a client connected straight to the broker), the
broker's classic coordinator coordinates the group and the sidecars forward their classic
members to it. Four things here move such a group to the engine as soon as the last direct
member is gone, without calling anybody back:

* **Member marks.** A classic JoinGroup this sidecar forwards to the broker carries the client
  id ``gg3|<fleet address>|-|<client id>`` (:func:`member_mark`) in its request header. The
  broker builds the member id from it (client id, dash, UUID) and shows it as the member's
  ``client_id`` in DescribeGroups in every group state, so whoever looks at the broker's group
  sees which members sit behind a sidecar of fleet protocol 3 (:func:`read_mark`). Nothing else
  of the request changes, and the client gets the broker's answer as it is.
* **Detection.** The JoinGroup answer of the broker group's *leader* lists every member id;
  only the sidecar that forwarded the leader's join sees it, so there is one candidate per
  generation and no election (:meth:`Upgrades.observe_join`). A group whose members are all
  marked (by this sidecar or others) becomes a *candidate* (bounded, expiring:
  :data:`CANDIDATES_MAX`, :data:`CANDIDATE_SECONDS`). Every :data:`POLL_SECONDS` the sidecar
  describes each candidate at the broker; one seen Stable with the same marked members on two
  polls at least :data:`POLL_SECONDS` apart, at the generation of the last leader answer, is
  converted.
* **Announcement** (members behind other sidecars; 0018, step 1): ``GroupConverting`` over
  FleetControl (:mod:`.fleet_control`) to every sidecar named in a mark, at once. Each holds
  the group's requests on its client connections (:meth:`Upgrades.on_converting`), suspends
  its bridged members of the group, waits up to :data:`PEER_DRAIN_SECONDS` for its requests of
  the group still at the broker (it counts the forwarded ones of every group it forwarded a
  marked join of, :attr:`Upgrades.forwarding`) and acknowledges with its members' session and
  rebalance timeouts. One that refuses or does not answer within :data:`ANNOUNCE_SECONDS`
  aborts the conversion (``ConversionAborted`` to every sidecar contacted). After the
  conversion, ``GroupConverted`` (or ``ConversionAborted``), from the converter only, ends
  their hold: they forget who held the group, look again, and relay the held requests to the
  new holder. One not told within :data:`PEER_HOLD_SECONDS` decides from the broker's group
  (:meth:`Upgrades.sweep`).
* **Conversion** (:meth:`Upgrades.convert`): *hold* the group's requests on this sidecar's
  connections (:meth:`Upgrades.holding`, bounded by :data:`HOLD_SECONDS`) and wait for the
  forwarded ones still at the broker (:data:`DRAIN_SECONDS` at most); *snapshot* the broker's
  group (DescribeGroups: member ids, client ids, protocol, subscriptions, assignments; the
  sessions and rebalance timeouts from the joins this sidecar forwarded, and from the other
  sidecars' acknowledgements); check it
  with the engine (:func:`~translation.classic.migration.conversion_refusal`); *empty and
  lock*: the group's broker membership is started with a LeaveGroup naming every member sent
  back to back with its JoinGroup on one connection (the service's takeover,
  ``leave_first``); once the lock is held, *convert*
  (:func:`~translation.classic.migration.convert_classic_group`: every member keeps its member
  id, generation and partitions; the target is what they own), write it to the state log,
  journal ``group_converted`` and count it (``groupgate_group_conversions_total``). Held
  requests then reach the engine, which answers every member's next Heartbeat, SyncGroup and
  commit at the generation it had.

The conversion needs ``classic-translation`` (the engine serves the members afterwards) and a
``migration-policy`` that allows upgrades (``bidirectional`` or ``upgrade``). A refused or
failed attempt is journalled (``conversion_aborted``) and tried again after
:data:`RETRY_SECONDS`; none is tried while this sidecar's own bridged members' clients have
not heartbeated at the generation yet (they do within a heartbeat interval: looked at again
on each poll). *Bridged* members (:mod:`.bridged`: the classic members sidecars run
for KIP-848 clients) convert too: a bridged member made leader notes the candidate
(:meth:`Upgrades.note_leader`); every sidecar with bridged members in the group suspends them
(nothing more is sent to the broker for them) while the conversion is announced or under way;
the engine adopts each under its client's KIP-848 member id, as a consumer-protocol member at
the generation's epoch, which is the epoch its client was told; then the bridged members end
without a word (:meth:`~.bridged.Bridges.convert_away`) and their clients' next heartbeats
reach the engine. An aborted conversion lets them go on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import trio
from cachetools import TTLCache

from proxy import metrics
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.coordination import convert, fleet_control
from proxy.coordination.fleet import PROTOCOL_NAME as LOCK_PROTOCOL
from proxy.coordination.fleet import Address
from proxy.coordination.handler import PASS, GroupRequest, Outcome, Upstream, Value
from proxy.coordination.in_flight import InFlight
from proxy.coordination.membership import (
    CoordinatorUnavailable,
    MembershipRefused,
    find_coordinator,
)
from proxy.upstream import UpstreamError
from translation.classic.messages import CONSUMER_PROTOCOL_TYPE, ClassicProtocol
from translation.classic.migration import (
    ClassicGroupMemberSnapshot,
    ClassicGroupSnapshot,
    conversion_refusal,
    convert_classic_group,
)
from translation.config import MigrationPolicy
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.bridged import Bridges
    from proxy.coordination.service import CoordinatorService
    from proxy.journal.observer import JournalObserver
    from proxy.journal.schema import Event

log = logging.getLogger("groupgate.coordination")

MARK_PREFIX: Final = "gg3|"
"""How a member mark of fleet protocol 3 starts."""
NO_MEMBER: Final = "-"
"""The KIP-848 member id field of a forwarded classic member's mark."""
POLL_SECONDS = 1.0
"""How often candidates are described at the broker; a candidate is converted once it was
seen Stable, all marked, on two polls at least this far apart (one heartbeat interval of
librdkafka's and the Java client's defaults is 3 s or less: the members have heard of the
generation)."""
CANDIDATES_MAX = 1000
CANDIDATE_SECONDS = 600.0
"""Candidates kept at once, and how long one is kept after the leader's join answer that made
it (a group still not converted by then waits for its next rebalance)."""
JOINS_MAX = 10_000
JOINS_SECONDS = 3600.0
"""Forwarded joins remembered (for the members' session and rebalance timeouts), and for how
long after the join."""
HOLD_SECONDS = 3.0
"""Longest a request of a group being converted is held before it is decided again (by then
the group's takeover is registered, and the request waits for it there)."""
DRAIN_SECONDS = 1.0
"""Longest a conversion waits for the group's forwarded requests still at the broker."""
ANNOUNCE_SECONDS = 1.0
"""Longest the converting sidecar waits for each other sidecar to acknowledge
``GroupConverting``; one that does not aborts the conversion."""
PEER_DRAIN_SECONDS = 0.5
"""Longest a sidecar told ``GroupConverting`` waits for its own forwarded requests of the
group still at the broker before it acknowledges (or refuses: the conversion is aborted)."""
PEER_HOLD_SECONDS = 6.0
"""Longest a sidecar told ``GroupConverting`` holds the group's requests without hearing how the
conversion ended: the converter's own hold (:data:`HOLD_SECONDS`) plus the broker's default
``group.initial.rebalance.delay.ms`` (3 s), which the lock's JoinGroup into the emptied group
waits. Then it looks again at who holds the group."""
PEER_HOLD_MAX_SECONDS = 20.0
"""Longest a hold that ran out is kept while the broker's group is still between owners (the
lock's JoinGroup waits the broker's initial rebalance delay, which operators raise): after
:data:`PEER_HOLD_SECONDS` the sidecar looks at the broker's group every
:data:`SWEEP_SECONDS`; held by the lock, the conversion happened; Stable in its old protocol,
it did not; otherwise it waits, up to this long in all, then lets its members go on."""
SWEEP_SECONDS = 0.5
HOLD_SESSION_SHARE = 0.5
"""A peer's hold lasts at most this share of the shortest broker session of its members of the
group (forwarded members' own ``session.timeout.ms``, bridged members'
``broker-session-timeout-ms``): their heartbeats wait meanwhile, and a hold that outlived a
session would have the broker remove them (and form a generation without them while their
clients still consume). With Kafka's 45 s default that leaves the 6 s and 20 s above; with
6 s sessions, 3 s."""
ENDED_SECONDS = 60.0
"""How long an ended hold is remembered, so that a late ``GroupConverted`` still ends the
bridged members the conversion adopted."""
ANSWER_MEMBERS_MAX = 1000
"""Members a sidecar's acknowledgement names at most."""
PEER_HOLDS_MAX = 1000
"""Conversions of other sidecars held for at once; more are refused."""
RETRY_SECONDS = 30.0
"""How long after a refused or failed conversion a candidate is tried again."""
DESCRIBE_VERSION = 5
SAFETY_NET_ERRORS = frozenset({int(ErrorCode.UNKNOWN_MEMBER_ID),
                               int(ErrorCode.ILLEGAL_GENERATION),
                               int(ErrorCode.REBALANCE_IN_PROGRESS),
                               int(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)})
"""Broker answers to a forwarded request that a conversion may have caused (0018's safety
net): counted (``groupgate_group_conversion_late_answers_total``) when one comes back for a
group converted or being converted here, and never passed to the client before the group was
looked at again (:meth:`Upgrades.safety_net`)."""
SAFETY_NET_SECONDS = 10.0
"""After a member's late answer was turned back, its next one within this long is the
broker's own answer (the group was looked at again, and the broker still coordinates it)."""


# ---- member marks ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberMark:
    """What a member mark says: which sidecar forwards the member (its fleet address), the
    KIP-848 member id of a bridged member (None for a forwarded classic member), and the
    application's own client id."""

    address: str
    kip848_member_id: str | None
    client_id: str


def _unchanged(response: Value) -> Value:
    return response


def answer_error(response: Value) -> int | None:
    """The error of a group API's answer: its top-level error code, or (OffsetCommit) the one
    error every partition has; None: no error, or partitions with different ones."""
    code = response.get("error_code")
    if isinstance(code, int):
        return code or None
    codes = {p.get("error_code") for t in response.get("topics") or ()
             for p in t.get("partitions") or ()}
    if len(codes) == 1:
        only = codes.pop()
        return only if isinstance(only, int) and only else None
    return None


def member_mark(address: str, client_id: str | None, kip848_member_id: str | None = None
                ) -> str:
    """The client id a forwarded classic JoinGroup carries to the broker."""
    return f"{MARK_PREFIX}{address}|{kip848_member_id or NO_MEMBER}|{client_id or ''}"


def read_mark(client_id: str | None) -> MemberMark | None:
    """The mark in a client id (or in a member id the broker built from one); None: the member
    is direct (or behind a sidecar of fleet protocol 2 or older, which cannot convert)."""
    if not client_id or not client_id.startswith(MARK_PREFIX):
        return None
    parts = client_id[len(MARK_PREFIX):].split("|", 2)
    if len(parts) != 3 or not parts[0]:
        return None
    address, member, rest = parts
    return MemberMark(address, None if member == NO_MEMBER else member, rest)


def all_marked(ids: Iterable[str], address: str | None = None) -> bool:
    """Whether every id (client ids, or member ids built from them) carries a mark (naming the
    sidecar at ``address``, when given); False for none at all."""
    seen = False
    for x in ids:
        mark = read_mark(x)
        if mark is None or (address is not None and mark.address != address):
            return False
        seen = True
    return seen


# ---- what this sidecar saw of the broker's groups ---------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinSeen:
    """A forwarded member's join, as it was sent (what DescribeGroups does not show)."""

    protocols: tuple[ClassicProtocol, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None
    client_id: str
    client_host: str
    regex: str | None = None
    """A bridged member's KIP-848 ``subscribed_topic_regex`` (its join names what it resolved
    to)."""


@dataclass(slots=True)
class Candidate:
    """A broker group whose leader's join answer, forwarded here, named only marked members."""

    generation: int
    member_ids: frozenset[str]
    stable_since: float | None = None
    """trio time of the first poll that saw it Stable at :attr:`generation` (None: not yet)."""
    not_before: float = 0.0
    """No conversion attempt before this trio time (after a refused one)."""


@dataclass(frozen=True, slots=True)
class PeerHold:
    """A conversion another sidecar announced: this sidecar holds the group's requests until
    it hears how it ended, or until :attr:`until` (trio time)."""

    converter: str
    generation: int
    until: float
    """trio time at which the sidecar looks at the broker's group itself (the converter has
    not said how the conversion ended by then)."""
    started: float = 0.0
    longest: float = PEER_HOLD_MAX_SECONDS
    """Longest the hold is kept in all (seconds): :data:`PEER_HOLD_MAX_SECONDS`, or less when
    a member's broker session is shorter (:meth:`Upgrades.hold_bound`)."""


def parse_address(address: str) -> Address | None:
    """``host:port`` of a member mark as an address (None: not one)."""
    host, _, port = address.rpartition(":")
    try:
        return (host, int(port)) if host else None
    except ValueError:
        return None


def snapshot_of(group_id: str, generation: int, described: Value,
                joins: Callable[[str], JoinSeen | None], default_session_ms: int
                ) -> ClassicGroupSnapshot | str:
    """The engine's snapshot of the broker's group from its DescribeGroups entry, or why it
    cannot be converted now."""
    if described.get("error_code"):
        return f"DescribeGroups error {described['error_code']}"
    if described.get("group_state") != "Stable":
        return f"the broker's group is {described.get('group_state')}"
    if described.get("protocol_type") != CONSUMER_PROTOCOL_TYPE:
        return f"protocol type {described.get('protocol_type')!r} is not 'consumer'"
    members_in = described.get("members") or []
    if not all_marked(m.get("client_id") or "" for m in members_in):
        return "a member is connected straight to the broker"
    protocol_name = described.get("protocol_data") or ""
    members: list[ClassicGroupMemberSnapshot] = []
    for m in members_in:
        member_id = m["member_id"]
        seen = joins(member_id)
        subscription = convert.parse_subscription(m.get("member_metadata") or b"")
        protocols = [ClassicProtocol(protocol_name, subscription)]
        if seen is not None:
            protocols += [p for p in seen.protocols if p.name != protocol_name]
        raw = m.get("member_assignment") or b""
        assignment = None
        user_data: bytes | None = None
        malformed = False
        if raw:
            try:
                assignment, user_data = convert.parse_assignment(raw)
            except convert.ShapeError:
                malformed = True
        mark = read_mark(m.get("client_id"))
        members.append(ClassicGroupMemberSnapshot(
            member_id=member_id,
            protocols=tuple(protocols),
            assignment=assignment,
            assignment_user_data=user_data,
            assignment_malformed=malformed,
            group_instance_id=m.get("group_instance_id"),
            client_id=mark.client_id if mark is not None else (m.get("client_id") or ""),
            client_host=m.get("client_host") or "",
            session_timeout_ms=seen.session_timeout_ms if seen else default_session_ms,
            rebalance_timeout_ms=seen.rebalance_timeout_ms if seen else default_session_ms,
            kip848_member_id=mark.kip848_member_id if mark is not None else None,
            subscribed_topic_regex=seen.regex if seen is not None else None,
        ))
    return ClassicGroupSnapshot(group_id, generation, CONSUMER_PROTOCOL_TYPE, protocol_name,
                                members)


class ConversionRefused(Exception):
    """The group cannot be converted now (the reason is journalled and logged)."""


class Upgrades:
    """The online upgrade of one sidecar: marks, candidates, the hold and the conversions."""

    def __init__(self, policy: MigrationPolicy, mark_address: str, *,
                 default_session_ms: int = 45_000) -> None:
        self.policy = policy
        self.mark_address = mark_address
        """The fleet address (``host:port``) this sidecar's marks carry; without a fleet
        listener, its client listener's address."""
        self.default_session_ms = default_session_ms
        # Fed by client requests: bounded, entries expire (docs/decisions/0008).
        self.joins: TTLCache[tuple[str, str], JoinSeen] = TTLCache(
            maxsize=JOINS_MAX, ttl=JOINS_SECONDS, timer=trio.current_time)
        self.candidates: TTLCache[str, Candidate] = TTLCache(
            maxsize=CANDIDATES_MAX, ttl=CANDIDATE_SECONDS, timer=trio.current_time)
        self.forwarding: TTLCache[str, bool] = TTLCache(
            maxsize=JOINS_MAX, ttl=JOINS_SECONDS, timer=trio.current_time)
        """Groups whose marked joins this sidecar forwarded: another sidecar may convert them
        (their forwarded requests are counted while at the broker, :meth:`tracked`)."""
        self._in_flight: dict[str, InFlight] = {}
        """Forwarded requests of candidate and forwarding groups not answered yet (an entry
        goes with its last request)."""
        self._peer_holds: dict[str, PeerHold] = {}
        """Groups another sidecar is converting (their events are in :attr:`_holds` too)."""
        self._ended: TTLCache[str, str] = TTLCache(maxsize=PEER_HOLDS_MAX, ttl=ENDED_SECONDS,
                                                   timer=trio.current_time)
        """Groups whose peer hold ended without word from the converter, by its address."""
        self._unsettled: TTLCache[str, bool] = TTLCache(maxsize=PEER_HOLDS_MAX,
                                                        ttl=ENDED_SECONDS,
                                                        timer=trio.current_time)
        """Groups whose peer hold ended converted, or without anybody able to tell, in the
        last :data:`ENDED_SECONDS`: the broker may not coordinate them any more (the safety
        net, :meth:`safety_net`). A hold the broker's group said was not converted is not
        here: that group is the broker's."""
        self._forget_route: Callable[[str], None] = lambda _group_id: None
        self._bridges: Bridges | None = None
        """This sidecar's bridged members (set with the FleetControl handlers)."""
        self._engine_claims: Callable[[str], bool] = lambda _group_id: False
        self.send = fleet_control.send
        """How FleetControl reaches another sidecar (replaced in tests)."""
        self._holds: dict[str, trio.Event] = {}
        """Groups being converted, here (at most one at a time: see :meth:`run`) or by another
        sidecar (:attr:`_peer_holds`)."""
        self.converted: TTLCache[str, int] = TTLCache(
            maxsize=CANDIDATES_MAX, ttl=CANDIDATE_SECONDS, timer=trio.current_time)
        """Groups converted here recently, with the generation they were converted at."""
        self._turned_back: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=JOINS_MAX, ttl=SAFETY_NET_SECONDS, timer=trio.current_time)
        """Members whose late broker answer was turned back (:meth:`safety_net`), by group."""

    # -- step 1: marks ---------------------------------------------------------------------

    def forward_join(self, request: GroupRequest, *, member_id: str | None = None,
                     failure: Callable[[int], Value] | None = None) -> Outcome:
        """A classic JoinGroup the engine does not take: forwarded with the member mark, its
        answer noted (:meth:`observe_join`) and passed back unchanged. ``member_id``: sent
        instead of the request's (a member of a group handed back, whose id is the
        engine's: "" lets the broker give it one)."""
        value = request.value
        if member_id is not None:
            value = dict(value, member_id=member_id)
            request = dataclasses.replace(request, value=value)
        if value.get("protocol_type") != CONSUMER_PROTOCOL_TYPE:
            return PASS if member_id is None else Upstream(value, _unchanged)
        group_id = value["group_id"]
        if self.policy.upgrade_enabled:
            self.forwarding[group_id] = True
        marked = member_mark(self.mark_address, request.client_id)
        header = encode_request_header(request.api_key, request.version,
                                       request.correlation_id, marked)
        release = self._track(group_id)

        def on_response(response: Value) -> Value:
            if release is not None:
                release()
            if failure is not None:
                instead = self.safety_net(group_id, value.get("member_id") or "", response,
                                          failure)
                if instead is not None:
                    return instead
            try:
                self.observe_join(group_id, request, response)
            except (KeyError, TypeError, ValueError, convert.ShapeError):
                log.debug("group %s: JoinGroup answer not noted", group_id, exc_info=True)
            return response

        return Upstream(value, on_response, release, header=header)

    # -- step 2: detection -------------------------------------------------------------------

    def observe_join(self, group_id: str, request: GroupRequest, response: Value) -> None:
        """The broker's answer to a forwarded JoinGroup: remember the member's join; if it is
        the leader's answer, the group is a candidate when every member is marked."""
        if response.get("error_code") != ErrorCode.NONE:
            return
        member_id = response.get("member_id") or ""
        if not member_id:
            return
        join = convert.join_group_request(request.value, request.version,
                                          client_id=request.client_id,
                                          client_host=request.client_host)
        self.joins[(group_id, member_id)] = JoinSeen(
            tuple(join.protocols), join.session_timeout_ms,
            join.rebalance_timeout_ms if join.rebalance_timeout_ms > 0
            else join.session_timeout_ms,
            join.group_instance_id, join.client_id, join.client_host)
        if response.get("leader") != member_id:
            return
        self.note_leader(group_id, response["generation_id"],
                         frozenset(m["member_id"] for m in response.get("members") or ()))

    def note_leader(self, group_id: str, generation: int, member_ids: frozenset[str]) -> None:
        """The broker's leader answer for ``group_id``, seen here (a forwarded member's, or a
        bridged member's, :mod:`.bridged`): the group is a candidate when every member is
        marked."""
        if not self.policy.upgrade_enabled or not all_marked(member_ids):
            # a direct member: the group stays the broker's
            self.candidates.pop(group_id, None)
            return
        previous = self.candidates.get(group_id)
        candidate = Candidate(generation, member_ids)
        if previous is not None:
            candidate.not_before = previous.not_before
        self.candidates[group_id] = candidate
        log.info("group %s: every member of the broker's group is behind a sidecar "
                 "(generation %d, %d member(s)); converting it once it is stable", group_id,
                 candidate.generation, len(member_ids))

    # -- forwarded requests of candidates, and the hold --------------------------------------

    def _track(self, group_id: str) -> Callable[[], None] | None:
        if group_id not in self.candidates and group_id not in self.forwarding:
            return None
        requests = self._in_flight.setdefault(group_id, InFlight())
        done = requests.track()

        def release() -> None:
            done()
            if not requests.count and self._in_flight.get(group_id) is requests:
                del self._in_flight[group_id]

        return release

    def tracked(self, request: GroupRequest, group_ids: Sequence[str],
                failure: Callable[[int], Value] | None = None) -> Upstream | None:
        """A forwarded (untouched) request of a candidate group, counted while it is at the
        broker so that a conversion can wait for it, its answer through the safety net
        (:meth:`safety_net`, with ``failure``: the request's response failing it with an
        error); None: forward it as it is."""
        if len(group_ids) != 1 or (group_ids[0] not in self.candidates
                                   and group_ids[0] not in self.forwarding):
            return None
        group_id = group_ids[0]
        release = self._track(group_id)
        if release is None:
            return None
        done = release
        member_id = str(request.value.get("member_id") or "")

        def on_response(response: Value) -> Value:
            done()
            if failure is not None:
                instead = self.safety_net(group_id, member_id, response, failure)
                if instead is not None:
                    return instead
            elif self._late(group_id) and answer_error(response) in SAFETY_NET_ERRORS:
                metrics.GROUP_CONVERSION_LATE_ANSWERS.inc()
            return response

        return Upstream(request.value, on_response, release)

    def _late(self, group_id: str) -> bool:
        return (group_id in self._holds or group_id in self.converted
                or group_id in self._unsettled)

    def safety_net(self, group_id: str, member_id: str, response: Value,
                   failure: Callable[[int], Value]) -> Value | None:
        """What the client gets instead of the broker's answer to its forwarded request of
        ``group_id`` (None: the broker's answer; decision record 0018, the safety net).

        Around a conversion of the group this sidecar heard of (being converted or held
        here, converted here, or a hold that ended converted or undecided in the last
        :data:`ENDED_SECONDS`), an answer UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or
        INCONSISTENT_GROUP_PROTOCOL may come from a group the broker no longer coordinates:
        the lock holds it and the engine has the member, at the generation it had. So it is
        not passed on: the client is answered NOT_COORDINATOR
        (it finds the coordinator, this sidecar, again and sends the request again), and
        who holds the group is looked up again (the route is forgotten), so that the request
        sent again is relayed to the holder, or answered by this sidecar's engine, or, if the
        broker still coordinates the group, forwarded again; the broker's answer to that one
        (within :data:`SAFETY_NET_SECONDS`) reaches the client as it is. Outside a
        conversion these answers are the broker phase's own (a cooperative member's stale
        generation, a member whose session ran out) and pass untouched: turning them back
        there delays every rebalance (the migration roll showed it)."""
        code = answer_error(response)
        if code not in SAFETY_NET_ERRORS or not self._late(group_id):
            return None
        metrics.GROUP_CONVERSION_LATE_ANSWERS.inc()
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            # the broker's group rebalances: a group the lock took answers a removed member
            # UNKNOWN_MEMBER_ID first, so this one is the broker's own (counted only)
            return None
        key = (group_id, member_id)
        if key in self._turned_back:
            return None  # looked at again since: the broker's answer stands
        self._turned_back[key] = True
        self._forget_route(group_id)
        metrics.GROUP_CONVERSION_TURNED_BACK.inc()
        log.info("group %s: the broker answered member %s %s; not passed on: the group is "
                 "looked up again and the client sends the request again", group_id,
                 member_id or "(none)", ErrorCode(code).name)
        return failure(int(ErrorCode.NOT_COORDINATOR))

    @property
    def converting(self) -> bool:
        """Whether a conversion is under way (its group's requests are held)."""
        return bool(self._holds)

    def holding(self, group_ids: Sequence[str]) -> trio.Event | None:
        """The event set when the conversion of one of ``group_ids`` is over (None: none is
        being converted): their requests wait for it (at most :data:`HOLD_SECONDS`) and are
        decided again."""
        if not self._holds:
            return None
        for group_id in group_ids:
            hold = self._holds.get(group_id)
            if hold is not None:
                return hold
        return None

    async def _drain(self, group_id: str) -> bool:
        requests = self._in_flight.get(group_id)
        return requests is None or await requests.drained(DRAIN_SECONDS)

    # -- step 3: conversion ------------------------------------------------------------------

    async def run(self, service: CoordinatorService) -> None:
        """Poll the candidates every :data:`POLL_SECONDS` and convert those that are ready,
        one at a time; meanwhile decide other sidecars' conversions whose hold ran out
        (:meth:`sweep`)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.sweep, service)
            while True:
                await trio.sleep(POLL_SECONDS)
                for group_id in list(self.candidates):
                    candidate = self.candidates.get(group_id)
                    if candidate is None or trio.current_time() < candidate.not_before:
                        continue
                    if (service.engine_claims(group_id) or not self.policy.upgrade_enabled
                            or service.releases.get(group_id, trio.current_time()) is not None
                            or await service.released_durably(group_id)):
                        # handed back (:mod:`.release`; remembered here, or in the state
                        # log): not converted again meanwhile
                        self.candidates.pop(group_id, None)
                        continue
                    if service.classic is None and not all(
                            (mark := read_mark(m)) is not None and mark.kip848_member_id
                            for m in candidate.member_ids):
                        continue  # classic members: the engine could not serve them
                    await self.poll(service, group_id, candidate)

    async def sweep(self, service: CoordinatorService) -> None:
        """Every :data:`SWEEP_SECONDS`: the holds of other sidecars' conversions that ran out
        without word are decided from the broker's group (:data:`PEER_HOLD_MAX_SECONDS`)."""
        while True:
            await trio.sleep(SWEEP_SECONDS)
            now = trio.current_time()
            for group_id, peer in list(self._peer_holds.items()):
                if now < peer.until:
                    continue
                outcome = await self._outcome(service, group_id)
                if self._peer_holds.get(group_id) is not peer:
                    continue  # told meanwhile
                if outcome is None and now - peer.started < peer.longest:
                    continue
                said = ("nothing yet: its members go on as they were" if outcome is None
                        else "converted" if outcome else "not converted")
                log.warning("group %s: the sidecar at %s did not say how its conversion ended; "
                            "the broker's group says %s", group_id, peer.converter, said)
                self._ended[group_id] = peer.converter
                if outcome is not False:  # the lock holds it, or nobody can tell: late
                    self._unsettled[group_id] = True
                self._end_peer_hold(group_id, converted=bool(outcome))

    async def _outcome(self, service: CoordinatorService, group_id: str) -> bool | None:
        """Whether the broker's group shows the conversion happened (the lock holds it, Stable),
        did not (Stable with its members' protocol), or cannot tell yet (None)."""
        try:
            described = await self._describe(service, group_id)
        except (CoordinatorUnavailable, UpstreamError, trio.TooSlowError):
            return None
        if described.get("error_code") or described.get("group_state") != "Stable":
            return None
        return described.get("protocol_data") == LOCK_PROTOCOL

    async def poll(self, service: CoordinatorService, group_id: str, candidate: Candidate
                   ) -> None:
        """One look at a candidate: note it Stable, or convert it if it was on an earlier
        poll at least :data:`POLL_SECONDS` ago."""
        if group_id in self._holds:
            return  # being converted
        try:
            described = await self._describe(service, group_id)
        except (CoordinatorUnavailable, UpstreamError, trio.TooSlowError) as exc:
            log.info("group %s: could not describe the broker's group: %s", group_id, exc)
            return
        ready = self._still_ready(group_id, candidate, described)
        now = trio.current_time()
        if not ready:
            candidate.stable_since = None
            return
        if candidate.stable_since is None:
            candidate.stable_since = now
            return
        if now - candidate.stable_since < POLL_SECONDS:
            return
        waiting = service.bridges.unconvertible(group_id, candidate.generation)
        if waiting is not None:
            # this sidecar's own bridged members are not there yet (a client heartbeats once
            # an interval): looked at again on the next poll, not refused for RETRY_SECONDS
            log.debug("group %s: not converted yet: %s", group_id, waiting)
            return
        await self.convert(service, group_id, candidate)

    def _still_ready(self, group_id: str, candidate: Candidate, described: Value) -> bool:
        if self.candidates.get(group_id) is not candidate:
            return False  # a newer leader answer replaced it meanwhile
        if described.get("error_code") or described.get("group_state") != "Stable":
            return False
        members = described.get("members") or []
        return (frozenset(m["member_id"] for m in members) == candidate.member_ids
                and all_marked(m.get("client_id") or "" for m in members))

    async def _describe(self, service: CoordinatorService, group_id: str) -> Value:
        deadline = trio.current_time() + service.config.connect_timeout
        _, address = await find_coordinator(service.pool, service.config.upstream, group_id,
                                            deadline)
        with trio.fail_after(max(deadline - trio.current_time(), 1.0)):
            response = await service.pool.link(address).request(
                ApiKey.DESCRIBE_GROUPS, DESCRIBE_VERSION,
                {"groups": [group_id], "include_authorized_operations": False})
        groups = response.get("groups") or []
        if len(groups) != 1:
            raise UpstreamError("DescribeGroups answered no group")
        described: Value = groups[0]
        return described

    async def convert(self, service: CoordinatorService, group_id: str, candidate: Candidate
                      ) -> str | None:
        """Convert the candidate: announce, hold, drain, snapshot, empty and lock, adopt, tell.
        Returns why not (None: converted)."""
        hold = self._holds[group_id] = trio.Event()
        announced: list[Address] = []
        reason: str | None = "the conversion was interrupted"
        converted = False
        try:
            reason = await self._announce(service, group_id, candidate, announced)
            if reason is None:
                reason = await self._convert_held(service, group_id, candidate)
                converted = reason is None
        except (CoordinatorUnavailable, UpstreamError, trio.TooSlowError) as exc:
            reason = f"the broker could not be asked: {exc}"
        finally:
            if converted:
                service.bridges.convert_away(group_id)  # before any held request goes on
            else:
                service.bridges.resume(group_id)
            del self._holds[group_id]
            hold.set()
            if announced:  # shielded and bounded: also when the conversion was cancelled
                ended = ({"type": "GroupConverted", "group": group_id,
                          "converter": self.mark_address} if converted
                         else {"type": "ConversionAborted", "group": group_id,
                               "converter": self.mark_address, "reason": reason})
                await self._tell_all(service, announced, ended)
        if converted:
            self.candidates.pop(group_id, None)
            self.converted[group_id] = candidate.generation
            return None
        metrics.GROUP_CONVERSIONS.labels("aborted").inc()
        log.warning("group %s: not moved to the engine: %s; trying again in %.0f s",
                    group_id, reason, RETRY_SECONDS)
        candidate.stable_since = None
        candidate.not_before = trio.current_time() + RETRY_SECONDS
        why = reason or "unknown"
        journal(service, lambda observer, now: observer.conversion_aborted(
            group_id, candidate.generation, why, now))
        return why

    # -- other sidecars' members: the announcement (decision record 0018, step 1) -----------

    def peers(self, candidate: Candidate) -> list[str]:
        """The fleet addresses of the other sidecars whose members are in the group."""
        found = {mark.address for m in candidate.member_ids
                 if (mark := read_mark(m)) is not None and mark.address != self.mark_address}
        return sorted(found)

    async def _announce(self, service: CoordinatorService, group_id: str,
                        candidate: Candidate, announced: list[Address]) -> str | None:
        """``GroupConverting`` to every other sidecar with members in the group, at once (each
        is added to ``announced``: told how it ended, whatever it answered); returns why not
        (None: every one acknowledged and now holds the group's requests)."""
        failures: list[str] = []
        body = {"type": "GroupConverting", "group": group_id,
                "generation": candidate.generation, "converter": self.mark_address,
                "members": sorted(candidate.member_ids)[:ANSWER_MEMBERS_MAX]}

        async def one(peer: str) -> None:
            address = parse_address(peer)
            if address is None:
                failures.append(f"a member's mark names no fleet address ({peer!r})")
                return
            announced.append(address)  # told the outcome whatever it answers
            try:
                error, answer = await self.send(
                    address, body, security=service.security, timeout=ANNOUNCE_SECONDS)
            except UpstreamError as exc:
                failures.append(f"the sidecar at {peer} did not acknowledge: {exc}")
                return
            if error != ErrorCode.NONE:
                failures.append(f"the sidecar at {peer} refused: "
                                f"{fleet_control.error_name(error)}")
                return
            self._note_peer_members(group_id, candidate, answer)

        async with trio.open_nursery() as nursery:
            for peer in self.peers(candidate):
                nursery.start_soon(one, peer)
        if failures:
            return "; ".join(sorted(failures))
        if announced:
            log.info("group %s: %d other sidecar(s) hold the group's requests for its "
                     "conversion", group_id, len(announced))
        return None

    def _note_peer_members(self, group_id: str, candidate: Candidate,
                           answer: fleet_control.Body | None) -> None:
        """The sessions and rebalance timeouts of another sidecar's members, from its
        acknowledgement (what DescribeGroups does not show)."""
        members = (answer or {}).get("members")
        if not isinstance(members, dict):
            return
        regexes = (answer or {}).get("regexes")
        if not isinstance(regexes, dict):
            regexes = {}
        for member_id, timeouts in members.items():
            if (member_id in candidate.member_ids and isinstance(timeouts, list)
                    and len(timeouts) == 2 and all(isinstance(t, int) and t > 0
                                                   for t in timeouts)):
                regex = regexes.get(member_id)
                self.joins[(group_id, member_id)] = JoinSeen(
                    (), timeouts[0], timeouts[1], None, "", "",
                    regex if isinstance(regex, str) and regex else None)

    async def _tell_all(self, service: CoordinatorService, addresses: list[Address],
                        body: fleet_control.Body) -> None:
        async def one(address: Address) -> None:
            try:
                await self.send(address, body, security=service.security,
                                timeout=ANNOUNCE_SECONDS)
            except UpstreamError as exc:
                log.info("group %s: could not tell the sidecar at %s:%d %s: %s (it decides "
                         "the group's requests again after %.0f s)", body["group"], *address,
                         body["type"], exc, PEER_HOLD_SECONDS)

        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for address in addresses:
                    nursery.start_soon(one, address)

    def control_handlers(self, service: CoordinatorService
                         ) -> dict[str, fleet_control.Handler]:
        """What this sidecar answers of another sidecar's conversion (:mod:`.fleet_control`)."""
        self._forget_route = lambda group_id: service.routes.forget([group_id])
        self._bridges = service.bridges
        self._engine_claims = service.engine_claims
        return {"GroupConverting": self.on_converting, "GroupConverted": self.on_ended,
                "ConversionAborted": self.on_ended}

    async def on_converting(self, body: fleet_control.Body, source: str
                            ) -> fleet_control.Answer:
        """``GroupConverting``: hold the group's requests, wait (a little) for those at the
        broker, and acknowledge with the sessions of this sidecar's members of the group."""
        try:
            group_id = fleet_control.field(body, "group", str)
            generation = fleet_control.field(body, "generation", int)
            converter = fleet_control.field(body, "converter", str)
        except (KeyError, TypeError):
            return ErrorCode.INVALID_REQUEST
        if not self.policy.upgrade_enabled:
            log.info("group %s: %s announced its conversion; refused: migration-policy %s",
                     group_id, source, self.policy.value)
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self._engine_claims(group_id) or (group_id in self._holds
                                            and group_id not in self._peer_holds):
            return ErrorCode.REBALANCE_IN_PROGRESS  # this sidecar has it, or converts it
        if group_id not in self._peer_holds and len(self._peer_holds) >= PEER_HOLDS_MAX:
            return ErrorCode.REBALANCE_IN_PROGRESS
        wanted = body.get("members")
        announced = (frozenset(m for m in wanted if isinstance(m, str))
                     if isinstance(wanted, list) else None)
        self._end_peer_hold(group_id)  # an earlier announcement of it, replaced
        self._ended.pop(group_id, None)
        now = trio.current_time()
        self._holds[group_id] = trio.Event()
        bound = self.hold_bound(group_id)
        self._peer_holds[group_id] = PeerHold(converter, generation,
                                              now + min(PEER_HOLD_SECONDS, bound), now,
                                              min(PEER_HOLD_MAX_SECONDS, bound))
        requests = self._in_flight.get(group_id)
        bridges = self._bridges
        deadline = now + PEER_DRAIN_SECONDS
        why: str | None = None
        if requests is not None and not await requests.drained(PEER_DRAIN_SECONDS):
            why = "forwarded requests of the group are still at the broker"
        elif bridges is not None and bridges.suspend(group_id):
            if not await bridges.drained(group_id, max(0.0, deadline - trio.current_time())):
                why = "bridged members' requests are still at the broker"
            else:
                why = bridges.unconvertible(group_id, generation)
        if why is not None:
            self._end_peer_hold(group_id)
            log.info("group %s: %s announced its conversion; refused: %s", group_id, source,
                     why)
            return ErrorCode.REBALANCE_IN_PROGRESS
        members = {member_id: [seen.session_timeout_ms, seen.rebalance_timeout_ms]
                   for (group, member_id), seen in list(self.joins.items())
                   if group == group_id and (announced is None or member_id in announced)}
        regexes: dict[str, str] = {}
        if bridges is not None:
            members.update(bridges.timeouts(group_id))
            regexes = bridges.regexes(group_id)
        log.info("group %s: %s converts it at generation %d; holding its requests here",
                 group_id, source, generation)
        answer: fleet_control.Body = {
            "members": dict(list(members.items())[:ANSWER_MEMBERS_MAX])}
        if regexes:  # bridged members subscribing by regex: adopted with it
            answer["regexes"] = dict(list(regexes.items())[:ANSWER_MEMBERS_MAX])
        return ErrorCode.NONE, answer

    def hold_bound(self, group_id: str) -> float:
        """Longest a hold of ``group_id`` may last here (seconds): :data:`HOLD_SESSION_SHARE`
        of the shortest broker session of this sidecar's members of the group."""
        sessions = [seen.session_timeout_ms for (group, _m), seen in list(self.joins.items())
                    if group == group_id and seen.session_timeout_ms > 0]
        bridges = self._bridges
        if bridges is not None and bridges.has_group(group_id):
            sessions.append(bridges.settings.session_timeout_ms)
        if not sessions:
            return PEER_HOLD_MAX_SECONDS
        return HOLD_SESSION_SHARE * min(sessions) / 1000

    def on_ended(self, body: fleet_control.Body, source: str) -> ErrorCode:
        """``GroupConverted`` or ``ConversionAborted`` from the converter it names: the group's
        held requests are decided again, after a fresh look at who holds it."""
        try:
            group_id = fleet_control.field(body, "group", str)
            converter = fleet_control.field(body, "converter", str)
        except (KeyError, TypeError):
            return ErrorCode.INVALID_REQUEST
        converted = body.get("type") == "GroupConverted"
        peer = self._peer_holds.get(group_id)
        if peer is None:
            if converted and self._ended.pop(group_id, None) == converter:
                # the hold had run out and the broker's group said nothing yet: the bridged
                # members went on; the engine has them now
                if self._bridges is not None:
                    self._bridges.convert_away(group_id)
                self._forget_route(group_id)
            return ErrorCode.NONE  # not held here (any more)
        if peer.converter != converter:
            return ErrorCode.INVALID_REQUEST  # not the sidecar that announced it
        log.info("group %s: %s says %s", group_id, source,
                 "it converted the group" if converted
                 else f"its conversion was aborted ({str(body.get('reason'))[:300]})")
        if converted:
            self._unsettled[group_id] = True
        self._end_peer_hold(group_id, converted=converted)
        return ErrorCode.NONE

    def _end_peer_hold(self, group_id: str, *, converted: bool = False) -> None:
        if self._peer_holds.pop(group_id, None) is None:
            return
        if self._bridges is not None:
            if converted:
                self._bridges.convert_away(group_id)
            else:
                self._bridges.resume(group_id)
        self._forget_route(group_id)
        hold = self._holds.pop(group_id, None)
        if hold is not None:
            hold.set()

    async def _convert_held(self, service: CoordinatorService, group_id: str,
                            candidate: Candidate) -> str | None:
        if not await self._drain(group_id):
            return "forwarded requests of the group are still unanswered"
        bridges = service.bridges
        if bridges.suspend(group_id):
            if not await bridges.drained(group_id, DRAIN_SECONDS):
                return "bridged members' requests of the group are still unanswered"
            unconvertible = bridges.unconvertible(group_id, candidate.generation)
            if unconvertible is not None:
                return unconvertible
        regexes = bridges.regexes(group_id)
        for member_id, (session_ms, rebalance_ms) in bridges.timeouts(group_id).items():
            self.joins[(group_id, member_id)] = JoinSeen((), session_ms, rebalance_ms, None,
                                                         "", "", regexes.get(member_id))
        if self.candidates.get(group_id) is not candidate:
            return "the broker's group rebalanced meanwhile"
        described = await self._describe(service, group_id)
        if not self._still_ready(group_id, candidate, described):
            return "the broker's group changed meanwhile"
        snapshot = snapshot_of(group_id, candidate.generation, described,
                               lambda m: self.joins.get((group_id, m)),
                               self.default_session_ms)
        if isinstance(snapshot, str):
            return snapshot
        refusal = conversion_refusal(service.engine, snapshot)
        if refusal is not None:
            return refusal
        leaving = [(m.member_id, m.group_instance_id) for m in snapshot.members]
        failure = await service.take_over_converting(snapshot, leaving)
        if failure is not None:
            return f"the broker's group could not be locked: {failure}"
        metrics.GROUP_CONVERSIONS.labels("converted").inc()
        log.info("group %s: moved from the broker's classic coordinator to the engine at "
                 "generation %d with its %d member(s); nobody was called back", group_id,
                 snapshot.generation_id, len(snapshot.members))
        return None



async def adopt_snapshot(service: CoordinatorService, snapshot: ClassicGroupSnapshot) -> None:
    """Once the lock is held (the membership's ``on_established``): the engine adopts the
    broker's group as the snapshot shows it, and that is written to the state log before any
    held request is answered. Raises (the membership then leaves the broker's group, whose
    members rejoin it) if the group cannot be adopted after all."""
    group_id = snapshot.group_id
    if service.durability is not None:
        loaded = await service.durability.take_over(group_id)
        service.apply(loaded.effects)
        group = service.engine.group(group_id)
        if group is not None and group.members:
            raise MembershipRefused(f"the state log holds members of group {group_id} from an "
                                    "earlier time; not converting it")
    names = {t for m in snapshot.members for p in m.protocols[:1]
             if p.subscription is not None for t in p.subscription.topics}
    await service.refresh_topics(names)
    refusal, effects = convert_classic_group(service.engine, snapshot, service.now_ms())
    if refusal is not None:
        raise MembershipRefused(f"group {group_id} cannot be converted: {refusal}")
    service.apply(effects)
    if service.durability is not None:
        failed = await service.durability.settled(group_id)
        if failed is not None:
            raise MembershipRefused(f"group {group_id}: the converted group was not written: "
                                    f"{failed}")
    journal(service, lambda observer, now: observer.converted(
        group_id, snapshot.generation_id, snapshot.protocol_name,
        [m.member_id for m in snapshot.members], now))


def journal(service: CoordinatorService,
            events: Callable[[JournalObserver, int], list[Event]]) -> None:
    """Write the events ``events`` makes, if the journal is on."""
    if service.journal is not None and service.observer is not None:
        service.journal.record_all(events(service.observer, int(time.time() * 1000)))
