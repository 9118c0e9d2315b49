"""The whole migration roll in the pod test bed, step by step: sidecars on, clients to the
consumer protocol, back to classic, sidecars off (through groupgate, in front of Kafka 3.9), or
the same clients switched classic to consumer pod by pod and back straight at Kafka 4.4's own
coordinator (the reference); and the exit in front of Kafka 4.4 (:func:`exit_roll`). Shared by
``test_downgrade_roll.py`` and ``test_native_exit.py`` (which assert after each step) and
``dev/bench migration`` (which measures it, ``tests/benchmarks/migration.py``).

The six members of ``test_migration_roll.py``: three pods, two members each, librdkafka
consumers with the group's assignor and, as the second member of the third pod, the Java
client's consumer (``KafkaConsumer``, ``commitSync`` after every poll), consuming a
12-partition topic while a producer writes to it without pause. A pod step restarts both of the
pod's members at once (a pod restart), then waits until every partition has exactly one owner
again.

Per step (:class:`Step`): the worst partition downtime (the longest time within the step that
one partition had no owner: from a revocation or loss, or its owner's close, to its next
assignment) and the members called back (members not restarted in the step that saw a
revocation or loss, and how many such callbacks).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.process import ProxyProcess
from tests.integration.members import (
    Member,
    Production,
    consumed,
    owned_exactly_once,
    ownership_overlaps,
    partitions_of,
    wait_until,
)
from tests.integration.test_classic_translation import CLASSIC, CONSUMER, FLAGS
from tests.integration.test_migration_roll import ROOT, SIDECAR, Java, engine_types, librdkafka
from tests.integration.test_new_protocol import ask_coordinator
from tests.integration.test_online_upgrade import (
    FLEET_SESSION,
    PARTITIONS,
    RATE,
    WAIT,
    Commits,
    broker_members,
)
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

ROLL_FLAGS = (*FLAGS, *FLEET_SESSION, "--migration-policy", "bidirectional")
"""The sidecars: the fleet's default settings, sessions a fleet accepts, and the policy that
converts the group when every member is behind a sidecar and hands it back when the last
KIP-848 member leaves (Kafka's ``bidirectional``)."""
NATIVE_SESSION_MS = 18_000
NATIVE_HEARTBEAT_MS = 500
NATIVE_PROPERTIES = {"group.consumer.session.timeout.ms": str(NATIVE_SESSION_MS),
                     "group.consumer.min.session.timeout.ms": "6000"}
"""Kafka 4.4 as the reference: its default migration policy (``bidirectional``), KIP-848
members with the sidecars' heartbeat (500 ms) and session (18 s)."""
CALLED_BACK = ("partitions_revoked", "partitions_lost")
LOCK = "groupgate-coordinated"


@dataclass
class Step:
    name: str
    begin: float
    end: float
    restarted: list[str]
    worst_downtime_s: float = 0.0
    called_back: dict[str, int] = field(default_factory=dict)
    """Members not restarted in the step -> revocations and losses they saw in it."""
    lost: dict[str, int] = field(default_factory=dict)
    """Of those, the losses (partitions taken, not given back)."""
    worst: Gap | None = None
    """Where the worst downtime was: the partition, who had it before and who next."""
    timeline: dict[str, dict[str, float]] = field(default_factory=dict)
    """The restarted members' events in the step (closed, started, first assigned), in
    seconds from its begin."""

    def as_json(self) -> dict[str, Any]:
        def at(t: float) -> float:
            return round(t - self.begin, 3)

        worst = None
        if self.worst is not None:
            gap = self.worst
            worst = {"partition": gap.partition[1], "from_s": at(gap.begin), "to_s": at(gap.end),
                     "before": None if gap.before is None else {
                         "owner": gap.before.owner, "ended_by": gap.before.ended_by},
                     "after": None if gap.after is None else {"owner": gap.after.owner}}
        return {"step": self.name, "seconds": round(self.end - self.begin, 3),
                "worst_downtime_s": round(self.worst_downtime_s, 3),
                "members_called_back": len(self.called_back),
                "callbacks": sum(self.called_back.values()), "lost": sum(self.lost.values()),
                "restarted": self.restarted, "called_back": self.called_back,
                "worst": worst, "timeline": self.timeline}


@dataclass
class Span:
    """One member's ownership of one partition: from its assignment callback to its revocation
    or loss (``ended_by``), else to its close (``closed``), else to now (``owning``)."""
    begin: float
    end: float
    owner: str
    ended_by: str


def spans(members: Iterable[Member]) -> dict[tuple[str, int], list[Span]]:
    """Per partition, the spans some member owned it."""
    found: dict[tuple[str, int], list[Span]] = {}
    now = time.time()
    for m in members:
        events = m.snapshot()
        closed = next((e["t"] for e in events if e["name"] == "closed"), None)
        held: dict[tuple[str, int], float] = {}
        for e in events:
            if e["name"] == "partitions_assigned":
                for p in partitions_of(e):
                    held.setdefault(p, e["t"])
            elif e["name"] in CALLED_BACK:
                for p in partitions_of(e):
                    if p in held:
                        found.setdefault(p, []).append(Span(held.pop(p), e["t"], m.name,
                                                            e["name"]))
        for p, since in held.items():
            found.setdefault(p, []).append(Span(since, now if closed is None else closed,
                                                m.name, "owning" if closed is None else "closed"))
    return found


def ownership(members: Iterable[Member]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Per partition, the spans some member owned it (assignment callback to revocation or
    loss, else to its close, else to now)."""
    return {p: [(s.begin, s.end) for s in found] for p, found in spans(members).items()}


@dataclass
class Gap:
    """The longest time within a step that one partition had no owner: who had it before and
    how that ended (None: nobody within the step), who had it next (None: nobody by the
    step's end)."""
    partition: tuple[str, int]
    begin: float
    end: float
    before: Span | None
    after: Span | None

    @property
    def seconds(self) -> float:
        return self.end - self.begin


def worst_gap(members: Iterable[Member], partitions: set[tuple[str, int]], begin: float,
              end: float) -> Gap | None:
    """The longest time within [begin, end] that one of ``partitions`` had no owner (None:
    none was ever without one)."""
    found = spans(members)
    worst: Gap | None = None

    def consider(gap: Gap) -> None:
        nonlocal worst
        if gap.seconds > 0 and (worst is None or gap.seconds > worst.seconds):
            worst = gap

    for p in sorted(partitions):
        owned = sorted(found.get(p, []), key=lambda s: (s.begin, s.end))

        def before(t: float, owned: list[Span] = owned) -> Span | None:
            ended = [s for s in owned if s.end <= t]
            return max(ended, key=lambda s: s.end) if ended else None

        cursor = begin
        for s in owned:
            if s.end <= cursor:
                continue
            if s.begin > cursor:
                consider(Gap(p, cursor, min(s.begin, end), before(cursor),
                             s if s.begin < end else None))
            cursor = max(cursor, s.end)
            if cursor >= end:
                break
        if cursor < end:
            consider(Gap(p, cursor, end, before(cursor), None))
    return worst


def worst_downtime(members: Iterable[Member], partitions: set[tuple[str, int]], begin: float,
                   end: float) -> float:
    """The longest time within [begin, end] that one of ``partitions`` had no owner."""
    gap = worst_gap(members, partitions, begin, end)
    return 0.0 if gap is None else gap.seconds


class PodRoll:
    """One group's roll through three pods: its members, sidecars, producer and steps."""

    def __init__(self, workdir: Path, broker: KafkaBroker, pod_list: list[pods.Pod],
                 assignor: str, *, on_step: Callable[[Step], None] | None = None) -> None:
        self.workdir, self.broker, self.pods, self.assignor = workdir, broker, pod_list, assignor
        self.topic = f"roll-{uuid.uuid4().hex[:6]}"
        self.group = f"{self.topic}-{assignor}"
        broker.create_topic(self.topic, PARTITIONS)
        self.everything = {(self.topic, p) for p in range(PARTITIONS)}
        self.sidecars: dict[int, ProxyProcess] = {}
        self.started_sidecars: list[ProxyProcess] = []
        """Every sidecar started (their logs outlive them)."""
        self.slots: dict[tuple[int, int], Member] = {}
        self.everyone: list[Member] = []
        self.steps: list[Step] = []
        self.on_step = on_step
        self.producer = Production(broker.bootstrap, self.topic, PARTITIONS, RATE)
        self.commits = Commits(broker.bootstrap, self.group, self.topic)

    # -- members and sidecars -------------------------------------------------------------------

    def live(self) -> list[Member]:
        return list(self.slots.values())

    def _start(self, i: int, k: int, bootstrap: str, protocol: str) -> Member:
        pod = self.pods[i]
        where = "sidecar" if bootstrap == SIDECAR else "direct"
        name = f"{pod.name}{k}-{protocol}-{where}-{len(self.everyone)}"
        member: Member
        if i == len(self.pods) - 1 and k == 1:
            member = Java(name, pod, bootstrap, self.topic, self.group, protocol, self.assignor,
                          self.workdir)
        else:
            member = librdkafka(name, pod, bootstrap, self.topic, self.group, protocol,
                                self.assignor)
        self.slots[(i, k)] = member
        self.everyone.append(member)
        return member

    def start_all(self, bootstrap: str, protocol: str = "classic") -> None:
        for i in range(len(self.pods)):
            for k in (0, 1):
                self._start(i, k, bootstrap, protocol)
        self.settle("six members owning all")

    def settle(self, what: str) -> None:
        wait_until(lambda: owned_exactly_once(self.live(), self.everything), what, WAIT)

    def start_sidecar(self, i: int) -> None:
        pod = self.pods[i]
        self.sidecars[i] = sidecar = ProxyProcess.start(
            self.broker.bootstrap, self.workdir / f"groupgate-{pod.name}.log", listen=SIDECAR,
            wrapper=pod.command([]), args=ROLL_FLAGS)
        self.started_sidecars.append(sidecar)

    def stop_sidecar(self, i: int) -> None:
        sidecar = self.sidecars.pop(i, None)
        if sidecar is not None:
            sidecar.stop()

    def logs(self) -> list[str]:
        """The logs of every sidecar started, running or stopped."""
        return [s.log() for s in self.started_sidecars]

    # -- steps ----------------------------------------------------------------------------------

    def restart_pod(self, i: int, bootstrap: str, protocol: str, name: str,
                    settled: Callable[[], bool] | None = None) -> Step:
        """Both of pod ``i``'s members stopped and started again (``bootstrap``, ``protocol``);
        the step ends once the group settled (and ``settled``, if given, holds)."""
        begin = time.time()
        old = [self.slots[(i, k)] for k in (0, 1)]
        for member in old:
            member.stop()
        new = [self._start(i, k, bootstrap, protocol) for k in (0, 1)]
        self.settle(f"the group to settle after {name}")
        if settled is not None:
            wait_until(settled, f"the group's state after {name}", WAIT)
        return self.record(name, begin, [m.name for m in (*old, *new)])

    def record(self, name: str, begin: float, restarted: list[str]) -> Step:
        """The step from ``begin`` to now: its worst downtime and who was called back."""
        end = time.time()
        gap = worst_gap(self.everyone, self.everything, begin, end)
        step = Step(name, begin, end, restarted, 0.0 if gap is None else gap.seconds,
                    worst=gap)
        for m in self.everyone:
            if m.name in restarted:
                events = [e for e in m.snapshot() if begin <= e["t"] <= end]
                times: dict[str, float] = {}
                for what in ("closed", "started"):
                    t = next((e["t"] for e in events if e["name"] == what), None)
                    if t is not None:
                        times[what] = round(t - begin, 3)
                t = next((e["t"] for e in events
                          if e["name"] == "partitions_assigned" and partitions_of(e)), None)
                if t is not None:
                    times["first_assigned"] = round(t - begin, 3)
                step.timeline[m.name] = times
                continue
            seen = [e for e in m.callbacks_after(begin)
                    if e["name"] in CALLED_BACK and e["t"] <= end and partitions_of(e)]
            if seen:
                step.called_back[m.name] = len(seen)
                lost = sum(e["name"] == "partitions_lost" for e in seen)
                if lost:
                    step.lost[m.name] = lost
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return step

    # -- the end --------------------------------------------------------------------------------

    def finish(self) -> None:
        """Stop producing, wait until every acknowledged record is consumed, stop everything."""
        try:
            self.producer.stop()
            wait_until(lambda: self.producer.acked <= consumed(self.everyone),
                       "every acknowledged record to be consumed", WAIT)
        finally:
            self.close()

    def close(self) -> None:
        self.producer.stop()
        self.commits.stop()
        for m in self.live():
            m.stop()
        for i in list(self.sidecars):
            self.stop_sidecar(i)

    def safety(self) -> dict[str, Any]:
        """Throughout: partitions owned twice, records acknowledged but not consumed, committed
        offsets moving back."""
        missing = len(self.producer.acked - consumed(self.everyone))
        return {"owned_twice": ownership_overlaps(self.everyone),
                "acknowledged": len(self.producer.acked), "missing": missing,
                "produce_failed": self.producer.failed, "offset_reads": self.commits.reads,
                "offsets_back": self.commits.backwards}


# -- the two rolls ---------------------------------------------------------------------------


def marked(clients: list[str]) -> int:
    return sum(c.startswith("gg3|") for c in clients)


def groupgate_roll(roll: PodRoll) -> None:
    """Through groupgate in front of Kafka 3.9: (0) six classic members straight at the
    broker; (a) pod by pod behind their sidecars, then the conversion to the engine; (b) pod
    by pod switched to the consumer protocol; (c) pod by pod back to classic (the last KIP-848
    member leaving hands the group back: ``bidirectional``, Kafka's rule); (d) the group
    released (if it was not already) and pod by pod the sidecars removed. Each step waits for
    the group's state it leads to: the broker's group (DescribeGroups at the broker: the
    lock, or the members' protocol and how many are marked as behind a sidecar) or the
    engine's (ConsumerGroupDescribe through a sidecar: the members' types)."""
    broker = roll.broker.bootstrap
    names = [p.name for p in roll.pods]
    n = len(roll.pods)
    roll.start_all(broker)
    protocol, clients = broker_members(broker, roll.group)
    assert protocol == roll.assignor and marked(clients) == 0, (protocol, clients)

    for i in range(n):  # a
        roll.start_sidecar(i)
        last = i == n - 1
        roll.restart_pod(i, SIDECAR, "classic", f"a: pod {names[i]} behind its sidecar",
                         settled=None if last else lambda i=i: _broker_group(  # type: ignore[misc]
                             roll, roll.assignor, 2 * (i + 1)))
    begin = time.time()
    wait_until(lambda: broker_members(broker, roll.group)[0] == LOCK,
               "the group to move to the engine", WAIT)
    wait_until(lambda: engine_types(roll.pods[0], roll.group) == [CLASSIC] * 6,
               "the engine to serve all six classic members", WAIT)
    counts = {m.name: len(m.records) for m in roll.live()}
    wait_until(lambda: all(len(m.records) > counts[m.name] for m in roll.live()),
               "every member to consume after the conversion", WAIT)
    roll.record("a: the conversion to the engine", begin, [])

    for i in range(n):  # b
        roll.restart_pod(i, SIDECAR, "consumer", f"b: pod {names[i]} on the consumer protocol",
                         settled=lambda i=i: engine_types(  # type: ignore[misc]
                             roll.pods[0], roll.group) == sorted(
                             [CLASSIC] * (6 - 2 * (i + 1)) + [CONSUMER] * 2 * (i + 1)))
    for i in range(n):  # c
        last = i == n - 1
        roll.restart_pod(
            i, SIDECAR, "classic", f"c: pod {names[i]} back to classic" + (
                " (the group handed back: its last KIP-848 member left)" if last else ""),
            settled=(lambda: _broker_group(roll, roll.assignor, 6)) if last else (
                lambda i=i: engine_types(  # type: ignore[misc]
                    roll.pods[0], roll.group) == sorted(
                    [CLASSIC] * 2 * (i + 1) + [CONSUMER] * (6 - 2 * (i + 1)))))
    if broker_members(broker, roll.group)[0] == LOCK:  # d: released by the command
        begin = time.time()
        release(roll)
        wait_until(lambda: _broker_group(roll, roll.assignor, 6), "the broker's group", WAIT)
        roll.settle("the group to settle after the release")
        roll.record("d: the group released", begin, [])
    for i in range(n):  # d: the sidecars removed
        begin = time.time()
        old = [roll.slots[(i, k)] for k in (0, 1)]
        for member in old:
            member.stop()
        new = [roll._start(i, k, broker, "classic") for k in (0, 1)]
        roll.stop_sidecar(i)
        roll.settle(f"the group to settle after pod {names[i]} left its sidecar")
        wait_until(lambda i=i: _broker_group(  # type: ignore[misc]
            roll, roll.assignor, 6 - 2 * (i + 1)), "the broker's group", WAIT)
        roll.record(f"d: pod {names[i]} without its sidecar", begin,
                    [m.name for m in (*old, *new)])


def native_roll(roll: PodRoll) -> None:
    """Straight at Kafka 4.4 (the reference): six classic members; pod by pod switched to the
    consumer protocol (Kafka converts the group on the first consumer-protocol heartbeat); pod
    by pod back to classic (it converts it back when the last one leaves)."""
    broker = roll.broker.bootstrap
    names = [p.name for p in roll.pods]
    n = len(roll.pods)
    roll.start_all(broker)
    for i in range(n):
        roll.restart_pod(i, broker, "consumer", f"b: pod {names[i]} on the consumer protocol",
                         settled=lambda i=i: _native_types(  # type: ignore[misc]
                             roll) == sorted([CLASSIC] * (6 - 2 * (i + 1))
                                             + [CONSUMER] * 2 * (i + 1)))
    for i in range(n):
        last = i == n - 1
        roll.restart_pod(
            i, broker, "classic", f"c: pod {names[i]} back to classic" + (
                " (the group converted back: its last consumer-protocol member left)"
                if last else ""),
            settled=(lambda: broker_members(broker, roll.group)[0] == roll.assignor) if last
            else (lambda i=i: _native_types(roll) == sorted(  # type: ignore[misc]
                [CLASSIC] * 2 * (i + 1) + [CONSUMER] * (6 - 2 * (i + 1)))))


def exit_roll(roll: PodRoll) -> None:
    """In front of Kafka 4.4: six classic members behind their sidecars (the engine takes the
    group at the first join), pod by pod switched to the consumer protocol behind them; a
    direct consumer-protocol client with the same group id arrives (refused: it owns nothing,
    nobody is called back); ``groupgate release --to native`` against the holder (the broker's
    KIP-848 coordinator then has all six); pod by pod the clients go straight to the broker
    (``group.protocol=consumer``) and the sidecars are removed."""
    broker = roll.broker.bootstrap
    names = [p.name for p in roll.pods]
    n = len(roll.pods)
    for i in range(n):
        roll.start_sidecar(i)
    roll.start_all(SIDECAR)
    wait_until(lambda: broker_members(broker, roll.group)[0] == LOCK,
               "the engine to hold the group", WAIT)
    wait_until(lambda: engine_types(roll.pods[0], roll.group) == [CLASSIC] * 6,
               "the engine to serve all six classic members", WAIT)
    for i in range(n):
        roll.restart_pod(i, SIDECAR, "consumer", f"b: pod {names[i]} on the consumer protocol",
                         settled=lambda i=i: engine_types(  # type: ignore[misc]
                             roll.pods[0], roll.group) == sorted(
                             [CLASSIC] * (6 - 2 * (i + 1)) + [CONSUMER] * 2 * (i + 1)))
    begin = time.time()
    stranger = librdkafka("stranger", roll.pods[0], broker, roll.topic, roll.group,
                          "consumer", roll.assignor)
    roll.everyone.append(stranger)
    wait_until(lambda: bool(stranger.errors), "the direct KIP-848 client to be refused", WAIT)
    counts = {m.name: len(m.records) for m in roll.live()}
    wait_until(lambda: all(len(m.records) > counts[m.name] for m in roll.live()),
               "the members behind the sidecars to go on consuming", WAIT)
    stranger.stop()
    assert not stranger.records and not stranger.owned(), stranger.snapshot()
    assert _native_types(roll) is None  # still the lock's classic group
    roll.record("a direct KIP-848 client refused", begin, [stranger.name])
    begin = time.time()
    release(roll, "native")
    wait_until(lambda: _native_types(roll) == [CONSUMER] * 6,
               "the broker's KIP-848 coordinator to have the six (the anchor gone)", WAIT)
    roll.settle("the group to settle after the exit")
    roll.record("the exit to the broker's KIP-848 coordinator", begin, [])
    for i in range(n):
        begin = time.time()
        old = [roll.slots[(i, k)] for k in (0, 1)]
        for member in old:
            member.stop()
        new = [roll._start(i, k, broker, "consumer") for k in (0, 1)]
        roll.stop_sidecar(i)
        roll.settle(f"the group to settle after pod {names[i]} went straight to the broker")
        wait_until(lambda: _native_types(roll) == [CONSUMER] * 6, "the broker's group", WAIT)
        roll.record(f"e: pod {names[i]} straight at the broker", begin,
                    [m.name for m in (*old, *new)])


def _broker_group(roll: PodRoll, protocol: str, marks: int) -> bool:
    """The broker's classic group coordinates, in ``protocol``, with six members of which
    ``marks`` are behind sidecars."""
    found, clients = broker_members(roll.broker.bootstrap, roll.group)
    return found == protocol and len(clients) == 6 and marked(clients) == marks


def _native_types(roll: PodRoll) -> list[int] | None:
    """The members' types in the broker's consumer group (ConsumerGroupDescribe v1 at the
    broker); None while it is not a consumer group."""
    entry = ask_coordinator(roll.broker.bootstrap, roll.group, 69, 1, {
        "group_ids": [roll.group], "include_authorized_operations": False})["groups"][0]
    if entry["error_code"] != 0:
        return None
    return sorted(m["member_type"] for m in entry["members"])


def release(roll: PodRoll, to: str = "classic") -> None:
    """``groupgate release [--to native]`` inside each pod against its sidecar until the
    holder takes it (the others answer NOT_COORDINATOR)."""
    answers = []
    for pod in roll.pods:
        done = pod.run([sys.executable, "-m", "proxy.cli", "release", "--group", roll.group,
                        "--to", to, "--bootstrap", SIDECAR], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
        if done.returncode == 0:
            return
        answers.append(done.stderr.strip())
    raise AssertionError(f"no sidecar took the release: {answers}")
