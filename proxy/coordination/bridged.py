"""Bridged members: KIP-848 clients in a broker group that still has direct members.

While clients connected straight to the broker hold a group, the broker refuses the proxy's
lock (INCONSISTENT_GROUP_PROTOCOL): the group is in the *broker phase* on this sidecar
(decision record 0018, "Members behind sidecars in the broker phase"). A KIP-848 client of such
a group gets a *bridged member*: a classic member this sidecar runs in the broker's group on its
behalf. Its state machine is :class:`translation.bridge.BridgedMember` (sans-I/O); this module
gives it a network and a clock:

* :class:`Bridge`: one member's task. JoinGroup, SyncGroup and LeaveGroup go to the group's
  coordinator broker on one link, Heartbeat on another (a JoinGroup can wait for a whole
  rebalance), every request under the member mark as client id; answers go back into the
  machine as they come, and what it asks for next is sent. The member leaves the broker's
  group when its client leaves (epoch -1), when the client's session runs out without a
  heartbeat, and when the proxy stops.
* :class:`Bridges`: every bridged member of this sidecar, bounded (``max-members``), in a
  nursery of its own that the service starts; a member whose task fails is logged, ended and
  forgotten, nothing else is touched. It answers the client's heartbeats from the machine
  (assignments as the broker's topic ids), and tells the offset handlers under which broker
  member id and generation a bridged client's commit goes (:meth:`Bridges.commit_target`).

A client subscribing by regex (``subscribed_topic_regex``) is bridged with the regex resolved
to names, as Kafka's Java client does for a pattern in the classic protocol: the names of the
topics this sidecar watches that the regex fully matches, those the client may DESCRIBE
(the rights the router's authorization stage brings, :class:`~translation.regex.TopicRights`;
a match not checked yet stays out until rights that checked it come, and one the member had
stays in), resolved again at every heartbeat of its client; when the names change, the
bridged member rejoins with them. The regex goes with the member into a conversion
(:meth:`Bridges.regexes`), so the engine adopts it subscribed by the regex.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from proxy import metrics
from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.coordination.convert import encode_assignment, parse_assignment, parse_subscription
from proxy.coordination.in_flight import InFlight
from proxy.coordination.membership import (
    COORDINATOR_MOVED,
    CoordinatorUnavailable,
    find_coordinator,
)
from proxy.coordination.topics import image_from_metadata
from proxy.kafka_client.links import Address, BrokerLink, LinkPool
from proxy.kafka_client.metadata import METADATA_VERSION, metadata_request
from proxy.upstream import UpstreamError
from translation.bridge import (
    BridgedMember,
    BridgeState,
    BrokerJoinAnswer,
    BrokerRequest,
    ClientAnswer,
    ClientHeartbeat,
    LeaderSyncGroupRequest,
)
from translation.classic.client_assignors import ClassicGroupMember
from translation.classic.messages import (
    CONSUMER_PROTOCOL_TYPE,
    ClassicAssignment,
    ClassicSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupResponse,
)
from translation.config import random_member_id
from translation.effects import ReleasedMember
from translation.errors import ErrorCode, GroupError
from translation.heartbeat import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    TopicPartitions,
)
from translation.regex import TopicRights, resolve, validate_regex
from translation.topics import TopicId, TopicMetadata, TopicsImage

log = logging.getLogger("groupgate.coordination")

JOIN_VERSION = 5
SYNC_VERSION = 3
HEARTBEAT_VERSION = 3
LEAVE_VERSION = 3
DESCRIBE_VERSION = 3
DESCRIBE_SECONDS = 2.0
"""Least time a joining member waits to learn the broker group's current protocol (which its
JoinGroup offers first, so that its vote never changes the group's protocol)."""
RETRY_SECONDS = 0.5
"""Pause before a request is sent again after the coordinator could not be reached."""
LEAVE_SECONDS = 5.0
"""Longest a stopping proxy waits for one bridged member's LeaveGroup."""
JOIN_WAIT_SECONDS = 30.0
"""Least time a JoinGroup may wait for its answer (the broker answers once every member has
rejoined, up to the longest rebalance timeout in the group)."""

Partitions = dict[str, frozenset[int]]


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    fleet_address: str
    """This sidecar's fleet address (``host:port``, ``-`` without one), for the member mark."""
    session_timeout_ms: int
    """The bridged member's session in the broker's group (``broker-session-timeout-ms``)."""
    client_session_ms: int
    """The client's KIP-848 session (``group-session-timeout-ms``): a member whose client is
    silent that long leaves the broker's group."""
    metadata_refresh_s: float
    """How often a leading member looks at its group's partition counts."""
    connect_timeout: float
    max_members: int


