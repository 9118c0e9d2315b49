"""Synthetic group-event journals for the report benchmark: a fleet migrating from the classic
protocol to KIP-848 over a week.

Each group keeps between 3 and 12 members and 6 to 48 partitions and, at random times, has a
member join, leave, crash (fenced), or a classic member replaced by a consumer-protocol one
(the rolling
migration: the share of classic joiners falls from 90% to 5% over the span). Every change is
told the way the observer tells it: an epoch bump, the member event, Assigning, the target,
Reconciling, then per moved partition the old owner's revocation, its release a little later,
the new owner's assignment after that, and Stable once the last partition is assigned.
Snapshots of every group come every five (simulated) minutes. Values are schema-version-1
JSON lines (``proxy.journal.schema``), written straight as text for speed.
"""

from __future__ import annotations

import bisect
import heapq
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPAN_MS = 7 * 24 * 3600 * 1000
SNAPSHOT_MS = 300_000
SOFTWARE = {
    "classic": [("apache-kafka-java", "2.8.2"), ("apache-kafka-java", "3.6.1"),
                ("librdkafka", "1.9.2"), ("kafka-python", "2.0.2")],
    "consumer": [("apache-kafka-java", "4.1.0"), ("librdkafka", "2.16.1"),
                 ("apache-kafka-java", "4.2.0")],
}


@dataclass
class Member:
    member_id: str
    protocol: str
    software: tuple[str, str]
    partitions: set[int] = field(default_factory=set)


@dataclass
class Group:
    name: str
    topic: str
    partitions: int
    members: dict[str, Member] = field(default_factory=dict)
    epoch: int = 0
    created: bool = False
    size: int = 8
    """Members it has at most (it hovers around it: a full group only loses members)."""


class Writer:
    def __init__(self, source: str) -> None:
        self.source = source
        self.seq = 0
        self.lines: list[tuple[int, int, str]] = []

    def emit(self, ts: int, group: str, event_type: str, **fields: Any) -> None:
        self.seq += 1
        value = {"v": 1, "type": event_type, "ts": ts, "group": group, "source": self.source,
                 "seq": self.seq}
        value.update({k: v for k, v in fields.items() if v is not None and v != {}})
        self.lines.append((ts, self.seq, json.dumps(value, separators=(",", ":"))))


class Fleet:
    def __init__(self, seed: int, groups: int) -> None:
        self.rng = random.Random(seed)
        self.out = Writer("synth-proxy:9092")
        self.groups = [Group(f"service-{i:05d}", f"topic-{i % 97}",
                             self.rng.choice((6, 12, 24, 48)), size=self.rng.randint(3, 12))
                       for i in range(groups)]
        self.next_member = 0

    def classic_share(self, ts: int) -> float:
        progress = min(max((ts - T0) / SPAN_MS, 0.0), 1.0)
        return 0.9 - 0.85 * progress

    def new_member(self, ts: int, protocol: str | None = None) -> Member:
        self.next_member += 1
        if protocol is None:
            protocol = "classic" if self.rng.random() < self.classic_share(ts) else "consumer"
        return Member(f"m-{self.next_member:09d}", protocol,
                      self.rng.choice(SOFTWARE[protocol]))

    def identity(self, m: Member) -> dict[str, Any]:
        return {"member": m.member_id, "protocol": m.protocol,
                "assignor": "range" if m.protocol == "classic" else "uniform",
                "client_id": "svc", "software_name": m.software[0],
                "software_version": m.software[1]}

    def state(self, ts: int, g: Group, name: str) -> None:
        self.out.emit(ts, g.name, "group_state", state=name, group_epoch=g.epoch,
                      assignment_epoch=g.epoch if name != "Assigning" else g.epoch - 1,
                      member_count=len(g.members))

    def bump(self, ts: int, g: Group, reason: str) -> None:
        g.epoch += 1
        self.out.emit(ts, g.name, "epoch_bumped", group_epoch=g.epoch, reason=reason)

    def reassign(self, ts: int, g: Group) -> int:
        """Reassign evenly; tell revocations, releases and assignments; returns when Stable."""
        out = self.out
        self.state(ts, g, "Assigning")
        out.emit(ts, g.name, "target_computed", assignment_epoch=g.epoch, assignor="uniform",
                 changed_members=len(g.members), member_count=len(g.members))
        self.state(ts, g, "Reconciling")
        ids = sorted(g.members)
        target: dict[str, set[int]] = {m: set() for m in ids}
        for p in range(g.partitions):
            target[ids[p % len(ids)]].add(p)
        end = ts
        released_at: dict[int, int] = {}
        for mid in ids:
            m = g.members[mid]
            gone = m.partitions - target[mid]
            if not gone:
                continue
            slow = 3000 if m.protocol == "classic" else 1000
            t_revoke = ts + self.rng.randint(50, slow)
            t_release = t_revoke + self.rng.randint(20, 2 * slow)
            names = {g.topic: sorted(gone)}
            out.emit(t_revoke, g.name, "assignment", member=mid, member_epoch=g.epoch - 1,
                     state="unrevoked_partitions", revoked=names, revoking=names)
            out.emit(t_release, g.name, "assignment", member=mid, member_epoch=g.epoch,
                     state="stable", released=names)
            m.partitions -= gone
            for p in gone:
                released_at[p] = t_release
        for mid in ids:
            m = g.members[mid]
            new = target[mid] - m.partitions
            if not new:
                continue
            ready = max((released_at.get(p, ts) for p in new), default=ts)
            t_assign = ready + self.rng.randint(10, 3000 if m.protocol == "classic" else 800)
            out.emit(t_assign, g.name, "assignment", member=mid, member_epoch=g.epoch,
                     state="stable", assigned={g.topic: sorted(new)})
            m.partitions |= new
            end = max(end, t_assign)
        self.state(end + 1, g, "Stable")
        return end + 1

    def act(self, ts: int, g: Group) -> int:
        """One change to ``g`` at ``ts``; returns when the group is Stable again."""
        out = self.out
        if not g.created:
            g.created = True
            out.emit(ts, g.name, "group_created", group_epoch=0, converted=False)
            for _ in range(self.rng.randint(2, 6)):
                m = self.new_member(ts)
                g.members[m.member_id] = m
                out.emit(ts, g.name, "member_joined", **self.identity(m), member_epoch=0,
                         group_epoch=g.epoch, topics=[g.topic])
            self.bump(ts, g, "group created; member joined")
            return self.reassign(ts, g)
        roll = self.rng.random()
        classic = [m for m in g.members.values() if m.protocol == "classic"]
        if roll < 0.35 and classic and self.rng.random() > self.classic_share(ts):
            old = self.rng.choice(classic)  # rolled to the new protocol: leave, then join
            self.bump(ts, g, "member left")
            del g.members[old.member_id]
            out.emit(ts, g.name, "member_left", member=old.member_id, protocol=old.protocol,
                     static=False, member_epoch=g.epoch - 1,
                     revoked={g.topic: sorted(old.partitions)},
                     released={g.topic: sorted(old.partitions)})
            ts = self.reassign(ts, g) + self.rng.randint(1000, 20_000)
            m = self.new_member(ts, "consumer")
            g.members[m.member_id] = m
            out.emit(ts, g.name, "member_joined", **self.identity(m), member_epoch=0,
                     group_epoch=g.epoch, topics=[g.topic])
            self.bump(ts, g, "member joined")
            return self.reassign(ts, g)
        if (roll < 0.65 and len(g.members) < g.size) or len(g.members) <= 2:
            m = self.new_member(ts)
            g.members[m.member_id] = m
            out.emit(ts, g.name, "member_joined", **self.identity(m), member_epoch=0,
                     group_epoch=g.epoch, topics=[g.topic])
            self.bump(ts, g, "member joined")
            return self.reassign(ts, g)
        victim = g.members.pop(self.rng.choice(sorted(g.members)))
        self.bump(ts, g, "member left" if roll < 0.9 else "session timeout")
        held = {g.topic: sorted(victim.partitions)}
        if roll < 0.9:
            out.emit(ts, g.name, "member_left", member=victim.member_id,
                     protocol=victim.protocol, static=False, member_epoch=g.epoch - 1,
                     revoked=held, released=held)
        else:
            out.emit(ts, g.name, "member_fenced", member=victim.member_id,
                     protocol=victim.protocol, reason="session-timeout",
                     member_epoch=g.epoch - 1, revoked=held, released=held)
        return self.reassign(ts, g)

    def snapshot(self, ts: int, g: Group) -> None:
        members = [{**self.identity(m), "member_epoch": g.epoch, "state": "stable",
                    "assigned": {g.topic: sorted(m.partitions)}} for m in g.members.values()]
        self.out.emit(ts, g.name, "group_snapshot", state="Stable", group_epoch=g.epoch,
                      assignment_epoch=g.epoch, member_count=len(members), part=1, parts=1,
                      members=members)


