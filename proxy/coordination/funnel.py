"""The request funnel: the two ends every group API's request passes through in the service.

Every request of a group the engine may serve (ConsumerGroupHeartbeat, and the classic
JoinGroup, SyncGroup, Heartbeat, LeaveGroup) goes the same way through
:class:`~proxy.coordination.service.CoordinatorService`:

1. **admission** (:meth:`Funnel.admit`): wait while the group's lease is undecided (the
   broker may still answer within its session), tell a member to let go if this sidecar
   hands its groups off or lost the group's lease by a cut-off, refuse while this sidecar
   does not hold the broker's group, and take the group over to load its state for a member
   the state log may know (:meth:`~.service.CoordinatorService.load_for_member`);
2. the API's own part: a takeover for a joining member, the engine call, a held join or sync;
3. **the answer** (:meth:`Funnel.answer`): wait for the write barrier (every unit of the
   group's state written up to the engine call, :mod:`translation.write_barrier`), then check
   the lease again: an answer that gives or confirms an assignment never leaves after the
   lease passed or was cut off meanwhile.

Each end returns a :class:`Refusal` (the error and message to answer with) or None (go on);
the APIs only build their own response type from it. The decisions themselves (decided,
coordinating, to let go, lapsed meanwhile) are here once, not in each API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a request is answered instead of going on."""

    error: ErrorCode
    message: str = ""


class Funnel:
    """The admission and the answer of the service's group requests (see the module)."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service

    # -- the two ends -------------------------------------------------------------------------

    async def admit(self, group_id: str, member_id: str, *, decide: float | None = INF,
                    tell: bool = True, load: bool = True,
                    hand_off_error: ErrorCode = ErrorCode.UNKNOWN_MEMBER_ID) -> Refusal | None:
        """Before the API's own part. ``decide``: how long to wait while the lease is
        undecided (None: not at all; COORDINATOR_LOAD_IN_PROGRESS if it stays undecided);
        ``tell``: answer a member to be told to let go (a leaving member is not: it leaves);
        ``load``: take the group over for ``member_id`` if the state log may know it;
        ``hand_off_error``: what a member told to let go hears (a joining member without a
        member id: the retriable COORDINATOR_NOT_AVAILABLE)."""
        if decide is not None and not await self.until_decided(group_id, decide):
            # a member that owns partitions; a KIP-848 client times a heartbeat out after one
            # interval: retriable, and unlike COORDINATOR_NOT_AVAILABLE it keeps the client on
            # this coordinator
            return Refusal(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                           f"groupgate is waiting for the broker's answer on group {group_id}")
        if tell and self.handing_off(group_id, member_id):
            return Refusal(hand_off_error,
                           "groupgate is handing its groups off"
                           + ("; rejoin" if hand_off_error == ErrorCode.UNKNOWN_MEMBER_ID
                              else ""))
        if self.not_coordinating(group_id):
            return Refusal(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                           f"groupgate is not holding the broker's group {group_id} now")
        if load and (waited := await self.service.load_for_member(group_id, member_id)
                     ) is not None:
            return Refusal(waited,
                           f"Group {group_id} is not coordinated here (any more); rejoin."
                           if waited == ErrorCode.UNKNOWN_MEMBER_ID
                           else f"groupgate is taking group {group_id} over")
        return None

    async def answer(self, group_id: str, member_id: str, *, confirms: bool
                     ) -> Refusal | None:
        """After the engine answered: wait for the write barrier (NOT_COORDINATOR if the
        group's state will never be written); then, if the answer ``confirms`` an assignment
        or membership (no error), check the lease again (:meth:`lapsed_meanwhile`)."""
        if (failed := await self.settled(group_id)) is not None:
            return Refusal(ErrorCode.NOT_COORDINATOR,
                           f"groupgate could not record group {group_id}: {failed}")
        if confirms and (lapsed := self.lapsed_meanwhile(group_id, member_id)) is not None:
            return Refusal(lapsed, f"groupgate lost its hold on the broker's group {group_id} "
                                   "while answering")
        return None

    # -- the decisions ------------------------------------------------------------------------

    async def settled(self, group_id: str) -> str | None:
        """With the state log: wait until what the engine changed for ``group_id`` so far is
        written; why not, if it never will be (the answer must then not leave)."""
        durability = self.service.durability
        if durability is None:
            return None
        return await durability.settled(group_id)

    async def until_decided(self, group_id: str, wait_s: float = INF) -> bool:
        """A request of a member of ``group_id`` that arrives while the group's lease has run
        out but the broker may still answer within the session
        (:meth:`BrokerMembership.undecided`, the last ``1 - LEASE_FRACTION`` of a broker
        session) waits, at most ``wait_s``, until the group is held again or lost, instead of
        hearing the retriable COORDINATOR_NOT_AVAILABLE at once. A classic client (the Java
        client, kafka-python) marks its coordinator dead on that answer and then sends only
        FindCoordinator, to the connection that carries its fetches: behind a sidecar cut off
        from the broker, both wait there on the broker for good, so the client would never
        hear that it must let go. Waiting instead, its request is answered as usual if the
        broker answered meanwhile, or UNKNOWN_MEMBER_ID once the session has passed (the
        lease is lost, ``CoordinatorService._tell_to_let_go``). False if ``wait_s`` passed
        first."""
        membership = self.service.memberships.get(group_id)
        if membership is None or not membership.undecided():
            return True
        with trio.move_on_after(wait_s):
            await membership.wait_decided()
        return not membership.undecided()

    def not_coordinating(self, group_id: str) -> bool:
        """Whether requests of ``group_id`` must wait: this sidecar steps down, or the group's
        broker membership is interrupted, or its lease ran out before the membership's task
        could notice."""
        service = self.service
        if service.stepping_down:
            return True
        membership = service.memberships.get(group_id)
        return membership is not None and (membership.interrupted or membership.lease_expired())

    def handing_off(self, group_id: str, member_id: str) -> bool:
        """While handing off, or if ``member_id`` is a member of a group whose lease was cut
        off that has not been told yet: note that it is being told; True if it is."""
        service = self.service
        if not service.hand_off.active and not service.to_let_go(group_id, member_id):
            return False
        service.hand_off.told(group_id, member_id)
        service.drop_told_members(group_id, (member_id,))
        return True

    def lapsed_meanwhile(self, group_id: str, member_id: str) -> ErrorCode | None:
        """Checked again just before an answer that gives or confirms a member's assignment
        leaves after a wait (a takeover, a topic refresh, a held join or sync, a state log
        write): the error to answer instead if the proxy may no longer act for ``group_id``.
        UNKNOWN_MEMBER_ID for a member of a group whose lease was cut off meanwhile; the
        retriable COORDINATOR_NOT_AVAILABLE if the lease ran out (or the membership was
        interrupted, or the group was forgotten) meanwhile.

        What the engine did for the request stays done (and, with the state log, written):
        the member just does not hear of it here. That is safe: a KIP-848 member that gets an
        error sends its next heartbeat with its full state (its last epoch, subscription and
        owned partitions), which the engine accepts as the lost-response case (the previous
        epoch, owning no more than it is assigned) or fences (FENCED_MEMBER_EPOCH: it drops
        everything and rejoins); a joining member rejoins as itself; a classic member
        rediscovers the coordinator and rejoins."""
        service = self.service
        if service.to_let_go(group_id, member_id):
            service.hand_off.told(group_id, member_id)
            service.drop_told_members(group_id, (member_id,))
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self.not_coordinating(group_id) or (group_id not in service.memberships
                                               and service.engine.group(group_id) is None):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None
