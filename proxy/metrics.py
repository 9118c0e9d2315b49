"""Prometheus metrics of the proxy, labelled by node and API where it matters.

The per-request counter sits on the forwarding path, so it is a plain dictionary increment
(about 150 ns, against about 770 ns for a cached prometheus-client child and 2 us for
``labels().inc()``, measured in ``docs/decisions/0002-metrics.md``); a custom collector turns
the dictionary into ``groupgate_requests_total`` when Prometheus scrapes. The other metrics of
the forwarding path are kept the same way: bytes of client frames per listener
(:class:`Traffic`, ``groupgate_client_bytes_*_total``) and the per-API request latency
histogram (:func:`observe_request`, ``groupgate_request_duration_seconds``, about 100 ns an
observation). What the coordinator holds (groups by state and protocol, members by protocol,
groups this sidecar follows) is read from it at scrape time (:func:`watch_coordination`).

Every label set is bounded by the code, never by what clients send: nodes are the listeners
the proxy opened, APIs the ones it accepts, reasons and outcomes fixed words (unknown ones
become ``other``); no group or member id is a label.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from proxy.codec.api_index import api_index

REGISTRY = CollectorRegistry(auto_describe=True)

CONNECTIONS = Counter("groupgate_connections_accepted", "Client connections accepted",
                      ["node"], registry=REGISTRY)
ACTIVE_CONNECTIONS = Gauge("groupgate_connections_active", "Client connections open",
                           ["node"], registry=REGISTRY)
CLOSED_BAD_INPUT = Counter("groupgate_connections_closed_bad_input",
                           "Connections closed because of a malformed or hostile frame",
                           ["node"], registry=REGISTRY)
REFUSED_CONNECTIONS = Counter("groupgate_connections_refused",
                              "Client connections closed at once: max-connections were open",
                              ["node"], registry=REGISTRY)
UPSTREAM_FAILURES = Counter("groupgate_upstream_connect_failures",
                            "Client connections closed because no upstream broker was reachable",
                            ["node"], registry=REGISTRY)
FLEET_RELAYS = Counter("groupgate_fleet_relayed_requests",
                       "Group requests relayed to the sidecar that coordinates their group, by "
                       "outcome (answered, failed: the sidecar could not be reached)",
                       ["outcome"], registry=REGISTRY)
FLEET_UNFOLLOWABLE = Counter(
    "groupgate_fleet_unfollowable",
    "Times this sidecar could not follow the sidecar coordinating a group, by reason "
    "(no-address: the holder has no fleet listener; unreachable: no connection to its fleet "
    "address could be opened); /readyz lists the recent cases", ["reason"], registry=REGISTRY)
LIVENESS = Counter(
    "groupgate_liveness_members",
    "Pod-local liveness of the members next to this sidecar, by outcome (suspected: every "
    "connection of its client closed together; declared: none came back within the grace; "
    "returned: the client or the member came back within it)",
    ["outcome"], registry=REGISTRY)
MEMBER_GONE = Counter(
    "groupgate_member_gone",
    "Member-gone messages, by result (fenced or refused at this sidecar as the group's "
    "holder; sent to another sidecar; dropped: no protocol-3 holder could be told)",
    ["result"], registry=REGISTRY)
COMMIT_TICKETS = Counter(
    "groupgate_commit_tickets",
    "Commit tickets (a relayed member's commit validated by the holder and sent by the "
    "follower on the client's connection), by event: issued, refused (validation failed), "
    "full (too many open), reported, report_failed, report_dropped, relayed (the holder "
    "takes no tickets: the commit was relayed)",
    ["event"], registry=REGISTRY)
REMAINDERS = Counter(
    "groupgate_remainders",
    "OffsetFetch, OffsetDelete, DescribeGroups and DeleteGroups of members behind a follower: "
    "the coordinating sidecar answers the engine's part, the follower sends the rest on the "
    "client's connection; by event: split (at the coordinating sidecar), sent (the rest sent "
    "by the follower), whole (the engine answered all), refused, relayed (the coordinating "
    "sidecar takes none: relayed)", ["event"], registry=REGISTRY)
REGEX_RIGHTS = Counter(
    "groupgate_regex_rights",
    "Relayed ConsumerGroupHeartbeats and their member's rights (regexes resolved under them), "
    "by event: asked (the coordinating sidecar asked the follower for them), brought (the "
    "follower asked the broker and sent the heartbeat again with them), plain (the "
    "coordinating sidecar takes no heartbeats in FleetControl: relayed)", ["event"],
    registry=REGISTRY)
CLIENT_AUTHENTICATIONS = Counter(
    "groupgate_client_authentications",
    "SASL authentications of clients through the proxy, by listener, mechanism and outcome "
    "(ok, reauthenticated: KIP-368 on an authenticated connection, failed: the broker refused)",
    ["node", "mechanism", "outcome"], registry=REGISTRY)
TLS_REFUSED = Counter("groupgate_tls_refused",
                      "Client connections closed for their TLS: TLS on a listener without it, "
                      "plaintext on one with it, or a failed handshake",
                      ["node"], registry=REGISTRY)
GROUPS_HELD = Gauge("groupgate_groups_held",
                    "Groups whose broker group this sidecar holds: it coordinates them",
                    registry=REGISTRY)
STALE_COMMIT_RETRIES = Counter(
    "groupgate_stale_commit_retries",
    "Partitions of commits acknowledged without being written: the client retried a commit the "
    "proxy had failed after a newer commit of the same member succeeded", registry=REGISTRY)
LEASE_EVENTS = Counter("groupgate_group_lease_events",
                       "Changes of this sidecar's hold on broker groups: won, lost-election "
                       "(another sidecar holds the group), expired (no heartbeat answered in "
                       "time: stopped acting), lost (the broker dropped the member), cut-off "
                       "(no answer from the broker for a whole session: the members are told "
                       "to let go)",
                       ["event"], registry=REGISTRY)
STATE_RECORDS_SKIPPED = Counter(
    "groupgate_state_records_skipped",
    "Group state records a takeover could not load and skipped (the members they described "
    "rejoin)", registry=REGISTRY)
STATE_WRITE_TASK_FAILURES = Counter(
    "groupgate_state_write_task_failures",
    "Groups whose state-writing task failed unexpectedly (the group was given up and taken "
    "over again)", registry=REGISTRY)
STATE_MEMBERS_TOO_LARGE = Counter(
    "groupgate_state_members_refused_too_large",
    "Members refused because their group state record would exceed the state topic's "
    "max.message.bytes, by API (consumer-group-heartbeat, join-group)",
    ["api"], registry=REGISTRY)
FLEET_SETTINGS_MISMATCHES = Counter(
    "groupgate_fleet_state_log_mismatches",
    "Groups this sidecar did not coordinate because the sidecar holding them uses other "
    "state-log settings, by setting (state-log, state-log-topic, "
    "state-log-transactional-id-prefix)", ["setting"], registry=REGISTRY)
BROKER_GROUP_JOINS = Counter(
    "groupgate_broker_group_joins",
    "JoinGroup requests this sidecar's own members sent to broker groups, by reason: takeover "
    "(taking a group over) or rejoin (a group it holds: new topics, a lost generation)",
    ["reason"], registry=REGISTRY)
GROUP_CONVERSIONS = Counter(
    "groupgate_group_conversions",
    "Online upgrades of a broker's classic group to the engine (every member behind a "
    "sidecar), by outcome: converted, or aborted (refused or failed; tried again later)",
    ["outcome"], registry=REGISTRY)
GROUP_CONVERSION_LATE_ANSWERS = Counter(
    "groupgate_group_conversion_late_answers",
    "Forwarded requests of a group being converted, or just converted, that the broker "
    "answered UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS or "
    "INCONSISTENT_GROUP_PROTOCOL (the conversion's hold missed them)", registry=REGISTRY)
GROUP_CONVERSION_TURNED_BACK = Counter(
    "groupgate_group_conversion_turned_back",
    "Broker answers to forwarded requests that the conversion's safety net did not pass to "
    "the client (answered NOT_COORDINATOR, the group looked up again, the request sent "
    "again)", registry=REGISTRY)

GROUP_RELEASES = Counter(
    "groupgate_group_releases",
    "Hand-backs of a group to the broker's classic coordinator, or to Kafka 4.x's KIP-848 "
    "coordinator (groupgate release [--to native], or the downgrade policy), by outcome: "
    "started, released, aborted (the group was lost meanwhile, or a sidecar relaying for it "
    "could not be told)",
    ["outcome"], registry=REGISTRY)
BRIDGED_MEMBERS = Counter(
    "groupgate_bridged_members",
    "Bridged members (the classic member this sidecar runs in a broker group for a KIP-848 "
    "client while the group has members connected straight to the broker), by event: "
    "started, carried (carried over from a group handed back), left (the client left), "
    "expired (the client stopped heartbeating), failed (the group cannot take one, or its "
    "task failed), stopped (the proxy stopped), refused (migration-policy disabled or "
    "downgrade: the "
    "client was answered GROUP_ID_NOT_FOUND), converted (the group moved to the engine, which "
    "adopted the client)",
    ["event"], registry=REGISTRY)
BRIDGED_ACTIVE = Gauge("groupgate_bridged_members_active",
                       "Bridged members this sidecar runs now", registry=REGISTRY)
BROKER_PHASE_GROUPS = Counter(
    "groupgate_broker_phase_entered",
    "Times a group's KIP-848 members were bridged into the broker's group because it has "
    "members connected straight to the broker", registry=REGISTRY)

JOURNAL_WRITTEN = Counter("groupgate_journal_events_written",
                          "Group events written to the journal topic", registry=REGISTRY)
JOURNAL_DROPPED = Counter("groupgate_journal_events_dropped",
                          "Group events not written: the journal's buffer was full "
                          "(buffer-full) or the broker refused them (rejected)",
                          ["reason"], registry=REGISTRY)
JOURNAL_BUFFERED = Gauge("groupgate_journal_buffered_events",
                         "Group events waiting to be written to the journal topic",
                         registry=REGISTRY)
JOURNAL_WRITE_ERRORS = Counter("groupgate_journal_write_errors",
                               "Journal writes that failed and are retried (broker unreachable, "
                               "leader moved, topic not ready)", registry=REGISTRY)

STATE_LOG_WRITE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                  30.0)
STATE_LOG_WRITES = Histogram(
    "groupgate_state_log_write_seconds",
    "State-log transactions of the groups this sidecar coordinates (AddPartitionsToTxn, "
    "Produce, EndTxn), from the first request to the commit's answer, by outcome (committed, "
    "failed: refused, unavailable past state-log-write-timeout-ms, or fenced)",
    ["outcome"], buckets=STATE_LOG_WRITE_BUCKETS, registry=REGISTRY)

FENCE_REASONS: Final = frozenset({"session-timeout", "rebalance-timeout", "pod-local",
                                  "let-go", "join-timeout", "sync-timeout"})
""":class:`translation.effects.MemberFenced` reasons; any other counts as ``other``."""
MEMBERS_FENCED = Counter(
    "groupgate_members_fenced",
    "Members the engine fenced in the groups this sidecar coordinates, by reason "
    "(session-timeout, rebalance-timeout, pod-local, let-go: told to let go when the lease was "
    "cut off, then loaded again; classic members also join-timeout, sync-timeout)",
    ["reason"], registry=REGISTRY)

DEPARTURE_WAITS = Counter(
    "groupgate_departure_waits",
    "Departure waits (classic-departure-wait-ms) ended in the groups this sidecar coordinates, "
    "by outcome (replaced: as many members arrived as had left; not-replaced: the wait ran out "
    "or no eager classic member was left, the departed members' partitions waited for it)",
    ["outcome"], registry=REGISTRY)

REBALANCE_REASONS: Final = frozenset({
    "group created", "member joined", "subscription changed", "member left",
    "session timeout", "rebalance timeout", "pod local", "let go", "classic join timeout",
    "classic sync timeout", "regex resolution changed", "subscribed topic metadata changed",
    "preferred assignor changed", "converted while rebalancing"})
"""The phrases the engine gives for a group epoch bump (several are joined with ``; ``)."""
REBALANCES = Counter(
    "groupgate_rebalances",
    "Group epoch bumps (a new target assignment: a KIP-848 rebalance) in the groups this "
    "sidecar coordinates, by the first reason the engine gave (group-created, member-joined, "
    "subscription-changed, member-left, session-timeout, rebalance-timeout, pod-local, let-go, "
    "classic-join-timeout, classic-sync-timeout, regex-resolution-changed, "
    "subscribed-topic-metadata-changed, preferred-assignor-changed, "
    "converted-while-rebalancing, other)", ["reason"], registry=REGISTRY)


def fence_reason(reason: str) -> str:
    """The label of a :class:`~translation.effects.MemberFenced` reason."""
    return reason if reason in FENCE_REASONS else "other"


def rebalance_reason(reason: str) -> str:
    """The label of a :class:`~translation.effects.GroupEpochBumped` reason: its first
    phrase, or ``other``."""
    first = reason.split(";", 1)[0].strip()
    return first.replace(" ", "-") if first in REBALANCE_REASONS else "other"


# -- the forwarding path: plain Python objects, published at scrape time ----------------------

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                          1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of ``groupgate_request_duration_seconds``: Fetch waits up to the
client's fetch.max.wait.ms (500 ms by default), a held JoinGroup up to a rebalance timeout."""