EVENTS_PER_GROUP = 7000
EVENTS_PER_CHANGE = 20
"""Roughly: a change is a bump, a member event, three states, a target and about a dozen
assignment events."""


def generate(events: int, seed: int = 1) -> Iterator[str]:
    """``events`` JSON lines in time order: snapshots and changes of ``events // 7000``
    groups (a week of five-minute snapshots is 2,016 per group; changes make the rest)."""
    groups = max(10, events // EVENTS_PER_GROUP)
    fleet = Fleet(seed, groups)
    rng = fleet.rng
    changes = max(1.0, (events / groups - SPAN_MS / SNAPSHOT_MS) / EVENTS_PER_CHANGE)
    mean_gap = SPAN_MS / changes
    queue: list[tuple[int, int, str]] = []
    for i in range(groups):
        heapq.heappush(queue, (T0 + rng.randint(0, 3_600_000), i, "act"))
        heapq.heappush(queue, (T0 + SNAPSHOT_MS + rng.randint(0, SNAPSHOT_MS), i, "snapshot"))
    written = 0
    while queue and written < events:
        ts, i, what = heapq.heappop(queue)
        g = fleet.groups[i]
        if what == "snapshot":
            if g.created:
                fleet.snapshot(ts, g)
            heapq.heappush(queue, (ts + SNAPSHOT_MS, i, "snapshot"))
        else:
            stable = fleet.act(ts, g)
            heapq.heappush(queue, (stable + int(rng.expovariate(1 / mean_gap)) + 1, i, "act"))
        # Every line before the earliest pending step is final: later steps write later.
        lines = fleet.out.lines
        lines.sort()
        cut = bisect.bisect_left(lines, (queue[0][0], -1, "")) if queue else len(lines)
        for _, _, line in lines[:cut]:
            if written == events:
                return
            yield line
            written += 1
        fleet.out.lines = lines[cut:]


def write_journal(path: Path, events: int, seed: int = 1) -> int:
    """Write about ``events`` lines to ``path``; returns how many."""
    n = 0
    with path.open("w") as f:
        chunk: list[str] = []
        for line in generate(events, seed):
            chunk.append(line)
            n += 1
            if len(chunk) >= 10_000:
                f.write("\n".join(chunk) + "\n")
                chunk = []
        if chunk:
            f.write("\n".join(chunk) + "\n")
    return n
