"""Clients of the fleet simulator (``tests/sim/fleet_sim.py``) as librdkafka and the Java
client drive them: their connection, timeouts, retries, backoff, consumption and commits.

The member's protocol state is :class:`~translation.simulation.client.SimulatedConsumer`
(KIP-848: heartbeats, reconciliation, revocation); this module adds what a sidecar sees of a
real client. Each client has one connection to its pod's sidecar (its bootstrap server and,
since the sidecar answers FindCoordinator with itself, its group coordinator); heartbeats and
offset commits go out on it and are answered in order.

librdkafka (2.16: ``src/rdkafka_cgrp.c``, ``rdkafka_request.c``, ``rdkafka_broker.c``):

* a ConsumerGroupHeartbeat times out after one heartbeat interval (the session timeout
  before the first answer gave one); a request that times out in flight takes the connection
  down (``socket.max.fails`` 1), every other request on it fails, and the timed-out heartbeat
  is retried as it was (the same member epoch) once a new connection is up;
* reconnecting: each connection attempt sets the earliest time of the next one to its own
  time plus the backoff (``reconnect.backoff.ms``, 100 ms, with -25 % .. +50 % jitter, capped
  at ``reconnect.backoff.max.ms``, 10 s) and doubles the backoff; an attempt more than 10 s
  after the earliest time the last one set starts again from 100 ms
  (``rd_kafka_broker_update_reconnect_backoff``). So a client whose heartbeats time out one
  after the other backs off up to 10 s between connections;
* COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR or a broken connection: the coordinator is
  looked up again and the next heartbeat, a full one, goes out at the next interval;
  COORDINATOR_LOAD_IN_PROGRESS: retried after ``retry.backoff.ms`` (100 ms) doubling to
  ``retry.backoff.max.ms`` (1 s); UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: the partitions are
  lost and the member joins again at once with epoch 0;
* no session check of its own with the consumer protocol (its session timer is set only by
  classic SyncGroup and Heartbeat answers);
* OffsetCommit: COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
  REQUEST_TIMED_OUT and broken connections are retried as the same request after the retry
  backoff (the stale retries of ``proxy/coordination/commit_retries.py``); UNKNOWN_MEMBER_ID and
  STALE_MEMBER_EPOCH make the next heartbeat go out at once; commits are pipelined.

Java (kafka-clients 4.x, the consumer protocol: ``AbstractHeartbeatRequestManager``,
``CommitRequestManager``, ``NetworkClient``):

* every request times out after ``request.timeout.ms`` (30 s), which disconnects;
* a failed heartbeat backs off ``retry.backoff.ms`` (100 ms) doubling to
  ``retry.backoff.max.ms`` (1 s), 20 % jitter; NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE
  mark the coordinator unknown: FindCoordinator, then the next heartbeat at once (no
  backoff); COORDINATOR_LOAD_IN_PROGRESS backs off; fencing errors rejoin at once;
* reconnects after ``reconnect.backoff.ms`` (50 ms) doubling per failed attempt in a row to
  ``reconnect.backoff.max.ms`` (1 s), 20 % jitter; a connection that came up resets it
  (``ClusterConnectionStates``);
* auto-commits are asynchronous, one in flight at a time, and not retried: the next one
  carries the newer offsets;
* no session check of its own.

Consumption: every partition grows by one record per ``record_ms`` (an idle topic stops
growing, the KIP-211 case); an owner that can fetch (its sidecar is up and reaches the broker)
reads up to the end; it starts from the offset committed at the broker. It commits what it
read every ``commit_interval_ms`` and when a revocation starts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from proxy.coordination.commit_retries import RETRIED_BY_CLIENTS
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.simulation.client import TP, ClientState, SimulatedConsumer

FENCING = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH})


class Kind(enum.Enum):
    LIBRDKAFKA = "librdkafka"
    JAVA = "java"


@dataclass(frozen=True)
class Behaviour:
    heartbeat_timeout_ms: int | None
    """None: one heartbeat interval (librdkafka)."""
    request_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    reconnect_backoff_ms: int
    reconnect_backoff_max_ms: int
    jitter: tuple[float, float]
    commit_retries: int
    commits_in_flight: int
    heartbeat_after_coordinator_error: str
    """``"interval"`` (librdkafka) or ``"now"`` (Java: once the coordinator is found)."""


BEHAVIOUR = {
    Kind.LIBRDKAFKA: Behaviour(
        heartbeat_timeout_ms=None, request_timeout_ms=60_000, retry_backoff_ms=100,
        retry_backoff_max_ms=1_000, reconnect_backoff_ms=100, reconnect_backoff_max_ms=10_000,
        jitter=(-0.25, 0.5), commit_retries=3, commits_in_flight=1_000,
        heartbeat_after_coordinator_error="interval"),
    Kind.JAVA: Behaviour(
        heartbeat_timeout_ms=30_000, request_timeout_ms=30_000, retry_backoff_ms=100,
        retry_backoff_max_ms=1_000, reconnect_backoff_ms=50, reconnect_backoff_max_ms=1_000,
        jitter=(-0.2, 0.2), commit_retries=0, commits_in_flight=1,
        heartbeat_after_coordinator_error="now"),
}


@dataclass(frozen=True)
class Commit:
    """An OffsetCommit of one member (v9: member id and member epoch)."""

    member_id: str
    epoch: int
    offsets: tuple[tuple[TP, int], ...]


Payload = ConsumerGroupHeartbeatRequest | Commit
Response = ConsumerGroupHeartbeatResponse | ErrorCode
"""A heartbeat's answer, or a commit's (one error code for the whole request)."""


@dataclass
class Sent:
    """A request the client sent (and, for a retry, sends again as it was)."""

    seq: int
    conn: int
    what: Payload
    sent_at: int
    attempt: int = 0


class Wire(Protocol):
    """What a client needs of the simulation around it."""

    now: int

    def at(self, t: int, fn: Callable[..., None], *args: object) -> None: ...
    def jitter(self, low: float, high: float) -> float: ...
    def client_send(self, client: FleetClient, sent: Sent) -> None: ...
    def client_closed(self, client: FleetClient, conn: int) -> None: ...
    def sidecar_process_up(self, client: FleetClient) -> bool: ...
    def can_fetch(self, client: FleetClient) -> bool: ...
    def committed(self, tp: TP) -> int: ...
    def revocation_started(self, client: FleetClient, token: int) -> None: ...
    def log_end(self, tp: TP) -> int: ...


@dataclass
class _Transport:
    conn: int = 0
    """The current connection's number (0: none open)."""
    connections: int = 0
    connecting: bool = False
    backoff_ms: int = 0
    """librdkafka: the next backoff (before jitter); Java: unused."""
    next_attempt: int = -10**9
    """librdkafka: the earliest time of the next connection attempt."""
    failures: int = 0
    """Java: failed connection attempts in a row."""
    in_flight: dict[int, Sent] = field(default_factory=dict)
    waiting: list[Sent] = field(default_factory=list)
    """Requests to send once a connection is up (retries, a heartbeat due meanwhile)."""


