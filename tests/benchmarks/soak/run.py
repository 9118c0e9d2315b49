"""The soak: real clients of several libraries in several groups, under continuous production
and random failures, with the invariants checked on everything they did.

A Kafka 3.9 broker from the test bed with groupgate in front of it (fixed ports, so that a
restarted proxy is found where the old one was). A producer writes to one topic per group
through the proxy at a steady rate. Each group has members of several kinds (library x group
protocol x commit style, :data:`GROUPS`), each a process of its own reporting its callbacks,
the records it consumed and every commit's outcome (:mod:`tests.benchmarks.soak.member`, the Java
``CommitConsumer``). A seeded schedule then applies random events, every kind once in a
random order before any kind repeats: a member joins, leaves gracefully, is SIGKILLed, or
stalls past its ``max.poll.interval.ms``; the proxy is restarted (SIGTERM) or killed
(SIGKILL) and started again; the broker restarts.

Meanwhile the committed offsets of every group are read straight from the broker every second
and the proxy's RSS every two seconds. At the end production stops, every group gets a live
member, the groups catch up, and :mod:`tests.benchmarks.soak.checks` judges the run: no committed
offset moved backwards, no acknowledged record went unconsumed, no partition had two owners
except a fenced zombie (whose late commits must have failed), and the proxy's memory did not
grow after warm-up beyond a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from proxy.commands import machine
from proxy.process import ProxyProcess
from tests.benchmarks.rebalance.timeline import Event, State, compute
from tests.benchmarks.soak import checks
from tests.testbed.artifacts import java_executable
from tests.testbed.broker import KafkaBroker, KafkaCluster, free_ports
from tests.testbed.pods import Pod, PodNetwork, frozen, netem_available
from tests.testbed.tools import CommitConsumer

HOST = "host"
"""Where the proxy runs without pods: this machine's loopback."""
SIDECAR = "127.0.0.1:9092"
"""Where a pod's sidecar listens, in the pod's own network namespace."""
FLEET_PORT = 9191
"""Where each pod's sidecar listens for the others (on the pod's address)."""
EVENT_KINDS = ("join", "leave", "kill", "stall", "proxy-restart", "proxy-kill",
               "broker-restart")
FLEET_EVENT_KINDS = ("coordinator-kill", "coordinator-restart", "join-coordinator-kill",
                     "sidecar-roll", "broker-kill", "join-broker-kill", "coordinator-freeze",
                     "join-coordinator-freeze", "coordinator-cutoff", "slow-link")
"""Events of the sidecar topology (``--pods``): SIGKILL or graceful restart of the sidecar
that coordinates a group (started again at once, as Kubernetes restarts a container); a
member joining and, a second later, its group's coordinating sidecar SIGKILLed; every pod's
sidecar restarted one at a time (a rollout); with 3 brokers, SIGKILL of the broker that
coordinates the group at the broker (started again 10 s later), alone or a second after a
member starts joining. For :attr:`Settings.fault_s` each (:mod:`tests.testbed.pods`): the
coordinating sidecar frozen (SIGSTOP, then SIGCONT), alone or with a member joining a second
later behind another sidecar (the one with the fewest members of the group: a scale-out); the
coordinating pod cut off from the brokers (a partition; its loopback and the other pods stay
reachable); a random pod's link slowed by :attr:`Settings.slow_link_ms` (netem; skipped
where the kernel has none)."""
SERVED_EVENTS = frozenset({"join", "coordinator-kill", "coordinator-restart",
                           "join-coordinator-kill", "sidecar-roll", "broker-kill",
                           "join-broker-kill", "proxy-kill", "proxy-restart",
                           "coordinator-freeze", "join-coordinator-freeze",
                           "coordinator-cutoff", "slow-link"})
"""Events after which the report says how long until the group was served again (for a join:
converged with the new member owning its share)."""


@dataclass(frozen=True)
class Kind:
    """One kind of member: client library, group protocol, assignor, commit style."""

    library: str  # confluent, kafka-python, java
    protocol: str  # classic, consumer
    assignor: str
    commit: str  # async, sync, auto

    @property
    def label(self) -> str:
        return f"{self.library}/{self.protocol}/{self.assignor}/{self.commit}"


def _kinds(classic_assignor: str, spec: str) -> tuple[Kind, ...]:
    out = []
    for item in spec.split():
        library, protocol, commit = item.split("/")
        assignor = classic_assignor if protocol == "classic" else "uniform"
        out.append(Kind(library, protocol, assignor, commit))
    return tuple(out)


GROUPS: dict[str, tuple[Kind, ...]] = {
    # classic members of one group share one assignor name, as at a Kafka broker
    "eager": _kinds("range", "confluent/classic/async confluent/consumer/async "
                             "java/classic/async kafka-python/classic/auto java/consumer/sync"),
    "cooperative": _kinds("cooperative-sticky",
                          "confluent/classic/sync java/classic/auto confluent/consumer/sync "
                          "java/consumer/async kafka-python/classic/async"),
    "roundrobin": _kinds("roundrobin", "kafka-python/classic/sync confluent/classic/auto "
                                       "confluent/consumer/auto java/consumer/auto "
                                       "java/classic/sync"),
}


FLEET_SESSION_MS = 19_000
"""Members' sessions with pods (a fleet): the shortest whole second the fleet's rule accepts
for every member here (docs/operations.md, "How long a request can wait"; groupgate refuses
less with fleet-listen set): group-heartbeat-interval-ms (1 s) + broker-session-timeout-ms
(6 s) + 11 s = 18 s for new-protocol members; the classic members here heartbeat every tenth
of their own session, which therefore needs S >= S/10 + 17 s, 18.9 s."""


