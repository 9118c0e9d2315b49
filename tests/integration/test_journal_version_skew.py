"""Version skew of the journal: schema version 2 between groupgate 0.2.0 and this build.

This build writes ``group_converted`` and ``conversion_aborted`` at schema version 2 and every
older event type at version 1 (``proxy/journal/schema.py``); 0.2.0 writes and reads version 1
only. During a rolling update both write to one journal topic, and either version's
``groupgate report`` may read it:

* **0.2.0's report on a journal with version-2 events** (this build's encoder): the command
  as a user runs it (its command line's ``main``), from 0.2.0's own ``proxy/``
  (``tests.testbed.releases``), must succeed and leave them out (its reader keeps ``v == 1``),
  silently, since it knows no other version to count: it reads the version-1 events only, and
  what it finds of the converted group is its version-1 events. With ``--run-slow`` it must
  also say exactly what it says of the same journal without its version-2 lines (a second
  report of 0.2.0, in the same process of 0.2.0, one after the other: one JVM, each report's
  Spark session started and stopped in it).
* **This build's report on a journal 0.2.0 wrote** (0.2.0's encoder and ``check()``, in a
  process of its own): every table and ``summary.json`` equal to this build's report on the
  same events as this build encodes them; nothing skipped, no conversion (by default, where
  0.2.0's lines are byte for byte this build's, that report is the same run). Likewise on the
  Parquet ``events`` table of 0.2.0's report (``--input report/events``).

Both run Spark (local, 1 g driver; this build's reports in the session the report modules
share): run it under the test bed's lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.journal.schema import Event, EventType
from proxy.report.job import Options, Source, run_report
from tests.benchmarks.report_diff import TABLES, differences
from tests.conftest import _run_slow
from tests.integration.conftest import SparkSessions
from tests.integration.test_report import journal, online_upgrade

ROOT = Path(__file__).resolve().parents[2]
VERSION_2 = (EventType.GROUP_CONVERTED, EventType.CONVERSION_ABORTED)

WRITE_AS_0_2_0 = """
import json, sys
from proxy.journal.schema import Event, EventType, check
with open(sys.argv[1]) as given, open(sys.argv[2], "w") as out:
    for line in given:
        e = json.loads(line)
        event = Event(EventType(e["type"]), e["group"], e["ts"], e["source"], e["seq"],
                      e["fields"])
        problems = check(event.to_value())
        assert problems == [], (problems, e)
        out.write(event.encode().decode() + "\\n")
"""
"""Run in 0.2.0's tree: encode the events given (type, group, ts, source, seq, fields) as
0.2.0's journal writer does, each held to 0.2.0's ``check()``."""


def old_tree() -> Path:
    from tests.testbed.releases import ReleaseUnavailable, release_tree

    try:
        return release_tree("0.2.0")
    except ReleaseUnavailable as exc:
        pytest.skip(str(exc))


def write(path: Path, events: list[Event]) -> Path:
    path.write_text("".join(e.encode().decode() + "\n" for e in events))
    return path


REPORTS_AS_0_2_0 = """
import json, sys
from proxy.cli import main
for name, argv in json.loads(sys.argv[1]).items():
    print(json.dumps({"report": name, "exit": main(argv)}), flush=True)
