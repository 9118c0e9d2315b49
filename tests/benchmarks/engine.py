"""``dev/bench engine``: assignor timings, groupgate's against Kafka's own, same inputs.

For every workload shape (members x partitions per member x topics, after Kafka's assignor JMH
benchmark), subscription kind (homogeneous, heterogeneous) and assignor (uniform, range) it times
the *full* assignment (nobody owns anything) and the *incremental* one (a stable target plus one
new member). Inputs are generated deterministically in Python (``tests.benchmarks.workload``) and
written to files that ``tests/benchmarks/java/AssignorBench.java`` reads, so Kafka's assignors from
``org.apache.kafka:kafka-group-coordinator`` run on the very same group specs in the same run.
Only ``assign()`` is timed on both sides; the JVM is warmed up first. Results go to a table on
stdout and, with ``--json``, to a file that also records the machine and the versions.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.commands import machine
from tests.testbed.artifacts import java_executable

KAFKA_VERSION = "4.4.0"
KAFKA_COORDINATES = [f"org.apache.kafka:kafka-group-coordinator:{KAFKA_VERSION}"]
JAVA_SOURCE = Path(__file__).resolve().parent / "java" / "AssignorBench.java"

# (members, partitions per member, topics). The full cross product of Kafka's JMH sizes
# (3 x 3 x 3) times 2 kinds x 2 assignors x full/incremental is 216 timings per side, too long
# for CPython on a shared machine; this subset keeps every size on each axis.
FULL_GRID: list[tuple[int, int, int]] = [
    *[(m, ppm, 10) for m in (100, 1000, 10000) for ppm in (5, 10, 50)],
    *[(m, 10, t) for m in (100, 1000, 10000) for t in (100, 1000)],
]
QUICK_GRID: list[tuple[int, int, int]] = [(100, 5, 10), (100, 10, 100), (1000, 10, 10)]
GRID_NOTE = (
    "subset of Kafka's JMH grid: members {100,1000,10000} x partitions/member {5,10,50} at 10 "
    "topics, plus topics {100,1000} at 10 partitions/member"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", type=Path, help="write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="a tiny grid (smoke test)")
    parser.add_argument(
        "--runs", type=int, default=None, help="timed runs per case (default 7, quick 3)"
    )
    parser.add_argument(
        "--java-warmup-ms",
        type=int,
        default=None,
        help="JVM warm-up time per case before timing (default 2000, quick 300)",
    )
    parser.add_argument(
        "--no-java", action="store_true", help="skip Kafka's assignors (no JVM, no Maven)"
    )
    parser.add_argument("--no-assignors", action="store_true", help="skip the assignor timings")
    parser.add_argument(
        "--no-engine",
        action="store_true",
        help="skip the steady-state heartbeat and memory-per-member rows",
    )


@dataclass
class Case:
    members: int
    partitions_per_member: int
    topics: int
    homogeneous: bool
    assignor: str
    mode: str  # "full" or "incremental"
    input_file: Path
    ours_ms: list[float] = field(default_factory=list)
    ours_digest: str = ""
    ours_moved: int = 0
    kafka_ms: list[float] = field(default_factory=list)
    kafka_digest: str = ""
    kafka_moved: int = -1
    kafka_warmup: int = 0

    @property
    def label(self) -> str:
        kind = "homo" if self.homogeneous else "hetero"
        return (
            f"{self.assignor:7} {kind:6} {self.mode:11} "
            f"{self.members:>5}m x{self.partitions_per_member:>3} {self.topics:>4}t"
        )


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _time_call(fn: Callable[[], object], runs: int) -> tuple[list[float], object]:
    """Run ``fn`` once untimed, then ``runs`` timed calls with the collector paused (as timeit
    does). Calls slower than a second are repeated at most three times."""
    result = fn()
    times: list[float] = []
    for i in range(runs):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            result = fn()
            elapsed = time.perf_counter() - t0
        finally:
            gc.enable()
        times.append(elapsed * 1000)
        if elapsed > 1.0 and i >= 2:
            break
    return times, result


def kafka_classpath() -> list[Path]:
    """Jars of Kafka's group coordinator and its runtime dependencies (resolved and cached)."""
    from tests.testbed.artifacts import classpath

    return classpath(f"kafka-group-coordinator-{KAFKA_VERSION}", KAFKA_COORDINATES)


