"""Handing groups off: every member drops its partitions before the proxy lets a group go.

The proxy keeps its groups' state in memory. When it gives its groups up (graceful shutdown,
so that another proxy, or the broker, coordinates them next), the next coordinator learns
nothing of who owns what, and would hand a partition out while its current owner still
consumes it. So before the proxy leaves the broker's groups it tells every member to let go:
each member's next group request is answered with UNKNOWN_MEMBER_ID (the member treats its
partitions as lost and rejoins; a joining member without a member id is told the coordinator
is not available, and retries), and the hand-off waits until every member has been told or
a bound has passed. Members that have not been heard from within the bound are the residual
risk (see docs/operations.md, "Restarting the proxy").

The same is done for one group whose lease was cut off (the broker did not answer the proxy's
membership for a whole session, so another sidecar may hold the group by now, and the members
cannot be routed to it while the broker is unreachable): the members the group had at that
moment are told to let go on their next request (:meth:`HandOff.lose_group`; requests that
waited for the session's end since the lease ran out are answered then), until each has been
told or the bound (one member session) has passed; the rest of the proxy carries on.

:class:`HandOff` keeps the members still to tell; the coordinator service answers the
requests and marks their members told (``CoordinatorService.let_go``,
``CoordinatorService._membership_lost``). For a cut-off group it also keeps, for the same
bound, the members already told (:meth:`HandOff.told_members`): if this sidecar holds the group
again and loads it from the state log, those members are not kept (they dropped their
partitions; a classic one rejoins under a new member id, and its old self would pin its
partitions until its session ran out).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import trio

from translation.coordinator import GroupCoordinator


@dataclass(slots=True)
class LostGroup:
    """The members of a group whose lease was cut off that have not been told yet."""

    members: set[str]
    until: float
    """trio time after which nobody more is told (they were not heard from within a
    session: any coordinator has fenced them by then)."""


class HandOff:
    """Which members of the engine's groups have been told to let go."""

    def __init__(self) -> None:
        self.active = False
        self.pending: set[tuple[str, str]] = set()
        self._all_told = trio.Event()
        self.lost: dict[str, LostGroup] = {}
        """Groups whose lease was cut off, with the members still to tell (bounded: at most
        the groups held within the last bound, each with the members it had)."""
        self.let_go: dict[str, LostGroup] = {}
        """The same groups with the members told so far (the same bound)."""

    def start(self, engine: GroupCoordinator) -> None:
        self.active = True
        self.pending = {(group_id, member_id) for group_id, group in engine.groups.items()
                        for member_id in group.members}
        if not self.pending:
            self._all_told.set()

    def lose_group(self, group_id: str, member_ids: Iterable[str], until: float) -> None:
        """The lease of ``group_id`` was cut off: tell ``member_ids`` to let go until
        ``until`` (trio time)."""
        now = trio.current_time()
        for kept in (self.lost, self.let_go):
            for expired in [g for g, lost in kept.items() if lost.until <= now]:
                del kept[expired]
        members = set(member_ids)
        if members and until > now:
            self.lost[group_id] = LostGroup(members, until)
            self.let_go[group_id] = LostGroup(set(), until)

    def to_tell(self, group_id: str, member_id: str) -> bool:
        """Whether ``member_id`` is a member of a cut-off group that has not been told yet."""
        lost = self.lost.get(group_id)
        if lost is None or not member_id:
            return False
        if lost.until <= trio.current_time():
            del self.lost[group_id]
            return False
        return member_id in lost.members

    def telling(self, group_id: str) -> bool:
        """Whether members of ``group_id`` (cut off) are still to be told."""
        lost = self.lost.get(group_id)
        if lost is not None and lost.until <= trio.current_time():
            del self.lost[group_id]
            return False
        return lost is not None

    def told_members(self, group_id: str) -> frozenset[str]:
        """The members of ``group_id`` (cut off within the bound) told to let go so far."""
        told = self.let_go.get(group_id)
        if told is None:
            return frozenset()
        if told.until <= trio.current_time():
            del self.let_go[group_id]
            return frozenset()
        return frozenset(told.members)

    def release(self, group_id: str) -> None:
        """Tell nobody more of ``group_id``: the sidecar holding it now decides."""
        self.lost.pop(group_id, None)
        self.let_go.pop(group_id, None)

    def told(self, group_id: str, member_id: str) -> None:
        """``member_id`` of ``group_id`` has been answered UNKNOWN_MEMBER_ID (or left)."""
        self.pending.discard((group_id, member_id))
        if self.active and not self.pending:
            self._all_told.set()
        lost = self.lost.get(group_id)
        if lost is not None and member_id in lost.members:
            lost.members.discard(member_id)
            told = self.let_go.get(group_id)
            if told is not None:
                told.members.add(member_id)
            if not lost.members:
                del self.lost[group_id]

    async def wait(self, timeout_s: float) -> int:
        """Wait until every member has been told, at most ``timeout_s``; return how many
        were not."""
        with trio.move_on_after(timeout_s):
            await self._all_told.wait()
        return len(self.pending)
