"""A rolling migration classic -> ``group.protocol=consumer`` -> classic, under load, loses nothing.

One group of four members behind groupgate in front of Kafka 3.9 (``--classic-translation on``,
so classic and new-protocol members share one engine group) is migrated one member at a time:
each classic member is stopped gracefully and replaced by a ``group.protocol=consumer``
member, then each of those is replaced by a classic member again (a rollback), while Kafka's
own VerifiableProducer writes a steady 200 records/s through the proxy into a 12-partition
topic. The members are Kafka's VerifiableConsumer, committing synchronously after every batch
(its default), with their offsets committed through the proxy:

* classic members: the 3.9.2 tools (the client the deployment starts from), once with the
  RangeAssignor (eager rebalancing, the default of the tool and of the Java client) and once
  with the CooperativeStickyAssignor (incremental rebalancing);
* consumer-protocol members: the 4.x tools (4.3.1 client; KIP-848 is GA there). The 3.9 tool
  has ``--group-protocol consumer`` too, but that client's KIP-848 support is a preview, and
  a real rollout upgrades the client to turn it on.

The test then checks, from the tools' own JSON events (every event carries the wall-clock
time of the JVM that printed it; all run on one machine):

* no loss: every record the producer saw acknowledged was consumed by some member, counting
  the members stopped along the way;
* exclusive ownership: no partition was ever owned by two members at once (ownership runs
  from a member's ``partitions_assigned`` callback to its ``partitions_revoked`` one);
* duplicates only where at-least-once allows them: a record consumed more than once was, every
  time but the last, consumed in a batch whose synchronous commit failed (or never happened
  because the member stopped), and such batches only occur around membership changes;
* commits keep working: the last successful commits reach the end of every partition;
* the engine serves the group throughout: 4 classic members, then 4 consumer-protocol members,
  then 4 classic members again (ConsumerGroupDescribe through the proxy).

Each change waits for the group to be at rest again (every member owning 2 of the 12
partitions, the target) before the next. A broker-free test runs the same accounting on
made-up event streams, so that its checks are known to catch what they look for.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.test_classic_translation import CLASSIC, CONSUMER, FLAGS, member_types
from tests.testbed.broker import KafkaBroker
from tests.testbed.tools import VerifiableConsumer, VerifiableProducer

PARTITIONS = 12
MEMBERS = 4
THROUGHPUT = 200
"""Records per second, for the whole test."""
KEYS = 1000
SESSION_MS = 6000
CLASSIC_CONFIG = {"heartbeat.interval.ms": "1000", "max.poll.interval.ms": "30000"}
CLASSIC_LINE = "3.9"
CONSUMER_LINE = "4.4"
SETTLE_S = 60.0
"""Bound for the group to settle after one membership change (a hang fails, not a timing)."""
DRAIN_S = 60.0
MARGIN_MS = 3000
"""Slack around a membership change's window for commits that were in flight across its ends."""

Record = tuple[int, int]  # partition, offset


# ------------------------------------------------------------------------------------------
# Members and what their event streams say


@dataclass
class Instance:
    """One VerifiableConsumer process, labelled by the role it plays in the migration."""

    label: str
    tool: VerifiableConsumer

    def owned(self) -> set[int]:
        with self.tool._cond:
            return {p for _, p in self.tool.assignment}

    def events(self) -> list[dict[str, Any]]:
        with self.tool._cond:
            return list(self.tool.events)


@dataclass(frozen=True)
class Batch:
    """One ``records_consumed`` event and the fate of the commit that followed it."""

    instance: str
    ts: int
    ranges: tuple[tuple[int, int, int], ...]  # partition, first offset, last offset
    committed: bool

    def records(self) -> Iterator[Record]:
        for p, lo, hi in self.ranges:
            for o in range(lo, hi + 1):
                yield p, o

    @property
    def size(self) -> int:
        return sum(hi - lo + 1 for _, lo, hi in self.ranges)