@dataclass
class Settings:
    duration_s: float = 120.0
    seed: int = 1
    partitions: int = 6
    rate_per_partition: float = 10.0
    min_event_gap_s: float = 5.0
    max_event_gap_s: float = 10.0
    max_members: int = 4
    session_timeout_ms: int = 0
    """Members' sessions (new-protocol members' from the proxy, classic members' own); 0: 9 s
    with one proxy, :data:`FLEET_SESSION_MS` with pods."""
    max_poll_interval_ms: int = 0
    """0: twice the session."""
    heartbeat_interval_ms: int = 1000
    """Handed to new-protocol members by the proxy."""
    events: tuple[str, ...] = EVENT_KINDS
    catch_up_s: float = 180.0
    rss_warmup_s: float = 30.0
    rss_bound_mib: float = 64.0
    """Largest RSS growth after warm-up that counts as flat."""
    pods: int = 0
    """0: one proxy on this machine's loopback with every member behind it. N: N pods
    (network namespaces, :mod:`tests.testbed.pods`), each with its own sidecar on
    ``127.0.0.1:9092``, the members spread over them in turn, the broker on the pods' bridge:
    several sidecars serving one group, as in the Kubernetes deployment."""
    brokers: int = 1
    """Kafka nodes (KRaft, combined); with 3 the broker side fails over too (``broker-kill``)."""
    groups: tuple[str, ...] = tuple(GROUPS)
    """The groups that run (a subset of :data:`GROUPS`)."""
    initial: tuple[str, ...] = ()
    """The members at the start, each ``GROUP:LIBRARY/PROTOCOL/COMMIT[@POD]`` (POD: 1-based,
    else the pods in turn); empty: two random kinds per group."""
    script: tuple[str, ...] = ()
    """Events at fixed times instead of random ones, each ``SECONDS:KIND[:GROUP[:WHO]]``
    (WHO, for leave, kill and stall: ``LIBRARY/PROTOCOL``, a live member of that kind). The
    seconds count from the start of the run (before the broker starts); a leave, kill or stall
    due then waits until its group has formed (:meth:`Soak.formed`)."""
    restart_delay_s: float = 1.0
    """After a sidecar is SIGKILLed, how long until it is started again (Kubernetes restarts
    a crashed container at once, then with back-off)."""
    fault_s: float = 10.0
    """``coordinator-freeze``, ``coordinator-cutoff``, ``slow-link``: how long the fault lasts
    before it is undone."""
    slow_link_ms: float = 200.0
    """``slow-link``: the delay added to everything the pod sends."""
    broker_down_s: float = 0.0
    """``broker-restart``: how long the stopped broker stays down before it starts again (on
    top of its own stop and start; with more than a broker session, every lease lapses)."""
    roll_gap_s: float = 10.0
    """``sidecar-roll``: seconds between one pod's sidecar being ready and the next one's
    stop (a Deployment's ``minReadySeconds``)."""
    kafka: str = "3.9"
    """The Kafka line of the brokers (``4.4``: the native KIP-848 coordinator)."""
    direct: bool = False
    """No proxies: the members (in their pods, if any) connect to the brokers themselves, the
    brokers' own coordinator serves the group: the reference the proxy is compared with."""
    proxy_args: tuple[str, ...] = ()
    """More flags for every proxy (e.g. ``--broker-session-timeout-ms 9000``)."""
    broker_properties: tuple[str, ...] = ()
    """``KEY=VALUE`` broker settings over the test bed's (e.g. ``broker.session.timeout.ms``)."""
    join_kind: str = ""
    """``LIBRARY/PROTOCOL/COMMIT`` of the members scripted events add; empty: a random kind
    of the group."""
    client_config: tuple[str, ...] = ()
    """``KEY=VALUE`` settings for every confluent-kafka member (e.g. a short
    ``connections.max.idle.ms``: the client closes its idle connections itself)."""

    def __post_init__(self) -> None:
        if not self.session_timeout_ms:
            self.session_timeout_ms = FLEET_SESSION_MS if self.pods else 9000
        if not self.max_poll_interval_ms:
            self.max_poll_interval_ms = 2 * self.session_timeout_ms


