"""The fleet core: one group's broker membership and this sidecar's role for it, sans-I/O.

Theory of operation
===================

A group the engine coordinates is *held* by one sidecar of the fleet: the one whose lock
member leads the broker's classic group of the same id (decision records 0014 and 0018). Every
other sidecar relays the group's requests to it. Who holds the group is decided by the broker
alone; what a sidecar may do for the group follows from what the broker last told it and from
the time. :class:`GroupCore` keeps exactly that for one group on one sidecar, in the style of
h11's connection state: events and the current time go in (:mod:`proxy.fleet_core.events`),
actions come out, and the core never reads a clock, opens a socket or waits. The trio service
and the fleet simulator (``tests/sim/fleet_sim.py``) are its drivers.

The *role* is one of :class:`Role`. It changes only through :meth:`GroupCore._move`, which
looks the pair (role, :class:`Why`) up in :data:`TRANSITIONS`; a pair missing from the table is
a bug and raises :class:`FleetCoreError`. The table is the whole of what can happen (the
``any`` row stands for every role but ``stepping-down``):

==============  ================  ==============  ================================================
from            why               to              actions
==============  ================  ==============  ================================================
absent          request           looking         hold the request; Lookup
looking         held-elsewhere    following       relay what is held (inbound: NOT_COORDINATOR)
looking         free              electing        SendJoin without a member id
looking         direct            broker          held requests: COORDINATOR_NOT_AVAILABLE
looking         not-eligible      absent          held requests: UNKNOWN_MEMBER_ID (no JoinGroup)
looking         unreachable       absent          held requests: COORDINATOR_NOT_AVAILABLE
looking         legacy            absent          held requests: COORDINATOR_NOT_AVAILABLE
electing        lost-election     looking         SendLeave if joined; Lookup
electing        election-failed   absent          SendLeave if joined; COORDINATOR_NOT_AVAILABLE
electing        elected           loading         Load; heartbeat every third of a session
electing        direct            broker          INCONSISTENT_GROUP_PROTOCOL: the broker phase
loading         loaded            coordinating    RunEngine for every held request
loading         loaded-nothing    coordinating    as loaded; joins wait takeover-wait-ms
loading         load-failed       absent          Forget; SendLeave
loading         lease-passed      absent          Forget; SendLeave
loading         rebalance         absent          Forget; SendLeave
loading         refused           absent          Forget
coordinating    lease-passed      interrupted     Suspend
coordinating    rebalance         interrupted     Suspend; SendJoin with the member id
coordinating    refused           letting-go      Forget
coordinating    write-failed      absent          Forget; SendLeave
interrupted     answered          coordinating    Resume
interrupted     session-passed    letting-go      Forget
interrupted     refused           letting-go      Forget
interrupted     lost-election     letting-go      Forget; SendLeave
interrupted     write-failed      absent          Forget; SendLeave
letting-go      let-go            absent          - (every member at the loss told, or a session)
following       relay-failed      looking         Lookup
following       view-expired      absent          -
broker          view-expired      absent          -
any             stop              stepping-down   held: Forget, SendLeave after the writes/hand-off
==============  ================  ==============  ================================================

``free`` is what a lookup says when this sidecar may try the election: the broker's group is
Empty (used before: its state may be in the log), or unused and a held request may start the
group (an epoch-0 heartbeat, a JoinGroup the engine takes), or led by this sidecar's own
address (its member from before a restart: the JoinGroup waits until the broker drops it).
An unused group and only requests of members that cannot exist is ``not-eligible``. A group
held by nobody the fleet can name (``held`` without a holder: a groupgate without a card,
0.1.0, leads it) is ``legacy``: nobody here acts next to it, and it is never taken for this
sidecar's own member from before a restart.

What a member's request gets in each role (:meth:`GroupCore._request`): ``absent`` starts a
lookup and holds it; ``looking``, ``electing`` and ``loading`` hold it (bounded by
``hold_ms``, or the request's own shorter ``hold_ms``, then answered its ``hold_error``, and by
``max_held``; in ``looking`` also by ``lookup_wait_ms`` after the lookup began, then answered
COORDINATOR_NOT_AVAILABLE, as is every request while that lookup goes on; an inbound
request, relayed here by a follower, is answered NOT_COORDINATOR unless this sidecar is
``loading``); ``following`` relays it; ``coordinating`` runs the engine (RunEngine) after
checking the lease (within ``takeover_wait_ms`` of a ``loaded-nothing``, a request that may
start the group is answered COORDINATOR_LOAD_IN_PROGRESS instead); ``interrupted`` answers
COORDINATOR_NOT_AVAILABLE; ``letting-go`` answers the first request of each member the
engine's group had at the loss (the driver names them with :class:`Forgotten` when it forgets
the group) UNKNOWN_MEMBER_ID (it drops its partitions and rejoins), and everything else
COORDINATOR_NOT_AVAILABLE (a member that joined elsewhere since holds nothing of this
sidecar's); it ends (``let-go``) once every one of them was told or ``let_go_ms`` passed;
``broker`` and ``stepping-down`` answer COORDINATOR_NOT_AVAILABLE (handing off, each
member's first request UNKNOWN_MEMBER_ID, as in ``letting-go``). Inbound requests are never
relayed again.

The lease. Every answered heartbeat (and the SyncGroup that completed a join) sent at time *s*
moves ``lease_deadline`` to *s* + ``lease_fraction`` x session and ``session_deadline`` to *s*
+ session. The broker cannot drop the lock member before a session after it *received* that
call, which is no earlier than *s*, so while the clocks run at rates within
``1 - lease_fraction`` of each other the sidecar stops acting (``lease-passed``) before the
broker can give the group to anyone else. The check runs before every event is handled (so a
sidecar frozen past its lease, or starved, notices before it acts on anything that queued up
meanwhile) and again before an answer leaves. From the lease's end to the session's end the
group is ``interrupted``: an answer from the broker resumes it (every member gets a full
session: the engine's timers were suspended); the session's end without one means the broker
may have given the group away, and the members are told to let go.

The write barrier. An engine call that changed durable state (:class:`EngineDone` with
``wrote``) becomes unit *n* of the group's writes (:class:`Write`); its answer, and the answer
of every later call, leaves only once the state log acknowledged every unit up to the one
submitted before it (:class:`Written`). An answer released after the lease passed is not sent
(COORDINATOR_NOT_AVAILABLE instead): the state it depends on is durable, and the client's retry
finds whoever holds the group then. A failed write gives the group up (``write-failed``): its
waiting answers fail, the engine forgets it, the lock is left, and the group is taken over
again from what the log holds. A sidecar taking over opens the group's writer before it reads
(:class:`Load`), which fences every earlier writer: a write of a holder that lost the group
while frozen fails instead of landing behind the new holder's load.

Stepping down (:class:`Stop`) from a group this sidecar holds: nothing more is answered (held
requests and waiting answers fail with COORDINATOR_NOT_AVAILABLE, the engine's timers do not
fire). With the state log, the lock is left once every unit submitted is acknowledged (the
engine forgets the group then), so that the next holder loads all of it at once and no member
is disturbed; without it (``hand_off``), the engine forgets the group at once, each member it
had is told to let go on its next request, and the lock is left once all were told. Either
wait is bounded by ``step_down_ms``; :attr:`GroupCore.stepped_down` tells the driver it may
exit.

Calls to the broker carry an attempt number; an answer to an attempt the core has moved past
(an older join, a heartbeat of an older generation) is ignored. Everything the core keeps is
bounded: held requests (``max_held``, each for ``hold_ms``), answers waiting for writes (one per
request the engine ran), heartbeat send times (those of the last session), and the members
still to tell to let go (the engine group's members at the loss).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.fleet_core.defects import NO_DEFECTS, Defects
from proxy.fleet_core.events import (
    Action,
    CallFailed,
    EngineDone,
    Event,
    Fail,
    Forget,
    Forgotten,
    HeartbeatAnswered,
    JoinAnswered,
    Load,
    LoadDone,
    LookedUp,
    Lookup,
    Relay,
    RelayDone,
    Request,
    Respond,
    Resume,
    RunEngine,
    SendHeartbeat,
    SendJoin,
    SendLeave,
    SendSync,
    Shape,
    Stop,
    Suspend,
    SyncAnswered,
    Write,
    WriteFailed,
    Written,
)
from proxy.fleet_core.lease import LEASE_FRACTION, Lease, LeaseState
from translation.errors import ErrorCode
from translation.write_barrier import WriteBarrier

INF = float("inf")


class FleetCoreError(Exception):
    """A move outside :data:`TRANSITIONS`: a bug in the core or its driver."""


class Role(enum.Enum):
    ABSENT = "absent"
    LOOKING = "looking"
    FOLLOWING = "following"
    BROKER = "broker"
    ELECTING = "electing"
    LOADING = "loading"
    COORDINATING = "coordinating"
    INTERRUPTED = "interrupted"
    LETTING_GO = "letting-go"
    STEPPING_DOWN = "stepping-down"


class Why(enum.Enum):
    REQUEST = "request"
    HELD_ELSEWHERE = "held-elsewhere"
    FREE = "free"
    DIRECT = "direct"
    NOT_ELIGIBLE = "not-eligible"
    UNREACHABLE = "unreachable"
    LOST_ELECTION = "lost-election"
    ELECTION_FAILED = "election-failed"
    ELECTED = "elected"
    LOADED = "loaded"
    LOADED_NOTHING = "loaded-nothing"
    LOAD_FAILED = "load-failed"
    LEASE_PASSED = "lease-passed"
    REBALANCE = "rebalance"
    REFUSED = "refused"
    WRITE_FAILED = "write-failed"
    ANSWERED = "answered"
    SESSION_PASSED = "session-passed"
    LET_GO = "let-go"
    RELAY_FAILED = "relay-failed"
    VIEW_EXPIRED = "view-expired"
    LEGACY = "legacy"
    STOP = "stop"


def _table() -> dict[tuple[Role, Why], Role]:
    rows: dict[tuple[Role, Why], Role] = {}
    lines = (__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("==============  ")]
    for line in lines[rules[1] + 1:rules[2]]:
        cells = line.split()
        why, to = Why(cells[1]), Role(cells[2])
        froms = ([r for r in Role if r is not Role.STEPPING_DOWN] if cells[0] == "any"
                 else [Role(cells[0])])
        for role in froms:
            rows[(role, why)] = to
    return rows


TRANSITIONS: dict[tuple[Role, Why], Role] = _table()
"""(role, why) -> role: every move of the group's role on this sidecar, read from the table in
this module's docstring (so the two cannot differ)."""