class Bridge:
    """One bridged member: its machine, its links and its task (:meth:`run`)."""

    def __init__(self, machine: BridgedMember, settings: BridgeSettings, pool: LinkPool,
                 bootstrap: Sequence[Address]) -> None:
        self.machine = machine
        self.settings = settings
        self.group_id = machine.group_id
        self.member_id = machine.member_id
        self._pool = pool
        self._bootstrap = tuple(bootstrap)
        self.topics: dict[str, TopicMetadata] = {}
        """Topics by name the member was told of (their ids for the client's answers);
        bounded by the group's subscriptions."""
        self.last_seen = trio.current_time()
        self.changed = trio.Event()
        """Set (and replaced) whenever the machine moved: heartbeats waiting for an epoch."""
        self._wake = trio.Event()
        self._queue: list[BrokerRequest] = []
        self._control_scope: trio.CancelScope | None = None
        self._control_busy = 0
        self.coordinator: Address | None = None
        self._control: BrokerLink | None = None
        self._heartbeats: BrokerLink | None = None
        self._links_lock = trio.Lock()
        self._counts: dict[str, int] = {}
        self._next_refresh = 0.0
        self.sent: tuple[int, Partitions] | None = None
        """(epoch, assignment) of the client's last answer."""
        self.told_to_let_go = False
        self.ended = ""
        """Why the member ended (empty while it runs)."""
        self.suspended = False
        """Nothing is sent to the broker meanwhile: another sidecar or this one converts the
        group (:mod:`.upgrade`); what the machine asks for waits."""
        self._resumed = trio.Event()
        self.client_epoch = -1
        """The epoch the client's last heartbeat carried."""
        self.regex: str | None = None
        """The client's ``subscribed_topic_regex`` (None: it subscribes by names)."""
        self.rights: TopicRights | None = None
        """What the client may DESCRIBE, as its last heartbeat that brought rights said
        (None: no rights asked, every match counts)."""
        self.resolved: frozenset[str] = frozenset()
        """The names the regex resolved to last (the machine's subscription)."""
        self.at_broker = InFlight()
        """Requests of this member at the broker now (a conversion waits for them)."""
        self.on_leader: Callable[[str, int, frozenset[str]], None] | None = None
        """Told (group, generation, member ids) when the broker made this member the leader."""
        self._scope = trio.CancelScope()

    # -- what the table uses ----------------------------------------------------------------

    def now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def feed(self, requests: Sequence[BrokerRequest]) -> None:
        """Queue what the machine asked for and wake the task (and the waiting heartbeats)."""
        self._queue.extend(requests)
        self._wake.set()
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def leave(self, why: str) -> None:
        if self.machine.state not in (BridgeState.LEAVING, BridgeState.LEFT):
            log.info("group %s: bridged member %s leaves the broker's group: %s",
                     self.group_id, self.member_id, why)
        self.feed(self.machine.leave())

    def partitions_by_name(self, topics: Iterable[tuple[TopicId, Sequence[int]]]
                           ) -> dict[str, list[int]]:
        by_id = {m.topic_id: m.name for m in self.topics.values()}
        out: dict[str, list[int]] = {}
        for topic_id, partitions in topics:
            name = by_id.get(topic_id)
            if name is not None:
                out.setdefault(name, []).extend(partitions)
        return out

    def response(self, answer: ClientAnswer, request_epoch: int
                 ) -> ConsumerGroupHeartbeatResponse:
        """The client's answer from the machine's (assignment by the broker's topic ids)."""
        if answer.error_code:
            return ConsumerGroupHeartbeatResponse(
                error_code=answer.error_code, member_id=self.member_id,
                error_message=f"the broker's group {self.group_id} cannot take this member "
                              "while it has members connected straight to the broker")
        if answer.member_epoch < 0:
            if request_epoch < 0:  # the client left: its leave is acknowledged
                return ConsumerGroupHeartbeatResponse(member_id=self.member_id,
                                                      member_epoch=request_epoch)
            return ConsumerGroupHeartbeatResponse(
                error_code=int(ErrorCode.UNKNOWN_MEMBER_ID), member_id=self.member_id,
                error_message=f"the member left the broker's group {self.group_id}; rejoin")
        shown = {t: frozenset(p) for t, p in (answer.assignment or {}).items() if p}
        assignment: list[TopicPartitions] | None = None
        if (request_epoch == 0 or self.sent != (answer.member_epoch, shown)
                or request_epoch != answer.member_epoch):
            assignment = [TopicPartitions(self.topics[name].topic_id, sorted(parts))
                          for name, parts in sorted(shown.items()) if name in self.topics]
            self.sent = (answer.member_epoch, shown)
        return ConsumerGroupHeartbeatResponse(
            member_id=self.member_id, member_epoch=answer.member_epoch,
            heartbeat_interval_ms=answer.heartbeat_interval_ms, assignment=assignment)

    def commit_partitions_ok(self, names: Mapping[str, Iterable[int]]) -> bool:
        """Whether every partition is the member's at its generation: assigned to it, or owned
        and kept through the join of a cooperative rebalance (revoked, not yet handed on)."""
        machine = self.machine
        mine = {t: set(p) for t, p in machine.assignment.items()}
        for t, p in machine.owned_at_join.items():
            mine.setdefault(t, set()).update(p)
        return all(set(parts) <= mine.get(topic, set()) for topic, parts in names.items())

    # -- the task ---------------------------------------------------------------------------

    def stop_quietly(self, why: str) -> None:
        """End the task without a word to the broker or the client (the engine adopted the
        member: its broker membership was removed with the group's)."""
        self.ended = why
        self._scope.cancel()

    async def run(self) -> None:
        with self._scope:
            await self._run()
        await self._close_links()

    async def _run(self) -> None:
        settings = self.settings
        machine = self.machine
        async with trio.open_nursery() as nursery:
            while True:
                if not self.suspended:
                    self._dispatch(nursery)
                if machine.state is BridgeState.LEFT and not self._control_busy:
                    break
                now = trio.current_time()
                session_end = self.last_seen + settings.client_session_ms / 1000
                if now >= session_end and machine.state is not BridgeState.LEAVING:
                    metrics.BRIDGED_MEMBERS.labels("expired").inc()
                    self.leave("its client sent no heartbeat within its session")
                    self.last_seen = float("inf")
                    continue
                due = machine.next_deadline_ms
                if due is not None and due <= self.now_ms():
                    self.feed(machine.poll(self.now_ms()))
                    continue
                deadline = session_end
                if due is not None:
                    deadline = min(deadline, due / 1000)
                if machine.leader and machine.state is BridgeState.STABLE:
                    if now >= self._next_refresh:
                        self._next_refresh = now + settings.metadata_refresh_s
                        nursery.start_soon(self._refresh_counts)
                    deadline = min(deadline, self._next_refresh)
                self._wake = trio.Event()
                if self._queue and not self.suspended:
                    continue
                with trio.move_on_at(deadline):
                    await self._wake.wait()
            nursery.cancel_scope.cancel()

    def _dispatch(self, nursery: trio.Nursery) -> None:
        queue, self._queue = self._queue, []
        for request in queue:
            if isinstance(request, HeartbeatRequest):
                nursery.start_soon(self._heartbeat, request)
                continue
            if self._control_scope is not None:
                # only a LeaveGroup replaces a request in flight (a JoinGroup still waiting):
                # its answer would be stale anyway
                self._control_scope.cancel()
            scope = self._control_scope = trio.CancelScope()
            self._control_busy += 1
            nursery.start_soon(self._control_request, request, scope)

    async def _control_request(self, request: BrokerRequest, scope: trio.CancelScope) -> None:
        release = self.at_broker.track()  # from dispatch: a conversion's drain waits for it
        try:
            with scope:
                if isinstance(request, JoinGroupRequest):
                    await self._join(request)
                elif isinstance(request, LeaderSyncGroupRequest):
                    await self._sync(request)
                elif isinstance(request, LeaveGroupRequest):
                    await self._leave(request)
        finally:
            release()
            self._control_busy -= 1
            self._wake.set()

    async def _links(self) -> tuple[BrokerLink, BrokerLink]:
        async with self._links_lock:  # the heartbeat and the control request may both ask
            return await self._links_now()

    async def _links_now(self) -> tuple[BrokerLink, BrokerLink]:
        if self.coordinator is None or self._control is None or self._heartbeats is None:
            deadline = trio.current_time() + self.settings.connect_timeout
            _node, address = await find_coordinator(self._pool, self._bootstrap, self.group_id,
                                                     deadline)
            if address != self.coordinator or self._control is None:
                await self._close_links()
                wait = max(JOIN_WAIT_SECONDS, self.machine.rebalance_timeout_ms / 1000)
                self._control = self._pool.dedicated(address,
                                                     wait + self.settings.connect_timeout)
                self._heartbeats = self._pool.dedicated(
                    address, self.settings.session_timeout_ms / 1000)
            self.coordinator = address
        assert self._control is not None and self._heartbeats is not None
        return self._control, self._heartbeats

    async def _close_links(self) -> None:
        links = [link for link in (self._control, self._heartbeats) if link is not None]
        self._control = self._heartbeats = None
        with trio.CancelScope(shield=True):
            for link in links:
                await link.aclose()

    async def _send(self, api_key: ApiKey, version: int, value: dict[str, Any], *,
                    heartbeat: bool = False) -> dict[str, Any] | None:
        """One request to the group's coordinator; None if it could not be reached (the
        coordinator is looked up again before the next one, after a pause)."""
        while self.suspended:  # dispatched before the suspension: sent after it, if at all
            await self._resumed.wait()
        release = self.at_broker.track()
        try:
            control, heartbeats = await self._links()
            link = heartbeats if heartbeat else control
            return await link.request(api_key, version, value, client_id=self.machine.client_id)
        except (UpstreamError, CoordinatorUnavailable) as exc:
            release()
            log.info("group %s: bridged member %s: %s failed: %s", self.group_id,
                     self.member_id, api_key.name, exc)
            self.coordinator = None
            await trio.sleep(RETRY_SECONDS)
            return None
        finally:
            release()

    async def _moved(self, error: int) -> None:
        if error in COORDINATOR_MOVED:
            self.coordinator = None
            await trio.sleep(RETRY_SECONDS)

    async def _join(self, request: JoinGroupRequest) -> None:
        first = request.protocols[0].subscription if request.protocols else None
        await self.learn_topics(first.topics if first is not None else ())
        response = await self._send(ApiKey.JOIN_GROUP, JOIN_VERSION, join_value(request))
        if response is None:
            answer = BrokerJoinAnswer(error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        else:
            await self._moved(response["error_code"])
            answer = join_answer(response)
        counts: dict[str, int] = {}
        if (answer.error_code == ErrorCode.NONE and answer.leader == answer.member_id
                and self.on_leader is not None):
            self.on_leader(self.group_id, answer.generation_id,
                           frozenset(m.member_id for m in answer.members))
        if answer.error_code == ErrorCode.NONE and answer.leader == answer.member_id:
            names = {t for m in answer.members for t in m.subscription.topics}
            await self.learn_topics(names, fresh=True)
            counts = {n: m.partitions for n, m in self.topics.items() if n in names}
            self._counts = dict(counts)
            self._next_refresh = trio.current_time() + self.settings.metadata_refresh_s
        self.feed(self.machine.on_join_answer(answer, counts, self.now_ms()))

    async def _sync(self, request: LeaderSyncGroupRequest) -> None:
        response = await self._send(ApiKey.SYNC_GROUP, SYNC_VERSION, {
            "group_id": request.group_id, "generation_id": request.generation_id,
            "member_id": request.member_id, "group_instance_id": request.group_instance_id,
            "assignments": [{"member_id": member_id, "assignment": encode_assignment(a)}
                            for member_id, a in request.assignments]})
        if response is None:
            answer = SyncGroupResponse(error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        else:
            await self._moved(response["error_code"])
            answer = sync_answer(response)
            if answer.assignment is not None:
                await self.learn_topics(t for t, _ in answer.assignment.partitions)
        self.feed(self.machine.on_sync_answer(answer, self.now_ms()))

    async def _heartbeat(self, request: HeartbeatRequest) -> None:
        response = await self._send(ApiKey.HEARTBEAT, HEARTBEAT_VERSION, {
            "group_id": request.group_id, "generation_id": request.generation_id,
            "member_id": request.member_id, "group_instance_id": request.group_instance_id},
            heartbeat=True)
        error = (int(ErrorCode.COORDINATOR_NOT_AVAILABLE) if response is None
                 else response["error_code"])
        if error in COORDINATOR_MOVED:
            self.coordinator = None
        self.feed(self.machine.on_heartbeat_answer(HeartbeatResponse(error_code=error),
                                                   self.now_ms()))

    async def _leave(self, request: LeaveGroupRequest) -> None:
        with trio.move_on_after(LEAVE_SECONDS):
            await self._send(ApiKey.LEAVE_GROUP, LEAVE_VERSION, {
                "group_id": request.group_id,
                "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id}
                            for m in request.members]})
        # answered or not: the broker drops the member within its session at the latest
        self.feed(self.machine.on_leave_answer(self.now_ms()))

    async def learn_topics(self, names: Iterable[str], *, fresh: bool = False) -> None:
        """Topic ids and partition counts of ``names`` (those not known yet, or all)."""
        wanted = frozenset(n for n in names if fresh or n not in self.topics)
        if not wanted:
            return
        for address in (*((self.coordinator,) if self.coordinator else ()), *self._bootstrap):
            try:
                with trio.fail_after(self.settings.connect_timeout + 5):
                    response = await self._pool.link(address).request(
                        ApiKey.METADATA, METADATA_VERSION, metadata_request(sorted(wanted)))
            except (UpstreamError, trio.TooSlowError) as exc:
                log.info("group %s: topic metadata from %s:%d failed: %s", self.group_id,
                         *address, exc)
                continue
            for meta in image_from_metadata(response).by_name.values():
                self.topics[meta.name] = meta
            return

    async def _refresh_counts(self) -> None:
        """As the leader: rejoin when the partition counts of the group's topics changed."""
        names = list(self._counts)
        await self.learn_topics(names, fresh=True)
        counts = {n: self.topics[n].partitions for n in names if n in self.topics}
        if counts != self._counts:
            self._counts = counts
            self.feed(self.machine.metadata_changed(self.now_ms()))


def subscription_bytes(subscription: ClassicSubscription | None) -> bytes:
    if subscription is None:
        return b""
    return messages.encode_data("ConsumerProtocolSubscription", subscription.version, {
        "topics": list(subscription.topics), "user_data": subscription.user_data,
        "owned_partitions": [{"topic": t, "partitions": list(p)}
                             for t, p in subscription.owned_partitions],
        "generation_id": subscription.generation_id, "rack_id": subscription.rack_id})


def join_value(request: JoinGroupRequest) -> dict[str, Any]:
    return {
        "group_id": request.group_id, "session_timeout_ms": request.session_timeout_ms,
        "rebalance_timeout_ms": request.rebalance_timeout_ms, "member_id": request.member_id,
        "group_instance_id": request.group_instance_id, "protocol_type": request.protocol_type,
        "protocols": [{"name": p.name, "metadata": subscription_bytes(p.subscription)}
                      for p in request.protocols]}


def join_answer(response: Mapping[str, Any]) -> BrokerJoinAnswer:
    members = []
    for m in response.get("members") or ():
        subscription = parse_subscription(m["metadata"]) or ClassicSubscription(0, ())
        members.append(ClassicGroupMember(m["member_id"], m.get("group_instance_id"),
                                          subscription))
    return BrokerJoinAnswer(error_code=response["error_code"],
                            generation_id=response["generation_id"],
                            protocol_name=response.get("protocol_name"),
                            leader=response.get("leader") or "",
                            member_id=response.get("member_id") or "", members=members)


def sync_answer(response: Mapping[str, Any]) -> SyncGroupResponse:
    error = response["error_code"]
    if error != ErrorCode.NONE:
        return SyncGroupResponse(error_code=error)
    data = response.get("assignment") or b""
    if not data:
        return SyncGroupResponse(assignment=ClassicAssignment(0, ()))
    try:
        assignment, _user_data = parse_assignment(data)
    except ValueError:
        return SyncGroupResponse(error_code=int(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
    return SyncGroupResponse(assignment=assignment)


class Bridges:
    """Every bridged member of this sidecar, by (group id, KIP-848 member id)."""

    def __init__(self, settings: BridgeSettings, pool: Callable[[], LinkPool],
                 bootstrap: Sequence[Address]) -> None:
        """``pool``: the service's pool of broker links (read when it is used)."""
        self.settings = settings
        self._pool = pool
        self._bootstrap = tuple(bootstrap)
        self.members: dict[tuple[str, str], Bridge] = {}
        """Bounded by ``max-members``; a member is forgotten once its task ended."""
        self._groups: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None
        self.stopping = False
        self.on_leader: Callable[[str, int, frozenset[str]], None] | None = None
        """Told when a bridged member here is made the broker group's leader (the online
        upgrade's detection, :meth:`~.upgrade.Upgrades.note_leader`)."""
        self.image: Callable[[], TopicsImage] = lambda: TopicsImage.of([])
        """The topics this sidecar watches (the service's), which regexes are resolved
        against."""
        metrics.BRIDGED_ACTIVE.set_function(lambda: len(self.members))

    @property
    def pool(self) -> LinkPool:
        return self._pool()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The nursery the members' tasks run in (until the service stops)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def has_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def member(self, group_id: str, member_id: str) -> Bridge | None:
        return self.members.get((group_id, member_id))

    def group_size(self, group_id: str) -> int:
        return self._groups.get(group_id, 0)

    # -- heartbeats -------------------------------------------------------------------------

    async def heartbeat(self, request: ConsumerGroupHeartbeatRequest, wait_s: float
                        ) -> ConsumerGroupHeartbeatResponse | None:
        """A heartbeat of a bridged member (None: ``request`` is not one)."""
        bridge = self.members.get((request.group_id, request.member_id))
        if bridge is None:
            return None
        return await self._serve(bridge, request, wait_s)

    async def join(self, request: ConsumerGroupHeartbeatRequest, wait_s: float
                   ) -> ConsumerGroupHeartbeatResponse:
        """A KIP-848 client joining a group in the broker phase: a new bridged member."""
        if self.stopping or self._nursery is None:
            return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE, "groupgate is stopping")
        if len(self.members) >= self.settings.max_members:
            return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                          f"groupgate runs its maximum of {self.settings.max_members} members "
                          "(max-members)")
        member_id = request.member_id or random_member_id()
        group_id = request.group_id
        protocol_type = protocol = ""
        with trio.move_on_after(max(wait_s, DESCRIBE_SECONDS)):
            protocol_type, protocol = await self._current_protocol(group_id)
            if protocol_type not in ("", CONSUMER_PROTOCOL_TYPE):
                metrics.BRIDGED_MEMBERS.labels("failed").inc()
                return _error(ErrorCode.GROUP_ID_NOT_FOUND,
                              f"the broker's group {group_id} is of protocol type "
                              f"{protocol_type}, not a consumer group")
        key = (group_id, member_id)
        if key in self.members:  # the same member joined again meanwhile
            return await self._serve(self.members[key], request, wait_s)
        regex = request.subscribed_topic_regex or None
        resolved = (self.resolve(regex, request.topic_rights, frozenset())
                    if regex is not None else frozenset())
        machine = BridgedMember(
            group_id=group_id, fleet_address=self.settings.fleet_address, member_id=member_id,
            client_id=request.client_id,
            subscribed_names=sorted(resolved) if regex is not None
            else request.subscribed_topic_names or (),
            session_timeout_ms=self.settings.session_timeout_ms,
            rebalance_timeout_ms=max(request.rebalance_timeout_ms,
                                     self.settings.session_timeout_ms),
            current_protocol=protocol or None, group_instance_id=request.instance_id,
            rack_id=request.rack_id)
        bridge = Bridge(machine, self.settings, self.pool, self._bootstrap)
        bridge.on_leader = self.on_leader
        bridge.regex, bridge.rights, bridge.resolved = regex, request.topic_rights, resolved
        self._know(bridge, resolved)
        self.members[key] = bridge
        self._groups[group_id] = self._groups.get(group_id, 0) + 1
        metrics.BRIDGED_MEMBERS.labels("started").inc()
        log.info("group %s: KIP-848 member %s (client %s) bridged into the broker's group%s",
                 group_id, member_id, request.client_id or "-",
                 "" if regex is None else f" (regex {regex[:200]!r}: {len(resolved)} topic(s))")
        self._nursery.start_soon(self._run_one, bridge)
        return await self._serve(bridge, _with_member_id(request, member_id), wait_s)

    def carry_over(self, group_id: str, member: ReleasedMember, protocol: str | None,
                   topics: Mapping[str, TopicMetadata]) -> None:
        """A KIP-848 member of a group the engine handed back (:mod:`.release`): a bridged
        member that keeps showing the client its epoch and the partitions it owns; it joins
        the broker's group at :meth:`start_carried`, once the lock has left it. ``topics``:
        the engine's topics by name (the client's answers name partitions by topic id)."""
        key = (group_id, member.member_id)
        if self.stopping or self._nursery is None or key in self.members:
            return
        if len(self.members) >= self.settings.max_members:
            log.warning("group %s: KIP-848 member %s not carried over: max-members reached; "
                        "it rejoins", group_id, member.member_id)
            return
        machine = BridgedMember(
            group_id=group_id, fleet_address=self.settings.fleet_address,
            member_id=member.member_id, client_id=member.client_id,
            subscribed_names=member.subscribed_topic_names,
            session_timeout_ms=self.settings.session_timeout_ms,
            rebalance_timeout_ms=max(member.rebalance_timeout_ms,
                                     self.settings.session_timeout_ms),
            current_protocol=protocol, group_instance_id=member.instance_id,
            rack_id=member.rack_id, epoch=member.member_epoch,
            owned={t: list(p) for t, p in member.owned})
        bridge = Bridge(machine, self.settings, self.pool, self._bootstrap)
        for name in {*member.subscribed_topic_names, *(t for t, _ in member.owned)}:
            if name in topics:
                bridge.topics[name] = topics[name]
        self.members[key] = bridge
        self._groups[group_id] = self._groups.get(group_id, 0) + 1
        metrics.BRIDGED_MEMBERS.labels("carried").inc()
        log.info("group %s: KIP-848 member %s (client %s) carried over at epoch %d with %d "
                 "partition(s)", group_id, member.member_id, member.client_id or "-",
                 member.member_epoch, sum(len(p) for _, p in member.owned))
        self._nursery.start_soon(self._run_one, bridge)

    def start_carried(self, group_id: str) -> int:
        """The broker's group is free: the members carried over join it (cooperative) or
        have their clients release first (eager). Returns how many there are."""
        started = 0
        for (group, _member_id), bridge in list(self.members.items()):
            if group == group_id and bridge.machine.carried:
                bridge.feed(bridge.machine.carry_over(bridge.now_ms()))
                started += 1
        return started

    async def _current_protocol(self, group_id: str) -> tuple[str, str]:
        """(protocol type, protocol name) of the broker's group now ("" where unknown)."""
        try:
            _node, address = await find_coordinator(
                self.pool, self._bootstrap, group_id,
                trio.current_time() + self.settings.connect_timeout)
            response = await self.pool.link(address).request(
                ApiKey.DESCRIBE_GROUPS, DESCRIBE_VERSION,
                {"groups": [group_id], "include_authorized_operations": False})
        except (UpstreamError, CoordinatorUnavailable) as exc:
            log.info("group %s: could not describe the broker's group: %s", group_id, exc)
            return "", ""
        groups = response.get("groups") or []
        if len(groups) != 1 or groups[0].get("error_code"):
            return "", ""
        return groups[0].get("protocol_type") or "", groups[0].get("protocol_data") or ""

    # -- regex subscriptions ---------------------------------------------------------------

    def resolve(self, regex: str, rights: TopicRights | None, had: frozenset[str]
                ) -> frozenset[str]:
        """The names ``regex`` resolves to for a client with ``rights`` (a match checked and
        not allowed is left out; one not checked stays only if the member ``had`` it)."""
        matches = resolve(regex, self.image())
        if rights is None:
            return matches
        unchecked = matches - rights.checked
        return (matches & rights.allowed) | (unchecked & had)

    def _regex_names(self, bridge: Bridge, request: ConsumerGroupHeartbeatRequest
                     ) -> list[str] | None:
        """The names to tell the machine of a regex member (its regex resolved again), when
        they changed; None: no change (or not a regex member)."""
        regex = request.subscribed_topic_regex
        if regex is not None:  # a new regex, or "" (back to names)
            if regex:
                validate_regex(regex)
            bridge.regex = regex or None
            if bridge.regex is None:
                bridge.resolved = frozenset()
                return None
        if request.topic_rights is not None:
            bridge.rights = request.topic_rights
        if bridge.regex is None:
            return None
        resolved = self.resolve(bridge.regex, bridge.rights, bridge.resolved)
        if resolved == bridge.resolved:
            return None
        log.info("group %s: the regex of bridged member %s resolves to %d topic(s) now "
                 "(%d before): it rejoins with them", bridge.group_id, bridge.member_id,
                 len(resolved), len(bridge.resolved))
        bridge.resolved = resolved
        self._know(bridge, resolved)
        return sorted(resolved)

    def _know(self, bridge: Bridge, names: Iterable[str]) -> None:
        by_name = self.image().by_name
        for name in names:
            if name in by_name:
                bridge.topics[name] = by_name[name]

    def has_regex(self) -> bool:
        """Whether a member here subscribes by regex (the sidecar then watches every topic)."""
        return any(b.regex is not None for b in self.members.values())

    def regex_topics_to_check(self, group_id: str, member_id: str) -> frozenset[str] | None:
        """The topics whose DESCRIBE the heartbeat of bridged member ``member_id`` should
        bring (the router's authorization stage): its regex's matches, when one is not checked
        yet; None when nothing is new."""
        bridge = self.members.get((group_id, member_id))
        if bridge is None or bridge.regex is None:
            return None
        matches = resolve(bridge.regex, self.image())
        if bridge.rights is not None and matches <= bridge.rights.checked:
            return None
        return matches

    def regexes(self, group_id: str) -> dict[str, str]:
        """(broker member id -> regex) of the group's members here that subscribe by regex:
        the engine adopts them subscribed by it (:mod:`.upgrade`)."""
        return {b.machine.broker_member_id: b.regex for b in self.of_group(group_id)
                if b.regex is not None and b.machine.broker_member_id}

    async def _serve(self, bridge: Bridge, request: ConsumerGroupHeartbeatRequest,
                     wait_s: float) -> ConsumerGroupHeartbeatResponse:
        machine = bridge.machine
        if (self.stopping or bridge.told_to_let_go) and request.member_epoch >= 0:
            # the proxy is stopping: the client lets go of its partitions before the bridged
            # member leaves the broker's group (and rejoins, elsewhere or later)
            bridge.told_to_let_go = True
            bridge.leave("groupgate is stopping")
            return _error(ErrorCode.UNKNOWN_MEMBER_ID, "groupgate is stopping; rejoin",
                          bridge.member_id)
        if machine.state not in (BridgeState.LEAVING, BridgeState.LEFT):
            bridge.last_seen = trio.current_time()
        bridge.client_epoch = request.member_epoch
        owned = (None if request.topic_partitions is None
                 else bridge.partitions_by_name(request.topic_partitions))
        names: Sequence[str] | None
        try:
            names = self._regex_names(bridge, request)
        except GroupError as exc:  # an invalid new regex: the member stays as it was
            return _error(exc.code, exc.message, bridge.member_id)
        if names is None and bridge.regex is None:
            # (a regex member's names are its regex's: the empty list its client sends
            # beside the regex says nothing)
            names = request.subscribed_topic_names
        if names is not None:
            await bridge.learn_topics(names)
        if request.member_epoch == -1 or request.member_epoch == -2:
            metrics.BRIDGED_MEMBERS.labels("left").inc()
        bridge.feed(machine.client_heartbeat(
            ClientHeartbeat(request.member_epoch, owned,
                            None if names is None else list(names)), bridge.now_ms()))
        answer = machine.client_answer()
        with trio.move_on_after(wait_s):
            while answer is None and not bridge.ended:
                await bridge.changed.wait()
                answer = machine.client_answer()
        if answer is None:
            return _error(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                          f"groupgate is still joining the broker's group {request.group_id} "
                          "for this member", bridge.member_id)
        return bridge.response(answer, request.member_epoch)

    async def _run_one(self, bridge: Bridge) -> None:
        """One member's task: a failure ends that member only (its client is told to rejoin
        by its next heartbeat, which finds no member)."""
        try:
            await bridge.run()
            bridge.ended = bridge.ended or "left"
        except Exception as exc:
            log.exception("group %s: bridged member %s failed unexpectedly; it is forgotten",
                          bridge.group_id, bridge.member_id)
            metrics.BRIDGED_MEMBERS.labels("failed").inc()
            bridge.ended = f"unexpected {type(exc).__name__}"
            await _leave_quietly(bridge)
        finally:
            self._forget(bridge)

    def _forget(self, bridge: Bridge) -> None:
        key = (bridge.group_id, bridge.member_id)
        if self.members.get(key) is bridge:
            del self.members[key]
            left = self._groups.get(bridge.group_id, 1) - 1
            if left > 0:
                self._groups[bridge.group_id] = left
            else:
                self._groups.pop(bridge.group_id, None)
        bridge.ended = bridge.ended or "forgotten"
        bridge.feed(())

    # -- the online upgrade (:mod:`.upgrade`) -------------------------------------------------

    def of_group(self, group_id: str) -> list[Bridge]:
        return [b for (g, _m), b in self.members.items() if g == group_id]

    def suspend(self, group_id: str) -> int:
        """The group is being converted: its members send nothing more to the broker (what
        their machines ask for waits). Returns how many there are."""
        bridges = self.of_group(group_id)
        for bridge in bridges:
            bridge.suspended = True
        return len(bridges)

    async def drained(self, group_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for the group's members' requests at the broker to end."""
        deadline = trio.current_time() + timeout
        for bridge in self.of_group(group_id):
            if not await bridge.at_broker.drained(max(0.0, deadline - trio.current_time())):
                return False
        return True

    def resume(self, group_id: str) -> None:
        """The conversion did not happen: the members go on in the broker's group."""
        for bridge in self.of_group(group_id):
            bridge.suspended = False
            resumed, bridge._resumed = bridge._resumed, trio.Event()
            resumed.set()
            bridge.feed(())

    def unconvertible(self, group_id: str, generation: int) -> str | None:
        """Why the group's members here cannot be adopted at ``generation`` now (None: they
        can): each must be stable in that generation, with nothing of a rebalance pending
        (a cooperative second round, a changed subscription), and its client must have
        heartbeated at that epoch (the epoch the engine adopts it at)."""
        for bridge in self.of_group(group_id):
            machine = bridge.machine
            if (machine.state is not BridgeState.STABLE or machine.followup
                    or machine.subscribed != machine.joined_with
                    or not machine.epoch == machine.generation == generation):
                return (f"bridged member {bridge.member_id} is not stable at generation "
                        f"{generation} ({machine.state.name})")
            if bridge.client_epoch != generation:
                return (f"the client of bridged member {bridge.member_id} has not heartbeated "
                        f"at epoch {generation} yet")
        return None

    def convert_away(self, group_id: str) -> int:
        """The engine adopted the group, these members included (under their clients' member
        ids): their tasks end without a LeaveGroup (the conversion removed their broker
        memberships) and their clients' next heartbeats go to the engine. Returns how many."""
        bridges = self.of_group(group_id)
        for bridge in bridges:
            bridge.stop_quietly("converted")
            metrics.BRIDGED_MEMBERS.labels("converted").inc()
            self._forget(bridge)
        if bridges:
            log.info("group %s: %d bridged member(s) adopted by the engine with their clients' "
                     "member ids", group_id, len(bridges))
        return len(bridges)

    def timeouts(self, group_id: str) -> dict[str, list[int]]:
        """(broker member id -> [session, rebalance timeout]) of the group's members here, as
        their JoinGroups asked (for the engine's adoption: DescribeGroups does not show them)."""
        return {b.machine.broker_member_id: [self.settings.client_session_ms,
                                             b.machine.rebalance_timeout_ms]
                for b in self.of_group(group_id) if b.machine.broker_member_id}

    # -- offsets ----------------------------------------------------------------------------

    def commit_target(self, group_id: str, member_id: str, epoch: int,
                      partitions: Iterable[tuple[str | None, TopicId | None, int]]
                      ) -> tuple[str, int] | ErrorCode | None:
        """Where a bridged client's commit goes: (broker member id, generation) of its bridged
        member, or the error to fail it with; None if ``member_id`` is not bridged here.

        The member epoch must be the bridged member's current one, which must still be the
        broker generation the member is in (else the broker has moved on: the client retries
        once its heartbeat told it the new epoch), and every partition must be the member's
        at that generation (:meth:`Bridge.commit_partitions_ok`). A commit is stamped once and
        never again: under another generation the broker refuses it."""
        bridge = self.members.get((group_id, member_id))
        if bridge is None:
            return None
        machine = bridge.machine
        if self.stopping or bridge.told_to_let_go or machine.state in (
                BridgeState.LEAVING, BridgeState.LEFT):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if epoch != machine.epoch or machine.epoch <= 0:
            return ErrorCode.STALE_MEMBER_EPOCH
        if machine.generation != machine.epoch or not machine.broker_member_id:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS  # a rebalance is under way
        by_name: dict[str, list[int]] = {}
        ids = {m.topic_id: m.name for m in bridge.topics.values()}
        for name, topic_id, partition in partitions:
            resolved = name or (ids.get(topic_id) if topic_id is not None else None)
            if resolved is None:
                return ErrorCode.STALE_MEMBER_EPOCH
            by_name.setdefault(resolved, []).append(partition)
        if not bridge.commit_partitions_ok(by_name):
            return ErrorCode.STALE_MEMBER_EPOCH
        return machine.broker_member_id, machine.generation

    def commit_refused(self, group_id: str, member_id: str, generation: int) -> None:
        """The broker refused a commit stamped with ``generation``: the member hears of a
        rebalance or of its loss at its next heartbeat, which is sent now."""
        bridge = self.members.get((group_id, member_id))
        if bridge is not None and bridge.machine.generation == generation:
            bridge.machine.next_heartbeat_ms = 0
            bridge.feed(())

    def fetch_error(self, group_id: str, member_id: str, epoch: int) -> ErrorCode | None:
        """Kafka's OffsetFetch member check for a bridged client (None: not bridged here)."""
        bridge = self.members.get((group_id, member_id))
        if bridge is None:
            return None
        if epoch != bridge.machine.epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    # -- stopping ---------------------------------------------------------------------------

    async def let_go(self, timeout_s: float) -> int:
        """The proxy is stopping: every bridged client is told to let go of its partitions at
        its next heartbeat (UNKNOWN_MEMBER_ID), after which its member leaves the broker's
        group; waits until all have been told or ``timeout_s`` passed; the number untold."""
        self.stopping = True
        with trio.move_on_after(timeout_s):
            while any(not b.told_to_let_go for b in self.members.values()):
                await trio.sleep(0.05)
        return sum(1 for b in self.members.values() if not b.told_to_let_go)

    async def aclose(self) -> None:
        """Every bridged member still there leaves the broker's group now."""
        self.stopping = True
        bridges = list(self.members.values())
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for bridge in bridges:
                    nursery.start_soon(_leave_quietly, bridge)
        for bridge in bridges:
            if not bridge.ended:
                metrics.BRIDGED_MEMBERS.labels("stopped").inc()
            self._forget(bridge)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


async def _leave_quietly(bridge: Bridge) -> None:
    """LeaveGroup for the member if it holds a broker member id (best effort, bounded)."""
    machine = bridge.machine
    if not machine.broker_member_id or machine.state is BridgeState.LEFT:
        return
    with trio.CancelScope(shield=True), trio.move_on_after(LEAVE_SECONDS):
        try:
            _node, address = await find_coordinator(
                bridge._pool, bridge._bootstrap, bridge.group_id,
                trio.current_time() + bridge.settings.connect_timeout)
            await bridge._pool.link(address).request(
                ApiKey.LEAVE_GROUP, LEAVE_VERSION,
                {"group_id": bridge.group_id, "members": [
                    {"member_id": machine.broker_member_id,
                     "group_instance_id": machine.group_instance_id}]},
                client_id=machine.client_id)
        except (UpstreamError, CoordinatorUnavailable) as exc:
            log.info("group %s: bridged member %s could not leave: %s", bridge.group_id,
                     bridge.member_id, exc)


def _error(code: ErrorCode, message: str, member_id: str | None = None
           ) -> ConsumerGroupHeartbeatResponse:
    return ConsumerGroupHeartbeatResponse(error_code=int(code), error_message=message,
                                          member_id=member_id)


def _with_member_id(request: ConsumerGroupHeartbeatRequest, member_id: str
                    ) -> ConsumerGroupHeartbeatRequest:
    if request.member_id == member_id:
        return request
    return dataclasses.replace(request, member_id=member_id)
