"""Pod-local liveness: tell from a client's connections that its process is gone.

The signal (docs/decisions/0020-pod-local-liveness.md): connections are grouped by the
client's identity (loopback peer host, client id, KIP-511 software name and version); a member
is tied to the connection that carried its last group request. When a client's last open
connection closes by the client, and at least two of its connections (the member's group
connection among them) closed within ``window_ms`` with no close the proxy made among them, its
members are *suspected*; unless a connection of the same client opens or a request of the
member arrives within ``grace_ms``, they are *declared* gone and handed to the caller (who asks
the group's holder to fence them, reason ``pod-local``).

:class:`LivenessTracker` is sans-I/O: every call takes ``now_ms`` and it never reads a clock;
the proxy drives it from its connections and asks :meth:`LivenessTracker.due` for
declarations at :meth:`LivenessTracker.next_deadline`. Its state is bounded: identities with
no open connection and nothing suspected are forgotten, members per connection and suspects
are capped.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

MAX_MEMBERS_PER_CONNECTION = 64
"""Members a connection can be tied to (a client controls how many it names)."""
MAX_SUSPECTS = 10_000


class Outcome(Enum):
    SUSPECTED = "suspected"
    DECLARED = "declared"
    RETURNED = "returned"
    """Suspected, then the client came back within the grace."""


@dataclass(frozen=True, slots=True)
class Identity:
    host: str
    client_id: str
    software: str
    """``name/version`` from ApiVersions (empty when the client sent none)."""


@dataclass(frozen=True, slots=True)
class SeenMember:
    """A member as its last group request on a connection named it."""

    group_id: str
    member_id: str
    member_epoch: int
    """Its member epoch (a classic member: the generation id of its request)."""
    classic: bool = False


@dataclass(frozen=True, slots=True)
class Declaration:
    """A member whose process is gone: fence it at ``member_epoch`` (if it is still there)."""

    member: SeenMember
    identity: Identity
    observed_at_ms: int
    """When its client's last connection closed (the tracker's clock)."""


@dataclass(slots=True)
class _Conn:
    identity: Identity | None = None
    members: dict[tuple[str, str], SeenMember] = field(default_factory=dict)


@dataclass(slots=True)
class _Client:
    open: set[int] = field(default_factory=set)
    closes: deque[tuple[int, int, bool, tuple[SeenMember, ...]]] = field(
        default_factory=deque)
    """Recent closes: (time, connection id, by the client, members tied to it)."""


@dataclass(slots=True)
class _Suspect:
    member: SeenMember
    identity: Identity
    observed_at_ms: int
    deadline_ms: int


def is_loopback(host: str) -> bool:
    """Whether a host as Kafka reports it (``/127.0.0.1``) is the pod's loopback."""
    try:
        return ipaddress.ip_address(host.lstrip("/")).is_loopback
    except ValueError:
        return False


