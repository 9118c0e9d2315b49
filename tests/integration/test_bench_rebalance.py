"""The rebalance benchmark runs end to end at a tiny size, so the harness cannot rot.

Nothing here judges a timing: the run must finish, converge, account for every member it
started, and write its JSON and picture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.broker
@pytest.mark.slow  # the harness of a benchmark; its groupgate target runs in the default suite
def test_scale_out_on_the_classic_reference(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    plots = tmp_path / "plots"
    result = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks", "rebalance", "--target", "classic-3.9",
         "--members", "3", "--scenario", "scale-out", "--protocol", "range", "--repeat", "1",
         "--json", str(out), "--plots", str(plots), "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] and data["versions"]
    (run,) = data["runs"]
    assert (run["target"], run["scenario"], run["members"]) == ("classic-3.9", "scale-out", 3)
    assert not run["timed_out"] and run["convergence_s"] is not None
    assert run["partitions"] == 30 and run["partitions_revoked"] > 0  # eager: everyone revokes
    assert run["records_consumed"] > 0 and not run["client_errors"]
    assert list(plots.glob("*.png")), "no picture written"
