"""What goes into the fleet core and what comes out of it (:mod:`proxy.fleet_core.core`).

Inputs are *events*: a member's request of the group reached this sidecar, the broker answered
one of the core's calls, the state log acknowledged a write, a relay came back. Outputs are
*actions* for the driver (the trio service, or the simulator): calls to send to the broker,
the engine to run for a request, an answer that may leave, a request to relay. Times are the
driver's monotonic clock in milliseconds, given with every call; the core reads no clock.

Every call the core sends carries an ``attempt`` number; the driver hands it back with the
answer, and an answer to an attempt the core has moved past is ignored, so late or reordered
answers cannot move the group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Shape(enum.Enum):
    """What a lookup (DescribeGroups at the group's broker coordinator) found."""

    UNUSED = "unused"
    """Dead, or never of protocol type ``consumer``: nobody ever held it."""
    FREE = "free"
    """Empty, protocol type ``consumer``: a sidecar may have held it (its state may be in the
    log)."""
    HELD = "held"
    """A sidecar's lock member leads it (``holder`` names the sidecar)."""
    DIRECT = "direct"
    """Members without a lock: the broker's own group (the broker phase)."""
    UNREACHABLE = "unreachable"
    """No answer within the lookup's deadline."""


# -- events (in) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A member's request of the group. ``inbound``: relayed here by a follower (a holder
    never relays it again). ``starts_group``: it may create the group (a first heartbeat, epoch
    0, or a JoinGroup the engine takes)."""

    rid: int
    member_id: str
    starts_group: bool = False
    inbound: bool = False
    hold_ms: int | None = None
    """Longest it may be held for a lookup, an election or a load (None: the core's
    ``hold_ms``); a ConsumerGroupHeartbeat waits at most half a heartbeat interval, since
    librdkafka times one out after an interval and then reconnects with a growing backoff."""
    hold_error: int | None = None
    """Its answer when the hold runs out (None: COORDINATOR_NOT_AVAILABLE; a heartbeat gets
    the retriable COORDINATOR_LOAD_IN_PROGRESS, which clients retry after a short backoff)."""


@dataclass(frozen=True)
class LookedUp:
    attempt: int
    shape: Shape
    holder: str | None = None
    """The holding sidecar's fleet address (``Shape.HELD``); None with ``Shape.HELD``: the
    broker's group is led by a groupgate without a card (0.1.0), which nobody follows."""


@dataclass(frozen=True)
class JoinAnswered:
    attempt: int
    error: int
    member_id: str = ""
    generation: int = -1
    leader: str = ""


@dataclass(frozen=True)
class SyncAnswered:
    attempt: int
    error: int


@dataclass(frozen=True)
class HeartbeatAnswered:
    attempt: int
    error: int


@dataclass(frozen=True)
class CallFailed:
    """The call of ``attempt`` failed on the link (connection refused or reset)."""

    attempt: int


@dataclass(frozen=True)
class LoadDone:
    ok: bool
    complete: bool = True
    """The log held the group's state (or its deletion) whole. False: nothing, or not all of
    it, could be loaded; if another coordinator held the group before, joins then wait
    ``takeover_wait_ms`` so that members it assigned partitions to let go first."""


@dataclass(frozen=True)
class EngineDone:
    """The driver ran the engine for request ``rid``; ``wrote``: the call changed durable state
    (its records are to be written as one unit, :class:`Write`)."""

    rid: int
    wrote: bool


@dataclass(frozen=True)
class Written:
    """The state log acknowledged every unit up to ``unit``."""

    unit: int


@dataclass(frozen=True)
class WriteFailed:
    unit: int


@dataclass(frozen=True)
class RelayDone:
    """A relayed request came back: answered by the holder, or refused/failed (NOT_COORDINATOR,
    the link broke, no answer in time)."""

    rid: int
    refused: bool


@dataclass(frozen=True)
class Forgotten:
    """The driver forgot the engine's group (:class:`Forget`); ``members``: the member ids the
    group had then. In ``letting-go`` these, and only these, are told to let go."""

    members: frozenset[str]


@dataclass(frozen=True)
class Stop:
    """The proxy stops: step down. With the state log (``hand_off`` False) nothing more is
    answered, what is pending is written, and the lock is left, so that the next holder loads
    everything and nobody is disturbed; without it (``hand_off``) the members are told to let
    go first (each one's next request is answered UNKNOWN_MEMBER_ID), then the lock is left."""

    hand_off: bool = False


Event = (Request | LookedUp | JoinAnswered | SyncAnswered | HeartbeatAnswered | CallFailed
         | LoadDone | EngineDone | Written | WriteFailed | RelayDone | Forgotten | Stop)


# -- actions (out) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lookup:
    """DescribeGroups at the group's broker coordinator; answer with :class:`LookedUp`."""

    attempt: int


@dataclass(frozen=True)
class SendJoin:
    attempt: int
    member_id: str


@dataclass(frozen=True)
class SendSync:
    attempt: int
    member_id: str
    generation: int


@dataclass(frozen=True)
class SendHeartbeat:
    attempt: int
    member_id: str
    generation: int


@dataclass(frozen=True)
class SendLeave:
    member_id: str


@dataclass(frozen=True)
class Load:
    """Open the group's writer (fencing every earlier one), read the log, load the engine;
    answer with :class:`LoadDone`."""


@dataclass(frozen=True)
class RunEngine:
    """Give request ``rid`` to the engine now; answer with :class:`EngineDone`."""

    rid: int


@dataclass(frozen=True)
class Write:
    """Write the records the last engine call changed as unit ``unit`` (in order)."""

    unit: int


@dataclass(frozen=True)
class Respond:
    """The engine's answer to ``rid`` may leave."""

    rid: int


@dataclass(frozen=True)
class Fail:
    """Answer ``rid`` with ``error`` (no engine answer)."""

    rid: int
    error: int


@dataclass(frozen=True)
class Relay:
    rid: int
    holder: str


@dataclass(frozen=True)
class Suspend:
    """The engine's timers for the group stop (the lease passed)."""


@dataclass(frozen=True)
class Resume:
    """The engine's timers run again; every member gets a full session."""


@dataclass(frozen=True)
class Forget:
    """The engine forgets the group; its writer is closed. The driver answers with
    :class:`Forgotten` (the members the group had)."""

    reason: str


Action = (Lookup | SendJoin | SendSync | SendHeartbeat | SendLeave | Load | RunEngine | Write
          | Respond | Fail | Relay | Suspend | Resume | Forget)
