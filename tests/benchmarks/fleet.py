"""``dev/bench fleet``: several sidecars, one group: what members behind the coordinating
sidecar and behind the others see, and a SIGKILL of the coordinating sidecar.

(Decision record 0014 compares forward and redirect routing with this command, run at the
commit that still had the redirect prototype.)

Each run is a scripted soak (:mod:`tests.benchmarks.soak.run`) in pods (network namespaces,
a sidecar each, the broker on the bridge): one group, ``--members-per-pod`` members in every pod
(confluent-kafka, alternately ``group.protocol=consumer`` and classic ``cooperative-sticky``,
asynchronous commits after every record, so many are in flight), continuous production, and
three events: a member joins at 25 s (scale-out), the sidecar coordinating the group is
SIGKILLed at 50 s and started again a second later (as Kubernetes restarts a container), a
member joins at 90 s. Reported (medians over runs):

* commit latency as the members see it (commit callback minus send), for members in the
  coordinating pod and for the others, median and p99;
* how long after the scale-out join and after the coordinator kill the group was served again
  (every partition owned by exactly one live member), and the partition-seconds unowned;
* CPU seconds used by all sidecars;
* the soak's invariants (no partition owned twice, nothing lost, no offset backwards, no member
  starting below a landed commit).

``--json`` writes every run with the machine; the markdown table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from proxy.commands import machine
from tests.benchmarks.soak import run as soak
from tests.testbed.artifacts import java_executable

GROUP = "cooperative"
SCRIPT = ("25:join:cooperative", "50:coordinator-kill:cooperative", "90:join:cooperative")
KINDS = ("confluent/consumer/async", "confluent/classic/async")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--members-per-pod", type=int, default=2)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--json", metavar="FILE", type=Path)
    parser.add_argument("--workdir", type=Path, default=None)


def settings_for(args: argparse.Namespace, seed: int) -> soak.Settings:
    initial = tuple(f"{GROUP}:{KINDS[i % len(KINDS)]}@{pod}"
                    for pod in range(1, args.pods + 1) for i in range(args.members_per_pod))
    return soak.Settings(duration_s=args.duration, seed=seed, pods=args.pods,
                         groups=(GROUP,), initial=initial, script=SCRIPT,
                         max_members=args.pods * args.members_per_pod + 4,
                         catch_up_s=120.0)


def commit_latencies(run: soak.Soak) -> dict[str, list[float]]:
    """Commit latencies (ms) of members in the pod that held the group at the time and of the
    others."""
    holders = sorted((t, pod) for t, group, pod in run.holders if group == GROUP)
    out: dict[str, list[float]] = {"coordinating pod": [], "other pods": []}
    for commit in run.groups[GROUP].commits:
        if commit.sent is None:
            continue
        holder = None
        for t, pod in holders:
            if t <= commit.sent:
                holder = pod
        pod = commit.member.rpartition("@")[2]
        key = "coordinating pod" if holder is not None and pod == holder else "other pods"
        out[key].append((commit.t - commit.sent) * 1000)
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(args: argparse.Namespace, seed: int, workdir: Path) -> dict[str, Any]:
    run = soak.Soak(settings_for(args, seed), workdir, out=print)
    result = run.run()
    latencies = commit_latencies(run)
    served = {f["event"]: f for f in result["served_again"]}
    figures: dict[str, Any] = {
        "routing": "forward", "seed": seed,
        "violations": result["violations"],
        "commit_ms": {k: {"n": len(v), "p50": _pct(v, 0.5), "p99": _pct(v, 0.99)}
                      for k, v in latencies.items()},
        "scale_out": served.get("join"),
        "coordinator_kill": served.get("coordinator-kill"),
        "sidecar_cpu_s": round(sum(c["cpu_s"] for c in result["proxy_cpu_s"].values()), 2),
        "duplicates": result["groups"][GROUP]["duplicates"],
        "produced": result["groups"][GROUP]["produced"],
    }
    print(json.dumps(figures))
    return {"figures": figures, "soak": result}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: list[dict[str, Any]], routings: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for routing in routings:
        mine = [r["figures"] for r in runs if r["figures"]["routing"] == routing]

        def served(event: str, field: str, mine: list[dict[str, Any]] = mine) -> float | None:
            return _median([(f[event] or {}).get(field) for f in mine])

        out[routing] = {
            "runs": len(mine),
            "commit_p50_local_ms": _median([f["commit_ms"]["coordinating pod"]["p50"]
                                            for f in mine]),
            "commit_p99_local_ms": _median([f["commit_ms"]["coordinating pod"]["p99"]
                                            for f in mine]),
            "commit_p50_other_ms": _median([f["commit_ms"]["other pods"]["p50"] for f in mine]),
            "commit_p99_other_ms": _median([f["commit_ms"]["other pods"]["p99"] for f in mine]),
            "scale_out_served_s": served("scale_out", "served_again_s"),
            "scale_out_downtime_ps": served("scale_out", "downtime_partition_s"),
            "kill_served_s": served("coordinator_kill", "served_again_s"),
            "kill_downtime_ps": served("coordinator_kill", "downtime_partition_s"),
            "sidecar_cpu_s": _median([f["sidecar_cpu_s"] for f in mine]),
            "violations": sum(len(f["violations"]) for f in mine),
        }
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    rows = [("commit p50, coordinating pod (ms)", "commit_p50_local_ms"),
            ("commit p99, coordinating pod (ms)", "commit_p99_local_ms"),
            ("commit p50, other pods (ms)", "commit_p50_other_ms"),
            ("commit p99, other pods (ms)", "commit_p99_other_ms"),
            ("scale-out: served again (s)", "scale_out_served_s"),
            ("scale-out: unowned (partition-s)", "scale_out_downtime_ps"),
            ("coordinator SIGKILL: served again (s)", "kill_served_s"),
            ("coordinator SIGKILL: unowned (partition-s)", "kill_downtime_ps"),
            ("CPU of all sidecars (s)", "sidecar_cpu_s"),
            ("invariant violations", "violations")]
    names = list(summary)
    lines = ["| median of runs | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for label, key in rows:
        cells = []
        for name in names:
            value = summary[name][key]
            cells.append("-" if value is None else
                         f"{value:.1f}" if isinstance(value, float) else str(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="groupgate-fleet-"))
    runs = [one_run(args, 100 + i, workdir / f"run-{i}") for i in range(args.repeat)]
    summary = summarize(runs, ["forward"])
    print(table(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine.machine_info(java_executable()),
            "script": SCRIPT, "kinds": KINDS, "pods": args.pods,
            "members_per_pod": args.members_per_pod, "summary": summary,
            "runs": [r["figures"] for r in runs],
            "soaks": [r["soak"] for r in runs]}, indent=1, default=str) + "\n")
    return 1 if any(r["figures"]["violations"] for r in runs) else 0
