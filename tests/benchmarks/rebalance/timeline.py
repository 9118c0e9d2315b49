"""Partition ownership over time, and the rebalance metrics computed from it (pure code).

The rebalance benchmark records what consumer members report from their own callbacks as a
list of :class:`Event` ``(t, member, kind, partitions)``; this module replays such a timeline
and computes, for the window ``[trigger, end]``:

- *convergence*: from the trigger until every partition is owned by exactly one live member,
  no member is inside a rebalance callback (a pending revocation or assignment), and every live
  member owns something (when there are at least as many partitions as members) — and stays so
  until ``end``;
- *downtime*: partition-seconds during which a partition had no live, non-stalled owner;
- *members disturbed*: live members that revoked or lost at least one partition;
- *duplicates* and *peak lag* from consumed-record ranges and producer high-water marks.

No clock, no I/O: the unit tests feed hand-made timelines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: Event kinds. ``join``: the member exists and is live. ``assign``: it starts owning the
#: partitions (recorded when its assignment callback returns). ``revoke`` / ``lost``: it stops
#: owning them (recorded when the callback is entered). ``stall`` / ``resume``: it enters / leaves
#: a rebalance callback, consuming nothing in between. ``leave``: a graceful close begins;
#: ``crash``: the process was killed. After ``leave`` or ``crash`` the member is not live and
#: owns nothing until it ``join``s again.
KINDS = frozenset({"join", "assign", "revoke", "lost", "stall", "resume", "leave", "crash"})


@dataclass(frozen=True, order=True)
class Event:
    t: float
    member: str
    kind: str
    partitions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}")


@dataclass
class State:
    """Replays events; answers questions about the group at the current instant."""

    partitions: int
    live: set[str] = field(default_factory=set)
    stalled: set[str] = field(default_factory=set)
    owned: dict[str, set[int]] = field(default_factory=dict)
    owners: dict[int, set[str]] = field(default_factory=dict)

    def apply(self, ev: Event) -> set[int]:
        """Apply one event; return the partitions a *live* member revoked or lost by it."""
        m = ev.member
        taken: set[int] = set()
        if ev.kind == "join":
            self.live.add(m)
            self.stalled.discard(m)
            self.owned.setdefault(m, set())
        elif ev.kind in ("leave", "crash"):
            self.live.discard(m)
            self.stalled.discard(m)
            for p in self.owned.pop(m, set()):
                self.owners.get(p, set()).discard(m)
        elif m not in self.live:
            pass  # a closing or dead member's late callbacks change nothing
        elif ev.kind == "assign":
            mine = self.owned.setdefault(m, set())
            for p in ev.partitions:
                mine.add(p)
                self.owners.setdefault(p, set()).add(m)
        elif ev.kind in ("revoke", "lost"):
            mine = self.owned.setdefault(m, set())
            for p in ev.partitions:
                if p in mine:
                    taken.add(p)
                mine.discard(p)
                self.owners.get(p, set()).discard(m)
        elif ev.kind == "stall":
            self.stalled.add(m)
        elif ev.kind == "resume":
            self.stalled.discard(m)
        return taken

    def unserved(self) -> int:
        """Partitions no live, non-stalled member is consuming right now."""
        served = 0
        for p in range(self.partitions):
            owners = self.owners.get(p)
            if owners and any(o not in self.stalled for o in owners):
                served += 1
        return self.partitions - served

    def converged(self) -> bool:
        if self.stalled:
            return False
        for p in range(self.partitions):
            if len(self.owners.get(p, ())) != 1:
                return False
        if self.partitions >= len(self.live):
            return all(self.owned.get(m) for m in self.live)
        return True


@dataclass(frozen=True)
class Metrics:
    convergence_s: float | None  # None: not converged by the end of the window
    downtime_partition_s: float
    members_disturbed: int
    partitions_revoked: int
    disturbed: tuple[str, ...]


def _grouped(events: Sequence[Event]) -> list[tuple[float, list[Event]]]:
    """Events sorted by time, grouped by identical timestamps (applied together)."""
    out: list[tuple[float, list[Event]]] = []
    for ev in sorted(events, key=lambda e: e.t):
        if out and out[-1][0] == ev.t:
            out[-1][1].append(ev)
        else:
            out.append((ev.t, [ev]))
    return out


def compute(events: Sequence[Event], partitions: int, trigger: float, end: float) -> Metrics:
    """Metrics of the window ``[trigger, end]``; events before ``trigger`` build the state."""
    if end < trigger:
        raise ValueError("end before trigger")
    state = State(partitions)
    groups = _grouped(events)
    i = 0
    while i < len(groups) and groups[i][0] <= trigger:
        for ev in groups[i][1]:
            state.apply(ev)
        i += 1
    now = trigger
    downtime = 0.0
    disturbed: set[str] = set()
    revoked = 0
    converged_since: float | None = trigger if state.converged() else None
    for t, evs in groups[i:]:
        if t > end:
            break
        downtime += state.unserved() * (t - now)
        now = t
        for ev in evs:
            taken = state.apply(ev)
            if taken:
                disturbed.add(ev.member)
                revoked += len(taken)
        if state.converged():
            if converged_since is None:
                converged_since = t
        else:
            converged_since = None
    downtime += state.unserved() * (end - now)
    convergence = None if converged_since is None else converged_since - trigger
    return Metrics(convergence, downtime, len(disturbed), revoked, tuple(sorted(disturbed)))


def converged_now(events: Iterable[Event], partitions: int) -> bool:
    """Whether the group is converged after every event given (in time order)."""
    state = State(partitions)
    for _, evs in _grouped(list(events)):
        for ev in evs:
            state.apply(ev)
    return state.converged()


# ---------------------------------------------------------------------------------------------
# Per-member series for the pictures


@dataclass(frozen=True)
class Segment:
    """One member's state between ``start`` and ``end``: how many partitions it owned, and
    whether it was live and whether it sat in a callback."""

    member: str
    start: float
    end: float
    owned: int
    live: bool
    stalled: bool


@dataclass(frozen=True)
class Overlap:
    """Partition ``partition`` owned by ``first`` and ``second`` at once from ``t`` on."""

    t: float
    partition: int
    first: str
    second: str


def overlaps(events: Sequence[Event]) -> list[Overlap]:
    """Every instant at which a partition had two owners, with ownership taken as widely as
    the callbacks allow: a member owns a partition from the moment its assignment callback is
    *entered* (the ``stall`` before the ``assign``) until its revocation callback *returns*
    (the ``resume`` after the ``revoke``), or until it leaves or crashes. ``lost`` ends
    ownership at once (the coordinator already gave the partition away: a fenced member's
    loss, not a double assignment). An empty list means no partition was ever owned twice."""
    intervals: list[tuple[int, float, float, str]] = []
    open_: dict[tuple[str, int], float] = {}
    stall_at: dict[str, float] = {}
    releasing: dict[str, set[int]] = {}

    def close(member: str, partition: int, t: float) -> None:
        start = open_.pop((member, partition), None)
        if start is not None:
            intervals.append((partition, start, t, member))

    for ev in sorted(events, key=lambda e: e.t):
        m = ev.member
        if ev.kind == "stall":
            stall_at[m] = ev.t
        elif ev.kind == "assign":
            start = stall_at.get(m, ev.t)
            for p in ev.partitions:
                open_.setdefault((m, p), start)
        elif ev.kind == "revoke":
            releasing.setdefault(m, set()).update(ev.partitions)
            if m not in stall_at:  # no callback bracket (Java members): released now
                for p in releasing.pop(m):
                    close(m, p, ev.t)
        elif ev.kind == "resume":
            stall_at.pop(m, None)
            for p in releasing.pop(m, set()):
                close(m, p, ev.t)
        elif ev.kind == "lost":
            for p in ev.partitions:
                close(m, p, ev.t)
        elif ev.kind in ("leave", "crash"):
            stall_at.pop(m, None)
            releasing.pop(m, None)
            for member, p in [k for k in open_ if k[0] == m]:
                close(member, p, ev.t)
    for (m, p), start in list(open_.items()):
        intervals.append((p, start, float("inf"), m))
    found: list[Overlap] = []
    by_partition: dict[int, list[tuple[float, float, str]]] = {}
    for p, start, end, m in intervals:
        by_partition.setdefault(p, []).append((start, end, m))
    for p, spans in sorted(by_partition.items()):
        spans.sort()
        for i, (_start, end, m) in enumerate(spans):
            for start2, _end2, m2 in spans[i + 1:]:
                if start2 >= end:
                    break
                if m2 != m:
                    found.append(Overlap(start2, p, m, m2))
    return found


def segments(events: Sequence[Event], partitions: int, start: float, end: float) -> list[Segment]:
    """Each member's states over ``[start, end]`` as contiguous segments (for drawing)."""
    state = State(partitions)
    members: list[str] = []
    seen: set[str] = set()
    current: dict[str, tuple[float, int, bool, bool]] = {}
    out: list[Segment] = []

    def snapshot(m: str) -> tuple[int, bool, bool]:
        return len(state.owned.get(m, ())), m in state.live, m in state.stalled

    for t, evs in _grouped(events):
        if t > end:
            break
        for ev in evs:
            state.apply(ev)
            if ev.member not in seen:
                seen.add(ev.member)
                members.append(ev.member)
        at = max(t, start)
        for m in members:
            snap = snapshot(m)
            old = current.get(m)
            if old is None or old[1:] != snap:
                if old is not None and at > old[0]:
                    out.append(Segment(m, old[0], at, *old[1:]))
                current[m] = (at, *snap)
    for m, (t0, owned, live, stalled) in current.items():
        if end > t0:
            out.append(Segment(m, t0, end, owned, live, stalled))
    return out


