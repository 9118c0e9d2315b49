"""``translation/`` is sans-I/O: no module of it imports networking, concurrency, process,
file-system or clock modules, and none reads a clock.

Every module under ``translation`` is imported; its globals must not hold any forbidden module
(or a function or class taken from one), and its source must not call a clock.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import types

import pytest

import translation

FORBIDDEN = {
    "socket",
    "ssl",
    "select",
    "selectors",
    "asyncio",
    "trio",
    "anyio",
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "subprocess",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "time",
    "datetime",
    "signal",
    "http",
    "urllib",
    "logging",
    "sched",
}
CLOCK_CALLS = re.compile(
    r"\b(time\.(time|monotonic|perf_counter|process_time|sleep)|datetime\.now|"
    r"datetime\.utcnow|date\.today|monotonic\(|perf_counter\()"
)


def _modules() -> list[str]:
    names = ["translation"]
    for info in pkgutil.walk_packages(translation.__path__, "translation."):
        names.append(info.name)
    return sorted(names)


MODULES = _modules()


def test_every_engine_module_is_found() -> None:
    for expected in (
        "translation.coordinator",
        "translation.heartbeat",
        "translation.reconciliation",
        "translation.offsets",
        "translation.timers",
        "translation.simulation.simulator",
        "translation.simulation.client",
    ):
        assert expected in MODULES


def _root(name: str | None) -> str:
    return (name or "").split(".")[0]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_no_io(name: str) -> None:
    module = importlib.import_module(name)
    for attr, value in vars(module).items():
        if isinstance(value, types.ModuleType):
            assert _root(value.__name__) not in FORBIDDEN, f"{name} imports {value.__name__}"
        elif callable(value) and not isinstance(value, type(translation)):
            origin = getattr(value, "__module__", None)
            assert _root(origin) not in FORBIDDEN, f"{name}.{attr} comes from {origin}"


@pytest.mark.parametrize("name", MODULES)
def test_module_reads_no_clock(name: str) -> None:
    module = importlib.import_module(name)
    source = inspect.getsource(module)
    match = CLOCK_CALLS.search(source)
    assert match is None, f"{name} reads a clock: {match.group(0) if match else ''}"


def test_the_checks_can_fail() -> None:
    fake = types.ModuleType("translation._fake")
    import time as clock

    fake.clock = clock  # type: ignore[attr-defined]
    offenders = [v.__name__ for v in vars(fake).values() if isinstance(v, types.ModuleType)]
    assert any(_root(o) in FORBIDDEN for o in offenders)
    assert CLOCK_CALLS.search("now = time.monotonic()")


def test_importing_the_engine_loads_no_io_library_even_indirectly() -> None:
    """In a fresh interpreter, importing every translation module pulls in no networking,
    event-loop, thread or process module (directly or through a dependency)."""
    import subprocess
    import sys

    script = (
        "import sys, pkgutil, importlib, translation\n"
        "for info in pkgutil.walk_packages(translation.__path__, 'translation.'):\n"
        "    importlib.import_module(info.name)\n"
        "bad = ['socket', 'ssl', 'select', 'selectors', 'asyncio', 'trio', 'anyio', 'threading',\n"
        "       'subprocess', 'multiprocessing', 'concurrent.futures']\n"
        "print(','.join(m for m in bad if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"loaded by translation: {out.stdout.strip()}"
