"""The proxy's own member in the broker's classic group of a coordinated group's id.

For every group the engine coordinates, the proxy joins the broker's classic group of the same
id with protocol type ``consumer`` and a protocol name no real client uses
(:data:`PROTOCOL_NAME`). That one membership

* makes offset commits valid: the broker accepts OffsetCommit / TxnOffsetCommit for a group
  with members only when they carry a current member id and generation, and the proxy commits
  on its members' behalf with its own (see :mod:`proxy.coordination.offsets`), so offsets stay
  in the broker where tools and a later downgrade find them;
* fences clients that bypass the proxy: a classic consumer that joins the broker directly
  offers ``range``, ``cooperative-sticky``... which the group does not support, and gets
  INCONSISTENT_GROUP_PROTOCOL instead of consuming the partitions a second time;
* keeps the group's offsets alive: its subscription names the topics the engine's group
  subscribes to. For a live ``consumer`` group whose subscription it can read, Kafka expires
  the offsets of every topic *outside* that subscription once ``offsets.retention.minutes``
  have passed since their last commit (KIP-211), so an empty subscription would let the
  offsets of a running group expire.

:class:`BrokerMembership` runs as one task per group: find the group's coordinator broker,
JoinGroup (v4+ asks for a member id first), SyncGroup (the proxy is the leader of a group of
one and assigns itself nothing), then Heartbeat until cancelled; any error sends it back to
joining. :meth:`BrokerMembership.leave` sends LeaveGroup, so that direct clients can take the
group over once the proxy is gone (graceful shutdown, or the engine group expired).

The membership is also the group's lock between sidecars (:mod:`proxy.coordination.fleet`):
its JoinGroup carries the sidecar's card, and a sidecar the broker does not make the leader
(another joined first) has lost the election: it leaves and the task ends with
:class:`ElectionLost`. A takeover that finds another sidecar holding the group between the
JoinGroup that asks for a member id and the one that joins loses the election without joining
(joining would make the broker rebalance the holder's group twice, for the join and the
leave). Once held, the lock is a lease: the broker drops the member one session
after the last heartbeat it received, so the proxy stops acting (:attr:`interrupted`) once
:data:`LEASE_FRACTION` of a session has passed since the last heartbeat it *sent* that was
answered, before any other sidecar can hold the group. A membership the broker forgot (it
answers UNKNOWN_MEMBER_ID) is not joined again under a new member id: the lease is lost, the
task ends (``on_lost``), and a new takeover starts afresh. A membership the broker does not
answer at all is lost the same way once a whole session has passed since the send time of the
last heartbeat (or SyncGroup) it answered (:attr:`BrokerMembership.session_deadline`): from
then on the broker may have dropped the member and another sidecar may hold the group, so the
proxy must not wait for an answer to conclude it (:attr:`BrokerMembership.cut_off`; the
service then tells the group's members to let go). Between the lease's end and the session's
end nothing is decided yet (:meth:`BrokerMembership.undecided`): the service holds members'
requests until it is (:meth:`BrokerMembership.wait_decided`), so that a member behind a sidecar
cut off from the broker hears that it must let go instead of a retriable error.

Commits carry the member id and generation they were stamped with (:meth:`stamp`) and are
never re-stamped: a commit accepted under one generation lands under it or fails. When the
group's topics change, the membership rejoins to advertise them (a new generation); it first
holds new commits back and lets the ones in flight be answered, so that no commit of the old
generation fails and is retried by its client after newer ones have landed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import trio

from proxy import metrics
from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.coordination.fleet import (
    PROTOCOL_NAME,
    PROTOCOL_TYPE,
    Card,
    card_of,
    read_holder,
    subscription_metadata,
)
from proxy.coordination.in_flight import InFlight
from proxy.fleet_core.lease import LEASE_FRACTION, Lease, LeaseState
from proxy.kafka_client.links import Address, BrokerLink, LinkPool
from proxy.kafka_client.metadata import (
    FIND_COORDINATOR_VERSION,
    FIND_COORDINATORS_VERSION,
    GROUP_KEY,
    find_coordinator_request,
    find_coordinators_request,
)
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

JOIN_VERSION = 5
SYNC_VERSION = 3
HEARTBEAT_VERSION = 3
LEAVE_VERSION = 3
DESCRIBE_VERSION = 3


COORDINATOR_MOVED = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                               ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})
MEMBERSHIP_LOST = frozenset({ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID,
                             ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.FENCED_INSTANCE_ID})
"""Errors on a commit under the proxy's membership that mean it must rejoin."""

