"""``dev/bench passthrough``: the product's pass-through benchmark against a test-bed broker.

Starts a Kafka broker of ``--kafka`` (default 3.9) from the test bed and runs
``groupgate bench passthrough`` (:mod:`proxy.commands.bench_passthrough`) against it with the
same arguments, so the recorded figures come from the command users run on their clusters.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from proxy.commands import bench_passthrough
from tests.testbed.broker import KafkaBroker


def configure(parser: argparse.ArgumentParser) -> None:
    bench_passthrough.configure(parser, bootstrap_required=False)
    parser.add_argument("--kafka", default="3.9", help="test-bed Kafka line (default 3.9)")


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="groupgate-bench-kafka-"))
    with KafkaBroker.start(args.kafka, workdir / "kafka") as broker:
        args.bootstrap = broker.bootstrap
        args.kafka_version = broker.version
        return bench_passthrough.run(args)
