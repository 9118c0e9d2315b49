"""``dev/bench rebalance --scenario crash --profile P`` (also ``dev/bench crash``): how long a
SIGKILLed member's partitions wait for another owner.

One member of a group (confluent-kafka, alone in its process) is SIGKILLed once the group is
converged and quiet; the figure is the time from the SIGKILL until every partition it owned has
been assigned to another member, as the members' own assignment callbacks report it
(:mod:`tests.benchmarks.rebalance.scenarios`, scenario ``crash``). Targets: ``groupgate``
(``groupgate run`` in front of Kafka 3.9, KIP-848 members, pod-local liveness on: the sidecar
sees the member's process go), ``native-4.4`` (Kafka 4.4's own KIP-848 coordinator, which waits
for the member's session timeout) and ``classic-3.9`` (classic ``cooperative-sticky`` members
straight at Kafka 3.9, which waits for the session timeout too). Profiles: ``bench`` (the
rebalance benchmark's 1 s heartbeat and 6 s session, on every target) and ``defaults`` (Kafka's:
45 s session everywhere, 5 s heartbeat for KIP-848 members on Kafka 4.4 and groupgate, the
classic client's 3 s heartbeat on Kafka 3.9).

One invocation measures one target and profile for the given group sizes, ``--repeat`` runs
each, and writes the runs to ``--json`` after every run. ``--report FILE...`` reads such files
and prints, per profile and size, the median, minimum and maximum of each target and the ratios
groupgate / native-4.4 and groupgate / classic-3.9 of the medians (and of the median partition
downtime, partition-seconds without a consuming owner); ``--summary FILE`` writes that table as
JSON with the machine and versions, ``--plots DIR`` draws it (:func:`plot_summary`).
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
from proxy.commands.machine import describe_machine
from proxy.process import ProxyProcess
from tests.benchmarks.rebalance import scenarios, targets
from tests.testbed.artifacts import java_executable

PROFILES = ("bench", "defaults")
TARGETS = ("groupgate", "native-4.4", "classic-3.9")
PROTOCOLS = {"groupgate": "consumer", "native-4.4": "consumer",
             "classic-3.9": "cooperative-sticky"}
"""The members' protocol on each target (classic-3.9: the classic assignor that moves nothing
but the victim's partitions, the best a classic group does after a crash)."""
KAFKA_SESSION_MS = 45_000
"""Kafka's default group.consumer.session.timeout.ms (and groupgate's), and the classic
client's default session.timeout.ms."""
KAFKA_HEARTBEAT_MS = 5_000
"""Kafka's default group.consumer.heartbeat.interval.ms (and groupgate's)."""
KAFKA_CLASSIC_HEARTBEAT_MS = 3_000
"""The classic client's default heartbeat.interval.ms."""


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


class Classic39(targets.Classic39):
    """Kafka 3.9's classic coordinator; the members' session and heartbeat are client settings:
    the benchmark's, or the classic client's defaults."""

    def __init__(self, profile: str) -> None:
        super().__init__()
        self.profile = profile

    def timeouts_ms(self) -> tuple[int, int]:
        """(session.timeout.ms, heartbeat.interval.ms) of the members."""
        if self.profile == "bench":
            return targets.SESSION_TIMEOUT_MS, targets.HEARTBEAT_INTERVAL_MS
        return KAFKA_SESSION_MS, KAFKA_CLASSIC_HEARTBEAT_MS

    def client_config(self, protocol: str, group: str) -> dict[str, Any]:
        session, heartbeat = self.timeouts_ms()
        return {**super().client_config(protocol, group), "session.timeout.ms": session,
                "heartbeat.interval.ms": heartbeat}

    def describe(self) -> dict[str, Any]:
        session, heartbeat = self.timeouts_ms()
        described = super().describe()
        described["classic_client"] = {**described["classic_client"],
                                       "session.timeout.ms": session,
                                       "heartbeat.interval.ms": heartbeat}
        return described


def make_target(name: str, profile: str) -> targets.Target:
    if name == "groupgate":
        return GroupgateLive(profile)
    if name == "classic-3.9":
        return Classic39(profile)
    return Native44(profile)


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
    """One row per (profile, members): each target's median, min, max and runs; the ratios of
    groupgate's medians to native-4.4's (``ratio``, ``downtime_ratio``) and to classic-3.9's
    (``ratio_classic``, ``downtime_ratio_classic``)."""
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
        for suffix, other in (("", "native-4.4"), ("_classic", "classic-3.9")):
            row["ratio" + suffix] = _ratio(row["groupgate"]["median_s"], row[other]["median_s"])
            row["downtime_ratio" + suffix] = _ratio(
                row["groupgate"]["downtime_median_partition_s"],
                row[other]["downtime_median_partition_s"])
        rows.append(row)
    return rows


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours is not None and theirs else None


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| profile | members | groupgate | native 4.4 | classic 3.9 "
             "| ratio to native 4.4 | ratio to classic 3.9 "
             "| downtime partition-s: groupgate / native 4.4 / classic 3.9 "
             "| downtime ratio to native 4.4 | downtime ratio to classic 3.9 |",
             "|---|---|---|---|---|---|---|---|---|---|"]

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
        lines.append(
            f"| {row['profile']} | {row['members']} | {cell(row['groupgate'])} | "
            f"{cell(row['native-4.4'])} | {cell(row['classic-3.9'])} | "
            f"{ratio(row['ratio'])} | {ratio(row['ratio_classic'])} | "
            f"{' / '.join(downtime(row[t]) for t in TARGETS)} | "
            f"{ratio(row['downtime_ratio'])} | {ratio(row['downtime_ratio_classic'])} |")
    return "\n".join(lines)