class Member:
    """One member process and what it reported."""

    def __init__(self, name: str, group: str, kind: Kind, soak: Soak, pod: Pod | None = None
                 ) -> None:
        self.name = name
        self.group = group
        self.kind = kind
        self.soak = soak
        self.pod = pod
        """The pod the member runs in (behind that pod's sidecar), None without pods."""
        self.proc: subprocess.Popen[str] | None = None
        self.java: CommitConsumer | None = None
        self.alive = False
        self.stuck_until = 0.0

    def start(self) -> None:
        s = self.soak
        topic, group_id = s.topic(self.group), s.group_id(self.group)
        bootstrap = (s.broker_bootstrap if s.settings.direct
                     else SIDECAR if self.pod is not None else s.bootstrap)
        wrapper = self.pod.command([]) if self.pod is not None else []
        if self.kind.library == "java":
            config = {"client.id": self.name,
                      "max.poll.interval.ms": str(s.settings.max_poll_interval_ms)}
            if self.kind.protocol == "classic":
                config.update({
                    "session.timeout.ms": str(s.settings.session_timeout_ms),
                    "heartbeat.interval.ms": str(s.settings.session_timeout_ms // 10),
                    "partition.assignment.strategy": _java_assignor(self.kind.assignor)})
            else:
                config["group.remote.assignor"] = self.kind.assignor
            if self.kind.commit == "auto":
                config["auto.commit.interval.ms"] = "1000"
            self.java = CommitConsumer(bootstrap, topic, group_id, mode=self.kind.commit,
                                       group_protocol=self.kind.protocol, config=config,
                                       workdir=s.workdir / "members", name=self.name,
                                       on_event=self._on_event, wrapper=wrapper)
            self.java.start()
            threading.Thread(target=self._watch_java, daemon=True).start()
        else:
            command = [*wrapper, sys.executable, "-m", "tests.benchmarks.soak.member",
                       "--library", self.kind.library, "--protocol", self.kind.protocol,
                       "--assignor", self.kind.assignor, "--commit", self.kind.commit,
                       "--bootstrap", bootstrap, "--topic", topic, "--group", group_id,
                       "--name", self.name,
                       "--session-timeout-ms", str(s.settings.session_timeout_ms),
                       "--max-poll-interval-ms", str(s.settings.max_poll_interval_ms)]
            if self.kind.library == "confluent":
                command += [f"--config={item}" for item in s.settings.client_config]
            log = open(s.workdir / "members" / f"{self.name}.stderr", "w")  # noqa: SIM115
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True, bufsize=1,
                                         start_new_session=True)
            log.close()
            threading.Thread(target=self._read, daemon=True).start()
        self.alive = True

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self._on_event(event)
        self._ended(self.proc.wait())

    def _watch_java(self) -> None:
        assert self.java is not None and self.java.proc is not None
        self._ended(self.java.proc.wait())

    def _ended(self, returncode: int) -> None:
        """The process is gone. If the soak neither stopped nor killed it, the client died
        on its own: a crash on the timeline (it owns nothing from now on) and a finding."""
        if not self.alive:
            return
        self.alive = False
        self.soak.exited(self, returncode)

    def _on_event(self, event: dict[str, Any]) -> None:
        self.soak.record(self, event)

    def send(self, line: str) -> None:
        if self.java is not None:
            self.java.send(line)
        elif self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def pid(self) -> int | None:
        if self.java is not None:
            return self.java.proc.pid if self.java.proc is not None else None
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        if self.java is not None:
            return self.java.running
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Graceful: SIGTERM, the client closes and leaves its group."""
        self.alive = False
        if self.java is not None:
            self.java.stop(timeout=30)
        elif self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> float:
        """SIGKILL; returns the time the process was gone."""
        self.alive = False
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if self.java is not None and self.java.proc is not None:
            self.java.proc.wait(10)
        elif self.proc is not None:
            self.proc.wait(10)
        return time.monotonic()


def _java_assignor(name: str) -> str:
    from tests.testbed.tools import _assignor_class

    return _assignor_class(name)


@dataclass
class GroupRecord:
    """Everything one group's members reported, and what the soak did to them."""

    name: str
    events: list[Event] = field(default_factory=list)
    consumed: dict[int, checks.Intervals] = field(default_factory=dict)
    records_consumed: int = 0
    commits: list[checks.Commit] = field(default_factory=list)
    commit_failures: int = 0
    commit_errors: dict[str, int] = field(default_factory=dict)
    stalls: list[tuple[str, float, float]] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    exits: list[dict[str, Any]] = field(default_factory=list)
    """Members whose process ended on its own (the client library gave up)."""
    starts: list[checks.Start] = field(default_factory=list)
    """The first offset each member consumed of a partition after being given it."""
    awaiting: dict[tuple[str, int], float] = field(default_factory=dict)
    """(member, partition) given to the member at this time, not consumed from since."""
    reads: list[tuple[float, str, int, int, int]] = field(default_factory=list)
    """What each member reported reading, when: (t, member, partition, first, last offset)."""


