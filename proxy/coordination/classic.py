"""Classic group requests answered by the proxy: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

With ``classic-translation`` on, the handlers here answer the classic requests of groups the
engine serves (and the JoinGroups the engine may take, see
:meth:`~proxy.coordination.service.CoordinatorService.takes_join`); the rest pass to the
broker untouched, except a forwarded ``consumer`` JoinGroup, which carries the member mark as
its client id (:mod:`proxy.coordination.upgrade`). Each handler maps the decoded wire value
onto the engine's classic dataclasses with :mod:`proxy.coordination.convert`, calls the
service (which runs the engine's
:class:`~translation.classic.coordinator.ClassicGroupCoordinator` and handles its effects) and
maps the answer back to a response value at the client's version. JoinGroup may wait for the
takeover of the broker's group, a topic metadata refresh, or a held (deferred) join; SyncGroup
for the release of the partitions its member waits for (a held sync).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from proxy.codec.api_keys import ApiKey
from proxy.coordination import convert
from proxy.coordination.handler import PASS, Answer, ApiHandler, GroupRequest, Outcome, Value
from translation.classic.messages import (
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupResponse,
    SyncGroupResponse,
)
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService



RELEASE_JOIN_WAIT = 60.0
"""Longest a JoinGroup of a group being handed back waits for the hand-back (the release's own
bound is half a member session)."""


class ClassicHandler(ApiHandler):
    """A classic group request: the engine's if it serves the group, else the broker's."""

    def decide(self, request: GroupRequest) -> Outcome:
        service = self.service
        if service.classic is None:
            return PASS
        if (told := self.told_to_rejoin(request)) is not None:
            return told
        if not self.is_local(request):
            return PASS
        return Answer(self.answer(request))

    def told_to_rejoin(self, request: GroupRequest) -> Outcome | None:
        """A Heartbeat or SyncGroup of a classic member of a group being handed back (or handed
        back) to the broker's coordinator: ILLEGAL_GENERATION, so that it gives up its
        partitions and joins again, keeping its member id (:mod:`.release`); None: not one."""
        value = request.value
        if not self.service.releases.classic_member(
                value["group_id"], value.get("member_id") or "", trio.current_time()):
            return None
        return Answer(self.failure(request, int(ErrorCode.ILLEGAL_GENERATION)))

    def is_local(self, request: GroupRequest) -> bool:
        value = request.value
        member_id = value.get("member_id") or ""
        if not member_id and value.get("members"):  # LeaveGroup v3+: a batch of members
            member_id = value["members"][0].get("member_id") or ""
        return self.service.serves_classic(value["group_id"], member_id)

    async def answer(self, request: GroupRequest) -> Value:
        raise NotImplementedError


class JoinGroupHandler(ClassicHandler):
    api_key = ApiKey.JOIN_GROUP

    def decide(self, request: GroupRequest) -> Outcome:
        service = self.service
        if service.classic is None:
            return PASS
        group_id, member_id = request.value["group_id"], request.value.get("member_id") or ""
        if service.releasing(group_id):
            # the group is being handed back: a member still owning partitions (a cooperative
            # one rejoining) is told to give them up first, as its Heartbeat would be; once
            # it owns nothing its join waits, and after the hand-back it joins the broker's
            if owns_partitions(request):
                return Answer(self.failure(request, int(ErrorCode.ILLEGAL_GENERATION)))
            service.releases.gave_up(group_id, member_id, trio.current_time())
            return Answer(self._after_release(request))
        if service.released_member(group_id, member_id):
            # the member id is the engine's: the broker gives the member one of its own
            # (MEMBER_ID_REQUIRED), and the member keeps what it owns
            return service.upgrades.forward_join(request, member_id="")
        if self.is_local(request):
            return Answer(self.answer(request))
        # to the broker's group, with the member mark (online upgrade, :mod:`.upgrade`); its
        # answer through the conversion's safety net
        return service.upgrades.forward_join(
            request, failure=lambda code: self.failure(request, code))

    async def _after_release(self, request: GroupRequest) -> Value:
        await self.service.release_finished(request.value["group_id"], RELEASE_JOIN_WAIT)
        return self.failure(request, int(ErrorCode.REBALANCE_IN_PROGRESS))

    def is_local(self, request: GroupRequest) -> bool:
        try:
            join = join_request(request)
        except convert.ShapeError:
            return False
        return self.service.takes_join(join)

    async def answer(self, request: GroupRequest) -> Value:
        response = await self.service.join_group(join_request(request))
        return convert.join_group_response(response, request.version)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return convert.join_group_response(
            JoinGroupResponse(error_code=error, member_id=request.value.get("member_id", "")),
            request.version)


class SyncGroupHandler(ClassicHandler):
    api_key = ApiKey.SYNC_GROUP

    async def answer(self, request: GroupRequest) -> Value:
        response = await self.service.sync_group(
            convert.sync_group_request(request.value, request.version))
        return convert.sync_group_response(response, request.version)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return convert.sync_group_response(SyncGroupResponse(error_code=error), request.version)


class HeartbeatHandler(ClassicHandler):
    api_key = ApiKey.HEARTBEAT

    def decide(self, request: GroupRequest) -> Outcome:
        service = self.service
        if service.classic is None:
            return PASS
        if (told := self.told_to_rejoin(request)) is not None:
            return told
        if not self.is_local(request):
            return PASS
        return Answer(self._answer(request))

    async def _answer(self, request: GroupRequest) -> Value:
        response = await self.service.classic_heartbeat(
            convert.heartbeat_request(request.value, request.version))
        return convert.heartbeat_response(response, request.version)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return convert.heartbeat_response(HeartbeatResponse(error_code=error), request.version)


class LeaveGroupHandler(ClassicHandler):
    api_key = ApiKey.LEAVE_GROUP

    def decide(self, request: GroupRequest) -> Outcome:
        service = self.service
        if service.classic is None:
            return PASS
        group_id = request.value["group_id"]
        if service.releasing(group_id):  # a member that leaves needs no telling
            for member in request.value.get("members") or [request.value]:
                service.releases.gave_up(group_id, member.get("member_id") or "",
                                         trio.current_time())
        if not self.is_local(request):
            return PASS
        return Answer(self._answer(request))

    async def _answer(self, request: GroupRequest) -> Value:
        response = await self.service.leave_group(
            convert.leave_group_request(request.value, request.version))
        return convert.leave_group_response(response, request.version)

    def failure(self, request: GroupRequest, error: int) -> Value:
        return convert.leave_group_response(LeaveGroupResponse(error_code=error),
                                           request.version)


def owns_partitions(request: GroupRequest) -> bool:
    """Whether a JoinGroup's first subscription names partitions its member still owns (a
    cooperative member rejoining with them; an unreadable one counts as owning)."""
    try:
        join = join_request(request)
    except convert.ShapeError:
        return True
    subscription = join.protocols[0].subscription if join.protocols else None
    return subscription is not None and any(ps for _, ps in subscription.owned_partitions)


def join_request(request: GroupRequest) -> JoinGroupRequest:
    return convert.join_group_request(request.value, request.version,
                                     client_id=request.client_id,
                                     client_host=request.client_host)


HANDLERS: tuple[Callable[[CoordinatorService], ApiHandler], ...] = (
    JoinGroupHandler, SyncGroupHandler, HeartbeatHandler, LeaveGroupHandler)
