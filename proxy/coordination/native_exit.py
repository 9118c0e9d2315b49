"""The exit to a native KIP-848 coordinator: a group handed to Kafka 4.x's own coordinator
(decision record 0018, section 2, "The exit"; ``groupgate release --group G --to native``).

The hand-back itself is the release's (:mod:`.release`: every member gives up its partitions
while the lock is still held, then the engine forgets the group and the lock leaves). What
differs after it, here:

* **The anchor.** Right after the lock left, while the broker's group is Empty, the sidecar
  joins it with a KIP-848 member of its own that subscribes to nothing
  (:meth:`NativeExits.anchor`). An empty classic group always converts on a consumer-protocol
  join, so the broker's group becomes a consumer group before any classic member rejoins it;
  the classic members' held joins are answered only once the anchor is in (or a bound
  passed). Without it the classic members would form a classic generation first, and Kafka
  4.x refuses to upgrade a classic group whose assignments carry user data, which librdkafka's
  sticky assignors write: every KIP-848 client would then be refused (GROUP_ID_NOT_FOUND,
  fatal in librdkafka). The anchor owns nothing (the broker's assignors give an empty
  subscription nothing) and stays until a consumer-protocol member other than itself is in
  the group, then leaves: a consumer group whose last consumer-protocol member leaves while
  classic members remain is downgraded by Kafka's policy, which the anchor's presence
  prevents meanwhile. It leaves when the sidecar stops too.
* **KIP-848 members** are told to rejoin at the broker: each one's first heartbeat after the
  hand-back (its member id is the engine's, which the broker's coordinator never issued) is
  answered UNKNOWN_MEMBER_ID; it rejoins with epoch 0 and from then on its heartbeats go to the
  broker untouched (:func:`heartbeat_outcome`), and so does ConsumerGroupDescribe
  (:func:`describe_outcome`). Their commits carry the broker's member ids and pass as any
  request of a group the engine does not serve.
* **Classic members** rejoin as after any release (their JoinGroups forwarded, without the
  engine's member id), now into the broker's consumer group, where Kafka serves them as
  classic-protocol members.
* **A sidecar that did not hand the group back**, or restarted since, never takes a group the
  broker's KIP-848 coordinator has (:meth:`NativeExits.at_broker`, asked before every
  takeover in front of a broker with a KIP-848 coordinator): Kafka 4.x admits the lock's
  classic JoinGroup into a consumer group (as a classic member, answered without a leader), so
  the check is made before it. The group is then remembered as released to the native
  coordinator (:meth:`~.release.ReleaseBook.found_native`): the broker's own group type is the
  durable record of the exit.

Whether the broker has a KIP-848 coordinator is read once from its ApiVersions
(ConsumerGroupHeartbeat listed), at the first release ``--to native`` or takeover that asks.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import trio

from proxy import __version__
from proxy.codec.api_keys import ApiKey
from proxy.coordination import convert
from proxy.coordination.handler import PASS, Answer, GroupRequest, Outcome
from proxy.coordination.membership import CoordinatorUnavailable, find_coordinator
from proxy.kafka_client.links import Address, LinkPool
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.service import CoordinatorService

log = logging.getLogger("groupgate.coordination")

API_VERSIONS_VERSION = 3
HEARTBEAT_VERSION = 0
DESCRIBE_VERSION = 1
"""ConsumerGroupDescribe v1 says each member's type (classic or consumer protocol)."""
CONSUMER_MEMBER_TYPE = 1
ANCHOR_CLIENT_ID: Final = "groupgate-exit-anchor"
ANCHOR_JOIN_SECONDS = 10.0
"""Longest the hand-back waits for the anchor to be in the broker's group before it answers
the classic members' held joins anyway."""
ANCHOR_CHECK_SECONDS = 2.0
"""How often the anchor looks for a consumer-protocol member other than itself."""
ANCHOR_REBALANCE_TIMEOUT_MS = 30_000
RETRY_SECONDS = 0.2
ANCHORS_MAX = 1000
"""Anchors one sidecar runs at once (one per group it handed to the broker's KIP-848
coordinator that has no consumer-protocol member yet)."""
KIP848_RECHECK_SECONDS = 600.0
"""How long what the broker's ApiVersions said is believed."""
MOVED: Final = frozenset({int(ErrorCode.NOT_COORDINATOR), int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                          int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)})
REJOIN_MESSAGE: Final = ("the group moved to the broker's KIP-848 coordinator (groupgate "
                         "release --to native); rejoin there")


