"""Finding a group's coordinating sidecar and relaying requests to it.

:class:`Directory` answers "who holds group G at the broker" (:class:`~.fleet.Holder`) from a
DescribeGroups at the group's broker coordinator, cached for :data:`~.fleet.VIEW_SECONDS`;
concurrent lookups of one group share one request, and the groups of one request (a describe
of many groups) are looked up together: one FindCoordinator (v4, an array of keys) and one
DescribeGroups per coordinating broker. :class:`ConnectionLinks` belongs to one client
connection and keeps one connection per coordinating sidecar it relays to (and, on the fleet
listener, per broker it sends relayed commits to), so that a client's group requests reach the
coordinator in the order the client sent them (the router lets no later request of the
connection pass a relayed one), and a JoinGroup held there for seconds holds nobody else's.
:class:`Routes` decides where a request goes; :class:`FleetSide` is what a connection's router
holds of all this.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio
from cachetools import TLRUCache, TTLCache

from proxy import metrics
from proxy.codec.api_keys import ApiKey
from proxy.coordination.fleet import (
    FLEET_PROTOCOL,
    SETTLED_VIEW_SECONDS,
    VIEW_SECONDS,
    Address,
    Card,
    Holder,
    read_holder,
)
from proxy.coordination.membership import find_coordinators
from proxy.kafka_client.links import BrokerLink, LinkPool
from proxy.upstream import UpstreamAuthenticationError, UpstreamConnectError, UpstreamError

log = logging.getLogger("groupgate.coordination")

DESCRIBE_VERSION = 3
LOOKUP_SECONDS = 5.0
"""Longest a lookup waits for the broker before the group's holder counts as unknown."""
LOOKUP_WAIT_SHARE = 0.5
"""The share of the members' heartbeat interval a request waits for its group's lookup
(:func:`lookup_wait`)."""
LOOKUP_BATCH = 250
"""Most groups looked up in one FindCoordinator and one DescribeGroups (a request naming more,
a describe of many groups, is looked up in batches of this many, one after another)."""
SETTLE_SECONDS = 0.25
"""How long a lookup waits before asking again about a group the broker is rebalancing."""
REMEMBERED_MAX = 10_000
HISTORY_SECONDS = 3600.0
"""How long the kind of a group's last holder is remembered (see
:meth:`Directory.last_kind`)."""
RELAY_TIMEOUT_SECONDS = 330.0
"""Longest a relayed JoinGroup or SyncGroup waits for the coordinating sidecar (a JoinGroup may
be held for the member's rebalance timeout, Kafka's default being 300 s)."""
RELAY_HEARTBEAT_SECONDS = 6.0
"""Longest a relayed heartbeat (ConsumerGroupHeartbeat, classic Heartbeat) waits for the
coordinating sidecar: the coordinator answers a heartbeat within half a heartbeat interval
(or its 10 s takeover wait, for classic ones, which the client then retries), so a longer
silence means a frozen or unreachable coordinator, whose broker membership ends within a
broker session; the follower drops its view and looks the group up again, so that another
sidecar can take the group over instead of every member waiting on a relay."""
RELAY_OTHER_SECONDS = 20.0
"""Longest any other relayed request (commits, offset fetches) waits: a commit may wait 15 s
at the coordinator for its broker membership."""


def relay_timeout(api_key: int) -> float:
    """How long a relayed request of ``api_key`` waits for the coordinating sidecar."""
    if api_key in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP):
        return RELAY_TIMEOUT_SECONDS
    if api_key in (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.HEARTBEAT):
        return RELAY_HEARTBEAT_SECONDS
    return RELAY_OTHER_SECONDS


def lookup_wait(heartbeat_interval_ms: int) -> float:
    """How long after a group's lookup began a request waits for it (:attr:`Routes.lookup_wait`):
    :data:`LOOKUP_WAIT_SHARE` of the members' heartbeat interval, at most
    :data:`LOOKUP_SECONDS`. librdkafka times a heartbeat out after one interval, and the
    requests queued behind a waiting one on its connection (a heartbeat behind a commit) are
    decided only once it is answered: a lookup that takes longer (the broker out of reach)
    goes on, and every request of its group is answered COORDINATOR_NOT_AVAILABLE meanwhile,
    at once, so the clients retry on their own backoff with their connections up."""
    return min(LOOKUP_SECONDS, LOOKUP_WAIT_SHARE * heartbeat_interval_ms / 1000)


