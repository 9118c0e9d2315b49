"""``groupgate report`` on a small journal written by hand, whose answers are worked out below
event by event: rebalance count, durations, members disturbed, partition downtime, member
lives, migration series; then the same journal read from a real broker's topic through
Spark's Kafka connector, the command end to end, and its HTML opened in headless Chromium.

The journal (T = 0 is 1_700_000_000_000 ms; times in seconds):

group g1, topic t with partitions 0-3
  0   created; A joins (consumer, librdkafka 2.16.1); bump 1; A gets t0-3; Stable
      -> rebalance 1: 0 s, A disturbed
  10  B joins (classic, apache-kafka-java 3.9.1); bump 2; Reconciling
  12  A told to revoke t2, t3
  13  A releases t2, t3
  15  B gets t2, t3; Stable
      -> rebalance 2: 10 s to 15 s = 5000 ms, A and B disturbed, A revoked, 2 partitions
      -> downtime t2, t3: 12 s to 15 s = 3000 ms each
  20  snapshot: A holds t0, t1; B holds t2, t3
  30  bump 3; B fenced (pod-local: its sidecar saw its process go) with t2, t3; Assigning
  31  A gets t2, t3; Stable
      -> rebalance 3: 30 s to 31 s = 1000 ms, B (revoked) and A (assigned) disturbed
      -> downtime t2, t3: 30 s to 31 s = 1000 ms each
  50  bump 4; A leaves with t0-3; Empty -> emptied, not a rebalance
      -> t0-3 revoked at 50 s, never assigned again in this life: "group ended"
  60  expired

group g2, topic u with partitions 0-1
  0   created; S joins (consumer, instance i1); bump 1; S gets u0, u1; Stable
      -> rebalance 1: 0 s
  20  S leaves for a while (static): u0, u1 revoked; Reconciling
  25  S2 replaces S with u0, u1; Stable (no bump: no rebalance)
      -> downtime u0, u1: 20 s to 25 s = 5000 ms each
  40  T joins (classic, no software known); bump 2; Reconciling; S2 told to revoke u1
      -> rebalance 2 still open at the end; u1 revoked at 40 s: "open"

group connect-workers: passed through at 5 s (protocol type 'connect')

So: 5 rebalances (4 finished: 0, 5000, 1000, 0 ms; 1 open); 6 downtimes that ended
(3000, 3000, 1000, 1000, 5000, 5000 ms), 4 "group ended", 1 open. At the end (61 s... the
window closes 1 ms after the last event, 60 s) g2 has S2 (consumer) and T (classic).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from proxy.journal.schema import Event, EventType, check
from proxy.report.job import Options, Source, run_report
from proxy.report.session import ReportError
from tests.integration.conftest import SparkSessions
from tests.testbed.broker import KafkaBroker, KafkaCluster

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000
S = 1000
E = EventType


def journal() -> list[Event]:
    seq = 0
    out: list[Event] = []

    def ev(t: float, group: str, event_type: EventType, **fields: Any) -> None:
        nonlocal seq
        seq += 1
        out.append(Event(event_type, group, T0 + int(t * S), "p1:9092", seq, fields))

    def state(t: float, group: str, name: str, epoch: int, target: int, n: int) -> None:
        ev(t, group, E.GROUP_STATE, state=name, group_epoch=epoch, assignment_epoch=target,
           member_count=n)

    def moved(t: float, group: str, member: str, epoch: int, member_state: str,
              **partitions: dict[str, list[int]]) -> None:
        ev(t, group, E.ASSIGNMENT, member=member, member_epoch=epoch, state=member_state,
           **partitions)

    java = {"software_name": "apache-kafka-java", "software_version": "3.9.1"}
    rdk = {"software_name": "librdkafka", "software_version": "2.16.1"}
    # g1
    ev(0, "g1", E.GROUP_CREATED, group_epoch=0, converted=False)
    ev(0, "g1", E.MEMBER_JOINED, member="A", protocol="consumer", assignor="uniform",
       client_id="app", client_host="/10.0.0.1", member_epoch=0, group_epoch=0,
       topics=["t"], **rdk)
    ev(0, "g1", E.EPOCH_BUMPED, group_epoch=1, reason="group created; member joined")
    moved(0, "g1", "A", 1, "stable", assigned={"t": [0, 1, 2, 3]})
    state(0, "g1", "Stable", 1, 1, 1)
    ev(5, "connect-workers", E.GROUP_PASSED_THROUGH, reason="protocol type 'connect'",
       protocol_type="connect")
    ev(10, "g1", E.MEMBER_JOINED, member="B", protocol="classic", assignor="range",
       client_id="legacy", client_host="/10.0.0.2", member_epoch=0, group_epoch=1,
       topics=["t"], **java)
    ev(10, "g1", E.EPOCH_BUMPED, group_epoch=2, reason="member joined")
    ev(10, "g1", E.TARGET_COMPUTED, assignment_epoch=2, assignor="uniform", changed_members=2)
    moved(10, "g1", "B", 2, "unreleased_partitions")
    state(10, "g1", "Reconciling", 2, 2, 2)
    moved(12, "g1", "A", 1, "unrevoked_partitions", revoked={"t": [2, 3]},
          revoking={"t": [2, 3]})
    moved(13, "g1", "A", 2, "stable", released={"t": [2, 3]})
    moved(15, "g1", "B", 2, "stable", assigned={"t": [2, 3]})
    state(15, "g1", "Stable", 2, 2, 2)
    ev(20, "g1", E.GROUP_SNAPSHOT, state="Stable", group_epoch=2, assignment_epoch=2,
       member_count=2, part=1, parts=1, members=[
           {"member": "A", "protocol": "consumer", "member_epoch": 2, "state": "stable",
            "assigned": {"t": [0, 1]}, **rdk},
           {"member": "B", "protocol": "classic", "member_epoch": 2, "state": "stable",
            "assigned": {"t": [2, 3]}, **java}])
    ev(30, "g1", E.EPOCH_BUMPED, group_epoch=3, reason="pod local")
    ev(30, "g1", E.MEMBER_FENCED, member="B", protocol="classic", reason="pod-local",
       member_epoch=2, revoked={"t": [2, 3]}, released={"t": [2, 3]})
    state(30, "g1", "Assigning", 3, 2, 1)
    moved(31, "g1", "A", 3, "stable", assigned={"t": [2, 3]})
    state(31, "g1", "Stable", 3, 3, 1)
    ev(50, "g1", E.EPOCH_BUMPED, group_epoch=4, reason="member left")
    ev(50, "g1", E.MEMBER_LEFT, member="A", protocol="consumer", static=False,
       member_epoch=3, revoked={"t": [0, 1, 2, 3]}, released={"t": [0, 1, 2, 3]})
    state(50, "g1", "Empty", 4, 3, 0)
    ev(60, "g1", E.GROUP_EXPIRED)
    # g2
    ev(0, "g2", E.GROUP_CREATED, group_epoch=0, converted=False)
    ev(0, "g2", E.MEMBER_JOINED, member="S", instance="i1", protocol="consumer",
       member_epoch=0, group_epoch=0, topics=["u"], **rdk)
    ev(0, "g2", E.EPOCH_BUMPED, group_epoch=1, reason="group created; member joined")
    moved(0, "g2", "S", 1, "stable", assigned={"u": [0, 1]})
    state(0, "g2", "Stable", 1, 1, 1)
    ev(20, "g2", E.MEMBER_LEFT, member="S", instance="i1", protocol="consumer", static=True,
       member_epoch=-2, revoked={"u": [0, 1]})
    state(20, "g2", "Reconciling", 1, 1, 1)
    ev(25, "g2", E.MEMBER_REPLACED, member="S2", replaced="S", instance="i1",
       protocol="consumer", replaced_protocol="consumer", member_epoch=0,
       assigned={"u": [0, 1]}, **rdk)
    moved(25, "g2", "S2", 1, "stable")
    state(25, "g2", "Stable", 1, 1, 1)
    ev(40, "g2", E.MEMBER_JOINED, member="T", protocol="classic", member_epoch=0,
       group_epoch=1, topics=["u"])
    ev(40, "g2", E.EPOCH_BUMPED, group_epoch=2, reason="member joined")
    state(40, "g2", "Reconciling", 2, 2, 2)
    moved(40, "g2", "S2", 1, "unrevoked_partitions", revoked={"u": [1]}, revoking={"u": [1]})
    for event in out:
        assert check(event.to_value()) == [], event
    return out


def write_jsonl(path: Path, events: list[Event]) -> Path:
    path.write_text("".join(event.encode().decode() + "\n" for event in events))
    return path


@pytest.fixture(scope="module")
def spark(spark_sessions: SparkSessions) -> Any:
    """The Spark session the report modules share (UTC)."""
    return spark_sessions.shared()


@pytest.fixture(scope="module")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    base = tmp_path_factory.mktemp("report")
    events = journal()
    # Every event twice (a writer's retry): the report reads each once.
    source = write_jsonl(base / "journal.jsonl", events + events[:10])
    out = base / "out"
    summary = run_report(spark, Options(Source(paths=(str(source),)), out))
    return out, summary


def rows(spark: Any, out: Path, table: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.parquet(str(out / table)).collect()]


def test_rebalances(spark: Any, report: tuple[Path, dict[str, Any]]) -> None:
    out, summary = report
    got = sorted((r["group"], r["start_ms"] - T0, r["duration_ms"], r["outcome"], r["bumps"],
                  r["members_disturbed"], r["members_revoked"], r["partitions_revoked"],
                  r["partitions_assigned"]) for r in rows(spark, out, "rebalances"))
    assert got == [
        ("g1", 0, 0, "stable", 1, 1, 0, 0, 4),
        ("g1", 10_000, 5000, "stable", 1, 2, 1, 2, 2),
        ("g1", 30_000, 1000, "stable", 1, 2, 1, 2, 2),
        ("g1", 50_000, 0, "emptied", 1, 1, 1, 4, 0),
        ("g2", 0, 0, "stable", 1, 1, 0, 0, 2),
        ("g2", 40_000, None, "open", 1, 1, 1, 1, 0),
    ]
    assert summary["rebalances"] == 5 and summary["rebalances_open"] == 1
    assert summary["rebalance_ms_max"] == 5000
    # Nearest rank of (0, 0, 1000, 5000): p50 the 2nd value, p95 and p99 the 4th.
    assert (summary["rebalance_ms_p50"], summary["rebalance_ms_p95"],
            summary["rebalance_ms_p99"]) == (0, 5000, 5000)
    assert summary["percentiles"] == "exact, nearest rank"


def test_partition_downtime(spark: Any, report: tuple[Path, dict[str, Any]]) -> None:
    out, summary = report
    got = sorted((r["group"], r["topic"], r["partition"], r["revoked_ms"] - T0,
                  r["downtime_ms"], r["outcome"], r["from_member"], r["to_member"])
                 for r in rows(spark, out, "partition_downtime"))
    assert got == [
        ("g1", "t", 0, 50_000, None, "group ended", "A", None),
        ("g1", "t", 1, 50_000, None, "group ended", "A", None),
        ("g1", "t", 2, 12_000, 3000, "assigned", "A", "B"),
        ("g1", "t", 2, 30_000, 1000, "assigned", "B", "A"),
        ("g1", "t", 2, 50_000, None, "group ended", "A", None),
        ("g1", "t", 3, 12_000, 3000, "assigned", "A", "B"),
        ("g1", "t", 3, 30_000, 1000, "assigned", "B", "A"),
        ("g1", "t", 3, 50_000, None, "group ended", "A", None),
        ("g2", "u", 0, 20_000, 5000, "assigned", "S", "S2"),
        ("g2", "u", 1, 20_000, 5000, "assigned", "S", "S2"),
        ("g2", "u", 1, 40_000, None, "open", "S2", None),
    ]
    assert (summary["downtimes"], summary["partitions_open"],
            summary["partitions_group_ended"]) == (6, 1, 4)
    assert summary["downtime_ms_total"] == 18_000 and summary["downtime_ms_max"] == 5000


def test_members_and_migration(spark: Any, report: tuple[Path, dict[str, Any]]) -> None:
    out, summary = report
    lives = sorted((r["group"], r["member"], r["start_ms"] - T0,
                    None if r["end_ms"] is None else r["end_ms"] - T0, r["end_reason"],
                    r["protocol"], r["software"]) for r in rows(spark, out, "members"))
    assert lives == [
        ("g1", "A", 0, 50_000, "left", "consumer", "librdkafka 2.16.1"),
        ("g1", "B", 10_000, 30_000, "fenced (pod-local: its process was gone)", "classic",
         "apache-kafka-java 3.9.1"),
        ("g2", "S", 0, 25_000, "replaced", "consumer", "librdkafka 2.16.1"),
        ("g2", "S2", 25_000, None, None, "consumer", "librdkafka 2.16.1"),
        ("g2", "T", 40_000, None, None, "classic", "unknown"),
    ]
    series = {(r["sample_ms"] - T0, r["dimension"], r["category"]): r["members"]
              for r in rows(spark, out, "migration")}
    step = 501  # the 60,001 ms window in 120 samples
    # At 12 s: A, S (consumer), B (classic). At 30.06 s: B gone; A, S2. At 45.09 s: A, S2, T.
    # At 55.11 s: S2, T.
    for i, consumer, classic in ((24, 2, 1), (60, 2, 0), (90, 2, 1), (110, 1, 1)):
        assert series.get((i * step, "protocol", "consumer"), 0) == consumer, i
        assert series.get((i * step, "protocol", "classic"), 0) == classic, i
    assert series[(24 * step, "software", "apache-kafka-java 3.9.1")] == 1
    assert (summary["classic_members_now"], summary["consumer_members_now"]) == (1, 1)


def test_groups(spark: Any, report: tuple[Path, dict[str, Any]]) -> None:
    out, summary = report
    groups = {r["group"]: r for r in rows(spark, out, "groups")}
    assert set(groups) == {"g1", "g2", "connect-workers"}
    assert (groups["g1"]["rebalances"], groups["g1"]["downtime_ms_total"]) == (3, 8000)
    assert (groups["g2"]["rebalances"], groups["g2"]["rebalances_open"],
            groups["g2"]["downtime_ms_total"], groups["g2"]["partitions_open"]) == (2, 1, 10_000, 1)
    assert groups["connect-workers"]["passed_through"] == "protocol type 'connect'"
    assert not groups["connect-workers"]["coordinated"] and groups["g1"]["coordinated"]
    assert (summary["groups"], summary["groups_coordinated"],
            summary["groups_passed_through"]) == (3, 2, 1)


def test_a_window_that_starts_later(spark: Any, tmp_path: Path) -> None:
    """From 11 s on: rebalance 2 of g1 started before the window and is not counted; the
    look-back still shows who was there, so migration counts are right from the start."""
    source = write_jsonl(tmp_path / "journal.jsonl", journal())
    summary = run_report(spark, Options(Source(paths=(str(source),)), tmp_path / "out",
                                        start_ms=T0 + 11_000, end_ms=T0 + 60_001,
                                        lookback_ms=60_000))
    reb = sorted((r["group"], r["start_ms"] - T0)
                 for r in rows(spark, tmp_path / "out", "rebalances"))
    assert reb == [("g1", 30_000), ("g1", 50_000), ("g2", 40_000)]
    down = sorted((r["group"], r["partition"], r["revoked_ms"] - T0)
                  for r in rows(spark, tmp_path / "out", "partition_downtime"))
    assert ("g1", 2, 12_000) in down and summary["downtimes"] == 6
    first = {(r["dimension"], r["category"]): r["members"]
             for r in rows(spark, tmp_path / "out", "migration")
             if r["sample_ms"] == T0 + 11_000 and r["members"]}
    assert first == {("protocol", "consumer"): 2, ("protocol", "classic"): 1,
                     ("software", "librdkafka 2.16.1"): 2,
                     ("software", "apache-kafka-java 3.9.1"): 1}


def test_percentiles_are_exact(spark: Any) -> None:
    """A group's p50/p95 are the nearest-rank values of all its rebalances and downtimes (the
    ceil(p * n)-th smallest), however many there are: with 20,000 values an approximation
    of relative error 1/1000 could be 20 ranks off."""
    import math
    import random

    from proxy.report import compute

    rng = random.Random(5)
    durations = [int(rng.lognormvariate(8, 1.5)) for _ in range(20_000)]
    downtimes = [int(rng.lognormvariate(7, 2)) for _ in range(20_000)]
    events = spark.createDataFrame([("g", T0, "group_created", None)],
                                   "`group` string, ts long, type string, reason string")
    rebalances = spark.createDataFrame(
        [("g", d, "stable", 1, 0) for d in durations],
        "`group` string, duration_ms long, outcome string, members_disturbed long, "
        "partitions_revoked long")
    downtime = spark.createDataFrame([("g", d, "assigned") for d in downtimes],
                                     "`group` string, downtime_ms long, outcome string")
    lives = spark.createDataFrame(
        [], "`group` string, member string, start_ms long, end_ms long, protocol string, "
            "software string")
    converted = spark.createDataFrame([], "`group` string, outcome string")
    row = compute.groups_table(events, rebalances, downtime, lives,
                               compute.Span(T0, T0 + 1), converted).first()

    def rank(values: list[int], p: float) -> int:
        return sorted(values)[math.ceil(p * len(values)) - 1]

    assert row is not None
    assert (row["rebalance_ms_p50"], row["rebalance_ms_p95"], row["downtime_ms_p95"]) == (
        rank(durations, 0.5), rank(durations, 0.95), rank(downtimes, 0.95))


def online_upgrade() -> list[Event]:
    """Schema-version-2 events after :func:`journal` (times in seconds from T0):

    group g3, converted online by sidecar p2, topic w with partitions 0-1
      100    conversion aborted at generation 4 (a direct member joined meanwhile)
      130    adopted (group_created converted, generation 5): C1 (w0) and C2 (w1) joined,
             classic cooperative-sticky, librdkafka 2.16.1
      130.4  converted: 2 members at generation 5, from cooperative-sticky
             -> conversion of 400 ms (the adoption at 130 s to the conversion)
    group g4 (sidecar p1): conversion aborted at 110 s at generation 2
    """
    rdk = {"software_name": "librdkafka", "software_version": "2.16.1"}
    out: list[Event] = []
    seqs = {"p1:9092": 1000, "p2:9092": 0}

    def ev(t: float, group: str, source: str, event_type: EventType, **fields: Any) -> None:
        seqs[source] += 1
        out.append(Event(event_type, group, T0 + int(t * S), source, seqs[source], fields))

    ev(100, "g3", "p2:9092", E.CONVERSION_ABORTED, group_epoch=4,
       reason="the broker's group changed meanwhile")
    ev(110, "g4", "p1:9092", E.CONVERSION_ABORTED, group_epoch=2,
       reason="forwarded requests of the group are still unanswered")
    ev(130, "g3", "p2:9092", E.GROUP_CREATED, group_epoch=5, converted=True)
    for member, partition in (("C1", 0), ("C2", 1)):
        ev(130, "g3", "p2:9092", E.MEMBER_JOINED, member=member, protocol="classic",
           assignor="cooperative-sticky", member_epoch=5, group_epoch=5, topics=["w"],
           assigned={"w": [partition]}, **rdk)
    ev(130.4, "g3", "p2:9092", E.GROUP_CONVERTED, group_epoch=5,
       assignor="cooperative-sticky", member_count=2, member_ids=["C1", "C2"])
    for event in out:
        assert check(event.to_value()) == [], event
    assert {e.to_value()["v"] for e in out if e.type in (E.GROUP_CONVERTED,
                                                         E.CONVERSION_ABORTED)} == {2}
    return out


UNKNOWN_VERSIONS = [
    {"v": 3, "type": "group_rebalanced", "ts": T0 + 70 * S, "group": "g1", "source": "p9:9092",
     "seq": 1, "group_epoch": 9},
    {"v": 3, "type": "member_joined", "ts": T0 + 71 * S, "group": "g1", "source": "p9:9092",
     "seq": 2, "member": "Z", "protocol": "consumer", "topics": ["t"]},
    {"v": 3, "type": "group_expired", "ts": T0 + 72 * S, "group": "g1", "source": "p9:9092",
     "seq": 3},
    {"type": "member_left", "ts": T0 + 73 * S, "group": "g2", "source": "p9:9092", "seq": 4,
     "member": "S2"},
]
"""Events of a schema version the report does not read (a later writer's; one without a
version): skipped and counted, even where their type is one the report knows."""


def write_mixed(path: Path) -> Path:
    """:func:`journal` and :func:`online_upgrade` (the conversion written twice, as a retried
    write would) with :data:`UNKNOWN_VERSIONS` in between."""
    upgrade = online_upgrade()
    lines = [e.encode().decode() for e in [*journal(), *upgrade, upgrade[-1]]]
    lines[5:5] = [json.dumps(v, separators=(",", ":")) for v in UNKNOWN_VERSIONS]
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def mixed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    base = tmp_path_factory.mktemp("mixed")
    out = base / "out"
    return out, run_report(spark, Options(Source(paths=(str(write_mixed(base / "j.jsonl")),)),
                                          out))


def test_conversions_from_version_2_events(spark: Any, mixed: tuple[Path, dict[str, Any]]
                                           ) -> None:
    out, summary = mixed
    got = sorted((r["group"], r["ts"] - T0, r["outcome"], r["from_protocol"], r["to"],
                  r["generation"], r["members"], r["duration_ms"], r["source"], r["reason"])
                 for r in rows(spark, out, "conversions"))
    assert got == [
        ("g3", 100_000, "aborted", None, None, 4, None, None, "p2:9092",
         "the broker's group changed meanwhile"),
        ("g3", 130_400, "converted", "cooperative-sticky", "engine", 5, 2, 400, "p2:9092", None),
        ("g4", 110_000, "aborted", None, None, 2, None, None, "p1:9092",
         "forwarded requests of the group are still unanswered"),
    ]
    assert (summary["conversions"], summary["conversions_aborted"],
            summary["groups_converted"]) == (1, 2, 1)
    groups = {r["group"]: r for r in rows(spark, out, "groups")}
    assert (groups["g3"]["conversions"], groups["g3"]["conversions_aborted"]) == (1, 1)
    assert (groups["g4"]["conversions"], groups["g4"]["conversions_aborted"]) == (0, 1)
    assert (groups["g1"]["conversions"], groups["g1"]["conversions_aborted"]) == (0, 0)
    lives = {(r["group"], r["member"]): r for r in rows(spark, out, "members")}
    assert lives[("g3", "C1")]["start_ms"] == T0 + 130_000
    assert lives[("g3", "C1")]["protocol"] == "classic"
    page = (out / "report.html").read_text()
    assert "<h3>Conversions to the engine</h3>" in page and "<h3>Conversions aborted</h3>" in page
    assert "classic (cooperative-sticky)" in page and "400 ms" in page
    assert "the broker&#x27;s group changed meanwhile" in page


def test_version_1_and_2_side_by_side_unknown_versions_skipped_and_counted(
        spark: Any, mixed: tuple[Path, dict[str, Any]]) -> None:
    """The version-1 tables of the mixed journal are those of :func:`journal` alone; the
    events of version 3 and without a version are left out (else Z would be a member of g1
    and S2 would have left g2 at 73 s) and counted, in ``summary.json`` and the HTML."""
    out, summary = mixed
    assert summary["events_skipped"] == {"3": 3, "none": 1}
    assert summary["schema_versions"] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["events_skipped"] == \
        {"3": 3, "none": 1}
    reb = sorted((r["group"], r["start_ms"] - T0, r["duration_ms"], r["outcome"])
                 for r in rows(spark, out, "rebalances"))
    assert reb == [("g1", 0, 0, "stable"), ("g1", 10_000, 5000, "stable"),
                   ("g1", 30_000, 1000, "stable"), ("g1", 50_000, 0, "emptied"),
                   ("g2", 0, 0, "stable"), ("g2", 40_000, None, "open")]
    lives = sorted((r["group"], r["member"], r["end_reason"])
                   for r in rows(spark, out, "members") if r["group"] in ("g1", "g2"))
    assert lives == [("g1", "A", "left"), ("g1", "B", "fenced (pod-local: its process was gone)"),
                     ("g2", "S", "replaced"), ("g2", "S2", None), ("g2", "T", None)]
    assert summary["downtimes"] == 6 and summary["partitions_open"] == 1
    # The events table keeps every row read; the others leave the unknown versions out.
    versions = sorted(r["v"] if r["v"] is not None else -1
                      for r in spark.read.parquet(str(out / "events")).select("v").collect())
    assert versions.count(3) == 3 and versions.count(-1) == 1 and versions.count(2) == 4
    page = (out / "report.html").read_text()
    assert ("4 events of a schema version this report does not read were skipped (version "
            "3: 3, without a version: 1; it reads 1, 2).") in page


def test_only_unknown_versions_says_so(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "j.jsonl"
    source.write_text("".join(json.dumps(v) + "\n" for v in UNKNOWN_VERSIONS))
    with pytest.raises(ReportError, match=r"skipped: v3: 3, no version: 1"):
        run_report(spark, Options(Source(paths=(str(source),)), tmp_path / "out"))


UNLIMITED_RETENTION = {"retention.ms": "-1"}
"""The journal topic's settings: its records carry the events' own timestamps, from 2023
(:data:`T0`), which a topic of the broker's default 7-day ``retention.ms`` deletes at its next
retention check (30 s after the broker starts, then every 5 minutes): between writing the
topic and a Spark job reading it, as the proxy's journal with ``journal-retention-ms -1``
would not."""


def write_journal_topic(cluster: KafkaCluster, topic: str,
                        config: Mapping[str, str] = UNLIMITED_RETENTION) -> None:
    """Create ``topic`` (2 partitions, ``config``) and write :func:`journal` to it, each record
    keyed and timestamped as the proxy's journal writer does."""
    from confluent_kafka import Producer

    cluster.create_topic(topic, 2, 1, config=config)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
    for event in journal():
        producer.produce(topic, key=event.key, value=event.encode(), timestamp=event.ts)
    assert producer.flush(30) == 0