def batches(label: str, events: list[dict[str, Any]]) -> list[Batch]:
    """The consumed batches of one instance; VerifiableConsumer commits each one synchronously
    right after printing it, and prints the commit's outcome (``offsets_committed``)."""
    out: list[Batch] = []
    pending: dict[str, Any] | None = None

    def close(event: dict[str, Any], committed: bool) -> None:
        ranges = tuple((int(p["partition"]), int(p["minOffset"]), int(p["maxOffset"]))
                       for p in event.get("partitions", []))
        if ranges:
            out.append(Batch(label, int(event["timestamp"]), ranges, committed))

    for event in events:
        name = event.get("name")
        if name == "records_consumed":
            if pending is not None:  # no commit outcome in between: not committed
                close(pending, False)
            pending = event
        elif name == "offsets_committed" and pending is not None:
            close(pending, bool(event.get("success")))
            pending = None
    if pending is not None:
        close(pending, False)
    return out


def ownership(events: list[dict[str, Any]], end_ms: int) -> dict[int, list[tuple[int, int]]]:
    """Partition -> [(from, to)] in ms: from ``partitions_assigned`` to ``partitions_revoked``
    (lost partitions are reported as revoked too); still owned at the end: up to ``end_ms``."""
    since: dict[int, int] = {}
    spans: dict[int, list[tuple[int, int]]] = {}
    last = end_ms
    for event in events:
        name = event.get("name")
        ts = int(event.get("timestamp", 0))
        parts = [int(p["partition"]) for p in event.get("partitions", [])]
        if name == "partitions_assigned":
            for p in parts:
                since.setdefault(p, ts)
        elif name == "partitions_revoked":
            for p in parts:
                if p in since:
                    spans.setdefault(p, []).append((since.pop(p), ts))
        elif name == "shutdown_complete":
            last = ts
    for p, start in since.items():
        spans.setdefault(p, []).append((start, last))
    return spans


def consumptions_of(all_batches: list[Batch]) -> dict[Record, list[Batch]]:
    """Record -> every batch that consumed it, across all members."""
    out: dict[Record, list[Batch]] = {}
    for b in all_batches:
        for r in b.records():
            out.setdefault(r, []).append(b)
    return out


def double_ownership(spans: dict[str, dict[int, list[tuple[int, int]]]]
                     ) -> list[tuple[tuple[int, int, int, str], tuple[int, int, int, str]]]:
    """Pairs of ownership spans (partition, from, to, member) of one partition that overlap;
    ``spans``: member -> :func:`ownership`. Touching ends (same ms) do not count."""
    flat = sorted((p, start, stop, member) for member, by_partition in spans.items()
                  for p, owned in by_partition.items() for start, stop in owned)
    # sorted by start, any overlap shows up between neighbours
    return [(a, b) for a, b in itertools.pairwise(flat) if a[0] == b[0] and b[1] < a[2]]


def redelivered_after_commit(consumptions: dict[Record, list[Batch]]) -> list[str]:
    """Records consumed again after a consumption of theirs was committed."""
    broken: list[str] = []
    for (p, o), cs in sorted(consumptions.items()):
        if len(cs) < 2:
            continue
        latest = max(b.ts for b in cs)
        for b in cs:
            if b.committed and b.ts < latest:
                broken.append(f"p{p}@{o}: committed by {b.instance} at {b.ts}, consumed again "
                              f"by {[(c.instance, c.ts) for c in cs if c.ts > b.ts]}")
    return broken


def now_ms() -> int:
    return int(time.time() * 1000)


# ------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def proxy(kafka39: KafkaBroker, start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(kafka39, *FLAGS)


