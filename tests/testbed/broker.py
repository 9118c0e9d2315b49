"""Run real Apache Kafka brokers (KRaft, combined broker+controller) on loopback for tests.

A :class:`KafkaCluster` is one or more ``kafka.Kafka`` JVMs of one line (see
:mod:`tests.testbed.distributions`), each node both broker and controller, on ephemeral
127.0.0.1 ports, with data and logs under a work directory. Readiness is a real ApiVersions and
Metadata round trip on the broker port. :class:`KafkaBroker` is the single-node case.

Every JVM runs in its own process group, dies with the Python process that started it (Linux
``PR_SET_PDEATHSIG``), and is killed at interpreter exit, so neither a failing test nor a
Ctrl-C leaves brokers behind.

    with KafkaBroker.start("3.9", workdir) as kafka:
        kafka.create_topic("t", partitions=3)
        ...  # clients use kafka.bootstrap
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from proxy.process import exit_with_parent
from tests.testbed import artifacts
from tests.testbed.distributions import KafkaLine, get_line
from tests.testbed.security import LISTENER as SECURE_LISTENER
from tests.testbed.security import BrokerSecurity

__all__ = [
    "BENCH_JVM_FLAGS",
    "FAST_JVM_FLAGS",
    "BrokerStartError",
    "ClusterMetadata",
    "KafkaBroker",
    "KafkaCluster",
    "KafkaNode",
    "api_versions",
    "free_ports",
    "kill_all",
    "metadata",
    "running",
]

#: JVM flags that shorten start-up on a small machine (C1 only, serial GC, CDS on).
FAST_JVM_FLAGS: tuple[str, ...] = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
#: JVM flags for benchmarks: full JIT, default collector.
BENCH_JVM_FLAGS: tuple[str, ...] = (
    "-XX:+UseG1GC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

_AVOID_PORTS = frozenset({9092, 9093, 9094})


class BrokerStartError(RuntimeError):
    """A broker did not become ready; the message carries the tail of its log."""


# ---------------------------------------------------------------------------------------------
# Minimal wire probes: ApiVersions v0 and Metadata v1, enough to tell that a broker is serving.


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    client_id = b"groupgate-testbed"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    data = _recv_exact(sock, size)
    (got_corr,) = struct.unpack_from(">i", data, 0)
    if got_corr != corr:
        raise ConnectionError(f"correlation id {got_corr} != {corr}")
    return data[4:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def _parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host, int(port)


def api_versions(bootstrap: str, timeout: float = 5.0) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 against one ``host:port``: ``{api_key: (min_version, max_version)}``."""
    with socket.create_connection(_parse_bootstrap(bootstrap), timeout=timeout) as sock:
        body = _request(sock, 18, 0, 1, b"")
    error, count = struct.unpack_from(">hi", body, 0)
    if error:
        raise ConnectionError(f"ApiVersions error code {error}")
    out: dict[int, tuple[int, int]] = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", body, 6 + 6 * i)
        out[key] = (lo, hi)
    return out


@dataclass(frozen=True)
class ClusterMetadata:
    """Brokers (node id -> host:port) and the controller id seen by one broker."""

    brokers: dict[int, str]
    controller_id: int


def metadata(bootstrap: str, timeout: float = 5.0) -> ClusterMetadata:
    """Metadata v1 with no topics against one ``host:port``."""
    with socket.create_connection(_parse_bootstrap(bootstrap), timeout=timeout) as sock:
        body = _request(sock, 3, 1, 2, struct.pack(">i", 0))
    pos = 0
    (count,) = struct.unpack_from(">i", body, pos)
    pos += 4
    brokers: dict[int, str] = {}
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", body, pos)
        pos += 6
        host = body[pos : pos + host_len].decode()
        pos += host_len
        port, rack_len = struct.unpack_from(">ih", body, pos)
        pos += 6 + max(rack_len, 0)
        brokers[node_id] = f"{host}:{port}"
    (controller_id,) = struct.unpack_from(">i", body, pos)
    return ClusterMetadata(brokers, controller_id)


# ---------------------------------------------------------------------------------------------
# Process bookkeeping


_LIVE: set[KafkaNode] = set()
_LIVE_LOCK = threading.Lock()


def kill_all() -> None:
    """SIGKILL every JVM this process started and that is still running."""
    with _LIVE_LOCK:
        nodes = list(_LIVE)
    for node in nodes:
        node.kill()


