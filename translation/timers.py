"""Timers of the group engine, driven by the caller's clock.

The engine never reads a clock. Every entry point takes ``now_ms`` (an ``int`` of
milliseconds on any monotonic clock the caller chooses; only differences matter). Deadlines
are kept here; the caller either calls ``tick(now_ms)`` regularly (or at
``next_deadline()``) or arms its own timers from the :class:`~translation.effects.TimerArmed`
effects and calls ``fire(key, now_ms)`` when one goes off. Both ways give the same result.

Re-arming a timer to a later deadline (the session timer on every heartbeat) is a dict
update, not a heap push: the heap holds possibly stale entries that are checked against the
current deadline when they come up (lazy deletion), so the steady heartbeat path stays O(1).
"""

from __future__ import annotations

import enum
import heapq
import itertools
from typing import NamedTuple


class TimerKind(enum.Enum):
    SESSION = "session"
    """The member did not heartbeat within the session timeout: fence it."""
    REBALANCE = "rebalance"
    """The member did not revoke its partitions within its rebalance timeout: fence it."""
    ASSIGNMENT = "assignment"
    """The assignment interval has passed: compute the target the group is waiting for."""
    GROUP_EXPIRY = "group-expiry"
    """The group stayed empty for the expiry delay: delete it (state DEAD)."""
    CLASSIC_JOIN = "classic-join"
    """A classic member told to rejoin did not send JoinGroup within its rebalance timeout."""
    CLASSIC_SYNC = "classic-sync"
    """A classic member did not send SyncGroup within its rebalance timeout after joining."""
    CLASSIC_SYNC_HOLD = "classic-sync-hold"
    """A held SyncGroup waited as long as it may: answer it with what the member has."""


class TimerKey(NamedTuple):
    kind: TimerKind
    group_id: str
    member_id: str = ""


class Timers:
    """Deadlines by key, with an optional integer payload (e.g. the epoch a timer guards)."""

    __slots__ = ("_counter", "_deadlines", "_heap")

    def __init__(self) -> None:
        self._deadlines: dict[TimerKey, tuple[int, int]] = {}
        self._heap: list[tuple[int, int, TimerKey]] = []
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._deadlines)

    def __contains__(self, key: object) -> bool:
        return key in self._deadlines

    def schedule(self, key: TimerKey, deadline_ms: int, payload: int = 0) -> None:
        """Arm (or re-arm) ``key`` to fire at ``deadline_ms``."""
        old = self._deadlines.get(key)
        self._deadlines[key] = (deadline_ms, payload)
        if old is None or deadline_ms < old[0]:
            heapq.heappush(self._heap, (deadline_ms, next(self._counter), key))

    def cancel(self, key: TimerKey) -> bool:
        """Disarm ``key``; returns whether it was armed."""
        return self._deadlines.pop(key, None) is not None

    def deadline(self, key: TimerKey) -> int | None:
        entry = self._deadlines.get(key)
        return None if entry is None else entry[0]

    def payload(self, key: TimerKey) -> int | None:
        entry = self._deadlines.get(key)
        return None if entry is None else entry[1]

    def take_if_due(self, key: TimerKey, now_ms: int) -> tuple[bool, int]:
        """Disarm ``key`` and return ``(True, payload)`` if it is armed and due."""
        entry = self._deadlines.get(key)
        if entry is None or entry[0] > now_ms:
            return False, 0
        del self._deadlines[key]
        return True, entry[1]

    def pop_due(self, now_ms: int) -> list[tuple[TimerKey, int]]:
        """Disarm and return every timer due at ``now_ms``, earliest first."""
        due: list[tuple[TimerKey, int]] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, _, key = heapq.heappop(heap)
            entry = self._deadlines.get(key)
            if entry is None:
                continue
            if entry[0] <= now_ms:
                del self._deadlines[key]
                due.append((key, entry[1]))
            else:
                heapq.heappush(heap, (entry[0], next(self._counter), key))
        return due

    def next_deadline(self) -> int | None:
        """The earliest armed deadline, or None when nothing is armed."""
        heap = self._heap
        while heap:
            deadline, _, key = heap[0]
            entry = self._deadlines.get(key)
            if entry is None:
                heapq.heappop(heap)
            elif entry[0] != deadline:
                heapq.heapreplace(heap, (entry[0], next(self._counter), key))
            else:
                return deadline
        return None