def anchor_member_id() -> str:
    """A member id as KIP-848 clients make them: a random UUID, base64url without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class NativeExits:
    """What the sidecar knows and runs for groups handed to the broker's KIP-848 coordinator:
    whether the broker has one, the check before a takeover, and the anchors."""

    def __init__(self, pool: Callable[[], LinkPool], bootstrap: Sequence[Address]) -> None:
        self._pool = pool
        self._bootstrap = tuple(bootstrap)
        self._kip848: bool | None = None
        self._asked_at = float("-inf")
        self.anchors: dict[str, trio.CancelScope] = {}
        """Groups whose anchor runs here, and the scope ending it."""

    async def broker_has_kip848(self) -> bool:
        """Whether the broker lists ConsumerGroupHeartbeat in its ApiVersions (asked again
        after :data:`KIP848_RECHECK_SECONDS`: a cluster may be upgraded under running
        sidecars; False while it cannot be asked)."""
        if self._kip848 is None or trio.current_time() >= self._asked_at + KIP848_RECHECK_SECONDS:
            for address in self._bootstrap:
                try:
                    answer = await self._pool().link(address).request(
                        ApiKey.API_VERSIONS, API_VERSIONS_VERSION,
                        {"client_software_name": "groupgate",
                         "client_software_version": __version__})
                except UpstreamError as exc:
                    log.info("ApiVersions at %s:%d failed: %s", *address, exc)
                    continue
                if answer.get("error_code") == ErrorCode.NONE:
                    self._asked_at = trio.current_time()
                    self._kip848 = any(k.get("api_key") == ApiKey.CONSUMER_GROUP_HEARTBEAT
                                       for k in answer.get("api_keys") or ())
                    break
        return bool(self._kip848)

    async def at_broker(self, group_id: str) -> bool:
        """Whether the broker's KIP-848 coordinator has ``group_id`` as a consumer group
        (ConsumerGroupDescribe answers it); False in front of a broker without one, and when
        it cannot be asked (the takeover then finds out itself)."""
        if not await self.broker_has_kip848():
            return False
        try:
            with trio.fail_after(5.0):
                _node, coordinator = await find_coordinator(
                    self._pool(), self._bootstrap, group_id, trio.current_time() + 4.0)
                answer = await self._pool().link(coordinator).request(
                    ApiKey.CONSUMER_GROUP_DESCRIBE, DESCRIBE_VERSION,
                    {"group_ids": [group_id], "include_authorized_operations": False})
        except (UpstreamError, CoordinatorUnavailable, trio.TooSlowError) as exc:
            log.info("group %s: could not ask the broker whether its KIP-848 coordinator has "
                     "it: %s", group_id, exc)
            return False
        groups = answer.get("groups") or []
        return bool(groups) and groups[0].get("error_code") == ErrorCode.NONE

    def start_anchor(self, group_id: str, nursery: trio.Nursery) -> trio.Event:
        """Start the anchor of ``group_id`` (once); the event is set when it is in the
        broker's group, or when it gave up joining."""
        joined = trio.Event()
        if group_id in self.anchors or len(self.anchors) >= ANCHORS_MAX:
            joined.set()
            return joined
        scope = self.anchors[group_id] = trio.CancelScope()
        nursery.start_soon(self._anchor, group_id, scope, joined)
        return joined

    async def _anchor(self, group_id: str, scope: trio.CancelScope, joined: trio.Event) -> None:
        member_id = anchor_member_id()
        held = [0]  # the epoch it holds (kept when cancelled, to leave with)
        try:
            with scope:
                await self._hold(group_id, member_id, joined, held)
        except Exception:
            log.exception("group %s: the exit's anchor failed", group_id)
        finally:
            joined.set()
            if self.anchors.get(group_id) is scope:
                del self.anchors[group_id]
            if held[0] > 0:
                with trio.CancelScope(shield=True), trio.move_on_after(5.0):
                    try:
                        _node, coordinator = await find_coordinator(
                            self._pool(), self._bootstrap, group_id, trio.current_time() + 3.0)
                        await self._pool().link(coordinator).request(
                            ApiKey.CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION,
                            _heartbeat(group_id, member_id, -1), client_id=ANCHOR_CLIENT_ID)
                        log.info("group %s: the exit's anchor left the broker's group",
                                 group_id)
                    except (UpstreamError, CoordinatorUnavailable) as exc:
                        log.info("group %s: the exit's anchor could not leave (the broker "
                                 "expires it): %s", group_id, exc)

    async def _hold(self, group_id: str, member_id: str, joined: trio.Event,
                    held: list[int]) -> None:
        """Join, then heartbeat until a consumer-protocol member other than the anchor is in
        the group; ``held[0]``: the epoch it holds (0: not in the group)."""
        give_up_joining = trio.current_time() + ANCHOR_JOIN_SECONDS
        epoch, interval, checked = 0, 1.0, 0.0
        coordinator: Address | None = None
        while True:
            try:
                if coordinator is None:
                    _node, coordinator = await find_coordinator(
                        self._pool(), self._bootstrap, group_id, trio.current_time() + 5.0)
                link = self._pool().link(coordinator)
                answer = await link.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION,
                                            _heartbeat(group_id, member_id, epoch),
                                            client_id=ANCHOR_CLIENT_ID)
                error = int(answer.get("error_code") or 0)
                if error == ErrorCode.NONE:
                    if epoch == 0:
                        log.info("group %s: the exit's anchor is in the broker's group (a "
                                 "consumer group now), epoch %d", group_id,
                                 answer.get("member_epoch"))
                    epoch = held[0] = int(answer.get("member_epoch") or epoch)
                    interval = max(0.1, (answer.get("heartbeat_interval_ms") or 1000) / 1000)
                    joined.set()
                elif error in MOVED:
                    coordinator = None
                    interval = RETRY_SECONDS
                elif error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH):
                    epoch = held[0] = 0  # fenced (e.g. its session passed): in again at once
                    interval = RETRY_SECONDS
                else:
                    log.warning("group %s: the exit's anchor was refused by the broker's "
                                "group (%s: %s); classic members may form a classic group "
                                "first, which Kafka does not upgrade if their assignments "
                                "carry user data", group_id, ErrorCode(error).name
                                if error in ErrorCode._value2member_map_ else error,
                                answer.get("error_message"))
                    return
            except (UpstreamError, CoordinatorUnavailable) as exc:
                log.info("group %s: the exit's anchor: %s", group_id, exc)
                coordinator, interval = None, RETRY_SECONDS
            if epoch == 0 and not joined.is_set() and trio.current_time() >= give_up_joining:
                log.warning("group %s: the exit's anchor did not get into the broker's group "
                            "within %.0f s", group_id, ANCHOR_JOIN_SECONDS)
                joined.set()
            if (epoch > 0 and coordinator is not None
                    and trio.current_time() >= checked + ANCHOR_CHECK_SECONDS):
                checked = trio.current_time()
                if await self._others_in(coordinator, group_id, member_id):
                    log.info("group %s: a consumer-protocol member is in the broker's group; "
                             "the exit's anchor leaves", group_id)
                    return
            await trio.sleep(interval)

    async def _others_in(self, coordinator: Address, group_id: str, member_id: str) -> bool:
        try:
            answer = await self._pool().link(coordinator).request(
                ApiKey.CONSUMER_GROUP_DESCRIBE, DESCRIBE_VERSION,
                {"group_ids": [group_id], "include_authorized_operations": False})
        except UpstreamError:
            return False
        for group in answer.get("groups") or ():
            for member in group.get("members") or ():
                if (member.get("member_id") != member_id
                        and member.get("member_type") == CONSUMER_MEMBER_TYPE):
                    return True
        return False

    def stop_anchors(self) -> None:
        for scope in list(self.anchors.values()):
            scope.cancel()