@pytest.fixture
def instances(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[Instance]]:
    """Every member started by the test; stopped at the end, and on failure their stderr and
    JSON events are kept in ``test-logs/<test id>/members/``."""
    started: list[Instance] = []
    yield started
    for inst in started:
        inst.tool.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", request.node.nodeid)[-150:]
        dest = request.config.rootpath / "test-logs" / safe / "members"
        dest.mkdir(parents=True, exist_ok=True)
        for inst in started:
            (dest / f"{inst.label}.events.jsonl").write_text(
                "".join(json.dumps(e) + "\n" for e in inst.events()))
            if inst.tool.stderr_file.exists():
                shutil.copy(inst.tool.stderr_file, dest / f"{inst.label}.stderr")


# ------------------------------------------------------------------------------------------
# The test


@pytest.mark.broker
@pytest.mark.parametrize("classic_assignor", [
    pytest.param("range", marks=pytest.mark.slow), "cooperative-sticky"],
    ids=["eager", "cooperative"])
def test_rolling_migration_to_consumer_protocol_and_back_loses_nothing(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        instances: list[Instance], tmp_path: Path, classic_assignor: str) -> None:
    name = topic(kafka39, partitions=PARTITIONS)
    group = f"rolling-{uuid.uuid4().hex[:8]}"
    windows: list[tuple[int, int]] = []  # (from, to) ms of each membership change
    current: list[Instance] = []
    counter = Counter[str]()

    def start_member(protocol: str) -> Instance:
        counter[protocol] += 1
        label = f"{protocol}-{counter[protocol]}"
        if protocol == "classic":
            tool = VerifiableConsumer(CLASSIC_LINE, proxy.bootstrap, name, group,
                                      assignment_strategy=classic_assignor,
                                      session_timeout_ms=SESSION_MS, config=CLASSIC_CONFIG,
                                      workdir=tmp_path / label)
        else:
            tool = VerifiableConsumer(CONSUMER_LINE, proxy.bootstrap, name, group,
                                      group_protocol="consumer", workdir=tmp_path / label)
        inst = Instance(label, tool)
        instances.append(inst)
        tool.start()
        return inst

    def describe_current() -> str:
        return "; ".join(f"{m.label}: {sorted(m.owned())}" for m in current)

    def settle(what: str) -> None:
        """Wait until the 4 current members own 3 partitions each, every partition once: the
        engine's (uniform) target for 12 partitions and 4 members, so the group is at rest."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            owned = [m.owned() for m in current]
            union = set().union(*owned)
            if all(len(o) == PARTITIONS // MEMBERS for o in owned) and \
                    len(union) == PARTITIONS:
                return
            for m in current:
                if not m.tool.running:
                    raise AssertionError(f"{m.label} exited while waiting for {what}:\n"
                                         f"{m.tool.stderr_tail()}")
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {m.label}\n{m.tool.stderr_tail(10)}" for m in current)
                raise AssertionError(f"gave up after {SETTLE_S}s waiting for {what}; "
                                     f"owned: {describe_current()}\n{tails}")
            time.sleep(0.1)

    def replace(index: int, protocol: str) -> None:
        old = current[index]
        began = now_ms()
        old.tool.stop()
        assert old.tool.events_named("shutdown_complete"), (
            f"{old.label} did not shut down cleanly:\n{old.tool.stderr_tail()}")
        current[index] = start_member(protocol)
        settle(f"{current[index].label} to replace {old.label}")
        windows.append((began, now_ms()))

    # keyed records, so that every partition gets some all the time (unkeyed, the sticky
    # partitioner fills one partition for a batch.size worth of records before moving on)
    producer = VerifiableProducer(CLASSIC_LINE, proxy.bootstrap, name, throughput=THROUGHPUT,
                                  repeating_keys=KEYS, workdir=tmp_path / "producer")
    started = time.monotonic()
    try:
        producer.start()
        producer.wait_acked(1, timeout=60)

        # 4 classic members form the group, served by the engine
        began = now_ms()
        current.extend(start_member("classic") for _ in range(MEMBERS))
        settle(f"{MEMBERS} classic members to share the partitions")
        windows.append((began, now_ms()))
        assert member_types(proxy.bootstrap, group) == [CLASSIC] * MEMBERS

        # upgrade, one member at a time, then roll back the same way
        for i in range(MEMBERS):
            replace(i, "consumer")
        assert member_types(proxy.bootstrap, group) == [CONSUMER] * MEMBERS
        for i in range(MEMBERS):
            replace(i, "classic")
        assert member_types(proxy.bootstrap, group) == [CLASSIC] * MEMBERS

        # Keep producing until every partition has a successful commit made after the last
        # change: a commit that failed in that change's rebalance is not retried by the
        # consumer (at-least-once allows it), and would otherwise stay the last one.
        settled_at = windows[-1][1]

        def committed_since() -> set[int]:
            done: set[int] = set()
            for inst in current:
                for event in inst.events():
                    if (event.get("name") == "offsets_committed" and event.get("success")
                            and int(event.get("timestamp", 0)) > settled_at):
                        done.update(int(o["partition"]) for o in event.get("offsets", []))
            return done

        deadline = time.monotonic() + SETTLE_S
        while committed_since() != set(range(PARTITIONS)):
            if time.monotonic() > deadline:
                raise AssertionError(f"no commit since the last change for partitions "
                                     f"{sorted(set(range(PARTITIONS)) - committed_since())}")
            time.sleep(0.2)
        producer.stop()
        assert producer.events_named("shutdown_complete"), producer.stderr_tail()
    finally:
        producer.stop()
    assert not producer.errors, f"producer send errors: {producer.errors[:3]}"
    acked = {(p, o) for _, p, o, _ in producer.acked}
    assert len(acked) == len(producer.acked), "the producer reported an offset twice"
    ends = {p: max(o for q, o in acked if q == p) + 1 for p in {p for p, _ in acked}}
    assert len(ends) == PARTITIONS, f"records reached only partitions {sorted(ends)}"

    # the current members drain the topic and commit its end
    def last_commits() -> dict[int, int]:
        done: dict[int, int] = {}
        for inst in instances:
            for event in inst.events():
                if event.get("name") == "offsets_committed" and event.get("success"):
                    for o in event.get("offsets", []):
                        p = int(o["partition"])
                        done[p] = max(done.get(p, 0), int(o["offset"]))
        return done

    deadline = time.monotonic() + DRAIN_S
    while last_commits() != ends:
        if time.monotonic() > deadline:
            raise AssertionError(f"commits stopped short of the end of the partitions: "
                                 f"ends {ends}, committed {last_commits()}; "
                                 f"owned: {describe_current()}")
        time.sleep(0.2)
    migrated_s = time.monotonic() - started

    teardown = now_ms()
    for m in current:
        m.tool.stop()
    windows.append((teardown, now_ms() + 1))
    end_ms = now_ms()

    # ---- accounting, from the tools' own events -------------------------------------------
    all_batches = [b for inst in instances for b in batches(inst.label, inst.events())]
    consumptions = consumptions_of(all_batches)

    # no loss: every acknowledged record was consumed
    missing = sorted(acked - consumptions.keys())
    assert not missing, (f"{len(missing)} of {len(acked)} acknowledged records were never "
                         f"consumed, e.g. {missing[:10]}")

    # exclusive ownership, from each member's own rebalance callbacks
    overlaps = double_ownership({inst.label: ownership(inst.events(), end_ms)
                                 for inst in instances})
    assert not overlaps, f"partitions owned by two members at once: {overlaps[:5]}"

    # Duplicates. At-least-once lets a record be delivered again only when its consumption
    # was not committed: VerifiableConsumer commits every batch synchronously before it polls
    # again, and rebalance callbacks (revocation included) run inside poll, so a successful
    # commit precedes any hand-over of the partition, and its next owner resumes after it.
    # The bound is therefore exact rather than a guess: every consumption of a record but the
    # last one must be in a batch whose commit failed (e.g. REBALANCE_IN_PROGRESS, a stale
    # member epoch) or never ran (the member stopped), i.e. the records in flight across a
    # rebalance. And those uncommitted batches may only occur around a membership change,
    # not while the group is at rest: otherwise the bound would allow anything.
    duplicates = sum(len(cs) - 1 for cs in consumptions.values())
    uncommitted = [b for b in all_batches if not b.committed]
    in_flight = sum(b.size for b in uncommitted)
    commit_errors = Counter(str(e.get("error")) for inst in instances for e in inst.events()
                            if e.get("name") == "offsets_committed" and not e.get("success"))
    summary = (f"{len(acked)} records acknowledged, {sum(b.size for b in all_batches)} "
               f"consumed by {len(instances)} members, {duplicates} duplicates, "
               f"{len(uncommitted)} uncommitted batches ({in_flight} records), "
               f"{len(windows)} membership changes, {migrated_s:.0f}s; "
               f"failed commits: {dict(commit_errors)}")
    print(summary)

    broken = redelivered_after_commit(consumptions)
    assert not broken, (f"records consumed again after their consumption was committed "
                        f"({len(broken)}): {broken[:5]}; {summary}")
    assert duplicates <= in_flight, summary  # implied by the rule above; stated as the bound

    def around_a_change(ts: int) -> bool:
        return any(lo - MARGIN_MS <= ts <= hi + MARGIN_MS for lo, hi in windows)

    at_rest = [(b.instance, b.ts, b.size) for b in uncommitted if not around_a_change(b.ts)]
    assert not at_rest, (f"commits failed while the group was at rest: {at_rest[:5]}; "
                         f"changes: {windows}; {summary}")


# ------------------------------------------------------------------------------------------
# The accounting itself, on made-up event streams: it must be able to fail


def test_accounting_flags_double_ownership_and_redelivery_after_commit() -> None:
    def part(p: int) -> dict[str, Any]:
        return {"topic": "t", "partition": p}

    def consumed(ts: int, p: int, lo: int, hi: int) -> dict[str, Any]:
        return {"timestamp": ts, "name": "records_consumed", "count": hi - lo + 1,
                "partitions": [dict(part(p), count=hi - lo + 1, minOffset=lo, maxOffset=hi)]}

    def committed(ts: int, success: bool) -> dict[str, Any]:
        return {"timestamp": ts, "name": "offsets_committed", "success": success}

    a = [{"timestamp": 1, "name": "partitions_assigned", "partitions": [part(0)]},
         consumed(2, 0, 0, 4), committed(3, True),
         consumed(4, 0, 5, 9), committed(5, False),
         consumed(6, 0, 10, 10),  # stopped before the commit
         {"timestamp": 8, "name": "partitions_revoked", "partitions": [part(0)]},
         {"timestamp": 9, "name": "shutdown_complete"}]
    a_batches = batches("a", a)
    assert [(b.ts, b.size, b.committed) for b in a_batches] == [
        (2, 5, True), (4, 5, False), (6, 1, False)]
    assert ownership(a, 100) == {0: [(1, 8)]}

    # b takes over where a's last commit left off: the uncommitted records come again
    b = [{"timestamp": 8, "name": "partitions_assigned", "partitions": [part(0)]},
         consumed(10, 0, 5, 12), committed(11, True)]
    clean = consumptions_of(a_batches + batches("b", b))
    assert sum(len(cs) - 1 for cs in clean.values()) == 6
    assert not redelivered_after_commit(clean)
    assert not double_ownership({"a": ownership(a, 100), "b": ownership(b, 100)})

    # c owns the partition before a let go of it, and re-reads what a had committed
    c = [{"timestamp": 7, "name": "partitions_assigned", "partitions": [part(0)]},
         consumed(10, 0, 3, 12), committed(11, True)]
    assert double_ownership({"a": ownership(a, 100), "c": ownership(c, 100)})
    broken = redelivered_after_commit(consumptions_of(a_batches + batches("c", c)))
    assert [line.split(":")[0] for line in broken] == ["p0@3", "p0@4"]
