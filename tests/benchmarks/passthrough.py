"""``dev/bench passthrough``: the product's pass-through benchmark against a test-bed broker.

Starts a Kafka broker of ``--kafka`` (default 3.9) from the test bed and runs
``groupgate bench passthrough`` (:mod:`proxy.commands.bench_passthrough`) against it with the
same arguments, so the recorded figures come from the command users run on their clusters.
With ``--tls`` the broker has a SASL_SSL listener (:mod:`tests.testbed.security`) and the
benchmark runs there: direct clients with TLS and SCRAM, proxied clients with SCRAM in
plaintext to the proxy, the proxy with TLS and SCRAM to the broker; the broker then runs with
the full JIT (``BENCH_JVM_FLAGS``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from proxy.commands import bench_passthrough
from tests.testbed.broker import BENCH_JVM_FLAGS, KafkaBroker
from tests.testbed.security import USERS, BrokerSecurity


def configure(parser: argparse.ArgumentParser) -> None:
    bench_passthrough.configure(parser, bootstrap_required=False)
    parser.add_argument("--kafka", default="3.9", help="test-bed Kafka line (default 3.9)")
    parser.add_argument("--tls", action="store_true",
                        help="measure on the broker's SASL_SSL listener (SCRAM-SHA-256)")


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="groupgate-bench-kafka-"))
    security = (BrokerSecurity.create(workdir / "certs", USERS) if args.tls else None)
    # TLS: the broker's AES-GCM needs the JVM's full JIT (the test bed's C1-only default
    # makes the broker, not the proxy, the bottleneck: 23 MB/s produced, direct)
    flags = {"jvm_flags": BENCH_JVM_FLAGS} if args.tls else {}
    with KafkaBroker.start(args.kafka, workdir / "kafka", security=security, **flags) as broker:
        args.kafka_version = broker.version
        args.bootstrap = broker.bootstrap
        if security is not None:
            broker.grant("User:alice", ("TOPIC", "*", "LITERAL", ("ALL",)),
                         ("GROUP", "*", "LITERAL", ("ALL",)))
            args.bootstrap = broker.secure_bootstrap
            args.security_protocol = "SASL_SSL"
            args.tls_ca_file = str(security.ca_file)
            args.sasl_mechanism = "SCRAM-SHA-256"
            args.sasl_username, args.sasl_password = "alice", USERS["alice"]
        return bench_passthrough.run(args)
