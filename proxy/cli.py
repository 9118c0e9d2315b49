"""The ``groupgate`` console script.

``groupgate run`` starts the proxy; the other subcommands are tools for users: the hand-back of a
group to the broker (``release``), the simulator, the fleet report from the group-event
journal, and the pass-through benchmark against their own cluster. Subcommand modules live in
``proxy.commands`` and are imported only when used. The benchmarks that need the test bed's
brokers and JVMs are development commands (``dev/bench``), not part of the package.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand path -> (module, help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("run",): ("proxy.commands.run", "run the proxy in front of a Kafka cluster"),
    ("simulate",): ("proxy.commands.simulate",
                    "run the seeded group simulator (invariants checked after every event)"),
    ("release",): ("proxy.commands.release",
                   "hand a group back to the broker's classic coordinator (downgrade)"),
    ("report",): ("proxy.commands.report",
                  "fleet report from the group-event journal (PySpark; the 'report' extra)"),
    ("bench", "passthrough"): ("proxy.commands.bench_passthrough",
                               "produce/consume throughput and latency, direct vs proxied"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="groupgate", description=__doc__.splitlines()[0])
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    wanted = tuple(a for a in argv if not a.startswith("-"))[:2]
    for path, (module, help_text) in COMMANDS.items():
        if len(path) == 1:
            sub = top.add_parser(path[0], help=help_text, description=help_text)
        else:
            if path[0] not in groups:
                group_parser = top.add_parser(path[0], help="benchmarks (commands, not tests)")
                groups[path[0]] = group_parser.add_subparsers(dest="subcommand", required=True,
                                                               metavar="BENCHMARK")
            sub = groups[path[0]].add_parser(path[1], help=help_text, description=help_text)
        sub.set_defaults(_module=module)
        # Only the chosen command's module is imported to declare its arguments.
        if wanted[: len(path)] == path:
            importlib.import_module(module).configure(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        module = importlib.import_module(args._module)
    except ModuleNotFoundError as exc:
        parser.error(f"{' '.join(a for a in argv if not a.startswith('-'))}: {exc}")
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