"""
"""Run in 0.2.0's tree: 0.2.0's command line (``proxy.cli.main``, as ``groupgate`` calls it)
once per report, in one process: one JVM for all of them (each report starts and stops its
own Spark session in it)."""


def report_commands(tree: Path, reports: dict[str, tuple[Path, Path]]
                    ) -> subprocess.CompletedProcess[str]:
    """``groupgate report --input SOURCE --out OUT`` of the release in ``tree`` (its ``proxy``
    imported first) for each ``name: (source, out)``; its output says each one's exit code."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(tree))
    argvs = {name: ["report", "--input", str(source), "--out", str(out), "--master", "local[2]",
                    "--driver-memory", "1g", "--shuffle-partitions", "4"]
             for name, (source, out) in reports.items()}
    return subprocess.run([sys.executable, "-c", REPORTS_AS_0_2_0, json.dumps(argvs)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=900,
                          check=False)


def exits(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """Each report's exit code, as :data:`REPORTS_AS_0_2_0` printed them."""
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith('{"report": '):
            said = json.loads(line)
            found[said["report"]] = said["exit"]
    return found


@pytest.fixture(scope="module")
def old_reports(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """0.2.0's report on the mixed journal, and with ``--run-slow`` on its version-1 lines
    alone (run before this module asks for its Spark session)."""
    tree = old_tree()
    base = tmp_path_factory.mktemp("old-report")
    events = [*journal(), *online_upgrade()]
    mixed = write(base / "mixed.jsonl", events)
    v1 = write(base / "v1.jsonl", [e for e in events if e.type not in VERSION_2])
    reports = {"mixed": (mixed, base / "mixed")}
    if _run_slow(request.config):
        reports["v1"] = (v1, base / "v1")
    done = report_commands(tree, reports)
    return {"base": base, "done": done, "events": events, "reports": set(reports),
            "v2_lines": sum(1 for e in events if e.type in VERSION_2)}


@pytest.fixture(scope="module")
def spark(old_reports: dict[str, Any], spark_sessions: SparkSessions) -> Any:
    """The Spark session the report modules share (UTC), asked for once 0.2.0's reports have
    run (their JVM has exited by then)."""
    return spark_sessions.shared()


@pytest.fixture(scope="module")
def ours_from_v1(spark: Any, old_reports: dict[str, Any]) -> Path:
    """This build's report on the journal's version-1 lines as this build encodes them: what
    this build must report from what 0.2.0 wrote (its journal, its events table)."""
    base: Path = old_reports["base"]
    run_report(spark, Options(Source(paths=(str(base / "v1.jsonl"),)), base / "ours-from-json"))
    return base / "ours-from-json"


def test_the_report_of_0_2_0_leaves_version_2_events_out(spark: Any,
                                                          old_reports: dict[str, Any]) -> None:
    base, done = old_reports["base"], old_reports["done"]
    assert done.returncode == 0 and exits(done) == dict.fromkeys(old_reports["reports"], 0), \
        (done.stdout[-2000:], done.stderr[-3000:])
    assert old_reports["v2_lines"] == 3
    # Every older type stays at version 1 (else 0.2.0 would leave it out: the count below).
    assert {json.loads(line)["v"] for line in (base / "v1.jsonl").read_text().splitlines()} \
        == {1}
    summary = json.loads((base / "mixed" / "summary.json").read_text())
    v1_events = len(old_reports["events"]) - old_reports["v2_lines"]
    assert summary["events"] == v1_events
    assert "events_skipped" not in summary and "conversions" not in summary  # 0.2.0's summary
    versions = {r["v"] for r in spark.read.parquet(str(base / "mixed" / "events"))
                .select("v").distinct().collect()}
    assert versions == {1}
    # What 0.2.0 found in g3: the adoption's version-1 events (created, two members joined).
    groups = {r["group"]: r for r in spark.read.parquet(str(base / "mixed" / "groups"))
              .collect()}
    assert groups["g3"]["members_seen"] == 2 and groups["g3"]["coordinated"]
    assert "g4" not in groups  # only a conversion_aborted: nothing 0.2.0 reads


@pytest.mark.slow  # a second report of 0.2.0; the default run checks what it left out above
def test_the_report_of_0_2_0_says_of_the_mixed_journal_what_it_says_without_version_2(
        spark: Any, old_reports: dict[str, Any]) -> None:
    base, done = old_reports["base"], old_reports["done"]
    assert exits(done) == {"mixed": 0, "v1": 0}, (done.stdout[-2000:], done.stderr[-3000:])
    found = differences(spark, base / "mixed", base / "v1", TABLES)
    assert found == [], "\n".join(found)


def test_this_build_reads_a_journal_written_by_0_2_0(spark: Any, ours_from_v1: Path,
                                                     tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    """By default, where 0.2.0 wrote the events byte for byte as this build does, this build's
    report on them is ``ours_from_v1`` itself (its ``summary.json`` is checked); with
    ``--run-slow``, or where the bytes differ, a report of 0.2.0's lines is run and compared
    table by table."""
    tree = old_tree()
    events = [e for e in [*journal(), *online_upgrade()] if e.type not in VERSION_2]
    given = tmp_path / "events.json"
    given.write_text("".join(json.dumps({"type": e.type.value, "group": e.group, "ts": e.ts,
                                         "source": e.source, "seq": e.seq,
                                         "fields": dict(e.fields)}) + "\n" for e in events))
    old = tmp_path / "written-by-0.2.0.jsonl"
    done = subprocess.run([sys.executable, "-c", WRITE_AS_0_2_0, str(given), str(old)],
                          cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(old.read_text().splitlines()) == len(events)
    assert {json.loads(line)["v"] for line in old.read_text().splitlines()} == {1}
    # the same events as this build encodes them: the version-1 lines of the journal above
    ours = write(tmp_path / "written-by-this-build.jsonl", events)
    assert ours.read_text() == (ours_from_v1.parent / "v1.jsonl").read_text()

    if old.read_text() == ours.read_text() and not _run_slow(request.config):
        from_old = json.loads((ours_from_v1 / "summary.json").read_text())
    else:
        from_old = run_report(spark, Options(Source(paths=(str(old),)), tmp_path / "from-old"))
        found = differences(spark, tmp_path / "from-old", ours_from_v1, (*TABLES, "conversions"))
        assert found == [], "\n".join(found)
    assert from_old["events_skipped"] == {} and from_old["events"] == len(events)
    assert (from_old["conversions"], from_old["conversions_aborted"]) == (0, 0)
    assert from_old["rebalances"] == 5 and from_old["downtimes"] == 6


def test_this_build_reads_the_events_table_of_0_2_0(spark: Any, old_reports: dict[str, Any],
                                                    ours_from_v1: Path) -> None:
    """``--input report/events`` (Parquet) of a 0.2.0 report: the same report as from the
    journal's version-1 lines."""
    base = old_reports["base"]
    from_table = run_report(spark, Options(Source(paths=(str(base / "mixed" / "events"),),
                                                  fmt="parquet"), base / "ours-from-table"))
    found = differences(spark, base / "ours-from-table", ours_from_v1, (*TABLES, "conversions"))
    assert found == [], "\n".join(found)
    assert from_table["events_skipped"] == {} and from_table["conversions"] == 0
