"""The departure wait (translation.departures): a restarted application's departure and arrival
are one target change, so eager classic members go round at most once per restart.

The group of the online upgrade's roll (docs/operations.md, step 3): eager classic members
(``range``) sharing 12 partitions under the engine's default ``uniform`` assignor; one leaves
(LeaveGroup) and its replacement arrives on the consumer protocol seconds later. The clients
are driven in 100 ms steps, each heartbeating once a second; an eager client told to rejoin
revokes everything (a *round*) and joins and syncs again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from translation.assignors.uniform import UniformAssignor
from translation.classic.messages import HeldRequest, LeavingMember, SyncGroupResponse
from translation.effects import (
    DepartureWaitEnded,
    DepartureWaitStarted,
    Effect,
    JoinCompleted,
    SyncCompleted,
    TargetAssignmentComputed,
)
from translation.heartbeat import ConsumerGroupHeartbeatRequest
from translation.member import LEAVE_GROUP_MEMBER_EPOCH

from ..helpers import FOO, hb, image, join
from .helpers import Classic, E, G, join_req

PARTITIONS = 12
WAIT = 10_000
STEP = 100


@dataclass
class EagerClient:
    """A classic client with an eager assignor: told to rejoin, it gives up everything."""

    member_id: str
    protocols: tuple[str, ...] = ("range",)
    phase: str = "join"
    generation: int = -1
    owned: set[int] = field(default_factory=set)
    rounds: int = 0
    mark: int = 0
    """Where in the driver's effects the answer to its held request is looked for."""

    def act(self, c: Classic, now: int) -> None:
        if self.phase == "join":
            self._join(c, now)
        elif self.phase == "stable" and (
                c.beat(self.member_id, self.generation, now) == E.REBALANCE_IN_PROGRESS):
            self.rounds += 1
            self.owned = set()
            self._join(c, now)

    def collect(self, c: Classic, now: int) -> None:
        """Pick up the answer to a held JoinGroup or SyncGroup."""
        for effect in c.effects[self.mark:]:
            if effect_for(effect, self.member_id, JoinCompleted) and self.phase == "joining":
                assert isinstance(effect, JoinCompleted)
                self._joined(c, effect.response.error_code, effect.response.generation_id, now)
            elif effect_for(effect, self.member_id, SyncCompleted) and self.phase == "syncing":
                assert isinstance(effect, SyncCompleted)
                self._synced(effect.response)

    def _join(self, c: Classic, now: int) -> None:
        self.mark = len(c.effects)
        response = c.join(join_req(self.member_id, protocols=self.protocols), now)
        if isinstance(response, HeldRequest):
            self.phase = "joining"
            return
        self._joined(c, response.error_code, response.generation_id, now)

    def _joined(self, c: Classic, code: int, generation: int, now: int) -> None:
        if code != 0:
            self.phase = "join"
            return
        self.generation = generation
        self.mark = len(c.effects)
        response = c.sync(self.member_id, generation, now)
        if isinstance(response, HeldRequest):
            self.phase = "syncing"
            return
        self._synced(response)

    def _synced(self, response: SyncGroupResponse) -> None:
        if response.error_code != 0:
            self.phase = "join"
            return
        assert response.assignment is not None
        self.owned = {p for _t, ps in response.assignment.partitions for p in ps}
        self.phase = "stable"


@dataclass
class NewClient:
    """A consumer-protocol client (it revokes what it loses, adds what it gains)."""

    member_id: str
    epoch: int = 0
    owned: set[int] = field(default_factory=set)

    def act(self, c: Classic, now: int) -> None:
        request: ConsumerGroupHeartbeatRequest = (
            join(G, self.member_id) if self.epoch == 0
            else hb(G, self.member_id, self.epoch, {FOO: self.owned}))
        response, effects = c.engine.heartbeat(request, now)
        c.effects.extend(effects)
        assert response.error_code == 0, response
        self.epoch = response.member_epoch
        if response.assignment is not None:
            self.owned = {p for _t, ps in response.assignment for p in ps}

    def collect(self, c: Classic, now: int) -> None:
        pass


def effect_for(effect: Effect, member_id: str, kind: type) -> bool:
    return isinstance(effect, kind) and getattr(effect, "member_id", None) == member_id