class FleetClient:
    """One application process: a consumer of the group with a real client's transport."""

    def __init__(self, wire: Wire, consumer: SimulatedConsumer, kind: Kind, *,
                 session_ms: int, heartbeat_ms: int, commit_interval_ms: int) -> None:
        self.wire = wire
        self.consumer = consumer
        self.kind = kind
        self.behaviour = BEHAVIOUR[kind]
        self.session_ms = session_ms
        self.heartbeat_ms = heartbeat_ms
        self.commit_interval_ms = commit_interval_ms
        self.transport = _Transport()
        self.seq = 0
        self.heartbeat: Sent | None = None
        """The heartbeat in transit (sent, or waiting to be sent again)."""
        self.heartbeat_token = 0
        self.expedite = False
        """A heartbeat is due as soon as the one in transit is answered."""
        self.retry_attempts = 0
        """Failed heartbeat attempts in a row (the retry backoff's exponent)."""
        self.positions: dict[TP, int | None] = {}
        """Owned partition -> next offset to read (None: not fetched yet)."""
        self.acked: dict[TP, int] = {}
        """The last offset of each partition the client was told it committed."""
        self.sent: dict[TP, int] = {}
        """The highest offset of each partition it sent in a commit since it owned it."""
        self.commits_in_flight = 0
        self.stats: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.consumer.name

    @property
    def alive(self) -> bool:
        return self.consumer.alive

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, after: int) -> None:
        self.consumer.subscribe(self.wire.now)
        self._connect_later(0)
        self._heartbeat_at(self.wire.now + after)
        self.wire.at(self.wire.now + self.commit_interval_ms, self._commit_tick)

    def crash(self) -> None:
        self.consumer.crash()
        self.heartbeat_token += 1
        self._close("crashed")

    # -- the connection ------------------------------------------------------------------------

    def _backoff(self, base: int, cap: int, attempts: int) -> int:
        low, high = self.behaviour.jitter
        value = min(cap, base * 2 ** min(attempts, 16))
        return max(1, int(value * (1 + self.wire.jitter(low, high))))

    def _connect_later(self, delay: int) -> None:
        t = self.transport
        if t.connecting or t.conn:
            return
        t.connecting = True
        b = self.behaviour
        if self.kind is Kind.LIBRDKAFKA:
            at = max(self.wire.now + delay, t.next_attempt)
        else:
            at = self.wire.now + max(delay, self._backoff(
                b.reconnect_backoff_ms, b.reconnect_backoff_max_ms, t.failures - 1)
                if t.failures else delay)
        self.wire.at(at, self._connect)

    def _connect(self) -> None:
        t = self.transport
        t.connecting = False
        if not self.alive or t.conn:
            return
        b = self.behaviour
        now = self.wire.now
        if self.kind is Kind.LIBRDKAFKA:
            if t.next_attempt + b.reconnect_backoff_max_ms < now:
                t.backoff_ms = b.reconnect_backoff_ms
            low, high = b.jitter
            wait = min(int(t.backoff_ms * self.wire.jitter(1 + low, 1 + high)),
                       b.reconnect_backoff_max_ms)
            t.next_attempt = now + wait
            t.backoff_ms = min(t.backoff_ms * 2, b.reconnect_backoff_max_ms)
        if not self.wire.sidecar_process_up(self):
            t.failures += 1  # connection refused
            self.count("connect-refused")
            self._connect_later(0)
            return
        t.failures = 0
        t.connections += 1
        t.conn = t.connections
        # What waited goes out in the order it was first made: retries of the requests the
        # broken connection failed, then the commits made meanwhile (librdkafka holds those
        # in the group's wait-for-coordinator queue until a connection is up).
        waiting, t.waiting = sorted(t.waiting, key=lambda s: s.seq), []
        for sent in waiting:
            self._send(sent)

    def _close(self, why: str) -> None:
        """The connection goes down (a timeout, the sidecar's process gone): every request on
        it fails."""
        t = self.transport
        if not t.conn:
            return
        conn, t.conn = t.conn, 0
        failed = sorted(t.in_flight.values(), key=lambda s: s.seq)
        t.in_flight.clear()
        self.wire.client_closed(self, conn)
        self.count(f"closed-{why}")
        for sent in failed:
            self._failed(sent, timed_out=why == "timeout")
        if self.alive:
            t.failures += 1  # Java: a disconnection counts until a connection is up again
            self._connect_later(0)

    def connection_reset(self, conn: int) -> None:
        """The sidecar's end of ``conn`` went away (its process died)."""
        if self.transport.conn == conn:
            self._close("reset")

    def _send(self, sent: Sent) -> None:
        t = self.transport
        if not t.conn:
            t.waiting.append(sent)
            self._connect_later(0)
            return
        sent.conn = t.conn
        sent.sent_at = self.wire.now
        t.in_flight[sent.seq] = sent
        self.wire.client_send(self, sent)
        if isinstance(sent.what, ConsumerGroupHeartbeatRequest):
            timeout = self.behaviour.heartbeat_timeout_ms or (
                self.consumer.heartbeat_interval_ms or self.session_ms)
        else:
            timeout = self.behaviour.request_timeout_ms
        self.wire.at(self.wire.now + timeout, self._timeout, sent.seq, sent.conn)

    def _timeout(self, seq: int, conn: int) -> None:
        t = self.transport
        if t.conn == conn and seq in t.in_flight:
            self.count("request-timeouts")
            self._close("timeout")

    # -- answers ---------------------------------------------------------------------------------

    def answer(self, seq: int, conn: int, response: Response) -> None:
        """An answer on connection ``conn`` (dropped if the client closed it meanwhile)."""
        t = self.transport
        if t.conn != conn or seq not in t.in_flight or not self.alive:
            return
        sent = t.in_flight.pop(seq)
        if isinstance(sent.what, ConsumerGroupHeartbeatRequest):
            assert isinstance(response, ConsumerGroupHeartbeatResponse)
            self._heartbeat_answered(sent, response)
        else:
            assert isinstance(response, ErrorCode)
            self._commit_answered(sent, response)

    def _failed(self, sent: Sent, *, timed_out: bool) -> None:
        """``sent`` got no answer: its connection went down."""
        if isinstance(sent.what, ConsumerGroupHeartbeatRequest):
            if sent is not self.heartbeat:
                return
            if self.kind is Kind.LIBRDKAFKA and timed_out:
                # _TIMED_OUT: the same request again once a connection is up.
                self.retry_attempts += 1
                self.wire.at(self.wire.now + self._retry_backoff(), self._resend, sent)
                return
            self.heartbeat = None
            self.consumer.on_request_lost()
            self.retry_attempts += 1
            if self.kind is Kind.LIBRDKAFKA:  # _TRANSPORT: coordinator query, next interval
                self._heartbeat_at(sent.sent_at + self._interval())
            else:
                self._heartbeat_at(self.wire.now + self._retry_backoff())
            return
        self.commits_in_flight -= 1
        self._commit_failed(sent)

    def _retry_backoff(self) -> int:
        b = self.behaviour
        return self._backoff(b.retry_backoff_ms, b.retry_backoff_max_ms,
                             max(self.retry_attempts - 1, 0))

    def _resend(self, sent: Sent) -> None:
        if sent is self.heartbeat and self.alive:
            self._send(sent)

    # -- heartbeats --------------------------------------------------------------------------

    def _interval(self) -> int:
        return self.consumer.heartbeat_interval_ms or self.heartbeat_ms

    def _heartbeat_at(self, t: int) -> None:
        self.heartbeat_token += 1
        self.wire.at(max(t, self.wire.now), self._heartbeat, self.heartbeat_token)

    def heartbeat_now(self) -> None:
        if self.heartbeat is None:
            self._heartbeat_at(self.wire.now)
        else:
            self.expedite = True

    def _heartbeat(self, token: int) -> None:
        if token != self.heartbeat_token or self.heartbeat is not None or not self.alive:
            return
        if self.consumer.state is ClientState.LEFT:
            return
        self.seq += 1
        self.expedite = False
        self.heartbeat = Sent(self.seq, 0, self.consumer.build_request(), self.wire.now)
        self._send(self.heartbeat)

    def _heartbeat_answered(self, sent: Sent, response: ConsumerGroupHeartbeatResponse) -> None:
        if sent is not self.heartbeat:
            return
        self.heartbeat = None
        code = ErrorCode(response.error_code)
        actions = self.consumer.on_response(response, self.wire.now)
        expedite, self.expedite = self.expedite, False
        if code is ErrorCode.NONE:
            self.retry_attempts = 0
        else:
            self.count(f"heartbeat-{code.name}")
        if "revoke" in actions:
            self._revocation_started()
            self.wire.revocation_started(self, self.consumer.revocation_token)
        if "heartbeat-now" in actions or code in FENCING or (expedite and code is ErrorCode.NONE):
            self.retry_attempts = 0
            self._heartbeat_at(self.wire.now)
        elif code is ErrorCode.NONE:
            self._heartbeat_at(sent.sent_at + self._interval())
        elif code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            self.retry_attempts += 1
            self._heartbeat_at(self.wire.now + self._retry_backoff())
        elif self.behaviour.heartbeat_after_coordinator_error == "now":
            # FindCoordinator (its request state backs off retry.backoff.ms after an answer),
            # then the heartbeat at once.
            self.retry_attempts = 0
            b = self.behaviour
            self._heartbeat_at(self.wire.now + self._backoff(b.retry_backoff_ms,
                                                             b.retry_backoff_max_ms, 0))
        else:
            self.retry_attempts += 1
            self._heartbeat_at(max(sent.sent_at + self._interval(), self.wire.now + 1))

    def _revocation_started(self) -> None:
        """The application's revocation callback starts: it commits what it read."""
        self._commit(sorted(self.consumer.revoking, key=_tp_key), force=True)

    # -- consumption and commits -------------------------------------------------------------

    def acquired(self, tp: TP) -> None:
        self.positions[tp] = None
        self.sent.pop(tp, None)
        self._fetch(tp)

    def released(self, tp: TP) -> None:
        self.positions.pop(tp, None)
        self.sent.pop(tp, None)

    def _fetch(self, tp: TP) -> None:
        if not self.wire.can_fetch(self):
            return
        position = self.positions.get(tp, 0)
        if position is None:
            position = self.wire.committed(tp)
        self.positions[tp] = max(position, self.wire.log_end(tp))

    def _commit_tick(self) -> None:
        if not self.alive:
            return
        self.wire.at(self.wire.now + self.commit_interval_ms, self._commit_tick)
        for tp in list(self.positions):
            self._fetch(tp)
        self._commit(sorted(self.positions, key=_tp_key), force=False)

    def _commit(self, tps: list[TP], *, force: bool) -> None:
        c = self.consumer
        if c.state not in (ClientState.STABLE, ClientState.RECONCILING,
                           ClientState.ACKNOWLEDGING) or not c.epoch:
            return
        if self.commits_in_flight >= self.behaviour.commits_in_flight and not force:
            return
        offsets = []
        for tp in tps:
            position = self.positions.get(tp)
            if position is not None and position > self.sent.get(tp, -1) \
                    and position > self.acked.get(tp, -1):
                offsets.append((tp, position))
                self.sent[tp] = position
        if not offsets:
            return
        self.seq += 1
        self.commits_in_flight += 1
        self.count("commits")
        self._send(Sent(self.seq, 0, Commit(c.member_id, c.epoch, tuple(offsets)),
                        self.wire.now))

    def _commit_answered(self, sent: Sent, code: ErrorCode) -> None:
        self.commits_in_flight -= 1
        assert isinstance(sent.what, Commit)
        if code is ErrorCode.NONE:
            self.count("commits-ok")
            for tp, offset in sent.what.offsets:
                if offset > self.acked.get(tp, -1):
                    self.acked[tp] = offset
            return
        self.count(f"commit-{code.name}")
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.STALE_MEMBER_EPOCH,
                    ErrorCode.FENCED_MEMBER_EPOCH):
            self.heartbeat_now()
        if int(code) in RETRIED_BY_CLIENTS:
            self._commit_failed(sent)
        else:
            self._forget_sent(sent)

    def _commit_failed(self, sent: Sent) -> None:
        """A commit failed with an error the client retries, or on a broken connection."""
        if sent.attempt < self.behaviour.commit_retries and self.alive:
            sent.attempt += 1
            self.commits_in_flight += 1
            self.count("commit-retries")
            b = self.behaviour
            self.wire.at(self.wire.now + self._backoff(b.retry_backoff_ms,
                                                       b.retry_backoff_max_ms, sent.attempt - 1),
                         self._resend_commit, sent)
            return
        self._forget_sent(sent)

    def _resend_commit(self, sent: Sent) -> None:
        if self.alive:
            self._send(sent)
        else:
            self.commits_in_flight -= 1

    def _forget_sent(self, sent: Sent) -> None:
        """A commit that will not be retried: its partitions go in the next one."""
        assert isinstance(sent.what, Commit)
        for tp, offset in sent.what.offsets:
            if self.sent.get(tp) == offset:
                del self.sent[tp]


def _tp_key(tp: TP) -> tuple[str, int]:
    return (str(tp[0]), tp[1])
