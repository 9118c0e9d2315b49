"""The Kubernetes test bed's pure parts: it says why it cannot run (no Go toolchain), the
shipped Containerfile is one its builder reads whole, and its compiles never wait for a lock
their own caller holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed import containerfile, kubernetes

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_go_toolchain_it_says_so_and_what_it_needs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GROUPGATE_CACHE", str(tmp_path))  # nothing built
    real_which = kubernetes.shutil.which
    monkeypatch.setattr(kubernetes.shutil, "which",
                        lambda name: None if name == "go" else real_which(name))
    monkeypatch.setattr(kubernetes, "GO_FALLBACK", str(tmp_path / "none" / "go"))
    with pytest.raises(kubernetes.Unavailable, match=r"no Go toolchain.*Go >= 1\.25"):
        kubernetes._go()
    ok, why = kubernetes.available()
    assert not ok
    if kubernetes.os.geteuid() == 0 and real_which("ip") and real_which("apt-get"):
        assert "no Go toolchain" in why, why


def test_the_shipped_containerfile_is_read_whole() -> None:
    steps = containerfile.parse((ROOT / "deploy" / "Containerfile").read_text())
    assert steps[0].text == "FROM debian:bookworm-slim"
    assert [s.instruction for s in steps].count("COPY") == 1
    assert steps[-1].instruction == "ENTRYPOINT"
    run = [s for s in steps if s.instruction == "RUN"]
    assert "python3 -m venv /opt/groupgate" in run[0].argument  # continuation lines joined
    assert "--no-index" in run[1].argument  # the image build reaches only Debian's archive


def test_an_instruction_the_builder_cannot_carry_out_is_refused() -> None:
    with pytest.raises(ValueError, match="HEALTHCHECK"):
        containerfile.parse("FROM debian:bookworm-slim\nHEALTHCHECK CMD true\n")
    with pytest.raises(ValueError, match="starts with FROM"):
        containerfile.parse("RUN true\n")
    with pytest.raises(ValueError, match="Debian bases only"):
        containerfile._suite(containerfile.Step("FROM", "python:3.11-slim"))


def test_a_compile_under_a_caller_s_flock_does_not_wait_for_it(tmp_path: Path) -> None:
    lock = tmp_path / "heavy.lock"
    code = ("from pathlib import Path\nfrom tests.testbed import kubernetes\n"
            f"kubernetes.HEAVY_LOCK = Path({str(lock)!r})\n"
            "with kubernetes.heavy_lock():\n    print('inside')\n")
    done = subprocess.run(["flock", str(lock), sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "inside", done.stderr