SESSION_TIMEOUT_MS = 6_000
"""The proxy's member's session in the broker's group (setting ``broker-session-timeout-ms``):
Kafka's default ``group.min.session.timeout.ms``, so the broker drops the member of a proxy that
died as soon as it allows, and a proxy started again takes the group over within about that."""
MAX_SESSION_TIMEOUT_MS = 300_000
JOIN_WAIT_SECONDS = 30.0
"""Longest the proxy waits for an answer on its link to the group's broker coordinator (a
JoinGroup is answered once the other members have rejoined or been dropped)."""
RETRY_SECONDS = 0.5
DRAIN_SECONDS = 10.0
"""Longest a rejoin for new topics waits for commits in flight under the old generation (and
at most half the session: no heartbeat goes out meanwhile)."""

_ASSIGNMENT = messages.encode_data("ConsumerProtocolAssignment", 0, {"assigned_partitions": []})


def lock_assignment(card: Card) -> bytes:
    """The lock member's own assignment: no partitions, and the card as user data. Kafka 4.x
    refuses to convert a classic group whose members' assignments carry user data (a custom
    assignor's state it would lose), so a KIP-848 client connecting straight to a 4.x broker
    is answered GROUP_ID_NOT_FOUND instead of being let into a group the engine coordinates
    (decision record 0018, section 2); other brokers never read it."""
    return messages.encode_data("ConsumerProtocolAssignment", 0,
                                {"assigned_partitions": [], "user_data": card.encode()})


class MembershipRefused(Exception):
    """The broker's group cannot be joined (e.g. it has members of another protocol)."""


class DirectMembers(MembershipRefused):
    """The broker's group has members of another protocol (INCONSISTENT_GROUP_PROTOCOL):
    clients connected straight to the broker hold it (the group's broker phase)."""


class ElectionLost(MembershipRefused):
    """Another sidecar holds the broker's group (it joined first): this one follows it."""


class LeaseLost(Exception):
    """The broker forgot the proxy's member after it held the group: whatever the proxy knew
    of the group may be stale (another sidecar may have held it meanwhile)."""


class CoordinatorUnavailable(Exception):
    """The broker-side coordinator of the group could not be found or reached."""


async def find_coordinator(pool: LinkPool, bootstrap: Sequence[Address], group_id: str,
                           deadline: float) -> tuple[int, Address]:
    """(node id, address) of the broker coordinating ``group_id``; retries until ``deadline``."""
    last = "no bootstrap server"
    while True:
        for address in bootstrap:
            try:
                response = await pool.link(address).request(
                    ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION,
                    find_coordinator_request(group_id, GROUP_KEY))
            except UpstreamError as exc:
                last = str(exc)
                continue
            if response["error_code"] == ErrorCode.NONE:
                return response["node_id"], (response["host"], response["port"])
            last = f"FindCoordinator error {response['error_code']}"
            break
        if trio.current_time() + RETRY_SECONDS > deadline:
            raise CoordinatorUnavailable(f"group {group_id}: {last}")
        await trio.sleep(RETRY_SECONDS)


async def find_coordinators(pool: LinkPool, bootstrap: Sequence[Address],
                            group_ids: Sequence[str], deadline: float
                            ) -> tuple[dict[str, tuple[int, Address]], dict[str, str]]:
    """The broker coordinating each of ``group_ids``, asked in one FindCoordinator (v4) per
    attempt: (node id, address) by group, and why for the groups still without one at
    ``deadline`` (those whose answer was an error are asked again until then)."""
    found: dict[str, tuple[int, Address]] = {}
    last = dict.fromkeys(group_ids, "no bootstrap server")
    pending = list(last)
    while pending:
        for address in bootstrap:
            try:
                response = await pool.link(address).request(
                    ApiKey.FIND_COORDINATOR, FIND_COORDINATORS_VERSION,
                    find_coordinators_request(pending, GROUP_KEY))
            except UpstreamError as exc:
                for group_id in pending:
                    last[group_id] = str(exc)
                continue
            for answer in response.get("coordinators") or []:
                key = answer["key"]
                if key not in last or key in found:
                    continue
                if answer["error_code"] == ErrorCode.NONE:
                    found[key] = answer["node_id"], (answer["host"], answer["port"])
                else:
                    last[key] = f"FindCoordinator error {answer['error_code']}"
            break
        pending = [g for g in pending if g not in found]
        if not pending or trio.current_time() + RETRY_SECONDS > deadline:
            break
        await trio.sleep(RETRY_SECONDS)
    return found, {g: f"group {g}: {last[g]}" for g in pending}


