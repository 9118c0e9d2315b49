"""The hand-back in a fleet: the sidecars that relay a group's requests to its holder are told
(decision record 0018, section 1, "Downgrade (hand-back)", steps 1 and 2; FleetControl
``GroupReleasing`` and ``GroupReleased``).

* **Who relays.** The holder keeps, per group, the sidecars that relayed for it within the last
  member session (:class:`Relayers`): a protocol-3 relay mark names the relaying sidecar's
  fleet address (:func:`~.fleet.mark_forwarded`), on a relayed request
  (:mod:`.stages.relayers`) and on one inside ``FleetControl`` (a KIP-848 heartbeat, a
  remainder: :mod:`.as_the_client`) alike; a relay with an older mark (groupgate
  0.2.0) is kept as ``0.2.0@<host>``, and a release of the group is refused while one is
  there (such a sidecar cannot be told; roll it first).
* **Step 1, ``GroupReleasing``** (:func:`announce`), before any member is told: to each of
  them, with the group's members (classic and KIP-848 member ids), where it goes (``to``)
  and how long the holder's first step may take. A follower (:meth:`FleetRelease.on_releasing`)
  notes the release as under way at that holder (:meth:`~.release.ReleaseBook.start` with
  ``peer``): it goes on relaying the members' requests to the holder (which tells them to give
  their partitions up), but never takes the group over itself, and a request it has to decide
  itself meanwhile waits (a JoinGroup until the hand-back is over, a KIP-848 heartbeat is
  answered COORDINATOR_LOAD_IN_PROGRESS). A follower that cannot be told, or refuses (it holds
  the group itself), aborts the release: the group stays the engine's.
* **Step 2, ``GroupReleased``** (:func:`tell_released`), once the lock left: each follower
  notes the group released (as the holder does: classic members told to rejoin the broker's
  group through it, KIP-848 members rejoining there as bridged members, or at the broker's own
  coordinator for ``native``), forgets its route to the holder, and answers the requests it
  held. A follower told nothing more within the announced bound plus :data:`PEER_SLACK_SECONDS`
  decides from the broker's group: the holder still holds it, the release did not happen;
  otherwise it did.

The command itself is never relayed (:class:`~.release.ReleaseCommandHandler`): it is
answered NOT_COORDINATOR by a follower, so it goes to the holder, where the broker authorizes
the caller on the caller's own connection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio
from cachetools import TTLCache

from proxy.coordination import fleet_control
from proxy.coordination.fleet import OLD_FOLLOWER
from proxy.coordination.release import ReleaseTarget
from proxy.coordination.upgrade import parse_address
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.release import GroupRelease
    from proxy.coordination.service import CoordinatorService

log = logging.getLogger("groupgate.coordination")

RELAYERS_MAX = 50_000
"""(group, sidecar) pairs remembered at once."""
ANNOUNCE_SECONDS = 1.0
"""How long a follower has to acknowledge ``GroupReleasing``."""
PEER_SLACK_SECONDS = 10.0
"""A follower told ``GroupReleasing`` waits this long past the announced bound for
``GroupReleased`` before it decides from the broker's group."""
IDS_BUDGET_BYTES = 48 * 1024
"""Member ids a ``GroupReleasing`` carries at most (the body is bounded by
:data:`~.fleet_control.MAX_BODY_BYTES`); beyond it they are left out, and a member left out is
told to rejoin by the broker's own answer instead (UNKNOWN_MEMBER_ID)."""


class Relayers:
    """The sidecars that relayed each group's requests here within ``ttl_s`` (bounded)."""

    def __init__(self, ttl_s: float, *, max_entries: int = RELAYERS_MAX) -> None:
        self._seen: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=max_entries, ttl=ttl_s, timer=trio.current_time)

    def __len__(self) -> int:
        return len(self._seen)

    def note(self, group_ids: Iterable[str], relayed_by: str) -> None:
        for group_id in group_ids:
            self._seen[(group_id, relayed_by)] = True

    def of(self, group_id: str) -> list[str]:
        """Who relayed for ``group_id`` (fleet addresses, and ``0.2.0@host`` entries)."""
        self._seen.expire()
        return sorted(by for (g, by) in list(self._seen.keys()) if g == group_id)


def old_followers(relayers: Iterable[str]) -> list[str]:
    return [r[len(OLD_FOLLOWER):] for r in relayers if r.startswith(OLD_FOLLOWER)]


def _ids(ids: Iterable[str], budget: list[int]) -> list[str]:
    out = []
    for member_id in sorted(ids):
        cost = len(json.dumps(member_id)) + 1
        if cost > budget[0]:
            break
        budget[0] -= cost
        out.append(member_id)
    return out


def releasing_body(release: GroupRelease, holder: str) -> fleet_control.Body:
    budget = [IDS_BUDGET_BYTES]
    return {"type": "GroupReleasing", "group": release.group_id, "holder": holder,
            "to": release.to.value,
            "bound_ms": max(0, int((release.deadline - release.started) * 1000)),
            "members": _ids(release.members, budget),
            "consumers": _ids(release.consumers, budget)}


