"""``dev/bench rebalance``: what a rebalance costs the consumers, per target and scenario.

Starts one broker of the target (one at a time), and for every protocol, group size and
scenario runs the scenario ``--repeat`` times with fresh topics and groups (see
:mod:`tests.benchmarks.rebalance.scenarios`). After each run the JSON file is rewritten, so a long
session that is cut short keeps what it measured. At the end it prints the summary table
(medians and min-max) and draws one picture per (protocol, scenario, size): the run with the
median downtime. ``--report`` only re-renders the table and pictures from JSON files.

``--scenario crash --profile bench|defaults`` runs the crash harness instead
(:mod:`tests.benchmarks.crash`, also ``dev/bench crash``): the time until a SIGKILLed member's
partitions have another owner, on ``classic-3.9``, ``native-4.4`` (``native-4.x`` is the same
Kafka 4.4) or ``groupgate`` with pod-local liveness, with the benchmark's timeouts or Kafka's
defaults; only ``--members``, ``--repeat``, ``--json`` and ``--workdir`` apply there.
``--report`` of its files prints its table (``--summary FILE``: as JSON; ``--plots DIR``: its
picture).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.commands import machine
from tests.benchmarks import crash
from tests.benchmarks.rebalance import report, scenarios, targets
from tests.testbed.artifacts import java_executable


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=sorted({*targets.TARGETS, *crash.TARGETS}),
                        help="what to measure (native-4.4: native-4.x, with --profile)")
    parser.add_argument("--members", default="10", help="group sizes, comma separated")
    parser.add_argument(
        "--scenario", default="all",
        help=f"comma separated among {', '.join(scenarios.SCENARIOS)}, or 'all'",
    )
    parser.add_argument(
        "--protocol", action="append", default=None,
        help="client protocol: range (eager), cooperative-sticky, consumer (KIP-848); "
        "repeatable; default: the target's references",
    )
    parser.add_argument("--client", choices=scenarios.CLIENTS, default="confluent")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", type=Path, help="write the runs as JSON")
    parser.add_argument("--plots", metavar="DIR", type=Path, default=None,
                        help="write one PNG per (protocol, scenario, size) here")
    parser.add_argument("--partitions-per-member", type=int, default=10)
    parser.add_argument("--rate-per-partition", type=float, default=2.0,
                        help="records per second per partition")
    parser.add_argument("--members-per-process", type=int, default=10)
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds the group must stay converged to end a run")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSON",
                        help="only render the table (and --plots) from these result files")
    parser.add_argument("--profile", choices=crash.PROFILES, default=None,
                        help="with --scenario crash: run the crash harness with the benchmark's "
                        "timeouts (bench: 1 s heartbeat, 6 s session) or Kafka's defaults")
    parser.add_argument("--summary", metavar="FILE", type=Path,
                        help="with --report of crash-harness files: write the summary as JSON")


def _versions(target: targets.Target) -> dict[str, Any]:
    import confluent_kafka

    from tests.testbed.distributions import get_line

    line = get_line(target.line)
    return {
        "kafka_broker": line.version,
        "kafka_java_tools": line.tools_version,
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
    }


def _write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")  # timelines are long
    tmp.replace(path)


def _plot_all(docs: list[dict[str, Any]], out: Path) -> list[Path]:
    written = []
    for doc in docs:
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for run in doc["runs"]:
            groups.setdefault(tuple(run[k] for k in report.KEY), []).append(run)
        for key, runs in groups.items():
            target, protocol, client, scenario, members = key
            name = f"rebalance-{target}-{protocol}-{client}-{scenario}-{members}.png"
            versions = dict(doc["versions"].get(target, {}))
            written.append(report.plot_run(report.representative(runs), doc["machine"],
                                           versions, out / name))
    return written


def _render(docs: list[dict[str, Any]], plots: Path | None) -> None:
    runs = [r for d in docs for r in d["runs"]]
    rows = report.summarize(runs)
    print(report.markdown_table(rows))
    targets_run = {r["target"] for r in runs}
    for baseline in ("classic-3.9", "native-4.x"):
        if {baseline, "groupgate"} <= targets_run:
            print(report.comparison_table(rows, baseline, "groupgate"))
    if plots is not None:
        for path in _plot_all(docs, plots):
            print(f"picture: {path}")


def _run_crash(args: argparse.Namespace) -> int:
    if args.scenario != "crash":
        print("--profile goes with --scenario crash", file=sys.stderr)
        return 2
    target = "native-4.4" if args.target == "native-4.x" else args.target
    if target is not None and target not in crash.TARGETS:
        print(f"the crash harness measures {', '.join(crash.TARGETS)}", file=sys.stderr)
        return 2
    return crash.run(argparse.Namespace(
        target=target, profile=args.profile, members=args.members, repeat=args.repeat,
        json=args.json, workdir=args.workdir, report=None, summary=None, plots=None))


def run(args: argparse.Namespace) -> int:
    if args.report:
        docs = [json.loads(p.read_text()) for p in args.report]
        if docs and all(d.get("benchmark") == "crash" for d in docs):
            return crash.report(args.report, args.summary, args.plots)
        _render(docs, args.plots)
        return 0
    if args.profile is not None:
        return _run_crash(args)
    if args.target == "native-4.4":
        print("native-4.4 is a crash-harness target (--scenario crash --profile P); "
              "here: native-4.x", file=sys.stderr)
        return 2
    if not args.target:
        print("--target is required (or --report)", file=sys.stderr)
        return 2
    target = targets.make_target(args.target)
    protocols = args.protocol or list(target.default_protocols)
    for p in protocols:
        if p not in target.protocols:
            print(f"{target.name} does not serve {p!r} (it serves {target.protocols})",
                  file=sys.stderr)
            return 2
    names = list(scenarios.SCENARIOS) if args.scenario == "all" else _csv(args.scenario)
    for name in names:
        if name not in scenarios.SCENARIOS:
            print(f"unknown scenario {name!r}", file=sys.stderr)
            return 2
    if args.client == "java" and "slow" in names:
        names.remove("slow")
        print("the Java VerifiableConsumer cannot block in a callback: skipping 'slow'")
    sizes = [int(x) for x in _csv(args.members)]
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="groupgate-rebalance-")) if own else args.workdir
    info = machine.machine_info(java_executable())
    doc: dict[str, Any] = {
        "benchmark": "rebalance",
        "command": "dev/bench rebalance " + " ".join(sys.argv[2:]),
        "machine": info,
        "versions": {},
        "targets": {},
        "settings": {
            "slow_callback_s": scenarios.SLOW_SECONDS,
            "settle_s": args.settle,
            "partitions_per_member": args.partitions_per_member,
            "rate_per_partition": args.rate_per_partition,
            "members_per_process": args.members_per_process,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "runs": [],
    }
    failures = 0
    t0 = time.monotonic()
    print(f"starting {target.name} ...", flush=True)
    target.start(workdir / target.name)
    try:
        doc["versions"][target.name] = _versions(target)
        doc["targets"][target.name] = target.describe()
        for size in sizes:
            for protocol in protocols:
                for scenario in names:
                    for i in range(args.repeat):
                        settings = scenarios.Settings(
                            members=size, scenario=scenario, protocol=protocol,
                            client=args.client,
                            partitions_per_member=args.partitions_per_member,
                            rate_per_partition=args.rate_per_partition,
                            members_per_process=args.members_per_process,
                            settle_s=args.settle,
                        )
                        print(f"[{time.monotonic() - t0:6.0f}s] {target.name} {protocol} "
                              f"{args.client} {scenario} N={size} run {i + 1}/{args.repeat}",
                              flush=True)
                        try:
                            result = scenarios.run_scenario(
                                target, settings, workdir / target.name,
                                log=lambda m: print(m, flush=True))
                        except scenarios.ScenarioError as exc:
                            failures += 1
                            print(f"  failed: {exc}", flush=True)
                            continue
                        result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime())
                        doc["runs"].append(result)
                        conv = result["convergence_s"]
                        print(f"  convergence {'-' if conv is None else f'{conv:.2f}s'}, "
                              f"downtime {result['downtime_partition_s']:.1f} partition-s, "
                              f"disturbed {result['members_disturbed']}, duplicates "
                              f"{result['duplicates']}, peak lag {result['peak_lag_records']}",
                              flush=True)
                        _write(args.json, doc)
    finally:
        target.stop()
        if own and not failures:
            shutil.rmtree(workdir, ignore_errors=True)
        elif own:  # the broker's and the proxy's logs of a failed run are worth reading
            print(f"{failures} run(s) failed: logs kept in {workdir}", flush=True)
    doc["settings"]["elapsed_s"] = round(time.monotonic() - t0, 1)
    _write(args.json, doc)
    _render([doc], args.plots)
    return 1 if failures else 0