class BrokerMembership:
    """The proxy's member in the broker's classic group ``group_id`` (one task per group)."""

    def __init__(self, group_id: str, pool: LinkPool, bootstrap: Sequence[Address], *,
                 connect_timeout: float,
                 topics: Callable[[], Iterable[str]] = tuple,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 card: Card | None = None,
                 leave_first: Sequence[tuple[str, str | None]] = ()) -> None:
        self.group_id = group_id
        self.leave_first = tuple(leave_first)
        """Members of the broker's group (member id, instance id) that a LeaveGroup sent just
        before the first JoinGroup, on the same connection, removes: a group converted online
        (:mod:`proxy.coordination.upgrade`) is emptied for the lock."""
        self.card = card or Card(None, "")
        """What the member tells other sidecars (:mod:`proxy.coordination.fleet`)."""
        self.session_timeout_ms = session_timeout_ms
        """Also the member's rebalance timeout: the proxy rejoins as soon as its heartbeat
        hears of a rebalance. Doubled (up to 300 s) while the broker refuses it with
        INVALID_SESSION_TIMEOUT (a ``group.min.session.timeout.ms`` above it)."""
        self._topics = topics
        """The topic names the group subscribes to now (advertised in the subscription)."""
        self.advertised: tuple[str, ...] = ()
        self.commits = InFlight()
        """Commits stamped with the current generation whose answer has not come back."""
        self._stable_changed = trio.Event()
        self._resubscribe = False
        """The group's topics changed: rejoin (after draining) to advertise them."""
        self._planned = False
        """Rejoining by choice (new topics), not because the broker membership failed."""
        self.on_interrupted: Callable[[bool], None] | None = None
        """Told when :attr:`interrupted` changes."""
        self.on_lost: Callable[[str], None] | None = None
        """Told once the lease held earlier is lost for good (the task has ended)."""
        self.on_established: Callable[[], Awaitable[None]] | None = None
        """Awaited once, when the first join succeeded, before anyone waiting on
        :attr:`settled` runs (so that whatever it decides, or loads, applies to every waiting
        request alike); if it raises, the membership fails and leaves the broker's group."""
        self.lease = Lease(LEASE_FRACTION)
        """The lock's lease in trio time (:mod:`proxy.fleet_core.lease`, shared with the fleet
        core): :attr:`lease_deadline` is until when the proxy may act for the group,
        :attr:`session_deadline` from when the broker may have dropped the member (one session
        after the send time of the last heartbeat or SyncGroup it answered; reached without
        another answer, the lease is lost for good, :attr:`cut_off`)."""
        self.cut_off = False
        """The lease was lost because the broker did not answer within a session (rather than
        because it said so): the group's members may not have heard of any other
        coordinator, and must be told to let go."""
        self._lapsed = False
        """The lease ran out before the task noticed (:meth:`lease_expired`): interrupted
        until the broker's group is held again."""
        self.previous_generation = -1
        """The broker group's generation before the proxy's first join (0: the group never
        had members; more: someone held or used it before)."""
        self._pool = pool
        self._bootstrap = tuple(bootstrap)
        self._connect_timeout = connect_timeout
        self.member_id = ""
        self.generation = -1
        self.coordinator_node: int | None = None
        self.coordinator: Address | None = None
        self.stable = False
        """Joined and synced at ``generation``: commits may use it."""
        self.settled = trio.Event()
        """Set once the first attempt succeeded or failed (see :attr:`failure`)."""
        self.failure: str | None = None
        self.failure_kind = ""
        """Why the first attempt failed: ``lost-election`` (another member leads the broker's
        group: a sidecar, an old groupgate or a client connected straight to the broker,
        which the directory tells apart), ``refused`` (the broker refused the membership,
        e.g. its group has members of another protocol) or ``unavailable`` (the broker could
        not be reached or had no coordinator: worth trying again)."""
        self.direct_members = False
        """The first attempt was refused because the broker's group has members of another
        protocol (:class:`DirectMembers`)."""
        self.left = False
        self._rejoin = trio.Event()
        self._link: BrokerLink | None = None
        self._scope = trio.CancelScope()

    # -- what the service uses --------------------------------------------------------------

    @property
    def lease_deadline(self) -> float:
        return self.lease.lease_deadline

    @lease_deadline.setter
    def lease_deadline(self, value: float) -> None:
        self.lease.lease_deadline = value

    @property
    def session_deadline(self) -> float:
        return self.lease.session_deadline

    @property
    def established(self) -> bool:
        return self.settled.is_set() and self.failure is None

    def fail(self, reason: str) -> None:
        """The membership's task ended with a bug: it holds nothing; whoever waits for it
        learns why."""
        if self.failure is None:
            self.failure = reason
        self.left = True
        self.settled.set()
        self._set_stable(False)
        self._wake_waiters()

    def request_rejoin(self) -> None:
        """A commit found the membership stale: rejoin at the next opportunity."""
        self._set_stable(False)
        self._rejoin.set()

    def subscription_changed(self) -> None:
        """The group's topics may have changed: rejoin to advertise them if they did."""
        if self.stable and tuple(sorted(set(self._topics()))) != self.advertised:
            self._resubscribe = True
            self._rejoin.set()

    def stamp(self) -> tuple[str, int, Callable[[], None]]:
        """(member id, generation) for a commit, and the callable to call exactly once when
        its answer is back or will never come (counts it as in flight meanwhile)."""
        release = self.commits.track()
        return self.member_id, self.generation, release

    async def wait_stable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until commits may be stamped."""
        with trio.move_on_after(timeout):
            while not self.stable:
                if self.left or (self.settled.is_set() and self.failure is not None):
                    return False
                await self._stable_changed.wait()  # replaced by a fresh one once set
        return self.stable

    def lease_expired(self) -> bool:
        """Whether the lease has run out, possibly without the task noticing yet (the process
        was frozen or starved past it): the proxy must not act for the group, whatever
        :attr:`stable` still says, until the broker answers again. Seeing it also acts on it
        at once, before anything else can act for the group: a lease that ran out makes the
        membership :attr:`interrupted` (``on_interrupted``) until the group is held again; a
        whole session without an answer loses the lease for good (:attr:`cut_off`,
        ``on_lost``)."""
        if not self.established:
            return False
        if self.left:
            return True
        state = self.lease.state(trio.current_time())
        if state is LeaseState.LOST:
            self._cut_off()
            return True
        if state is LeaseState.UNDECIDED:
            self._lapse()
            return True
        return False

    def undecided(self) -> bool:
        """Whether the lease has run out while the broker may still answer within the session
        (from :attr:`lease_deadline` to :attr:`session_deadline`, the last
        ``1 - LEASE_FRACTION`` of a session): the proxy must not act for the group, and does
        not know yet whether it holds the group again or has lost it
        (:meth:`wait_decided`)."""
        if not self.established or self.left:
            return False
        return self.lease.state(trio.current_time()) is LeaseState.UNDECIDED

    async def wait_decided(self) -> None:
        """While :meth:`undecided`: wait until the broker answers again (the group is held
        again), the lease is lost, or the session ends; then act on what is known
        (:meth:`lease_expired`: at the session's end the lease is lost for good and the
        service tells the group's members to let go). At most ``1 - LEASE_FRACTION`` of a
        session."""
        with trio.move_on_at(self.session_deadline):
            while self.undecided():
                await self._stable_changed.wait()  # replaced by a fresh one once set
        self.lease_expired()

    async def wait_cut_off(self) -> None:
        """Return once the lease is lost because the broker did not answer for a whole
        session (:attr:`cut_off`): no answer from it is to be expected on any link."""
        while not self.cut_off:
            await self._stable_changed.wait()  # replaced by a fresh one once set

    @property
    def interrupted(self) -> bool:
        """Established once, but not holding the broker's group right now for a reason other
        than a planned rejoin (the broker is unreachable, the coordinator moved, the broker
        forgot the member), or its lease ran out (:meth:`lease_expired`, even in a planned
        rejoin): the proxy is not the group's coordinator until it holds it again."""
        return (self.established and not self.left
                and (self._lapsed or (not self.stable and not self._planned)))

    def _lapse(self) -> None:
        if self._lapsed:
            return
        before = self.interrupted
        self._lapsed = True
        if not before and self.on_interrupted is not None:
            self.on_interrupted(True)

    def _answered(self, sent: float) -> None:
        """The broker answered a heartbeat or SyncGroup sent at ``sent`` (trio time): it
        cannot drop the member before a session after that."""
        self.lease.answered(sent, self.session_timeout_ms / 1000)

    def _set_stable(self, stable: bool) -> None:
        before = self.interrupted
        if stable:
            self._lapsed = False
        if stable != self.stable:
            self.stable = stable
            self._wake_waiters()
        after = self.interrupted
        if before != after and self.on_interrupted is not None:
            self.on_interrupted(after)

    def _wake_waiters(self) -> None:
        """Wake every commit waiting in :meth:`wait_stable` (each checks again what it waits
        for); later waiters wait for the next change."""
        self._stable_changed.set()
        self._stable_changed = trio.Event()

    def _lose(self, reason: str, event: str = "lost") -> None:
        """The lease held earlier is gone for good: stop acting, end, tell the service."""
        if self.left:
            return
        log.warning("group %s: lost the broker's group: %s", self.group_id, reason)
        metrics.LEASE_EVENTS.labels(event).inc()
        self._set_stable(False)
        self.left = True
        self.lease.drop()
        self._wake_waiters()
        if self.on_lost is not None:
            self.on_lost(reason)

    def _cut_off(self) -> None:
        """A whole session passed without an answer from the broker: the lease is lost for
        good (whoever notices first: the task, or the service before it acts for the
        group); the task ends."""
        if self.left:
            return
        self.cut_off = True
        self._scope.cancel()
        self._lose(f"no answer from the broker within a session ({self.session_timeout_ms} "
                   "ms) of the last answered heartbeat; it may have given the group to "
                   "another sidecar", "cut-off")

    async def _leave_quietly(self) -> None:
        """LeaveGroup after losing an election (best effort, the task goes on to end)."""
        if self.member_id and self._link is not None:
            with trio.move_on_after(5):
                try:
                    await self._link.request(ApiKey.LEAVE_GROUP, LEAVE_VERSION, {
                        "group_id": self.group_id,
                        "members": [{"member_id": self.member_id, "group_instance_id": None}],
                    })
                except UpstreamError as exc:
                    log.info("group %s: LeaveGroup after the election failed: %s",
                             self.group_id, exc)
        self.member_id = ""

    async def leave(self) -> None:
        """LeaveGroup at the broker (best effort) and stop the task."""
        self._scope.cancel()
        if self.left:
            return
        self.left = True
        self.lease.drop()
        if not self.settled.is_set():
            # given up before the first attempt was decided (a takeover under way when the
            # proxy steps down, or the group given up): whoever waits for the takeover is
            # answered now (COORDINATOR_NOT_AVAILABLE: a follower relaying to this sidecar
            # looks the group up again), not when its own wait runs out
            self.failure = "left the broker's group before holding it"
            self.failure_kind = "unavailable"
            self.settled.set()
        self._wake_waiters()
        if self.member_id and self._link is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await self._link.request(ApiKey.LEAVE_GROUP, LEAVE_VERSION, {
                        "group_id": self.group_id,
                        "members": [{"member_id": self.member_id, "group_instance_id": None}],
                    })
                    log.info("group %s: left the broker's group (member %s)", self.group_id,
                             self.member_id)
                except UpstreamError as exc:
                    log.warning("group %s: LeaveGroup failed: %s", self.group_id, exc)
        self._set_stable(False)
        if self._link is not None:
            with trio.CancelScope(shield=True):
                await self._link.aclose()

    # -- the task ---------------------------------------------------------------------------

    async def run(self) -> None:
        with self._scope:
            first = True
            while True:
                try:
                    if first:
                        await self._join_and_sync(first)
                    else:
                        # answered within the session, or the lease is lost for good
                        with trio.move_on_at(self.session_deadline) as rejoining:
                            await self._join_and_sync(first)
                        if rejoining.cancelled_caught:
                            self._cut_off()
                            return
                except LeaseLost as exc:
                    self._lose(str(exc))
                    return
                except ElectionLost as exc:
                    metrics.LEASE_EVENTS.labels("lost-election").inc()
                    await self._leave_quietly()
                    if first:
                        self.failure = str(exc)
                        self.failure_kind = "lost-election"
                        self.settled.set()
                        self._set_stable(False)
                    else:
                        self._lose(str(exc))
                    return
                except (MembershipRefused, CoordinatorUnavailable, UpstreamError) as exc:
                    self._planned = False
                    self._set_stable(False)
                    if first:
                        self.failure = str(exc)
                        self.failure_kind = ("refused" if isinstance(exc, MembershipRefused)
                                             else "unavailable")
                        self.direct_members = isinstance(exc, DirectMembers)
                        self.settled.set()
                        return
                    log.warning("group %s: broker-side membership lost, rejoining: %s",
                                self.group_id, exc)
                    if not isinstance(exc, MembershipRefused):
                        # the coordinator broker may be gone: ask who coordinates the group
                        # now (after a failover its new coordinator knows this member)
                        self.coordinator = None
                    with trio.move_on_at(self.session_deadline) as waiting:
                        await trio.sleep(RETRY_SECONDS)
                    if waiting.cancelled_caught:
                        self._cut_off()
                        return
                    continue
                if first:
                    first = False
                    metrics.LEASE_EVENTS.labels("won").inc()
                    if self.on_established is not None:
                        try:
                            await self._established_hook(self.on_established)
                        except Exception as exc:
                            log.warning("group %s: not coordinating it: %s", self.group_id, exc)
                            await self._leave_quietly()
                            self.fail(str(exc))
                            return
                    self.settled.set()
                await self._heartbeat_until_rejoin()

    async def _established_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` (e.g. loading the group's state) while heartbeating, so that a slow
        hook does not let the broker drop the member; a heartbeat error ends it (the
        takeover fails and is tried again from the start)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeat_during_hook)
            await hook()
            nursery.cancel_scope.cancel()

    async def _heartbeat_during_hook(self) -> None:
        assert self._link is not None
        while True:
            await trio.sleep(self.session_timeout_ms / 3000)
            sent = trio.current_time()
            response = await self._link.request(ApiKey.HEARTBEAT, HEARTBEAT_VERSION, {
                "group_id": self.group_id, "generation_id": self.generation,
                "member_id": self.member_id, "group_instance_id": None})
            if response["error_code"] != ErrorCode.NONE:
                raise MembershipRefused(f"heartbeat error {response['error_code']} while "
                                        "taking the group over")
            self._answered(sent)

    async def _connect(self) -> BrokerLink:
        if self.coordinator is None or self._link is None:
            if self._link is not None:
                await self._link.aclose()
            deadline = trio.current_time() + self._connect_timeout
            self.coordinator_node, self.coordinator = await find_coordinator(
                self._pool, self._bootstrap, self.group_id, deadline)
            # a JoinGroup waits for the other members of the broker's group (other proxies)
            wait = max(JOIN_WAIT_SECONDS, self.session_timeout_ms / 1000)
            self._link = self._pool.dedicated(self.coordinator, wait + self._connect_timeout)
        return self._link

    async def _join_and_sync(self, first: bool) -> None:
        self._set_stable(False)
        self._rejoin = trio.Event()
        self._resubscribe = False
        held_as = "" if first else self.member_id
        if first and self.leave_first:
            await self._empty_the_group()
        for _ in range(10):
            link = await self._connect()
            topics = tuple(sorted(set(self._topics())))
            metrics.BROKER_GROUP_JOINS.labels("takeover" if first else "rejoin").inc()
            join = await link.request(ApiKey.JOIN_GROUP, JOIN_VERSION, {
                "group_id": self.group_id,
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.session_timeout_ms,
                "member_id": self.member_id,
                "group_instance_id": None,
                "protocol_type": PROTOCOL_TYPE,
                "protocols": [{"name": PROTOCOL_NAME,
                               "metadata": subscription_metadata(topics, self.card)}],
            })
            error = join["error_code"]
            if error == ErrorCode.MEMBER_ID_REQUIRED:
                if held_as:
                    raise LeaseLost(f"the broker forgot member {held_as}")
                self.member_id = join["member_id"]
                if first:
                    await self._not_held_elsewhere(link)
                continue
            if error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                if held_as and error == ErrorCode.UNKNOWN_MEMBER_ID:
                    raise LeaseLost(f"the broker forgot member {held_as}")
                self.member_id = ""
                continue
            if error in COORDINATOR_MOVED:
                self.coordinator = None
                await trio.sleep(RETRY_SECONDS)
                continue
            if error == ErrorCode.REBALANCE_IN_PROGRESS:
                continue
            if (error == ErrorCode.INVALID_SESSION_TIMEOUT
                    and self.session_timeout_ms < MAX_SESSION_TIMEOUT_MS):
                self.session_timeout_ms = min(2 * self.session_timeout_ms, MAX_SESSION_TIMEOUT_MS)
                log.warning("group %s: the broker refused the session timeout; trying %d ms "
                            "(see broker-session-timeout-ms)", self.group_id,
                            self.session_timeout_ms)
                continue
            if error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
                raise DirectMembers(
                    f"the broker's group {self.group_id} has members connected straight to the "
                    "broker with another protocol")
            if error != ErrorCode.NONE:
                raise MembershipRefused(f"JoinGroup for {self.group_id} failed with error {error}")
            self.member_id = join["member_id"]
            if held_as and self.member_id != held_as:
                raise LeaseLost(f"the broker gave member {held_as} up")
            generation = join["generation_id"]
            if self.previous_generation < 0:
                # the generation this member's first join made: the group's before it is the
                # one below (a sync that fails because another member joined meanwhile makes
                # the next one higher, though nobody held the group before)
                self.previous_generation = generation - 1
            if join["leader"] != self.member_id:
                raise ElectionLost(f"another sidecar holds the broker's group {self.group_id}")
            self._check_members(join["members"])
            assignments = [{"member_id": m["member_id"],
                             "assignment": (lock_assignment(self.card)
                                            if m["member_id"] == self.member_id
                                            else _ASSIGNMENT)}
                           for m in join["members"]]
            sent = trio.current_time()
            sync = await link.request(ApiKey.SYNC_GROUP, SYNC_VERSION, {
                "group_id": self.group_id,
                "generation_id": generation,
                "member_id": self.member_id,
                "group_instance_id": None,
                "assignments": assignments,
            })
            error = sync["error_code"]
            if held_as and self.left:  # cut off while the answer was on its way
                raise LeaseLost("the lease was lost while rejoining")
            if error == ErrorCode.NONE:
                self.generation = generation
                self._answered(sent)
                self.advertised = topics
                self._planned = False
                self._set_stable(True)
                log.info("group %s: holding the broker's group as member %s, generation %d, "
                         "topics %s", self.group_id, self.member_id, generation,
                         ",".join(topics) or "-")
                return
            if error in COORDINATOR_MOVED:
                self.coordinator = None
            elif error == ErrorCode.UNKNOWN_MEMBER_ID and held_as:
                raise LeaseLost(f"the broker forgot member {held_as}")
            elif error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                self.member_id = ""
        raise CoordinatorUnavailable(f"group {self.group_id}: could not join the broker's group")

    async def _empty_the_group(self) -> None:
        """LeaveGroup naming every member of the broker's group (:attr:`leave_first`), right
        before the lock's JoinGroup on the same connection (once: the members are gone)."""
        link = await self._connect()
        leaving, self.leave_first = self.leave_first, ()
        response = await link.request(ApiKey.LEAVE_GROUP, LEAVE_VERSION, {
            "group_id": self.group_id,
            "members": [{"member_id": member_id, "group_instance_id": instance}
                        for member_id, instance in leaving]})
        errors = [m for m in response.get("members") or () if m.get("error_code")]
        if response.get("error_code") or errors:
            log.warning("group %s: LeaveGroup for the members of the broker's group answered "
                        "error %s, members %s", self.group_id, response.get("error_code"),
                        [(m.get("member_id"), m.get("error_code")) for m in errors])

    async def _not_held_elsewhere(self, link: BrokerLink) -> None:
        """Before the JoinGroup that adds this member to the broker's group (the broker then
        rebalances the group, and its holder learns of it only at its next heartbeat, up to a
        third of a session later, twice: for this join and for the leave after the lost
        election): if another sidecar, one that can be followed, holds the group already,
        lose the election without joining. Two sidecars whose members ask for a new group
        at the same moment both find it free; the one whose JoinGroup comes second used to
        join the group the first one had just formed (tens of milliseconds later). The
        member id the broker asked for is only pending until that JoinGroup: leaving it
        disturbs nobody."""
        response = await link.request(ApiKey.DESCRIBE_GROUPS, DESCRIBE_VERSION, {
            "groups": [self.group_id], "include_authorized_operations": False})
        groups = response.get("groups") or []
        if len(groups) != 1:
            return
        holder = read_holder(groups[0], frozenset({self.member_id}))
        card = holder.card
        if (holder.kind == "sidecar" and card is not None and card.address is not None
                and card.address != self.card.address):
            raise ElectionLost(f"another sidecar holds the broker's group {self.group_id} "
                               f"(member {holder.member_id}); not joining it")

    def _check_members(self, members: list[dict[str, object]]) -> None:
        """As the leader: a member without a card is a groupgate from before the fleet, which
        coordinates on its own; never act next to it. Members with a card lost the election
        and leave by themselves."""
        for member in members:
            if member["member_id"] == self.member_id:
                continue
            metadata = member.get("metadata")
            if card_of(metadata if isinstance(metadata, bytes | bytearray | memoryview)
                       else None) is None:
                raise ElectionLost(
                    f"a groupgate without fleet support (0.1.0) is a member of the broker's "
                    f"group {self.group_id}; not coordinating next to it")

    async def _drain(self) -> None:
        """Before a rejoin the proxy chose: hold new commits, let those in flight finish."""
        self._planned = True
        self._set_stable(False)
        bound = min(DRAIN_SECONDS, self.session_timeout_ms / 2000)
        if not await self.commits.drained(bound):
            log.warning("group %s: %d commit(s) still unanswered after %.1f s; rejoining "
                        "anyway", self.group_id, self.commits.count, bound)

    async def _stop_acting_at(self, lease_deadline: float) -> None:
        """While a heartbeat is unanswered: at ``lease_deadline`` stop acting for the group
        (the broker may drop the member a fifth of a session later) until it is answered."""
        await trio.sleep_until(lease_deadline)
        if trio.current_time() >= self.session_deadline:  # woken past the whole session
            self._cut_off()
            return
        metrics.LEASE_EVENTS.labels("expired").inc()
        log.warning("group %s: no heartbeat answered within %.1f s of the last; stopping "
                    "before the broker can give the group to another sidecar", self.group_id,
                    LEASE_FRACTION * self.session_timeout_ms / 1000)
        self._lapse()
        self._set_stable(False)

    async def _heartbeat_until_rejoin(self) -> None:
        while True:
            with trio.move_on_after(self.session_timeout_ms / 3000):  # Kafka's ratio
                await self._rejoin.wait()
            if self._rejoin.is_set():
                if self._resubscribe and self.stable:
                    await self._drain()
                return
            assert self._link is not None
            sent = trio.current_time()
            if sent >= self.session_deadline:  # frozen or starved past the whole session
                self._cut_off()
                return
            response: dict[str, Any] | None = None
            failure: UpstreamError | None = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stop_acting_at, self.lease_deadline)
                # the answer is awaited until the session's end, not the lease's: one that
                # comes after the lease ran out (the process was frozen or starved past it)
                # still holds the group; cancelling the request at the lease's end reset the
                # connection and left a whole rejoin (a new connection, FindCoordinator,
                # JoinGroup, SyncGroup) for what was left of the session
                with trio.move_on_at(self.session_deadline):
                    try:
                        response = await self._link.request(
                            ApiKey.HEARTBEAT, HEARTBEAT_VERSION, {
                                "group_id": self.group_id, "generation_id": self.generation,
                                "member_id": self.member_id, "group_instance_id": None})
                    except UpstreamError as exc:
                        failure = exc
                nursery.cancel_scope.cancel()
            if failure is not None:
                log.warning("group %s: broker heartbeat failed: %s", self.group_id, failure)
                self.coordinator = None
                return
            if response is None:  # a whole session without an answer
                self._cut_off()
                return
            error = response["error_code"]
            if error == ErrorCode.NONE:
                self._answered(sent)
                if (self._lapsed and not self._rejoin.is_set()
                        and self.lease.state(trio.current_time()) is LeaseState.HELD):
                    self._set_stable(True)
                    log.info("group %s: heartbeat answered %.1f s after it was sent; holding "
                             "the broker's group again as member %s, generation %d",
                             self.group_id, trio.current_time() - sent, self.member_id,
                             self.generation)
                continue
            log.info("group %s: broker heartbeat error %d, rejoining", self.group_id, error)
            if error in COORDINATOR_MOVED:
                self.coordinator = None
            return
