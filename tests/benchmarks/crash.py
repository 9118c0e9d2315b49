"""``dev/bench crash``: how long a SIGKILLed member's partitions wait for another owner.

One member of a KIP-848 group (confluent-kafka, ``group.protocol=consumer``, alone in its
process) is SIGKILLed once the group is converged and quiet; the figure is the time from the
SIGKILL until every partition it owned has been assigned to another member, as the members'
own assignment callbacks report it (:mod:`tests.benchmarks.rebalance.scenarios`, scenario
``crash``). Targets: ``groupgate`` (``groupgate run`` in front of Kafka 3.9, pod-local
liveness on: the sidecar sees the member's process go) and ``native-4.4`` (Kafka 4.4's own
KIP-848 coordinator, which waits for the member's session timeout). Profiles: ``bench`` (the
rebalance benchmark's 1 s heartbeat and 6 s session, on both targets) and ``defaults`` (Kafka's
45 s session and 5 s heartbeat, groupgate's defaults likewise).

One invocation measures one target and profile for the given group sizes, ``--repeat`` runs
each, and writes the runs to ``--json`` after every run. ``--report FILE...`` reads such files
and prints, per profile and size, the median, minimum and maximum of each target and the ratio
groupgate / native-4.4 of the medians (and of the median partition downtime, partition-seconds
without a consuming owner); ``--summary FILE`` writes that table as JSON with the
machine and versions.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.commands import machine
from proxy.process import ProxyProcess
from tests.benchmarks.rebalance import scenarios, targets
from tests.testbed.artifacts import java_executable

PROFILES = ("bench", "defaults")
TARGETS = ("groupgate", "native-4.4")
KAFKA_SESSION_MS = 45_000
"""Kafka's default group.consumer.session.timeout.ms (and groupgate's)."""
KAFKA_HEARTBEAT_MS = 5_000
"""Kafka's default group.consumer.heartbeat.interval.ms (and groupgate's)."""


class GroupgateLive(targets.Groupgate):
    """``groupgate run`` with pod-local liveness on, the benchmark's session or the defaults."""

    def __init__(self, profile: str) -> None:
        super().__init__()
        self.profile = profile

    def start(self, workdir: Path) -> None:
        targets.Classic39.start(self, workdir)
        args = ["--pod-local-liveness", "on"]
        if self.profile == "bench":
            args += ["--group-heartbeat-interval-ms", str(targets.HEARTBEAT_INTERVAL_MS),
                     "--group-session-timeout-ms", str(targets.SESSION_TIMEOUT_MS)]
        self.proxy = ProxyProcess.start(self.broker_bootstrap, workdir / "groupgate.log",
                                        args=args)

    def describe(self) -> dict[str, Any]:
        bench = self.profile == "bench"
        return {**super().describe(), "pod_local_liveness": True,
                "group_heartbeat_interval_ms": (targets.HEARTBEAT_INTERVAL_MS if bench
                                                else KAFKA_HEARTBEAT_MS),
                "group_session_timeout_ms": (targets.SESSION_TIMEOUT_MS if bench
                                             else KAFKA_SESSION_MS)}


class Native44(targets.Native4):
    """Kafka 4.4's KIP-848 coordinator, the benchmark's session or Kafka's defaults."""

    name = "native-4.4"

    def __init__(self, profile: str) -> None:
        super().__init__()
        self.profile = profile

    def consumer_heartbeat_ms(self) -> int | None:
        return super().consumer_heartbeat_ms() if self.profile == "bench" else None

    def broker_properties(self) -> dict[str, str]:
        if self.profile == "bench":
            return super().broker_properties()
        return targets.Target.broker_properties(self)


def make_target(name: str, profile: str) -> targets.Target:
    return GroupgateLive(profile) if name == "groupgate" else Native44(profile)


