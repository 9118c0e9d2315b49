"""``./dev/up``: a local Kafka 3.9 broker with groupgate in front, until Ctrl-C or SIGTERM.

The broker comes from the test bed (jars fetched from Maven Central on first use, then cached),
listens on an ephemeral loopback port, and groupgate's bootstrap listener takes
``127.0.0.1:9092`` (override with ``--listen``). One line says when clients can connect:
``groupgate ready: bootstrap 127.0.0.1:9092 upstream 127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from proxy.process import ProxyProcess, ProxyStartError
from tests.testbed.broker import KafkaBroker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dev/up", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:9092")
    parser.add_argument("--kafka", default="3.9", help="test-bed Kafka line (3.9 or 4.4)")
    parser.add_argument("proxy_args", nargs="*", help="extra `groupgate run` flags after --")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    workdir = Path(tempfile.mkdtemp(prefix="groupgate-dev-"))
    print(f"starting Kafka {args.kafka} (work dir {workdir})", file=sys.stderr, flush=True)
    with KafkaBroker.start(args.kafka, workdir / "kafka", auto_create_topics=True) as broker:
        try:
            proxy = ProxyProcess.start(broker.bootstrap, workdir / "groupgate.log",
                                       listen=args.listen, args=args.proxy_args)
        except ProxyStartError as exc:
            print(exc, file=sys.stderr)
            return 1
        with proxy:
            print(f"groupgate ready: bootstrap {proxy.bootstrap} upstream {broker.bootstrap}",
                  flush=True)
            print(f"proxy log: {proxy.log_file}", file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                if not proxy.alive:
                    print("groupgate exited:\n" + proxy.log()[-2000:], file=sys.stderr)
                    return 1
            print("stopping groupgate and Kafka", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
