"""Heartbeat answers a KIP-848 client missed: its next heartbeat carries the epoch it was given.

librdkafka gives a ConsumerGroupHeartbeat one heartbeat interval before it times the request
out, and then sends the next one with the member epoch it still knows, on the same connection,
while the first is still on its way. When the coordinator was slow (a sidecar frozen for a few
seconds, a takeover, a relay waiting for its holder), several heartbeats of one member queue up
and are answered one after the other: the first moves the member to a new epoch, the client
never reads that answer, and a later one carries the old epoch. The coordinator accepts the
epoch before the current one (Kafka's rule for a lost answer), but when the group's epoch moved
twice meanwhile (a member joined while they queued), it fences a member that was never gone:
the client gives its partitions up as lost and joins again.

The sidecar the client is connected to sees every answer its client is sent, in order. This
keeps, per connection and member, the epoch the client's last heartbeat carried and the epoch
its answer gave. A later heartbeat that carries that same old epoch is a heartbeat whose
client has not read the answer yet (a client that had read it would send the new epoch), so it
goes on with the epoch the answer gave, as if the client had read it. What the heartbeat says
it owns is unchanged: the coordinator still takes back only what the client reports released.
Joins (epoch 0) and leaves (negative epochs) are never changed, and an error answer forgets
the member, so a member the coordinator fenced stays fenced.

Bounded: :data:`MAX_MEMBERS` members per connection (a client heartbeats as one member).
"""

from __future__ import annotations

from typing import Any

MAX_MEMBERS = 16
"""Members remembered per connection; the oldest is forgotten first."""


class HeartbeatAnswers:
    """Per connection: the member epoch each member's last heartbeat carried and was given."""

    __slots__ = ("_members",)

    def __init__(self) -> None:
        self._members: dict[str, tuple[int, int]] = {}
        """member id -> (epoch the client's heartbeat carried, epoch its answer gave)."""

    def __len__(self) -> int:
        return len(self._members)

    def catch_up(self, request: dict[str, Any]) -> int | None:
        """The epoch the client of ``request`` was last given, if the request carries the
        epoch of a heartbeat whose answer the client has not read; None: it goes on
        unchanged."""
        epoch = request.get("member_epoch", 0)
        known = self._members.get(request.get("member_id") or "")
        if known is None or epoch <= 0:
            return None
        carried, given = known
        if epoch != carried or given <= carried:
            return None
        return given

    def answered(self, carried: int, request: dict[str, Any], response: dict[str, Any]
                 ) -> None:
        """The client is sent ``response`` to ``request``, whose epoch as the client sent it
        was ``carried``."""
        member_id = response.get("member_id") or request.get("member_id") or ""
        if not member_id:
            return
        given = response.get("member_epoch", -1)
        self._members.pop(member_id, None)
        if response.get("error_code", 0) != 0 or carried < 0 or given <= 0:
            return
        if len(self._members) >= MAX_MEMBERS:
            del self._members[next(iter(self._members))]
        self._members[member_id] = (carried, given)
