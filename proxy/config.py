"""Proxy configuration: one table of settings, read from flags, environment and a file.

Every setting has one name used everywhere: ``--max-frame-bytes`` on the command line,
``GROUPGATE_MAX_FRAME_BYTES`` in the environment, ``max-frame-bytes`` in the optional TOML file
given by ``--config`` / ``GROUPGATE_CONFIG``. Precedence: flag, then environment, then file,
then the default. ``docs/configuration.md`` lists the same table.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.journal.settings import SETTINGS as JOURNAL_SETTINGS
from proxy.journal.settings import (
    JournalSettings,
    parse_acks,
    parse_compression,
    parse_source,
    parse_topic,
)
from proxy.records import Compression
from proxy.state_log.ids import check_prefix


class ConfigError(ValueError):
    """A setting has a value the proxy cannot use; the message names the setting and source."""


FLEET_WAIT_MS = 7_000
"""Longest a member's request waits at a follower sidecar before it reaches the coordinating
sidecar: a lookup of the group's holder (``proxy.coordination.peers.LOOKUP_SECONDS``) and a
connect to its fleet listener (``proxy.kafka_client.links.PEER_CONNECT_SECONDS``). At the
coordinating sidecar a member's session does not run while its request is inside
(``proxy.coordination.inside``)."""
TAKEOVER_MS = 3_000
"""What a takeover may take, from the broker dropping a dead holder's member until the next
holder has loaded the group: its JoinGroup lands in an Empty group, which a Kafka broker holds
for ``group.initial.rebalance.delay.ms`` (3 s by default) before the join completes; the
proxy's own round trips and the read of the group's state take tens of milliseconds at the
sizes measured (docs/benchmarks/failover.md). A budget, not a timeout: a longer load counts
against the members' sessions (docs/operations.md, "How long a request can wait")."""
SESSION_MARGIN_MS = 1_000


def failover_ms(heartbeat_ms: int, broker_session_ms: int) -> int:
    """Longest a member may go without an answer while its group's coordinating sidecar fails
    over: its last answered request up to one heartbeat interval before the sidecar died, the
    broker drops the dead sidecar's member at most ``broker_session_ms`` after that, the next
    sidecar takes the group over (:data:`TAKEOVER_MS`), and the member's next request may wait
    :data:`FLEET_WAIT_MS` at its own sidecar to find and reach the new holder."""
    return heartbeat_ms + broker_session_ms + TAKEOVER_MS + FLEET_WAIT_MS


def shortest_fleet_session_ms(heartbeat_ms: int, broker_session_ms: int) -> int:
    """The shortest member session a fleet accepts: a failover (:func:`failover_ms`) and a
    margin. It also covers the follower wait in normal operation (a heartbeat interval and
    :data:`FLEET_WAIT_MS`)."""
    return failover_ms(heartbeat_ms, broker_session_ms) + SESSION_MARGIN_MS


def shortest_classic_fleet_session_ms(broker_session_ms: int) -> int:
    """The shortest ``session.timeout.ms`` of a classic member (its own, from its JoinGroup)
    that a failover cannot outlast, before its own heartbeat interval is added (which the
    proxy does not know): :func:`shortest_fleet_session_ms` without the heartbeat term."""
    return shortest_fleet_session_ms(0, broker_session_ms)


def check_session_against_fleet_waits(session_ms: int, heartbeat_ms: int,
                                      broker_session_ms: int) -> None:
    """With a fleet, a member's requests may go unanswered for :func:`failover_ms` when the
    coordinating sidecar dies; a session shorter than that (and a margin) would end while the
    group fails over: refused (docs/operations.md, "How long a request can wait")."""
    needed = shortest_fleet_session_ms(heartbeat_ms, broker_session_ms)
    if session_ms < needed:
        raise ConfigError(
            f"group-session-timeout-ms={session_ms} is too short for a fleet (fleet-listen is "
            f"set) with broker-session-timeout-ms={broker_session_ms}: when the coordinating "
            f"sidecar dies, a member may go unanswered for a heartbeat interval "
            f"(group-heartbeat-interval-ms, {heartbeat_ms}) + broker-session-timeout-ms "
            f"({broker_session_ms}, until the broker drops the dead sidecar's member) + "
            f"{TAKEOVER_MS} (the takeover) + {FLEET_WAIT_MS} (the wait at the member's own "
            f"sidecar), so the session must be at least that + {SESSION_MARGIN_MS} = {needed} "
            f"ms: raise group-session-timeout-ms or lower broker-session-timeout-ms")