def plot_summary(rows: list[dict[str, Any]], machine_info: dict[str, Any] | None,
                 path: Path) -> Path:
    """Bars of the median per target (whiskers: min-max), one column per profile, one group
    of bars per group size; top: seconds until the victim's partitions are reassigned, bottom:
    the median partition downtime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"groupgate": "#2ca02c", "native-4.4": "#1f77b4", "classic-3.9": "#ff7f0e"}
    fig, axes = plt.subplots(2, len(PROFILES), figsize=(11, 7), squeeze=False)
    width = 0.8 / len(TARGETS)
    for col, profile in enumerate(PROFILES):
        mine = [r for r in rows if r["profile"] == profile]
        sizes = [r["members"] for r in mine]
        for line, (key, label) in enumerate((
                ("median_s", "seconds until the victim's\npartitions are reassigned"),
                ("downtime_median_partition_s", "partition downtime\n(partition-s)"))):
            ax = axes[line][col]
            for i, name in enumerate(TARGETS):
                xs, ys, low, high = [], [], [], []
                for j, row in enumerate(mine):
                    value = row[name][key]
                    if value is None:
                        continue
                    xs.append(j + (i - (len(TARGETS) - 1) / 2) * width)
                    ys.append(value)
                    if key == "median_s":
                        low.append(value - row[name]["min_s"])
                        high.append(row[name]["max_s"] - value)
                errors = [low, high] if key == "median_s" else None
                bars = ax.bar(xs, ys, width, color=colors[name], label=name, yerr=errors,
                              capsize=3 if errors else 0)
                labels = [f"{y:.2f}" if key == "median_s" else f"{y:.1f}" for y in ys]
                ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels([f"{n} members" for n in sizes])
            ax.set_ylabel(label, fontsize=8)
            ax.margins(y=0.15)
            if line == 0:
                session, heartbeat = (("6 s", "1 s") if profile == "bench"
                                      else ("45 s", "5 s (classic 3 s)"))
                ax.set_title(f"{profile}: session {session}, heartbeat {heartbeat}",
                             fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("A member SIGKILLed: median of 3 runs (whiskers: min-max)", fontsize=10)
    if machine_info:
        fig.text(0.01, 0.005, describe_machine(machine_info), fontsize=6, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    parser.add_argument("--plots", metavar="DIR", type=Path, default=None,
                        help="with --report: draw the summary as DIR/crash-summary.png")


def _command() -> str:
    return "dev/bench " + " ".join(sys.argv[1:])


def report(paths: list[Path], summary: Path | None, plots: Path | None = None) -> int:
    docs = [json.loads(p.read_text()) for p in paths]
    rows = summarize(docs)
    print(table(rows))
    if plots is not None:
        picture = plot_summary(rows, docs[0]["machine"] if docs else None,
                               plots / "crash-summary.png")
        print(f"picture: {picture}")
    if summary is not None:
        _write(summary, {
            "benchmark": "crash",
            "command": _command(),
            "measure": "seconds from the SIGKILL of a member's process until every partition "
                       "it owned was assigned to another member (their callbacks)",
            "machine": docs[0]["machine"] if docs else None,
            "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sources": {str(p): {"target": d["target"], "profile": d["profile"],
                                 "command": d["command"], "started_utc": d["started_utc"],
                                 "elapsed_s": d.get("elapsed_s"), "versions": d["versions"],
                                 "settings": d["target_settings"]}
                        for p, d in zip(paths, docs, strict=True)},
            "rows": rows,
        })
        print(f"summary: {summary}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.report:
        return report(args.report, args.summary, args.plots)
    if not args.target:
        print("--target is required (or --report)", file=sys.stderr)
        return 2
    target = make_target(args.target, args.profile)
    sizes = [int(x) for x in args.members.split(",") if x.strip()]
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="groupgate-crash-")) if own else args.workdir
    doc: dict[str, Any] = {
        "benchmark": "crash", "command": _command(),
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
            settings = scenarios.Settings(members=size, scenario="crash",
                                          protocol=PROTOCOLS[target.name])
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
                    "protocol": settings.protocol,
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
