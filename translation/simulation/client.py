"""A simulated KIP-848 consumer: the member state machine of the client design.

States: NOT_IN_GROUP -> JOINING (heartbeat with epoch 0, full request) -> STABLE. A response
carrying an assignment starts RECONCILING: partitions no longer assigned are revoked first
(the revocation "callback" takes simulated time, during which the client still owns and
processes them), then newly assigned partitions are added, then the client acknowledges with
an immediate heartbeat reporting what it owns. FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID: the
client drops everything (partitions lost) and rejoins with epoch 0 and the same member id.
Leaving revokes everything and sends epoch -1 (-2 for a static member's temporary leave).
UNRELEASED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, INVALID_REQUEST and INVALID_REGULAR_EXPRESSION are
fatal, as in the Java client and librdkafka.

Two client-side safety rules keep a member from processing partitions the coordinator has
already given away: a member whose revocation outlives its rebalance timeout (the poll
interval) gives up its partitions and leaves before the coordinator can fence it; and a member
that has not heard from the coordinator for the shorter of the session and rebalance timeouts
treats its partitions as lost (a lost response may have carried a revocation whose rebalance
timeout is running). The simulator arms both from the send time of the oldest unanswered
request, which is no later than when the coordinator started either timer.

The client does not talk to the network: :meth:`SimulatedConsumer.build_request` produces
the next heartbeat and :meth:`SimulatedConsumer.on_response` consumes the answer; the
simulator schedules everything and observes ownership through the ``on_acquire`` /
``on_release`` callbacks.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.topics import TopicId

TP = tuple[TopicId, int]


class ClientState(enum.Enum):
    NOT_IN_GROUP = "not-in-group"
    JOINING = "joining"
    STABLE = "stable"
    RECONCILING = "reconciling"
    """Revocation callback running."""
    ACKNOWLEDGING = "acknowledging"
    """Reconciliation done; the next heartbeat reports the new owned partitions."""
    LEAVING = "leaving"
    LEFT = "left"
    FATAL = "fatal"
    DEAD = "dead"
    """The process crashed: it owns nothing and sends nothing."""


FATAL_ERRORS = frozenset(
    {
        ErrorCode.UNRELEASED_INSTANCE_ID,
        ErrorCode.UNSUPPORTED_ASSIGNOR,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REGULAR_EXPRESSION,
    }
)
REJOIN_ERRORS = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})


class SimulatedConsumer:
    def __init__(
        self,
        name: str,
        member_id: str,
        group_id: str,
        *,
        topics: frozenset[str],
        regex: str | None,
        instance_id: str | None,
        server_assignor: str | None,
        rebalance_timeout_ms: int,
        on_acquire: Callable[[SimulatedConsumer, TP], None],
        on_release: Callable[[SimulatedConsumer, TP, str], None],
    ) -> None:
        self.name = name
        self.member_id = member_id
        self.group_id = group_id
        self.topics = topics
        self.regex = regex
        self.instance_id = instance_id
        self.server_assignor = server_assignor
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.on_acquire = on_acquire
        self.on_release = on_release

        self.state = ClientState.NOT_IN_GROUP
        self.epoch = 0
        self.owned: set[TP] = set()
        self.heartbeat_interval_ms = 0
        self.target: set[TP] | None = None
        """Latest assignment received and not yet reconciled."""
        self.revoking: set[TP] = set()
        self.revocation_token = 0
        self.revocation_deadline_ms = 0
        self.need_full = True
        self.sub_version = 1
        self.acked_sub_version = 0
        self.sent_owned: frozenset[TP] | None = None
        self.in_flight = False
        self.last_success_ms = 0
        self.fatal_error: ErrorCode | None = None
        self.leave_epoch = 0
        self.awaiting_ack: frozenset[TP] = frozenset()
        """Partitions revoked but not yet reported as released to the coordinator."""
        self._pending_owned: frozenset[TP] | None = None
        self._pending_sub = 0

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.state not in (ClientState.DEAD, ClientState.LEFT, ClientState.FATAL)

    def subscribe(self, now_ms: int) -> None:
        self.state = ClientState.JOINING
        self.epoch = 0
        self.need_full = True
        self.last_success_ms = now_ms

    def change_subscription(
        self, topics: frozenset[str], regex: str | None, server_assignor: str | None
    ) -> None:
        self.topics = topics
        self.regex = regex
        self.server_assignor = server_assignor
        self.sub_version += 1

    def crash(self) -> None:
        """The process dies: it owns nothing any more and never speaks again."""
        self._drop_all("crashed")
        self.state = ClientState.DEAD
        self.in_flight = False

    def start_leave(self, static: bool) -> None:
        """Revoke everything (commit, onPartitionsRevoked) and send a leave heartbeat."""
        self._drop_all("left")
        self.state = ClientState.LEAVING
        self.leave_epoch = -2 if static else -1

    def lose_partitions(self, reason: str) -> None:
        """onPartitionsLost and rejoin from scratch with the same member id."""
        self._drop_all(reason)
        self.epoch = 0
        self.state = ClientState.JOINING
        self.need_full = True

    def _drop_all(self, reason: str) -> None:
        for tp in sorted(self.owned, key=_tp_key):
            self.on_release(self, tp, reason)
        self.owned.clear()
        self.revoking.clear()
        self.target = None
        self.revocation_token += 1
        self.sent_owned = None
        self.awaiting_ack = frozenset()

    # -- requests --------------------------------------------------------------------------

    def build_request(self) -> ConsumerGroupHeartbeatRequest:
        if self.state is ClientState.LEAVING:
            request = ConsumerGroupHeartbeatRequest(
                group_id=self.group_id,
                member_id=self.member_id,
                member_epoch=self.leave_epoch,
                instance_id=self.instance_id,
            )
            self.in_flight = True
            return request
        joining = self.state is ClientState.JOINING
        full = joining or self.need_full
        owned = frozenset(self.owned)
        send_owned = full or owned != self.sent_owned
        send_sub = full or self.sub_version != self.acked_sub_version
        # An empty regex means "no regex"; sending it with every subscription update also
        # clears a regex the coordinator may have from a request whose response was lost.
        regex = (self.regex or "") if send_sub else None
        request = ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=0 if joining else self.epoch,
            instance_id=self.instance_id,
            rebalance_timeout_ms=self.rebalance_timeout_ms if full else -1,
            subscribed_topic_names=sorted(self.topics) if send_sub else None,
            subscribed_topic_regex=regex,
            server_assignor=self.server_assignor if send_sub else None,
            topic_partitions=[] if joining else (_group_tps(owned) if send_owned else None),
        )
        self.in_flight = True
        self._pending_owned = frozenset() if joining else (owned if send_owned else self.sent_owned)
        self._pending_sub = self.sub_version if send_sub else 0
        return request

    def on_request_lost(self) -> None:
        """No response before the request timeout: resend a full request."""
        self.in_flight = False
        if self.state is not ClientState.LEAVING:
            self.need_full = True

    # -- responses -------------------------------------------------------------------------

    def on_response(self, response: ConsumerGroupHeartbeatResponse, now_ms: int) -> list[str]:
        """Apply a response; returns actions for the simulator: "revoke", "heartbeat-now"."""
        self.in_flight = False
        code = ErrorCode(response.error_code)
        if self.state is ClientState.LEAVING:
            if code in (
                ErrorCode.NONE,
                ErrorCode.UNKNOWN_MEMBER_ID,
                ErrorCode.GROUP_ID_NOT_FOUND,
                ErrorCode.FENCED_INSTANCE_ID,
            ):
                self.state = ClientState.LEFT
            return []
        if code is not ErrorCode.NONE:
            if code in REJOIN_ERRORS:
                self.lose_partitions("fenced")
                return ["heartbeat-now"]
            if code in FATAL_ERRORS:
                self._drop_all("fatal")
                self.fatal_error = code
                self.state = ClientState.FATAL
                return []
            self.need_full = True
            return []
        self.last_success_ms = now_ms
        self.need_full = False
        self.sent_owned = self._pending_owned
        if (
            self.awaiting_ack
            and self.sent_owned is not None
            and not (self.awaiting_ack & self.sent_owned)
            and self.state is not ClientState.RECONCILING
        ):
            self.awaiting_ack = frozenset()
        if self._pending_sub:
            self.acked_sub_version = self._pending_sub
        if response.heartbeat_interval_ms:
            self.heartbeat_interval_ms = response.heartbeat_interval_ms
        assert response.member_epoch is not None
        self.epoch = response.member_epoch
        if self.state is ClientState.JOINING:
            self.state = ClientState.STABLE
        if response.assignment is not None:
            self.target = {(t, p) for t, ps in response.assignment for p in ps}
        if self.state is ClientState.RECONCILING:
            return []
        if self.target is None:
            if self.state is ClientState.ACKNOWLEDGING and frozenset(self.owned) == self.sent_owned:
                self.state = ClientState.STABLE
            return []
        return self._reconcile()

    def _reconcile(self) -> list[str]:
        assert self.target is not None
        revoked = self.owned - self.target
        if revoked:
            self.revoking = revoked
            self.awaiting_ack = frozenset(revoked)
            self.state = ClientState.RECONCILING
            self.revocation_token += 1
            return ["revoke"]
        added = self.target - self.owned
        self.target = None
        if added:
            for tp in sorted(added, key=_tp_key):
                self.owned.add(tp)
                self.on_acquire(self, tp)
            self.state = ClientState.ACKNOWLEDGING
            return ["heartbeat-now"]
        if self.state is ClientState.ACKNOWLEDGING and frozenset(self.owned) == self.sent_owned:
            self.state = ClientState.STABLE
        return []

    def finish_revocation(self, token: int) -> list[str]:
        """The revocation callback completed: drop the revoked partitions, then assign."""
        if token != self.revocation_token or self.state is not ClientState.RECONCILING:
            return []
        # Revoked partitions are released before the acknowledgement is sent.
        for tp in sorted(self.revoking, key=_tp_key):
            self.owned.discard(tp)
            self.on_release(self, tp, "revoked")
        self.revoking = set()
        self.state = ClientState.ACKNOWLEDGING
        if self.target is not None:
            self._reconcile()
        return ["heartbeat-now"]


def _tp_key(tp: TP) -> tuple[str, int]:
    return (str(tp[0]), tp[1])


def _group_tps(owned: frozenset[TP]) -> list[tuple[TopicId, list[int]]]:
    by_topic: dict[TopicId, list[int]] = {}
    for t, p in owned:
        by_topic.setdefault(t, []).append(p)
    return [(t, sorted(ps)) for t, ps in sorted(by_topic.items(), key=lambda kv: str(kv[0]))]
