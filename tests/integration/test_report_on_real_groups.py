"""The journal of real groups and the report computed from it, against the clients' own view.

groupgate in front of Kafka 3.9 with the journal on (heartbeat 1 s, session 6 s) coordinates a
group of real confluent-kafka members while a producer writes to its topic. The members report
their rebalance callbacks (:mod:`tests.benchmarks.rebalance.members`); after the group first
settles, the test plays what a fleet goes through, waiting for the group to settle between
steps:

* a rolling migration from the classic protocol (``cooperative-sticky``) to KIP-848: a
  member is closed, and once the others have its partitions it starts again with
  ``group.protocol=consumer`` (the default run migrates two of the three members; with
  ``--run-slow``, all three one after the other);
* a crash: a member's process is SIGKILLed; its sidecar sees every connection of the process
  close (pod-local liveness, on by default) and the member is fenced a grace later, long
  before its session would end;
* a stuck member: one member blocks 8 s in its next callback while a new member joins.

``groupgate report`` then reads the journal topic through Spark's Kafka source for the window
from the first settled moment to the end, and its tables are held to the clients' timeline:

* as many rebalances as the clients saw episodes of change (a member's partitions moved, from
  the first callback to the last), each starting within one heartbeat interval of its episode
  (the crash's a liveness grace after the SIGKILL);
* one downtime row per partition the clients saw given up (a revocation callback, a close, a
  crash) and given out again, with the same partition and the same two moments within one
  heartbeat interval (a crashed member's partitions from the crash plus the grace), and the
  crashed member's life ends fenced pod-local.

The server's and the clients' moments differ by up to a heartbeat interval: a member hears of
an assignment at its next heartbeat, and the coordinator hears of a revocation at the member's
next heartbeat after its callback.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.report.compute import POD_LOCAL_END
from proxy.report.job import Options, Source, run_report
from tests.benchmarks.rebalance import scenarios, timeline
from tests.integration.conftest import SparkSessions, StartProxy
from tests.testbed.broker import KafkaBroker

HEARTBEAT_S = 1.0
SESSION_S = 6.0
CRASH_NOTICED_S = 0.4
"""A crashed member is fenced this long after its process died: ``liveness-grace-ms`` (400),
the time its sidecar waits for the client to come back once all its connections closed."""
STUCK_S = 8.0
PARTITIONS = 12
CLASSIC = {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky",
           "session.timeout.ms": int(SESSION_S * 1000),
           "heartbeat.interval.ms": int(HEARTBEAT_S * 1000)}
CONSUMER = {"group.protocol": "consumer", "partition.assignment.strategy": None,
            "session.timeout.ms": None, "heartbeat.interval.ms": None}


@dataclass(frozen=True)
class Episode:
    """A stretch of the clients' timeline in which partitions moved."""

    start: float
    end: float
    cause: str


@dataclass(frozen=True)
class Downtime:
    """A partition given up (``start``) until a member was given it again (``end``)."""

    partition: int
    start: float
    end: float
    cause: str


def client_view(events: list[timeline.Event], since: float
                ) -> tuple[list[Episode], list[Downtime]]:
    """Episodes and downtimes that start after ``since``, from the members' callbacks.

    An episode runs while the group is not converged as the clients see it (a partition
    without exactly one owner, a member inside a callback, a live member with nothing);
    episodes less than two heartbeat intervals apart are one (members hear of their part at
    their own next heartbeats). A crashed member gives its partitions up when the proxy fences
    it: its downtimes start at ``crash + CRASH_NOTICED_S``."""
    state = timeline.State(PARTITIONS)
    owner: dict[int, str] = {}
    down_since: dict[int, tuple[float, str]] = {}
    downtimes: list[Downtime] = []
    episodes: list[Episode] = []
    open_at: tuple[float, str] | None = None
    for ev in sorted(events, key=lambda e: e.t):
        state.apply(ev)
        if ev.kind == "assign":
            for p in ev.partitions:
                owner[p] = ev.member
                started = down_since.pop(p, None)
                if started is not None and started[0] >= since:
                    downtimes.append(Downtime(p, started[0], ev.t, started[1]))
        elif ev.kind in ("revoke", "lost", "leave", "crash"):
            t = ev.t + CRASH_NOTICED_S if ev.kind == "crash" else ev.t
            given_up = [p for p, m in owner.items() if m == ev.member
                        and (ev.kind in ("leave", "crash") or p in ev.partitions)]
            for p in given_up:
                del owner[p]
                down_since.setdefault(p, (t, ev.kind))
        converged = state.converged()
        if not converged and open_at is None:
            open_at = (ev.t, ev.kind)
        elif converged and open_at is not None:
            start, cause = open_at
            open_at = None
            if start < since:
                continue
            if episodes and start - episodes[-1].end <= 2 * HEARTBEAT_S:
                episodes[-1] = Episode(episodes[-1].start, ev.t, episodes[-1].cause)
            else:
                episodes.append(Episode(start, ev.t, cause))
    assert open_at is None, f"the group never settled after {open_at}"
    return episodes, downtimes


