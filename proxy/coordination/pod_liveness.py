"""Pod-local liveness in the running proxy: from the client connections to a fenced member.

The signal itself is :class:`proxy.liveness.LivenessTracker` (docs/decisions/
0020-pod-local-liveness.md). This module feeds it and acts on what it declares:

* every client-facing :class:`~.routing.CoordinatingRouter` carries a :class:`ConnectionWatch`
  (its ``liveness`` hook): the connection's ApiVersions names its client, its group requests
  tie members to it; the server tells :meth:`PodLiveness.connection_closed` how the connection
  ended (by the client, or by the proxy: never a death then) and
  :meth:`PodLiveness.connection_refused` when it closed a new connection at once
  (``max-connections``, no broker reachable: a client that could not come back);
* :meth:`PodLiveness.run` declares the suspects whose grace passed and sends each to the
  group's holder: itself (:meth:`PodLiveness.member_gone`), or a protocol-3 sidecar over its
  fleet listener, with one ``FleetControl`` message ``MemberGone`` (:mod:`.fleet_control`,
  answered with an error code; decision record 0018, section 5). A message that cannot be
  delivered is dropped, never queued (the member's session timeout applies); a holder of fleet
  protocol 2 gets nothing;
* :meth:`PodLiveness.on_member_gone` answers ``MemberGone`` on the fleet listener.

The holder fences only while it coordinates the group (not interrupted, lease valid, not
stepping down or handing off), and only a member at the epoch observed
(:meth:`translation.coordinator.GroupCoordinator.fence_member`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from proxy import metrics
from proxy.codec.api_keys import ApiKey
from proxy.connection import Router
from proxy.coordination import fleet_control
from proxy.coordination.fleet import Address
from proxy.coordination.handler import GroupRequest
from proxy.coordination.peers import RELAY
from proxy.journal.clients import client_software
from proxy.liveness import Identity, LivenessTracker, Outcome, SeenMember
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.connection import Connection
    from proxy.coordination.service import CoordinatorService

log = logging.getLogger("groupgate.liveness")

MEMBER_GONE_PROTOCOL = 3
"""The lowest fleet protocol of a holder that is sent ``MemberGone``."""
SEND_SECONDS = 2.0
"""Longest a follower tries to deliver one ``MemberGone`` before dropping it."""
MAX_SENDING = 64
"""Messages being delivered at once; more are dropped (a crash of many members at once is
still covered by their session timeouts)."""
CLIENT_CLOSES = ("client closed the connection", "client connection failed")
"""How :attr:`Connection.closing_reason` starts when the client ended the connection."""


def closed_by_client(conn: Connection) -> bool:
    """Whether the client ended the connection (end of stream or reset), not the proxy."""
    reason = conn.closing_reason
    return (not conn.bad_input and not conn.draining and reason is not None
            and reason.startswith(CLIENT_CLOSES))


class ConnectionWatch:
    """What one client connection tells the tracker (the router's ``liveness`` hook)."""

    __slots__ = ("_host", "_liveness")

    def __init__(self, liveness: PodLiveness, client_host: str) -> None:
        self._liveness = liveness
        self._host = client_host
        liveness.tracker.opened(id(self))

    def api_versions(self, frame: memoryview, version: int) -> None:
        named = client_software(frame, version)
        if named is not None:
            client_id, name, software_version = named
            log.debug("a connection from %s named its client %r (%s/%s)", self._host,
                      client_id, name, software_version)
            self._liveness.tracker.identified(
                id(self), Identity(self._host, client_id, f"{name}/{software_version}"),
                self._liveness.now_ms())

    def group_request(self, request: GroupRequest) -> None:
        """A decoded group request of the connection (before it is decided)."""
        value = request.value
        tracker = self._liveness.tracker
        key = request.api_key
        group_id = value.get("group_id") or ""
        if key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            member_id, epoch = value.get("member_id") or "", value.get("member_epoch", 0)
            if epoch == -1:
                tracker.member_left(group_id, member_id)
            elif member_id:
                self._seen(SeenMember(group_id, member_id, epoch),
                           value.get("instance_id") is not None or epoch < 0)
        elif key in (ApiKey.HEARTBEAT, ApiKey.SYNC_GROUP):
            member_id = value.get("member_id") or ""
            if member_id:
                self._seen(SeenMember(group_id, member_id, value.get("generation_id", -1), True),
                           value.get("group_instance_id") is not None)
        elif key == ApiKey.LEAVE_GROUP:
            members = value.get("members") or [{"member_id": value.get("member_id")}]
            for member in members:
                tracker.member_left(group_id, member.get("member_id") or "")

    def _seen(self, member: SeenMember, static: bool) -> None:
        if self._liveness.tracker.member_seen(id(self), member, static=static):
            log.debug("group %s: member %s tied to a connection from %s", member.group_id,
                      member.member_id, self._host)


class PodLiveness:
    """The tracker of this sidecar's client connections and the delivery of what it
    declares."""

    def __init__(self, service: CoordinatorService, *, window_ms: int, grace_ms: int,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.service = service
        self.tracker = LivenessTracker(window_ms=window_ms, grace_ms=grace_ms)
        self._clock = clock
        self._wake = trio.Event()
        self._sending = 0
        self._nursery: trio.Nursery | None = None

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- hooks of the server and the routers --------------------------------------------------

    def watch(self, client_host: str) -> ConnectionWatch:
        return ConnectionWatch(self, client_host)

    def connection_closed(self, router: Router, conn: Connection) -> None:
        watch = getattr(router, "liveness", None)
        if not isinstance(watch, ConnectionWatch):
            return
        by_client = closed_by_client(conn)
        suspected = self.tracker.closed(id(watch), self.now_ms(), by_client=by_client)
        log.debug("%s: closed (%s; %s): %s", conn.name, conn.closing_reason,
                  "by the client" if by_client else "by the proxy",
                  self.tracker.last_verdict)
        for member in suspected:
            metrics.LIVENESS.labels(Outcome.SUSPECTED.value).inc()
            log.debug("group %s: member %s suspected gone: every connection of its client "
                      "closed", member.group_id, member.member_id)
        if suspected:
            self._wake.set()

    def connection_refused(self) -> None:
        """The proxy closed a new connection at once: a client may have been kept from
        coming back; nothing suspected now is declared."""
        before = self.tracker.counts[Outcome.RETURNED]
        self.tracker.proxy_refused()
        for _ in range(self.tracker.counts[Outcome.RETURNED] - before):
            metrics.LIVENESS.labels(Outcome.RETURNED.value).inc()

    def silence(self) -> None:
        """The sidecar is stopping: nothing more is declared."""
        self.tracker.silence()

    # -- declaring and delivering ---------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self._wake = wake = trio.Event()
                deadline = self.tracker.next_deadline()
                if deadline is None:
                    await wake.wait()
                else:
                    with trio.move_on_at(deadline / 1000):
                        await wake.wait()
                returned = self.tracker.counts[Outcome.RETURNED]
                for declaration in self.tracker.due(self.now_ms()):
                    self.deliver(declaration.member, declaration.observed_at_ms)
                self._count_returns(returned)

    def _count_returns(self, before: int) -> None:
        for _ in range(self.tracker.counts[Outcome.RETURNED] - before):
            metrics.LIVENESS.labels(Outcome.RETURNED.value).inc()

    def deliver(self, member: SeenMember, observed_at_ms: int) -> None:
        """Tell the group's holder that ``member`` is gone: here, or over the fleet."""
        metrics.LIVENESS.labels(Outcome.DECLARED.value).inc()
        service = self.service
        group_id = member.group_id
        if service.claims(group_id):
            self.member_gone(group_id, member.member_id, member.member_epoch, "this sidecar")
            return
        route = service.routes.route([group_id])
        if route.kind != RELAY or route.address is None:
            self._dropped(member, f"no coordinating sidecar known ({route.kind})")
            return
        if route.protocol < MEMBER_GONE_PROTOCOL:
            self._dropped(member, f"its holder speaks fleet protocol {route.protocol}")
            return
        if self._nursery is None or self._sending >= MAX_SENDING:
            self._dropped(member, "too many messages on their way")
            return
        self._sending += 1
        self._nursery.start_soon(self._send, route.address, member, observed_at_ms)

    def _dropped(self, member: SeenMember, why: str) -> None:
        metrics.MEMBER_GONE.labels("dropped").inc()
        log.info("group %s: member %s is gone, but %s: its session timeout applies",
                 member.group_id, member.member_id, why)

    async def _send(self, address: Address, member: SeenMember, observed_at_ms: int) -> None:
        body = member_gone_body(member.group_id, member.member_id, member.member_epoch,
                                observed_at_ms)
        try:
            error, _ = await fleet_control.send(address, body, security=self.service.security,
                                                timeout=SEND_SECONDS)
            metrics.MEMBER_GONE.labels("sent").inc()
            log.info("group %s: member %s is gone (every connection of its client closed); "
                     "told %s:%d, which answered %s", member.group_id, member.member_id,
                     *address, fleet_control.error_name(error))
        except UpstreamError as exc:
            self._dropped(member, f"{address[0]}:{address[1]} could not be told: {exc}")
        finally:
            self._sending -= 1

    def on_member_gone(self, body: fleet_control.Body, source: str) -> ErrorCode:
        """``MemberGone`` from the sidecar next to the member (:mod:`.fleet_control`)."""
        try:
            group_id = fleet_control.field(body, "group", str)
            member_id = fleet_control.field(body, "member_id", str)
            epoch = fleet_control.field(body, "member_epoch", int)
        except (KeyError, TypeError):
            return ErrorCode.INVALID_REQUEST
        return self.member_gone(group_id, member_id, epoch, source)

    def member_gone(self, group_id: str, member_id: str, member_epoch: int, source: str
                    ) -> ErrorCode:
        """At the holder: fence the member as at its session timeout (reason ``pod-local``)
        if this sidecar coordinates the group right now and the member is still at
        ``member_epoch``; the error code says why not."""
        service = self.service
        membership = service.memberships.get(group_id)
        if (service.stepping_down or service.hand_off.active or membership is None
                or membership.interrupted or membership.lease_expired()):
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            error, effects = service.engine.fence_member(group_id, member_id, member_epoch,
                                                          "pod-local", service.now_ms())
            service.apply(effects)
        metrics.MEMBER_GONE.labels("fenced" if error is ErrorCode.NONE else "refused").inc()
        if error is ErrorCode.NONE:
            log.info("group %s: member %s fenced (pod-local): the sidecar next to it (%s) saw "
                     "its process go", group_id, member_id, source)
        else:
            log.info("group %s: member %s reported gone by %s, not fenced: %s", group_id,
                     member_id, source, error.name)
        return error


def member_gone_body(group_id: str, member_id: str, member_epoch: int,
                     observed_at_ms: int) -> fleet_control.Body:
    return {"type": "MemberGone", "group": group_id, "member_id": member_id,
            "member_epoch": member_epoch, "observed_at": observed_at_ms}