def parse_hostport(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` allowed)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise ValueError(f"{text!r} has no port")
        return host, default_port
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range")
    return host, port


def _hostport(text: str) -> tuple[str, int]:
    return parse_hostport(text)


def _hostport_list(text: str) -> tuple[tuple[str, int], ...]:
    items = [part for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("empty list")
    return tuple(parse_hostport(item, default_port=9092) for item in items)


def _optional_hostport(text: str) -> tuple[str, int] | None:
    return None if text.strip() in ("", "off", "none", "auto") else parse_hostport(text)


FLEET_PORT = 9191
"""The fleet listener's default port."""


def _fleet_address(text: str) -> tuple[str, int] | None:
    """host:port, a host alone (port 0: fleet-listen's), or 'auto' (None)."""
    text = text.strip()
    if text in ("", "auto"):
        return None
    if text.count(":") > 1 and not text.startswith("["):
        return text, 0  # a bare IPv6 address
    return parse_hostport(text, default_port=0)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _optional_int(text: str) -> int | None:
    return None if text.strip() in ("", "auto") else int(text)


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("on or off")


def _auto_int(text: str) -> int:
    """A positive number, or 'auto' (0)."""
    if text.strip() in ("", "auto"):
        return 0
    return _positive_int(text)


def _key_values(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return value
    return parse


def _upper_choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper()
        if value not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return value
    return parse


def _mechanism(text: str) -> str:
    value = text.strip().upper()
    if value in ("", "NONE"):
        return ""
    if value not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise ValueError("PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (the proxy's own connections; "
                         "clients may use any mechanism the broker offers)")
    return value


def _file(text: str) -> str:
    """A path that must be a readable file now ('' for none)."""
    path = text.strip()
    if path and not os.access(path, os.R_OK):
        raise ValueError(f"no readable file {path}")
    return path


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError("one of DEBUG, INFO, WARNING, ERROR")
    return level


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[str], Any]
    default: str | None
    help: str

    @property
    def attr(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "GROUPGATE_" + self.attr.upper()


JOURNAL_PARSERS: dict[str, Callable[[str], Any]] = {
    "journal-topic": parse_topic, "journal-partitions": int,
    "journal-replication-factor": int, "journal-retention-ms": int,
    "journal-buffer-events": _positive_int, "journal-snapshot-interval-ms": _positive_int,
    "journal-acks": parse_acks, "journal-compression": parse_compression,
    "journal-source": parse_source,
}
"""How each journal setting (:data:`proxy.journal.settings.SETTINGS`) is read."""

SETTINGS: tuple[Setting, ...] = (
    Setting("upstream", _hostport_list, None,
            "Bootstrap servers of the real Kafka cluster, comma separated (required)."),
    Setting("listen", _hostport, "127.0.0.1:9092",
            "Address of the bootstrap listener clients connect to."),
    Setting("advertised-host", str, "",
            "Host name handed to clients for every proxy listener (default: the listen host)."),
    Setting("broker-port-base", _optional_int, "auto",
            "Broker N gets a listener on port broker-port-base + N "
            "(default: the listen port + 1)."),
    Setting("max-frame-bytes", _positive_int, str(100 * 1024 * 1024),
            "Largest request or response frame accepted; bigger ones close the connection."),
    Setting("max-in-flight", _positive_int, "128",
            "Requests per client connection awaiting a response before the proxy stops reading."),
    Setting("max-connections", _positive_int, "1000",
            "Client connections open at once; a connection beyond it is closed as soon as it "
            "is accepted (one log line every 10 s while it happens)."),
    Setting("max-held-response-bytes", _positive_int, str(16 * 1024 * 1024),
            "Per client connection: bytes of broker responses held while an earlier request "
            "on the connection is still being answered by the proxy (at most one response "
            "more); beyond it the proxy stops reading that broker connection until the answer "
            "is ready."),
    Setting("held-response-bytes", _positive_int, str(128 * 1024 * 1024),
            "All client connections together: the same bytes, one response more per "
            "connection at most."),
    Setting("max-examined-request-bytes", _positive_int, str(1024 * 1024),
            "Largest group request the proxy decodes (JoinGroup, OffsetCommit, OffsetFetch, "
            "DescribeGroups, ...; decoding takes about 15 times the request's size and holds "
            "the event loop about 0.4 s per MiB). A bigger one is forwarded untouched when its "
            "group is not coordinated by the proxy, else its connection is closed with a log "
            "line. Requests the proxy only forwards are bounded by max-frame-bytes."),
    Setting("examined-bytes-in-flight", _positive_int, str(32 * 1024 * 1024),
            "All client connections together: bytes of requests being decoded at once; a "
            "request that does not fit waits for others to finish."),
    Setting("examined-read-timeout", _positive_float, "30",
            "Seconds a group request large enough to take part of examined-bytes-in-flight "
            "may take to arrive; a slower one closes its connection with a log line."),
    Setting("connect-timeout", _positive_float, "10",
            "Seconds to wait for an upstream broker connection."),
    Setting("shutdown-grace", _positive_float, "10",
            "Seconds in-flight requests get to finish after SIGTERM."),
    Setting("splice", _bool, "on",
            "Relay large frames that pass unchanged with splice(2) on Linux (the bytes never "
            "enter Python); off copies them through one buffer per connection. Ignored where "
            "the platform has no splice."),
    Setting("fetch-node-endpoints", _bool, "off",
            "Advertise Fetch v16+ (KIP-951 node endpoints, rewritten to proxy addresses). Off "
            "keeps Fetch at v15 so large fetch responses stream through without being held."),
    Setting("metrics-listen", _optional_hostport, "off",
            "Address of the HTTP endpoint for /metrics, /livez and /readyz ('off' disables)."),
    Setting("log-level", _log_level, "INFO", "DEBUG, INFO, WARNING or ERROR."),
    Setting("coordinate-groups", _bool, "on",
            "Serve the KIP-848 consumer group protocol (ConsumerGroupHeartbeat, "
            "ConsumerGroupDescribe) from the proxy's own group coordinator. Off forwards every "
            "group request to the broker untouched, with the broker's own API versions."),
    Setting("classic-translation", _bool, "on",
            "Serve classic consumers (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) from the "
            "proxy's group coordinator as classic members of KIP-848 groups, so they share "
            "groups with new-protocol members. Joins the proxy cannot serve faithfully (Kafka "
            "Connect, custom assignors, groups with members connected straight to the broker) "
            "still go to the broker. Needs coordinate-groups."),
    Setting("classic-quiet-advance", _bool, "on",
            "A classic member whose partitions a group change leaves alone is moved to the new "
            "group epoch without being asked to rejoin (Kafka asks every classic member to "
            "rejoin, and eager clients then stop all their partitions). off: Kafka's behaviour."),
    Setting("classic-sync-hold-ms", _non_negative_int, "3000",
            "How long the SyncGroup of a classic member waiting for partitions other members "
            "still own may be held, so it gets them the moment they are released (bounded by "
            "its rebalance timeout and half its session timeout). 0: answer at once with what "
            "is free (Kafka's behaviour)."),
    Setting("classic-departure-wait-ms", _non_negative_int, "10000",
            "When a member leaves (LeaveGroup or a leave heartbeat; a fenced member does not "
            "count) a group that still has eager classic members "
            "(assignors other than cooperative-sticky: they revoke everything at each "
            "rebalance that touches them), hold the group's next assignment until as many "
            "members have arrived as left, at most this long from the first departure: a "
            "restarted application's departure and arrival become one rebalance instead of "
            "two. The departed members' partitions stay unassigned meanwhile (until the "
            "replacement arrives, or the whole wait). 0: assign at once (Kafka's behaviour)."),
    Setting("migration-policy", _choice("bidirectional", "upgrade", "downgrade", "disabled"),
            "upgrade",
            "Which moves of a group between the broker's classic coordinator and the proxy's "
            "engine are allowed (Kafka's group.consumer.migration.policy values: "
            "bidirectional, upgrade, downgrade, disabled). With upgrade or bidirectional, a "
            "classic group of the broker whose members are all behind sidecars moves to the "
            "engine online, nobody called back (docs/operations.md, 'Rolling sidecars onto a "
            "live group'); with downgrade or disabled it stays the broker's. With downgrade or "
            "disabled, a KIP-848 member joining a group whose members all use the classic "
            "protocol (straight at the broker, or in the engine) is answered "
            "GROUP_ID_NOT_FOUND, as Kafka answers it (otherwise it takes part, as a bridged "
            "member while members are straight at the broker); the KIP-848 members a "
            "hand-back carried over keep taking part. With downgrade or bidirectional, a group "
            "the engine coordinates is handed back to the broker's classic coordinator by "
            "'groupgate release', or on its own when its last KIP-848 member leaves while "
            "classic members remain (docs/operations.md, 'Handing a group back'). The default "
            "is upgrade, not Kafka's bidirectional: under upgrade a group handed back is not "
            "converted again only for an hour (in memory; the state log's record of the "
            "hand-back is read under bidirectional), so roll downgrade before removing "
            "sidecars."),
    Setting("pod-local-liveness", _bool, "on",
            "Fence a member at once (reason pod-local) when every connection of its client "
            "to this sidecar closes together and none reopens within liveness-grace-ms: its "
            "process is gone (docs/decisions/0020-pod-local-liveness.md). Off: a crashed "
            "member keeps its partitions until its session times out."),
    Setting("liveness-window-ms", _positive_int, "200",
            "Pod-local liveness: a client's connections must all close within this many "
            "milliseconds (the kernel closes a dead process's sockets at once)."),
    Setting("liveness-grace-ms", _positive_int, "400",
            "Pod-local liveness: how long a client whose connections all closed has to open "
            "one again (or its member to send a request) before its members are declared "
            "gone; keep it well under the heartbeat interval."),
    Setting("broker-session-timeout-ms", _positive_int, "6000",
            "Session (and rebalance) timeout of the proxy's own member in the broker's classic "
            "group of each group it coordinates. A proxy that dies is dropped from that group "
            "this long after its last heartbeat, and only then can a proxy started again take "
            "the group over. Kafka's group.min.session.timeout.ms (6000 by default) is the "
            "lower bound; a broker that refuses the value makes the proxy double it. With "
            "fleet-listen set, group-session-timeout-ms must cover it (see there)."),
    Setting("group-session-timeout-ms", _positive_int, "45000",
            "Session timeout of new-protocol members (Kafka's group.consumer.session.timeout.ms). "
            "With fleet-listen set, at least group-heartbeat-interval-ms + "
            "broker-session-timeout-ms + 11000: when the coordinating sidecar dies, the broker "
            "drops its member after broker-session-timeout-ms, the takeover may take 3 s and a "
            "member's request may wait up to 7 s at its own sidecar before it reaches the new "
            "one, plus 1 s of margin (docs/operations.md, \"How long a request can wait\")."),
    Setting("group-heartbeat-interval-ms", _positive_int, "5000",
            "Heartbeat interval handed to new-protocol members "
            "(Kafka's group.consumer.heartbeat.interval.ms)."),
    Setting("group-max-size", _positive_int, "1000",
            "Members of one coordinated group (Kafka's group.consumer.max.size); a member "
            "joining beyond it gets GROUP_MAX_SIZE_REACHED."),
    Setting("max-groups", _positive_int, "1000",
            "Groups the proxy coordinates at once (each holds one member in the broker's group "
            "of the same id); a join that would create one more gets COORDINATOR_NOT_AVAILABLE "
            "and its group stays the broker's."),
    Setting("max-members", _positive_int, "10000",
            "Members of all coordinated groups together; a new member beyond it gets "
            "COORDINATOR_NOT_AVAILABLE."),
    Setting("max-subscription-topics", _positive_int, "10000",
            "Topic names one member may subscribe to; a longer subscription gets "
            "INVALID_REQUEST (a classic join that would start a group goes to the broker "
            "untouched)."),
    Setting("max-regex-bytes", _positive_int, "4096",
            "Longest subscription regular expression (SubscribedTopicRegex) accepted; a longer "
            "one gets INVALID_REGULAR_EXPRESSION."),
    Setting("group-empty-expiry-ms", _positive_int, "600000",
            "How long a coordinated group without members is kept before it is deleted and the "
            "proxy leaves the broker's group of the same id."),
    Setting("fleet-listen", _optional_hostport, f"0.0.0.0:{FLEET_PORT}",
            "Address of the fleet listener: where the other sidecars of a fleet relay the group "
            "requests of groups this sidecar coordinates (docs/operations.md, 'Several "
            "sidecars, one group'). The default listens on every address of the pod; left at "
            "the default, it takes another free port (with a warning) when that port is "
            "taken, and it is switched off (with a warning) where the fleet's security "
            "settings are incomplete. 'off': this sidecar follows groups other sidecars "
            "coordinate but cannot be followed, so it is only right for a proxy that is alone "
            "in front of its groups."),
    Setting("fleet-address", _fleet_address, "auto",
            "The address the other sidecars reach the fleet listener at: host:port, or a host "
            "alone (the port is fleet-listen's), e.g. the pod IP from the downward API. "
            "'auto': fleet-listen's host, or for a wildcard one (0.0.0.0, ::) this host's "
            "address on its route to the first upstream broker (to the default route when the "
            "brokers are on the loopback)."),
    Setting("takeover-wait-ms", _optional_int, "auto",
            "How long a sidecar that takes a group over from another coordinator whose state "
            "it cannot load answers joins with COORDINATOR_LOAD_IN_PROGRESS before it assigns "
            "partitions: the members the old coordinator assigned keep their partitions until "
            "they hear from the new one. 'auto': group-session-timeout-ms (the longest a "
            "member may go unheard before Kafka gives its partitions away). With state-log on "
            "it applies only when the log has no state for a group someone held before (or "
            "some of its records could not be loaded): the last coordinator may have written "
            "another log (other state-log settings) or none."),
    Setting("state-log", _bool, "on",
            "Write each coordinated group's state (epochs, members, assignments) to a "
            "compacted topic, so that a sidecar taking a group over loads it and members keep "
            "their partitions through a coordinator failover or restart (docs/operations.md, "
            "'Durable group state'). Needs the topic, transactional ids and their ACLs."),
    Setting("state-log-topic", str, "_groupgate-group-state",
            "The compacted topic of the group state (created when missing)."),
    Setting("state-log-partitions", _positive_int, "16",
            "Partitions of the state topic when it is created; never change it afterwards "
            "(groups are hashed over the partition count)."),
    Setting("state-log-replication-factor", _auto_int, "auto",
            "Replication factor of the state topic when it is created; 'auto': the cluster's "
            "broker count, at most 3 (min.insync.replicas is one less, between 1 and 2)."),
    Setting("state-log-topic-config", _key_values, "",
            "Topic configs of the state topic that replace the defaults when it is created, "
            "comma separated key=value (e.g. segment.ms=600000)."),
    Setting("state-log-transactional-id-prefix", str, "groupgate-state",
            "Prefix of the transactional ids that fence the writers of the group state, one "
            "per group (<prefix>-<group id>); the proxy's identity needs WRITE on them."),
    Setting("state-log-transaction-timeout-ms", _positive_int, "15000",
            "Transaction timeout of the state writers: how long a writer that died mid-write "
            "can keep other groups of its partition from being loaded."),
    Setting("state-log-write-timeout-ms", _positive_int, "10000",
            "Longest one write of group state may take before the group is given up (its "
            "answers fail; it is taken over again from the log)."),
    Setting("state-log-load-timeout-ms", _positive_int, "60000",
            "Longest reading a group's state may take when it is taken over."),
    *(Setting(name, JOURNAL_PARSERS[name], default, help_text)
      for name, default, help_text in JOURNAL_SETTINGS),
    Setting("group-metadata-refresh-ms", _positive_int, "5000",
            "How often the proxy reads the metadata of the topics its groups subscribe to "
            "(partition counts, topics created or deleted, regex matches)."),
    # -- security (docs/security.md) --------------------------------------------------------
    Setting("security-protocol",
            _upper_choice("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), "PLAINTEXT",
            "How the cluster's listener is reached, as Kafka's security.protocol. SSL and "
            "SASL_SSL: every connection to a broker uses TLS (tls-*). SASL_PLAINTEXT and "
            "SASL_SSL: the proxy's own connections authenticate (sasl-*), and clients must "
            "authenticate through the proxy before it answers anything but ApiVersions and the "
            "SASL APIs."),
    Setting("tls-ca-file", _file, "",
            "PEM bundle of the CAs that sign the brokers' certificates (default: the system's "
            "trust store). Reloaded when it changes."),
    Setting("tls-cert-file", _file, "",
            "PEM certificate (chain) the proxy presents to brokers that ask for one (mTLS); "
            "needs tls-key-file. Reloaded when it changes."),
    Setting("tls-key-file", _file, "", "PEM private key of tls-cert-file (unencrypted)."),
    Setting("tls-verify-hostname", _bool, "on",
            "Check that a broker's certificate names the host the proxy connects to (Kafka's "
            "ssl.endpoint.identification.algorithm=https); off checks the chain only."),
    Setting("tls-cert-for-clients", _bool, "off",
            "With security-protocol SSL: present tls-cert-file also on the clients' "
            "connections. The broker then takes every client of the proxy for the principal "
            "of that certificate; off: clients' connections carry no certificate (a broker "
            "that requires one refuses them). With SASL_SSL the certificate only admits the "
            "connection and is always presented."),
    Setting("sasl-mechanism", _mechanism, "",
            "SASL mechanism of the proxy's own connections: PLAIN, SCRAM-SHA-256 or "
            "SCRAM-SHA-512 (required with SASL_*)."),
    Setting("sasl-username", str, "", "User name of the proxy's own connections."),
    Setting("sasl-password", str, "",
            "Password of the proxy's own connections (prefer GROUPGATE_SASL_PASSWORD or "
            "sasl-password-file to a flag)."),
    Setting("sasl-username-file", _file, "",
            "File holding the user name (e.g. a mounted Kubernetes Secret); read again for "
            "every new connection, so a rotated Secret applies without a restart."),
    Setting("sasl-password-file", _file, "",
            "File holding the password; read again for every new connection."),
    Setting("listener-tls-cert-file", _file, "",
            "PEM certificate of the proxy's own listeners (bootstrap and brokers): clients "
            "must then connect with TLS, which the proxy terminates. Unset: plaintext (the "
            "pod's loopback), and a client that starts TLS is closed with a log line."),
    Setting("listener-tls-key-file", _file, "", "PEM private key of listener-tls-cert-file."),
    Setting("listener-tls-ca-file", _file, "",
            "With listener TLS: clients must present a certificate signed by one of these CAs "
            "(mTLS to the proxy; the subject is recorded for the connection)."),
    Setting("fleet-auth", _choice("auto", "none", "mtls", "sasl"), "auto",
            "How the fleet listener knows another sidecar: 'mtls' (a certificate of "
            "fleet-tls-ca-file, both ways), 'sasl' (it authenticates with the proxies' own "
            "SASL identity, checked by the broker, and its user must be one of fleet-users), "
            "'none' (anyone who reaches the port; refused on a SASL cluster). 'auto': mtls "
            "when fleet-tls-ca-file is set, else sasl on a SASL cluster, else none."),
    Setting("authorize-clients", _choice("auto", "on", "off"), "auto",
            "Authorize the group requests the proxy answers or relays itself as Kafka would, "
            "as each client's own principal, asking the broker on the client's connection. "
            "'auto': when clients act as principals other than the proxy's (SASL_*, or SSL "
            "with tls-cert-file and tls-cert-for-clients off) and the brokers have an "
            "authorizer; 'on': always; 'off': never (every authenticated client may use every "
            "group the proxy coordinates)."),
    Setting("authorization-ttl-ms", _positive_int, "5000",
            "How long the broker's answer about what a client may do is trusted on its "
            "connection: a right removed while a member is in a group is refused at the "
            "member's first request after this."),
    Setting("fleet-users", str, "",
            "With fleet-auth sasl: the SASL user names other sidecars authenticate as, comma "
            "separated (default: this sidecar's own sasl-username)."),
    Setting("fleet-tls-cert-file", _file, "",
            "PEM certificate of the fleet listener, also presented by this sidecar to the "
            "others (needs fleet-tls-key-file): the fleet listener then speaks TLS only."),
    Setting("fleet-tls-key-file", _file, "", "PEM private key of fleet-tls-cert-file."),
    Setting("fleet-tls-ca-file", _file, "",
            "PEM bundle of the fleet's CA: other sidecars' fleet listeners must present a "
            "certificate it signed, and with fleet-auth mtls so must every sidecar connecting "
            "to this one."),
    Setting("fleet-tls-server-name", str, "",
            "The name other sidecars' fleet certificates must carry (checked like a host "
            "name); empty: the fleet CA's signature alone (pod IPs change)."),
)


@dataclass(frozen=True)
class ProxyConfig:
    upstream: tuple[tuple[str, int], ...]
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    advertised_host: str = ""
    broker_port_base: int | None = None
    max_frame_bytes: int = 100 * 1024 * 1024
    max_in_flight: int = 128
    connect_timeout: float = 10.0
    shutdown_grace: float = 10.0
    max_connections: int = 1000
    max_held_response_bytes: int = 16 * 1024 * 1024
    held_response_bytes: int = 128 * 1024 * 1024
    max_examined_request_bytes: int = 1024 * 1024
    examined_bytes_in_flight: int = 32 * 1024 * 1024
    examined_read_timeout: float = 30.0
    group_max_size: int = 1000
    max_groups: int = 1000
    max_members: int = 10_000
    max_subscription_topics: int = 10_000
    max_regex_bytes: int = 4096
    splice: bool = True
    fetch_node_endpoints: bool = False
    metrics_listen: tuple[str, int] | None = None
    log_level: str = "INFO"
    coordinate_groups: bool = True
    classic_translation: bool = True
    classic_quiet_advance: bool = True
    classic_sync_hold_ms: int = 3_000
    classic_departure_wait_ms: int = 10_000
    migration_policy: str = "upgrade"
    pod_local_liveness: bool = True
    liveness_window_ms: int = 200
    liveness_grace_ms: int = 400
    broker_session_timeout_ms: int = 6_000
    group_session_timeout_ms: int = 45_000
    group_heartbeat_interval_ms: int = 5_000
    group_empty_expiry_ms: int = 600_000
    group_metadata_refresh_ms: int = 5_000
    fleet_listen: tuple[str, int] | None = None
    fleet_address: tuple[str, int] | None = None
    fleet_listen_defaulted: bool = False
    """fleet-listen was left at its default (:func:`resolve_fleet` may pick another port)."""
    fleet_note: str = ""
    """Why the default fleet listener was switched off ('' if it was not)."""
    takeover_wait_ms: int | None = None
    security_protocol: str = "PLAINTEXT"
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_verify_hostname: bool = True
    tls_cert_for_clients: bool = False
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    sasl_username_file: str = ""
    sasl_password_file: str = ""
    listener_tls_cert_file: str = ""
    listener_tls_key_file: str = ""
    listener_tls_ca_file: str = ""
    fleet_auth: str = "auto"
    authorize_clients: str = "auto"
    authorization_ttl_ms: int = 5_000
    fleet_users: str = ""
    fleet_tls_cert_file: str = ""
    fleet_tls_key_file: str = ""
    fleet_tls_ca_file: str = ""
    fleet_tls_server_name: str = ""
    state_log: bool = True
    state_log_topic: str = "_groupgate-group-state"
    state_log_partitions: int = 16
    state_log_replication_factor: int = 0
    state_log_topic_config: tuple[tuple[str, str], ...] = ()
    state_log_transactional_id_prefix: str = "groupgate-state"
    state_log_transaction_timeout_ms: int = 15_000
    state_log_write_timeout_ms: int = 10_000
    state_log_load_timeout_ms: int = 60_000
    journal_topic: str | None = None
    journal_partitions: int = -1
    journal_replication_factor: int = -1
    journal_retention_ms: int = 7 * 24 * 3600 * 1000
    journal_buffer_events: int = 100_000
    journal_snapshot_interval_ms: int = 300_000
    journal_acks: int = -1
    journal_compression: Compression = Compression.GZIP
    journal_source: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def client_host(self) -> str:
        """The host clients are told to connect to."""
        return self.advertised_host or self.listen[0]

    @property
    def advertised_fleet_address(self) -> tuple[str, int] | None:
        """Where other sidecars reach this one's fleet listener (None: no fleet listener)."""
        if self.fleet_listen is None:
            return None
        host, port = self.fleet_listen
        if self.fleet_address is not None:
            return self.fleet_address[0], self.fleet_address[1] or port
        if host in WILDCARDS:
            return host_address(self.upstream[0][0] if self.upstream else ""), port
        return host, port

    @property
    def journal(self) -> JournalSettings:
        """The group-event journal's settings (off while ``journal-topic`` is unset)."""
        return JournalSettings(
            topic=self.journal_topic, partitions=self.journal_partitions,
            replication_factor=self.journal_replication_factor,
            retention_ms=self.journal_retention_ms, buffer_events=self.journal_buffer_events,
            snapshot_interval_ms=self.journal_snapshot_interval_ms, acks=self.journal_acks,
            compression=self.journal_compression,
            source=self.journal_source or f"{self.client_host}:{self.listen[1]}")

    @property
    def takeover_wait_seconds(self) -> float:
        """The wait before a group taken over with no state to load is assigned (0: none)."""
        wait = self.takeover_wait_ms
        if wait is None:
            wait = self.group_session_timeout_ms
        return wait / 1000

    def broker_port(self, node_id: int, bound_listen_port: int | None = None) -> int:
        """The deterministic listener port of broker ``node_id``.

        ``bound_listen_port`` is the bootstrap port actually bound, used when the configured one
        is 0 (ephemeral, tests): then brokers get ephemeral ports too (returns 0).
        """
        if self.broker_port_base is not None:
            return self.broker_port_base + node_id
        listen_port = self.listen[1]
        if listen_port == 0:
            return 0
        return listen_port + 1 + node_id


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with settings "
                        "(env GROUPGATE_CONFIG); keys are the flag names without dashes prefix.")
    for setting in SETTINGS:
        parser.add_argument(f"--{setting.name}", dest=setting.attr, default=None,
                            help=f"{setting.help} [env {setting.env}; default {setting.default}]")


def load(args: argparse.Namespace | None = None,
         environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """Build the configuration from parsed flags, the environment and the config file."""
    environ = os.environ if environ is None else environ
    flags = vars(args) if args is not None else {}
    config_path = flags.get("config") or environ.get("GROUPGATE_CONFIG")
    file_values: dict[str, Any] = {}
    if config_path:
        try:
            file_values = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {config_path}: {exc}") from exc
        unknown = set(file_values) - {s.name for s in SETTINGS}
        if unknown:
            raise ConfigError(f"config file {config_path}: unknown settings {sorted(unknown)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        raw: str | None
        if flags.get(setting.attr) is not None:
            raw, source = str(flags[setting.attr]), f"--{setting.name}"
        elif setting.env in environ:
            raw, source = environ[setting.env], setting.env
        elif setting.name in file_values:
            value = file_values[setting.name]
            raw = ",".join(value) if isinstance(value, list) else str(value)
            source = f"{config_path}:{setting.name}"
        else:
            raw, source = setting.default, "default"
        if raw is None:
            raise ConfigError(f"{setting.name} is required (--{setting.name} or {setting.env})")
        try:
            values[setting.attr] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{setting.name}={raw!r} from {source}: {exc}") from exc
        sources[setting.attr] = source
    fleet = values.get("fleet_listen")
    address = values.get("fleet_address")
    if fleet is not None and fleet[1] == 0 and (address is None or address[1] == 0):
        raise ConfigError("fleet-listen with port 0 needs fleet-address with a port: other "
                          "sidecars cannot know an ephemeral port")
    values["fleet_listen_defaulted"] = sources["fleet_listen"] == "default"
    if values.get("takeover_wait_ms") is not None and values["takeover_wait_ms"] < 0:
        raise ConfigError("takeover-wait-ms must not be negative")
    if (values.get("state_log_transaction_timeout_ms", 15_000)
            <= values.get("state_log_write_timeout_ms", 10_000)):
        raise ConfigError("state-log-transaction-timeout-ms must exceed "
                          "state-log-write-timeout-ms (a transaction is aborted by its "
                          "coordinator only after it)")
    try:
        ProxyConfig(**values).journal  # noqa: B018 (checks the journal settings together)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        check_prefix(values.get("state_log_transactional_id_prefix", "groupgate-state"))
    except ValueError as exc:
        raise ConfigError(f"state-log-transactional-id-prefix: {exc}") from None
    check_security(values, fleet=False)
    if values.get("fleet_listen") is not None:
        try:
            check_session_against_fleet_waits(
                values.get("group_session_timeout_ms", 45_000),
                values.get("group_heartbeat_interval_ms", 5_000),
                values.get("broker_session_timeout_ms", 6_000))
            check_fleet_security(values)
        except ConfigError as exc:
            if not values["fleet_listen_defaulted"]:
                raise
            # the default listener must not turn a working single-sidecar setup into a
            # refused one: it is left off, and the startup log says why
            values["fleet_listen"] = None
            values["fleet_note"] = (f"no fleet listener: {exc} (for several sidecars, set "
                                    "fleet-listen and settings that satisfy this)")
    return ProxyConfig(**values, sources=sources)


def check_security(values: Mapping[str, Any], *, fleet: bool = True) -> None:
    """Refuse security settings that contradict each other or leave a way around what the
    cluster enforces (docs/security.md); ``fleet``: the fleet listener's too
    (:func:`check_fleet_security`)."""
    protocol = values.get("security_protocol", "PLAINTEXT")
    sasl = protocol.startswith("SASL_")
    tls = protocol in ("SSL", "SASL_SSL")
    for prefix in ("tls", "listener-tls", "fleet-tls"):
        cert, key = (values.get(f"{prefix.replace('-', '_')}_{part}_file", "")
                     for part in ("cert", "key"))
        if bool(cert) != bool(key):
            raise ConfigError(f"{prefix}-cert-file and {prefix}-key-file go together")
    if not tls and any(values.get(k) for k in ("tls_ca_file", "tls_cert_file")):
        raise ConfigError(f"tls-ca-file/tls-cert-file are set but security-protocol is "
                          f"{protocol} (SSL or SASL_SSL uses them)")
    if values.get("listener_tls_ca_file") and not values.get("listener_tls_cert_file"):
        raise ConfigError("listener-tls-ca-file needs listener-tls-cert-file")
    mechanism = values.get("sasl_mechanism", "")
    if sasl:
        if not mechanism:
            raise ConfigError(f"security-protocol {protocol} needs sasl-mechanism (PLAIN, "
                              "SCRAM-SHA-256 or SCRAM-SHA-512) for the proxy's own connections")
        for what in ("username", "password"):
            if not values.get(f"sasl_{what}") and not values.get(f"sasl_{what}_file"):
                raise ConfigError(f"security-protocol {protocol} needs sasl-{what} or "
                                  f"sasl-{what}-file")
    elif mechanism or values.get("sasl_username") or values.get("sasl_username_file"):
        raise ConfigError(f"sasl-* settings are set but security-protocol is {protocol} "
                          "(SASL_PLAINTEXT or SASL_SSL uses them)")
    if fleet and values.get("fleet_listen") is not None:
        check_fleet_security(values)


def check_fleet_security(values: Mapping[str, Any]) -> None:
    """Refuse a fleet listener whose authentication the other settings cannot back."""
    protocol = values.get("security_protocol", "PLAINTEXT")
    sasl = protocol.startswith("SASL_")
    mechanism = values.get("sasl_mechanism", "")
    auth = values.get("fleet_auth", "auto")
    if auth == "auto":
        auth = "mtls" if values.get("fleet_tls_ca_file") else ("sasl" if sasl else "none")
    fleet_tls = bool(values.get("fleet_tls_cert_file"))
    if auth == "none" and sasl:
        raise ConfigError("fleet-auth none on a SASL cluster: anyone reaching the fleet "
                          "listener could act in groups without authenticating; use sasl or "
                          "mtls")
    if auth == "mtls" and not (fleet_tls and values.get("fleet_tls_ca_file")):
        raise ConfigError("fleet-auth mtls needs fleet-tls-cert-file, fleet-tls-key-file "
                          "and fleet-tls-ca-file")
    if auth == "sasl":
        if not sasl:
            raise ConfigError("fleet-auth sasl needs a SASL cluster (security-protocol "
                              "SASL_PLAINTEXT or SASL_SSL): the broker checks the credentials")
        if mechanism == "PLAIN" and not fleet_tls:
            raise ConfigError("fleet-auth sasl with sasl-mechanism PLAIN sends the password "
                              "across the pod network: set fleet-tls-cert-file and "
                              "fleet-tls-key-file (and fleet-tls-ca-file on every sidecar)")


def describe(config: ProxyConfig, items: Sequence[Setting] = SETTINGS) -> str:
    """One line per setting with its value and where it came from (for the startup log)."""
    return ", ".join(
        f"{s.name}={_shown(s, getattr(config, s.attr))} ({config.sources.get(s.attr, '?')})"
        for s in items
    )


def _shown(setting: Setting, value: Any) -> str:
    """A value for the log; secrets are only said to be set."""
    if setting.name in SECRET_SETTINGS:
        return "'(set)'" if value else "''"
    return repr(value)


SECRET_SETTINGS = frozenset({"sasl-password"})

WILDCARDS = ("0.0.0.0", "::", "")
NO_ROUTE_TARGET = "192.0.2.1"
"""An address of TEST-NET-1 (RFC 5737): the kernel's route to it is the default route."""
_host_addresses: dict[str, str] = {}


def host_address(toward: str) -> str:
    """This host's (pod's) own address as others reach it: the source address of its route
    toward ``toward`` (the first upstream broker), or of the default route when that one is on
    the loopback, else 127.0.0.1 (a host alone). Nothing is sent (a UDP socket's connect only
    picks the route); remembered per ``toward``."""
    found = _host_addresses.get(toward)
    if found is not None:
        return found
    address = "127.0.0.1"
    for target in (toward, NO_ROUTE_TARGET):
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(sockaddr)
                source = str(probe.getsockname()[0])
        except (OSError, IndexError, UnicodeError):
            continue
        if not ipaddress.ip_address(source.split("%")[0]).is_loopback:
            address = source
            break
    _host_addresses[toward] = address
    return address


def resolve_fleet(config: ProxyConfig) -> ProxyConfig:
    """The configuration with a fleet listener that can be bound: a defaulted fleet-listen
    whose port is taken (another proxy on this host) gets a free port, advertised as such.
    Returns the configuration unchanged otherwise; a port taken despite an explicit
    fleet-listen fails later, at the bind, as before."""
    if config.fleet_listen is None or not config.fleet_listen_defaulted:
        return config
    host, port = config.fleet_listen
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            return config
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return config
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        free = int(probe.getsockname()[1])
    advertised = config.advertised_fleet_address
    assert advertised is not None
    note = (f"fleet-listen: port {port} is taken on this host; the fleet listener uses port "
            f"{free} (a NetworkPolicy admitting only {port} keeps other sidecars out; set "
            "fleet-listen to choose)")
    return dataclasses.replace(config, fleet_listen=(host, free),
                               fleet_address=(advertised[0], free), fleet_note=note)