def unserved_series(
    events: Sequence[Event], partitions: int, start: float, end: float
) -> list[tuple[float, int]]:
    """``(t, partitions not consumed)`` step points over ``[start, end]``."""
    state = State(partitions)
    points: list[tuple[float, int]] = []
    started = False
    for t, evs in _grouped(events):
        if t > end:
            break
        if t > start and not started:
            points.append((start, state.unserved()))
            started = True
        for ev in evs:
            state.apply(ev)
        if t >= start:
            started = True
            points.append((t, state.unserved()))
    if not started:
        points.append((start, state.unserved()))
    points.append((end, state.unserved()))
    return points


# ---------------------------------------------------------------------------------------------
# Records: duplicates and lag


@dataclass(frozen=True)
class Consumed:
    """Records a member consumed in one batch: ``ranges`` of ``(partition, first, last)``
    offsets (inclusive, each range contiguous)."""

    t: float
    member: str
    ranges: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Produced:
    """Producer high-water marks at ``t``: ``partition -> next offset``."""

    t: float
    next_offsets: dict[int, int]


def duplicates(batches: Iterable[Consumed]) -> tuple[int, int]:
    """``(records consumed, records consumed more than once)`` (the second counts the extra
    deliveries: an offset consumed three times adds two)."""
    per_partition: dict[int, list[tuple[int, int]]] = {}
    total = 0
    for batch in batches:
        for p, lo, hi in batch.ranges:
            if hi < lo:
                raise ValueError(f"bad range {lo}..{hi}")
            per_partition.setdefault(p, []).append((lo, hi))
            total += hi - lo + 1
    distinct = 0
    for ranges in per_partition.values():
        ranges.sort()
        cur_lo, cur_hi = ranges[0]
        for lo, hi in ranges[1:]:
            if lo <= cur_hi + 1:
                cur_hi = max(cur_hi, hi)
            else:
                distinct += cur_hi - cur_lo + 1
                cur_lo, cur_hi = lo, hi
        distinct += cur_hi - cur_lo + 1
    return total, total - distinct