@pytest.fixture(scope="module")
def spark(spark_sessions: SparkSessions) -> Any:
    """The Spark session the report modules share."""
    return spark_sessions.shared()


class Fleet:
    """The members (each in a process of its own) and the timeline they report."""

    def __init__(self, bootstrap: str, topic: str, group: str, workdir: Path) -> None:
        self.rec = scenarios.Recorder()
        base = {"bootstrap.servers": bootstrap, "group.id": group,
                "auto.offset.reset": "earliest", "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000, "log_level": 3}
        self.names = ["m0", "m1", "m2", "m3"]
        self.pool = scenarios.ConfluentPool(self.rec, topic, base, workdir,
                                            [[n] for n in self.names])
        self.live: set[str] = set()

    def start(self, member: str, config: dict[str, Any]) -> None:
        self.pool.start(member, config)
        self.live.add(member)

    def stop(self, member: str) -> None:
        self.pool.stop(member)
        self.rec.wait(lambda: member in self.rec.closed, 60.0, f"{member} to close")
        self.rec.closed.discard(member)
        self.live.discard(member)

    def crash(self, member: str) -> None:
        t = time.monotonic()
        self.pool.crash(member)
        self.rec.add_event(timeline.Event(t, member, "crash"))
        self.live.discard(member)

    def settle(self, what: str) -> None:
        """Wait until the group has been converged, with the live members, for two heartbeat
        intervals."""
        settings = scenarios.Settings(members=1, scenario="rolling", protocol="consumer",
                                      partitions_per_member=PARTITIONS)
        scenarios._wait_converged(self.rec, settings, set(self.live), 2 * HEARTBEAT_S, 60.0,
                                  what)

    def close(self) -> None:
        self.pool.close()


@pytest.mark.broker
@pytest.mark.parametrize("migrated", [
    pytest.param(("m0", "m1"), id="two-members-migrated"),
    pytest.param(("m0", "m1", "m2"), id="every-member-migrated", marks=pytest.mark.slow)])
def test_report_agrees_with_the_clients_timeline(
        kafka39: KafkaBroker, start_proxy: StartProxy, spark: Any, tmp_path: Path,
        migrated: tuple[str, ...]) -> None:
    run = uuid.uuid4().hex[:8]
    topic, group, journal = f"orders-{run}", f"migrating-{run}", f"journal-{run}"
    kafka39.create_topic(topic, PARTITIONS, 1)
    proxy = start_proxy(
        kafka39, "--group-heartbeat-interval-ms", str(int(HEARTBEAT_S * 1000)),
        "--group-session-timeout-ms", str(int(SESSION_S * 1000)),
        "--journal-topic", journal, "--journal-partitions", "1",
        "--journal-replication-factor", "1", "--journal-snapshot-interval-ms", "10000")
    clock = time.time() - time.monotonic()  # members stamp with CLOCK_MONOTONIC
    fleet = Fleet(proxy.bootstrap, topic, group, tmp_path)
    producer = scenarios._Proc(
        [sys.executable, "-m", "tests.benchmarks.rebalance.members", "producer",
         "--bootstrap", kafka39.bootstrap, "--topic", topic, "--partitions", str(PARTITIONS),
         "--rate-per-partition", "5"], fleet.rec, tmp_path / "producer.log")
    try:
        for name in ("m0", "m1", "m2"):
            fleet.start(name, CLASSIC)
        fleet.settle("the classic group")
        since = time.monotonic()
        for name in migrated:  # the rolling migration
            fleet.stop(name)
            fleet.settle(f"the others after {name} closed")
            fleet.start(name, CONSUMER)
            fleet.settle(f"{name} back on the consumer protocol")
        fleet.crash("m0")
        fleet.settle("the group after the crash")
        fleet.pool.slow("m1", STUCK_S)
        fleet.start("m3", CONSUMER)
        fleet.settle("the group around the stuck member")
        end = time.monotonic()
        time.sleep(HEARTBEAT_S)
    finally:
        fleet.close()
        producer.quit()
    events = fleet.rec.snapshot()
    (tmp_path / "timeline.json").write_text(json.dumps(
        [[e.t + clock, e.member, e.kind, list(e.partitions)] for e in events]))
    assert not [e for e in fleet.rec.errors if "Fatal" in e], fleet.rec.errors
    assert timeline.overlaps(events) == []
    m1 = [e for e in sorted(events) if e.member == "m1" and e.kind in ("stall", "resume")]
    assert any(a.kind == "stall" and b.kind == "resume" and b.t - a.t >= STUCK_S - 0.5
               for a, b in itertools.pairwise(m1)), "m1 was never stuck in a callback"

    episodes, downtimes = client_view(events, since)
    # a close and a join per member migrated, a crash, a join around a stuck member
    assert len(episodes) == 2 * len(migrated) + 2, episodes
    assert [e.cause for e in episodes][2 * len(migrated)] == "crash"

    out = tmp_path / "report"
    summary = run_report(spark, Options(Source(kafka_bootstrap=kafka39.bootstrap,
                                               topic=journal), out,
                                        start_ms=int((since + clock) * 1000),
                                        end_ms=int((end + clock) * 1000) + 1,
                                        groups=(group,)))
    rebalances = sorted((r["start_ms"] / 1000 - clock, r["end_ms"], r["outcome"])
                        for r in spark.read.parquet(str(out / "rebalances")).collect())
    (tmp_path / "rebalances.json").write_text(json.dumps(rebalances))
    assert summary["rebalances"] == len(episodes) == len(rebalances), (rebalances, episodes)
    starts = []
    for (start, _end, outcome), episode in zip(rebalances, episodes, strict=True):
        assert outcome == "stable", rebalances
        expected = episode.start + (CRASH_NOTICED_S if episode.cause == "crash" else 0.0)
        starts.append(start - expected)
        assert abs(start - expected) <= HEARTBEAT_S, (start, episode)

    rows = [r.asDict() for r in spark.read.parquet(str(out / "partition_downtime")).collect()]
    reported = sorted((r["partition"], r["revoked_ms"] / 1000 - clock,
                       r["assigned_ms"] / 1000 - clock) for r in rows if r["topic"] == topic)
    (tmp_path / "downtime.json").write_text(json.dumps(reported))
    assert all(r["outcome"] == "assigned" for r in rows), rows
    seen = sorted((d.partition, d.start, d.end, d.cause) for d in downtimes)
    assert len(reported) == len(seen), (reported, seen)
    lengths = []
    for (p, start, end_t), (q, c_start, c_end, cause) in zip(reported, seen, strict=True):
        assert p == q, (reported, seen)
        assert abs(start - c_start) <= HEARTBEAT_S, (p, start, c_start, cause)
        assert abs(end_t - c_end) <= HEARTBEAT_S, (p, end_t, c_end, cause)
        lengths.append((end_t - start) - (c_end - c_start))
    assert summary["downtimes"] == len(seen)
    ended = [r["end_reason"] for r in spark.read.parquet(str(out / "members")).collect()
             if r["group"] == group]
    assert ended.count(POD_LOCAL_END) == 1, ended  # the crash, as its sidecar saw it
    agreement = {"rebalances": len(rebalances),
                 "rebalance_start_s_max_difference": round(max(map(abs, starts)), 3),
                 "downtimes": len(seen),
                 "downtime_s_max_difference": round(max(map(abs, lengths)), 3),
                 "downtime_s_longest": round(max(e - s for _, s, e in reported), 2)}
    (tmp_path / "agreement.json").write_text(json.dumps(agreement))
    print("report against the clients' timeline:", agreement)