def _compiled_harness(jars: Sequence[Path]) -> Path:
    """Compile AssignorBench.java once per source version into the cache directory."""
    from tests.testbed.artifacts import cache_root

    source = JAVA_SOURCE.read_bytes()
    tag = hashlib.sha256(source + KAFKA_VERSION.encode()).hexdigest()[:12]
    out = cache_root() / "bench" / f"assignor-bench-{tag}"
    if (out / "AssignorBench.class").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cp = os.pathsep.join(str(j) for j in jars)
    proc = subprocess.run(
        ["javac", "-nowarn", "-d", str(out), "-cp", cp, str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"javac failed:\n{proc.stderr[-3000:]}")
    return out


def _run_java(cases: list[Case], runs: int, warmup_ms: int) -> None:
    from tests.testbed.artifacts import require_java

    java = require_java()
    jars = kafka_classpath()
    classes = _compiled_harness(jars)
    cp = os.pathsep.join([*(str(j) for j in jars), str(classes)])
    by_file = {str(c.input_file): c for c in cases}
    args = [f"{c.assignor}={c.input_file}" for c in cases]
    cmd = [java, "-Xms2g", "-Xmx6g", "-cp", cp, "AssignorBench", str(warmup_ms), "3", str(runs)]
    with subprocess.Popen(
        [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            row = json.loads(line)
            case = by_file[row["file"]]
            case.kafka_ms = [float(x) for x in row["runs"]]
            case.kafka_digest = row["digest"]
            case.kafka_moved = int(row["moved"])
            case.kafka_warmup = int(row["warmup"])
            print(f"  kafka  {case.label}  {_median(case.kafka_ms):9.3f} ms", flush=True)
        stderr = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"AssignorBench failed ({proc.returncode}):\n{stderr[-3000:]}")


def machine_info() -> dict[str, Any]:
    return dict(machine.machine_info(java_executable()), kafka_group_coordinator=KAFKA_VERSION)


def _prepare_and_time_ours(
    grid: list[tuple[int, int, int]], workdir: Path, runs: int
) -> list[Case]:
    from tests.benchmarks.workload import (
        ImageDescriber,
        assignment_digest,
        build_workload,
        moved_partitions,
        with_new_member,
        write_case,
    )
    from translation.assignors import PartitionAssignor, RangeAssignor, UniformAssignor

    assignors: list[PartitionAssignor] = [UniformAssignor(), RangeAssignor()]
    cases: list[Case] = []
    for members, ppm, topics in grid:
        for homogeneous in (True, False):
            base = build_workload(members, ppm, topics, homogeneous=homogeneous)
            describer = ImageDescriber(base.image)
            for assignor in assignors:
                workload = base
                stable: dict[str, dict[Any, frozenset[int]]] = {}
                for mode in ("full", "incremental"):
                    if mode == "incremental":
                        workload = with_new_member(base, stable)
                    kind = "homo" if homogeneous else "hetero"
                    path = workdir / f"{assignor.name}-{kind}-{mode}-{members}-{ppm}-{topics}.txt"
                    write_case(workload, path)
                    case = Case(members, ppm, topics, homogeneous, assignor.name, mode, path)
                    group = workload.group

                    def call(
                        a: PartitionAssignor = assignor,
                        g: Any = group,
                        d: ImageDescriber = describer,
                    ) -> dict[str, dict[Any, frozenset[int]]]:
                        return a.assign(g, d)

                    case.ours_ms, result = _time_call(call, runs)
                    assert isinstance(result, dict)
                    case.ours_digest = assignment_digest(result)
                    case.ours_moved = moved_partitions(group, result)
                    if mode == "full":
                        stable = result
                    print(f"  ours   {case.label}  {_median(case.ours_ms):9.3f} ms", flush=True)
                    cases.append(case)
    return cases


def _table(cases: list[Case], with_java: bool) -> str:
    head = f"{'assignor':7} {'kind':6} {'mode':11} {'shape':18} {'ours ms':>9} {'spread':>15}"
    if with_java:
        head += f" {'kafka ms':>9} {'spread':>15} {'ratio':>7} {'moved o/k':>13} same"
    lines = [head, "-" * len(head)]
    for c in cases:
        row = f"{c.label}  {_median(c.ours_ms):9.3f} {min(c.ours_ms):7.2f}-{max(c.ours_ms):<7.2f}"
        if with_java and c.kafka_ms:
            ratio = _median(c.ours_ms) / _median(c.kafka_ms)
            moved = f"{c.ours_moved}/{c.kafka_moved}"
            same = "yes" if c.ours_digest == c.kafka_digest else "no"
            row += (
                f" {_median(c.kafka_ms):9.3f} {min(c.kafka_ms):7.3f}-{max(c.kafka_ms):<7.3f}"
                f" {ratio:7.1f} {moved:>13} {same}"
            )
        lines.append(row)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    quick = bool(args.quick)
    grid = QUICK_GRID if quick else FULL_GRID
    runs = args.runs or (3 if quick else 7)
    warmup_ms = args.java_warmup_ms or (300 if quick else 2000)
    with_java = not args.no_java
    info = machine_info()
    print(
        f"dev/bench engine: {info['cpu_model']}, {info['cores']} cores, "
        f"Python {info['python']}, {info['java']}"
    )
    print(f"grid: {'quick' if quick else GRID_NOTE}; {runs} timed runs per case (median)")
    started = time.time()
    cases: list[Case] = []
    java_error = None
    if not args.no_assignors:
        with tempfile.TemporaryDirectory(prefix="groupgate-bench-") as tmp:
            cases = _prepare_and_time_ours(grid, Path(tmp), runs)
            if with_java:
                try:
                    _run_java(cases, runs, warmup_ms)
                except Exception as exc:  # the Python figures are still worth printing
                    java_error = str(exc)
                    print(f"Kafka side failed: {exc}", file=sys.stderr)
        print()
        print(_table(cases, with_java and java_error is None))
        print(
            "\nours/Kafka ratio of medians; moved o/k = partitions that changed owner"
            " (ours/Kafka); same = identical assignment"
        )
    engine_rows: list[dict[str, Any]] = []
    if not args.no_engine:
        print("\nengine: steady-state heartbeats (one group, 10 topics, 2 partitions/member)")
        for members in QUICK_ENGINE_SIZES if quick else ENGINE_SIZES:
            row = _engine_steady_state(members, max(50_000, 5 * members))
            engine_rows.append(row)
            print(
                f"  {members:>6} members: {row['heartbeats_per_s']:>10,.0f} heartbeats/s "
                f"({row['us_per_heartbeat']:.1f} us each), "
                f"{row['bytes_per_member'] / 1024:.1f} KiB/member, "
                f"group formed in {row['join_s']} s",
                flush=True,
            )
    if args.json:
        doc = {
            "command": "dev/bench engine" + (" --quick" if quick else ""),
            "started_unix": started,
            "duration_s": round(time.time() - started, 1),
            "machine": info,
            "grid": "quick" if quick else GRID_NOTE,
            "runs_per_case": runs,
            "java_warmup_ms": warmup_ms if with_java else None,
            "java_error": java_error,
            "timing": (
                "median of timed assign() calls; Python: one untimed call first, collector "
                "paused while timing; Java: warm-up by time, then timed calls"
            ),
            "engine": engine_rows,
            "engine_note": (
                "steady state: every member at the current epoch, heartbeats without changes, "
                "round-robin, one thread; bytes_per_member = tracemalloc-traced memory still "
                "allocated after the group settled, per member"
            ),
            "assignors": [
                {
                    "assignor": c.assignor,
                    "subscription": "homogeneous" if c.homogeneous else "heterogeneous",
                    "mode": c.mode,
                    "members": c.members,
                    "partitions_per_member": c.partitions_per_member,
                    "topics": c.topics,
                    "partitions": c.members * c.partitions_per_member,
                    "ours_ms": {
                        "median": _median(c.ours_ms),
                        "min": min(c.ours_ms),
                        "max": max(c.ours_ms),
                        "runs": c.ours_ms,
                    },
                    "kafka_ms": (
                        {
                            "median": _median(c.kafka_ms),
                            "min": min(c.kafka_ms),
                            "max": max(c.kafka_ms),
                            "runs": c.kafka_ms,
                            "warmup_calls": c.kafka_warmup,
                        }
                        if c.kafka_ms
                        else None
                    ),
                    "ratio": (_median(c.ours_ms) / _median(c.kafka_ms)) if c.kafka_ms else None,
                    "moved_ours": c.ours_moved,
                    "moved_kafka": c.kafka_moved if c.kafka_ms else None,
                    "same_assignment": (c.ours_digest == c.kafka_digest) if c.kafka_ms else None,
                }
                for c in cases
            ],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if java_error is None else 1


# --------------------------------------------------------------------------------------------
# Engine: steady-state heartbeats and memory per member (translation.coordinator)

ENGINE_SIZES = [1000, 10000]
QUICK_ENGINE_SIZES = [200]


def _engine_steady_state(members: int, heartbeats: int) -> dict[str, Any]:
    """Join ``members`` consumers to one group, run them to a stable assignment, then time
    steady-state heartbeats (current epoch, nothing changed) round-robin.

    Memory per member is what ``tracemalloc`` sees still allocated by the coordinator once the
    group settled (collector run first; allocations made by this module, i.e. the simulated
    clients' bookkeeping, are left out), divided by the member count. Tracing covers only
    group formation, not the timed heartbeats.
    """
    import tracemalloc
    import uuid as uuid_mod

    from translation.assignors import RangeAssignor, UniformAssignor
    from translation.config import GroupConfig
    from translation.coordinator import GroupCoordinator
    from translation.heartbeat import ConsumerGroupHeartbeatRequest
    from translation.topics import TopicMetadata, TopicsImage

    topics = 10
    per_topic = max(1, members * 2 // topics)
    metas = [
        TopicMetadata(uuid_mod.UUID(int=k + 1), f"bench-{k}", per_topic) for k in range(topics)
    ]
    names = [m.name for m in metas]
    image = TopicsImage.of(metas)
    member_ids = [f"member-{i:06d}" for i in range(members)]
    epochs: dict[str, int] = dict.fromkeys(member_ids, 0)
    owned: dict[str, list[tuple[Any, list[int]]]] = {m: [] for m in member_ids}

    gc.collect()
    tracemalloc.start()
    config = GroupConfig(assignors=[UniformAssignor(), RangeAssignor()])
    coordinator = GroupCoordinator(config, image)
    now = 0
    t_join = time.perf_counter()
    for member_id in member_ids:
        response, _ = coordinator.heartbeat(
            ConsumerGroupHeartbeatRequest(
                group_id="bench",
                member_id=member_id,
                member_epoch=0,
                rebalance_timeout_ms=300_000,
                subscribed_topic_names=names,
                topic_partitions=[],
            ),
            now,
        )
        if response.error_code:
            raise RuntimeError(f"join failed: {response.error_code} {response.error_message}")
        epochs[member_id] = response.member_epoch
        if response.assignment is not None:
            owned[member_id] = [(tp.topic_id, list(tp.partitions)) for tp in response.assignment]
    join_s = time.perf_counter() - t_join

    # Reconcile: every member heartbeats with what it owns until nothing changes.
    rounds = 0
    while True:
        rounds += 1
        changed = False
        now += 1000
        coordinator.tick(now)
        for member_id in member_ids:
            response, _ = coordinator.heartbeat(
                ConsumerGroupHeartbeatRequest(
                    group_id="bench",
                    member_id=member_id,
                    member_epoch=epochs[member_id],
                    topic_partitions=owned.get(member_id, []),
                ),
                now,
            )
            if response.error_code:
                raise RuntimeError(f"heartbeat failed: {response.error_message}")
            if response.member_epoch != epochs[member_id] or response.assignment is not None:
                changed = True
            epochs[member_id] = response.member_epoch
            if response.assignment is not None:
                owned[member_id] = [
                    (tp.topic_id, list(tp.partitions)) for tp in response.assignment
                ]
        if not changed or rounds > 50:
            break
    gc.collect()
    # Leave out what this module allocated (the simulated clients' view of their partitions).
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, __file__)])
    retained = sum(stat.size for stat in snapshot.statistics("filename"))
    tracemalloc.stop()
    assigned = sum(len(ps) for per_member in owned.values() for _, ps in per_member)
    if assigned != topics * per_topic:
        raise RuntimeError(f"group did not settle: {assigned} of {topics * per_topic} owned")

    requests = [
        ConsumerGroupHeartbeatRequest(
            group_id="bench", member_id=member_id, member_epoch=epochs[member_id]
        )
        for member_id in member_ids
    ]
    done = 0
    unexpected = 0
    gc.collect()
    t0 = time.perf_counter()
    while done < heartbeats:
        now += 10
        for request in requests:
            response, _ = coordinator.heartbeat(request, now)
            if response.error_code or response.assignment is not None:
                unexpected += 1
        done += len(requests)
    elapsed = time.perf_counter() - t0
    if unexpected:
        raise RuntimeError(f"{unexpected} steady-state heartbeats got an error or a new assignment")
    return {
        "members": members,
        "partitions": topics * per_topic,
        "topics": topics,
        "join_s": round(join_s, 2),
        "partitions_owned": assigned,
        "reconcile_rounds": rounds,
        "heartbeats": done,
        "heartbeats_per_s": done / elapsed,
        "us_per_heartbeat": elapsed / done * 1e6,
        "bytes_per_member": retained / members,
    }
