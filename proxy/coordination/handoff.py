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

:class:`HandOff` only keeps the set of members still to tell; the coordinator service
answers the requests and marks their members told (``CoordinatorService.let_go``).
"""

from __future__ import annotations

import trio

from translation.coordinator import GroupCoordinator


class HandOff:
    """Which members of the engine's groups have been told to let go."""

    def __init__(self) -> None:
        self.active = False
        self.pending: set[tuple[str, str]] = set()
        self._all_told = trio.Event()

    def start(self, engine: GroupCoordinator) -> None:
        self.active = True
        self.pending = {(group_id, member_id) for group_id, group in engine.groups.items()
                        for member_id in group.members}
        if not self.pending:
            self._all_told.set()

    def told(self, group_id: str, member_id: str) -> None:
        """``member_id`` of ``group_id`` has been answered UNKNOWN_MEMBER_ID (or left)."""
        self.pending.discard((group_id, member_id))
        if self.active and not self.pending:
            self._all_told.set()

    async def wait(self, timeout_s: float) -> int:
        """Wait until every member has been told, at most ``timeout_s``; return how many
        were not."""
        with trio.move_on_after(timeout_s):
            await self._all_told.wait()
        return len(self.pending)
