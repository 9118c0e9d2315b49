"""The coordinator service: drives the sans-I/O group engine from trio.

One :class:`CoordinatorService` per proxy process owns the
:class:`~translation.coordinator.GroupCoordinator` and everything that gives it a clock and a
network:

* time: ``now_ms`` is trio's monotonic clock in milliseconds; a timer task sleeps until the
  engine's :meth:`~translation.coordinator.GroupCoordinator.next_deadline` (or until a new
  timer is armed) and calls ``tick`` (session timeouts, rebalance timeouts, deferred target
  computations, expiry of empty groups);
* serialization: engine calls are plain synchronous calls made from trio tasks of one thread,
  and none of them awaits, so each runs to completion before another starts: no lock needed;
* taking a group over: the first ConsumerGroupHeartbeat with epoch 0 for a group id the proxy
  does not coordinate yet starts a :class:`~proxy.coordination.membership.BrokerMembership`;
  only once the proxy holds the broker's classic group of that id does the engine see the
  heartbeat. If the broker's group has members connected straight to the broker, the takeover
  fails and the heartbeat gets COORDINATOR_NOT_AVAILABLE (retriable: the client keeps trying
  until the direct members are gone);
* topics: a :class:`~proxy.coordination.topics.TopicWatcher` feeds topic metadata into
  ``update_topics``; a joining member naming a topic the image does not know (or bringing a
  new regex) waits for one refresh first, so its first assignment already covers the topic;
* effects: a group that expired (empty past ``group-empty-expiry-ms``) leaves the broker's
  group; at shutdown every broker group is left so that direct clients can take over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from proxy.config import ProxyConfig
from proxy.coordination.links import Address, LinkPool
from proxy.coordination.membership import BrokerMembership
from proxy.coordination.topics import TopicWatcher
from translation.assignors import BUILTIN_ASSIGNORS
from translation.config import GroupConfig
from translation.coordinator import GroupCoordinator
from translation.effects import (
    Effect,
    GroupCreated,
    GroupExpired,
    MemberFenced,
    MemberJoined,
    MemberLeft,
    TargetAssignmentComputed,
    TargetAssignmentFailed,
    TimerArmed,
)
from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from translation.topics import TopicsImage

log = logging.getLogger("groupgate.coordination")

TOPIC_WAIT_SECONDS = 3.0
"""How long a joining member naming an unknown topic waits for a metadata refresh."""
TAKEOVER_WAIT_SECONDS = 10.0
"""How long a joining heartbeat waits for the broker-side membership before it is answered
with the retriable COORDINATOR_LOAD_IN_PROGRESS (the membership keeps trying)."""


def group_config(config: ProxyConfig) -> GroupConfig:
    return GroupConfig(
        assignors=[cls() for cls in BUILTIN_ASSIGNORS],
        session_timeout_ms=config.group_session_timeout_ms,
        heartbeat_interval_ms=config.group_heartbeat_interval_ms,
        empty_group_expiry_ms=config.group_empty_expiry_ms,
    )


class CoordinatorService:
    """The engine plus its timers, topic metadata and broker-side memberships."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.engine = GroupCoordinator(group_config(config))
        self.pool = LinkPool(connect_timeout=config.connect_timeout,
                             request_timeout=config.connect_timeout + 20,
                             max_frame_bytes=config.max_frame_bytes)
        self.memberships: dict[str, BrokerMembership] = {}
        self.topics = TopicWatcher(self.pool, config.upstream,
                                   config.group_metadata_refresh_ms / 1000, self._wanted_topics,
                                   self._install_topics)
        self.node_address: Callable[[int | None], Address] = lambda _node: config.upstream[0]
        """Upstream address of a broker node (the server's directory; set by the app)."""
        self._pending_names: dict[str, int] = {}
        self._pending_regex = 0
        self._timer_wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, watch_topics: bool = True,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the timer task and (unless ``watch_topics`` is off) the topic watcher."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._timers)
            if watch_topics:
                nursery.start_soon(self.topics.run)
            task_status.started()

    async def aclose(self) -> None:
        """Leave every broker-side group (so direct clients can take over) and stop."""
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for membership in list(self.memberships.values()):
                    nursery.start_soon(membership.leave)
            self.memberships.clear()
            await self.pool.aclose()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    # -- which groups the proxy coordinates ---------------------------------------------------

    def coordinates(self, group_id: str) -> bool:
        membership = self.memberships.get(group_id)
        return membership is not None and membership.established

    def membership(self, group_id: str) -> BrokerMembership | None:
        membership = self.memberships.get(group_id)
        return membership if membership is not None and membership.established else None

    @property
    def has_groups(self) -> bool:
        return bool(self.engine.groups)

    # -- ConsumerGroupHeartbeat ---------------------------------------------------------------

    async def heartbeat(self, request: ConsumerGroupHeartbeatRequest
                        ) -> ConsumerGroupHeartbeatResponse:
        group_id = request.group_id
        if request.member_epoch == 0 and group_id and group_id.strip():
            failure: str | None = None
            with trio.move_on_after(TAKEOVER_WAIT_SECONDS) as waiting:
                failure = await self._take_over(group_id)
            if waiting.cancelled_caught:
                # e.g. the broker waits for a stale member of a killed proxy to time out
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                    error_message=f"groupgate is still joining the broker's group {group_id}")
            if failure is not None:
                return ConsumerGroupHeartbeatResponse(
                    error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                    error_message=f"groupgate cannot coordinate group {group_id}: {failure}")
            await self._await_topics(request)
        elif request.member_epoch > 0 and self.engine.group(group_id) is None:
            # The group is unknown here (e.g. the proxy restarted and lost its state): the
            # member must rejoin with epoch 0. Kafka would say GROUP_ID_NOT_FOUND, which
            # clients treat as fatal; its coordinators never forget a group.
            return ConsumerGroupHeartbeatResponse(
                error_code=int(ErrorCode.UNKNOWN_MEMBER_ID),
                error_message=f"Group {group_id} is not coordinated here (any more); rejoin.")
        response, effects = self.engine.heartbeat(request, self.now_ms())
        self.apply(effects)
        names = request.subscribed_topic_names
        if names and any(n not in self.engine.image.by_name for n in names):
            assert self._nursery is not None
            self._nursery.start_soon(self.topics.refresh, TOPIC_WAIT_SECONDS)
        return response

    async def _take_over(self, group_id: str) -> str | None:
        """Hold the broker's group ``group_id``; returns why not, or None."""
        membership = self.memberships.get(group_id)
        if membership is None:
            assert self._nursery is not None
            membership = BrokerMembership(group_id, self.pool, self.config.upstream,
                                          connect_timeout=self.config.connect_timeout)
            self.memberships[group_id] = membership
            self._nursery.start_soon(membership.run)
        await membership.settled.wait()
        if membership.failure is not None:
            if self.memberships.get(group_id) is membership:
                del self.memberships[group_id]
            return membership.failure
        return None

    async def _await_topics(self, request: ConsumerGroupHeartbeatRequest) -> None:
        image = self.engine.image
        names = [n for n in request.subscribed_topic_names or () if n not in image.by_name]
        group = self.engine.group(request.group_id)
        regex = request.subscribed_topic_regex
        new_regex = bool(regex) and (group is None or regex not in group.regex_counts)
        if not names and not new_regex:
            return
        for n in names:
            self._pending_names[n] = self._pending_names.get(n, 0) + 1
        self._pending_regex += new_regex
        try:
            await self.topics.refresh(TOPIC_WAIT_SECONDS)
        finally:
            for n in names:
                left = self._pending_names[n] - 1
                if left:
                    self._pending_names[n] = left
                else:
                    del self._pending_names[n]
            self._pending_regex -= new_regex

    # -- engine effects, timers, topics -------------------------------------------------------

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, TimerArmed):
                self._timer_wake.set()
            elif isinstance(effect, GroupExpired):
                log.info("group %s: expired after staying empty", effect.group_id)
                membership = self.memberships.pop(effect.group_id, None)
                if membership is not None and self._nursery is not None:
                    self._nursery.start_soon(membership.leave)
            elif isinstance(effect, GroupCreated | MemberJoined | MemberLeft | MemberFenced
                            | TargetAssignmentComputed | TargetAssignmentFailed):
                log.info("%s", effect)

    async def _timers(self) -> None:
        while True:
            self._timer_wake = wake = trio.Event()
            deadline = self.engine.next_deadline()
            if deadline is None:
                await wake.wait()
            else:
                with trio.move_on_at((deadline + 1) / 1000):
                    await wake.wait()
            self.apply(self.engine.tick(self.now_ms()))

    def _wanted_topics(self) -> tuple[frozenset[str], bool]:
        names = set(self._pending_names)
        regex = self._pending_regex > 0
        for group in self.engine.groups.values():
            names.update(group.subscribed_names)
            regex = regex or bool(group.regex_counts)
        return frozenset(names), regex

    def _install_topics(self, image: TopicsImage) -> None:
        if image == self.engine.image:
            return
        self.apply(self.engine.update_topics(image, self.now_ms()))
