"""Bridged members: the classic member a sidecar runs in the broker's group for one KIP-848
client while the group is still the broker's (decision record 0018, "Members behind sidecars
in the broker phase").

The proxy drives it (``proxy/coordination/bridged.py``). Sans-I/O like the rest of
the engine: the client's ConsumerGroupHeartbeat, the broker's answers and the time go in;
the broker requests to send and the heartbeat answer to give the client come out.

Modules:

* :mod:`~translation.bridge.messages`: what goes in and out (the classic requests are
  :mod:`translation.classic.messages`' own, except the leader's SyncGroup).
* :mod:`~translation.bridge.member`: :class:`BridgedMember`, the state machine, with its
  transition table.

A bridged member elected leader runs :mod:`translation.classic.client_assignors`.
"""

from translation.bridge.member import (
    TRANSITIONS,
    BridgedMember,
    BridgeEvent,
    BridgeState,
    BridgeStateError,
    member_mark,
)
from translation.bridge.messages import (
    BrokerJoinAnswer,
    BrokerRequest,
    ClientAnswer,
    ClientHeartbeat,
    LeaderSyncGroupRequest,
)

__all__ = [
    "TRANSITIONS",
    "BridgeEvent",
    "BridgeState",
    "BridgeStateError",
    "BridgedMember",
    "BrokerJoinAnswer",
    "BrokerRequest",
    "ClientAnswer",
    "ClientHeartbeat",
    "LeaderSyncGroupRequest",
    "member_mark",
]
