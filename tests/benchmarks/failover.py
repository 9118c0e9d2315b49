"""``dev/bench failover``: a coordinator failover, groupgate's against Kafka 4.4's own, with the
same clients, the same timing and the same detection time.

Both arms run three pods (network namespaces), two members of one group (12 partitions) in
each (confluent-kafka, one ``group.protocol=consumer``, one classic ``cooperative-sticky``, both
committing asynchronously after every record), continuous production, a three-node KRaft
cluster with ``broker.session.timeout.ms=9000`` (Kafka's default), heartbeats every second and
21-second member sessions (20 s in the recorded runs), and two scripted failures:

* **groupgate** (Kafka 3.9, a sidecar in each pod with ``--broker-session-timeout-ms 9000``, so
  a dead sidecar is noticed as late as a dead broker is): at 30 s the sidecar coordinating the
  group is SIGKILLed (started again a second later, as Kubernetes restarts a container); at
  70 s a new-protocol member starts joining and, a second later, the coordinating sidecar is
  SIGKILLed again.
* **kafka** (Kafka 4.4, the members connect to the brokers, the native KIP-848 coordinator):
  at 30 s the broker coordinating the group is SIGKILLed (started again 10 s later); at 70 s a
  new-protocol member starts joining and, a second later, the coordinating broker is SIGKILLed.

Measured for each failure, from the members' own callbacks and commit callbacks:

* **served again**: the later of (a) every partition owned by exactly one live member, the
  joining member with its share, and (b) every member that lived through the failure having had
  a commit sent after the failure acknowledged (the coordinator answers again);
* **joiner waited**: from the joining member's start to its first partitions;
* **partition downtime**: partition-seconds without a consuming owner after the failure;
* members disturbed (a partition revoked or lost), and the soak's invariants (no partition
  owned twice, nothing lost, no committed offset backwards).

``--json`` writes every run with the machine; ``--plots DIR`` draws the median run of each arm
and failure (a row per member, and the partitions nobody consumes) and a side-by-side chart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from proxy.commands import machine
from tests.benchmarks.rebalance import report
from tests.benchmarks.soak import run as soak
from tests.testbed.artifacts import java_executable

GROUP = "cooperative"
KINDS = ("confluent/consumer/async", "confluent/classic/async")
JOINER = "confluent/consumer/async"
DETECTION_MS = 9000
"""Kafka's ``broker.session.timeout.ms`` default, and the sidecars' detection time."""
SESSION_MS = 21000
"""The members' session (classic ``session.timeout.ms``; the group's for the new protocol):
longer than a failover, so that members that keep heartbeating can keep their partitions: the
shortest a fleet accepts with 1 s heartbeats and the 9 s detection (1 + 9 + 11 s,
docs/operations.md, "How long a request can wait"; the runs in docs/benchmarks/failover.md
were made with 20 s, before the rule counted the broker session)."""
STEADY_AT, JOIN_AT = 30, 70
"""Seconds from the start of a run (the cluster starts in the first ~10)."""
PARTITIONS = 12
"""Two per initial member, so that the joining member gets a share."""


ARMS: dict[str, dict[str, Any]] = {
    "groupgate": {"kafka": "3.9", "direct": False,
                  "proxy_args": ("--broker-session-timeout-ms", str(DETECTION_MS)),
                  "events": ("coordinator-kill", "join-coordinator-kill")},
    "kafka": {"kafka": "4.4", "direct": True, "proxy_args": (),
              "events": ("broker-kill", "join-broker-kill")},
}
FAILURES = ("steady", "joining")
"""The two failures of a run: at steady state, and while a member joins."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--arms", default="groupgate,kafka")
    parser.add_argument("--duration", type=float, default=110.0)
    parser.add_argument("--json", metavar="FILE", type=Path)
    parser.add_argument("--plots", metavar="DIR", type=Path)
    parser.add_argument("--workdir", type=Path, default=None)


def settings_for(arm: str, seed: int, duration_s: float) -> soak.Settings:
    a = ARMS[arm]
    steady, joining = a["events"]
    initial = tuple(f"{GROUP}:{kind}@{pod}" for pod in (1, 2, 3) for kind in KINDS)
    return soak.Settings(
        duration_s=duration_s, seed=seed, partitions=PARTITIONS, pods=3, brokers=3,
        groups=(GROUP,), initial=initial,
        script=(f"{STEADY_AT}:{steady}:{GROUP}", f"{JOIN_AT}:{joining}:{GROUP}"),
        max_members=len(initial) + 2, catch_up_s=120.0, session_timeout_ms=SESSION_MS,
        max_poll_interval_ms=SESSION_MS + 10000, kafka=a["kafka"], direct=a["direct"],
        proxy_args=a["proxy_args"], join_kind=JOINER,
        broker_properties=(f"broker.session.timeout.ms={DETECTION_MS}",))