class LivenessTracker:
    """The connections of the clients next to this sidecar and what they say of liveness."""

    def __init__(self, *, window_ms: int = 200, grace_ms: int = 400) -> None:
        self.window_ms = window_ms
        self.grace_ms = grace_ms
        self.silenced = False
        """Set while the sidecar is stepping down (draining): nothing is suspected."""
        self._conns: dict[int, _Conn] = {}
        self._clients: dict[Identity, _Client] = {}
        self._suspects: dict[tuple[str, str], _Suspect] = {}
        self._ties: dict[tuple[str, str], int] = {}
        """Which connection each member is tied to."""
        self.counts: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self.last_verdict = ""
        """Why the last :meth:`closed` suspected what it did (or nothing), for the log."""

    # -- what the connections report ---------------------------------------------------------

    def opened(self, conn_id: int) -> None:
        self._conns[conn_id] = _Conn()

    def identified(self, conn_id: int, identity: Identity, now_ms: int) -> None:
        """The connection's first request named its client (``now_ms``): a suspect of the
        same client is back."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.identity is not None or not is_loopback(identity.host):
            return
        conn.identity = identity
        self._clients.setdefault(identity, _Client()).open.add(conn_id)
        for key, suspect in list(self._suspects.items()):
            if suspect.identity == identity:
                self._returned(key)

    def member_seen(self, conn_id: int, member: SeenMember, *, static: bool = False) -> bool:
        """A group request of ``member`` came on the connection: tie the member to it (a static
        member is never declared gone: untied); a suspect of that member is back. Returns
        whether the member is newly tied to this connection."""
        key = (member.group_id, member.member_id)
        if key in self._suspects:
            self._returned(key)
        conn = self._conns.get(conn_id)
        if conn is None or conn.identity is None:
            return False
        tied = self._ties.get(key)
        if tied is not None and tied != conn_id:
            self._untie(key)
        if static or not member.member_id:
            self._untie(key)
        elif key in conn.members or len(conn.members) < MAX_MEMBERS_PER_CONNECTION:
            conn.members[key] = member
            self._ties[key] = conn_id
            return tied != conn_id
        return False

    def member_left(self, group_id: str, member_id: str) -> None:
        """The member left the group (or was fenced): nothing more to tell about it."""
        key = (group_id, member_id)
        self._untie(key)
        self._suspects.pop(key, None)

    def closed(self, conn_id: int, now_ms: int, *, by_client: bool) -> list[SeenMember]:
        """The connection closed (``by_client``: end of stream or reset from the client; False:
        the proxy closed it). Returns the members suspected now."""
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            self.last_verdict = "not tracked"
            return []
        for key in conn.members:
            self._ties.pop(key, None)
        if conn.identity is None:
            self.last_verdict = "its client was never named (no ApiVersions, or not loopback)"
            return []
        identity = conn.identity
        client = self._clients.get(identity)
        if client is None:
            self.last_verdict = "its client is no longer tracked"
            return []
        client.open.discard(conn_id)
        closes = client.closes
        closes.append((now_ms, conn_id, by_client, tuple(conn.members.values())))
        while closes and closes[0][0] < now_ms - self.window_ms:
            closes.popleft()
        if client.open:
            self.last_verdict = (f"{len(client.open)} other connection(s) of its client open, "
                                 f"{len(conn.members)} member(s) tied to this one")
            return []
        burst = list(closes)
        closes.clear()
        del self._clients[identity]
        if self.silenced:
            self.last_verdict = "silenced (stepping down)"
            return []
        if len(burst) < 2:
            self.last_verdict = "the client's last connection closed alone"
            return []
        if not all(c[2] for c in burst):
            self.last_verdict = (f"last of {len(burst)} closes, "
                                 f"{sum(not c[2] for c in burst)} of them by the proxy")
            return []
        suspected = []
        for _at, _conn, _by, members in burst:
            for member in members:
                key = (member.group_id, member.member_id)
                if key in self._suspects or len(self._suspects) >= MAX_SUSPECTS:
                    continue
                self._suspects[key] = _Suspect(member, identity, now_ms, now_ms + self.grace_ms)
                self.counts[Outcome.SUSPECTED] += 1
                suspected.append(member)
        self.last_verdict = (f"last of {len(burst)} closes by the client, "
                             f"{len(suspected)} member(s) tied to them")
        return suspected

    # -- what the proxy asks -----------------------------------------------------------------

    def next_deadline(self) -> int | None:
        return min((s.deadline_ms for s in self._suspects.values()), default=None)

    def due(self, now_ms: int) -> list[Declaration]:
        """The suspects whose grace has passed: declared gone (removed from the tracker)."""
        out = []
        for key, suspect in list(self._suspects.items()):
            if suspect.deadline_ms <= now_ms:
                del self._suspects[key]
                if self.silenced:
                    continue
                self.counts[Outcome.DECLARED] += 1
                out.append(Declaration(suspect.member, suspect.identity,
                                       suspect.observed_at_ms))
        return out

    def proxy_refused(self) -> None:
        """The proxy closed a new connection at once (``max-connections``, no broker): it may
        have been a suspect's client coming back, which cannot be told: every suspect is
        dropped (counted as returned)."""
        for key in list(self._suspects):
            self._returned(key)

    def silence(self) -> None:
        """The sidecar steps down: forget every suspect, suspect nothing more."""
        self.silenced = True
        self._suspects.clear()

    def __len__(self) -> int:
        """Connections tracked (for tests and bounds)."""
        return len(self._conns)

    def _untie(self, key: tuple[str, str]) -> None:
        conn_id = self._ties.pop(key, None)
        conn = self._conns.get(conn_id) if conn_id is not None else None
        if conn is not None:
            conn.members.pop(key, None)

    def _returned(self, key: tuple[str, str]) -> None:
        del self._suspects[key]
        self.counts[Outcome.RETURNED] += 1
