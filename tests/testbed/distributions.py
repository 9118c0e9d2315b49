"""The Kafka lines the test bed runs, as Maven bundles plus main classes and logging setup.

Two lines: 3.9 (classic group coordinator, reload4j logging) and 4.x (native KIP-848 consumer
groups, log4j2 logging). Each line names three bundles resolved by :mod:`tests.testbed.artifacts`:
the broker (``kafka_2.13`` and its runtime dependencies plus an SLF4J binding), the tools
(VerifiableProducer, VerifiableConsumer, consumer-groups command) and the plain Java client.
The 3.9 line has a fourth, the Kafka Connect runtime (distributed worker, FileStream connectors,
JSON converter, transforms); the 4.x line has none.

Maven Central carries ``kafka_2.13:4.4.0`` and ``kafka-clients:4.4.0`` but not
``kafka-tools``/``kafka-tools-api`` 4.4.0, so the 4.4 line runs the 4.3.1 tools (which bring their
own 4.3.1 client) and the broker gets ``kafka-tools-api`` 4.3.1, a small interface jar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.testbed import artifacts

__all__ = ["COMPAT_LINES", "KAFKA4", "KAFKA28", "KAFKA33", "KAFKA36", "KAFKA39", "LINES",
           "KafkaLine", "get_line"]


@dataclass(frozen=True)
class KafkaLine:
    """One Kafka release line: versions, Maven coordinates and how to run its JVMs."""

    name: str  # "3.9" or "4.4"
    version: str  # broker version, e.g. "3.9.2"
    tools_version: str
    clients_version: str
    log4j2: bool  # False: reload4j (log4j 1.x API), True: log4j2
    native_consumer_protocol: bool  # broker serves KIP-848 ConsumerGroupHeartbeat
    broker_coordinates: tuple[str, ...]
    broker_exclusions: tuple[str, ...]
    tools_coordinates: tuple[str, ...]
    tools_exclusions: tuple[str, ...] = ()
    connect_coordinates: tuple[str, ...] = ()  # empty: no Connect runtime for this line
    zookeeper: bool = False
    """The broker runs in ZooKeeper mode, with a ZooKeeper server from the broker's own
    bundle (2.8: its KRaft mode is an early access without producer ids, KIP-730 being 3.0,
    so no idempotent or transactional producer works there)."""

    broker_main: str = "kafka.Kafka"
    storage_tool_main: str = "kafka.tools.StorageTool"
    verifiable_producer_main: str = "org.apache.kafka.tools.VerifiableProducer"
    verifiable_consumer_main: str = "org.apache.kafka.tools.VerifiableConsumer"
    consumer_groups_main: str = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
    connect_distributed_main: str = "org.apache.kafka.connect.cli.ConnectDistributed"

    @property
    def clients_coordinates(self) -> tuple[str, ...]:
        return (f"org.apache.kafka:kafka-clients:{self.clients_version}",)

    def broker_classpath(self, *, offline: bool = False) -> list[Path]:
        return artifacts.classpath(
            f"kafka-broker-{self.version}",
            self.broker_coordinates,
            self.broker_exclusions,
            offline=offline,
        )

    def tools_classpath(self, *, offline: bool = False) -> list[Path]:
        return artifacts.classpath(
            f"kafka-tools-{self.tools_version}",
            self.tools_coordinates,
            self.tools_exclusions,
            offline=offline,
        )

    def clients_classpath(self, *, offline: bool = False) -> list[Path]:
        return artifacts.classpath(
            f"kafka-clients-{self.clients_version}", self.clients_coordinates, offline=offline
        )

    def connect_classpath(self, *, offline: bool = False) -> list[Path]:
        """The Kafka Connect runtime with the FileStream connectors (3.9 line only)."""
        if not self.connect_coordinates:
            raise ValueError(f"Kafka line {self.name} has no Connect bundle")
        return artifacts.classpath(
            f"kafka-connect-{self.version}", self.connect_coordinates, offline=offline
        )

    def fetch_all(self) -> dict[str, list[Path]]:
        """Resolve every bundle of the line (what ``dev/fetch-kafka`` calls)."""
        bundles = {
            "broker": self.broker_classpath(),
            "tools": self.tools_classpath(),
            "clients": self.clients_classpath(),
        }
        if self.connect_coordinates:
            bundles["connect"] = self.connect_classpath()
        return bundles

    def log_config(self, path: Path, log_file: Path | None, level: str = "INFO") -> list[str]:
        """Write a logging config to ``path``; return the JVM flags that select it.

        With ``log_file`` everything goes to that file (broker logs); without, WARN and above
        go to stderr (command-line tools, whose stdout carries their JSON output).
        """
        if self.log4j2:
            path.write_text(_log4j2_config(log_file, level))
            return [f"-Dlog4j2.configurationFile={path}"]
        path.write_text(_reload4j_config(log_file, level))
        return [f"-Dlog4j.configuration=file:{path}"]


def _reload4j_config(log_file: Path | None, level: str) -> str:
    if log_file is None:
        return (
            "log4j.rootLogger=WARN, stderr\n"
            "log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stderr.Target=System.err\n"
            "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )
    return (
        f"log4j.rootLogger={level}, file\n"
        "log4j.appender.file=org.apache.log4j.FileAppender\n"
        f"log4j.appender.file.File={log_file}\n"
        "log4j.appender.file.Append=true\n"
        "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        "log4j.logger.kafka.request.logger=WARN\n"
        "log4j.logger.org.apache.kafka.clients=WARN\n"
        "log4j.logger.kafka.log.LogCleaner=WARN\n"
    )


def _log4j2_config(log_file: Path | None, level: str) -> str:
    if log_file is None:
        return (
            "status = warn\n"
            "appender.err.type = Console\n"
            "appender.err.name = STDERR\n"
            "appender.err.target = SYSTEM_ERR\n"
            "appender.err.layout.type = PatternLayout\n"
            "appender.err.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = WARN\n"
            "rootLogger.appenderRef.err.ref = STDERR\n"
        )
    return (
        "status = warn\n"
        "appender.file.type = File\n"
        "appender.file.name = FILE\n"
        f"appender.file.fileName = {log_file}\n"
        "appender.file.append = true\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        f"rootLogger.level = {level}\n"
        "rootLogger.appenderRef.file.ref = FILE\n"
        "logger.req.name = kafka.request.logger\n"
        "logger.req.level = WARN\n"
        "logger.clients.name = org.apache.kafka.clients\n"
        "logger.clients.level = WARN\n"
    )


KAFKA39 = KafkaLine(
    name="3.9",
    version="3.9.2",
    tools_version="3.9.2",
    clients_version="3.9.2",
    log4j2=False,
    native_consumer_protocol=False,
    broker_coordinates=(
        "org.apache.kafka:kafka_2.13:3.9.2",
        "org.slf4j:slf4j-reload4j:1.7.36",
        "ch.qos.reload4j:reload4j:1.2.25",
    ),
    # ZooKeeper mode is not used; its jars stay because kafka.Kafka links ZooKeeper classes.
    broker_exclusions=(),
    tools_coordinates=("org.apache.kafka:kafka-tools:3.9.2",),
    # connect-runtime brings reload4j but no SLF4J binding; the broker's binding is added.
    connect_coordinates=(
        "org.apache.kafka:connect-runtime:3.9.2",
        "org.apache.kafka:connect-file:3.9.2",
        "org.apache.kafka:connect-json:3.9.2",
        "org.apache.kafka:connect-api:3.9.2",
        "org.apache.kafka:connect-transforms:3.9.2",
        "org.slf4j:slf4j-reload4j:1.7.36",
    ),
)

KAFKA4 = KafkaLine(
    name="4.4",
    version="4.4.0",
    tools_version="4.3.1",
    clients_version="4.4.0",
    log4j2=True,
    native_consumer_protocol=True,
    broker_coordinates=(
        "org.apache.kafka:kafka_2.13:4.4.0",
        "org.apache.kafka:kafka-tools-api:4.3.1",
        "org.apache.logging.log4j:log4j-slf4j-impl:2.25.5",
    ),
    broker_exclusions=("org.apache.kafka:kafka-tools-api",),
    tools_coordinates=(
        "org.apache.kafka:kafka-tools:4.3.1",
        "org.apache.logging.log4j:log4j-slf4j-impl:2.25.4",
    ),
)

LINES: dict[str, KafkaLine] = {"3.9": KAFKA39, "4.4": KAFKA4}


def _older_line(name: str, version: str) -> KafkaLine:
    """An older 3.x broker for the compatibility run: its own broker bundle, the 3.9 tools
    and client (a newer client speaks to an older broker at the versions both know)."""
    return KafkaLine(
        name=name,
        version=version,
        tools_version=KAFKA39.tools_version,
        clients_version=KAFKA39.clients_version,
        log4j2=False,
        native_consumer_protocol=False,
        broker_coordinates=(
            f"org.apache.kafka:kafka_2.13:{version}",
            "org.slf4j:slf4j-reload4j:1.7.36",
            "ch.qos.reload4j:reload4j:1.2.25",
        ),
        broker_exclusions=(),
        tools_coordinates=KAFKA39.tools_coordinates,
    )


KAFKA33 = _older_line("3.3", "3.3.2")
KAFKA36 = _older_line("3.6", "3.6.2")
KAFKA28 = KafkaLine(
    name="2.8",
    version="2.8.2",
    tools_version=KAFKA39.tools_version,
    clients_version=KAFKA39.clients_version,
    log4j2=False,
    native_consumer_protocol=False,
    # log4j 1.2.17 and its SLF4J binding give way to reload4j, as in the 3.x lines
    broker_coordinates=(
        "org.apache.kafka:kafka_2.13:2.8.2",
        "org.slf4j:slf4j-reload4j:1.7.36",
        "ch.qos.reload4j:reload4j:1.2.25",
    ),
    broker_exclusions=("log4j:log4j", "org.slf4j:slf4j-log4j12"),
    tools_coordinates=KAFKA39.tools_coordinates,
    zookeeper=True,
)
COMPAT_LINES: dict[str, KafkaLine] = {"2.8": KAFKA28, "3.3": KAFKA33, "3.6": KAFKA36}
"""Older KRaft brokers run only by the compatibility test
(``tests/integration/test_compatibility.py``); ``dev/fetch-kafka`` fetches them only when
named."""


def get_line(version: str | KafkaLine) -> KafkaLine:
    """Accept a line object or a version such as "3.9", "3.9.2", "4", "4.4" or "4.4.0"."""
    if isinstance(version, KafkaLine):
        return version
    for line in LINES.values():
        if version in (line.name, line.version, line.name.split(".")[0]):
            return line
    for line in COMPAT_LINES.values():
        if version in (line.name, line.version):
            return line
    raise ValueError(f"unknown Kafka line {version!r}; known: {sorted(LINES | COMPAT_LINES)}")


def fetch_main(argv: list[str] | None = None) -> int:
    """Resolve every bundle of every line (or of the lines named in ``argv``); print where."""
    import sys

    names = (sys.argv[1:] if argv is None else argv) or list(LINES)
    artifacts.require_java()
    print(f"Kafka artifacts cache: {artifacts.cache_root()}")
    for name in names:
        line = get_line(name)
        for kind, jars in line.fetch_all().items():
            print(f"  {line.name} {kind:8} {len(jars):3} jars  {jars[0].parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(fetch_main())
