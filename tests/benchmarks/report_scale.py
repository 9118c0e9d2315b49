"""``dev/bench report-scale``: how long ``groupgate report`` takes on synthetic journals of 1, 3
and 10 million events (``tests/benchmarks/journal_synth.py``) in ``local[2]``.

Each size is generated once into the cache (``~/.cache/groupgate/journals``) and then
reported by the command exactly as a user runs it (a fresh ``python -m proxy.cli report``
process, its own Spark session: JVM start included). Prints one line per size and writes
JSON with the machine. Run it under the test bed's lock; it keeps a 2-core machine busy.

``--master spark://HOST:PORT`` runs the report on that standalone cluster; ``--cluster`` starts
one of the test bed's for the run (``tests.testbed.spark.standalone_cluster``: a master and
two 1-core workers on 127.0.0.1) and stops it afterwards. ``--keep DIR`` keeps each size's
output in ``DIR/EVENTS`` (for ``dev/bench report-diff``).

``--conf KEY=VALUE`` passes a Spark setting on to the report command. ``--commit REV`` runs
the report of an earlier version instead of this checkout's: the ``proxy`` and
``translation`` packages at ``REV`` are exported (``git archive``) into a temporary directory
and the command runs from there, so that before/after runs of the same day alternate with one
harness. The JSON names the commit each run used and the settings given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proxy.commands.machine import machine_info
from tests.benchmarks.journal_synth import write_journal

ROOT = Path(__file__).resolve().parents[2]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, nargs="+",
                        default=[1_000_000, 3_000_000, 10_000_000],
                        help="journal sizes (default 1, 3 and 10 million)")
    parser.add_argument("--master", default="local[2]",
                        help="Spark master (local[2]; spark://HOST:PORT for a standalone cluster)")
    parser.add_argument("--cluster", action="store_true",
                        help="start the test bed's standalone cluster (two 1-core workers) and "
                             "run on it")
    parser.add_argument("--executor-memory", default="2g",
                        help="spark.executor.memory on a cluster, and each test-bed worker's "
                             "memory with --cluster (2g)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each size's output in DIR/EVENTS")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (6g)")
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "groupgate" / "journals",
                        help="where generated journals are kept")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the report command (repeatable), e.g. "
                             "spark.sql.files.maxPartitionBytes=128m")
    parser.add_argument("--commit", metavar="REV",
                        help="run the report code of commit REV of this repository (exported "
                             "with git archive) instead of this checkout's")
    parser.add_argument("--json", type=Path, help="write the figures here")


def journal(cache: Path, events: int, seed: int) -> tuple[Path, float | None]:
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"journal-{events}-seed{seed}.jsonl"
    if path.exists():
        return path, None
    started = time.monotonic()
    part = path.with_suffix(".part")
    write_journal(part, events, seed)
    part.rename(path)
    return path, time.monotonic() - started


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def export(rev: str, into: Path) -> str:
    """The ``proxy`` and ``translation`` packages at ``rev`` into ``into``; the full commit."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                              "proxy", "translation"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def checkout_commit() -> str:
    """This checkout's commit, ``+`` when its tracked files differ from it."""
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "proxy", "translation")
    return git("rev-parse", "HEAD") + ("+" if dirty else "")


def environment(code: Path) -> dict[str, str]:
    """The report command's environment; it runs with ``code`` as its working directory too,
    which ``python -m`` puts first on ``sys.path``."""
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(code))


def report(path: Path, args: argparse.Namespace, master: str, events: int,
           code: Path = ROOT) -> dict[str, Any]:
    if args.keep is not None:
        out = args.keep / str(events)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    else:
        out = Path(tempfile.mkdtemp(prefix="report-scale-"))
    env = environment(code)
    command = [sys.executable, "-m", "proxy.cli", "report", "--input", str(path), "--out",
               str(out), "--master", master, "--driver-memory", args.driver_memory]
    if not master.startswith("local"):
        command += ["--conf", f"spark.executor.memory={args.executor_memory}",
                    "--conf", f"spark.pyspark.python={sys.executable}"]
    for setting in args.conf:
        command += ["--conf", setting]
    started = time.monotonic()
    done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"report failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    html_bytes = (out / "report.html").stat().st_size
    if args.keep is None:
        shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": round(wall, 1), "job_s": summary["seconds"], "summary": summary,
            "html_bytes": html_bytes, "command": " ".join(command[2:])}


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        master = args.master
        if args.cluster:
            from tests.testbed.spark import standalone_cluster

            cluster = stack.enter_context(standalone_cluster(
                workers=2, cores=1, memory=args.executor_memory))
            master = cluster.master_url
            print(f"standalone cluster {master} (master UI {cluster.ui_url})", flush=True)
        code, commit = ROOT, checkout_commit()
        if args.commit:
            code = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="report-code-")))
            commit = export(args.commit, code)
        print(f"report code: {commit} ({code})", flush=True)
        return _run(args, master, code, commit)


def _run(args: argparse.Namespace, master: str, code: Path, commit: str) -> int:
    rows = []
    print(f"{'events':>11} {'file MB':>8} {'groups':>7} {'rebalances':>10} {'downtimes':>10} "
          f"{'job s':>7} {'wall s':>7}")
    for events in args.events:
        path, generated = journal(args.cache, events, args.seed)
        if generated is not None:
            print(f"  generated {path} in {generated:.0f} s", flush=True)
        result = report(path, args, master, events, code)
        s = result["summary"]
        row = {"events": events, "file_bytes": path.stat().st_size, **result}
        rows.append(row)
        print(f"{events:11,d} {path.stat().st_size / 1e6:8.0f} {s['groups']:7,d} "
              f"{s['rebalances']:10,d} {s['downtimes']:10,d} {result['job_s']:7.1f} "
              f"{result['wall_s']:7.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "commit": commit,
                                         "master": master, "conf": args.conf,
                                         "cluster": args.cluster,
                                         "driver_memory": args.driver_memory, "rows": rows},
                                        indent=2))
    return 0
