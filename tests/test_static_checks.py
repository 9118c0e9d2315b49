"""The tree stays ruff-clean and the engine stays mypy-strict: checked in the suite so CI
cannot drift from what the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_translation() -> None:
    result = _run(sys.executable, "-m", "mypy")  # files and strictness from pyproject.toml
    assert result.returncode == 0, result.stdout + result.stderr