class Roll:
    """The driver: clients by member id, time in 100 ms steps."""

    def __init__(self, n: int, protocols: tuple[str, ...] = ("range",), **config: object
                 ) -> None:
        config.setdefault("assignment_interval_ms", 1_000)
        config.setdefault("classic_departure_wait_ms", WAIT)
        self.c = Classic.of(image(foo=(FOO, PARTITIONS)), UniformAssignor(), **config)
        self.clients: dict[str, EagerClient | NewClient] = {
            f"m{i}": EagerClient(f"m{i}", protocols) for i in range(n)}
        self.now = 0
        self.run_until(30_000)
        assert self.settled(), self.owners()
        for client in self.clients.values():
            if isinstance(client, EagerClient):
                client.rounds = 0
        self.c.effects.clear()

    def run_until(self, end: int) -> None:
        while self.now < end:
            self.now += STEP
            self.c.tick(self.now)
            for i, client in enumerate(list(self.clients.values())):
                client.collect(self.c, self.now)
                if (self.now // STEP + i) % 10 == 0:  # a heartbeat a second, staggered
                    client.act(self.c, self.now)

    def owners(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        for member_id, client in self.clients.items():
            for p in client.owned:
                out[p].append(member_id)
        return out

    def settled(self) -> bool:
        return all(len(owners) == 1 for owners in self.owners().values())

    def leave(self, member_id: str) -> None:
        client = self.clients.pop(member_id)
        if isinstance(client, EagerClient):
            assert self.c.leave(LeavingMember(member_id), now=self.now).members[0].error_code == 0
        else:
            response, effects = self.c.engine.heartbeat(
                hb(G, member_id, LEAVE_GROUP_MEMBER_EPOCH), self.now)
            self.c.effects.extend(effects)
            assert response.error_code == 0

    def arrive(self, client: EagerClient | NewClient) -> None:
        self.clients[client.member_id] = client
        client.act(self.c, self.now)

    def rounds(self) -> dict[str, int]:
        return {m: c.rounds for m, c in self.clients.items() if isinstance(c, EagerClient)}

    def computations(self) -> int:
        return sum(isinstance(e, TargetAssignmentComputed) for e in self.c.effects)


def restart(roll: Roll, member_id: str, replacement: EagerClient | NewClient,
            after_ms: int) -> None:
    roll.leave(member_id)
    roll.run_until(roll.now + after_ms)
    roll.arrive(replacement)
    roll.run_until(roll.now + 20_000)
    assert roll.settled(), roll.owners()


def test_a_restart_onto_the_consumer_protocol_is_one_target_change() -> None:
    roll = Roll(6)
    restart(roll, "m5", NewClient("n5"), after_ms=2_500)
    assert roll.computations() == 1
    # the replacement took the departed member's partitions; nobody else was disturbed
    assert all(r == 0 for r in roll.rounds().values()), roll.rounds()
    ended = [e for e in roll.c.effects if isinstance(e, DepartureWaitEnded)]
    assert len(ended) == 1 and ended[0].departed == ("m5",) and ended[0].arrived == ("n5",)
    assert 2_500 <= ended[0].waited_ms < 2_600


def test_without_the_wait_eager_members_go_round_for_the_departure_and_the_arrival() -> None:
    """Kafka's behaviour (and groupgate's with the wait off): two target changes, and the
    members given the departed member's partitions revoke everything at each."""
    roll = Roll(6, classic_departure_wait_ms=0)
    restart(roll, "m5", NewClient("n5"), after_ms=2_500)
    assert roll.computations() == 2
    assert max(roll.rounds().values()) == 2, roll.rounds()
    assert not any(isinstance(e, DepartureWaitStarted) for e in roll.c.effects)


def test_every_restart_of_a_roll_is_one_target_change() -> None:
    """The whole step 3 of the online upgrade: every member, one at a time, onto the
    consumer protocol; an eager member goes round at most once per restart (here never)."""
    roll = Roll(6)
    for i in range(6):
        before = roll.computations()
        restart(roll, f"m{i}", NewClient(f"n{i}"), after_ms=1_500 + 700 * i)
        # the last eager member's departure is computed at once: nobody eager is left to
        # spare a round
        assert roll.computations() == before + (1 if i < 5 else 2)
        assert all(r <= 1 for r in roll.rounds().values()), (i, roll.rounds())
    assert roll.rounds() == {}  # nobody classic is left
    assert not roll.c.engine.groups[G].members.keys() - {f"n{i}" for i in range(6)}


def test_a_classic_replacement_is_folded_too() -> None:
    roll = Roll(6)
    restart(roll, "m2", EagerClient("m2b"), after_ms=3_000)
    assert roll.computations() == 1
    assert all(r == 0 for r in roll.rounds().values()), roll.rounds()


def test_the_departed_partitions_wait_for_the_arrival() -> None:
    """The cost: what the departed member had stays unassigned until its replacement comes;
    the others keep theirs and consume meanwhile."""
    roll = Roll(6)
    gone = set(roll.clients["m5"].owned)
    roll.leave("m5")
    roll.run_until(roll.now + 4_000)
    group = roll.c.engine.groups[G]
    assert all(group.owners.owner(FOO, p) is None for p in gone)
    assert all(len(roll.owners()[p]) == 1 for p in set(range(PARTITIONS)) - gone)
    assert group.group_epoch > group.target.epoch  # assigning: the target is held
    roll.arrive(NewClient("n5"))
    roll.run_until(roll.now + 3_000)
    assert roll.clients["n5"].owned == gone


def test_the_wait_runs_out_without_an_arrival() -> None:
    roll = Roll(6)
    roll.leave("m5")
    left = roll.now
    roll.run_until(left + WAIT - STEP)
    assert roll.computations() == 0 and all(r == 0 for r in roll.rounds().values())
    roll.run_until(left + WAIT + 5_000)
    assert roll.computations() == 1 and roll.settled()
    assert all(r <= 1 for r in roll.rounds().values()), roll.rounds()
    ended = [e for e in roll.c.effects if isinstance(e, DepartureWaitEnded)]
    assert [(e.arrived, e.waited_ms) for e in ended] == [((), WAIT)]


def test_two_departures_wait_for_two_arrivals() -> None:
    """A pod with two applications restarted at once: one target change."""
    roll = Roll(6)
    roll.leave("m4")
    roll.run_until(roll.now + 300)
    roll.leave("m5")
    roll.run_until(roll.now + 1_500)
    roll.arrive(NewClient("n4"))
    roll.run_until(roll.now + 1_500)
    assert roll.computations() == 0  # one replacement of two: still waiting
    roll.arrive(NewClient("n5"))
    roll.run_until(roll.now + 20_000)
    assert roll.settled() and roll.computations() == 1
    assert all(r == 0 for r in roll.rounds().values()), roll.rounds()


def test_later_departures_do_not_extend_the_wait() -> None:
    roll = Roll(6)
    roll.leave("m4")
    first = roll.now
    roll.run_until(first + 6_000)
    roll.leave("m5")
    roll.run_until(first + WAIT + 1_500)
    ended = [e for e in roll.c.effects if isinstance(e, DepartureWaitEnded)]
    assert [e.departed for e in ended] == [("m4", "m5")] and ended[0].waited_ms <= WAIT + STEP


def test_no_wait_in_a_group_without_eager_members() -> None:
    """Cooperative classic members (and consumer-protocol ones) lose only what moves: the
    departure is computed at once, as before."""
    roll = Roll(6, protocols=("cooperative-sticky",))
    roll.leave("m5")
    roll.run_until(roll.now + 1_500)
    assert roll.computations() == 1
    assert not any(isinstance(e, DepartureWaitStarted) for e in roll.c.effects)


def test_the_wait_ends_when_the_last_eager_member_goes() -> None:
    roll = Roll(2)
    roll.arrive(NewClient("n0"))
    roll.run_until(roll.now + 20_000)
    assert roll.settled()
    roll.c.effects.clear()
    roll.leave("m0")  # m1 is still eager: the wait opens
    roll.run_until(roll.now + 1_000)
    assert roll.computations() == 0
    roll.leave("m1")  # nobody eager is left: the target is computed at the next heartbeat
    roll.run_until(roll.now + 1_500)
    assert roll.computations() == 1
    assert roll.clients["n0"].owned == set(range(PARTITIONS))


def test_a_classic_rejoin_during_the_wait_is_held_until_it_ends() -> None:
    """A member that rejoins of its own accord during the wait (here: with a changed
    protocol list) has its JoinGroup held until the replacement arrives, then answered."""
    roll = Roll(6)
    roll.leave("m5")
    roll.run_until(roll.now + 1_200)  # a heartbeat arms the group's assignment timer
    m0 = roll.clients["m0"]
    assert isinstance(m0, EagerClient)
    m0.owned = set()
    m0._join(roll.c, roll.now)
    assert m0.phase == "joining"
    roll.run_until(roll.now + 2_000)
    assert m0.phase == "joining"
    roll.arrive(NewClient("n5"))
    roll.run_until(roll.now + 20_000)
    assert m0.phase == "stable" and roll.settled()
    assert roll.computations() == 1


def test_a_fence_is_computed_at_once() -> None:
    """A member that stops without a LeaveGroup is fenced when its session runs out (or by
    its pod's sidecar at once): it crashed or hung, and the fence hands its partitions on
    without a wait."""
    roll = Roll(6)
    roll.clients.pop("m5")  # stops heartbeating
    roll.run_until(roll.now + 12_000)  # its 10 s session runs out
    assert not any(isinstance(e, DepartureWaitStarted) for e in roll.c.effects)
    assert roll.computations() == 1 and roll.settled()


def test_a_fence_during_the_wait_is_not_waited_for() -> None:
    roll = Roll(6)
    roll.leave("m4")
    roll.clients.pop("m5")  # crashes meanwhile: fenced at its session timeout, not awaited
    roll.run_until(roll.now + 9_000)
    roll.arrive(NewClient("n4"))  # ends the wait: one arrival for one departure
    roll.run_until(roll.now + 20_000)
    assert roll.settled()
    ended = [e for e in roll.c.effects if isinstance(e, DepartureWaitEnded)]
    assert [(e.departed, e.arrived) for e in ended] == [(("m4",), ("n4",))]
