"""A simulated classic consumer (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) for the simulator.

It follows what the Java client's ``ConsumerCoordinator`` does, in two flavours:

* **eager** (the Java default ``[range, cooperative-sticky]``): before every JoinGroup it
  revokes everything it owns and reports no owned partitions; the SyncGroup assignment
  replaces its ownership;
* **cooperative** (``[cooperative-sticky]``): it keeps its partitions across JoinGroup and reports
  them; after SyncGroup it adds the new partitions at once, revokes the ones it lost (the
  revocation callback takes simulated time) and then rejoins at once.

Errors: MEMBER_ID_REQUIRED -> rejoin with the given id; REBALANCE_IN_PROGRESS -> rejoin;
ILLEGAL_GENERATION -> partitions lost, rejoin with the same member id; UNKNOWN_MEMBER_ID ->
partitions lost, rejoin without a member id; FENCED_INSTANCE_ID and INCONSISTENT_GROUP_PROTOCOL
are fatal. A static member leaves without a LeaveGroup (it just stops); a dynamic one sends
LeaveGroup. A classic client cannot subscribe to a regex on the coordinator: a pattern is
resolved against the topics it sees when it subscribes.

The same safety rules as the new-protocol client (:mod:`translation.simulation.client`) apply:
partitions a JoinGroup reported for revocation must be let go before the coordinator's
rebalance timeout, counted from when that JoinGroup was sent (the simulator arms that), and the
session guard drops everything when the coordinator has not answered for too long.

The client exposes the attributes and methods the simulator drives
(``build_request``/``on_response``/``finish_revocation``/...), with ``state`` in the
new-protocol client's :class:`~translation.simulation.client.ClientState` terms.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from translation.classic.messages import (
    ClassicProtocol,
    ClassicSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeavingMember,
    SyncGroupRequest,
    SyncGroupResponse,
)
from translation.errors import ErrorCode
from translation.simulation.client import TP, ClientState
from translation.topics import TopicsImage

ClassicRequest = JoinGroupRequest | SyncGroupRequest | HeartbeatRequest | LeaveGroupRequest
ClassicResponse = JoinGroupResponse | SyncGroupResponse | HeartbeatResponse | LeaveGroupResponse

FATAL = frozenset({ErrorCode.FENCED_INSTANCE_ID, ErrorCode.INCONSISTENT_GROUP_PROTOCOL})


class Phase(enum.Enum):
    JOIN = "join"
    SYNC = "sync"
    STABLE = "stable"


class SimulatedClassicConsumer:
    def __init__(
        self,
        name: str,
        group_id: str,
        *,
        topics: frozenset[str],
        instance_id: str | None,
        cooperative: bool,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        heartbeat_interval_ms: int,
        image: Callable[[], TopicsImage],
        on_acquire: Callable[[SimulatedClassicConsumer, TP], None],
        on_release: Callable[[SimulatedClassicConsumer, TP, str], None],
    ) -> None:
        self.name = name
        self.group_id = group_id
        self.topics = topics
        self.regex: str | None = None
        self.instance_id = instance_id
        self.server_assignor: str | None = None
        self.cooperative = cooperative
        # The Java client's rebalance protocol is the one all its assignors support: eager with
        # its default [range, cooperative-sticky], cooperative with cooperative-sticky alone.
        # Either way the group shares a protocol name, as in a rolling assignor change.
        self.protocols = ("cooperative-sticky",) if cooperative else ("range", "cooperative-sticky")
        self.protocol = self.protocols[0]
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.image = image
        self.on_acquire = on_acquire
        self.on_release = on_release

        self.member_id = ""
        self.epoch = -1
        """The generation (= member epoch) of the last successful JoinGroup."""
        self.state = ClientState.NOT_IN_GROUP
        self.phase = Phase.JOIN
        self.owned: set[TP] = set()
        self.revoking: set[TP] = set()
        self.awaiting_ack: frozenset[TP] = frozenset()
        """Revoked, not yet reported by a JoinGroup the coordinator answered."""
        self.revocation_token = 0
        self.in_flight = False
        self.sent_owned: frozenset[TP] | None = None
        self.fatal_error: ErrorCode | None = None
        self.assignment_image: TopicsImage | None = None
        """Topic metadata to read the next SyncGroup assignment with (set by the simulator)."""
        self.window_start: int | None = None
        """Open rebalance: when its first JoinGroup was sent (the simulator keeps this and
        drops the partitions if the rebalance outlives the rebalance timeout)."""
        self._sent_kind: type | None = None
        self._join_reported: frozenset[TP] = frozenset()
        self.joined_topics: frozenset[str] = frozenset()
        """The subscription of the last JoinGroup; a different one needs a rejoin (as the
        Java client's ``joinedSubscription`` check)."""

    @property
    def alive(self) -> bool:
        return self.state not in (ClientState.DEAD, ClientState.LEFT, ClientState.FATAL)

    # -- lifecycle -------------------------------------------------------------------------

    def subscribe(self, now_ms: int) -> None:
        self.state = ClientState.JOINING
        self._rejoin()

    def change_subscription(
        self, topics: frozenset[str], regex: str | None, server_assignor: str | None
    ) -> None:
        if regex:
            from translation.regex import resolve

            topics = topics | resolve(regex, self.image())
        self.topics = topics
        if self.state not in (ClientState.LEAVING, ClientState.RECONCILING):
            self._rejoin()

    def crash(self) -> None:
        self._drop_all("crashed")
        self.state = ClientState.DEAD
        self.in_flight = False

    def start_leave(self, static: bool) -> None:
        self._drop_all("left")
        if static:
            # A static classic member sends no LeaveGroup: it just stops.
            self.state = ClientState.LEFT
        else:
            self.state = ClientState.LEAVING

    def lose_partitions(self, reason: str) -> None:
        self._drop_all(reason)
        self.window_start = None
        self.state = ClientState.JOINING
        self.phase = Phase.JOIN

    def _drop_all(self, reason: str) -> None:
        for tp in sorted(self.owned, key=_tp_key):
            self.on_release(self, tp, reason)
        self.owned.clear()
        self.revoking.clear()
        self.revocation_token += 1
        self.awaiting_ack = frozenset()

    def _rejoin(self) -> None:
        """onJoinPrepare: an eager client revokes everything before it rejoins."""
        if not self.cooperative:
            for tp in sorted(self.owned, key=_tp_key):
                self.on_release(self, tp, "revoked")
            self.owned.clear()
        self.phase = Phase.JOIN
        if self.state is not ClientState.RECONCILING:
            self.state = ClientState.JOINING

    # -- requests --------------------------------------------------------------------------

    def build_request(self) -> ClassicRequest:
        self.in_flight = True
        if self.state is ClientState.LEAVING:
            self._sent_kind = LeaveGroupRequest
            return LeaveGroupRequest(
                self.group_id, [LeavingMember(self.member_id, self.instance_id)]
            )
        if self.phase is Phase.JOIN:
            self._sent_kind = JoinGroupRequest
            return self._join_request()
        if self.phase is Phase.SYNC:
            self._sent_kind = SyncGroupRequest
            return SyncGroupRequest(
                self.group_id,
                self.member_id,
                self.epoch,
                group_instance_id=self.instance_id,
                protocol_type="consumer",
                protocol_name=self.protocol,
            )
        self._sent_kind = HeartbeatRequest
        return HeartbeatRequest(self.group_id, self.member_id, self.epoch, self.instance_id)

    def _join_request(self) -> JoinGroupRequest:
        image = self.image()
        by_topic: dict[str, list[int]] = {}
        reported: set[TP] = set()
        if self.cooperative:
            for topic_id, p in self.owned:
                meta = image.by_id.get(topic_id)
                if meta is not None:
                    by_topic.setdefault(meta.name, []).append(p)
                    reported.add((topic_id, p))
        self._join_reported = frozenset(reported)
        self.joined_topics = self.topics
        subscription = ClassicSubscription(
            version=3 if self.cooperative else 1,
            topics=tuple(sorted(self.topics)),
            owned_partitions=tuple((t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items())),
            generation_id=self.epoch,
        )
        return JoinGroupRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            protocol_type="consumer",
            protocols=[ClassicProtocol(name, subscription) for name in self.protocols],
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            group_instance_id=self.instance_id,
        )

    def on_request_lost(self) -> None:
        self.in_flight = False
        if self.state is not ClientState.LEAVING and self.phase is Phase.SYNC:
            self._rejoin()

    # -- responses -------------------------------------------------------------------------

    def on_response(self, response: ClassicResponse, now_ms: int) -> list[str]:
        self.in_flight = False
        code = ErrorCode(response.error_code)
        if self.state is ClientState.LEAVING:
            if isinstance(response, LeaveGroupResponse):
                self.state = ClientState.LEFT
            return []
        if code in FATAL:
            self._drop_all("fatal")
            self.fatal_error = code
            self.state = ClientState.FATAL
            return []
        if code is ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            self.lose_partitions("fenced")
            return ["heartbeat-now"]
        if code is ErrorCode.ILLEGAL_GENERATION:
            self.lose_partitions("fenced")
            return ["heartbeat-now"]
        if isinstance(response, JoinGroupResponse):
            return self._on_join(response, code)
        if isinstance(response, SyncGroupResponse):
            return self._on_sync(response, code)
        if (
            isinstance(response, HeartbeatResponse)
            and code is ErrorCode.REBALANCE_IN_PROGRESS
            and self.phase is Phase.STABLE
        ):
            if self.state is ClientState.RECONCILING:
                return []  # it rejoins once the revocation callback is done
            self._rejoin()
            return ["heartbeat-now"]
        return []

    def _on_join(self, response: JoinGroupResponse, code: ErrorCode) -> list[str]:
        if self.phase is not Phase.JOIN:
            return []
        if code is ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            return ["heartbeat-now"]
        if code is not ErrorCode.NONE:
            return ["heartbeat-now"] if code is ErrorCode.REBALANCE_IN_PROGRESS else []
        self.member_id = response.member_id
        self.epoch = response.generation_id
        if self.awaiting_ack and not (self.awaiting_ack & self._join_reported):
            self.awaiting_ack = frozenset()
        self.phase = Phase.SYNC
        return ["heartbeat-now"]

    def _on_sync(self, response: SyncGroupResponse, code: ErrorCode) -> list[str]:
        if self.phase is not Phase.SYNC:
            return []
        if code is not ErrorCode.NONE or response.assignment is None:
            self._rejoin()
            return ["heartbeat-now"]
        image = self.assignment_image or self.image()
        assigned: set[TP] = set()
        for name, ps in response.assignment.partitions:
            meta = image.by_name.get(name)
            if meta is not None:
                assigned.update((meta.topic_id, p) for p in ps)
        added = assigned - self.owned
        for tp in sorted(added, key=_tp_key):
            self.owned.add(tp)
            self.on_acquire(self, tp)
        revoked = self.owned - assigned
        self.phase = Phase.STABLE
        if revoked:
            self.revoking = revoked
            self.awaiting_ack = frozenset(revoked)
            self.revocation_token += 1
            self.state = ClientState.RECONCILING
            return ["revoke"]
        self.state = ClientState.STABLE
        self.window_start = None
        if self.joined_topics != self.topics:
            self._rejoin()
            return ["heartbeat-now"]
        return []

    def finish_revocation(self, token: int) -> list[str]:
        """The revocation callback completed: drop the partitions, then rejoin at once."""
        if token != self.revocation_token or self.state is not ClientState.RECONCILING:
            return []
        for tp in sorted(self.revoking, key=_tp_key):
            self.owned.discard(tp)
            self.on_release(self, tp, "revoked")
        self.revoking = set()
        self.state = ClientState.JOINING
        self._rejoin()
        return ["heartbeat-now"]


def _tp_key(tp: TP) -> tuple[str, int]:
    return (str(tp[0]), tp[1])