def test_read_from_kafka(spark: Any, kafka39: KafkaBroker, tmp_path: Path,
                         report: tuple[Path, dict[str, Any]]) -> None:
    """The same journal from a topic (keys, timestamps) through Spark's Kafka source gives
    the same summary as from the file."""
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    write_journal_topic(kafka39, topic)
    summary = run_report(spark, Options(Source(kafka_bootstrap=kafka39.bootstrap, topic=topic),
                                        tmp_path / "out"))
    _, from_file = report
    skip = {"seconds", "stages_s"}
    assert {k: v for k, v in summary.items() if k not in skip} == \
        {k: v for k, v in from_file.items() if k not in skip}


def chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        pytest.fail("headless Chromium is missing: apt-get install -y chromium (dev/bootstrap "
                    "installs it)")
    return path


def run_chromium(args: list[str]) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr",
             "--v=0", *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_command_and_its_html_in_a_browser(tmp_path: Path) -> None:
    """``groupgate report`` as a user runs it (its own Spark session), then the HTML in
    headless Chromium: a screenshot, every plot decoded, no script error."""
    source = write_jsonl(tmp_path / "journal.jsonl", journal())
    out = tmp_path / "out"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "report", "--input", str(source), "--out", str(out),
         "--master", "local[2]", "--driver-memory", "1g", "--shuffle-partitions", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 rebalances" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rebalances"] == 5
    page = out / "report.html"
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    plots = text.count('<img class="plot"')
    assert plots >= 9  # 7 fleet plots, 2 per group section

    shot = tmp_path / "report.png"
    taken = run_chromium([f"--screenshot={shot}", "--window-size=1200,3000",
                          "--virtual-time-budget=5000", page.as_uri()])
    assert shot.exists() and shot.stat().st_size > 50_000, taken.stderr[-2000:]
    dom = run_chromium(["--dump-dom", "--virtual-time-budget=5000", page.as_uri()])
    assert f'data-plots-loaded="{plots}/{plots}"' in dom.stdout, dom.stdout[-500:]
    errors = [line for line in taken.stderr.splitlines() + dom.stderr.splitlines()
              if "CONSOLE" in line or "Uncaught" in line]
    assert errors == []
    shutil.copy(shot, ROOT / "test-logs" / "report.png") if (ROOT / "test-logs").is_dir() \
        else None


def test_without_pyspark_the_command_says_how_to_get_it(tmp_path: Path) -> None:
    blocker = tmp_path / "no_pyspark"
    blocker.mkdir()
    (blocker / "pyspark").mkdir()
    (blocker / "pyspark" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(os.environ, PYTHONPATH=f"{blocker}{os.pathsep}{ROOT}")
    done = subprocess.run([sys.executable, "-m", "proxy.cli", "report", "--input", "x.jsonl",
                           "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "pip install 'groupgate[report]'" in done.stderr
