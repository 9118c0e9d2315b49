"""Targets of the rebalance benchmark: what the consumer members connect to.

A :class:`Target` starts a broker from the test bed (and whatever sits in front of it), tells
the harness where clients connect, which group protocols it serves, and the client settings
for each protocol; it records the broker settings it chose. Adding a target is one class:

- ``classic-3.9``: Kafka 3.9 (classic coordinator only): eager ``range`` and
  ``cooperative-sticky``;
- ``native-4.x``: Kafka 4.4 with KIP-848 (``consumer``), and classic clients on 4.4 for
  reference;
- ``groupgate``: ``groupgate run`` in front of Kafka 3.9. Today the proxy passes group traffic
  through to the broker, so this measures pass-through; once the proxy coordinates groups it
  will also serve ``consumer``.

Session timeouts are lowered the same way on every target (6 s session, 1 s heartbeat) so that a
crashed member is detected within seconds; the values are recorded with every run. groupgate
runs with its defaults otherwise, pod-local liveness among them: it fences a crashed member
(alone in its process) within its liveness grace, before the session would end.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config import ProxyConfig
from proxy.process import ProxyProcess
from tests.testbed.broker import BENCH_JVM_FLAGS, KafkaBroker

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
#: classic clients' rebalance timeout (max.poll.interval.ms): the default, well above the
#: slow member's 30 s callback.
MAX_POLL_INTERVAL_MS = 300000

CLASSIC_PROTOCOLS = {"range": "range", "cooperative-sticky": "cooperative-sticky"}


@dataclass(frozen=True)
class ProtocolSpec:
    """How clients of one protocol are configured (recorded in the results)."""

    name: str  # "range" (eager), "cooperative-sticky", or "consumer" (KIP-848)

    @property
    def kind(self) -> str:
        return "consumer" if self.name == "consumer" else "classic"


class Target:
    """Base class: a test-bed broker, started and stopped by the harness."""

    name = "abstract"
    line = ""
    protocols: tuple[str, ...] = ()
    default_protocols: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.broker: KafkaBroker | None = None
        self._broker_dir = Path()

    # -- broker ---------------------------------------------------------------------------------

    def broker_properties(self) -> dict[str, str]:
        return {
            "group.min.session.timeout.ms": "1000",
            "group.initial.rebalance.delay.ms": "0",
        }

    def consumer_heartbeat_ms(self) -> int | None:
        return None

    def start(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self._broker_dir = workdir / "broker"
        shutil.rmtree(self._broker_dir, ignore_errors=True)  # a fresh cluster every time
        self.broker = KafkaBroker.start(
            self.line, self._broker_dir, heap="1g", jvm_flags=BENCH_JVM_FLAGS,
            consumer_heartbeat_ms=self.consumer_heartbeat_ms(),
            properties=self.broker_properties(),
        )

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
            shutil.rmtree(self._broker_dir / "nodes", ignore_errors=True)

    @property
    def broker_bootstrap(self) -> str:
        assert self.broker is not None, "target not started"
        return self.broker.bootstrap

    @property
    def bootstrap(self) -> str:
        """Where the members connect."""
        return self.broker_bootstrap

    def create_topic(self, name: str, partitions: int) -> None:
        assert self.broker is not None, "target not started"
        self.broker.create_topic(name, partitions, timeout=120.0)

    # -- clients --------------------------------------------------------------------------------

    def client_config(self, protocol: str, group: str) -> dict[str, Any]:
        """librdkafka settings for a member of ``group`` speaking ``protocol``."""
        if protocol not in self.protocols:
            raise ValueError(f"target {self.name} does not serve protocol {protocol!r}")
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 5000,
        }
        if protocol == "consumer":
            conf["group.protocol"] = "consumer"
        else:
            conf.update({
                "group.protocol": "classic",
                "partition.assignment.strategy": CLASSIC_PROTOCOLS[protocol],
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            })
        return conf

    def java_client_args(self, protocol: str) -> dict[str, Any]:
        """Settings for Kafka's VerifiableConsumer (see :mod:`tests.testbed.tools`)."""
        if protocol == "consumer":
            return {"group_protocol": "consumer"}
        return {
            "assignment_strategy": protocol,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "config": {"heartbeat.interval.ms": str(HEARTBEAT_INTERVAL_MS),
                       "max.poll.interval.ms": str(MAX_POLL_INTERVAL_MS)},
        }

    @property
    def tools_line(self) -> str:
        return self.line

    def describe(self) -> dict[str, Any]:
        return {
            "target": self.name,
            "broker_line": self.line,
            "broker_version": self.broker.version if self.broker else None,
            "broker_properties": {
                **self.broker_properties(),
                **({"group.consumer.heartbeat.interval.ms": str(self.consumer_heartbeat_ms()),
                    "group.consumer.min.heartbeat.interval.ms": str(self.consumer_heartbeat_ms())}
                   if self.consumer_heartbeat_ms() else {}),
            },
            "classic_client": {
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            },
        }


class Classic39(Target):
    name = "classic-3.9"
    line = "3.9"
    protocols = ("range", "cooperative-sticky")
    default_protocols = ("range", "cooperative-sticky")


class Native4(Target):
    name = "native-4.x"
    line = "4.4"
    protocols = ("consumer", "range", "cooperative-sticky")
    default_protocols = ("consumer",)

    def consumer_heartbeat_ms(self) -> int | None:
        return HEARTBEAT_INTERVAL_MS

    def broker_properties(self) -> dict[str, str]:
        return {
            **super().broker_properties(),
            "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "group.consumer.min.session.timeout.ms": "1000",
        }


class Groupgate(Classic39):
    """``groupgate run`` in front of Kafka 3.9: new-protocol members are served by the proxy's
    engine, and so are classic members (``classic-translation``, on by default). The engine
    gets the same heartbeat interval and session timeout as the ``native-4.x`` broker."""

    name = "groupgate"
    protocols = ("consumer", "range", "cooperative-sticky")
    default_protocols = ("consumer", "range", "cooperative-sticky")

    def __init__(self) -> None:
        super().__init__()
        self.proxy: ProxyProcess | None = None

    def start(self, workdir: Path) -> None:
        super().start(workdir)
        self.proxy = ProxyProcess.start(
            self.broker_bootstrap, workdir / "groupgate.log",
            args=["--group-heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS),
                  "--group-session-timeout-ms", str(SESSION_TIMEOUT_MS)])

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        super().stop()

    @property
    def bootstrap(self) -> str:
        assert self.proxy is not None, "target not started"
        return self.proxy.bootstrap

    def describe(self) -> dict[str, Any]:
        return {**super().describe(),
                "proxy": "groupgate run (KIP-848 engine for new-protocol and classic members)",
                "group_heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
                "group_session_timeout_ms": SESSION_TIMEOUT_MS,
                "classic_quiet_advance": ProxyConfig.classic_quiet_advance,
                "classic_sync_hold_ms": ProxyConfig.classic_sync_hold_ms}


TARGETS: dict[str, type[Target]] = {t.name: t for t in (Classic39, Native4, Groupgate)}


def make_target(name: str) -> Target:
    try:
        return TARGETS[name]()
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None
