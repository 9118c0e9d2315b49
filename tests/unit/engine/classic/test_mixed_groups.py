"""Classic and new-protocol members share one target and one reconciliation, through a full
rolling upgrade and back: all-classic -> mixed -> all-new -> mixed -> all-classic."""

from __future__ import annotations

from translation.assignors.uniform import UniformAssignor
from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import HeldRequest, JoinGroupResponse, LeavingMember
from translation.config import GroupConfig
from translation.coordinator import GroupCoordinator
from translation.group import GroupState
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from ..helpers import BAR, FOO, hb, image, join
from .helpers import Classic, E, G, join_req


class Driver:
    """Well-behaved clients: classic ones cooperative, new ones revoking at once."""

    def __init__(self) -> None:
        engine = GroupCoordinator(
            GroupConfig(assignors=[UniformAssignor()], assignment_interval_ms=0),
            image(foo=(FOO, 6), bar=(BAR, 3)),
        )
        self.c = Classic(engine, ClassicGroupCoordinator(engine))
        self.now = 0
        self.classic: dict[str, tuple[int, set[tuple[str, int]]]] = {}
        self.new: dict[str, tuple[int, dict[object, set[int]]]] = {}

    def add_classic(self, name: str) -> None:
        self.classic[name] = (-1, set())

    def add_new(self, name: str) -> None:
        resp, _ = self.c.engine.heartbeat(join(G, name, topics=("foo", "bar")), self.now)
        owned = {t: set(ps) for t, ps in resp.assignment or []}
        self.new[name] = (resp.member_epoch, owned)

    def step(self) -> None:
        self.now += 100
        c = self.c
        for name, (gen, owned) in list(self.classic.items()):
            if gen >= 0 and c.beat(name, gen, now=self.now) is E.NONE:
                continue
            by_topic: dict[str, list[int]] = {}
            for t, p in owned:
                by_topic.setdefault(t, []).append(p)
            r = c.join(
                join_req(name, ("foo", "bar"), by_topic, protocols=("cooperative-sticky",)),
                self.now,
            )
            assert isinstance(r, JoinGroupResponse) and r.error_code == 0
            s = c.sync(name, r.generation_id, self.now)
            if isinstance(s, HeldRequest):  # held until its partitions are released
                for _ in range(40):
                    if name in c.synced():
                        break
                    self.now += 100
                    c.tick(self.now)
                s = c.synced()[name]
                c.effects.clear()
            if s.error_code:
                self.classic[name] = (r.generation_id, owned)
                continue
            assert s.assignment is not None
            self.classic[name] = (
                r.generation_id,
                {(t, p) for t, ps in s.assignment.partitions for p in ps},
            )
        for name, (epoch, owned_new) in list(self.new.items()):
            resp, _ = c.engine.heartbeat(hb(G, name, epoch, owned_new), self.now)
            assert resp.error_code == 0, resp
            if resp.assignment is not None:
                owned_new = {t: set(ps) for t, ps in resp.assignment}
            self.new[name] = (resp.member_epoch, owned_new)
        self.check_exclusive()

    def check_exclusive(self) -> None:
        seen: dict[tuple[object, int], str] = {}
        ids = {m.name: m.topic_id for m in self.c.engine.image.by_id.values()}
        for name, (_, owned) in self.classic.items():
            for t, p in owned:
                key = (ids[t], p)
                assert key not in seen, (key, seen[key], name)
                seen[key] = name
        for name, (_, owned_new) in self.new.items():
            for t, ps in owned_new.items():
                for p in ps:
                    key = (t, p)
                    assert key not in seen, (key, seen[key], name)
                    seen[key] = name

    def settle(self) -> None:
        for _ in range(12):
            self.step()
        group = self.c.engine.groups[G]
        assert group.state is GroupState.STABLE, group.state
        total = sum(len(o) for _, o in self.classic.values())
        total += sum(len(ps) for _, o in self.new.values() for ps in o.values())
        assert total == 9  # every partition owned exactly once
        for name, (gen, _) in self.classic.items():
            member = group.members[name]
            assert member.member_epoch == group.target.epoch
            assert member.classic is not None and gen == member.classic.generation
        for epoch, _ in self.new.values():
            assert epoch == group.target.epoch


def test_rolling_upgrade_and_back() -> None:
    d = Driver()
    d.add_classic("c1")
    d.add_classic("c2")
    d.settle()  # all classic
    d.add_new("n1")
    d.settle()  # mixed
    d.c.leave(LeavingMember("c1"), now=d.now)
    del d.classic["c1"]
    d.add_new("n2")
    d.c.leave(LeavingMember("c2"), now=d.now)
    del d.classic["c2"]
    d.settle()  # all new
    assert all(not m.classic for m in d.c.engine.groups[G].members.values())
    d.add_classic("c3")
    d.settle()  # mixed again
    for name in ("n1", "n2"):
        d.c.engine.heartbeat(ConsumerGroupHeartbeatRequest(G, name, -1), d.now)
        del d.new[name]
    d.add_classic("c4")
    d.settle()  # all classic, still on the engine (adopt_classic_groups)
    assert set(d.c.engine.groups[G].members) == {"c3", "c4"}