class _Latencies:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        """Observations per bucket (not cumulative); the last is above every bound."""
        self.total = 0.0


_LATENCIES: dict[int, _Latencies] = {}
"""api key -> its request latencies."""


def observe_request(api_key: int, seconds: float) -> None:
    """A request of ``api_key`` was answered to its client ``seconds`` after it was read."""
    latencies = _LATENCIES.get(api_key)
    if latencies is None:
        latencies = _LATENCIES[api_key] = _Latencies()
    latencies.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
    latencies.total += seconds


class Traffic:
    """Bytes of Kafka frames (length prefix included) one listener's clients sent to the
    proxy and received from it; shared by the listener's connections. TLS records and frames
    cut short by a closed connection are not counted."""

    __slots__ = ("received", "sent")

    def __init__(self) -> None:
        self.received = 0
        self.sent = 0


_TRAFFIC: dict[str, Traffic] = {}
"""node label -> its listener's traffic."""


def traffic(node: str) -> Traffic:
    """The traffic counters of the listener ``node`` (``bootstrap``, ``fleet`` or a broker
    id), created on first use."""
    found = _TRAFFIC.get(node)
    if found is None:
        found = _TRAFFIC[node] = Traffic()
    return found


# -- the coordinator, read at scrape time -----------------------------------------------------