class Soak:
    def __init__(self, settings: Settings, workdir: Path, out: Callable[[str], None] = print
                 ) -> None:
        self.settings = settings
        self.workdir = workdir
        self.out = out
        self.rng = random.Random(settings.seed)
        self.lock = threading.Lock()
        self.groups = {name: GroupRecord(name) for name in settings.groups}
        self.members: dict[str, Member] = {}
        self.member_count = 0
        self.produced: dict[str, dict[int, int]] = {name: {} for name in settings.groups}
        self.offsets = checks.OffsetWatch()
        self.rss: list[tuple[float, int, float]] = []
        self.cpu: dict[int, tuple[str, float]] = {}
        """Proxy incarnation -> (where it ran, CPU seconds it had used when last sampled)."""
        self.holders: list[tuple[float, str, str]] = []
        """(t, group, pod) whenever the pod whose sidecar holds a group was seen to change."""
        self.applied: list[dict[str, Any]] = []
        self.incarnation = 0
        self.broker: KafkaCluster | None = None
        self.network: PodNetwork | None = None
        self.pods: list[Pod] = []
        self.proxies: dict[str, ProxyProcess] = {}
        """Where a proxy runs (``host``, or a pod's name) -> the proxy running there."""
        self.proxy_incarnation: dict[str, int] = {}
        self.listen_port, self.broker_port_base = free_ports(2)
        self.suffix = f"{settings.seed}-{os.urandom(2).hex()}"
        self.stopping = threading.Event()
        self.producers: list[subprocess.Popen[str]] = []
        self.caught_up = True
        self.chaos_end = float("inf")
        """When events stop (production stops and the groups catch up after that)."""

    # -- names ------------------------------------------------------------------------------

    def topic(self, group: str) -> str:
        return f"soak-{group}-{self.suffix}"

    def group_id(self, group: str) -> str:
        return f"soak-{group}-{self.suffix}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    # -- recording --------------------------------------------------------------------------

    def record(self, member: Member, event: dict[str, Any]) -> None:
        kind = event.get("e")
        t = float(event.get("t", time.monotonic()))
        g = self.groups[member.group]
        with self.lock:
            if kind in ("join", "assign", "revoke", "lost", "stall", "resume", "leave"):
                g.events.append(Event(t, member.name, kind, tuple(event.get("p", ()))))
                if kind == "assign":
                    for partition in event.get("p", ()):
                        g.awaiting[(member.name, int(partition))] = t
            elif kind == "c":
                for partition, first, last in event["r"]:
                    given = g.awaiting.pop((member.name, partition), None)
                    if given is not None:
                        g.starts.append(checks.Start(given, member.name, partition, first))
                    runs = g.consumed.get(partition, [])
                    g.consumed[partition] = checks.add_run(runs, first, last)
                    g.records_consumed += last - first + 1
                    g.reads.append((t, member.name, partition, first, last))
            elif kind == "commit":
                if event["ok"]:
                    sent = float(event.get("sent", t))
                    for partition, offset in event["o"]:
                        g.commits.append(checks.Commit(t, member.name, partition, offset, sent))
                else:
                    g.commit_failures += 1
                    reason = str(event.get("err"))[:80]
                    g.commit_errors[reason] = g.commit_errors.get(reason, 0) + 1
            elif kind == "stuck":
                g.stalls.append((member.name, t, t + float(event["s"])))
            elif kind == "blocked":  # a synchronous commit held its poll loop
                g.stalls.append((member.name, float(event["since"]), t))

    def exited(self, member: Member, returncode: int) -> None:
        t = time.monotonic()
        stderr = self.workdir / "members" / f"{member.name}.stderr"
        try:
            tail = stderr.read_text(errors="replace").strip().splitlines()[-1:]
        except OSError:
            tail = []
        with self.lock:
            g = self.groups[member.group]
            g.events.append(Event(t, member.name, "crash"))
            g.exits.append({"t": t, "member": member.name, "returncode": returncode,
                            "last_error": tail[0][:300] if tail else ""})

    # -- processes ----------------------------------------------------------------------------

    def start_proxy(self, where: str = HOST) -> None:
        """(Re)start the proxy on this machine's loopback (``host``) or a pod's sidecar."""
        self.incarnation += 1
        self.proxy_incarnation[where] = self.incarnation
        log = self.workdir / f"groupgate-{self.incarnation}-{where}.log"
        s = self.settings
        args = ["--group-heartbeat-interval-ms", str(s.heartbeat_interval_ms),
                "--group-session-timeout-ms", str(s.session_timeout_ms),
                "--group-metadata-refresh-ms", "1000", *s.proxy_args]
        if where == HOST:
            self.proxies[where] = ProxyProcess.start(
                self.broker_bootstrap, log, listen=f"127.0.0.1:{self.listen_port}",
                args=["--broker-port-base", str(self.broker_port_base), *args], timeout=60)
        else:
            pod = self.pod(where)
            self.proxies[where] = ProxyProcess.start(
                self.broker_bootstrap, log, listen=SIDECAR,
                args=[*args, "--fleet-listen", f"{pod.ip}:{FLEET_PORT}"],
                wrapper=pod.command([]), timeout=60)

    @property
    def broker_bootstrap(self) -> str:
        assert self.broker is not None
        return self.broker.bootstrap

    def start_producers(self) -> None:
        for group in self.settings.groups:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.benchmarks.rebalance.members", "producer",
                 "--bootstrap", (self.broker_bootstrap if self.pods or self.settings.direct
                                 else self.bootstrap),
                 "--topic", self.topic(group),
                 "--partitions", str(self.settings.partitions),
                 "--rate-per-partition", str(self.settings.rate_per_partition)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=open(self.workdir / f"producer-{group}.stderr", "w"),  # noqa: SIM115
                text=True, bufsize=1, start_new_session=True)
            self.producers.append(proc)
            threading.Thread(target=self._read_producer, args=(group, proc), daemon=True).start()

    def _read_producer(self, group: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("e") == "p":
                with self.lock:
                    high = self.produced[group]
                    for p, offset in event["o"].items():
                        high[int(p)] = max(high.get(int(p), 0), int(offset))

    def stop_producers(self) -> None:
        for proc in self.producers:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.producers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def new_member(self, group: str, kind: Kind | None = None, pod_index: int | None = None
                   ) -> Member:
        """A new member of ``group`` (a random kind of the group unless given), in pod
        ``pod_index`` (1-based) or the pods in turn."""
        kind = kind or self.rng.choice(GROUPS[group])
        self.member_count += 1
        pod = None
        if self.pods:
            pod = (self.pods[(pod_index - 1) % len(self.pods)] if pod_index is not None
                   else self.pods[self.member_count % len(self.pods)])
        name = f"{group}-{self.member_count}-{kind.library}-{kind.protocol}-{kind.commit}"
        if pod is not None:
            name += f"@{pod.name}"
        member = Member(name, group, kind, self, pod)
        self.members[name] = member
        self.groups[group].kinds[name] = kind.label
        member.start()
        return member

    def live(self, group: str | None = None) -> list[Member]:
        return [m for m in self.members.values()
                if m.alive and (group is None or m.group == group)]

    # -- pollers ------------------------------------------------------------------------------

    def poll_offsets(self) -> None:
        """Committed offsets straight from the broker, every second. (kafka-python's admin
        client: librdkafka 2.16's ListConsumerGroupOffsets crashes the process when the
        broker answers that the group's coordinator is loading or moved.)"""
        from kafka.admin import KafkaAdminClient

        admin: Any = None
        while not self.stopping.is_set():
            try:
                if admin is None:
                    admin = KafkaAdminClient(bootstrap_servers=self.broker_bootstrap,
                                             request_timeout_ms=5000)
                listed = admin.list_group_offsets([self.group_id(g)
                                                   for g in self.settings.groups])
            except Exception:  # the broker is restarting: poll again later
                if admin is not None:
                    with contextlib.suppress(Exception):
                        admin.close()
                admin = None
                self.stopping.wait(1.0)
                continue
            now = time.monotonic()
            with self.lock:
                for group in self.settings.groups:
                    offsets = listed.get(self.group_id(group)) or {}
                    self.offsets.observe(now, group, {tp.partition: om.offset
                                                      for tp, om in offsets.items()
                                                      if om.offset >= 0})
            self.stopping.wait(1.0)
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def sample_rss(self) -> None:
        """Each proxy's RSS and CPU time every two seconds; with pods, who holds each group."""
        while not self.stopping.is_set():
            for where, proxy in list(self.proxies.items()):
                if proxy.process is not None:
                    mib = _rss_mib(proxy.process.pid)
                    cpu = _cpu_seconds(proxy.process.pid)
                    incarnation = self.proxy_incarnation[where]
                    with self.lock:
                        if mib is not None:
                            self.rss.append((time.monotonic(), incarnation, mib))
                        if cpu is not None:
                            self.cpu[incarnation] = (where, cpu)
            if self.pods and not self.settings.direct:
                for group in self.settings.groups:
                    holder = self.coordinating_pod(group, quiet=True)
                    with self.lock:
                        last = next((h for t, g, h in reversed(self.holders) if g == group),
                                    None)
                        if holder is not None and holder != last:
                            self.holders.append((time.monotonic(), group, holder))
            self.stopping.wait(2.0)

    # -- events -------------------------------------------------------------------------------

    def apply_event(self, kind: str, chosen: str | None = None, who: str | None = None
                    ) -> dict[str, Any]:
        """Apply one event to ``chosen`` (a random group if None); a leave, kill or stall
        picks a random live member, of the kind ``who`` (``LIBRARY/PROTOCOL``) if given."""
        s = self.settings
        group = chosen or self.rng.choice(list(s.groups))
        live = self.live(group)
        if who is not None:
            live = [m for m in live if m.kind.label.startswith(who + "/")]
        began = time.monotonic()
        note: dict[str, Any] = {"t": began, "began": began, "event": kind, "group": group}
        if kind == "join" and len(live) < s.max_members:
            note["member"] = self.new_member(group, self.join_kind(group)).name
        elif kind in ("leave", "kill", "stall") and live:
            member = self.rng.choice(live)
            note["member"] = member.name
            if kind == "leave":
                member.stop()
            elif kind == "kill":
                t = member.kill()
                with self.lock:
                    self.groups[group].events.append(Event(t, member.name, "crash"))
            else:
                seconds = s.max_poll_interval_ms / 1000 + 5
                member.stuck_until = time.monotonic() + seconds
                member.send(f"stall {seconds}")
        elif kind in ("proxy-restart", "proxy-kill") and self.proxies:
            where = self.rng.choice(sorted(self.proxies))
            note["proxy"] = where
            self.restart_proxy(where, hard=kind == "proxy-kill")
        elif kind in ("coordinator-kill", "coordinator-restart", "join-coordinator-kill"):
            if kind == "join-coordinator-kill":
                note["member"] = self.new_member(group, self.join_kind(group)).name
                time.sleep(1.0)  # its join is under way
            holder = self.coordinating_pod(group)
            if holder is None:
                note["skipped"] = True
            else:
                note["proxy"] = holder
                note["t"] = time.monotonic()
                self.restart_proxy(holder, hard=kind != "coordinator-restart")
        elif kind == "sidecar-roll" and self.pods:
            note["proxies"] = []
            for pod in self.pods:  # a rollout: one at a time, the next once it is ready
                self.restart_proxy(pod.name, hard=False)
                note["proxies"].append(pod.name)
                time.sleep(s.roll_gap_s)
        elif kind in ("coordinator-freeze", "join-coordinator-freeze",
                      "coordinator-cutoff") and self.pods:
            holder = self.coordinating_pod(group)
            if holder is None:
                note["skipped"] = True
            else:
                note["proxy"] = holder
                note["t"] = time.monotonic()
                fault = (self.pod(holder).partitioned() if kind == "coordinator-cutoff"
                         else frozen(self.proxies[holder]))
                with fault:
                    if kind == "join-coordinator-freeze":
                        time.sleep(min(1.0, s.fault_s))
                        pod = self.quietest_pod(group, besides=holder)
                        note["member"] = self.new_member(group, self.join_kind(group),
                                                         self.pods.index(pod) + 1).name
                        note["member_pod"] = pod.name
                    time.sleep(max(0.0, note["t"] + s.fault_s - time.monotonic()))
        elif kind == "slow-link" and self.pods:
            ok, why = netem_available()
            if not ok:
                note["skipped"] = True
                note["why"] = why
            else:
                pod = self.rng.choice(self.pods)
                note["proxy"] = pod.name
                with pod.slowed(s.slow_link_ms):
                    time.sleep(s.fault_s)
        elif kind == "broker-restart" and isinstance(self.broker, KafkaBroker):
            if s.broker_down_s > 0:
                self.broker.stop_node()
                time.sleep(s.broker_down_s)
                self.broker.start_node()
            else:
                self.broker.restart(timeout=120)
        elif (kind in ("broker-kill", "join-broker-kill") and self.broker is not None
              and s.brokers > 1):
            if kind == "join-broker-kill":
                note["member"] = self.new_member(group, self.join_kind(group)).name
                time.sleep(1.0)  # its join is under way
            node = self.coordinating_broker(group)
            if node is None:
                note["skipped"] = True
            else:
                note["broker"] = node
                note["t"] = time.monotonic()
                self.broker.kill_broker(node)
                time.sleep(10.0)
                self.broker.start_broker(node, timeout=120)
        else:
            note["skipped"] = True
        for g in s.groups:  # every group keeps at least one member
            if not self.live(g):
                note.setdefault("replacements", []).append(self.new_member(g).name)
        return note

    def join_kind(self, group: str) -> Kind | None:
        if not self.settings.join_kind:
            return None
        return parse_member(f"{group}:{self.settings.join_kind}")[1]

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def quietest_pod(self, group: str, besides: str) -> Pod:
        """The pod other than ``besides`` with the fewest live members of ``group`` (the
        first such: where a scale-out's new pod would be)."""
        others = [p for p in self.pods if p.name != besides] or self.pods
        return min(others, key=lambda p: sum(1 for m in self.live(group) if m.pod is p))

    def restart_proxy(self, where: str, *, hard: bool) -> None:
        """SIGKILL (``hard``) or stop gracefully the proxy at ``where``, and start it again."""
        proxy = self.proxies[where]
        if hard:
            proxy.signal(signal.SIGKILL)
            assert proxy.process is not None
            proxy.process.wait(10)
            time.sleep(self.settings.restart_delay_s)
        else:
            proxy.stop(timeout=60)
        self.start_proxy(where)

    def _admin(self) -> Any:
        from kafka.admin import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=self.broker_bootstrap, request_timeout_ms=5000)

    def coordinating_pod(self, group: str, *, quiet: bool = False) -> str | None:
        """The pod whose sidecar holds ``group``'s broker group (its member's client host)."""
        try:
            admin = self._admin()
        except Exception as exc:
            if not quiet:
                self.out(f"soak: cannot tell who coordinates {group}: {exc}")
            return None
        try:
            described = admin.describe_groups([self.group_id(group)])
        except Exception as exc:  # the broker could not say: the event is skipped
            if not quiet:
                self.out(f"soak: cannot tell who coordinates {group}: {exc}")
            return None
        finally:
            admin.close()
        for member in (described.get(self.group_id(group)) or {}).get("members") or []:
            host = str(member.get("client_host", "")).lstrip("/")
            for pod in self.pods:
                if pod.ip == host:
                    return pod.name
        return None

    def coordinating_broker(self, group: str) -> int | None:
        admin = self._admin()
        try:
            return int(admin._manager.run(admin._find_coordinator_id, self.group_id(group)))
        except Exception as exc:
            self.out(f"soak: cannot find the broker coordinating {group}: {exc}")
            return None
        finally:
            admin.close()

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        s = self.settings
        (self.workdir / "members").mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        host = "127.0.0.1"
        if s.pods:
            self.network = PodNetwork()
            self.pods = [self.network.pod(f"pod{i + 1}") for i in range(s.pods)]
            host = self.network.host_ip
        try:
            properties = dict(p.split("=", 1) for p in s.broker_properties)
            if s.direct and s.kafka != "3.9":  # the native coordinator, with the proxy's timing
                properties = {"group.consumer.heartbeat.interval.ms": str(s.heartbeat_interval_ms),
                              "group.consumer.min.heartbeat.interval.ms": "500",
                              "group.consumer.session.timeout.ms": str(s.session_timeout_ms),
                              "group.consumer.min.session.timeout.ms": "1000", **properties}
            if s.brokers == 1:
                self.broker = KafkaBroker.start(s.kafka, self.workdir / "kafka", host=host,
                                                properties=properties)
            else:
                self.broker = KafkaCluster.start(s.kafka, self.workdir / "kafka",
                                                 size=s.brokers, host=host,
                                                 properties=properties)
            for group in s.groups:
                self.broker.create_topic(self.topic(group), s.partitions, min(s.brokers, 3))
            if not s.direct:
                for where in [p.name for p in self.pods] or [HOST]:
                    self.start_proxy(where)
            threading.Thread(target=self.poll_offsets, daemon=True).start()
            threading.Thread(target=self.sample_rss, daemon=True).start()
            self.start_producers()
            if s.initial:
                for spec in s.initial:
                    group, kind, pod_index = parse_member(spec)
                    self.new_member(group, kind, pod_index)
            else:
                for group in s.groups:
                    for kind in self.rng.sample(GROUPS[group], 2):
                        self.new_member(group, kind)
            where = (f"{len(self.pods)} pods, a sidecar each on {SIDECAR}" if self.pods
                     else f"proxy on {self.bootstrap}")
            self.out(f"soak: seed {s.seed}, {s.duration_s:.0f} s, groups {list(s.groups)}, "
                     f"{where}")
            chaos_end = self.chaos_end = started + s.duration_s
            if s.script or not s.events:  # scripted, or no events at all: a steady group
                self.run_script(started)
                remaining = chaos_end - time.monotonic()
                if remaining > 0:
                    time.sleep(remaining)
            else:
                self.run_random(chaos_end)
            self.stop_producers()
            self.catch_up()
            for member in self.live():
                member.stop()
        finally:
            self.stopping.set()
            for member in self.members.values():
                if member.running():
                    member.kill()
            for proxy in self.proxies.values():
                proxy.stop()
            if self.broker is not None:
                self.broker.stop()
            if self.network is not None:
                self.network.close()
        return self.report(time.monotonic() - started)

    def run_random(self, chaos_end: float) -> None:
        s = self.settings
        bag: list[str] = []
        while True:
            gap = self.rng.uniform(s.min_event_gap_s, s.max_event_gap_s)
            if time.monotonic() + gap >= chaos_end:
                break
            time.sleep(gap)
            if not bag:  # every kind once, in a random order, before any repeats
                bag = self.rng.sample(s.events, len(s.events))
            self._apply(bag.pop(), None, chaos_end - s.duration_s)

    def run_script(self, started: float) -> None:
        for at, kind, group, who in (parse_scripted(e) for e in self.settings.script):
            wait = started + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if kind in MEMBER_EVENTS:
                for g in [group] if group else self.settings.groups:
                    self.wait_formed(g, FORMED_WAIT_S)
            self._apply(kind, group, started, who)

    def formed(self, group: str) -> bool:
        """Whether every live member of ``group`` has been given its assignment (an assignment
        callback since it joined, empty or not) and the group has converged on the members' own
        callbacks (every partition owned once, nobody inside a callback, every member owning
        something where there are enough partitions)."""
        with self.lock:
            events = sorted(self.groups[group].events, key=lambda e: e.t)  # stable: ties kept
            live = {m.name for m in self.live(group)}
        state = State(self.settings.partitions)
        assigned: set[str] = set()
        for event in events:
            state.apply(event)
            if event.kind == "assign":
                assigned.add(event.member)
            elif event.kind in ("join", "leave", "crash"):
                assigned.discard(event.member)
        return live <= assigned and state.converged()

    def wait_formed(self, group: str, timeout_s: float) -> bool:
        """Wait until :meth:`formed` (a scripted kill, leave or stall is of a member of a
        served group: on a busy machine the members may still be starting at the scripted
        time, and a process killed before it joined is no member); False if ``timeout_s``
        passed first (the event goes on)."""
        deadline = time.monotonic() + timeout_s
        while not self.formed(group):
            if time.monotonic() >= deadline:
                self.out(f"soak: {group} had not formed within {timeout_s:.0f} s; "
                         "the event goes on")
                return False
            time.sleep(0.2)
        return True

    def _apply(self, event: str, group: str | None, started: float, who: str | None = None
               ) -> None:
        note = self.apply_event(event, group, who)
        self.applied.append(note)
        self.out(f"  {note['t'] - started:7.1f}s {event:15s} {note.get('group', '')} "
                 f"{note.get('member', '')} {note.get('proxy', '')}"
                 f"{' (skipped)' if note.get('skipped') else ''}")

    def served_again(self) -> list[dict[str, Any]]:
        """For each sidecar or broker event: how long until every partition of the group had
        exactly one live owner again (and stayed so until the next event), and the
        partition-seconds without an owner meanwhile, from the members' own callbacks."""
        out = []
        times = sorted(n.get("began", n["t"]) for n in self.applied if not n.get("skipped"))
        for note in self.applied:
            if note["event"] not in SERVED_EVENTS or note.get("skipped"):
                continue
            later = [t for t in times if t > note["t"]]  # until the next event began
            end = later[0] if later else max(self.chaos_end, note["t"])
            figures = compute(self.groups[note["group"]].events, self.settings.partitions,
                              note["t"], end)
            out.append({"event": note["event"], "group": note["group"],
                        "proxy": note.get("proxy"), "broker": note.get("broker"),
                        "t": note["t"], "window_s": round(end - note["t"], 1),
                        "served_again_s": (None if figures.convergence_s is None
                                           else round(figures.convergence_s, 2)),
                        "downtime_partition_s": round(figures.downtime_partition_s, 1),
                        "members_disturbed": figures.members_disturbed})
        return out

    def catch_up(self) -> None:
        """Every group consumes and commits what was produced (bounded by ``catch_up_s``)."""
        deadline = time.monotonic() + self.settings.catch_up_s
        for group in self.settings.groups:
            if not [m for m in self.live(group) if time.monotonic() > m.stuck_until]:
                self.new_member(group)
        while time.monotonic() < deadline:
            with self.lock:
                done = all(
                    self.offsets.highest.get((group, p), 0) >= end
                    for group in self.settings.groups
                    for p, end in self.produced[group].items())
            if done:
                return
            time.sleep(1)
        with self.lock:
            behind = {f"{group}/{p}": (self.offsets.highest.get((group, p)), end)
                      for group in self.settings.groups
                      for p, end in self.produced[group].items()
                      if self.offsets.highest.get((group, p), 0) < end}
        self.caught_up = False
        self.out(f"soak: the groups did not catch up in time: (committed, produced) {behind}")

    def report(self, elapsed: float) -> dict[str, Any]:
        s = self.settings
        groups: dict[str, Any] = {}
        violations: list[str] = []
        with self.lock:
            for name, g in self.groups.items():
                stuck = checks.zombie_windows(g.events, g.stalls)
                unexplained, explained = checks.double_ownership(g.events, stuck)
                zombies = checks.zombie_commits(explained, stuck, g.commits)
                gaps = checks.missing(self.produced[name], g.consumed)
                rewinds = checks.rewinds(g.starts, g.commits)
                produced = sum(self.produced[name].values())
                regressions = [r for r in self.offsets.regressions if r.group == name]
                groups[name] = {
                    "produced": produced, "consumed": g.records_consumed,
                    "duplicates": max(g.records_consumed - produced, 0),
                    "missing": gaps, "offset_regressions": [
                        dict(asdict(r), commits_around=[  # what the members said meanwhile
                            asdict(c) for c in g.commits
                            if c.partition == r.partition and r.t - 30 <= c.t <= r.t + 5])
                        for r in regressions],
                    "double_ownership": [asdict(o) for o in unexplained],
                    "explained_overlaps": [asdict(o) for o in explained],
                    "zombie_commits": [asdict(c) for c in zombies],
                    "rewinds": [asdict(r) for r in rewinds],
                    "commits_ok": len(g.commits), "commits_failed": g.commit_failures,
                    "commit_errors": g.commit_errors, "members": g.kinds,
                    "stalls": len(g.stalls), "exited_on_their_own": g.exits,
                    "timeline": [[round(e.t, 3), e.member, e.kind, list(e.partitions)]
                                 for e in g.events],
                    "reads": [[round(t, 3), member, partition, first, last]
                              for t, member, partition, first, last in g.reads],
                }
                if gaps:
                    violations.append(f"{name}: {sum(gaps.values())} records never consumed")
                if regressions:
                    violations.append(f"{name}: {len(regressions)} committed offsets moved "
                                      "backwards")
                if unexplained:
                    violations.append(f"{name}: {len(unexplained)} partitions owned twice")
                if zombies:
                    violations.append(f"{name}: {len(zombies)} zombie commits accepted")
                if rewinds:
                    violations.append(f"{name}: {len(rewinds)} times a member started a "
                                      "partition below an offset whose commit had landed")
            if not self.caught_up:
                violations.append("the groups had not committed everything produced "
                                  f"{s.catch_up_s:.0f} s after production stopped")
            growth = checks.rss_growth(self.rss, s.rss_warmup_s)
            for r in growth:
                if r.growth_mib > s.rss_bound_mib:
                    violations.append(f"proxy #{r.incarnation}: RSS grew {r.growth_mib:.1f} "
                                      f"MiB after warm-up")
            served = self.served_again()
            result = {
                "served_again": served,
                "proxy_cpu_s": {str(i): {"where": w, "cpu_s": round(c, 2)}
                                for i, (w, c) in sorted(self.cpu.items())},
                "holders": [[round(t, 2), g, h] for t, g, h in self.holders],
                "settings": asdict(s), "machine": machine.machine_info(java_executable()),
                "elapsed_s": round(elapsed, 1), "events": self.applied,
                "offset_polls": self.offsets.polls, "groups": groups,
                "rss": [asdict(r) for r in growth],
                "rss_peak_mib": max((mib for _, _, mib in self.rss), default=0.0),
                "caught_up": self.caught_up, "violations": violations,
            }
        if violations:
            result["member_log_tails"] = self.member_log_tails()
        return result

    def member_log_tails(self, lines: int = 12) -> dict[str, list[str]]:
        """The last lines each member's client logged (its stderr), for a failed run's
        summary: a CI run keeps only what the test printed."""
        tails: dict[str, list[str]] = {}
        for path in sorted((self.workdir / "members").glob("*.stderr")):
            text = path.read_text(errors="replace").strip().splitlines()
            if text:
                tails[path.stem] = [line[:300] for line in text[-lines:]]
        warnings = [f"{path.stem}: {line[:300]}"
                    for path in sorted(self.workdir.glob("groupgate-*.log"))
                    for line in path.read_text(errors="replace").splitlines()
                    if " WARNING " in line or " ERROR " in line]
        if warnings:
            tails["sidecars (warnings and errors)"] = warnings[-3 * lines:]
        return tails


