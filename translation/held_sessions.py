"""Sessions that do not run while a member's request is inside the proxy.

A member's session measures how long it has gone unheard. Kafka's own coordinator hears a
request the moment it arrives, and keeps a classic member alive while its JoinGroup or
SyncGroup is held (``MemberMetadata.shouldKeepAlive``). In front of a classic broker a
request can wait inside the proxy: a commit waits for the proxy's broker membership to be
stable again, a heartbeat waits behind that commit on the same connection (Kafka answers a
connection's requests in order), a held JoinGroup waits for the group's assignment. The
member is alive all that time; fencing it would hand its partitions to another member while
it still consumes them.

So the driver reports each request of a known member when it starts being decided
(:meth:`HeldSessions.arrived`) and when its answer leaves (:meth:`HeldSessions.left`). While
at least one is inside, the member's session clock is stopped: the time it had left when the
first one arrived is kept, a heartbeat handled meanwhile resets it to a full session, and
when the last one leaves the session timer is armed for exactly that remainder. A session
timer that comes due meanwhile does nothing.

Bounded: one entry per member with a request inside (at most the group's members; an entry
goes with its member). A hold that outlives ``bound_ms`` (the member's rebalance timeout, the
longest any request may legitimately wait) stops protecting the member, so a driver bug that
never reports a request's end cannot keep a dead member forever.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class HeldSession:
    """A member with ``count`` requests inside the proxy since ``since_ms``."""

    count: int
    remaining_ms: int
    """Its session time left when the first request arrived (or a full session, if a
    heartbeat was handled since)."""
    since_ms: int
    bound_ms: int


class HeldSessions:
    """The members of one group whose sessions are stopped."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, HeldSession] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, member_id: object) -> bool:
        return member_id in self._held

    def arrived(self, member_id: str, remaining_ms: int, now_ms: int, bound_ms: int) -> None:
        held = self._held.get(member_id)
        if held is None:
            self._held[member_id] = HeldSession(1, max(remaining_ms, 0), now_ms, bound_ms)
        else:
            held.count += 1

    def left(self, member_id: str) -> HeldSession | None:
        """One request of ``member_id`` left; the entry once its last one did (the caller
        arms the session timer for ``remaining_ms``), else None."""
        held = self._held.get(member_id)
        if held is None:
            return None
        held.count -= 1
        if held.count > 0:
            return None
        del self._held[member_id]
        return held

    def heard(self, member_id: str, session_ms: int) -> None:
        """A heartbeat of the member was handled while held: a full session is left."""
        held = self._held.get(member_id)
        if held is not None:
            held.remaining_ms = session_ms

    def protected_until(self, member_id: str, now_ms: int) -> int | None:
        """If a session timer of ``member_id`` coming due at ``now_ms`` must wait: until when
        at the latest (the hold's bound); None if it must not."""
        held = self._held.get(member_id)
        if held is None or now_ms - held.since_ms >= held.bound_ms:
            return None
        return held.since_ms + held.bound_ms

    def drop(self, member_id: str) -> None:
        """The member is gone."""
        self._held.pop(member_id, None)