GROUP_STATES: Final = ("empty", "assigning", "reconciling", "stable")
MEMBER_PROTOCOLS: Final = ("consumer", "classic")
GROUP_PROTOCOLS: Final = ("consumer", "classic", "mixed", "none")
"""A group's ``protocol`` label: its members' protocol, ``mixed`` for both, ``none`` without
members."""


def group_protocol(member_protocols: Iterable[str]) -> str:
    """The ``protocol`` label of a group whose members speak ``member_protocols``."""
    found = set(member_protocols)
    if not found:
        return "none"
    if found == {"consumer"} or found == {"classic"}:
        return found.pop()
    return "mixed"


class CoordinationView:
    """What :func:`watch_coordination` reads at each scrape."""

    __slots__ = ("followed", "groups")

    def __init__(self, groups: Callable[[], Iterable[tuple[str, Iterable[str]]]],
                 followed: Callable[[], int]) -> None:
        self.groups = groups
        """``(state, member protocols)`` of every group the engine coordinates."""
        self.followed = followed
        """Groups whose coordinator, as this sidecar last saw it, is another sidecar."""


_COORDINATION: list[CoordinationView] = []


def watch_coordination(view: CoordinationView) -> None:
    """Publish ``view`` (the one of the running coordinator service; a later call replaces
    it) as ``groupgate_coordinated_groups``, ``groupgate_coordinated_members`` and
    ``groupgate_groups_followed``."""
    _COORDINATION[:] = [view]


