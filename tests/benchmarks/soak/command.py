"""``dev/bench soak``: real clients under random failures, with the offset and ownership
invariants checked on everything they did (see :mod:`tests.benchmarks.soak.run`).

Prints each event as it is applied and, at the end, one table per run; ``--json`` writes the
full result (settings, machine, events, per-group figures and violations). Exits 1 when an
invariant was violated. Needs the test bed (Kafka jars in the cache, a JDK).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from tests.benchmarks.soak import run as soak


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=120.0,
                        help="seconds of random events (production and checks run longer)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--events", default=",".join(soak.EVENT_KINDS),
                        help=f"comma separated among {', '.join(soak.EVENT_KINDS)}; with "
                             f"--pods also {', '.join(soak.FLEET_EVENT_KINDS)}")
    parser.add_argument("--gap", default="5,10",
                        help="seconds between events: MIN,MAX (drawn uniformly)")
    parser.add_argument("--pods", type=int, default=0,
                        help="run the members in N pods (network namespaces), each behind its "
                             "own sidecar, as in the Kubernetes deployment (root; default 0: "
                             "one proxy for every member)")
    parser.add_argument("--brokers", type=int, default=1,
                        help="Kafka nodes (3: the broker side fails over too, broker-kill)")
    parser.add_argument("--groups", default=",".join(soak.GROUPS),
                        help=f"comma separated among {', '.join(soak.GROUPS)}")
    parser.add_argument("--member", action="append", default=[], metavar="SPEC",
                        help="a member at the start, GROUP:LIBRARY/PROTOCOL/COMMIT[@POD] "
                             "(repeat; default: two random kinds per group)")
    parser.add_argument("--script", action="append", default=[],
                        metavar="SECONDS:KIND[:GROUP[:WHO]]",
                        help="an event at a fixed time instead of random ones (repeat); WHO: "
                             "LIBRARY/PROTOCOL of the member a leave, kill or stall picks (it "
                             "waits until its group has formed)")
    parser.add_argument("--fault-seconds", type=float, default=10.0,
                        help="how long coordinator-freeze, join-coordinator-freeze, "
                             "coordinator-cutoff and slow-link last")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--session-timeout-ms", type=int, default=0,
                        help="members' sessions (new-protocol members' from the proxy, classic "
                             "members' own); default 9 s, with --pods "
                             f"{soak.FLEET_SESSION_MS} ms: with --pods at least the heartbeat "
                             "interval + the broker session (6 s) + 11 s (docs/operations.md)")
    parser.add_argument("--heartbeat-interval-ms", type=int,
                        default=soak.Settings.heartbeat_interval_ms,
                        help="handed to new-protocol members by the proxy")
    parser.add_argument("--json", metavar="FILE", type=Path)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep logs here (default: a temporary directory, kept on failure)")


def run(args: argparse.Namespace) -> int:
    low, high = (float(x) for x in args.gap.split(","))
    settings = soak.Settings(duration_s=args.duration, seed=args.seed,
                             min_event_gap_s=low, max_event_gap_s=high,
                             events=tuple(e for e in args.events.split(",") if e),
                             pods=args.pods, brokers=args.brokers,
                             groups=tuple(g for g in args.groups.split(",") if g),
                             initial=tuple(args.member), script=tuple(args.script),
                             partitions=args.partitions, fault_s=args.fault_seconds,
                             session_timeout_ms=args.session_timeout_ms,
                             heartbeat_interval_ms=args.heartbeat_interval_ms)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="groupgate-soak-"))
    result = soak.Soak(settings, workdir).run()
    print(soak.summary(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    if result["violations"]:
        print(f"logs kept in {workdir}")
        return 1
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
