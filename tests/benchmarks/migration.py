"""``dev/bench migration``: the whole migration roll in the pod test bed, step by step, through
groupgate and on Kafka 4.4's own coordinator (the reference).

``--target groupgate``: three pods with groupgate in front of Kafka 3.9 (the roll of
``tests/integration/pod_roll.py``, ``groupgate_roll``): sidecars on pod by pod and the
conversion, clients to the consumer protocol pod by pod, back to classic pod by pod (the last
KIP-848 member leaving hands the group back), sidecars off pod by pod. ``--target native-4.4``:
the same clients straight at Kafka 4.4, switched classic to consumer pod by pod and back
(``native_roll``). Six members (librdkafka and the Java client's consumer), 12 partitions,
continuous production. Per step: the worst partition downtime (the longest time one partition
had no owner within the step) and the members called back (members not restarted in the step
that saw a revocation or loss; and how many callbacks).

One invocation is one run of one target (so a series can take the test bed's lock per run and
alternate targets), written to ``--json``; ``--report FILE...`` reads such files and prints per
step the median (and min-max) over runs of each target side by side, the worst step of each
roll, and whether groupgate's worst per-step downtime is at most Kafka 4.4's; ``--summary``
writes it as JSON with the machine and versions, ``--plots DIR`` draws it
(``DIR/migration-steps.png``), ``--markdown FILE`` writes the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.commands import machine
from proxy.commands.machine import describe_machine
from tests.testbed.artifacts import java_executable

TARGETS = ("groupgate", "native-4.4")
STEP_KINDS = ("a", "b", "c", "d")


def _versions(line: str) -> dict[str, Any]:
    import confluent_kafka

    from tests.testbed.distributions import get_line

    return {"kafka_broker": get_line(line).version,
            "confluent_kafka": confluent_kafka.__version__,
            "librdkafka": confluent_kafka.libversion()[0], "java_client": get_line("4.4").version}


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def one_run(target: str, assignor: str, workdir: Path) -> dict[str, Any]:
    """One roll of ``target``: its steps and the safety checks."""
    from tests.integration.pod_roll import (
        NATIVE_HEARTBEAT_MS,
        NATIVE_PROPERTIES,
        PodRoll,
        Step,
        groupgate_roll,
        native_roll,
    )
    from tests.integration.test_migration_roll import POD_NAMES
    from tests.testbed import pods
    from tests.testbed.broker import KafkaBroker

    ok, why = pods.available()
    if not ok:
        raise RuntimeError(f"the pod test bed is not available here: {why}")

    def show(step: Step) -> None:
        where = ""
        if step.worst is not None:
            gap = step.worst
            before = "nobody" if gap.before is None else (
                f"{gap.before.owner} ({gap.before.ended_by})")
            where = (f" [partition {gap.partition[1]}, {gap.begin - step.begin:.2f}-"
                     f"{gap.end - step.begin:.2f} s: from {before} to "
                     f"{'nobody' if gap.after is None else gap.after.owner}]")
        print(f"  {step.name}: worst downtime {step.worst_downtime_s:.2f} s{where}, called back "
              f"{len(step.called_back)} ({sum(step.called_back.values())} callbacks)",
              flush=True)

    started = time.time()
    with pods.PodNetwork() as network:
        pod_list = [network.pod(name) for name in POD_NAMES]
        if target == "groupgate":
            broker = KafkaBroker.start("3.9", workdir / "kafka", host=network.host_ip)
        else:
            broker = KafkaBroker.start("4.4", workdir / "kafka", host=network.host_ip,
                                       consumer_heartbeat_ms=NATIVE_HEARTBEAT_MS,
                                       properties=NATIVE_PROPERTIES)
        with broker:
            roll = PodRoll(workdir, broker, pod_list, assignor, on_step=show)
            error = None
            try:
                (groupgate_roll if target == "groupgate" else native_roll)(roll)
                roll.finish()
            except AssertionError as exc:  # a step that did not settle: recorded, not hidden
                error = str(exc)
            finally:
                roll.close()
            safety = roll.safety()
    return {"target": target, "assignor": assignor, "elapsed_s": round(time.time() - started, 1),
            "error": error, "steps": [s.as_json() for s in roll.steps],
            "safety": {k: (v if not isinstance(v, list) else v[:10]) for k, v in safety.items()},
            "client_errors": [{"member": m.name, **e} for m in roll.everyone
                              for e in m.errors][:20]}


def kind(step: str) -> str:
    return step.split(":", 1)[0]


def comparable(step: str) -> str:
    """A step's name without what only one roll says of it (the group handed back, converted
    back), so that the two rolls' steps line up."""
    return step.split(" (", 1)[0]


