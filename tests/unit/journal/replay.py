"""Folding journal events back into groups, members and who holds which partition, so tests
can check that the journal alone tells what the engine did."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.journal.schema import Event, EventType
from translation.coordinator import GroupCoordinator
from translation.member import LEAVE_GROUP_STATIC_MEMBER_EPOCH, PartitionEpochs
from translation.topics import TopicId

TP = tuple[str, int]


def tps(partitions: Any) -> set[TP]:
    return {(t, p) for t, ps in (partitions or {}).items() for p in ps}


@dataclass
class ReplayedMember:
    protocol: str
    assigned: set[TP] = field(default_factory=set)
    """What it consumes: gained by ``assigned``, lost by ``revoked``."""
    held: set[TP] = field(default_factory=set)
    """What nobody else may get: gained by ``assigned``, lost by ``released``."""


@dataclass
class Replay:
    groups: dict[str, dict[str, ReplayedMember]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    epochs: dict[str, tuple[int, int]] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        f = event.fields
        g = event.group
        t = event.type
        if t is EventType.GROUP_CREATED:
            assert g not in self.groups, f"{g} created twice"
            self.groups[g] = {}
        elif t in (EventType.GROUP_EXPIRED, EventType.GROUP_DELETED,
                   EventType.GROUP_HANDED_BACK, EventType.GROUP_DROPPED):
            del self.groups[g]
            self.states.pop(g, None)
        elif t is EventType.GROUP_STATE:
            self.states[g] = f["state"]
            self.epochs[g] = (f["group_epoch"], f["assignment_epoch"])
        elif t is EventType.MEMBER_JOINED:
            members = self.groups[g]
            assert f["member"] not in members
            carried = tps(f.get("assigned"))
            members[f["member"]] = ReplayedMember(f["protocol"], set(carried), set(carried))
        elif t is EventType.MEMBER_REPLACED:
            members = self.groups[g]
            members.pop(f["replaced"])
            carried = tps(f.get("assigned"))
            members[f["member"]] = ReplayedMember(f["protocol"], set(carried), set(carried))
        elif t is EventType.MEMBER_LEFT and f.get("static"):
            self.groups[g][f["member"]].assigned -= tps(f.get("revoked"))
        elif t in (EventType.MEMBER_LEFT, EventType.MEMBER_FENCED):
            del self.groups[g][f["member"]]
        elif t is EventType.ASSIGNMENT:
            m = self.groups[g][f["member"]]
            # Within one event, what is given up goes before what is gained.
            m.assigned = (m.assigned - tps(f.get("revoked"))) | tps(f.get("assigned"))
            m.held = (m.held - tps(f.get("released"))) | tps(f.get("assigned"))


def names(engine: GroupCoordinator, partitions: PartitionEpochs,
          known: dict[TopicId, str]) -> set[TP]:
    return {(known[t], p) for t, ps in partitions.items() for p in ps}


def mismatches(replay: Replay, engine: GroupCoordinator,
               known: dict[TopicId, str] | None = None) -> list[str]:
    """How the replayed journal differs from the engine (empty: it does not). ``known``: the
    name of every topic id seen so far (a deleted topic keeps its name in the journal)."""
    known = {} if known is None else known
    known.update((t.topic_id, t.name) for t in engine.image.by_id.values())
    out: list[str] = []
    if set(replay.groups) != set(engine.groups):
        return [f"groups {sorted(replay.groups)} != engine {sorted(engine.groups)}"]
    for group_id, group in engine.groups.items():
        replayed = replay.groups[group_id]
        if set(replayed) != set(group.members):
            out.append(f"{group_id}: members {sorted(replayed)} != {sorted(group.members)}")
            continue
        if replay.states.get(group_id) != group.state.value:
            out.append(f"{group_id}: state {replay.states.get(group_id)} != {group.state.value}")
        for member_id, member in group.members.items():
            r = replayed[member_id]
            held = (names(engine, member.assigned, known)
                    | names(engine, member.pending_revocation, known))
            if r.held != held:
                out.append(f"{member_id}: held {sorted(r.held)} != {sorted(held)}")
            if member.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH \
                    and r.assigned != names(engine, member.assigned, known):
                out.append(f"{member_id}: assigned {sorted(r.assigned)} != "
                           f"{sorted(names(engine, member.assigned, known))}")
            if r.protocol != member.protocol.value:
                out.append(f"{member_id}: protocol {r.protocol} != {member.protocol.value}")
    return out
