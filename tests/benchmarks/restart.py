"""``dev/bench restart``: how long a mixed group waits after its proxy is SIGKILLed and started
again on the same ports.

One Kafka 3.9 broker, one topic of 4 partitions, groupgate in front of it, and two members of
one group through it (confluent-kafka: one with ``group.protocol=consumer``, one classic with
``range``; the soak's member processes, :mod:`tests.benchmarks.soak.member`). Once both hold
partitions, the proxy is SIGKILLed and started again on the same ports; the clock runs from the
kill until every partition is owned again, each by one member, with both members holding some
("served again"). Also reported: when the new proxy held the broker's group again (its log
line). The dead proxy's member in the broker's group is what the new one waits for: the broker
drops it only when its session expires. Prints each run and the median; ``--json`` writes them
with the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from proxy.commands import machine
from proxy.process import ProxyProcess
from tests.testbed.artifacts import java_executable
from tests.testbed.broker import KafkaBroker, free_ports

PARTITIONS = 4
_HELD = re.compile(r"holding the broker's group as member")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a run may wait for the group to be served again")
    parser.add_argument("--proxy-arg", action="append", default=[], metavar="FLAG",
                        help="extra `groupgate run` flag (repeatable)")
    parser.add_argument("--json", metavar="FILE", type=Path)
    parser.add_argument("--workdir", type=Path, default=None)


class Ownership:
    """What each member holds, from its assign/revoke/lost events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, set[int]] = {}

    def apply(self, member: str, event: dict[str, Any]) -> None:
        kind, partitions = event.get("e"), set(event.get("p", ()))
        with self.lock:
            mine = self.held.setdefault(member, set())
            if kind == "assign":
                mine |= partitions
            elif kind in ("revoke", "lost"):
                mine -= partitions
            elif kind in ("leave", "closed"):
                mine.clear()

    def served(self, members: int) -> bool:
        """Every partition owned by exactly one member, and every member owning some."""
        with self.lock:
            held = [h for h in self.held.values() if h]
            owned = [p for h in held for p in h]
        return (len(held) == members and len(owned) == PARTITIONS
                and set(owned) == set(range(PARTITIONS)))


def _member(bootstrap: str, topic: str, group: str, name: str, protocol: str, assignor: str,
            ownership: Ownership, logdir: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.benchmarks.soak.member", "--library", "confluent",
               "--protocol", protocol, "--assignor", assignor, "--commit", "async",
               "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--name", name]
    stderr = open(logdir / f"{name}.stderr", "w")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, text=True, bufsize=1, start_new_session=True)
    stderr.close()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                ownership.apply(name, json.loads(line))
            except ValueError:
                continue

    threading.Thread(target=read, daemon=True).start()
    return proc


def _wait(condition: Any, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.05)
    return None


def one_run(broker: KafkaBroker, workdir: Path, run: int, args: argparse.Namespace
            ) -> dict[str, Any]:
    topic = group = f"restart-{run}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, PARTITIONS, 1)
    listen, base = free_ports(2)
    proxy_args = ["--broker-port-base", str(base), "--group-heartbeat-interval-ms", "1000",
                  "--group-session-timeout-ms", "6000", *args.proxy_arg]
    logs = workdir / f"run-{run}"
    logs.mkdir(parents=True, exist_ok=True)
    proxy = ProxyProcess.start(broker.bootstrap, logs / "groupgate-1.log",
                               listen=f"127.0.0.1:{listen}", args=proxy_args, timeout=60)
    ownership = Ownership()
    members = [
        _member(proxy.bootstrap, topic, group, "consumer", "consumer", "uniform", ownership, logs),
        _member(proxy.bootstrap, topic, group, "classic", "classic", "range", ownership, logs),
    ]
    restarted: ProxyProcess | None = None
    try:
        if _wait(lambda: ownership.served(2), args.timeout) is None:
            raise RuntimeError(f"run {run}: the group never formed; logs in {logs}")
        time.sleep(3)  # steady state
        proxy.signal(9)
        assert proxy.process is not None
        proxy.process.wait(10)
        killed = time.monotonic()
        restarted = ProxyProcess.start(broker.bootstrap, logs / "groupgate-2.log",
                                       listen=f"127.0.0.1:{listen}", args=proxy_args, timeout=60)
        listening = time.monotonic() - killed
        time.sleep(0.5)  # let the members notice before the ownership is read again
        served_at = _wait(lambda: ownership.served(2), args.timeout)
        held_at = _wait(lambda: bool(_HELD.search(restarted.log() if restarted else "")), 1)
        result = {
            "run": run,
            "proxy_listening_s": round(listening, 2),
            "served_again_s": None if served_at is None else round(served_at - killed, 2),
            "broker_group_held_again": held_at is not None,
        }
        return result
    finally:
        for proc in members:
            proc.terminate()
        for proc in members:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for p in (proxy, restarted):
            if p is not None:
                p.stop()


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="groupgate-restart-"))
    info = machine.machine_info(java_executable())
    print(f"machine: {machine.describe_machine(info)}")
    runs: list[dict[str, Any]] = []
    with KafkaBroker.start("3.9", workdir / "kafka") as broker:
        for i in range(1, args.repeat + 1):
            result = one_run(broker, workdir, i, args)
            runs.append(result)
            print(f"run {i}: proxy listening again after {result['proxy_listening_s']} s, "
                  f"group served again after {result['served_again_s']} s", flush=True)
    served = [r["served_again_s"] for r in runs if r["served_again_s"] is not None]
    median = statistics.median(served) if served else None
    print(f"median: served again {median} s after the SIGKILL ({len(served)}/{len(runs)} runs "
          f"served within {args.timeout:.0f} s); logs in {workdir}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "restart", "machine": info,
                                         "proxy_args": args.proxy_arg, "runs": runs,
                                         "median_served_again_s": median}, indent=2) + "\n")
    return 0 if len(served) == len(runs) else 1