def summarize(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step (in roll order), each target's median, min and max of the worst downtime and
    of the members called back; each roll's worst step (median over runs of each run's
    worst step); the goal."""
    order: list[str] = []
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    worst: dict[str, list[float]] = {t: [] for t in TARGETS}
    runs: dict[str, int] = {t: 0 for t in TARGETS}
    failed: dict[str, list[str]] = {t: [] for t in TARGETS}
    for doc in docs:
        for run in doc["runs"]:
            target = run["target"]
            runs[target] += 1
            if run.get("error"):
                failed[target].append(run["error"][:200])
            steps = run["steps"]
            if steps:
                worst[target].append(max(s["worst_downtime_s"] for s in steps))
            for s in steps:
                name = comparable(s["step"])
                if name not in order:
                    order.append(name)
                cells.setdefault(name, {}).setdefault(target, []).append(s)
    rows = []
    for name in sorted(order, key=lambda n: (STEP_KINDS.index(kind(n)) if kind(n) in STEP_KINDS
                                             else 9, order.index(n))):
        row: dict[str, Any] = {"step": name}
        for target in TARGETS:
            seen = cells[name].get(target, [])
            downtimes = sorted(s["worst_downtime_s"] for s in seen)
            called = sorted(s["members_called_back"] for s in seen)
            row[target] = None if not seen else {
                "runs": len(seen),
                "worst_downtime_median_s": round(statistics.median(downtimes), 2),
                "worst_downtime_min_s": downtimes[0], "worst_downtime_max_s": downtimes[-1],
                "called_back_median": statistics.median(called),
                "called_back_max": called[-1],
                "callbacks_median": statistics.median(s["callbacks"] for s in seen),
                "lost_max": max(s["lost"] for s in seen)}
        rows.append(row)
    roll_worst = {t: (round(statistics.median(worst[t]), 2) if worst[t] else None)
                  for t in TARGETS}
    ours, theirs = roll_worst["groupgate"], roll_worst["native-4.4"]
    return {"rows": rows, "runs": runs, "failed": failed, "roll_worst_downtime_median_s":
            roll_worst, "goal_met": (ours <= theirs) if ours is not None and theirs is not None
            else None}


def table(summary: dict[str, Any]) -> str:
    lines = ["| step | groupgate: worst downtime s | groupgate: members called back "
             "| Kafka 4.4: worst downtime s | Kafka 4.4: members called back |",
             "|---|---|---|---|---|"]

    def cell(c: dict[str, Any] | None) -> tuple[str, str]:
        if c is None:
            return "-", "-"
        lost = f", {c['lost_max']} lost" if c["lost_max"] else ""
        return (f"{c['worst_downtime_median_s']:.2f} ({c['worst_downtime_min_s']:.2f}-"
                f"{c['worst_downtime_max_s']:.2f})",
                f"{c['called_back_median']:g} of the others (max {c['called_back_max']}; "
                f"{c['callbacks_median']:g} callbacks{lost})")

    for row in summary["rows"]:
        ours, theirs = cell(row["groupgate"]), cell(row["native-4.4"])
        lines.append(f"| {row['step']} | {ours[0]} | {ours[1]} | {theirs[0]} | {theirs[1]} |")
    worst = summary["roll_worst_downtime_median_s"]
    lines.append(f"| **worst step of the roll** (median of each run's worst) | "
                 f"**{worst['groupgate']}** | | **{worst['native-4.4']}** | |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], machine_info: dict[str, Any] | None, path: Path) -> Path:
    """Per step, bars of the median worst downtime of each target (whiskers: min-max), and
    below, the median of the members called back."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"groupgate": "#2ca02c", "native-4.4": "#1f77b4"}
    rows = summary["rows"]
    fig, axes = plt.subplots(2, 1, figsize=(12, 7.5), sharex=True)
    width = 0.4
    for i, target in enumerate(TARGETS):
        xs, ys, low, high, called = [], [], [], [], []
        for j, row in enumerate(rows):
            c = row[target]
            if c is None:
                continue
            xs.append(j + (i - 0.5) * width)
            ys.append(c["worst_downtime_median_s"])
            # (the median is rounded: a whisker of a few milliseconds below zero is none)
            low.append(max(0.0, c["worst_downtime_median_s"] - c["worst_downtime_min_s"]))
            high.append(max(0.0, c["worst_downtime_max_s"] - c["worst_downtime_median_s"]))
            called.append(c["called_back_median"])
        label = "groupgate (Kafka 3.9)" if target == "groupgate" else "Kafka 4.4 native"
        bars = axes[0].bar(xs, ys, width, color=colors[target], label=label,
                           yerr=[low, high], capsize=3)
        axes[0].bar_label(bars, labels=[f"{y:.1f}" for y in ys], fontsize=7, padding=2)
        bars = axes[1].bar(xs, called, width, color=colors[target], label=label)
        axes[1].bar_label(bars, labels=[f"{y:g}" for y in called], fontsize=7, padding=2)
    axes[0].set_ylabel("worst partition downtime\nin the step (s)", fontsize=8)
    axes[1].set_ylabel("members not restarted\nthat were called back", fontsize=8)
    axes[1].set_xticks(range(len(rows)))
    axes[1].set_xticklabels([r["step"].replace(": ", ":\n", 1) for r in rows], fontsize=7,
                            rotation=30, ha="right")
    axes[0].legend(fontsize=8)
    axes[0].margins(y=0.15)
    axes[1].margins(y=0.15)
    runs = summary["runs"]
    fig.suptitle(f"The migration roll, six members, three pods: median of "
                 f"{runs['groupgate']} groupgate and {runs['native-4.4']} Kafka 4.4 runs "
                 "(whiskers: min-max)", fontsize=10)
    if machine_info:
        fig.text(0.01, 0.005, describe_machine(machine_info), fontsize=6, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=TARGETS, help="what to run (one roll)")
    parser.add_argument("--assignor", default="range",
                        choices=("range", "cooperative-sticky"),
                        help="the classic members' assignor (default range: Kafka 4.4 does "
                             "not upgrade a librdkafka cooperative-sticky group, whose "
                             "assignments carry user data)")
    parser.add_argument("--json", metavar="FILE", type=Path, help="write the run as JSON")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSON",
                        help="only summarize these result files")
    parser.add_argument("--summary", metavar="FILE", type=Path,
                        help="with --report: write the summary as JSON")
    parser.add_argument("--plots", metavar="DIR", type=Path, default=None,
                        help="with --report: draw DIR/migration-steps.png")
    parser.add_argument("--markdown", metavar="FILE", type=Path, default=None,
                        help="with --report: write the table as Markdown")