HOLDING = frozenset({Role.LOADING, Role.COORDINATING, Role.INTERRUPTED})
"""Roles in which this sidecar's lock member may lead the broker's group."""
LOST = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION,
                  ErrorCode.FENCED_INSTANCE_ID})
RETRY_JOIN = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                        ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
                        ErrorCode.REBALANCE_IN_PROGRESS})
"""Answers to the election's JoinGroup that are tried again (the coordinator moving, a
rebalance under way), at most :data:`MAX_JOIN_TRIES` times, as the broker membership does."""
MAX_JOIN_TRIES = 10
"""Broker answers that mean the lock member is gone (the broker forgot it)."""


@dataclass(frozen=True)
class CoreConfig:
    session_ms: int
    """The lock member's session at the broker (``broker-session-timeout-ms``); also its
    rebalance timeout."""
    lease_fraction: float = LEASE_FRACTION
    hold_ms: int = 5_000
    """Longest a request waits for a lookup, an election or a load."""
    max_held: int = 1_000
    lookup_ms: int = 3_000
    """Longest a lookup may take before the broker counts as unreachable."""
    lookup_wait_ms: int | None = None
    """Longest after a lookup of ``looking`` began that the requests held for it wait: then
    they are answered COORDINATOR_NOT_AVAILABLE while the lookup goes on, and a request that
    comes later is answered so at once, so that the requests queued behind one on its
    connection are not held for it in turn (the fleet route's bounded lookups,
    ``proxy/coordination/peers.py``; half a heartbeat interval). None: ``hold_ms``."""
    view_ms: int = 30_000
    """How long a view of another holder (or of the broker's own group) is followed."""
    let_go_ms: int = 45_000
    """How long a lost group's members are told to let go (a member session)."""
    retry_ms: int = 500
    """Between a failed rejoin call and the next."""
    step_down_ms: int = 5_000
    """Longest a sidecar that stops waits, before it leaves the lock, for its pending writes
    (with the state log) or for every member to be told to let go (handing off)."""
    takeover_wait_ms: int = 0
    """After a takeover that loaded nothing (or not all) of a group another coordinator held
    before (its broker generation before this sidecar's join was above 0), joins are answered
    COORDINATOR_LOAD_IN_PROGRESS for this long (``takeover-wait-ms``): members of the earlier
    coordinator may still consume what it assigned, and hear UNKNOWN_MEMBER_ID from the
    engine meanwhile."""

    @property
    def call_ms(self) -> int:
        """Longest a JoinGroup or SyncGroup may wait (a join waits up to the rebalance
        timeout for the other members)."""
        return self.session_ms + 2_000


