"""``groupgate simulate``: run the discrete-event simulation of KIP-848 groups.

``groupgate simulate --seed N`` replays one seed and, when it fails, prints the violated
invariant and the tail of the event trace. ``groupgate simulate --seeds COUNT [--start S]
[--members M]`` runs many seeds and prints a summary line, listing each failing seed with the
command that replays it. ``--classic-share F`` makes each new client a classic
(JoinGroup/SyncGroup) consumer with probability F instead of the per-seed choice.
``--failover-rate R`` fails the coordinator over R times per simulated second of chaos on
average: the engine's records go through a simulated write pipeline, and a new coordinator
loaded from the acknowledged ones takes over (``--write-delay-ms`` bounds how long a write
takes to be acknowledged). ``--pod-local-rate P`` has the sidecar of a crashed dynamic member
report it gone with probability P (pod-local liveness: the engine fences it a grace after the
crash, reason ``pod-local``). The simulation itself is pure code in ``translation.simulation``.
"""

from __future__ import annotations

import argparse
import time

from translation.simulation import SimulationResult, run_seed


def configure(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="replay one seed (verbose on failure)")
    which.add_argument("--seeds", type=int, metavar="COUNT", help="run COUNT seeds")
    parser.add_argument("--start", type=int, default=0, help="first seed with --seeds (default 0)")
    parser.add_argument(
        "--members", type=int, default=None, help="members per group (default: chosen per seed)"
    )
    parser.add_argument(
        "--classic-share",
        type=float,
        default=None,
        metavar="F",
        help="probability that a new client speaks the classic protocol (default: per seed)",
    )
    parser.add_argument(
        "--failover-rate",
        type=float,
        default=None,
        metavar="R",
        help="coordinator failovers per simulated second of chaos (default 0: none)",
    )
    parser.add_argument(
        "--write-delay-ms",
        type=int,
        default=None,
        metavar="MS",
        help="with failovers: a write is acknowledged 1 to MS ms after it is made (default 30)",
    )
    parser.add_argument(
        "--pod-local-rate",
        type=float,
        default=None,
        metavar="P",
        help="probability that a crashed dynamic member is reported gone by its sidecar "
        "(default 0)",
    )
    parser.add_argument(
        "--trace", type=int, default=40, help="event trace lines to print on failure (default 40)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print every seed's stats")


def _report_failure(result: SimulationResult, args: argparse.Namespace) -> None:
    print(f"seed {result.seed} FAILED: {result.violation}")
    if result.knobs is not None:
        print(f"  scenario: {result.knobs}")
    print("  last events:")
    for line in result.trace:
        print(f"    {line}")
    print(f"  replay: {_replay(result, args)}")


def _knobs(args: argparse.Namespace) -> dict[str, object]:
    knobs: dict[str, object] = {"trace_length": args.trace}
    if args.classic_share is not None:
        knobs["classic_share"] = args.classic_share
    if args.failover_rate is not None:
        knobs["failover_rate"] = args.failover_rate
    if args.write_delay_ms is not None:
        knobs["write_delay_ms"] = args.write_delay_ms
    if args.pod_local_rate is not None:
        knobs["pod_local_rate"] = args.pod_local_rate
    return knobs


def _replay(result: SimulationResult, args: argparse.Namespace) -> str:
    replay = result.replay
    if args.members is not None:
        replay += f" --members {args.members}"
    if args.classic_share is not None:
        replay += f" --classic-share {args.classic_share}"
    if args.failover_rate is not None:
        replay += f" --failover-rate {args.failover_rate}"
    if args.write_delay_ms is not None:
        replay += f" --write-delay-ms {args.write_delay_ms}"
    if args.pod_local_rate is not None:
        replay += f" --pod-local-rate {args.pod_local_rate}"
    return replay


def run(args: argparse.Namespace) -> int:
    if args.classic_share is not None and not 0.0 <= args.classic_share <= 1.0:
        print("--classic-share must be between 0 and 1")
        return 2
    if args.failover_rate is not None and args.failover_rate < 0:
        print("--failover-rate must not be negative")
        return 2
    if args.pod_local_rate is not None and not 0.0 <= args.pod_local_rate <= 1.0:
        print("--pod-local-rate must be between 0 and 1")
        return 2
    if args.write_delay_ms is not None and args.write_delay_ms < 1:
        print("--write-delay-ms must be at least 1")
        return 2
    if args.seed is not None:
        started = time.perf_counter()
        result = run_seed(args.seed, args.members, **_knobs(args))
        elapsed = time.perf_counter() - started
        if not result.ok:
            _report_failure(result, args)
            return 1
        stats = ", ".join(f"{k}={v}" for k, v in sorted(result.stats.items()))
        print(
            f"seed {result.seed} ok: {result.events} events, {result.sim_time_ms} ms simulated, "
            f"{elapsed:.2f}s wall"
        )
        if args.verbose:
            print(f"  {stats}")
        return 0

    started = time.perf_counter()
    failures: list[SimulationResult] = []
    events = 0
    for seed in range(args.start, args.start + args.seeds):
        result = run_seed(seed, args.members, **_knobs(args))
        events += result.events
        if args.verbose:
            print(f"seed {seed}: {'ok' if result.ok else 'FAILED'} ({result.events} events)")
        if not result.ok:
            failures.append(result)
    elapsed = time.perf_counter() - started
    print(
        f"{args.seeds - len(failures)}/{args.seeds} seeds passed "
        f"(seeds {args.start}..{args.start + args.seeds - 1}, {events} events, {elapsed:.1f}s)"
    )
    for result in failures:
        print(f"  seed {result.seed}: {result.violation}")
        print(f"    replay: {_replay(result, args)}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="groupgate simulate", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