def _view_expiry(_group_id: str, holder: Holder, now: float) -> float:
    """A free or unused group is looked at again soon (acting on a stale view of one means
    joining the broker's group, which disturbs the holder), and so is one an old groupgate
    holds (its members here wait until it is gone), and so is one a sidecar without a fleet listener
    holds (a proxy restarted here takes it over once the broker drops the dead holder); one a
    fleet sidecar or the broker's own members hold
    later (a stale view corrects itself: the relay fails or is answered NOT_COORDINATOR, and
    the view is dropped)."""
    short = holder.kind in ("free", "unused", "legacy") or (
        holder.card is not None and holder.card.address is None)
    return now + (VIEW_SECONDS if short else SETTLED_VIEW_SECONDS)


class Directory:
    """Cached answers to "who holds this group at the broker"."""

    def __init__(self, pool: Callable[[], LinkPool], bootstrap: Sequence[Address]) -> None:
        self._pool = pool
        """The service's pool of broker links (read at each lookup)."""
        self._bootstrap = tuple(bootstrap)
        self._views: TLRUCache[str, Holder] = TLRUCache(
            maxsize=REMEMBERED_MAX, ttu=_view_expiry, timer=trio.current_time)
        self._lookups: dict[str, trio.Event] = {}
        self._began: dict[str, float] = {}
        """When the lookup under way of each group of ``_lookups`` began."""
        self.background: trio.Nursery | None = None
        """Where a lookup the requests stopped waiting for goes on (the service's nursery,
        while it runs: :meth:`lookup_within`); None: each lookup runs in the task asking."""
        self._last_kind: TTLCache[str, str] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=HISTORY_SECONDS, timer=trio.current_time)

    def last_kind(self, group_id: str) -> str | None:
        """The kind of holder last seen for ``group_id`` (within :data:`HISTORY_SECONDS`)."""
        return self._last_kind.get(group_id)

    def view(self, group_id: str) -> Holder | None:
        """The holder seen less than :data:`VIEW_SECONDS` ago, or None."""
        return self._views.get(group_id)

    def forget(self, group_id: str) -> None:
        self._views.pop(group_id, None)

    def holders(self) -> list[Holder]:
        """The holders seen less than :data:`VIEW_SECONDS` ago (for metrics)."""
        self._views.expire()
        return list(self._views.values())

    async def lookup(self, group_id: str, own_member_ids: frozenset[str] = frozenset()
                     ) -> Holder:
        """Ask the broker (once for all who ask at the same time)."""
        return (await self.lookup_many((group_id,), own_member_ids))[group_id]

    async def lookup_many(self, group_ids: Sequence[str],
                          own_member_ids: frozenset[str] = frozenset()) -> dict[str, Holder]:
        """Ask the broker about every group of ``group_ids`` at once (one FindCoordinator and
        one DescribeGroups per coordinating broker for up to :data:`LOOKUP_BATCH` groups); a
        group someone is already asking about is not asked again but waited for."""
        wanted = list(dict.fromkeys(group_ids))
        waiting = [(g, self._lookups[g]) for g in wanted if g in self._lookups]
        mine = [g for g in wanted if g not in self._lookups]
        found = await self._run(mine, self._begin(mine), own_member_ids) if mine else {}
        for group_id, pending in waiting:
            await pending.wait()
            found[group_id] = (self._views.get(group_id)
                               or Holder("unknown", detail="lookup failed"))
        return found

    async def lookup_within(self, group_ids: Sequence[str], wait: float
                            ) -> dict[str, Holder]:
        """Every group of ``group_ids`` as :meth:`lookup_many` finds it, waited for until
        ``wait`` after the earliest lookup of them under way began (a request coming while
        one has gone on longer waits for nothing). A group not found by then counts as
        unknown, while its lookup goes on in :attr:`background` and what it finds is
        remembered for the next request. Without :attr:`background`, :meth:`lookup_many`."""
        nursery = self.background
        if nursery is None:
            return await self.lookup_many(group_ids)
        wanted = list(dict.fromkeys(group_ids))
        mine = [g for g in wanted if g not in self._lookups]
        if mine:
            nursery.start_soon(self._in_background, mine, self._begin(mine))
        with trio.move_on_at(min(self._began[g] for g in wanted) + wait):
            for group_id in wanted:
                pending = self._lookups.get(group_id)
                if pending is not None:
                    await pending.wait()
        return {g: self._views.get(g) or Holder(
                    "unknown", detail=f"the lookup failed or is still under way ({wait:g} s)")
                for g in wanted}

    def _begin(self, group_ids: list[str]) -> trio.Event:
        """Note the lookup of ``group_ids`` under way: set once it ended."""
        done = trio.Event()
        now = trio.current_time()
        for group_id in group_ids:
            self._lookups[group_id] = done
            self._began[group_id] = now
        return done

    async def _run(self, group_ids: list[str], done: trio.Event,
                   own_member_ids: frozenset[str]) -> dict[str, Holder]:
        """Look ``group_ids`` up (:meth:`_begin` noted them) and remember what was found."""
        found: dict[str, Holder] = {}
        try:
            for i in range(0, len(group_ids), LOOKUP_BATCH):
                batch = group_ids[i:i + LOOKUP_BATCH]
                for group_id, holder in (await self._describe(batch, own_member_ids)).items():
                    found[group_id] = holder
                    if holder.kind != "unknown":
                        self._views[group_id] = holder
                        if holder.kind not in ("free", "unused"):
                            self._last_kind[group_id] = holder.kind
        finally:
            for group_id in group_ids:
                del self._lookups[group_id]
                del self._began[group_id]
            done.set()
        return found

    async def _in_background(self, group_ids: list[str], done: trio.Event) -> None:
        try:
            await self._run(group_ids, done, frozenset())
        except Exception:  # the next request looks the groups up again
            log.exception("looking up who holds %s failed", ",".join(group_ids))

    async def _describe(self, group_ids: list[str], own_member_ids: frozenset[str]
                        ) -> dict[str, Holder]:
        deadline = trio.current_time() + LOOKUP_SECONDS
        found: dict[str, Holder] = {}
        asking = group_ids
        while True:
            answers = await self._describe_once(asking, own_member_ids, deadline)
            found.update(answers)
            asking = [g for g in asking if answers[g].settling]
            if not asking or trio.current_time() + SETTLE_SECONDS >= deadline:
                return found
            await trio.sleep(SETTLE_SECONDS)  # the broker's group is rebalancing: look again

    async def _describe_once(self, group_ids: list[str], own_member_ids: frozenset[str],
                             deadline: float) -> dict[str, Holder]:
        """Each group's holder as its broker coordinator describes it now."""
        found: dict[str, Holder] = {}
        pool = self._pool()
        coordinators, missing = await find_coordinators(pool, self._bootstrap, group_ids,
                                                        deadline)
        for group_id, why in missing.items():
            log.info("group %s: could not ask the broker who holds it: %s", group_id, why)
            found[group_id] = Holder("unknown", detail=why)
        by_broker: dict[tuple[int, Address], list[str]] = {}
        for group_id, coordinator in coordinators.items():
            by_broker.setdefault(coordinator, []).append(group_id)

        async def describe(coordinator: tuple[int, Address], groups: list[str]) -> None:
            try:
                with trio.fail_after(max(deadline - trio.current_time(), 0.5)):
                    response = await pool.link(coordinator[1]).request(
                        ApiKey.DESCRIBE_GROUPS, DESCRIBE_VERSION,
                        {"groups": groups, "include_authorized_operations": False})
            except (UpstreamError, trio.TooSlowError) as exc:
                for group_id in groups:
                    log.info("group %s: could not ask the broker who holds it: %s",
                             group_id, exc)
                    found[group_id] = Holder("unknown", detail=str(exc))
                return
            described = {g.get("group_id"): g for g in response.get("groups") or []}
            for group_id in groups:
                group = described.get(group_id)
                found[group_id] = (
                    Holder("unknown", detail="DescribeGroups answered no group")
                    if group is None else
                    dataclasses.replace(read_holder(group, own_member_ids),
                                        coordinator=coordinator))

        async with trio.open_nursery() as nursery:
            for coordinator, groups in by_broker.items():
                nursery.start_soon(describe, coordinator, groups)
        return found


