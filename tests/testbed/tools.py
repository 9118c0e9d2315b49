"""Kafka's own Java tools as subprocesses: VerifiableProducer, VerifiableConsumer, consumer groups.

The verifiable tools print one JSON object per line on stdout; :class:`JavaTool` runs a tool with
its line's classpath (see :mod:`tests.testbed.distributions`), collects those events on a reader
thread, and lets a test wait for conditions on them. :class:`VerifiableConsumer` keeps the current
assignment and the consumed offsets, :class:`VerifiableProducer` the acknowledged records, so a
test can check that every acknowledged record was consumed. :func:`consumer_groups` runs the
consumer-groups command and :func:`parse_table` reads its tables. :class:`ConnectWorker` runs a
Kafka Connect worker in distributed mode and talks to its REST API.

Tools are short-lived JVMs in their own process group; :meth:`JavaTool.stop` sends SIGTERM (the
tools then print ``shutdown_complete``) and SIGKILLs after a grace period.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from proxy.process import exit_with_parent
from tests.testbed import artifacts
from tests.testbed.broker import free_ports
from tests.testbed.distributions import KafkaLine, get_line

__all__ = [
    "TOOL_JVM_FLAGS",
    "ConnectWorker",
    "JavaTool",
    "ToolError",
    "VerifiableConsumer",
    "VerifiableProducer",
    "consumer_groups",
    "describe_group",
    "list_groups",
    "missing_records",
    "parse_table",
]

TOOL_JVM_FLAGS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)

Event = dict[str, Any]
TopicPartition = tuple[str, int]

_LIVE: set[JavaTool] = set()
_LIVE_LOCK = threading.Lock()


class ToolError(RuntimeError):
    """A tool failed, or a condition on its events was not met in time."""


def kill_all() -> None:
    """SIGKILL every tool this process started that is still running."""
    with _LIVE_LOCK:
        tools = list(_LIVE)
    for tool in tools:
        tool.kill()


atexit.register(kill_all)


def _write_properties(path: Path, props: Mapping[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


class JavaTool:
    """A Java main class of a Kafka line, run with the line's tools classpath.

    Call :meth:`start` (or use it as a context manager); ``events`` fills as JSON lines arrive.
    Non-JSON stdout lines are kept in ``other_output``; stderr goes to ``stderr_file``.
    """

    accepts_commands = False
    """Whether the tool reads commands from stdin (:meth:`send`)."""

    def __init__(
        self,
        line: str | KafkaLine,
        main_class: str,
        args: Sequence[str],
        *,
        workdir: Path | None = None,
        jvm_flags: Sequence[str] = TOOL_JVM_FLAGS,
        classpath: Sequence[Path] | None = None,
        name: str | None = None,
    ) -> None:
        self.line = get_line(line)
        self.main_class = main_class
        self.args = list(args)
        self.name = name or main_class.rsplit(".", 1)[-1]
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"groupgate-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.jvm_flags = list(jvm_flags)
        self._classpath = list(classpath) if classpath is not None else None
        self.events: list[Event] = []
        self.other_output: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._eof = False
        self.stderr_file = self.workdir / f"{self.name}.stderr"
        self.wrapper: list[str] = []
        """A command prefix the JVM runs under (e.g. ``ip netns exec POD``: a pod's client)."""

    def command(self) -> list[str]:
        cp = self._classpath if self._classpath is not None else self.line.tools_classpath()
        log_flags = self.line.log_config(self.workdir / f"{self.name}-log.properties", None)
        return [
            *self.wrapper,
            artifacts.require_java(),
            *self.jvm_flags,
            *log_flags,
            "-cp",
            artifacts.classpath_string(cp),
            self.main_class,
            *self.args,
        ]

    def start(self) -> JavaTool:
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started")
        cmd = self.command()
        (self.workdir / f"{self.name}.cmd").write_text(" ".join(cmd) + "\n")
        err = open(self.stderr_file, "w")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if self.accepts_commands else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
                start_new_session=True,
                preexec_fn=exit_with_parent(signal.SIGKILL),
            )
        finally:
            err.close()
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-stdout", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            with self._cond:
                if isinstance(event, dict):
                    self._on_event(event)
                    self.events.append(event)
                else:
                    self.other_output.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _on_event(self, event: Event) -> None:
        """Hook for subclasses; called with the condition lock held."""

    def send(self, line: str) -> None:
        """Write one command line to the tool's stdin (tools with ``accepts_commands``)."""
        if self.proc is None or self.proc.stdin is None:
            raise RuntimeError(f"{self.name} takes no commands")
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    # -- waiting ------------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str = "") -> None:
        """Wait until ``predicate()`` (evaluated under the event lock) is true."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ToolError(
                        f"{self.name}: timed out waiting for {what or predicate}"
                        f"\n{self.stderr_tail()}"
                    )
                if self._eof:
                    raise ToolError(
                        f"{self.name} exited (rc={self.returncode}) before {what or predicate}"
                        f"\n{self.stderr_tail()}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def wait_event(
        self, name: str, timeout: float = 60.0, where: Callable[[Event], bool] | None = None
    ) -> Event:
        """Wait for an event called ``name`` (optionally matching ``where``); return it."""
        found: list[Event] = []

        def match() -> bool:
            for ev in self.events:
                if ev.get("name") == name and (where is None or where(ev)):
                    found.append(ev)
                    return True
            return False

        self.wait_for(match, timeout, f"event {name}")
        return found[0]

    def events_named(self, name: str) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.get("name") == name]

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Wait for the process to end on its own; return its exit code."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} not started")
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise ToolError(f"{self.name} still running after {timeout}s") from exc
        self._finish()
        return rc

    def _finish(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.stderr_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- stopping -----------------------------------------------------------------------------

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (the tools shut down cleanly and report it), SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self._finish()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._finish()

    def __enter__(self) -> JavaTool:
        if self.proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _config_flag(line: KafkaLine) -> str:
    # 4.x deprecates --producer.config/--consumer.config in favour of --command-config.
    return "--command-config" if int(line.tools_version.split(".")[0]) >= 4 else ""


class VerifiableProducer(JavaTool):
    """``VerifiableProducer``: sends increasing integers as values, reports every ack.

    Events: ``startup_complete``, ``producer_send_success`` (topic, partition, offset, key,
    value), ``producer_send_error``, ``shutdown_complete``, ``tool_data`` (sent, acked, ...).
    """

    def __init__(
        self,
        line: str | KafkaLine,
        bootstrap: str,
        topic: str,
        *,
        max_messages: int = -1,
        throughput: int = -1,
        acks: int = -1,
        value_prefix: int | None = None,
        repeating_keys: int | None = None,
        config: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        jvm_flags: Sequence[str] = TOOL_JVM_FLAGS,
    ) -> None:
        kline = get_line(line)
        args = [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--max-messages",
            str(max_messages),
            "--throughput",
            str(throughput),
            "--acks",
            str(acks),
        ]
        if value_prefix is not None:
            args += ["--value-prefix", str(value_prefix)]
        if repeating_keys is not None:
            args += ["--repeating-keys", str(repeating_keys)]
        super().__init__(
            kline,
            kline.verifiable_producer_main,
            args,
            workdir=workdir,
            jvm_flags=jvm_flags,
            name="verifiable-producer",
        )
        if config:
            path = _write_properties(self.workdir / "producer.properties", config)
            self.args += [_config_flag(kline) or "--producer.config", str(path)]
        self.acked: list[tuple[str, int, int, str | None]] = []  # topic, partition, offset, value
        self.errors: list[Event] = []

    def _on_event(self, event: Event) -> None:
        name = event.get("name")
        if name == "producer_send_success":
            self.acked.append(
                (event["topic"], int(event["partition"]), int(event["offset"]), event.get("value"))
            )
        elif name == "producer_send_error":
            self.errors.append(event)

    def wait_acked(self, n: int, timeout: float = 60.0) -> None:
        self.wait_for(lambda: len(self.acked) >= n, timeout, f"{n} acked records")

    def run(self, timeout: float = 120.0) -> list[tuple[str, int, int, str | None]]:
        """Start, wait for the tool to finish (needs ``max_messages``), return the acks."""
        if self.proc is None:
            self.start()
        rc = self.wait_exit(timeout)
        if rc != 0:
            raise ToolError(f"verifiable producer exited with {rc}:\n{self.stderr_tail()}")
        return list(self.acked)


class VerifiableConsumer(JavaTool):
    """``VerifiableConsumer``: one group member that reports assignments and consumed ranges.

    Events: ``startup_complete``, ``partitions_assigned`` / ``partitions_revoked`` (partitions:
    [{topic, partition}]), ``records_consumed`` (count, partitions: [{topic, partition, count,
    minOffset, maxOffset}]), ``record_data`` (with ``verbose``), ``offsets_committed``,
    ``shutdown_complete``. ``group_protocol="consumer"`` needs a 4.x broker (or the proxy).
    """

    def __init__(
        self,
        line: str | KafkaLine,
        bootstrap: str,
        topic: str,
        group_id: str,
        *,
        group_protocol: str = "classic",
        group_remote_assignor: str | None = None,
        assignment_strategy: str | None = None,
        group_instance_id: str | None = None,
        max_messages: int = -1,
        session_timeout_ms: int | None = None,
        enable_autocommit: bool = False,
        reset_policy: str = "earliest",
        verbose: bool = False,
        config: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        jvm_flags: Sequence[str] = TOOL_JVM_FLAGS,
    ) -> None:
        kline = get_line(line)
        args = [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--group-id",
            group_id,
            "--max-messages",
            str(max_messages),
            "--reset-policy",
            reset_policy,
        ]
        if group_protocol.lower() != "classic":
            args += ["--group-protocol", group_protocol]
        if group_remote_assignor:
            args += ["--group-remote-assignor", group_remote_assignor]
        if assignment_strategy:
            args += ["--assignment-strategy", _assignor_class(assignment_strategy)]
        if group_instance_id:
            args += ["--group-instance-id", group_instance_id]
        if session_timeout_ms is not None:
            args += ["--session-timeout", str(session_timeout_ms)]
        if enable_autocommit:
            args.append("--enable-autocommit")
        if verbose:
            args.append("--verbose")
        super().__init__(
            kline,
            kline.verifiable_consumer_main,
            args,
            workdir=workdir,
            jvm_flags=jvm_flags,
            name=f"verifiable-consumer-{group_instance_id or os.urandom(3).hex()}",
        )
        if config:
            path = _write_properties(self.workdir / f"{self.name}.properties", config)
            self.args += [_config_flag(kline) or "--consumer.config", str(path)]
        self.assignment: set[TopicPartition] = set()
        self.consumed: dict[TopicPartition, set[int]] = {}
        self.consumed_count = 0
        self.rebalances = 0
        self.records: list[Event] = []

    def _on_event(self, event: Event) -> None:
        name = event.get("name")
        if name == "partitions_assigned":
            self.rebalances += 1
            self.assignment |= {(p["topic"], int(p["partition"])) for p in event["partitions"]}
        elif name == "partitions_revoked":
            self.assignment -= {(p["topic"], int(p["partition"])) for p in event["partitions"]}
        elif name == "records_consumed":
            self.consumed_count += int(event.get("count", 0))
            for p in event.get("partitions", []):
                offsets = self.consumed.setdefault((p["topic"], int(p["partition"])), set())
                offsets.update(range(int(p["minOffset"]), int(p["maxOffset"]) + 1))
        elif name == "record_data":
            self.records.append(event)

    def wait_assigned(self, timeout: float = 60.0, at_least: int = 1) -> set[TopicPartition]:
        self.wait_for(lambda: len(self.assignment) >= at_least, timeout, "an assignment")
        with self._cond:
            return set(self.assignment)

    def wait_records(self, n: int, timeout: float = 60.0) -> None:
        """Wait until ``n`` records were consumed in total (duplicates count)."""
        self.wait_for(lambda: self.consumed_count >= n, timeout, f"{n} consumed records")

    def consumed_offsets(self) -> set[tuple[str, int, int]]:
        with self._cond:
            return {(t, p, o) for (t, p), offs in self.consumed.items() for o in offs}


_ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}


def _assignor_class(name: str) -> str:
    return _ASSIGNORS.get(name, name)


def consumer_groups(
    line: str | KafkaLine, bootstrap: str, *args: str, timeout: float = 60.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the consumer-groups command (``kafka-consumer-groups.sh``) with ``args``."""
    kline = get_line(line)
    tool = JavaTool(
        kline,
        kline.consumer_groups_main,
        ["--bootstrap-server", bootstrap, *args],
        name="consumer-groups",
    )
    proc = subprocess.run(
        tool.command(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise ToolError(
            f"consumer-groups {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return proc


def parse_table(text: str) -> list[dict[str, str]]:
    """Rows of the whitespace-aligned tables the group commands print (header row first).

    Several tables (one per group) are merged; a ``-`` cell is kept as ``-``.
    """
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            header = None
            continue
        if header is None:
            if cells[0] == "GROUP" or cells[0] == "GROUP-ID" or "TOPIC" in cells:
                header = cells
            continue
        if len(cells) > len(header):  # e.g. CONSUMER-ID with spaces: fold the tail
            cells = [*cells[: len(header) - 1], " ".join(cells[len(header) - 1 :])]
        rows.append(dict(zip(header, cells, strict=False)))
    return rows


def describe_group(
    line: str | KafkaLine, bootstrap: str, group: str, *extra: str
) -> list[dict[str, str]]:
    """``--describe --group GROUP`` (plus e.g. ``--members`` or ``--state``) as rows."""
    proc = consumer_groups(line, bootstrap, "--describe", "--group", group, *extra)
    return parse_table(proc.stdout)


def list_groups(line: str | KafkaLine, bootstrap: str) -> list[str]:
    proc = consumer_groups(line, bootstrap, "--list")
    return [g.strip() for g in proc.stdout.splitlines() if g.strip()]


def missing_records(
    acked: Iterable[tuple[str, int, int, Any]], consumers: Iterable[VerifiableConsumer]
) -> set[tuple[str, int, int]]:
    """Acknowledged (topic, partition, offset) triples that no consumer reported: empty is good."""
    seen: set[tuple[str, int, int]] = set()
    for c in consumers:
        seen |= c.consumed_offsets()
    return {(t, p, o) for t, p, o, _ in acked} - seen


class ConnectWorker(JavaTool):
    """A Kafka Connect worker in distributed mode (``ConnectDistributed``), 3.9 line.

    Workers started with the same ``group_id`` form one Connect group (protocol type
    ``connect``) through ``bootstrap`` and share its config, offset and status topics
    (``<group_id>-configs`` / ``-offsets`` / ``-status``, one partition each where allowed,
    replication factor 1). The REST API listens on a free port of 127.0.0.1, which is also the
    worker id that connector status reports (``worker_id``). The FileStream connectors and the
    String/JSON converters are on the classpath, found by ServiceLoader (no plugin.path).
    The worker logs at INFO to ``log_file``; stdout carries nothing of interest.
    """

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        *,
        line: str | KafkaLine = "3.9",
        config: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        jvm_flags: Sequence[str] = TOOL_JVM_FLAGS,
    ) -> None:
        kline = get_line(line)
        self.port = free_ports(1)[0]
        self.group_id = group_id
        super().__init__(
            kline,
            kline.connect_distributed_main,
            [],
            workdir=workdir,
            jvm_flags=jvm_flags,
            classpath=kline.connect_classpath(),
            name=f"connect-worker-{self.port}",
        )
        self.log_file = self.workdir / f"{self.name}.log"
        props = {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "config.storage.topic": f"{group_id}-configs",
            "offset.storage.topic": f"{group_id}-offsets",
            "status.storage.topic": f"{group_id}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "listeners": f"http://127.0.0.1:{self.port}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            "rest.advertised.listener": "http",
            "plugin.discovery": "service_load",
            "offset.flush.interval.ms": "1000",
            **(config or {}),
        }
        self.properties_file = _write_properties(self.workdir / f"{self.name}.properties", props)
        self.args = [str(self.properties_file)]

    def command(self) -> list[str]:
        assert self._classpath is not None
        log_flags = self.line.log_config(
            self.workdir / f"{self.name}-log.properties", self.log_file
        )
        return [
            *self.wrapper,
            artifacts.require_java(),
            *self.jvm_flags,
            *log_flags,
            "-cp",
            artifacts.classpath_string(self._classpath),
            self.main_class,
            *self.args,
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        """How Connect names this worker in connector and task status."""
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- REST ---------------------------------------------------------------------------------

    def rest(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        """One REST call: (HTTP status, decoded JSON body or None). Raises ``OSError`` when
        nothing answers (the worker is not listening yet, or gone)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return status, decoded

    def _poll_rest(
        self,
        method: str,
        path: str,
        accept: Callable[[int, Any], bool],
        timeout: float,
        what: str,
        body: Any = None,
    ) -> tuple[int, Any]:
        deadline = time.monotonic() + timeout
        last: tuple[int, Any] | str = "no answer"
        while True:
            if not self.running:
                raise ToolError(
                    f"{self.name} exited (rc={self.returncode}) before {what}\n{self.log_tail()}"
                )
            try:
                status, decoded = self.rest(method, path, body)
            except OSError as exc:  # connection refused / reset while starting
                last = repr(exc)
            else:
                if accept(status, decoded):
                    return status, decoded
                last = (status, decoded)
            if time.monotonic() > deadline:
                raise ToolError(
                    f"{self.name}: timed out waiting for {what}; last answer {last}"
                    f"\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait until ``GET /connectors`` answers 200: the REST resources are up and the worker
        has joined its group and read the config topic (it answers 409 while rebalancing)."""
        self._poll_rest("GET", "/connectors", lambda s, _: s == 200, timeout, "GET /connectors")

    def connectors(self) -> list[str]:
        status, body = self.rest("GET", "/connectors")
        if status != 200:
            raise ToolError(f"{self.name}: GET /connectors -> {status} {body}")
        return list(body)

    def create_connector(
        self, name: str, config: Mapping[str, str], timeout: float = 60.0
    ) -> dict[str, Any]:
        """``POST /connectors``, retried while the group rebalances (409); returns the body.

        A rejected configuration (400) raises at once. When an earlier attempt that timed out
        on this side did create it (409, already exists), its ``GET /connectors/NAME`` is
        returned instead."""

        def created(status: int, body: Any) -> bool:
            if status == 400:
                raise ToolError(f"{self.name}: connector {name} rejected: {body}")
            return status in (200, 201) or (status == 409 and "already exists" in str(body))

        status, body = self._poll_rest(
            "POST",
            "/connectors",
            created,
            timeout,
            f"connector {name} to be created",
            body={"name": name, "config": dict(config)},
        )
        if status == 409:
            _, body = self._poll_rest(
                "GET", f"/connectors/{name}", lambda s, _: s == 200, timeout, f"connector {name}"
            )
        return dict(body)

    def connector_status(self, name: str) -> dict[str, Any] | None:
        """``GET /connectors/NAME/status``, or None while it is unknown or not answerable."""
        try:
            status, body = self.rest("GET", f"/connectors/{name}/status")
        except OSError:  # not listening (yet, or any more), or too slow to answer
            return None
        return dict(body) if status == 200 else None


_COMMIT_CONSUMER = Path(__file__).resolve().parent / "java" / "CommitConsumer.java"


def compiled_java(source: Path, classpath: Sequence[Path]) -> Path:
    """Compile ``source`` against ``classpath`` once per source and classpath, into the
    cache; returns the directory of its classes."""
    digest = hashlib.sha256(source.read_bytes())
    for jar in classpath:
        digest.update(str(jar).encode())
    out = artifacts.cache_root() / "java" / f"{source.stem}-{digest.hexdigest()[:12]}"
    if (out / f"{source.stem}.class").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    javac = str(Path(artifacts.require_java()).with_name("javac"))
    proc = subprocess.run(
        [javac, "-nowarn", "-d", str(out), "-cp", artifacts.classpath_string(classpath),
         str(source)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise ToolError(f"javac {source.name} failed:\n{proc.stderr[-3000:]}")
    return out


class CommitConsumer(JavaTool):
    """A Java ``KafkaConsumer`` (the 4.4 client, either group protocol) committing the way
    applications do: ``commitAsync`` after every record (``mode="async"``), ``commitSync``
    after every poll (``"sync"``) or auto-commit (``"auto"``); ``slow_ms`` stalls every
    revocation callback, :meth:`stall` blocks its poll loop once. Events (JSON lines, ``t`` on
    the machine's monotonic clock): ``join``, ``stall`` / ``resume`` around callbacks,
    ``assign`` / ``revoke`` / ``lost`` (``p``: partitions), ``c`` (consumed, ``r``: [[partition,
    first, last]]), ``commit`` (``ok``, ``err``, ``o``: [[partition, offset]]), ``stuck`` /
    ``unstuck``, ``leave``, ``closed`` (see CommitConsumer.java)."""

    accepts_commands = True

    def __init__(self, bootstrap: str, topic: str, group_id: str, *, mode: str = "async",
                 group_protocol: str = "classic", slow_ms: int = 0,
                 config: Mapping[str, str] | None = None, workdir: Path | None = None,
                 name: str | None = None,
                 on_event: Callable[[Event], None] | None = None,
                 wrapper: Sequence[str] = ()) -> None:
        line = get_line("4.4")
        jars = line.clients_classpath()
        classes = compiled_java(_COMMIT_CONSUMER, jars)
        super().__init__(line, "CommitConsumer", [], workdir=workdir,
                         classpath=[*jars, classes],
                         name=name or f"commit-consumer-{os.urandom(3).hex()}")
        self.topic = topic
        self.wrapper = list(wrapper)
        props = {"bootstrap.servers": bootstrap, "group.id": group_id,
                 "group.protocol": group_protocol, "auto.offset.reset": "earliest",
                 **(config or {})}
        path = _write_properties(self.workdir / f"{self.name}.properties", props)
        self.args = [str(path), topic, mode, str(slow_ms)]
        self.consumed: dict[TopicPartition, set[int]] = {}
        self.committed: dict[TopicPartition, int] = {}
        """The highest offset each partition's successful commits reached."""
        self.commit_errors: list[str] = []
        self.commits = 0
        self.on_event = on_event
        """Also called with every event (from the reader thread)."""

    def _on_event(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        kind = event.get("e")
        if kind == "c":
            for partition, first, last in event["r"]:
                self.consumed.setdefault((self.topic, int(partition)), set()).update(
                    range(int(first), int(last) + 1))
        elif kind == "commit":
            self.commits += 1
            if not event["ok"]:
                self.commit_errors.append(str(event["err"]))
                return
            for partition, offset in event["o"]:
                tp = (self.topic, int(partition))
                self.committed[tp] = max(self.committed.get(tp, -1), int(offset))

    def stall(self, seconds: float) -> None:
        """Block the poll loop once for ``seconds`` (before committing what it just read)."""
        self.send(f"stall {seconds}")

    @property
    def consumed_count(self) -> int:
        return sum(len(v) for v in self.consumed.values())
