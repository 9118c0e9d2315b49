"""The soak's invariants, as pure functions over what the soak recorded (no clock, no I/O).

* :class:`OffsetWatch`: committed offsets polled from the broker never move backwards.
* :func:`missing`: every record the producer had acknowledged was consumed by some member of
  each group (at least once).
* :func:`double_ownership`: no partition had two owners at once on the members' own callback
  timelines (:func:`tests.benchmarks.rebalance.timeline.overlaps`), except where one of the two was
  a member whose poll loop was stuck (a stall past its ``max.poll.interval.ms``, or a
  synchronous commit that held it while the coordinator was unreachable): a zombie the
  coordinator had fenced. Such a member must not have had a commit of the partition accepted
  that it sent after the overlap began (:func:`zombie_commits`).
* :func:`rewinds`: no member given a partition started below an offset whose commit had been
  acknowledged before it was given the partition (so duplicates are only records whose commit
  had not landed).
* :func:`rss_growth`: the proxy's resident memory after warm-up, per process incarnation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tests.benchmarks.rebalance.timeline import Event, Overlap, overlaps

Intervals = list[tuple[int, int]]
"""Sorted, disjoint, inclusive [first, last] runs of offsets."""


@dataclass(frozen=True)
class Regression:
    t: float
    group: str
    partition: int
    before: int
    after: int


@dataclass
class OffsetWatch:
    """Committed offsets as polled; every decrease is a :class:`Regression`."""

    highest: dict[tuple[str, int], int] = field(default_factory=dict)
    regressions: list[Regression] = field(default_factory=list)
    polls: int = 0

    def observe(self, t: float, group: str, committed: Mapping[int, int]) -> None:
        self.polls += 1
        for partition, offset in committed.items():
            key = (group, partition)
            before = self.highest.get(key)
            if before is not None and offset < before:
                self.regressions.append(Regression(t, group, partition, before, offset))
            if before is None or offset > before:
                self.highest[key] = offset


def add_run(runs: Intervals, first: int, last: int) -> Intervals:
    """``runs`` with [first, last] merged in."""
    out: Intervals = []
    placed = False
    for a, b in runs:
        if b + 1 < first:
            out.append((a, b))
        elif last + 1 < a:
            if not placed:
                out.append((first, last))
                placed = True
            out.append((a, b))
        else:
            first, last = min(a, first), max(b, last)
    if not placed:
        out.append((first, last))
    out.sort()
    return out


def missing(produced: Mapping[int, int], consumed: Mapping[int, Intervals]) -> dict[int, int]:
    """Per partition, how many of the offsets ``0 .. produced[p] - 1`` no member consumed."""
    gaps: dict[int, int] = {}
    for partition, end in produced.items():
        covered = 0
        for a, b in consumed.get(partition, []):
            lo, hi = max(a, 0), min(b, end - 1)
            if hi >= lo:
                covered += hi - lo + 1
        if end - covered:
            gaps[partition] = end - covered
    return gaps


@dataclass(frozen=True)
class Stuck:
    """A member that blocked its poll loop from ``start`` to ``end`` (asked to) and noticed
    what the coordinator did meanwhile at ``noticed`` (its next revoke, loss, leave or crash;
    infinity if never)."""

    member: str
    start: float
    end: float
    noticed: float = float("inf")


def zombie_windows(events: Sequence[Event], stuck: Iterable[tuple[str, float, float]]
                   ) -> list[Stuck]:
    """:class:`Stuck` records for (member, start, end) stalls, with when each one noticed."""
    ends = sorted((e.t, e.member) for e in events
                  if e.kind in ("revoke", "lost", "leave", "crash"))
    out = []
    for member, start, end in stuck:
        noticed = next((t for t, m in ends if m == member and t >= end), float("inf"))
        out.append(Stuck(member, start, end, noticed))
    return out


def _zombie(member: str, t: float, stuck: Sequence[Stuck]) -> bool:
    return any(s.member == member and s.start <= t <= s.noticed for s in stuck)


def double_ownership(events: Sequence[Event], stuck: Sequence[Stuck]
                     ) -> tuple[list[Overlap], list[Overlap]]:
    """(unexplained, explained) overlaps: explained ones involve a member that had been stuck
    (a fenced zombie that had not yet noticed)."""
    unexplained, explained = [], []
    for o in overlaps(events):
        if _zombie(o.first, o.t, stuck) or _zombie(o.second, o.t, stuck):
            explained.append(o)
        else:
            unexplained.append(o)
    return unexplained, explained


@dataclass(frozen=True)
class Commit:
    t: float
    """When the member learnt the outcome."""
    member: str
    partition: int
    offset: int
    sent: float | None = None
    """When the member sent it (an asynchronous commit's callback may come much later)."""

    @property
    def sent_at(self) -> float:
        return self.t if self.sent is None else self.sent


def zombie_commits(explained: Iterable[Overlap], stuck: Sequence[Stuck],
                   commits: Iterable[Commit]) -> list[Commit]:
    """Successful commits of a stuck member for a partition it shared with another owner,
    made after the sharing began and before the member noticed it had been fenced: each of
    them is a zombie commit the coordinator let in. (Once it has noticed, the member rejoins
    and may own the partition again, legitimately.)"""
    windows: list[tuple[str, int, float, float]] = []
    for o in explained:
        for member in (o.first, o.second):
            for s in stuck:
                if s.member == member and s.start <= o.t <= s.noticed:
                    windows.append((member, o.partition, o.t, s.noticed))
    return [c for c in commits
            if any(c.member == m and c.partition == p and start < c.sent_at <= noticed
                   for m, p, start, noticed in windows)]


@dataclass(frozen=True)
class Start:
    """A member given ``partition`` at ``t`` first consumed it from ``offset``."""

    t: float
    member: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Rewind:
    """A member started a partition below an offset whose commit had been acknowledged before
    the member was given the partition: records consumed again although their commit had
    landed (a committed offset rolled back, or a stale one handed out)."""

    member: str
    partition: int
    t: float
    started_at: int
    committed: int
    committed_at: float


def rewinds(starts: Iterable[Start], commits: Sequence[Commit]) -> list[Rewind]:
    """Every :class:`Start` below the highest offset committed (and acknowledged to its
    committer) for the partition before the start. Duplicates that remain are records whose
    commit had not landed when their partition moved."""
    by_partition: dict[int, list[Commit]] = {}
    for c in commits:
        by_partition.setdefault(c.partition, []).append(c)
    for listed in by_partition.values():
        listed.sort(key=lambda c: c.t)
    out = []
    for start in starts:
        best: Commit | None = None
        for c in by_partition.get(start.partition, ()):
            if c.t >= start.t:
                break
            if best is None or c.offset > best.offset:
                best = c
        if best is not None and start.offset < best.offset:
            out.append(Rewind(start.member, start.partition, start.t, start.offset,
                              best.offset, best.t))
    return out


@dataclass(frozen=True)
class RssGrowth:
    incarnation: int
    warm_mib: float
    peak_mib: float

    @property
    def growth_mib(self) -> float:
        return self.peak_mib - self.warm_mib


def rss_growth(samples: Iterable[tuple[float, int, float]], warmup_s: float) -> list[RssGrowth]:
    """``samples``: (t, incarnation, rss MiB). Per incarnation: the RSS at the end of its
    warm-up (the first sample at least ``warmup_s`` after its first) and the peak after."""
    by: dict[int, list[tuple[float, float]]] = {}
    for t, incarnation, mib in samples:
        by.setdefault(incarnation, []).append((t, mib))
    out = []
    for incarnation, series in sorted(by.items()):
        series.sort()
        start = series[0][0]
        warm = [mib for t, mib in series if t >= start + warmup_s]
        if len(warm) < 2:
            continue
        out.append(RssGrowth(incarnation, warm[0], max(warm)))
    return out
