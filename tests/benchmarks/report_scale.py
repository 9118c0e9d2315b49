"""``dev/bench report-scale``: how long ``groupgate report`` takes on synthetic journals of 1, 3
and 10 million events (``tests/benchmarks/journal_synth.py``) in ``local[2]``.

Each size is generated once into the cache (``~/.cache/groupgate/journals``) and then
reported by the command exactly as a user runs it (a fresh ``python -m proxy.cli report``
process, its own Spark session: JVM start included). Prints one line per size and writes
JSON with the machine. Run it under the test bed's lock; it keeps a 2-core machine busy.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--master", default="local[2]", help="Spark master (local[2])")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (6g)")
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "groupgate" / "journals",
                        help="where generated journals are kept")
    parser.add_argument("--seed", type=int, default=1)
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


def report(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="report-scale-"))
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "proxy.cli", "report", "--input", str(path), "--out",
               str(out), "--master", args.master, "--driver-memory", args.driver_memory]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"report failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    html_bytes = (out / "report.html").stat().st_size
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": round(wall, 1), "job_s": summary["seconds"], "summary": summary,
            "html_bytes": html_bytes, "command": " ".join(command[2:])}


def run(args: argparse.Namespace) -> int:
    rows = []
    print(f"{'events':>11} {'file MB':>8} {'groups':>7} {'rebalances':>10} {'downtimes':>10} "
          f"{'job s':>7} {'wall s':>7}")
    for events in args.events:
        path, generated = journal(args.cache, events, args.seed)
        if generated is not None:
            print(f"  generated {path} in {generated:.0f} s", flush=True)
        result = report(path, args)
        s = result["summary"]
        row = {"events": events, "file_bytes": path.stat().st_size, **result}
        rows.append(row)
        print(f"{events:11,d} {path.stat().st_size / 1e6:8.0f} {s['groups']:7,d} "
              f"{s['rebalances']:10,d} {s['downtimes']:10,d} {result['job_s']:7.1f} "
              f"{result['wall_s']:7.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "master": args.master,
                                         "driver_memory": args.driver_memory, "rows": rows},
                                        indent=2))
    return 0