def victim_partitions(run: dict[str, Any]) -> set[int]:
    """The partitions the victim owned at the SIGKILL (time 0 of the run's timeline)."""
    victim = run["roles"]["victim"]
    owned: set[int] = set()
    for t, member, kind, partitions in sorted(run["timeline"], key=lambda e: e[0]):
        if t >= 0:
            break
        if member == victim and kind == "assign":
            owned.update(partitions)
        elif member == victim and kind in ("revoke", "lost"):
            owned.difference_update(partitions)
    return owned


def reassigned_after(run: dict[str, Any]) -> float | None:
    """Seconds from the SIGKILL until every partition the victim owned then has been assigned
    to another member (the last of their assignment callbacks); None when one never was
    within the run."""
    victim = run["roles"]["victim"]
    waiting = victim_partitions(run)
    for t, member, kind, partitions in sorted(run["timeline"], key=lambda e: e[0]):
        if t < 0 or member == victim or kind != "assign":
            continue
        waiting.difference_update(partitions)
        if not waiting:
            return float(t)
    return None


def _versions(target: targets.Target) -> dict[str, Any]:
    import confluent_kafka

    from tests.testbed.distributions import get_line

    line = get_line(target.line)
    return {"kafka_broker": line.version, "confluent_kafka": confluent_kafka.__version__,
            "librdkafka": confluent_kafka.libversion()[0]}


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def summarize(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (profile, members): each target's median, min, max and runs; the ratio of
    groupgate's median to native-4.4's."""
    cells: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    for doc in docs:
        for run in doc["runs"]:
            key = (doc["profile"], run["members"])
            cells.setdefault(key, {}).setdefault(run["target"], []).append(run)
    rows = []
    for (profile, members), by_target in sorted(cells.items()):
        row: dict[str, Any] = {"profile": profile, "members": members}
        for name in TARGETS:
            runs = by_target.get(name, [])
            done = sorted(r["reassigned_s"] for r in runs if r["reassigned_s"] is not None)
            downtimes = [r["downtime_partition_s"] for r in runs
                         if r.get("downtime_partition_s") is not None]
            row[name] = {"runs": len(runs), "not_reassigned": len(runs) - len(done),
                         "median_s": round(statistics.median(done), 2) if done else None,
                         "min_s": round(done[0], 2) if done else None,
                         "max_s": round(done[-1], 2) if done else None,
                         "downtime_median_partition_s": (round(statistics.median(downtimes), 1)
                                                         if downtimes else None)}
        row["ratio"] = _ratio(row["groupgate"]["median_s"], row["native-4.4"]["median_s"])
        row["downtime_ratio"] = _ratio(row["groupgate"]["downtime_median_partition_s"],
                                       row["native-4.4"]["downtime_median_partition_s"])
        rows.append(row)
    return rows


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours is not None and theirs else None


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| profile | members | groupgate median (min-max) | native 4.4 median (min-max) "
             "| ratio | downtime partition-s, groupgate / native 4.4 (ratio) |",
             "|---|---|---|---|---|---|"]

    def cell(c: dict[str, Any]) -> str:
        if c["median_s"] is None:
            return "-"
        missing = f", {c['not_reassigned']} never" if c["not_reassigned"] else ""
        return (f"{c['median_s']:.2f} s ({c['min_s']:.2f}-{c['max_s']:.2f}, "
                f"{c['runs']} runs{missing})")

    def ratio(value: float | None) -> str:
        return "-" if not value else f"{value:.3f} (1/{1 / value:.1f})"

    def downtime(c: dict[str, Any]) -> str:
        value = c["downtime_median_partition_s"]
        return "-" if value is None else f"{value:.1f}"

    for row in rows:
        lines.append(f"| {row['profile']} | {row['members']} | {cell(row['groupgate'])} | "
                     f"{cell(row['native-4.4'])} | {ratio(row['ratio'])} | "
                     f"{downtime(row['groupgate'])} / {downtime(row['native-4.4'])} "
                     f"({ratio(row['downtime_ratio'])}) |")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=TARGETS, help="what to measure")
    parser.add_argument("--profile", choices=PROFILES, default="bench",
                        help="bench: 1 s heartbeat, 6 s session; defaults: Kafka's")
    parser.add_argument("--members", default="10", help="group sizes, comma separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", type=Path, help="write the runs as JSON")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSON",
                        help="only summarize these result files")
    parser.add_argument("--summary", metavar="FILE", type=Path,
                        help="with --report: write the summary as JSON")


def _report(paths: list[Path], summary: Path | None) -> int:
    docs = [json.loads(p.read_text()) for p in paths]
    rows = summarize(docs)
    print(table(rows))
    if summary is not None:
        _write(summary, {
            "benchmark": "crash",
            "command": "dev/bench crash " + " ".join(sys.argv[2:]),
            "measure": "seconds from the SIGKILL of a member's process until every partition "
                       "it owned was assigned to another member (their callbacks)",
            "machine": docs[0]["machine"] if docs else None,
            "sources": {str(p): {"target": d["target"], "profile": d["profile"],
                                 "command": d["command"], "versions": d["versions"],
                                 "settings": d["target_settings"]}
                        for p, d in zip(paths, docs, strict=True)},
            "rows": rows,
        })
        print(f"summary: {summary}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.report:
        return _report(args.report, args.summary)
    if not args.target:
        print("--target is required (or --report)", file=sys.stderr)
        return 2
    target = make_target(args.target, args.profile)
    sizes = [int(x) for x in args.members.split(",") if x.strip()]
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="groupgate-crash-")) if own else args.workdir
    doc: dict[str, Any] = {
        "benchmark": "crash", "command": "dev/bench crash " + " ".join(sys.argv[2:]),
        "target": target.name, "profile": args.profile,
        "machine": machine.machine_info(java_executable()), "versions": {},
        "target_settings": {}, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": [],
    }
    failures = 0
    t0 = time.monotonic()
    print(f"starting {target.name} ({args.profile}) ...", flush=True)
    target.start(workdir / target.name)
    try:
        doc["versions"] = _versions(target)
        doc["target_settings"] = target.describe()
        for size in sizes:
            settings = scenarios.Settings(members=size, scenario="crash", protocol="consumer")
            for i in range(args.repeat):
                print(f"[{time.monotonic() - t0:6.0f}s] {target.name} {args.profile} N={size} "
                      f"run {i + 1}/{args.repeat}", flush=True)
                try:
                    result = scenarios.run_scenario(target, settings, workdir / target.name,
                                                    log=lambda m: print(m, flush=True))
                except scenarios.ScenarioError as exc:
                    failures += 1
                    print(f"  failed: {exc}", flush=True)
                    continue
                reassigned = reassigned_after(result)
                doc["runs"].append({
                    "target": target.name, "members": size, "run_id": result["run_id"],
                    "reassigned_s": None if reassigned is None else round(reassigned, 3),
                    "victim_partitions": len(victim_partitions(result)),
                    "convergence_s": result["convergence_s"],
                    "downtime_partition_s": result["downtime_partition_s"],
                    "timed_out": result["timed_out"],
                    "client_errors": result["client_errors"][:5],
                })
                print(f"  reassigned after "
                      f"{'-' if reassigned is None else f'{reassigned:.2f}s'}, downtime "
                      f"{result['downtime_partition_s']:.1f} partition-s", flush=True)
                _write(args.json, doc)
    finally:
        target.stop()
        if own and not failures:
            shutil.rmtree(workdir, ignore_errors=True)
        elif own:
            print(f"{failures} run(s) failed: logs kept in {workdir}", flush=True)
    doc["elapsed_s"] = round(time.monotonic() - t0, 1)
    _write(args.json, doc)
    print(table(summarize([doc])))
    return 1 if failures else 0