async def announce(service: CoordinatorService, release: GroupRelease, holder: str,
                   followers: list[str]) -> str | None:
    """``GroupReleasing`` to every follower at once; why not (None: every one acknowledged)."""
    body = releasing_body(release, holder)
    failures: list[str] = []

    async def one(peer: str) -> None:
        address = parse_address(peer)
        if address is None:
            failures.append(f"a relay named no fleet address ({peer!r})")
            return
        try:
            error, _answer = await fleet_control.send(
                address, body, security=service.security, timeout=ANNOUNCE_SECONDS)
        except UpstreamError as exc:
            failures.append(f"the sidecar at {peer} did not acknowledge: {exc}")
            return
        if error != ErrorCode.NONE:
            failures.append(f"the sidecar at {peer} refused: {fleet_control.error_name(error)}")

    async with trio.open_nursery() as nursery:
        for peer in followers:
            nursery.start_soon(one, peer)
    return "; ".join(sorted(failures)) or None


async def tell_released(service: CoordinatorService, release: GroupRelease, holder: str,
                        followers: list[str], protocol: str | None) -> None:
    """``GroupReleased`` to every follower (best effort: one not told decides from the
    broker's group after its bound)."""
    body = {"type": "GroupReleased", "group": release.group_id, "holder": holder,
            "to": release.to.value, "protocol": protocol}

    async def one(peer: str) -> None:
        address = parse_address(peer)
        if address is None:
            return
        try:
            await fleet_control.send(address, body, security=service.security,
                                     timeout=ANNOUNCE_SECONDS)
        except UpstreamError as exc:
            log.info("group %s: could not tell the sidecar at %s that the group was handed "
                     "back: %s (it looks at the broker's group itself)", release.group_id,
                     peer, exc)

    with trio.CancelScope(shield=True):
        async with trio.open_nursery() as nursery:
            for peer in followers:
                nursery.start_soon(one, peer)


class FleetRelease:
    """What a follower answers of a holder's hand-back (:mod:`.fleet_control` handlers)."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service

    def handlers(self) -> dict[str, fleet_control.Handler]:
        return {"GroupReleasing": self.on_releasing, "GroupReleased": self.on_released}

    def on_releasing(self, body: fleet_control.Body, source: str) -> fleet_control.Answer:
        service = self.service
        try:
            group_id = fleet_control.field(body, "group", str)
            holder = fleet_control.field(body, "holder", str)
            to = ReleaseTarget(fleet_control.field(body, "to", str))
            bound_ms = fleet_control.field(body, "bound_ms", int)
            members = [m for m in fleet_control.field(body, "members", list)
                       if isinstance(m, str)]
            consumers = [m for m in fleet_control.field(body, "consumers", list)
                         if isinstance(m, str)]
        except (KeyError, TypeError, ValueError):
            return ErrorCode.INVALID_REQUEST
        if service.engine_claims(group_id):
            log.warning("group %s: %s says it hands the group back, but this sidecar holds it "
                        "(or takes it over); refused", group_id, source)
            return ErrorCode.REBALANCE_IN_PROGRESS
        now = trio.current_time()
        service.releases.forget(group_id)  # an earlier one, replaced
        bound_s = max(0, bound_ms) / 1000 + PEER_SLACK_SECONDS
        started = service.releases.start(group_id, f"the sidecar at {holder} hands it back",
                                         members, consumers, now, bound_s, to, peer=holder)
        if isinstance(started, str):
            return ErrorCode.REBALANCE_IN_PROGRESS
        service.peer_release_started(group_id, started)
        log.warning("group %s: the sidecar at %s hands it back to the broker's %s "
                    "coordinator; this sidecar does not take it over", group_id, holder,
                    "KIP-848" if to is ReleaseTarget.NATIVE else "classic")
        return ErrorCode.NONE

    def on_released(self, body: fleet_control.Body, source: str) -> fleet_control.Answer:
        service = self.service
        try:
            group_id = fleet_control.field(body, "group", str)
            holder = fleet_control.field(body, "holder", str)
            to = ReleaseTarget(fleet_control.field(body, "to", str))
        except (KeyError, TypeError, ValueError):
            return ErrorCode.INVALID_REQUEST
        now = trio.current_time()
        release = service.releases.get(group_id, now)
        if release is None or release.peer != holder:
            # not told it was coming (started since, or the message was lost): believed
            started = service.releases.start(group_id, f"the sidecar at {holder} handed it "
                                             "back", (), (), now, 0.0, to, peer=holder)
            if isinstance(started, str):
                return ErrorCode.REBALANCE_IN_PROGRESS
        service.peer_release_ended(group_id, released=True)
        log.info("group %s: %s handed it back; its members here join the broker's group",
                 group_id, source)
        return ErrorCode.NONE