def _heartbeat(group_id: str, member_id: str, epoch: int) -> dict[str, Any]:
    """The anchor's ConsumerGroupHeartbeat: its join names an empty subscription; later ones
    change nothing; epoch -1 leaves."""
    joining = epoch == 0
    return {"group_id": group_id, "member_id": member_id, "member_epoch": epoch,
            "instance_id": None, "rack_id": None,
            "rebalance_timeout_ms": ANCHOR_REBALANCE_TIMEOUT_MS if joining else -1,
            "subscribed_topic_names": [] if joining else None, "server_assignor": None,
            "topic_partitions": [] if joining else None}


# ---- the requests of a group handed to the native coordinator -----------------------------


def heartbeat_outcome(service: CoordinatorService, request: GroupRequest) -> Outcome | None:
    """A ConsumerGroupHeartbeat of a group handed to the broker's KIP-848 coordinator: the
    first heartbeat of each member the engine had is answered UNKNOWN_MEMBER_ID (it rejoins
    with epoch 0), every other goes to the broker untouched; None: not such a group."""
    value = request.value
    release = service.releases.native(value["group_id"], trio.current_time())
    if release is None:
        return None
    member_id = value.get("member_id") or ""
    if (value.get("member_epoch", 0) > 0 and member_id in release.consumers
            and member_id not in release.told):
        release.told.add(member_id)
        return Answer(convert.consumer_group_heartbeat_error(
            int(ErrorCode.UNKNOWN_MEMBER_ID), REJOIN_MESSAGE))
    return PASS


def describe_outcome(service: CoordinatorService, request: GroupRequest) -> Outcome | None:
    """ConsumerGroupDescribe naming only groups handed to the broker's KIP-848 coordinator:
    the broker describes them; None: another request."""
    now = trio.current_time()
    group_ids = request.value.get("group_ids") or []
    if group_ids and all(service.releases.native(g, now) is not None for g in group_ids):
        return PASS
    return None