def peak_lag(
    produced: Iterable[Produced], consumed: Iterable[Consumed], start: float, end: float
) -> int:
    """The largest total lag (records produced but not yet consumed, summed over partitions)
    seen at any event time in ``[start, end]``. A partition's consumed position is one past
    the highest offset consumed so far (by anybody)."""
    items: list[tuple[float, int, object]] = []
    items += [(p.t, 0, p) for p in produced]
    items += [(c.t, 1, c) for c in consumed]
    items.sort(key=lambda x: (x[0], x[1]))
    high: dict[int, int] = {}
    position: dict[int, int] = {}
    lag = 0
    peak = 0
    for t, _, item in items:
        if t > end:
            break
        if isinstance(item, Produced):
            for p, nxt in item.next_offsets.items():
                old = high.get(p, 0)
                if nxt > old:
                    pos = position.get(p, 0)
                    lag += max(nxt - pos, 0) - max(old - pos, 0)
                    high[p] = nxt
        elif isinstance(item, Consumed):
            for p, _lo, hi in item.ranges:
                old = position.get(p, 0)
                if hi + 1 > old:
                    top = high.get(p, 0)
                    lag += max(top - hi - 1, 0) - max(top - old, 0)
                    position[p] = hi + 1
        if t >= start:
            peak = max(peak, lag)
    return peak
