"""The proxy's packages import one way: coordination -> state_log -> kafka_client -> codec,
records and the upstream connection; no arrow runs back up. The fleet core (sans-I/O) imports
none of them.

Two checks. Every ``import`` of every module of a lower package, read with :mod:`ast` (imports
under ``if TYPE_CHECKING`` and inside functions included), names none of the packages above
it; and importing the lower package in a fresh interpreter loads none of them, so no arrow runs
back up through a module in between either (the proxy's configuration, say, which names the
state log). The state log, the Kafka client and the fleet core know nothing of the group engine: of
``translation`` they use the error codes only, and the fleet core the sans-I/O write barrier
(:mod:`translation.write_barrier`, which imports nothing).
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import proxy

ROOT = pathlib.Path(proxy.__file__).parent
ABOVE = ("proxy.coordination", "proxy.app", "proxy.commands", "proxy.router",
         "proxy.connection", "proxy.server")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "proxy.kafka_client": (*ABOVE, "proxy.state_log", "proxy.journal", "proxy.config"),
    "proxy.state_log": (*ABOVE, "proxy.journal", "proxy.config"),
    "proxy.journal": (*ABOVE, "proxy.state_log"),
    "proxy.fleet_core": (*ABOVE, "proxy.state_log", "proxy.journal", "proxy.config",
                         "proxy.kafka_client", "proxy.upstream", "proxy.metrics"),
}
"""A package -> what it must not import, directly or through another module."""
ENGINE_FREE = ("proxy.kafka_client", "proxy.state_log", "proxy.fleet_core")
ENGINE_ALLOWED = ("translation.errors", "translation.write_barrier")


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> dict[str, pathlib.Path]:
    folder = ROOT.parent.joinpath(*package.split("."))
    modules = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _violations(package: str) -> list[str]:
    bad = []
    for module, path in _modules(package).items():
        for name in sorted(imports_of(path.read_text(), module, path.name == "__init__.py")):
            if _under(name, FORBIDDEN[package]):
                bad.append(f"{module} imports {name}")
            elif (package in ENGINE_FREE and _under(name, ("translation",))
                  and not _under(name, ENGINE_ALLOWED)):
                bad.append(f"{module} imports the engine's {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_of_a_lower_package_imports_one_above(package: str) -> None:
    assert len(_modules(package)) > 1  # the package is really read
    assert _violations(package) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_a_lower_package_loads_nothing_above_it(package: str) -> None:
    modules = sorted(_modules(package))
    assert len(modules) > 1
    script = ("import importlib, sys\n"
              f"for m in {modules!r}: importlib.import_module(m)\n"
              "print('\\n'.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT.parent, check=True,
                          capture_output=True, text=True)
    loaded = done.stdout.split()
    assert set(modules) <= set(loaded)
    assert [m for m in loaded if _under(m, FORBIDDEN[package])] == []


def test_the_reader_sees_every_form_of_import() -> None:
    source = ("import proxy.coordination.service\n"
              "from proxy.coordination import routing\n"
              "from . import sibling\n"
              "from ..coordination.fleet import Card\n"
              "if TYPE_CHECKING:\n    from proxy.coordination.links import X\n"
              "def f():\n    from proxy.coordination import peers\n")
    found = imports_of(source, "proxy.state_log.writer")
    assert {"proxy.coordination.service", "proxy.coordination.routing",
            "proxy.state_log.sibling", "proxy.coordination.fleet.Card",
            "proxy.coordination.links", "proxy.coordination.peers"} <= found
    assert _under("proxy.coordination.fleet.Card", FORBIDDEN["proxy.state_log"])
    assert not _under("proxy.coordinations", ("proxy.coordination",))