def _command() -> str:
    return "dev/bench " + " ".join(sys.argv[1:])


def report(args: argparse.Namespace) -> int:
    paths: list[Path] = args.report
    docs = [json.loads(p.read_text()) for p in paths]
    summary = summarize(docs)
    text = table(summary)
    print(text)
    print(f"goal (groupgate's worst step at most Kafka 4.4's): {summary['goal_met']}")
    machine_info = docs[0]["machine"] if docs else None
    if args.plots is not None:
        print(f"picture: {plot(summary, machine_info, args.plots / 'migration-steps.png')}")
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    if args.summary is not None:
        _write(args.summary, {
            "benchmark": "migration", "command": _command(), "machine": machine_info,
            "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sources": {str(p): {"target": d["runs"][0]["target"] if d["runs"] else None,
                                 "started_utc": d["started_utc"], "versions": d["versions"],
                                 "command": d["command"]}
                        for p, d in zip(paths, docs, strict=True)},
            **summary})
        print(f"summary: {args.summary}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.report:
        return report(args)
    if not args.target:
        print("--target is required (or --report)", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="groupgate-migration-"))
    doc: dict[str, Any] = {
        "benchmark": "migration", "command": _command(),
        "machine": machine.machine_info(java_executable()),
        "versions": _versions("3.9" if args.target == "groupgate" else "4.4"),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    print(f"{args.target}: the roll ({args.assignor}) ...", flush=True)
    result = one_run(args.target, args.assignor, workdir)
    doc["runs"].append(result)
    _write(args.json, doc)
    print(json.dumps(result["safety"]))
    if result["error"]:
        print(f"the roll stopped: {result['error']} (logs in {workdir})", flush=True)
    return 1 if result["error"] else 0