def served_figures(result: dict[str, Any]) -> list[str]:
    """One line per event after which the group had to be served again."""
    lines = []
    for f in result.get("served_again", []):
        took = (f"{f['served_again_s']:.1f} s" if f["served_again_s"] is not None
                else "not within the window")
        lines.append(f"{f['event']} ({f['group']}, {f.get('proxy') or f.get('broker', '')}): "
                     f"served again after {took}, {f['downtime_partition_s']:.1f} partition-s "
                     "unserved")
    return lines


def parse_member(spec: str) -> tuple[str, Kind, int | None]:
    """``GROUP:LIBRARY/PROTOCOL/COMMIT[@POD]`` -> (group, kind, pod index or None)."""
    group, _, rest = spec.partition(":")
    label, _, pod = rest.partition("@")
    library, protocol, commit = label.split("/")
    classic_assignor = next((k.assignor for k in GROUPS[group] if k.protocol == "classic"),
                            "range")
    assignor = classic_assignor if protocol == "classic" else "uniform"
    return group, Kind(library, protocol, assignor, commit), int(pod) if pod else None


MEMBER_EVENTS = frozenset({"kill", "leave", "stall"})
"""Scripted events of one member, applied once the group has formed (:meth:`Soak.formed`)."""
FORMED_WAIT_S = 60.0