def slowest(by_member: dict[str, float | None] | None) -> float | None:
    """Seconds until every member that lived through a failure had a commit sent after it
    acknowledged (:func:`commits_resumed_by_member`); None if one had none."""
    if not by_member or None in by_member.values():
        return None
    return max(v for v in by_member.values() if v is not None)


def commits_resumed_by_member(run: soak.Soak, t: float,
                              end: float) -> dict[str, float | None] | None:
    """Per member that lived through ``[t, end]``: seconds from ``t`` to its first acknowledged
    commit sent after ``t`` (None if none by ``end``); None if no member lived through it."""
    g = run.groups[GROUP]
    gone = {e.member for e in g.events if e.kind in ("crash", "leave") and e.t <= end}
    started = {e.member for e in g.events if e.kind == "join" and e.t >= t - 1.5}
    members = set(g.kinds) - gone - started
    first: dict[str, float] = {}
    for c in g.commits:
        if c.sent is not None and t < c.sent and c.t <= end and c.member in members:
            first[c.member] = min(first.get(c.member, c.t), c.t)
    if not members:
        return None
    return {m: (round(first[m] - t, 2) if m in first else None) for m in sorted(members)}


def failure_figures(run: soak.Soak, result: dict[str, Any], arm: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    served = [f for f in result["served_again"] if f["event"] in ARMS[arm]["events"]]
    for name, event in zip(FAILURES, ARMS[arm]["events"], strict=True):
        f = next((x for x in served if x["event"] == event), None)
        note = next((n for n in result["events"] if n["event"] == event), None)
        if f is None or note is None or note.get("skipped"):
            out[name] = None
            continue
        end = f["t"] + f["window_s"]
        by_member = commits_resumed_by_member(run, f["t"], end)
        resumed = slowest(by_member)
        converged = f["served_again_s"]
        both = None if resumed is None or converged is None else max(resumed, converged)
        figures: dict[str, Any] = {
            "t": f["t"], "window_s": f["window_s"], "served_again_s": both,
            "converged_s": converged, "commits_resumed_s": resumed,
            "commits_resumed_by_member": by_member,
            "downtime_partition_s": f["downtime_partition_s"],
            "members_disturbed": f["members_disturbed"], "joiner_waited_s": None,
            "where": note.get("proxy") or note.get("broker")}
        if "member" in note:
            g = run.groups[GROUP]
            given = [e.t for e in g.events
                     if e.member == note["member"] and e.kind == "assign" and e.partitions]
            if given:
                figures["joiner_waited_s"] = round(min(given) - note["began"], 2)
        out[name] = figures
    return out


def one_run(arm: str, seed: int, duration_s: float, workdir: Path) -> dict[str, Any]:
    run = soak.Soak(settings_for(arm, seed, duration_s), workdir, out=print)
    result = run.run()
    figures = {"arm": arm, "seed": seed, "violations": result["violations"],
               **failure_figures(run, result, arm),
               "duplicates": result["groups"][GROUP]["duplicates"],
               "produced": result["groups"][GROUP]["produced"]}
    print(json.dumps(figures))
    return {"figures": figures, "soak": result}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


METRICS = (("served_again_s", "served again (s)"),
           ("joiner_waited_s", "joining member waited (s)"),
           ("downtime_partition_s", "partition downtime (partition-s)"),
           ("members_disturbed", "members disturbed"),
           ("commits_resumed_s", "commits acknowledged again (s)"),
           ("converged_s", "every partition owned once (s)"))


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        mine = [r["figures"] for r in runs if r["figures"]["arm"] == arm]
        if not mine:
            continue
        row: dict[str, Any] = {"runs": len(mine),
                               "violations": sum(len(f["violations"]) for f in mine),
                               "not_served": {}}
        for failure in FAILURES:
            for key, _ in METRICS:
                values = [(f[failure] or {}).get(key) for f in mine]
                row[f"{failure}.{key}"] = _median(values)
            row["not_served"][failure] = sum(
                1 for f in mine if (f[failure] or {}).get("served_again_s") is None)
        out[arm] = row
    return out


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """groupgate's median over Kafka's, for the figures the comparison is about."""
    out: dict[str, float | None] = {}
    if "groupgate" not in summary or "kafka" not in summary:
        return out
    for failure in FAILURES:
        for key in ("served_again_s", "joiner_waited_s", "downtime_partition_s"):
            mine, theirs = (summary[a].get(f"{failure}.{key}") for a in ("groupgate", "kafka"))
            if mine is None or theirs is None or (failure == "steady"
                                                  and key == "joiner_waited_s"):
                continue
            out[f"{failure}.{key}"] = (round(mine / theirs, 2) if theirs
                                       else (1.0 if mine == 0 else None))
    return out


def table(summary: dict[str, dict[str, Any]], ratio: dict[str, float | None]) -> str:
    arms = list(summary)
    lines = ["| median of runs | " + " | ".join(arms) + " | ratio |",
             "|---|" + "---:|" * (len(arms) + 1)]
    labels = {"steady": "at steady state", "joining": "while a member joins"}
    for failure in FAILURES:
        for key, label in METRICS:
            if failure == "steady" and key == "joiner_waited_s":
                continue
            cells = []
            for arm in arms:
                value = summary[arm][f"{failure}.{key}"]
                cells.append("-" if value is None else f"{value:g}")
            r = ratio.get(f"{failure}.{key}")
            lines.append(f"| {labels[failure]}: {label} | " + " | ".join(cells)
                         + f" | {'' if r is None else f'{r:.2f}'} |")
    lines.append("| invariant violations (all runs) | "
                 + " | ".join(str(summary[a]["violations"]) for a in arms) + " | |")
    return "\n".join(lines)


def _plot_run(figures: dict[str, Any], result: dict[str, Any], failure: str,
              path: Path, before_s: float = 3.0) -> Path:
    f = figures[failure]
    t0 = f["t"]
    window = min(f["window_s"], 35.0)
    timeline = [[t - t0, m, k, p] for t, m, k, p in result["groups"][GROUP]["timeline"]
                if t - t0 <= window]
    members = {m for _, m, k, _ in timeline if k in ("join", "assign")}
    arm = figures["arm"]
    event = ARMS[arm]["events"][FAILURES.index(failure)]
    run = {"timeline": timeline, "window_s": window, "partitions": result["settings"]["partitions"],
           "members": len(members), "scenario": f"{arm}: {event}",
           "target": f"Kafka {result['settings']['kafka']}",
           "protocol": "direct" if result["settings"]["direct"] else "sidecars",
           "client": "confluent-kafka", "convergence_s": f["served_again_s"],
           "downtime_partition_s": f["downtime_partition_s"],
           "members_disturbed": f["members_disturbed"]}
    return report.plot_run(run, result["machine"], {"arm": arm}, path, before_s=before_s)


def _plot_comparison(summary: dict[str, dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("steady.served_again_s", "steady: served again (s)"),
            ("joining.served_again_s", "joining: served again (s)"),
            ("joining.joiner_waited_s", "joining: joiner waited (s)")]
    arms = list(summary)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        values = [summary[arm].get(key) or 0.0 for key, _ in bars]
        xs = [j + i * width for j in range(len(bars))]
        ax.bar(xs, values, width, label=arm)
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(bars))])
    ax.set_xticklabels([label for _, label in bars], fontsize=8)
    ax.set_ylabel("seconds (median of runs)")
    ax.set_title(f"coordinator failover, detection {DETECTION_MS // 1000} s, "
                 "3 pods, 3 brokers", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def representative(runs: list[dict[str, Any]], arm: str, failure: str) -> dict[str, Any] | None:
    """The run of ``arm`` whose ``failure`` was served again in the median time."""
    mine = [r for r in runs if r["figures"]["arm"] == arm
            and (r["figures"][failure] or {}).get("served_again_s") is not None]
    mine.sort(key=lambda r: r["figures"][failure]["served_again_s"])
    return mine[(len(mine) - 1) // 2] if mine else None


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="groupgate-failover-"))
    arms = [a for a in args.arms.split(",") if a]
    runs = []
    for i in range(args.repeat):  # the arms alternate, so drift on the machine hits both
        for arm in arms:
            runs.append(one_run(arm, 200 + i, args.duration, workdir / f"{arm}-{i}"))
    summary = summarize(runs)
    ratio = ratios(summary)
    print(table(summary, ratio))
    pictures = []
    if args.plots:
        for arm in arms:
            for failure in FAILURES:
                chosen = representative(runs, arm, failure)
                if chosen is not None:
                    pictures.append(str(_plot_run(chosen["figures"], chosen["soak"], failure,
                                                  args.plots / f"{arm}-{failure}.png")))
        pictures.append(str(_plot_comparison(summary, args.plots / "comparison.png")))
        print("pictures: " + ", ".join(pictures))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine.machine_info(java_executable()),
            "arms": {a: {k: v for k, v in ARMS[a].items()} for a in arms},
            "kinds": KINDS, "joiner": JOINER, "detection_ms": DETECTION_MS,
            "summary": summary, "ratios": ratio, "pictures": pictures,
            "runs": [r["figures"] for r in runs],
            "soaks": [r["soak"] for r in runs]}, indent=1, default=str) + "\n")
    return 1 if any(r["figures"]["violations"] for r in runs) else 0