atexit.register(kill_all)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (never Kafka's well-known 9092-9094)."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in _AVOID_PORTS:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path.name})"


# ---------------------------------------------------------------------------------------------
# One JVM


class KafkaNode:
    """One ``kafka.Kafka`` process: broker and controller for ``node_id``."""

    def __init__(
        self,
        line: KafkaLine,
        node_id: int,
        directory: Path,
        port: int,
        controller_port: int,
        properties: Mapping[str, str],
        jvm_flags: Sequence[str],
        die_with_parent: bool,
        host: str = "127.0.0.1",
    ) -> None:
        self.line = line
        self.host = host
        """The address the broker listens on and advertises (the controller stays on the
        loopback)."""
        self.node_id = node_id
        self.directory = directory
        self.port = port
        self.controller_port = controller_port
        self.properties = dict(properties)
        self.jvm_flags = list(jvm_flags)
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None
        self.secure_port: int | None = None
        """The SASL_SSL listener's port (clusters with ``security``)."""
        self.format_args: list[str] = []
        """Extra StorageTool ``format`` arguments (SCRAM users)."""

    def __repr__(self) -> str:
        return f"KafkaNode({self.line.version}, id={self.node_id}, {self.bootstrap})"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def log_file(self) -> Path:
        return self.log_dir / "server.log"

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def write_config(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{k}={v}" for k, v in self.properties.items()]
        self.config_file.write_text("\n".join(lines) + "\n")

    def _java(self, main: str, args: Sequence[str], log_file: Path | None) -> list[str]:
        cp = artifacts.classpath_string(self.line.broker_classpath())
        suffix = "log4j2.properties" if self.line.log4j2 else "log4j.properties"
        # the broker logs to logs/server.log; short-lived tools log warnings to stderr
        config = self.directory / (suffix if log_file else f"tool-{suffix}")
        log_flags = self.line.log_config(config, log_file)
        return [
            artifacts.require_java(),
            *self.jvm_flags,
            *log_flags,
            "-cp",
            cp,
            main,
            *args,
        ]

    def format_storage(self, cluster_id: str) -> subprocess.Popen[bytes]:
        """Start ``StorageTool format`` for this node (the caller waits)."""
        cmd = self._java(
            self.line.storage_tool_main,
            ["format", "-t", cluster_id, "-c", str(self.config_file), "--ignore-formatted",
             *self.format_args],
            None,
        )
        cmd = [c for c in cmd if not c.startswith("-Xm")]
        out = open(self.log_dir / "format.log", "wb")  # noqa: SIM115 - closed by the child
        try:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()

    def command(self) -> list[str]:
        return self._java(self.line.broker_main, [str(self.config_file)], self.log_file)

    def launch(self) -> None:
        """Start the JVM without waiting for readiness."""
        if self.alive:
            raise RuntimeError(f"{self} is already running")
        cmd = self.command()
        out = open(self.log_dir / "stdout.log", "ab")  # noqa: SIM115 - closed below
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
                # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only the
                # main thread's children get it; others rely on the atexit hook.
                preexec_fn=exit_with_parent(signal.SIGKILL) if self.die_with_parent else None,
            )
        finally:
            out.close()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def probe(self, expect_brokers: int = 1) -> bool:
        """True when the node answers ApiVersions and Metadata lists ``expect_brokers`` brokers
        (this one among them) and a controller."""
        try:
            api_versions(self.bootstrap, timeout=2.0)
            md = metadata(self.bootstrap, timeout=2.0)
        except (OSError, ConnectionError, struct.error):
            return False
        return self.node_id in md.brokers and len(md.brokers) >= expect_brokers

    def wait_ready(self, timeout: float, expect_brokers: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise BrokerStartError(
                    f"{self} exited with {self.proc.returncode if self.proc else None}:\n"
                    f"{_tail(self.log_file)}\n{_tail(self.log_dir / 'stdout.log', 20)}"
                )
            if self.probe(expect_brokers):
                return
            time.sleep(0.1)
        raise BrokerStartError(f"{self} not ready after {timeout:.0f}s:\n{_tail(self.log_file)}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (controlled shutdown), then SIGKILL after ``timeout`` seconds."""
        self.signal(signal.SIGTERM)
        if not self.wait_exit(timeout):
            self.kill()

    def kill(self) -> None:
        """SIGKILL the process group at once."""
        self.signal(signal.SIGKILL)
        self.wait_exit(10.0)


class ZooKeeperNode(KafkaNode):
    """The ZooKeeper server of a ZooKeeper-mode cluster (Kafka 2.8), from the broker's bundle,
    on ``port`` (its admin HTTP server off)."""

    def __repr__(self) -> str:
        return f"ZooKeeper(127.0.0.1:{self.port})"

    def write_config(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        cmd = self._java("org.apache.zookeeper.server.ZooKeeperServerMain",
                         [str(self.port), str(self.data_dir)], self.log_file)
        return [cmd[0], "-Dzookeeper.admin.enableServer=false", *cmd[1:]]

    def probe(self, expect_brokers: int = 1) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as sock:
                sock.sendall(b"srvr")
                return sock.recv(64).startswith(b"Zookeeper version")
        except OSError:
            return False


# ---------------------------------------------------------------------------------------------
# Clusters


def _base_properties(
    line: KafkaLine, size: int, auto_create_topics: bool, consumer_heartbeat_ms: int | None
) -> dict[str, str]:
    rf = str(min(size, 3))
    props = {
        "inter.broker.listener.name": "PLAINTEXT",
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true" if auto_create_topics else "false",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
        "log.cleaner.threads": "1",
        "log.segment.bytes": str(64 * 1024 * 1024),
        "log.retention.check.interval.ms": "300000",
        "group.min.session.timeout.ms": "1000",
        "delete.topic.enable": "true",
    }
    if line.zookeeper:
        props["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT"
    else:
        props["process.roles"] = "broker,controller"
        props["controller.listener.names"] = "CONTROLLER"
        props["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        # A node restarted after SIGKILL is accepted once its old registration expires (the
        # broker session timeout, 9 s by default); hand leadership back to preferred
        # replicas soon after a restart instead of after the 5-minute default.
        props["broker.heartbeat.interval.ms"] = "500"
        props["broker.session.timeout.ms"] = "4000"
    if size > 1:
        props["leader.imbalance.check.interval.seconds"] = "5"
        props["leader.imbalance.per.broker.percentage"] = "0"
    if line.native_consumer_protocol:
        props["group.coordinator.rebalance.protocols"] = "classic,consumer"
        props["share.coordinator.state.topic.replication.factor"] = rf
        props["share.coordinator.state.topic.min.isr"] = "1"
        if consumer_heartbeat_ms is not None:
            props["group.consumer.min.heartbeat.interval.ms"] = str(
                min(consumer_heartbeat_ms, 5000)
            )
            props["group.consumer.heartbeat.interval.ms"] = str(consumer_heartbeat_ms)
    return props


class KafkaCluster:
    """``size`` combined KRaft nodes (ids 1..size) of one Kafka line on loopback.

    Use :meth:`start` (also a context manager) and :meth:`stop`. Node ids are 1-based;
    ``bootstrap`` lists every node.
    """

    def __init__(
        self,
        version: str | KafkaLine,
        workdir: Path | str | None = None,
        *,
        size: int = 1,
        heap: str = "512m",
        jvm_flags: Sequence[str] = FAST_JVM_FLAGS,
        auto_create_topics: bool = False,
        consumer_heartbeat_ms: int | None = None,
        properties: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
        host: str = "127.0.0.1",
        security: BrokerSecurity | None = None,
    ) -> None:
        """``host``: the address the brokers listen on and advertise, e.g. the bridge of a
        :class:`~tests.testbed.pods.PodNetwork` so that pods reach them. ``security``: also a
        SASL_SSL listener per node, with the authorizer (:mod:`tests.testbed.security`)."""
        self.security = security
        self.line = get_line(version)
        self.host = host
        self._own_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix=f"groupgate-kafka{self.line.name}-"))
            if workdir is None
            else Path(workdir)
        )
        self.size = size
        self.heap = heap
        self.jvm_flags = list(jvm_flags)
        self.auto_create_topics = auto_create_topics
        self.consumer_heartbeat_ms = consumer_heartbeat_ms
        self.extra_properties = dict(properties or {})
        self.die_with_parent = die_with_parent
        self.cluster_id = _cluster_id()
        self.nodes: dict[int, KafkaNode] = {}
        self.zookeeper: ZooKeeperNode | None = None
        """ZooKeeper-mode lines only (:attr:`KafkaLine.zookeeper`)."""
        self.startup_seconds: float | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @classmethod
    def start(
        cls, version: str | KafkaLine, workdir: Path | str | None = None, **kwargs: Any
    ) -> KafkaCluster:
        """Create, format and start the cluster; return it once every node is ready."""
        cluster = cls(version, workdir, **kwargs)
        cluster.launch()
        return cluster

    def launch(self, timeout: float = 120.0, attempts: int = 3) -> None:
        """Format and start every node, retrying with new ports if one was taken meanwhile."""
        self.line.broker_classpath()  # resolve outside the timed part
        artifacts.require_java()
        t0 = time.monotonic()
        for attempt in range(attempts):
            self._build_nodes()
            try:
                if self.zookeeper is not None:
                    self.zookeeper.launch()
                    self.zookeeper.wait_ready(timeout)
                else:
                    self._format_all()
                for node in self.nodes.values():
                    node.launch()
                for node in self.nodes.values():
                    node.wait_ready(timeout, expect_brokers=self.size)
                self.startup_seconds = time.monotonic() - t0
                return
            except BrokerStartError as exc:
                self.kill()
                if "Address already in use" not in str(exc) or attempt == attempts - 1:
                    raise
                shutil.rmtree(self.workdir / "nodes", ignore_errors=True)

    def _build_nodes(self) -> None:
        per_node = 3 if self.security is not None else 2
        ports = free_ports(per_node * self.size)
        secure_ports = ports[2 * self.size:]
        ids = list(range(1, self.size + 1))
        voters = ",".join(f"{i}@127.0.0.1:{ports[2 * (i - 1) + 1]}" for i in ids)
        base = _base_properties(
            self.line, self.size, self.auto_create_topics, self.consumer_heartbeat_ms
        )
        self.nodes = {}
        self.zookeeper = None
        if self.line.zookeeper:  # on the first node's controller port
            self.zookeeper = ZooKeeperNode(
                self.line, 0, self.workdir / "nodes" / "zookeeper", ports[1], ports[1], {},
                ["-Xmx128m", *self.jvm_flags], self.die_with_parent)
            self.zookeeper.write_config()
        for i in ids:
            port, cport = ports[2 * (i - 1)], ports[2 * (i - 1) + 1]
            directory = self.workdir / "nodes" / f"node-{i}"
            if self.zookeeper is not None:
                props = {
                    "broker.id": str(i),
                    "zookeeper.connect": f"127.0.0.1:{self.zookeeper.port}",
                    "listeners": f"PLAINTEXT://{self.host}:{port}",
                    "advertised.listeners": f"PLAINTEXT://{self.host}:{port}",
                    "log.dirs": str(directory / "data"),
                    **base,
                }
            else:
                props = {
                    "node.id": str(i),
                    "controller.quorum.voters": voters,
                    "listeners": (f"PLAINTEXT://{self.host}:{port},"
                                  f"CONTROLLER://127.0.0.1:{cport}"),
                    "advertised.listeners": f"PLAINTEXT://{self.host}:{port}",
                    "log.dirs": str(directory / "data"),
                    **base,
                }
            if self.security is not None:
                sport = secure_ports[i - 1]
                props["listeners"] += f",{SECURE_LISTENER}://{self.host}:{sport}"
                props["advertised.listeners"] += f",{SECURE_LISTENER}://{self.host}:{sport}"
                props["listener.security.protocol.map"] += (
                    f",{SECURE_LISTENER}:{SECURE_LISTENER}")
                props.update(self.security.broker_properties())
            props.update(self.extra_properties)
            node = KafkaNode(
                self.line,
                i,
                directory,
                port,
                cport,
                props,
                [f"-Xmx{self.heap}", f"-Xms{_half(self.heap)}", *self.jvm_flags],
                self.die_with_parent,
                self.host,
            )
            if self.security is not None:
                node.secure_port = secure_ports[i - 1]
                node.format_args = self.security.format_args()
            node.write_config()
            self.nodes[i] = node

    def _format_all(self) -> None:
        procs = [(n, n.format_storage(self.cluster_id)) for n in self.nodes.values()]
        for node, proc in procs:
            if proc.wait(120) != 0:
                raise BrokerStartError(
                    f"storage format failed for {node}:\n{_tail(node.log_dir / 'format.log')}"
                )

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every node at once, SIGKILL whatever is left after ``timeout``."""
        for node in self.nodes.values():
            node.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            if not node.wait_exit(max(0.0, deadline - time.monotonic())):
                node.kill()
        if self.zookeeper is not None:
            self.zookeeper.stop(timeout=10.0)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL every node."""
        for node in self.nodes.values():
            node.kill()
        if self.zookeeper is not None:
            self.zookeeper.kill()

    def __enter__(self) -> KafkaCluster:
        if not self.nodes or not any(n.alive for n in self.nodes.values()):
            self.launch()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- per node -----------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.line.version

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values())

    @property
    def secure_bootstrap(self) -> str:
        """The SASL_SSL listeners (clusters started with ``security``)."""
        if self.security is None:
            raise RuntimeError("this cluster has no secured listener")
        return ",".join(f"{n.host}:{n.secure_port}" for n in self.nodes.values())

    def grant(self, principal: str, *grants: tuple[str, str, str, Sequence[str]]) -> None:
        """Allow ``principal`` the operations of ``grants`` (see
        :func:`tests.testbed.security.acl_bindings`), through the administration listener."""
        from tests.testbed.security import acl_bindings

        admin = self.admin()
        for future in admin.create_acls(acl_bindings(principal, grants)).values():
            future.result(30)

    @property
    def alive(self) -> bool:
        return all(n.alive for n in self.nodes.values())

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id]

    def stop_broker(self, node_id: int, timeout: float = 30.0) -> None:
        self.nodes[node_id].stop(timeout)

    def kill_broker(self, node_id: int) -> None:
        self.nodes[node_id].kill()

    def start_broker(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped node again with its data and wait until every node sees it."""
        node = self.nodes[node_id]
        t0 = time.monotonic()
        node.launch()
        node.wait_ready(timeout, expect_brokers=1)
        self.wait_for_brokers(set(self.nodes), timeout=timeout)
        node.startup_seconds = time.monotonic() - t0

    def restart_broker(self, node_id: int, timeout: float = 120.0, *, hard: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with ``hard``) and start one node."""
        if hard:
            self.kill_broker(node_id)
        else:
            self.stop_broker(node_id)
        self.start_broker(node_id, timeout)

    def wait_for_brokers(self, node_ids: set[int], timeout: float = 60.0) -> None:
        """Wait until every live node's Metadata lists exactly ``node_ids``."""
        deadline = time.monotonic() + timeout
        while True:
            seen: list[set[int]] = []
            for node in self.nodes.values():
                if node.alive:
                    try:
                        seen.append(set(metadata(node.bootstrap, 2.0).brokers))
                    except (OSError, ConnectionError, struct.error):
                        seen.append(set())
            if seen and all(s == node_ids for s in seen):
                return
            if time.monotonic() > deadline:
                raise BrokerStartError(f"brokers {node_ids} not all visible: {seen}")
            time.sleep(0.2)

    def log_files(self) -> list[Path]:
        return [n.log_file for n in self.nodes.values()]

    def copy_logs(self, dest: Path) -> Path:
        """Copy every node's logs and config to ``dest/node-N/``; return ``dest``."""
        for node in self.nodes.values():
            target = dest / f"node-{node.node_id}"
            target.mkdir(parents=True, exist_ok=True)
            if node.log_dir.is_dir():
                shutil.copytree(node.log_dir, target, dirs_exist_ok=True)
            if node.config_file.is_file():
                shutil.copy2(node.config_file, target / "server.properties")
        return dest

    # -- topics -----------------------------------------------------------------------------

    def admin(self) -> Any:
        """A confluent-kafka ``AdminClient`` bound to this cluster."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        *,
        replica_assignment: Sequence[Sequence[int]] | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create a topic and wait until every partition has a leader on every node."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        if replica_assignment is not None:
            new = NewTopic(
                name,
                # confluent-kafka 2.16 wants the partition count here, despite its docs
                num_partitions=len(replica_assignment),
                replication_factor=-1,
                replica_assignment=[list(r) for r in replica_assignment],
                config=dict(config or {}),
            )
            partitions = len(replica_assignment)
        else:
            new = NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication_factor,
                config=dict(config or {}),
            )
        admin = self.admin()  # keep a reference: the futures fail if the client is collected
        futures = admin.create_topics([new], operation_timeout=timeout)
        futures[name].result(timeout)
        self.wait_for_topic(name, lambda t: t is not None and _all_led(t, partitions), timeout)

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        """Delete a topic and wait until no node lists it."""
        admin = self.admin()
        futures = admin.delete_topics([name], operation_timeout=timeout)
        futures[name].result(timeout)
        self.wait_for_topic(name, lambda t: t is None, timeout)

    def topic_leaders(self, name: str, timeout: float = 10.0) -> dict[int, int]:
        """Partition -> leader node id, as the first live node reports it. librdkafka may ask
        any node it learnt of, and a node can answer UNKNOWN_TOPIC_OR_PART for a topic every
        node listed a moment before (seen once on three nodes): asked again until
        ``timeout``."""
        node = next(n for n in self.nodes.values() if n.alive)
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        while True:
            md = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 3}).list_topics(
                name, timeout=10
            )
            topic = md.topics[name]
            if topic.error is None:
                return {p.id: p.leader for p in topic.partitions.values()}
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name}: {topic.error}")
            time.sleep(0.2)

    def wait_for_preferred_leaders(self, name: str, timeout: float = 60.0) -> dict[int, int]:
        """Wait until every partition of ``name`` is led by its first replica (and that replica
        is in sync); return partition -> leader."""

        def preferred(topic: Any) -> bool:
            return topic is not None and all(
                p.replicas and p.leader == p.replicas[0] and p.replicas[0] in p.isrs
                for p in topic.partitions.values()
            )

        self.wait_for_topic(name, preferred, timeout)
        return self.topic_leaders(name)

    def wait_for_topic(self, name: str, predicate: Callable[[Any], bool], timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        while True:
            ok = True
            for node in self.nodes.values():
                if not node.alive:
                    continue
                md = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 3}).list_topics(
                    timeout=10
                )
                topic = md.topics.get(name)
                if topic is not None and topic.error is not None:
                    topic = None
                if not predicate(topic):
                    ok = False
                    break
            if ok:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} did not reach the expected state")
            time.sleep(0.2)


def _all_led(topic: Any, partitions: int) -> bool:
    parts = topic.partitions
    return len(parts) == partitions and all(p.leader >= 0 for p in parts.values())


def _half(heap: str) -> str:
    num, unit = heap[:-1], heap[-1]
    if unit.isdigit():
        return str(int(heap) // 2)
    return f"{max(1, int(num) // 2)}{unit}"


class KafkaBroker(KafkaCluster):
    """A single-node KRaft Kafka (node id 1) with the per-node operations at top level."""

    def __init__(
        self, version: str | KafkaLine, workdir: Path | str | None = None, **kwargs: Any
    ) -> None:
        kwargs.pop("size", None)
        super().__init__(version, workdir, size=1, **kwargs)

    @classmethod
    def start(
        cls, version: str | KafkaLine, workdir: Path | str | None = None, **kwargs: Any
    ) -> KafkaBroker:
        broker = cls(version, workdir, **kwargs)
        broker.launch()
        return broker

    def __enter__(self) -> KafkaBroker:
        super().__enter__()
        return self

    @property
    def node_id(self) -> int:
        return 1

    @property
    def port(self) -> int:
        return self.nodes[1].port

    @property
    def log_dir(self) -> Path:
        return self.nodes[1].log_dir

    @property
    def data_dir(self) -> Path:
        return self.nodes[1].data_dir

    @property
    def log_file(self) -> Path:
        return self.nodes[1].log_file

    def restart(self, timeout: float = 120.0, *, hard: bool = False) -> None:
        self.restart_broker(1, timeout, hard=hard)

    def stop_node(self, timeout: float = 30.0) -> None:
        """Stop the JVM but keep the work directory, for :meth:`start_node`."""
        self.stop_broker(1, timeout)

    def start_node(self, timeout: float = 120.0) -> None:
        self.start_broker(1, timeout)


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.testbed.broker [3.9|4.4] [SIZE]``: run a cluster until Ctrl-C."""
    args = list(sys.argv[1:] if argv is None else argv)
    version = args[0] if args else "3.9"
    size = int(args[1]) if len(args) > 1 else 1
    cluster = KafkaCluster.start(version, size=size)
    print(f"Kafka {cluster.version} ready in {cluster.startup_seconds:.1f}s: {cluster.bootstrap}")
    print(f"work dir: {cluster.workdir}", flush=True)
    try:
        while cluster.alive:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


@contextlib.contextmanager
def running(version: str | KafkaLine, **kwargs: Any) -> Iterator[KafkaCluster]:
    """``with running("4.4", size=3) as cluster:`` start, yield, stop."""
    cluster = KafkaCluster.start(version, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(_main())
