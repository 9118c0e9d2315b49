"""Prometheus metrics of the proxy, labelled by node and API where it matters.

The per-request counter sits on the forwarding path, so it is a plain dictionary increment
(about 150 ns, against about 770 ns for a cached prometheus-client child and 2 us for
``labels().inc()``, measured in ``docs/decisions/0002-metrics.md``); a custom collector turns
the dictionary into ``groupgate_requests_total`` when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

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
    "(no-address: the holder has no fleet listener; unreachable: its fleet address did not "
    "answer); /readyz lists the recent cases", ["reason"], registry=REGISTRY)
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


REGISTRY.register(_RequestCollector())