@dataclass
class _Held:
    member_id: str
    starts_group: bool
    inbound: bool
    until: float
    error: int = ErrorCode.COORDINATOR_NOT_AVAILABLE


class GroupCore:
    """One group's fleet protocol state on one sidecar (see the module's docstring)."""

    def __init__(self, group_id: str, address: str, config: CoreConfig,
                 defects: Defects = NO_DEFECTS) -> None:
        self.group_id = group_id
        self.address = address
        """This sidecar's fleet address (what its card tells other sidecars)."""
        self.config = config
        self.defects = defects
        """Fixed defects put back (the simulator's tests only, :mod:`.defects`)."""
        self.role = Role.ABSENT
        self.history: list[tuple[float, Role, Why, Role]] = []
        """The last moves (bounded), for traces."""
        self.holder: str | None = None
        """The sidecar followed (``following``)."""
        self.member_id = ""
        self.generation = -1
        self.membership = "none"
        """The lock member: ``none``, ``joining``, ``checking`` (a member id was given; is the
        group held elsewhere?), ``syncing``, ``stable``."""
        self.lease = Lease(config.lease_fraction, -INF, -INF)
        """The lock's lease (:mod:`proxy.fleet_core.lease`), in this core's milliseconds."""
        self._attempt = 0
        self._call: int | None = None
        """The join, sync or lookup attempt an answer is awaited for."""
        self._call_sent = 0.0
        self._call_until = INF
        self._next_heartbeat = INF
        self._heartbeats: dict[int, tuple[float, int]] = {}
        """Attempt -> (send time, generation) of heartbeats sent in the last session."""
        self._retry_at = INF
        self._join_tries = 0
        """Joins of the election answered with a retriable error so far."""
        self._view_until = INF
        self._let_go_until = INF
        self._assign_from = -INF
        """Before this time joins are answered COORDINATOR_LOAD_IN_PROGRESS
        (``loaded-nothing``)."""
        self._elected_generation = -1
        """The broker generation of the join that won the election (1: nobody held the
        group before)."""
        self._held: dict[int, _Held] = {}
        self.barrier: WriteBarrier[tuple[int, bool]] = WriteBarrier()
        """The write barrier (:mod:`translation.write_barrier`): units submitted and
        acknowledged, and the answers waiting for them as (rid, inbound)."""
        self._stepping = ""
        """Stepping down from a group it held: ``writes`` (waiting for every unit to be
        acknowledged), ``members`` (waiting for every member to be told to let go), or ``""``
        (nothing to wait for: the lock is left, or was never held)."""
        self._step_down_until = INF
        self._to_tell: set[str] = set()
        """Members of the group at the loss not told yet to let go (``letting-go``; bounded by
        the engine group's members)."""
        self._running: dict[int, bool] = {}
        """rid -> inbound, for requests given to the engine and not reported back yet."""
        self._stale_takeover = False
        """``Defects.keep_failed_takeover`` only: a lost election kept registered."""
        self._look_until = INF
        """``looking``: when the requests held for the lookup stop waiting for it."""

    # -- what the driver calls ---------------------------------------------------------------

    @property
    def lease_deadline(self) -> float:
        return self.lease.lease_deadline

    @lease_deadline.setter
    def lease_deadline(self, value: float) -> None:
        self.lease.lease_deadline = value

    @property
    def session_deadline(self) -> float:
        return self.lease.session_deadline

    def acting(self, now: float) -> bool:
        """Whether this sidecar may act for the group now (answer, fire the engine's timers):
        coordinating, within the lease."""
        return self.role is Role.COORDINATING and self.lease.state(now) is LeaseState.HELD

    def handle(self, event: Event, now: float) -> list[Action]:
        out: list[Action] = []
        self._time(now, out)
        if isinstance(event, Request):
            self._request(event, now, out)
        elif isinstance(event, LookedUp):
            self._looked_up(event, now, out)
        elif isinstance(event, JoinAnswered):
            self._join_answered(event, now, out)
        elif isinstance(event, SyncAnswered):
            self._sync_answered(event, now, out)
        elif isinstance(event, HeartbeatAnswered):
            self._heartbeat_answered(event, now, out)
        elif isinstance(event, CallFailed):
            self._call_failed(event, now, out)
        elif isinstance(event, LoadDone):
            self._load_done(event, now, out)
        elif isinstance(event, EngineDone):
            self._engine_done(event, now, out)
        elif isinstance(event, Written):
            self._written(event, now, out)
        elif isinstance(event, WriteFailed):
            if self.role in (Role.COORDINATING, Role.INTERRUPTED) \
                    and event.unit > self.barrier.acknowledged:
                self._give_up(Why.WRITE_FAILED, now, out)
            elif self._stepping == "writes":
                self._stepped_down(out)  # what was not written, the next holder never hears of
        elif isinstance(event, RelayDone):
            self._relay_done(event, now, out)
        elif isinstance(event, Forgotten):
            if self.role is Role.LETTING_GO or self._stepping == "members":
                self._to_tell = set(event.members)
                if self._stepping == "members" and not self._to_tell:
                    self._stepped_down(out)
        elif isinstance(event, Stop) and self.role is not Role.STEPPING_DOWN:
            self._step_down(event, now, out)
        return out

    def tick(self, now: float) -> list[Action]:
        """Act on the time: leases, sessions, heartbeats due, calls and holds that ran out."""
        out: list[Action] = []
        self._time(now, out)
        return out

    def next_deadline(self) -> float:
        """When :meth:`tick` has something to do (``inf``: nothing until the next event)."""
        times = [self._next_heartbeat, self._call_until, self._retry_at, self._view_until,
                 self._let_go_until, self._step_down_until]
        if self.role in (Role.LOADING, Role.COORDINATING):
            times.append(self.lease_deadline)
        if self.role is Role.INTERRUPTED and not self.defects.cut_off_holder_keeps_claiming:
            times.append(self.session_deadline)
        if self._held:
            times.append(min(h.until for h in self._held.values()))
            if self.role is Role.LOOKING:
                times.append(self._look_until)
        return min(times)

    @property
    def held(self) -> int:
        return len(self._held)

    # -- the role ----------------------------------------------------------------------------

    def _move(self, why: Why, now: float, out: list[Action]) -> None:
        after = TRANSITIONS.get((self.role, why))
        if after is None:
            raise FleetCoreError(f"group {self.group_id}: {why.value} is not a move from "
                                 f"{self.role.value}")
        self.history.append((now, self.role, why, after))
        if len(self.history) > 64:
            del self.history[:32]
        self.role = after
        if after is not Role.FOLLOWING and after is not Role.BROKER:
            self._view_until = INF
        if after is not Role.LETTING_GO:
            self._let_go_until = INF
            self._to_tell.clear()
        if after not in HOLDING:
            self._next_heartbeat = INF
            self._heartbeats.clear()
            self._assign_from = -INF
        if after not in (Role.ELECTING, Role.LOOKING) and not (
                after is Role.INTERRUPTED and self.membership in ("joining", "syncing")):
            self._call = None
            self._call_until = INF
        if after is not Role.COORDINATING:
            self._fail_waiting(out)
        if after in (Role.ABSENT, Role.LETTING_GO, Role.STEPPING_DOWN, Role.BROKER):
            self._fail_held(out, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if after in (Role.ABSENT, Role.LETTING_GO, Role.FOLLOWING, Role.LOOKING, Role.BROKER):
            self.membership = "none" if after is not Role.LETTING_GO else self.membership
            self.barrier.reset()

    def _time(self, now: float, out: list[Action]) -> None:
        """Everything the passing of time decides, before any event is handled."""
        lease = self.lease.state(now)
        if self.role in (Role.LOADING, Role.COORDINATING) and lease is not LeaseState.HELD:
            if self.role is Role.LOADING:
                out.append(Forget("the lease passed while loading"))
                self._leave(out)
                self._move(Why.LEASE_PASSED, now, out)
            else:
                out.append(Suspend())
                self._move(Why.LEASE_PASSED, now, out)
        if self.role is Role.INTERRUPTED and lease is LeaseState.LOST \
                and not self.defects.cut_off_holder_keeps_claiming:
            out.append(Forget("no answer from the broker within a session"))
            self._leave(out)
            self._move(Why.SESSION_PASSED, now, out)
            self._let_go_until = now + self.config.let_go_ms
        if self.role is Role.LETTING_GO and now >= self._let_go_until:
            self._move(Why.LET_GO, now, out)
        if self.role in (Role.FOLLOWING, Role.BROKER) and now >= self._view_until:
            self._move(Why.VIEW_EXPIRED, now, out)
        if self._stepping and now >= self._step_down_until:
            self._stepped_down(out)
        if now >= self._call_until:
            self._call_timed_out(now, out)
        if now >= self._retry_at:
            self._retry_at = INF
            if self.role in (Role.INTERRUPTED, Role.ELECTING) and self.membership == "joining":
                self._send_join(now, out)
        if self.role in HOLDING and self.membership == "stable" and now >= self._next_heartbeat:
            self._attempt += 1
            self._heartbeats[self._attempt] = (now, self.generation)
            for attempt in [a for a, (sent, _) in self._heartbeats.items()
                            if sent < now - self.config.session_ms]:
                del self._heartbeats[attempt]
            out.append(SendHeartbeat(self._attempt, self.member_id, self.generation))
            self._next_heartbeat = now + self.config.session_ms / 3
        if self.role is Role.LOOKING and now >= self._look_until:
            self._fail_held(out, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        expired = [rid for rid, h in self._held.items() if now >= h.until]
        for rid in expired:
            held = self._held.pop(rid)
            out.append(Fail(rid, ErrorCode.NOT_COORDINATOR if held.inbound else held.error))

    # -- requests ----------------------------------------------------------------------------

    def _request(self, request: Request, now: float, out: list[Action]) -> None:
        role = self.role
        rid = request.rid
        if self._stale_takeover:  # Defects.keep_failed_takeover
            if not request.starts_group:
                out.append(Fail(rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))
                return
            self._stale_takeover = False
            self._held[rid] = self._hold(request, now)
            self._move(Why.LOST_ELECTION, now, out)
            self._lookup(now, out)
            return
        if role is Role.COORDINATING:
            if request.starts_group and now < self._assign_from:
                out.append(Fail(rid, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
                return
            self._running[rid] = request.inbound
            out.append(RunEngine(rid))
        elif role is Role.FOLLOWING:
            out.append(Fail(rid, ErrorCode.NOT_COORDINATOR) if request.inbound
                       else Relay(rid, self.holder or ""))
        elif request.inbound and role is not Role.LOADING:
            out.append(Fail(rid, ErrorCode.NOT_COORDINATOR))
        elif role is Role.LOOKING and now >= self._look_until:
            out.append(Fail(rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))  # the lookup is late
        elif role in (Role.ABSENT, Role.LOOKING, Role.ELECTING, Role.LOADING):
            if len(self._held) >= self.config.max_held:
                out.append(Fail(rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))
                return
            self._held[rid] = self._hold(request, now)
            if role is Role.ABSENT:
                self._move(Why.REQUEST, now, out)
                self._lookup(now, out)
        elif role in (Role.LETTING_GO, Role.STEPPING_DOWN) \
                and request.member_id in self._to_tell:
            self._to_tell.discard(request.member_id)
            # (a member rejoining with epoch 0 has let go already: told either way)
            out.append(Fail(rid, ErrorCode.COORDINATOR_NOT_AVAILABLE if request.starts_group
                            else ErrorCode.UNKNOWN_MEMBER_ID))
            if not self._to_tell:
                if role is Role.LETTING_GO:
                    self._move(Why.LET_GO, now, out)
                else:
                    self._stepped_down(out)
        else:
            out.append(Fail(rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))

    def _hold(self, request: Request, now: float) -> _Held:
        hold = self.config.hold_ms if request.hold_ms is None \
            else min(request.hold_ms, self.config.hold_ms)
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE if request.hold_error is None \
            else request.hold_error
        return _Held(request.member_id, request.starts_group, request.inbound, now + hold,
                     error)

    def _fail_held(self, out: list[Action], error: ErrorCode) -> None:
        for rid, held in self._held.items():
            out.append(Fail(rid, ErrorCode.NOT_COORDINATOR if held.inbound else error))
        self._held.clear()

    def _fail_waiting(self, out: list[Action]) -> None:
        for rid, inbound in self.barrier.drop():
            out.append(Fail(rid, ErrorCode.NOT_COORDINATOR if inbound
                            else ErrorCode.COORDINATOR_NOT_AVAILABLE))

    # -- looking and following ---------------------------------------------------------------

    def _lookup(self, now: float, out: list[Action]) -> None:
        self._attempt += 1
        self._call = self._attempt
        self._call_until = now + self.config.lookup_ms
        wait = self.config.lookup_wait_ms
        self._look_until = INF if (
            self.role is not Role.LOOKING or wait is None
            or self.defects.lookup_waits_unbounded) else now + wait
        out.append(Lookup(self._attempt))

    def _looked_up(self, event: LookedUp, now: float, out: list[Action]) -> None:
        if event.attempt != self._call or self.role not in (Role.LOOKING, Role.ELECTING):
            return
        if self.role is Role.ELECTING:
            if self.membership != "checking":
                return
            if event.shape is Shape.HELD and event.holder != self.address:
                self._lose_election(now, out)
            else:
                self._send_join(now, out)
            return
        self._call, self._call_until = None, INF
        if event.shape is Shape.HELD and event.holder not in (None, self.address):
            self.holder = event.holder
            self._move(Why.HELD_ELSEWHERE, now, out)
            self._view_until = now + self.config.view_ms
            held, self._held = self._held, {}
            for rid, h in held.items():
                out.append(Fail(rid, ErrorCode.NOT_COORDINATOR) if h.inbound
                           else Relay(rid, event.holder))
        elif event.shape is Shape.DIRECT:
            self._move(Why.DIRECT, now, out)
            self._view_until = now + self.config.view_ms
        elif event.shape is Shape.HELD and event.holder is None:
            # led by a groupgate without a card (0.1.0): not this sidecar's, nobody's to follow
            held, self._held = self._held, {}
            self._move(Why.LEGACY, now, out)
            for rid in held:
                out.append(Fail(rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        elif event.shape is Shape.UNREACHABLE:
            self._move(Why.UNREACHABLE, now, out)
        elif (event.shape is Shape.FREE or event.shape is Shape.HELD  # this sidecar before
              or any(h.starts_group for h in self._held.values())):  # a restart, or a start
            self.membership = "joining"
            self.member_id = ""
            self._join_tries = 0
            self._move(Why.FREE, now, out)
            self._send_join(now, out)
        else:
            held, self._held = self._held, {}
            self._move(Why.NOT_ELIGIBLE, now, out)
            for rid in held:
                out.append(Fail(rid, ErrorCode.UNKNOWN_MEMBER_ID))

    def _relay_done(self, event: RelayDone, now: float, out: list[Action]) -> None:
        if not event.refused:
            out.append(Respond(event.rid))
            return
        out.append(Fail(event.rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        if self.role is Role.FOLLOWING:
            self._move(Why.RELAY_FAILED, now, out)
            self._lookup(now, out)

    # -- the lock member ---------------------------------------------------------------------

    def _send_join(self, now: float, out: list[Action]) -> None:
        self._attempt += 1
        self._call = self._attempt
        self._call_sent = now
        self._call_until = now + self.config.call_ms
        if self.role is Role.ELECTING:
            self.membership = "joining"
        out.append(SendJoin(self._attempt, self.member_id))

    def _send_sync(self, now: float, out: list[Action]) -> None:
        self._attempt += 1
        self._call = self._attempt
        self._call_sent = now
        self._call_until = now + self.config.call_ms
        self.membership = "syncing"
        out.append(SendSync(self._attempt, self.member_id, self.generation))

    def _leave(self, out: list[Action]) -> None:
        if self.member_id:
            out.append(SendLeave(self.member_id))
        self.member_id = ""
        self.generation = -1
        self.membership = "none"
        self.lease.drop()

    def _answered(self, sent: float) -> None:
        self.lease.answered(sent, self.config.session_ms)

    def _join_answered(self, event: JoinAnswered, now: float, out: list[Action]) -> None:
        if event.attempt != self._call or self.membership != "joining":
            return
        if self.role is Role.ELECTING:
            if event.error == ErrorCode.MEMBER_ID_REQUIRED and not self.member_id:
                self.member_id = event.member_id
                if self.defects.join_without_checking:
                    self._send_join(now, out)
                    return
                self.membership = "checking"
                self._lookup(now, out)
                return
            if event.error in RETRY_JOIN and self._join_tries < MAX_JOIN_TRIES:
                # the broker's coordinator is moving, or the group rebalances: the same join
                # again after a pause (the member id the broker gave stays pending)
                self._join_tries += 1
                self._call, self._call_until = None, INF
                self._retry_at = now + self.config.retry_ms
                return
            if event.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
                # members of another protocol hold the broker's group: its broker phase
                self._leave(out)
                self._move(Why.DIRECT, now, out)
                self._view_until = now + self.config.view_ms
                return
            if event.error != ErrorCode.NONE:
                self._leave(out)
                self._move(Why.ELECTION_FAILED, now, out)
                return
            self.generation = event.generation
            if event.leader != self.member_id:
                self._lose_election(now, out)
                return
            self._send_sync(now, out)
            return
        if self.role is not Role.INTERRUPTED:
            return
        if event.error in LOST:
            out.append(Forget("the broker forgot the lock member"))
            self.member_id = ""
            self._move(Why.REFUSED, now, out)
            self._let_go_until = now + self.config.let_go_ms
        elif event.error != ErrorCode.NONE:
            self._call, self._call_until = None, INF
            self._retry_at = now + self.config.retry_ms
        elif event.leader != self.member_id:
            out.append(Forget("another member leads the broker's group"))
            self._leave(out)
            self._move(Why.LOST_ELECTION, now, out)
            self._let_go_until = now + self.config.let_go_ms
        else:
            self.generation = event.generation
            self._send_sync(now, out)

    def _lose_election(self, now: float, out: list[Action]) -> None:
        self._leave(out)
        if self.defects.keep_failed_takeover and not self._held:
            self._stale_takeover = True  # nobody waits for it: it stays, claiming the group
            self._call, self._call_until = None, INF
            return
        self._move(Why.LOST_ELECTION, now, out)
        self._lookup(now, out)

    def _sync_answered(self, event: SyncAnswered, now: float, out: list[Action]) -> None:
        if event.attempt != self._call or self.membership != "syncing":
            return
        sent = self._call_sent
        self._call, self._call_until = None, INF
        if event.error != ErrorCode.NONE:
            if self.role is Role.ELECTING:
                self._leave(out)
                self._move(Why.ELECTION_FAILED, now, out)
            elif self.role is Role.INTERRUPTED:
                if event.error in LOST:
                    self._refused(now, out)
                else:
                    self.membership = "joining"
                    self._retry_at = now
            return
        self._answered(sent)
        self.membership = "stable"
        self._next_heartbeat = now + self.config.session_ms / 3
        if self.role is Role.ELECTING:
            self._elected_generation = self.generation
            self._move(Why.ELECTED, now, out)
            out.append(Load())
        elif self.role is Role.INTERRUPTED and self.lease.state(now) is LeaseState.HELD:
            self._move(Why.ANSWERED, now, out)
            out.append(Resume())

    def _heartbeat_answered(self, event: HeartbeatAnswered, now: float,
                            out: list[Action]) -> None:
        sent_generation = self._heartbeats.pop(event.attempt, None)
        if sent_generation is None or self.role not in HOLDING:
            return
        sent, generation = sent_generation
        if generation != self.generation or self.membership != "stable":
            return
        if event.error == ErrorCode.NONE:
            self._answered(sent)
            if self.role is Role.INTERRUPTED and self.lease.state(now) is LeaseState.HELD:
                self._move(Why.ANSWERED, now, out)
                out.append(Resume())
        elif event.error == ErrorCode.REBALANCE_IN_PROGRESS:
            if self.role is Role.LOADING:
                out.append(Forget("a rebalance while loading"))
                self._leave(out)
                self._move(Why.REBALANCE, now, out)
                return
            if self.role is Role.COORDINATING:
                out.append(Suspend())
                self._move(Why.REBALANCE, now, out)
            self._next_heartbeat = INF
            self.membership = "joining"
            self._send_join(now, out)
        elif event.error in LOST:
            self._refused(now, out)

    def _refused(self, now: float, out: list[Action]) -> None:
        """The broker forgot the lock member: lost for good."""
        out.append(Forget("the broker forgot the lock member"))
        self.member_id = ""
        self.membership = "none"
        self.lease.drop()
        self._move(Why.REFUSED, now, out)
        if self.role is Role.LETTING_GO:
            self._let_go_until = now + self.config.let_go_ms

    def _call_failed(self, event: CallFailed, now: float, out: list[Action]) -> None:
        if event.attempt in self._heartbeats:
            del self._heartbeats[event.attempt]  # the lease runs out if nothing answers
            return
        if event.attempt == self._call:
            self._call_timed_out(now, out)

    def _call_timed_out(self, now: float, out: list[Action]) -> None:
        self._call, self._call_until = None, INF
        if self.role is Role.LOOKING:
            self._move(Why.UNREACHABLE, now, out)
        elif self.role is Role.ELECTING:
            self._leave(out)
            self._move(Why.ELECTION_FAILED, now, out)
        elif self.role is Role.INTERRUPTED and self.membership in ("joining", "syncing"):
            self.membership = "joining"
            self._retry_at = now + self.config.retry_ms

    # -- loading, the engine and the write barrier -------------------------------------------

    def _load_done(self, event: LoadDone, now: float, out: list[Action]) -> None:
        if self.role is not Role.LOADING:
            return
        if not event.ok:
            out.append(Forget("the load failed"))
            self._leave(out)
            self._move(Why.LOAD_FAILED, now, out)
            return
        if not event.complete and self._elected_generation > 1 \
                and self.config.takeover_wait_ms > 0:
            self._move(Why.LOADED_NOTHING, now, out)
            self._assign_from = now + self.config.takeover_wait_ms
        else:
            self._move(Why.LOADED, now, out)
        held, self._held = self._held, {}
        for rid, h in held.items():
            if h.starts_group and now < self._assign_from:
                out.append(Fail(rid, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
                continue
            self._running[rid] = h.inbound
            out.append(RunEngine(rid))

    def _engine_done(self, event: EngineDone, now: float, out: list[Action]) -> None:
        inbound = self._running.pop(event.rid, False)
        if event.wrote:
            out.append(Write(self.barrier.submit()))
        if self.role is not Role.COORDINATING:
            out.append(Fail(event.rid, ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        if self.barrier.hold((event.rid, inbound)):
            out.append(Respond(event.rid))

    def engine_ticked(self, wrote: bool, now: float) -> list[Action]:
        """The driver fired the engine's timers (only while :meth:`acting`)."""
        out: list[Action] = []
        self._time(now, out)
        if wrote:
            out.append(Write(self.barrier.submit()))
        return out

    def _written(self, event: Written, now: float, out: list[Action]) -> None:
        if self._stepping == "writes":
            self.barrier.acknowledge(event.unit)  # (every answer failed at the stop)
            if self.barrier.settled():
                self._stepped_down(out)
            return
        if self.role not in HOLDING:
            return
        ready = self.barrier.acknowledge(event.unit)  # none waits unless coordinating
        for rid, inbound in ready:
            if self.acting(now):
                out.append(Respond(rid))
            else:
                out.append(Fail(rid, ErrorCode.NOT_COORDINATOR if inbound
                                else ErrorCode.COORDINATOR_NOT_AVAILABLE))

    # -- stepping down ------------------------------------------------------------------------

    def _step_down(self, event: Stop, now: float, out: list[Action]) -> None:
        held = self.role in HOLDING
        if self.role is Role.LETTING_GO:
            out.append(Forget("the proxy stops"))
        pending = held and not event.hand_off and not self.barrier.settled()
        self._move(Why.STOP, now, out)  # held requests and waiting answers fail
        if not held:
            self._leave(out)
            self.barrier.reset()
            return
        if event.hand_off:  # the driver names the members with Forgotten
            out.append(Forget("the proxy stops: its members let go first"))
        self._stepping = "writes" if pending else "members" if event.hand_off else ""
        if self._stepping:
            self._step_down_until = now + self.config.step_down_ms
        else:
            self._stepped_down(out)

    def _stepped_down(self, out: list[Action]) -> None:
        """Stepping down is done (or its bound passed): the engine forgets the group (unless
        it did already, handing off) and the lock is left at once, so that the next holder
        need not wait for the broker's session."""
        if self._stepping != "members":
            out.append(Forget("the proxy stops"))
        self._stepping = ""
        self._step_down_until = INF
        self._to_tell.clear()
        self._leave(out)
        self.barrier.reset()

    @property
    def stepped_down(self) -> bool:
        """Stepping down and nothing left to wait for (the driver may exit)."""
        return self.role is Role.STEPPING_DOWN and not self._stepping

    def _give_up(self, why: Why, now: float, out: list[Action]) -> None:
        out.append(Forget(f"group given up: {why.value}"))
        self._leave(out)
        self._move(why, now, out)


def moves(history: Iterable[tuple[float, Role, Why, Role]]) -> list[str]:
    """A trace of moves, one line each."""
    return [f"{at:.0f} {a.value} -{why.value}-> {b.value}" for at, a, why, b in history]
