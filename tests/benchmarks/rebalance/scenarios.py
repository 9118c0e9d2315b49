"""Rebalance scenarios against a running target: members, a producer, an event, a timeline.

:func:`run_scenario` creates a fresh topic (10 partitions per member by default) and group,
starts a producer at a fixed rate per partition and ``N`` real consumer members, waits until the
group is converged and quiet, then triggers the scenario's event at ``trigger`` and waits until
the group has been converged again for ``settle`` seconds (or a time limit passes). Everything
members report (callbacks, consumed ranges) and the producer's high-water marks are collected
by a :class:`Recorder`; the metrics come from :mod:`tests.benchmarks.rebalance.timeline`.

Scenarios: ``scale-out`` (N -> N+1), ``leave`` (one member closes), ``crash`` (SIGKILL of one
member, found by the session timeout; in front of groupgate, whose pod-local liveness is on by
default, by the proxy seeing the member's process go: ``dev/bench crash`` measures that),
``rolling`` (each of the N members closed and replaced, one after another, waiting for
convergence in between), ``slow`` (one member blocks 30 s in its next rebalance callback while
a new member joins).

Members are confluent-kafka clients hosted by :mod:`tests.benchmarks.rebalance.members` processes
(several per process; the crash victim alone in its own), or Kafka's Java VerifiableConsumer
(one JVM per member; no ``slow`` scenario: it cannot block in its callback).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.benchmarks.rebalance import timeline
from tests.benchmarks.rebalance.targets import Target

SCENARIOS = ("scale-out", "leave", "crash", "rolling", "slow")
CLIENTS = ("confluent", "java")
SLOW_SECONDS = 30.0


class ScenarioError(RuntimeError):
    pass


@dataclass
class Settings:
    members: int
    scenario: str
    protocol: str
    client: str = "confluent"
    partitions_per_member: int = 10
    rate_per_partition: float = 2.0
    members_per_process: int = 10
    settle_s: float = 5.0
    quiet_before_s: float = 3.0
    max_wait_s: float = 120.0
    slow_s: float = SLOW_SECONDS
    """How long the stuck member of the ``slow`` scenario stays in its callback."""

    @property
    def partitions(self) -> int:
        return self.members * self.partitions_per_member


# ---------------------------------------------------------------------------------------------
# Collecting what members and the producer report


@dataclass
class Recorder:
    events: list[timeline.Event] = field(default_factory=list)
    consumed: list[timeline.Consumed] = field(default_factory=list)
    produced: list[timeline.Produced] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    max_age_ms: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def add_event(self, ev: timeline.Event) -> None:
        with self.lock:
            self.events.append(ev)
            self.lock.notify_all()

    def handle(self, obj: dict[str, Any]) -> None:
        kind = obj.get("e")
        t = float(obj.get("t", time.monotonic()))
        with self.lock:
            if kind == "c":
                ranges = tuple((int(p), int(lo), int(hi)) for p, lo, hi in obj["r"])
                self.consumed.append(timeline.Consumed(t, obj["m"], ranges))
                if obj.get("a"):
                    self.max_age_ms.append((t, float(obj["a"])))
            elif kind == "p":
                self.produced.append(
                    timeline.Produced(t, {int(p): int(o) for p, o in obj["o"].items()})
                )
            elif kind == "closed":
                self.closed.add(obj["m"])
            elif kind == "error":
                self.errors.append(f"{obj.get('m')}: {obj.get('msg')}")
            elif kind in timeline.KINDS:
                self.events.append(
                    timeline.Event(t, obj["m"], kind, tuple(int(p) for p in obj.get("p", ())))
                )
            self.lock.notify_all()

    def snapshot(self) -> list[timeline.Event]:
        with self.lock:
            return list(self.events)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise ScenarioError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)


def _state(rec: Recorder, partitions: int) -> timeline.State:
    state = timeline.State(partitions)
    for ev in sorted(rec.snapshot(), key=lambda e: e.t):
        state.apply(ev)
    return state


# ---------------------------------------------------------------------------------------------
# Member processes


class _Proc:
    """A child process writing JSON lines to stdout, read by a thread into the recorder."""

    def __init__(self, argv: list[str], rec: Recorder, log: Path) -> None:
        self.log = log
        err = open(log, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                text=True, bufsize=1, start_new_session=True,
            )
        finally:
            err.close()
        self.rec = rec
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.rec.handle(json.loads(line))

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.reader.join(5)

    def quit(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send({"cmd": "quit"})
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.kill()


class MemberPool:
    """Where members live; the scenarios only use these operations."""

    def start(self, member: str) -> None:
        raise NotImplementedError

    def stop(self, member: str) -> None:
        """Graceful close; the member reports ``leave`` (and ``closed`` when done)."""
        raise NotImplementedError

    def crash(self, member: str) -> None:
        """SIGKILL the member's process (it must be alone there)."""
        raise NotImplementedError

    def slow(self, member: str, seconds: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ConfluentPool(MemberPool):
    def __init__(self, rec: Recorder, topic: str, config: dict[str, Any], workdir: Path,
                 layout: list[list[str]]) -> None:
        self.rec = rec
        self.hosts: list[_Proc] = []
        self.host_of: dict[str, _Proc] = {}
        argv = [sys.executable, "-m", "tests.benchmarks.rebalance.members", "consumers",
                "--topic", topic, "--config", json.dumps(config)]
        for i, names in enumerate(layout):
            host = _Proc(argv, rec, workdir / f"members-{i}.log")
            self.hosts.append(host)
            for name in names:
                self.host_of[name] = host

    def start(self, member: str, config: dict[str, Any] | None = None) -> None:
        """Start ``member``; ``config``: settings of its own over the pool's (None removes
        one)."""
        self.host_of[member].send({"cmd": "start", "member": member, "config": config or {}})

    def stop(self, member: str) -> None:
        self.host_of[member].send({"cmd": "stop", "member": member})

    def crash(self, member: str) -> None:
        host = self.host_of[member]
        others = [m for m, h in self.host_of.items() if h is host and m != member]
        if others:
            raise ScenarioError(f"{member} shares its process with {others}")
        host.kill()

    def slow(self, member: str, seconds: float) -> None:
        self.host_of[member].send({"cmd": "slow", "member": member, "seconds": seconds})

    def close(self) -> None:
        for host in self.hosts:
            host.quit()


class JavaPool(MemberPool):
    """One Kafka VerifiableConsumer JVM per member."""

    def __init__(self, rec: Recorder, target: Target, protocol: str, topic: str, group: str,
                 workdir: Path) -> None:
        self.rec = rec
        self.target = target
        self.protocol = protocol
        self.topic = topic
        self.group = group
        self.workdir = workdir
        self.tools: dict[str, Any] = {}
        # VerifiableConsumer stamps events with the wall clock (ms); map it onto monotonic
        self.offset = time.time() - time.monotonic()

    def _to_mono(self, event: dict[str, Any]) -> float:
        ts = event.get("timestamp")
        return float(ts) / 1000.0 - self.offset if ts else time.monotonic()

    def start(self, member: str) -> None:
        from tests.testbed.tools import VerifiableConsumer

        pool = self

        class Reporting(VerifiableConsumer):
            def _on_event(self, event: dict[str, Any]) -> None:
                super()._on_event(event)
                pool._report(member, event)

        tool = Reporting(
            self.target.tools_line, self.target.bootstrap, self.topic, self.group,
            enable_autocommit=True, workdir=self.workdir / member,
            **self.target.java_client_args(self.protocol),
        )
        self.rec.add_event(timeline.Event(time.monotonic(), member, "join"))
        tool.start()
        self.tools[member] = tool

    def _report(self, member: str, event: dict[str, Any]) -> None:
        name = event.get("name")
        t = self._to_mono(event)
        if name in ("partitions_assigned", "partitions_revoked"):
            kind = "assign" if name == "partitions_assigned" else "revoke"
            parts = [int(p["partition"]) for p in event.get("partitions", [])]
            self.rec.handle({"t": t, "m": member, "e": kind, "p": parts})
        elif name == "records_consumed":
            ranges = [[int(p["partition"]), int(p["minOffset"]), int(p["maxOffset"])]
                      for p in event.get("partitions", []) if int(p.get("count", 0)) > 0]
            if ranges:
                self.rec.handle({"t": t, "m": member, "e": "c", "r": ranges})
        elif name == "shutdown_complete":
            self.rec.handle({"t": t, "m": member, "e": "closed"})

    def stop(self, member: str) -> None:
        tool = self.tools.pop(member)
        self.rec.add_event(timeline.Event(time.monotonic(), member, "leave"))
        threading.Thread(target=tool.stop, daemon=True).start()

    def crash(self, member: str) -> None:
        self.tools.pop(member).kill()

    def slow(self, member: str, seconds: float) -> None:
        raise ScenarioError("the Java VerifiableConsumer cannot block in its callback")

    def close(self) -> None:
        for tool in self.tools.values():
            tool.kill()
        self.tools.clear()


def _producer(target: Target, topic: str, s: Settings, rec: Recorder, workdir: Path) -> _Proc:
    argv = [sys.executable, "-m", "tests.benchmarks.rebalance.members", "producer",
            "--bootstrap", target.broker_bootstrap, "--topic", topic,
            "--partitions", str(s.partitions), "--rate-per-partition", str(s.rate_per_partition)]
    return _Proc(argv, rec, workdir / "producer.log")


# ---------------------------------------------------------------------------------------------
# One run


def member_names(n: int) -> list[str]:
    width = max(2, len(str(n)))
    return [f"m{i:0{width}d}" for i in range(n + 1)]  # the last one is the joiner


def _layout(names: list[str], per_process: int) -> list[list[str]]:
    """The crash victim (first) alone, the joiner (last) alone, the rest ``per_process``."""
    victim, rest, joiner = names[0], names[1:-1], names[-1]
    groups = [[victim], [joiner]]
    for i in range(0, len(rest), per_process):
        groups.append(rest[i : i + per_process])
    return groups


def _wait_converged(rec: Recorder, s: Settings, live: set[str], stable_for: float,
                    timeout: float, what: str) -> float:
    """Wait until the group is converged with exactly ``live`` members for ``stable_for``
    seconds; return when it became so."""
    deadline = time.monotonic() + timeout
    since: float | None = None
    while True:
        state = _state(rec, s.partitions)
        now = time.monotonic()
        if state.converged() and state.live == live:
            since = since if since is not None else now
            if now - since >= stable_for:
                return since
        else:
            since = None
        if now > deadline:
            owned = {m: len(state.owned.get(m, ())) for m in sorted(state.live)}
            unowned = sum(1 for p in range(s.partitions) if not state.owners.get(p))
            raise ScenarioError(
                f"timed out after {timeout:.0f}s waiting for {what}: live={len(state.live)} "
                f"(want {len(live)}), stalled={sorted(state.stalled)}, unowned={unowned}, "
                f"owned={owned}, errors={rec.errors[-3:]}"
            )
        time.sleep(0.1)


def _event_time(events: list[timeline.Event], scenario: str, commanded: float, victim: str,
                joiner: str, initial: list[str]) -> float:
    """The trigger as the members saw it: the joiner's ``join`` (its client created), the
    first ``leave`` (its close begun); for a crash, the moment of the SIGKILL."""
    if scenario in ("scale-out", "slow"):
        wanted = {(joiner, "join")}
    elif scenario == "leave":
        wanted = {(victim, "leave")}
    elif scenario == "rolling":
        wanted = {(initial[0], "leave")}
    else:
        return commanded
    for ev in events:
        if ev.t >= commanded and (ev.member, ev.kind) in wanted:
            return ev.t
    return commanded


def run_scenario(target: Target, s: Settings, workdir: Path,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Play one scenario once; return the run's record (settings, metrics, timeline)."""
    if s.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {s.scenario!r}")
    if s.client == "java" and s.scenario == "slow":
        raise ScenarioError("the slow scenario needs a client that can block in its callback")
    run_id = uuid.uuid4().hex[:8]
    topic = f"bench-{run_id}"
    group = f"bench-{s.scenario}-{run_id}"
    workdir = workdir / run_id
    workdir.mkdir(parents=True, exist_ok=True)
    target.create_topic(topic, s.partitions)
    rec = Recorder()
    names = member_names(s.members)
    initial, joiner = names[:-1], names[-1]
    victim, slowpoke = names[0], names[1 % len(initial)]
    producer = _producer(target, topic, s, rec, workdir)
    pool: MemberPool
    if s.client == "java":
        pool = JavaPool(rec, target, s.protocol, topic, group, workdir)
    else:
        pool = ConfluentPool(rec, topic, target.client_config(s.protocol, group), workdir,
                             _layout(names, s.members_per_process))
    steps: list[dict[str, Any]] = []
    try:
        t_start = time.monotonic()
        for name in initial:
            pool.start(name)
        join_limit = 60.0 + 2.0 * s.members
        _wait_converged(rec, s, set(initial), s.quiet_before_s, join_limit, "the initial group")
        log(f"  group of {s.members} formed in {time.monotonic() - t_start:.1f}s")
        live = set(initial)
        trigger = time.monotonic()
        if s.scenario == "scale-out":
            pool.start(joiner)
            live.add(joiner)
        elif s.scenario == "leave":
            pool.stop(victim)
            live.discard(victim)
        elif s.scenario == "crash":
            trigger = time.monotonic()
            pool.crash(victim)
            rec.add_event(timeline.Event(trigger, victim, "crash"))
            live.discard(victim)
        elif s.scenario == "slow":
            pool.slow(slowpoke, s.slow_s)
            trigger = time.monotonic()
            pool.start(joiner)
            live.add(joiner)
        elif s.scenario == "rolling":
            for name in initial:
                t_step = time.monotonic()
                pool.stop(name)
                rec.wait(lambda n=name: n in rec.closed, 60.0, f"{name} to close")
                rec.closed.discard(name)
                pool.start(name)
                _wait_converged(rec, s, live, 0.5, s.max_wait_s, f"the group after {name}")
                steps.append({"member": name, "seconds": time.monotonic() - t_step})
        limit = s.max_wait_s + (s.slow_s if s.scenario == "slow" else 0.0)
        timed_out = False
        try:
            _wait_converged(rec, s, live, s.settle_s, limit, "convergence")
        except ScenarioError as exc:
            timed_out = True
            log(f"  {exc}")
        end = time.monotonic()
    finally:
        pool.close()
        producer.quit()
    events = sorted(rec.snapshot(), key=lambda e: e.t)
    trigger = _event_time(events, s.scenario, trigger, victim, joiner, initial)
    metrics = timeline.compute(events, s.partitions, trigger, end)
    total, dups = timeline.duplicates(rec.consumed)
    lag = timeline.peak_lag(rec.produced, rec.consumed, trigger, end)
    ages = [a for t, a in rec.max_age_ms if trigger <= t <= end]
    return {
        "run_id": run_id,
        "target": target.name,
        "protocol": s.protocol,
        "client": s.client,
        "scenario": s.scenario,
        "members": s.members,
        "partitions": s.partitions,
        "rate_per_partition": s.rate_per_partition,
        "settle_s": s.settle_s,
        "timed_out": timed_out,
        "window_s": end - trigger,
        "convergence_s": metrics.convergence_s,
        "downtime_partition_s": metrics.downtime_partition_s,
        "members_disturbed": metrics.members_disturbed,
        "partitions_revoked": metrics.partitions_revoked,
        "disturbed": list(metrics.disturbed),
        "records_consumed": total,
        "duplicates": dups,
        "peak_lag_records": lag,
        "max_record_age_s": (max(ages) / 1000.0) if ages else None,
        "client_errors": rec.errors[:20],
        "rolling_steps": steps,
        "roles": {"victim": victim, "joiner": joiner, "slow": slowpoke},
        # the ownership timeline relative to the trigger, enough to redraw the pictures
        "timeline": [[round(e.t - trigger, 4), e.member, e.kind, list(e.partitions)]
                     for e in events],
    }


def events_of(run: dict[str, Any]) -> list[timeline.Event]:
    """The timeline of a run record (times relative to its trigger)."""
    return [timeline.Event(t, m, k, tuple(p)) for t, m, k, p in run["timeline"]]
