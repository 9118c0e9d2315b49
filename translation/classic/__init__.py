"""Classic-protocol members (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) on the KIP-848 engine.

KIP-848's "Supporting Online Consumer Group Upgrade": a member that still speaks the classic
rebalance protocol is reconciled on its own, like a new-protocol member, through a per-member
state machine (PrepareRebalance -> CompletingRebalance -> Stable). JoinGroup carries the
subscription and the owned partitions and moves the member along its reconciliation, SyncGroup
hands out the member's current assignment, Heartbeat keeps the session and says
REBALANCE_IN_PROGRESS when the member has something to revoke or to collect.

Modules:

* :mod:`~translation.classic.messages`: requests, responses and the embedded consumer protocol
  (subscription / assignment), already decoded by the proxy; topics by name.
* :mod:`~translation.classic.member`: the per-member classic state kept next to the engine's
  member record.
* :mod:`~translation.classic.coordinator`: :class:`ClassicGroupCoordinator`, the entry point
  (join, sync, heartbeat, leave, deferred joins).
* :mod:`~translation.classic.routing`: which JoinGroups the engine may take at all
  (:func:`classify_classic_join`).
* :mod:`~translation.classic.migration`: converting a broker's classic group into an engine
  group (upgrade) and handing a group back (downgrade), under the migration policy.
* :mod:`~translation.classic.client_assignors`: the client-side assignors (``range``,
  ``roundrobin``, ``sticky``, ``cooperative-sticky``) a bridged member runs when the broker
  elects it leader (:mod:`translation.bridge`; not wired into the proxy yet).

Nothing here imports the proxy: the proxy decodes the wire messages (including the embedded
``ConsumerProtocolSubscription``) and encodes the responses (``ConsumerProtocolAssignment`` at
the version the engine returns).
"""
