"""Switches that put fleet defects back, for the fleet simulator's tests only.

Every fleet defect found in real runs and fixed has a switch here that reintroduces it, so the
simulator (``tests/sim/fleet_sim.py``) shows it finds the defect, with a seed kept as a
replayable test (``tests/sim/test_fleet_defects.py``; the catalogue is in
``docs/architecture.md``, "Fleet defects the simulator finds"). Nothing in the proxy sets one:
:data:`NO_DEFECTS` is the default everywhere, and the service never passes anything else.

Some switches are read by :class:`~proxy.fleet_core.core.GroupCore` (the defect's logic is in
the core now); the others by the simulator's model of the trio service, where that logic still
lives (they move into the core with it). Each field names the commit that fixed it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Defects:
    # -- read by the core ----------------------------------------------------------------------
    keep_failed_takeover: bool = False
    """191fce7: a takeover that lost its election after the request that started it stopped
    waiting stays registered: the group's requests at that sidecar are answered
    COORDINATOR_NOT_AVAILABLE instead of relayed to the holder, until a request that may
    start the group comes (a JoinGroup; an epoch-0 heartbeat)."""
    join_without_checking: bool = False
    """92f580e (``BrokerMembership._not_held_elsewhere``): the JoinGroup that joins follows the
    one that asked for a member id at once, without looking the group up in between, so a
    sidecar joins (and rebalances) a group another sidecar formed since its lookup."""
    lookup_waits_unbounded: bool = False
    """88d465e (``proxy/coordination/peers.py``, ``lookup_wait``): a request at a sidecar
    looking its group's holder up (a follower whose relay failed) waits for the whole lookup
    (up to ``LOOKUP_SECONDS``, 5 s, asked again while the broker cannot be reached; in the
    core, the lookup's ``lookup_ms`` or the request's ``hold_ms``), and the requests behind it
    on its connection wait with it: at a follower cut off from the broker, a heartbeat queued
    behind a commit times out, and librdkafka backs its reconnects off up to 10 s, past the
    cut."""
    cut_off_holder_keeps_claiming: bool = False
    """49192ea: a holder whose broker has not answered for a whole session stays interrupted
    (COORDINATOR_NOT_AVAILABLE) instead of telling its members to let go, until the broker
    answers again."""

    # -- read by the simulator's model of the service (the logic is trio-side today) ----------
    timers_ignore_lease: bool = False
    """49192ea: the timer task fires the engine's timers (session and rebalance timeouts)
    without looking at the lease, so a sidecar frozen or starved past its lease fences members
    whose heartbeats could not reach it."""
    sessions_run_while_inside: bool = False
    """7bfe2f6 (``translation/held_sessions.py``, ``proxy/coordination/inside.py``): a
    member's session runs while a request of it waits inside the coordinating sidecar (a
    commit waiting for the broker, a heartbeat queued behind it, an answer waiting for a
    write)."""
    no_stale_retry_guard: bool = False
    """12b575a (``proxy/coordination/commit_retries.py``): a commit librdkafka re-sends after
    a newer one succeeded is written, and the committed offset moves back."""
    closed_connection_commits_land: bool = False
    """902abd8: commits a client sent on a connection it closed (a request timed out) are
    still carried out by the broker, possibly after the newer ones it sent on its next
    connection (the broker connection is not reset)."""
    relayed_commits_unbounded: bool = False
    """4d447fe, 73432a6: a commit waiting at the holder for the broker's answer waits as long
    as the broker (or the follower's relay timeout) takes, also once the holder is cut off,
    and holds the member's heartbeats behind it on its connection."""
    stepping_down_passes_to_broker: bool = False
    """f2e0584: while stepping down, a former engine member's commit is passed to the broker,
    whose classic group of that id (the fleet's lock) does not know the member:
    UNKNOWN_MEMBER_ID."""
    heartbeats_held_whole_hold: bool = False
    """24049ab: a ConsumerGroupHeartbeat waits for a takeover as long as any request (the
    core's ``hold_ms``) instead of half a heartbeat interval; librdkafka times it out after
    one interval, drops the connection and reconnects with a growing backoff."""
    no_heartbeat_catch_up: bool = False
    """caa8162 (``proxy/coordination/heartbeat_answers.py``): a heartbeat that carries the
    epoch of an answer its client has not read yet goes on with that old epoch; with the
    group's epoch moved twice meanwhile, the member is fenced."""
    takeover_advertises_no_topics: bool = False
    """2fc434b: a sidecar that took a group over keeps a lock member that subscribes to no
    topic, so the broker expires (KIP-211) the committed offsets of the group's topics that
    see no commits for the retention time."""

    def on(self) -> list[str]:
        """The switches that are on, by name."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name)]


NO_DEFECTS = Defects()
"""Every fix in place: what the proxy always runs."""
