"""What every benchmark records about the machine it ran on, and small statistics helpers
(the pass-through benchmark here; the test-bed benchmarks under ``tests/benchmarks``)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else "unknown"


def java_version(java: str | None = None) -> str:
    """``java -version``'s first line, for the JVM at ``java`` (else the one on PATH)."""
    try:
        executable = java or shutil.which("java")
        if executable is None:
            return "unavailable (no java on PATH)"
        out = subprocess.run([executable, "-version"], capture_output=True, text=True,
                             check=False)
        return (out.stderr or out.stdout).strip().splitlines()[0]
    except Exception as exc:  # reported, not fatal
        return f"unavailable ({exc})"


def groupgate_version() -> str:
    try:
        from importlib.metadata import version

        return version("groupgate")
    except Exception:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        match = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.MULTILINE)
        return match.group(1) if match else "unknown"


def machine_info(java: str | None = None) -> dict[str, Any]:
    """The machine a benchmark ran on; ``java``: the JVM its Java side used, if any."""
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "java": java_version(java),
        "platform": platform.platform(),
        "groupgate": groupgate_version(),
    }


def describe_machine(info: dict[str, Any]) -> str:
    return (f"{info['cpu_model']}; {info['cores']} cores; {info.get('memory_gib', '?')} GiB; "
            f"Python {info['python']}; {info['java']}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]
