"""``python -m tests.benchmarks NAME [ARGS]`` (``dev/bench NAME [ARGS]``): one benchmark or
long scenario of the test bed; each module has ``configure(parser)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS: dict[str, tuple[str, str]] = {
    "rebalance": ("tests.benchmarks.rebalance.command",
                  "rebalance cost felt by real consumers, per target"),
    "crash": ("tests.benchmarks.crash",
              "a SIGKILLed member's partitions reassigned: groupgate (pod-local) vs Kafka 4.4 "
              "and 3.9 (also: rebalance --scenario crash --profile P)"),
    "migration": ("tests.benchmarks.migration",
                  "the whole migration roll in the pod test bed, per step: groupgate vs Kafka "
                  "4.4 native"),
    "soak": ("tests.benchmarks.soak.command",
             "real clients under random failures; offsets and ownership checked"),
    "engine": ("tests.benchmarks.engine",
               "assignor and heartbeat throughput of the engine vs Kafka's"),
    "fleet": ("tests.benchmarks.fleet",
              "several sidecars, one group: relayed vs local members, coordinator SIGKILL"),
    "failover": ("tests.benchmarks.failover",
                 "coordinator failover: groupgate's sidecars vs Kafka 4.4's own, 3 nodes"),
    "restart": ("tests.benchmarks.restart",
                "how long a mixed group waits after its proxy is SIGKILLed and restarted"),
    "routing": ("tests.benchmarks.routing",
                "per-request cost of the coordinating router, in process"),
    "state-log": ("tests.benchmarks.state_log",
                  "group state log: write latency and rate, load time, record batch code"),
    "passthrough": ("tests.benchmarks.passthrough",
                    "groupgate bench passthrough against a test-bed broker"),
    "security": ("tests.benchmarks.security",
                 "SCRAM, test certificates and TLS stream costs, in process"),
    "report-scale": ("tests.benchmarks.report_scale",
                     "groupgate report on 1, 3 and 10 million synthetic journal events"),
    "report-diff": ("tests.benchmarks.report_diff",
                    "do two groupgate report outputs of the same journal say the same?"),
    "records": ("tests.benchmarks.records",
                "record batches of journal events: proxy.records vs kafka-python"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="dev/bench", description=__doc__.splitlines()[0])
    names = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module, help_text) in BENCHMARKS.items():
        sub = names.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module)
        if argv[:1] == [name]:  # only the chosen benchmark's module is imported
            importlib.import_module(module).configure(sub)
    args = parser.parse_args(argv)
    code: int = importlib.import_module(args._module).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