PROBLEM_SECONDS = 60.0
"""How long a case where this sidecar could not follow a group's coordinator is reported (by
``/readyz``) and how often it is logged (once per case in that time)."""
PROBLEMS_MAX = 100
"""Cases reported at once (the rest are counted, not listed)."""
NO_ADDRESS: Final = "no-address"
UNREACHABLE: Final = "unreachable"


class FleetProblems:
    """Where this sidecar, following a group another sidecar coordinates, cannot reach it: the
    holder has no fleet address (:data:`NO_ADDRESS`) or no connection to its address can be
    opened (:data:`UNREACHABLE`; not a connection it closed, as a stopping holder does). Each
    case is logged as a WARNING naming the settings to check (once per case every
    :data:`PROBLEM_SECONDS`), counted in ``groupgate_fleet_unfollowable_total{reason}`` and
    listed by :meth:`summary` (the ``/readyz`` answer's detail, never a failed probe) for
    :data:`PROBLEM_SECONDS`."""

    def __init__(self) -> None:
        self._recent: TTLCache[tuple[str, str], str] = TTLCache(
            maxsize=PROBLEMS_MAX, ttl=PROBLEM_SECONDS, timer=trio.current_time)
        self._logged: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=PROBLEM_SECONDS, timer=trio.current_time)

    def note(self, reason: str, key: str, message: str) -> None:
        metrics.FLEET_UNFOLLOWABLE.labels(reason).inc()
        self._recent[(reason, key)] = message
        if (reason, key) not in self._logged:
            self._logged[(reason, key)] = True
            log.warning("%s", message)

    def no_address(self, group_id: str, holder: Holder) -> None:
        version = holder.card.version if holder.card is not None else "?"
        self.note(NO_ADDRESS, group_id,
                  f"group {group_id} is coordinated by a sidecar without a fleet address "
                  f"(groupgate {version}, member {holder.member_id or '?'}): its members here "
                  "are refused until that sidecar is gone; set fleet-listen (and fleet-address "
                  "where the pod's address is not found by itself) on every sidecar of the "
                  "group")

    def unreachable(self, address: Address, error: str) -> None:
        self.note(UNREACHABLE, f"{address[0]}:{address[1]}",
                  f"the sidecar coordinating a group here cannot be reached at its fleet "
                  f"address {address[0]}:{address[1]}: {error}; check its fleet-address (and "
                  "fleet-listen) and that NetworkPolicies admit the fleet port between the "
                  "application's pods")

    def summary(self) -> list[str]:
        """One line per recent case (for ``/readyz``)."""
        try:
            items = sorted(self._recent.items())
        except RuntimeError:  # outside trio (no clock): nothing recent
            return []
        return [f"fleet {reason}: {message}" for (reason, _key), message in items]