def parse_scripted(spec: str) -> tuple[float, str, str | None, str | None]:
    """``SECONDS:KIND[:GROUP[:LIBRARY/PROTOCOL]]`` -> (seconds from the start, kind, group or
    None, the kind of member it applies to or None)."""
    at, _, rest = spec.partition(":")
    kind, _, rest = rest.partition(":")
    group, _, who = rest.partition(":")
    return float(at), kind, group or None, who or None


def _cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of ``pid`` so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def summary(result: dict[str, Any]) -> str:
    """A markdown table of one run."""
    lines = ["| group | produced | consumed | duplicates | missing | offsets backwards | "
             "owned twice | zombie overlaps | commits ok / failed | members |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, g in result["groups"].items():
        lines.append(
            f"| {name} | {g['produced']} | {g['consumed']} | {g['duplicates']} | "
            f"{sum(g['missing'].values())} | {len(g['offset_regressions'])} | "
            f"{len(g['double_ownership'])} | {len(g['explained_overlaps'])} | "
            f"{g['commits_ok']} / {g['commits_failed']} | {len(g['members'])} |")
    rss = ", ".join(f"#{r['incarnation']}: {r['warm_mib']:.0f}->{r['peak_mib']:.0f} MiB"
                    for r in result["rss"])
    events: dict[str, int] = {}
    for e in result["events"]:
        if not e.get("skipped"):
            events[e["event"]] = events.get(e["event"], 0) + 1
    exits = [e for g in result["groups"].values() for e in g["exited_on_their_own"]]
    lines += ["", f"events: {events}", f"proxy RSS after warm-up (per process): {rss or '-'}"]
    if exits:
        lines.append(f"members whose client exited on its own: {len(exits)}, e.g. "
                     f"{exits[0]['member']}: {exits[0]['last_error']}")
    lines += served_figures(result)
    lines += overlap_context(result)
    for member, tail in result.get("member_log_tails", {}).items():
        lines.append(f"{member} logged, last lines:")
        lines += [f"    {line}" for line in tail]
    lines.append(f"violations: {result['violations'] or 'none'}")
    return "\n".join(lines)


def overlap_context(result: dict[str, Any], most: int = 4) -> list[str]:
    """For a run with partitions owned twice: the first few overlaps and what the members
    involved reported in the 15 s before each (the logs stay in the work directory, but a CI
    run shows only what the test printed)."""
    lines: list[str] = []
    for name, g in result["groups"].items():
        found = g["double_ownership"]
        if not found:
            continue
        zero = min((e[0] for e in g["timeline"]), default=0.0)
        lines.append(f"{name}: owned twice, first {min(most, len(found))} of {len(found)} "
                     f"(seconds from the first callback; holders "
                     f"{[(round(t - zero, 1), h) for t, gr, h in result.get('holders', [])]}; "
                     f"events {[(round(e['t'] - zero, 1), e['event']) for e in result['events']]}"
                     f"; commit errors {g['commit_errors']})")
        for o in found[:most]:
            lines.append(f"  {o['t'] - zero:.1f}s partition {o['partition']}: {o['first']} "
                         f"and {o['second']}")
            for t, member, kind, partitions in g["timeline"]:
                if (member in (o["first"], o["second"]) and o["t"] - 15 <= t <= o["t"] + 1
                        and kind not in ("stall", "resume")):
                    lines.append(f"    {t - zero:7.2f}s {member} {kind} {partitions}")
    return lines
