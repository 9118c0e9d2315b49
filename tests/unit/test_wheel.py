"""The wheel built from this repository ships the product only: the proxy and the engine, with
their schemas, and no test bed, no test-bed benchmark, no Java or Maven code, nothing that
imports the test suite."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_PARTS = ("testbed", "benchmarks", "tests")
FORBIDDEN_SUFFIXES = (".java", ".jar", ".class")
FORBIDDEN_NAMES = ("pom.xml",)
FORBIDDEN_TEXT = ("from tests", "import tests", "maven", "repo1.maven.org")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (path,) = out.glob("groupgate-*.whl")
    return zipfile.ZipFile(path)


def _product_files(wheel: zipfile.ZipFile) -> list[str]:
    return [n for n in wheel.namelist() if not n.split("/")[0].endswith((".dist-info", ".data"))]


def test_the_wheel_holds_the_product(wheel: zipfile.ZipFile) -> None:
    names = set(_product_files(wheel))
    for needed in ("proxy/connection.py", "proxy/splice.py", "proxy/cli.py",
                   "proxy/commands/bench_passthrough.py", "translation/coordinator.py",
                   "translation/classic/coordinator.py"):
        assert needed in names, needed
    assert any(n.startswith("proxy/codec/schemas/") and n.endswith(".json") for n in names)


def test_the_wheel_holds_no_test_bed_benchmark_or_maven_code(wheel: zipfile.ZipFile) -> None:
    for name in _product_files(wheel):
        parts = name.split("/")
        assert parts[0] in ("proxy", "translation"), name
        assert not any(p in FORBIDDEN_PARTS for p in parts), name
        assert not name.endswith(FORBIDDEN_SUFFIXES), name
        assert parts[-1] not in FORBIDDEN_NAMES, name
        if name.endswith(".py"):
            text = wheel.read(name).decode().lower()
            for word in FORBIDDEN_TEXT:
                assert word not in text, f"{name} mentions {word!r}"