class ConnectionLinks:
    """One client connection's own links to other sidecars and to brokers, one per address.

    A follower relays a client connection's requests to the coordinating sidecar on a link of
    that connection alone, so they arrive in the order the client sent them and a JoinGroup
    held there for seconds holds nobody else's; on the fleet listener the coordinating sidecar
    sends that connection's commits to the group's broker coordinator the same way.
    """

    __slots__ = ("_links", "_pool", "_problems")

    def __init__(self, pool: LinkPool, problems: FleetProblems | None = None) -> None:
        self._pool = pool
        self._links: dict[tuple[Address, bool], BrokerLink] = {}
        self._problems = problems

    async def request(self, address: Address, api_key: int, version: int,
                      value: dict[str, Any], client_id: str, *, to_peer: bool = False
                      ) -> dict[str, Any]:
        """Send ``value`` to ``address`` (``to_peer``: another sidecar's fleet listener, with
        the fleet's TLS and authentication; else a broker, as the proxy's own identity) and
        return its answer (UpstreamError if it cannot be reached or does not answer within
        :func:`relay_timeout`, by API)."""
        link = self._links.get((address, to_peer))
        if link is None:
            link = self._links[(address, to_peer)] = (
                self._pool.peer(address, RELAY_TIMEOUT_SECONDS) if to_peer
                else self._pool.dedicated(address, RELAY_TIMEOUT_SECONDS))
        try:
            return await link.request(api_key, version, value, client_id=client_id,
                                      timeout=relay_timeout(api_key) if to_peer else None)
        except UpstreamError as exc:
            # only a connection that could not be opened (or authenticated) is a problem of
            # settings; one the holder closed (it stopped: a rollout) or that timed out was
            # reached, and the follower looks the group's coordinator up again
            if (to_peer and self._problems is not None
                    and isinstance(exc, UpstreamConnectError | UpstreamAuthenticationError)):
                self._problems.unreachable(address, str(exc))
            raise

    async def control(self, address: Address, api_key: int, version: int, body: bytes,
                      timeout: float | None = None) -> bytes:
        """Send a ``FleetControl`` body to the sidecar at ``address`` on this connection's
        link to it (after the requests relayed before it) and return the answer's body
        (within ``timeout``, default :data:`RELAY_OTHER_SECONDS`)."""
        link = self._peer_link(address)
        try:
            return await link.exchange_raw(api_key, version, body,
                                           timeout=timeout or RELAY_OTHER_SECONDS)
        except UpstreamError as exc:
            if self._problems is not None:
                self._problems.unreachable(address, str(exc))
            raise

    def _peer_link(self, address: Address) -> BrokerLink:
        link = self._links.get((address, True))
        if link is None:
            link = self._links[(address, True)] = self._pool.peer(address,
                                                                  RELAY_TIMEOUT_SECONDS)
        return link

    async def aclose(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            await link.aclose()


LOCAL: Final = "local"
RELAY: Final = "relay"
REFUSE: Final = "refuse"
LOOKUP: Final = "lookup"


@dataclass(frozen=True, slots=True)
class Route:
    """Where the requests of a set of groups go from this sidecar."""

    kind: str
    """:data:`LOCAL` (this sidecar decides: it holds the group, is taking it over, or nobody
    or the broker's own coordinator holds it), :data:`RELAY` (to ``address``), :data:`REFUSE`
    (answer COORDINATOR_NOT_AVAILABLE: ``reason``) or :data:`LOOKUP` (ask the broker first)."""
    address: Address | None = None
    reason: str = ""
    protocol: int = FLEET_PROTOCOL
    """RELAY only: the fleet protocol the coordinating sidecar speaks (its card), which says
    how relayed requests are marked."""
    let_go: bool = False
    """REFUSE only: members must also drop their partitions (answered UNKNOWN_MEMBER_ID, joins
    COORDINATOR_NOT_AVAILABLE): a coordinator this sidecar cannot follow is handing them out."""


LOCAL_ROUTE: Final = Route(LOCAL)
LOOKUP_ROUTE: Final = Route(LOOKUP)


class Routes:
    """The routing decision for group requests, from what this sidecar holds and what the
    :class:`Directory` saw."""

    def __init__(self, claims: Callable[[str], bool], directory: Directory,
                 own_address: Address | None, own_card: Card | None = None,
                 lookup_wait: float | None = None) -> None:
        self.claims = claims
        self.directory = directory
        self.own_address = own_address
        self.own_fleet_address = (f"{own_address[0]}:{own_address[1]}"
                                  if own_address is not None else None)
        """``own_address`` as relay marks carry it (:func:`~.fleet.mark_forwarded`)."""
        self.own_card = own_card
        """This sidecar's card (its state-log settings are compared with holders')."""
        self.lookup_wait = lookup_wait
        """How long after a group's lookup began a request waits for it (:func:`lookup_wait`;
        :meth:`Directory.lookup_within`); None: until the lookup ends."""
        self.decided_here: Callable[[str], bool] = lambda _group_id: False
        """Groups whose requests this sidecar decides itself without asking the broker who
        holds them: groups handed back to the broker (:mod:`.release`), whose requests go
        to the broker's group, which a lookup during the broker's own rebalance could not
        name (and would refuse, keeping the members from rejoining it)."""
        self.problems = FleetProblems()
        self._mismatches_logged: TTLCache[str, bool] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=REFUSAL_LOG_SECONDS, timer=trio.current_time)
        self._refusals_logged: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=REMEMBERED_MAX, ttl=REFUSAL_LOG_SECONDS, timer=trio.current_time)

    def followed(self) -> int:
        """Groups this sidecar's view says another sidecar coordinates, one it can relay to:
        its role in them is follower (``groupgate_groups_followed``)."""
        return sum(1 for holder in self.directory.holders()
                   if holder.followable and holder.card is not None
                   and holder.card.address != self.own_address)

    def route(self, group_ids: Sequence[str]) -> Route:
        routes = {self._route_one(g) for g in group_ids}
        if not routes:
            return LOCAL_ROUTE
        if len(routes) == 1:
            return routes.pop()
        if LOOKUP_ROUTE in routes:
            return LOOKUP_ROUTE
        refused = [r for r in routes if r.kind == REFUSE]
        # groups held in different places: each group is answered by what this sidecar
        # knows (DescribeGroups and the like); never a reason to hold the request up
        return refused[0] if refused else LOCAL_ROUTE

    def _route_one(self, group_id: str) -> Route:
        if not group_id.strip() or self.claims(group_id) or self.decided_here(group_id):
            return LOCAL_ROUTE
        holder = self.directory.view(group_id)
        if holder is None:
            return LOOKUP_ROUTE
        return self.route_for(holder, group_id)

    def route_for(self, holder: Holder, group_id: str = "") -> Route:
        if holder.kind in ("free", "unused", "broker"):
            return LOCAL_ROUTE
        if holder.kind == "sidecar" and holder.card is not None:
            address = holder.card.address
            if address is None and group_id:
                self.problems.no_address(group_id, holder)
            differences = (self.own_card.state_log_differences(holder.card)
                           if self.own_card is not None else ())
            if differences:
                # it writes another state log: taking the group over would find no state
                # there; relay to it if it can be followed, never take it over
                self._note_mismatch(holder, differences)
                if address is None or address == self.own_address:
                    return Route(REFUSE, reason=_mismatch(holder, differences))
                return Route(RELAY, address, protocol=holder.card.protocol)
            if address is None or address == self.own_address:
                # This sidecar before a restart, or one without a fleet listener, which
                # cannot be followed: take the group over here. The broker decides: the
                # JoinGroup waits until a dead holder's member expires, and a live holder
                # stays the leader (this sidecar then leaves and refuses).
                return LOCAL_ROUTE
            return Route(RELAY, address, protocol=holder.card.protocol)
        if holder.kind == "legacy":
            return Route(REFUSE, reason=holder.detail, let_go=True)
        return Route(REFUSE, reason=f"cannot tell who coordinates it: {holder.detail}")

    def _note_mismatch(self, holder: Holder, differences: tuple[str, ...]) -> None:
        """WARNING and metric, once per holder every :data:`REFUSAL_LOG_SECONDS`."""
        key = holder.member_id
        if key in self._mismatches_logged:
            return
        self._mismatches_logged[key] = True
        for name in differences:
            metrics.FLEET_SETTINGS_MISMATCHES.labels(name).inc()
        log.warning("%s; this sidecar will not take its groups over (set the same %s on "
                    "every sidecar of the fleet)", _mismatch(holder, differences),
                    ", ".join(differences))

    async def lookup(self, group_ids: Sequence[str]) -> Route:
        """Ask the broker about every group not known yet (waiting :attr:`lookup_wait` at
        most), then route: a group the broker did not name a holder of by then is refused."""
        unknown = [g for g in group_ids if self._route_one(g) == LOOKUP_ROUTE]
        if unknown:
            holders = (await self.directory.lookup_many(unknown) if self.lookup_wait is None
                       else await self.directory.lookup_within(unknown, self.lookup_wait))
            for group_id in unknown:
                if holders[group_id].kind == "unknown":
                    return self.route_for(holders[group_id])
        route = self.route(group_ids)
        return route if route.kind != LOOKUP else Route(REFUSE, reason="lookup failed")

    def forget(self, group_ids: Sequence[str]) -> None:
        for group_id in group_ids:
            self.directory.forget(group_id)

    def note_refused(self, group_ids: Sequence[str], reason: str) -> None:
        """Log that requests of ``group_ids`` are refused: once per group and reason every
        :data:`REFUSAL_LOG_SECONDS` (members retry several times a second)."""
        key = (",".join(group_ids), reason)
        if key not in self._refusals_logged:
            self._refusals_logged[key] = True
            log.info("group requests of %s refused here: %s", key[0], reason)


REFUSAL_LOG_SECONDS = 10.0


def _mismatch(holder: Holder, differences: tuple[str, ...]) -> str:
    assert holder.card is not None
    theirs = holder.card.state_log
    return (f"the sidecar holding the group (member {holder.member_id}) uses other state-log "
            f"settings: {', '.join(differences)} differ"
            f"{f' (it uses {theirs.describe()})' if theirs is not None else ''}")


@dataclass(frozen=True, slots=True)
class FleetSide:
    """What one client connection's router needs to work among several sidecars."""

    routes: Routes
    links: ConnectionLinks
    inbound: bool
    """A connection on the fleet listener: its group requests are decided here or refused
    with NOT_COORDINATOR, never relayed again."""
    broker_of: Callable[[Sequence[str]], Address | None]
    """The broker coordinating the first of these groups that this sidecar holds (where an
    inbound connection sends their commits), None if it holds none."""
