"""The report benchmark's ``--commit``: the report packages of a commit, exported, are what the
report command imports when it runs from the export."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.benchmarks.report_scale import ROOT, checkout_commit, environment, export, git


def test_an_exported_commit_is_what_the_report_command_imports(tmp_path: Path) -> None:
    commit = export("HEAD", tmp_path)
    assert commit == git("rev-parse", "HEAD") and len(commit) == 40
    assert checkout_commit().rstrip("+") == commit
    job = tmp_path / "proxy" / "report" / "job.py"
    assert job.read_bytes() == subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:proxy/report/job.py"],
        capture_output=True, check=True).stdout
    assert (tmp_path / "translation").is_dir() and not (tmp_path / "tests").exists()
    imported = subprocess.run(
        [sys.executable, "-c", "import proxy.report.job as j, translation as t; "
                               "print(j.__file__); print(t.__file__)"],
        cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, check=True)
    paths = [Path(line) for line in imported.stdout.split()]
    assert paths == [job, tmp_path / "translation" / "__init__.py"], paths