def unwatch_coordination(view: CoordinationView) -> None:
    """Stop publishing ``view`` (its service stopped); the gauges read zero."""
    if view in _COORDINATION:
        _COORDINATION.remove(view)


def _inside_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


_REQUEST_COUNTS: dict[str, dict[int, int]] = {}
"""node label -> api key -> requests received."""


class RequestCounters:
    """The request counts of one listener (shared by its connections)."""

    __slots__ = ("_counts",)

    def __init__(self, node: str) -> None:
        self._counts = _REQUEST_COUNTS.setdefault(node, {})

    def inc(self, api_key: int) -> None:
        counts = self._counts
        counts[api_key] = counts.get(api_key, 0) + 1


class _RequestCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("groupgate_requests", "Requests received from clients",
                                     labels=["node", "api_key"])
        for node, counts in list(_REQUEST_COUNTS.items()):
            for api_key, count in list(counts.items()):
                family.add_metric([node, str(api_key)], count)
        yield family


class _ForwardingCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        received = CounterMetricFamily(
            "groupgate_client_bytes_received",
            "Bytes of request frames received from clients, by listener", labels=["node"])
        sent = CounterMetricFamily(
            "groupgate_client_bytes_sent",
            "Bytes of response frames sent to clients, by listener", labels=["node"])
        for node, counts in list(_TRAFFIC.items()):
            received.add_metric([node], counts.received)
            sent.add_metric([node], counts.sent)
        yield received
        yield sent
        latency = HistogramMetricFamily(
            "groupgate_request_duration_seconds",
            "Time from reading a client's request to sending its response (forwarded or "
            "answered by the proxy), by API; Produce with acks=0 has no response",
            labels=["api_key", "api"])
        index = api_index()
        bounds = [repr(float(b)) for b in LATENCY_BUCKETS] + ["+Inf"]
        for api_key, latencies in sorted(_LATENCIES.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, latencies.counts, strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            info = index.get(api_key)
            latency.add_metric([str(api_key), info.name if info else str(api_key)], buckets,
                               latencies.total)
        yield latency


class _CoordinationCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        groups = GaugeMetricFamily(
            "groupgate_coordinated_groups",
            "Groups this sidecar's engine coordinates, by KIP-848 group state and by their "
            "members' protocol (consumer, classic, mixed: both, none: no members)",
            labels=["state", "protocol"])
        members = GaugeMetricFamily(
            "groupgate_coordinated_members",
            "Members of the groups this sidecar coordinates, by protocol (consumer: "
            "ConsumerGroupHeartbeat, classic: JoinGroup/SyncGroup/Heartbeat on the engine)",
            labels=["protocol"])
        followed = GaugeMetricFamily(
            "groupgate_groups_followed",
            "Groups another sidecar coordinates, as this sidecar last saw them (its members' "
            "requests for them are relayed there)")
        by_shape = {(state, protocol): 0 for state in GROUP_STATES
                     for protocol in GROUP_PROTOCOLS}
        by_protocol = dict.fromkeys(MEMBER_PROTOCOLS, 0)
        following = 0
        # the coordinator's state belongs to its trio run (the health server scrapes from
        # inside it); a scrape from outside any run reads nothing of it
        for view in _COORDINATION if _inside_trio() else ():
            for state, protocols in view.groups():
                listed = list(protocols)
                shape = (state, group_protocol(listed))
                if shape in by_shape:
                    by_shape[shape] += 1
                for protocol in listed:
                    if protocol in by_protocol:
                        by_protocol[protocol] += 1
            following += view.followed()
        for (state, protocol), count in by_shape.items():
            groups.add_metric([state, protocol], count)
        for protocol, count in by_protocol.items():
            members.add_metric([protocol], count)
        followed.add_metric([], following)
        yield groups
        yield members
        yield followed


REGISTRY.register(_RequestCollector())
REGISTRY.register(_ForwardingCollector())
REGISTRY.register(_CoordinationCollector())
