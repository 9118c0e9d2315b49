"""The lock's lease: how long a sidecar may act for a group after the broker last answered.

The broker drops the lock member one session after the last call of it that it *received*.
A sidecar therefore counts from when it *sent* the last call the broker answered (a heartbeat,
or the SyncGroup that completed a join): until ``fraction`` of a session after it, the group is
``HELD`` and the sidecar acts; from then until a whole session after it, ``UNDECIDED`` (the
broker may still answer; nothing is done for the group meanwhile); after that ``LOST`` (the
broker may have given the group to another sidecar). With the sidecar's clock and the broker's
running at rates within ``1 - fraction`` of each other, the sidecar stops before anyone else can
start. Times are the caller's monotonic clock, in any unit, the session in the same unit.

One :class:`Lease` serves the broker membership (:mod:`proxy.coordination.membership`, trio
seconds) and the fleet core (:mod:`proxy.fleet_core.core`, milliseconds).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

LEASE_FRACTION = 0.8
"""Share of the session after the last answered call (counted from when it was sent) during
which the sidecar acts for the group."""


class LeaseState(enum.Enum):
    HELD = "held"
    UNDECIDED = "undecided"
    LOST = "lost"


@dataclass
class Lease:
    fraction: float = LEASE_FRACTION
    lease_deadline: float = float("inf")
    """Until when the sidecar may act (``inf`` before anything was answered: the caller
    decides whether that means held; ``-inf`` once dropped)."""
    session_deadline: float = float("inf")
    """From when the broker may have dropped the member."""
    last_sent: float = float("-inf")

    def answered(self, sent: float, session: float) -> None:
        """The broker answered a call sent at ``sent``; ``session``: the member's session now.
        An answer to an earlier call than one already counted changes nothing."""
        if sent < self.last_sent:
            return
        self.last_sent = sent
        self.lease_deadline = sent + self.fraction * session
        self.session_deadline = sent + session

    def drop(self) -> None:
        """The member is gone (left, lost): nothing is held from now on."""
        self.lease_deadline = self.session_deadline = float("-inf")

    def state(self, now: float) -> LeaseState:
        if now >= self.session_deadline:
            return LeaseState.LOST
        if now >= self.lease_deadline:
            return LeaseState.UNDECIDED
        return LeaseState.HELD
