"""Faults of the coordinating sidecar in the pod test bed: frozen (SIGSTOP) while a member
joins, cut off from the broker, SIGKILLed with a topic nobody commits to any more.

Each test runs real clients in pods (:mod:`tests.testbed.pods`), mostly as a short scripted
soak (:mod:`tests.benchmarks.soak.run`), and checks the soak's invariants (no partition owned
twice on the members' own callback timelines, every acknowledged record consumed, no committed
offset moving backwards) and the fault's own story: what the sidecars logged, in what order the
members let go and were given partitions, who holds the group after it. Sidecar log lines are
stamped with the wall clock; :func:`sidecar_lines` puts them on the members' clock
(``time.monotonic()``) so that both can be ordered. No assertion is timed: the bounds the
design gives (docs/operations.md, "How long a request can wait") are measured and printed,
the assertions are on order.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.soak import run as soak
from tests.integration.test_fleet import run_soak
from tests.testbed import pods

pytestmark = pytest.mark.broker

BROKER_SESSION_S = 6.0
"""``broker-session-timeout-ms`` (the default) of every sidecar below."""
HEARTBEAT_S = soak.Settings.heartbeat_interval_ms / 1000


@pytest.fixture(autouse=True)
def _pods_available() -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_LOG = re.compile(r"groupgate-(\d+)-(\w+)\.log$")


def sidecar_lines(workdir: Path, pattern: str) -> list[tuple[float, str, int, str]]:
    """(t, pod, incarnation, line) of every sidecar log line matching ``pattern``, in time
    order; ``t`` on the members' clock (``time.monotonic()``), converted from the line's
    wall-clock stamp (to the millisecond; both clocks run at the same rate here)."""
    offset = time.time() - time.monotonic()
    found = []
    for path in workdir.glob("groupgate-*.log"):
        named = _LOG.search(path.name)
        assert named, path
        for line in path.read_text(errors="replace").splitlines():
            stamp = _STAMP.match(line)
            if stamp and re.search(pattern, line):
                wall = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
                found.append((wall.timestamp() - offset, named.group(2), int(named.group(1)),
                              line))
    return sorted(found, key=lambda found: found[0])  # stable: a file's order within a stamp


def owners_over(timeline: Iterable[list[Any]]) -> dict[str, set[int]]:
    """Who owns what after the timeline's callbacks (a member's leave or crash ends all)."""
    owned: dict[str, set[int]] = {}
    for _t, member, kind, partitions in timeline:
        if kind == "assign":
            owned.setdefault(member, set()).update(partitions)
        elif kind in ("revoke", "lost"):
            owned.setdefault(member, set()).difference_update(partitions)
        elif kind in ("leave", "crash"):
            owned.pop(member, None)
    return owned


def handed_over_after_let_go(timeline: list[list[Any]], since: float) -> list[str]:
    """For every partition a member stopped owning (revoke, lost, leave, crash) from
    ``since`` on: was anyone else given it before the member let go? The findings (none when
    every hand-over waited for the release)."""
    findings = []
    owned: dict[str, set[int]] = {}
    for t, member, kind, partitions in sorted(timeline, key=lambda e: e[0]):
        if kind == "assign":
            for p in partitions:
                others = [m for m, mine in owned.items() if m != member and p in mine]
                if others and t >= since:
                    findings.append(f"{t:.3f}: {member} given {p} while {others} owned it")
            owned.setdefault(member, set()).update(partitions)
        elif kind in ("revoke", "lost"):
            owned.setdefault(member, set()).difference_update(partitions)
        elif kind in ("leave", "crash"):
            owned.pop(member, None)
    return findings


def read_while_not_owned(timeline: list[list[Any]], reads: list[list[Any]], since: float
                         ) -> list[str]:
    """Records a member reported reading, from ``since`` on, of a partition it did not own
    then on its own callback timeline (it had let go of it, or was never given it): the
    findings (none when every member stopped consuming what it let go of)."""
    owned: dict[str, set[int]] = {}
    changes = sorted(timeline, key=lambda e: e[0])
    findings = []
    i = 0
    for t, member, partition, first, last in sorted(reads, key=lambda r: r[0]):
        while i < len(changes) and changes[i][0] <= t:
            _t, who, kind, partitions = changes[i]
            if kind == "assign":
                owned.setdefault(who, set()).update(partitions)
            elif kind in ("revoke", "lost"):
                owned.setdefault(who, set()).difference_update(partitions)
            elif kind in ("leave", "crash"):
                owned.pop(who, None)
            i += 1
        if t >= since and partition not in owned.get(member, set()):
            findings.append(f"{t:.3f}: {member} read {partition} [{first}, {last}] while not "
                            "owning it")
    return findings


def _event(result: dict[str, Any], kind: str) -> dict[str, Any]:
    (event,) = [e for e in result["events"] if e["event"] == kind]
    assert not event.get("skipped"), result["events"]
    return dict(event)


def _served(result: dict[str, Any], kind: str) -> dict[str, Any]:
    (served,) = [f for f in result["served_again"] if f["event"] == kind]
    return dict(served)


FOUR_MEMBERS = ("cooperative:confluent/consumer/async@1", "cooperative:confluent/classic/async@1",
                "cooperative:confluent/consumer/async@2", "cooperative:confluent/classic/sync@2")
"""Two pods with a KIP-848 and a classic member each; a third pod starts empty (where a
scale-out's member joins)."""


def test_coordinator_frozen_for_half_a_broker_session_while_a_member_joins(
        tmp_path: Path) -> None:
    """The coordinating sidecar frozen for 3 s (half of ``broker-session-timeout-ms``); a
    second in, a member starts joining behind the third pod's sidecar, which has served none
    of the group yet (a scale-out). Its requests wait for the frozen holder. On waking the
    holder still holds the broker's group (its lease is 80% of a session after its last
    answered heartbeat was sent, and heartbeats go every third of a session: the lease may run
    out just before the wake, then it holds the group again at once): nobody loses a
    partition or rejoins; the joiner gets its share. A KIP-848 member behind a follower is
    not fenced by its own abandoned heartbeat either: librdkafka gives a heartbeat up after
    about a second and sends the next one at the same epoch without its owned partitions,
    while the follower has relayed the first to the frozen holder, which on waking moves the
    member on with it; the next one is a lost response the engine accepts when that move
    changed nothing but the member epoch (``translation.heartbeat.lost_response``; it was
    fenced in 1 of 6 runs before)."""
    result = run_soak(
        tmp_path, duration_s=45.0, seed=31, pods=3, groups=("cooperative",), fault_s=3.0,
        initial=FOUR_MEMBERS, join_kind="confluent/consumer/async",
        script=("20:join-coordinator-freeze:cooperative",))
    freeze = _event(result, "join-coordinator-freeze")
    holder, joiner = freeze["proxy"], freeze["member"]
    assert freeze["member_pod"] == "pod3" and holder in ("pod1", "pod2"), freeze
    woke = freeze["t"] + 3.0
    timeline = result["groups"]["cooperative"]["timeline"]
    # the group's state after the fault: the same holder from the freeze on (two sidecars
    # taking the new group over at the same moment can both be members of the broker's
    # group for a moment before the freeze, until the broker's election is settled:
    # docs/benchmarks/fleet.md, narrowed but not ruled out), the joiner owns its share
    assert {h for t, _g, h in result["holders"] if t >= freeze["began"]} <= {holder}, \
        result["holders"]
    served = _served(result, "join-coordinator-freeze")
    assert served["served_again_s"] is not None, served
    owned = owners_over(e for e in timeline if e[0] <= freeze["t"] + served["window_s"])
    assert owned.get(joiner) and sorted(p for ps in owned.values() for p in ps) == list(
        range(6)), owned
    # nobody disturbed but by the joiner's arrival: no loss, no rejoin, and every partition
    # another member revoked went to the joiner
    window = [e for e in timeline if freeze["t"] <= e[0] <= freeze["t"] + served["window_s"]]
    disturbed = [e for e in window if e[2] == "lost" or (e[2] == "join" and e[1] != joiner)]
    fenced = sorted({e[1] for e in disturbed})
    assert not disturbed, (f"{fenced} lost partitions or rejoined as the holder woke (a "
                           f"KIP-848 member behind a follower fenced by its own abandoned "
                           f"heartbeat, or another cause): {window}")
    revoked = {p for e in window if e[2] == "revoke" and e[1] != joiner for p in e[3]}
    given = {p for e in window if e[2] == "assign" and e[1] == joiner for p in e[3]}
    assert revoked <= given, window
    # what the holder did on waking: at most a lapse and a rejoin, never a loss
    lapses = sidecar_lines(tmp_path, "no heartbeat answered within")
    assert not sidecar_lines(tmp_path, "lost the broker's group|told to let go"), \
        sidecar_lines(tmp_path, "WARNING")
    for t, pod, _i, line in lapses:
        assert pod == holder and t >= woke - 0.5, line
    print(f"holder {holder}; lease lapsed on waking: {bool(lapses)}; joiner {joiner} served "
          f"{served['served_again_s']} s after the freeze began")


class NotTakenOver(AssertionError):
    """No other sidecar took the group over while its holder was frozen."""


@pytest.mark.slow  # a minute: the short version is the half-session freeze above
def test_coordinator_frozen_for_two_broker_sessions_while_a_member_joins(
        tmp_path: Path) -> None:
    """The coordinating sidecar frozen for 12 s (two broker sessions) while a member joins
    behind an empty pod's sidecar. The broker drops the frozen holder's member after a
    session; on waking, the frozen one finds its lease long gone (a whole session without an
    answer): its first act is to lose the group, never to answer under its old membership
    (no assignment, no commit), and it tells its members to let go. Safety and progress hold
    (checked first), and another sidecar takes the group over during the freeze
    (:class:`NotTakenOver` otherwise: followers waited on their relays to the frozen holder
    for up to 330 s until relayed heartbeats were bounded to 6 s)."""
    fault_s = 2 * BROKER_SESSION_S
    result = run_soak(
        tmp_path, duration_s=55.0, seed=32, pods=3, groups=("cooperative",), fault_s=fault_s,
        initial=FOUR_MEMBERS, join_kind="confluent/classic/async",
        script=("20:join-coordinator-freeze:cooperative",))
    freeze = _event(result, "join-coordinator-freeze")
    holder, joiner = freeze["proxy"], freeze["member"]
    assert freeze["member_pod"] == "pod3" and holder in ("pod1", "pod2"), freeze
    woke = freeze["t"] + fault_s
    timeline = result["groups"]["cooperative"]["timeline"]
    held = sidecar_lines(tmp_path, "holding the broker's group as member")
    (old_member,) = {re.search(r"as member (\S+),", line).group(1)  # type: ignore[union-attr]
                     for t, pod, _i, line in held if pod == holder and t < freeze["t"]}
    # the frozen one, on waking, did not act: its first word about the group is the loss,
    # and it never holds the group under its old membership again
    after = [(t, line) for t, pod, _i, line in sidecar_lines(tmp_path, r"group soak-")
             if pod == holder and t >= woke - 0.5]
    assert after and "lost the broker's group: no answer from the broker within a session" \
        in after[0][1], after[:5]
    assert not [line for t, pod, _i, line in held if t >= woke - 0.5 and old_member in line]
    assert not handed_over_after_let_go(timeline, freeze["t"]), timeline
    # the group's state after it: served again, the joiner and the others own every partition
    served = _served(result, "join-coordinator-freeze")
    assert served["served_again_s"] is not None, served
    owned = owners_over(e for e in timeline if e[0] <= freeze["t"] + served["window_s"])
    assert owned.get(joiner) and sorted(p for ps in owned.values() for p in ps) == list(
        range(6)), owned
    disturbed = sorted({e[1] for e in timeline if e[0] >= freeze["t"] and e[2] == "lost"})
    takeovers = [(t, pod, line) for t, pod, _i, line in held if freeze["t"] < t < woke]
    print(f"holder {holder} frozen {fault_s} s; held during the freeze by "
          f"{[pod for _t, pod, _l in takeovers]}; after waking: "
          f"{[(round(t - freeze['t'], 2), line[24:160]) for t, line in after[:6]]}; members "
          f"that lost partitions: {disturbed}; served again {served['served_again_s']} s "
          "after the freeze began")
    if not takeovers or any(pod == holder for _t, pod, _l in takeovers):
        raise NotTakenOver(f"held during the freeze: {takeovers}; all: {held}")


class NeverToldToLetGo(AssertionError):
    """A member of the cut-off sidecar's group kept its partitions until after another
    member was given them, or read a partition it did not own."""


@pytest.mark.slow  # a minute; the open case below is described in docs/operations.md
@pytest.mark.xfail(raises=NeverToldToLetGo, strict=False, reason=(
    "a member whose own commit the cut-off sidecar forwarded to the broker on the member's "
    "connection before the lease ran out waits behind that commit: its heartbeats on the "
    "connection are answered only after it, so it is not told to let go until the pod is "
    "reconnected (seen: a KIP-848 librdkafka member behind the holder, 1 partition owned "
    "twice for 9 s)"))
def test_coordinator_cut_off_from_the_broker_its_members_let_go_before_others_take_over(
        tmp_path: Path) -> None:
    """The coordinating sidecar's pod cut off from the broker (not from the other pods) for
    35 s: the new holder gives the cut-off members' partitions away one member session (19 s,
    what a fleet accepts with 1 s heartbeats) after it loaded the group, about a broker
    session after the cut. Its lease runs out 0.8 of a broker session after the send time of
    its last answered heartbeat (log line ``no heartbeat answered within``); its members'
    requests wait from then on, and a whole session after it (``lost the broker's group: no
    answer``) it tells every member it had to let go: each hears UNKNOWN_MEMBER_ID (a waiting
    request at once, a commit relayed by another sidecar too) and gives its partitions up
    before any other member is given them. Another sidecar takes the group over and gives the
    cut-off members' partitions to others, which read records meanwhile; nobody reads a
    partition it does not own; once the pod is reconnected its members rejoin and every
    record is consumed.

    The holder is the pod whose member asked first, often pod3 with seed 33, whose only
    member is kafka-python: a classic client without a session timer of its own, which used
    to hear nothing until the pod was reconnected (:class:`NeverToldToLetGo`; answered
    COORDINATOR_NOT_AVAILABLE, it marked its coordinator dead and sent only FindCoordinator,
    on the connection carrying its fetches, which the cut-off sidecar had forwarded to the
    broker). Where another pod holds the group, that member is behind a follower, whose
    relayed commit used to wait at the cut-off holder for the broker, holding the member's
    heartbeats back until the pod was reconnected. Still open (the expected failure): a
    member behind the holder whose own commit went to the broker on its connection just
    before the cut (the librdkafka members commit after every record) waits behind it."""
    fault_s = 35.0
    result = soak.Soak(soak.Settings(
        duration_s=70.0, seed=33, pods=3, groups=("cooperative",), fault_s=fault_s,
        initial=(*FOUR_MEMBERS, "cooperative:kafka-python/classic/async@3"),
        script=("20:coordinator-cutoff:cooperative",)), tmp_path).run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(soak.summary(result))
    assert result["caught_up"], f"logs in {tmp_path}"
    owned_twice = [v for v in result["violations"] if v.endswith("partitions owned twice")]
    assert [v for v in result["violations"] if v not in owned_twice] == [], tmp_path
    group = result["groups"]["cooperative"]
    assert group["produced"] > 300 and group["commits_ok"] > 0
    cut = _event(result, "coordinator-cutoff")
    holder = cut["proxy"]
    timeline = group["timeline"]
    lapsed = [t for t, pod, _i, _line in sidecar_lines(tmp_path, "no heartbeat answered within")
              if pod == holder and t >= cut["t"]]
    lost = [t for t, pod, _i, _line in sidecar_lines(
        tmp_path, "lost the broker's group: no answer from the broker within a session")
        if pod == holder and t >= cut["t"]]
    told = [line for _t, pod, _i, line in sidecar_lines(tmp_path, "told to let go")
            if pod == holder]
    assert lapsed and lost and told, sidecar_lines(tmp_path, "WARNING")
    assert cut["t"] < lapsed[0] < lost[0] < cut["t"] + fault_s, (cut["t"], lapsed, lost)
    # another sidecar held the group during the cut
    took_over = [(t, pod) for t, pod, _i, _line in sidecar_lines(
        tmp_path, "holding the broker's group as member") if cut["t"] < t < cut["t"] + fault_s]
    assert took_over and all(pod != holder for _t, pod in took_over), took_over
    # Every member that owned partitions when the pod was cut off let go after the session
    # had passed (never before: nobody is disturbed while the holder may still hold the
    # group), and before anyone else was given what it held.
    before = owners_over(e for e in timeline if e[0] < cut["t"])
    assert sorted(p for ps in before.values() for p in ps) == list(range(6)), before
    let_go: dict[str, float] = {}
    too_late: list[str] = []
    for member, partitions in before.items():
        if not partitions:
            continue
        first = next((e for e in timeline if e[0] >= cut["t"] and e[1] == member
                      and e[2] in ("revoke", "lost", "leave", "crash")), None)
        assert first is not None, (member, timeline)
        let_go[member] = first[0]
        assert first[0] >= lost[0], (member, first, lost[0])
        given = [e for e in timeline if e[0] >= cut["t"] and e[1] != member
                 and e[2] == "assign" and set(e[3]) & partitions]
        if given and given[0][0] < first[0]:
            too_late.append(f"{member} let go {first[0] - cut['t']:.2f} s after the cut, "
                            f"{given[0][1]} given {given[0][3]} {given[0][0] - cut['t']:.2f} s "
                            "after it")
    # progress while the pod was cut off: every partition its members held was given to a
    # member behind another sidecar, and those members read records
    cut_off = {m for m, ps in before.items() if ps and m.endswith(f"@{holder}")}
    held_by_cut_off = {p for m in cut_off for p in before[m]}
    during = [e for e in timeline if cut["t"] < e[0] < cut["t"] + fault_s]
    reassigned = {p for e in during if e[2] == "assign" and not e[1].endswith(f"@{holder}")
                  for p in e[3]}
    assert held_by_cut_off <= reassigned, (held_by_cut_off, reassigned, during)
    reads = group["reads"]
    read_by_others = sum(last - first + 1 for t, m, _p, first, last in reads
                         if cut["t"] < t < cut["t"] + fault_s and not m.endswith(f"@{holder}"))
    assert read_by_others > 0, reads[-20:]
    # and the cut-off members stopped consuming: nobody read a partition it did not own,
    # during the cut or after the pod was reconnected
    stale_reads = read_while_not_owned(timeline, reads, cut["t"])
    # the group's state after it: every partition owned once, served again
    served = _served(result, "coordinator-cutoff")
    assert served["served_again_s"] is not None, served
    after = owners_over(e for e in timeline if e[0] <= cut["t"] + served["window_s"])
    assert sorted(p for ps in after.values() for p in ps) == list(range(6)), after
    # measured, not asserted (the design's bound: the session's end plus one heartbeat
    # interval, or a classic member's own; the lease line is logged at 0.8 of the session
    # after the last answered heartbeat was sent)
    session_end = lapsed[0] + 0.2 * BROKER_SESSION_S
    print(f"holder {holder} cut off at 0, reconnected at {fault_s:.0f} s; lease ran out "
          f"{lapsed[0] - cut['t']:.2f} s in, lost {lost[0] - cut['t']:.2f} s in (last answered "
          f"heartbeat sent about {lapsed[0] - 0.8 * BROKER_SESSION_S - cut['t']:.2f} s); "
          f"taken over by {took_over[0][1]} {took_over[0][0] - cut['t']:.2f} s in")
    for member, t in sorted(let_go.items(), key=lambda kv: kv[1]):
        print(f"  {member} let go {t - cut['t']:.2f} s in: {t - session_end:+.2f} s after the "
              f"session's end")
    print(f"  cut-off members {sorted(cut_off)}; {read_by_others} records read by the others "
          "during the cut")
    if too_late or owned_twice or stale_reads:
        raise NeverToldToLetGo(f"{owned_twice}: {too_late}; overlaps "
                               f"{group['double_ownership']}; reads {stale_reads[:10]}")
    assert not handed_over_after_let_go(timeline, cut["t"]), timeline


TWO_TOPIC_MEMBER = r"""
import json, sys, time
from confluent_kafka import Consumer

bootstrap, group, name, *topics = sys.argv[1:]

def emit(kind, **fields):
    print(json.dumps({"t": time.monotonic(), "e": kind, **fields}), flush=True)

def on_commit(err, partitions):
    done = [[tp.topic, tp.partition, tp.offset] for tp in partitions
            if err is None and tp.error is None and tp.offset >= 0]
    if done:
        emit("commit", o=done)

consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                     "group.protocol": "consumer", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "on_commit": on_commit})
def callback(kind):
    return lambda _consumer, ps: emit(kind, p=[[tp.topic, tp.partition] for tp in ps])

consumer.subscribe(list(topics), on_assign=callback("assign"), on_revoke=callback("revoke"),
                   on_lost=callback("lost"))
while True:
    read = {}
    for m in consumer.consume(num_messages=500, timeout=0.2):
        if m.error() is None:
            read[m.topic()] = read.get(m.topic(), 0) + 1
            consumer.commit(message=m, asynchronous=True)
    if read:
        emit("c", n=read)
"""
"""A KIP-848 member subscribed to several topics, committing each record's offset as it goes
(so a topic that gets no records gets no commits), reporting its callbacks, what it read per
topic and its acknowledged commits as JSON lines."""


class TwoTopicMember:
    """:data:`TWO_TOPIC_MEMBER` in a pod, behind that pod's sidecar."""

    def __init__(self, pod: pods.Pod, group_id: str, name: str, topics: list[str],
                 workdir: Path) -> None:
        import subprocess
        import sys

        self.name = name
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        stderr = open(workdir / f"{name}.stderr", "w")  # noqa: SIM115
        self.proc = pod.popen([sys.executable, "-c", TWO_TOPIC_MEMBER, soak.SIDECAR, group_id,
                               name, *topics], stdout=subprocess.PIPE, stderr=stderr, text=True,
                              start_new_session=True)
        stderr.close()
        self._log = workdir / f"{name}.events"
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self._log, "w") as log:  # kept for a failed run
            for line in self.proc.stdout:
                log.write(line)
                self._take(line)

    def _take(self, line: str) -> None:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            with self._lock:
                self.events.append(event)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["e"] == kind]

    def read(self, topic: str) -> int:
        return sum(e["n"].get(topic, 0) for e in self.of("c"))

    def owned(self) -> set[tuple[str, int]]:
        mine: set[tuple[str, int]] = set()
        with self._lock:
            for e in self.events:
                if e["e"] == "assign":
                    mine |= {(t, p) for t, p in e["p"]}
                elif e["e"] in ("revoke", "lost"):
                    mine -= {(t, p) for t, p in e["p"]}
        return mine

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def _wait(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.5)


@pytest.mark.slow  # 125 s of offset retention
def test_failover_keeps_the_offsets_of_a_topic_nobody_commits_to(tmp_path: Path) -> None:
    """KIP-211 through a failover: a KIP-848 member behind each of two sidecars, subscribed to
    a busy and an idle topic, a broker that expires offsets one minute after their last commit
    when the group's subscription does not name their topic (checked every 5 s). The idle
    topic's records are consumed and committed, then nothing more is produced to it; the
    coordinating sidecar is SIGKILLed and started again, the other one takes the group over
    and loads it. 125 s later the idle topic's committed offsets are still at the broker (its
    last commits are two minutes old: only the taken-over group's subscription, advertised
    again after the load, keeps them), and the busy topic's go on moving."""
    from confluent_kafka import Producer
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    from proxy.process import ProxyProcess
    from tests.testbed.broker import KafkaBroker

    workdir = tmp_path
    network = pods.PodNetwork()
    broker: KafkaBroker | None = None
    sidecars: dict[str, ProxyProcess] = {}
    members: list[TwoTopicMember] = []
    incarnation = [0]
    stopping = threading.Event()
    try:
        pod_list = [network.pod("pod1"), network.pod("pod2")]
        broker = KafkaBroker.start("3.9", workdir / "kafka", host=network.host_ip, properties={
            "offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "5000"})
        busy, idle = f"busy-{uuid.uuid4().hex[:6]}", f"idle-{uuid.uuid4().hex[:6]}"
        group_id = f"kip211-{uuid.uuid4().hex[:6]}"
        for name in (busy, idle):
            broker.create_topic(name, 2)

        def start_sidecar(pod: pods.Pod) -> None:
            incarnation[0] += 1
            sidecars[pod.name] = ProxyProcess.start(
                broker.bootstrap if broker else "", workdir / f"groupgate-{incarnation[0]}-"
                f"{pod.name}.log", listen=soak.SIDECAR, wrapper=pod.command([]), timeout=60,
                args=["--group-heartbeat-interval-ms", "1000", "--group-session-timeout-ms",
                      str(soak.FLEET_SESSION_MS), "--group-metadata-refresh-ms", "1000",
                      "--fleet-listen", f"{pod.ip}:{soak.FLEET_PORT}"])

        for pod in pod_list:
            start_sidecar(pod)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(200):
            producer.produce(idle, value=b"%d" % i, partition=i % 2)
            producer.produce(busy, value=b"%d" % i, partition=i % 2)
        producer.flush(30)
        produced = {busy: 200, idle: 200}

        def produce_busy() -> None:
            while not stopping.wait(0.1):
                for p in (0, 1):
                    producer.produce(busy, value=b"x", partition=p)
                    produced[busy] += 1
                producer.poll(0)
            producer.flush(10)

        threading.Thread(target=produce_busy, daemon=True).start()
        members = [TwoTopicMember(pod, group_id, f"member@{pod.name}", [busy, idle], workdir)
                   for pod in pod_list]
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
        idle_partitions = [TopicPartition(idle, 0), TopicPartition(idle, 1)]
        busy_partitions = [TopicPartition(busy, 0), TopicPartition(busy, 1)]

        def committed(partitions: list[TopicPartition]) -> list[int]:
            listed = admin.list_group_offsets({group_id: partitions})[group_id]
            return [listed[tp].offset if tp in listed else -1 for tp in partitions]

        # step 1: both members own two of the four partitions and have read and committed
        # everything of the idle topic
        _wait("each member owns two partitions",
              lambda: all(len(m.owned()) == 2 for m in members), 90)
        _wait("the idle topic's 200 records committed",
              lambda: sum(committed(idle_partitions)) == 200, 90)
        assert sum(m.read(idle) for m in members) >= 200
        holder = _holding_pod(admin, group_id, pod_list)
        assert holder is not None
        busy_before = committed(busy_partitions)
        idle_done = time.monotonic()
        # step 2: the coordinating sidecar SIGKILLed, started again a second later
        killed = sidecars[holder.name]
        killed.signal(signal.SIGKILL)
        assert killed.process is not None
        killed.process.wait(10)
        time.sleep(1.0)
        start_sidecar(holder)
        # step 3: a sidecar holds the broker's group again, advertising both topics
        _wait("a sidecar holds the group again, advertising both topics", lambda: any(
            t > idle_done for t, _pod, _i, _line in sidecar_lines(
                workdir, rf"group {group_id}: holding the broker's group as member .* topics "
                rf"({busy},{idle}|{idle},{busy})")), 60)
        loaded = [(pod, line) for _t, pod, _i, line in sidecar_lines(
            workdir, rf"group {group_id}: holding the broker's group") if _t > idle_done]
        print("after the kill:", *loaded, sep="\n  ")
        # step 4: 125 s later (over two minutes after the idle topic's last commit)
        read_before = {m.name: m.read(busy) for m in members}
        time.sleep(125.0)
        idle_after = committed(idle_partitions)
        busy_after = committed(busy_partitions)
        print(f"idle {idle}: {idle_after} committed; busy {busy}: {busy_before} -> "
              f"{busy_after}; holder then {holder.name}, now "
              f"{getattr(_holding_pod(admin, group_id, pod_list), 'name', None)}")
        assert idle_after == [100, 100], idle_after  # kept, not -1
        assert all(a > b for a, b in zip(busy_after, busy_before, strict=True)), \
            (busy_before, busy_after)
        # the group's state: both members still own two partitions each and go on reading
        assert all(len(m.owned()) == 2 for m in members), [m.events[-5:] for m in members]
        assert sorted(tp for m in members for tp in m.owned()) == sorted(
            (t, p) for t in (busy, idle) for p in (0, 1))
        readers = [m for m in members if any(t == busy for t, _p in m.owned())]
        assert readers and all(m.read(busy) > read_before[m.name] for m in readers), \
            (read_before, {m.name: (m.owned(), m.read(busy)) for m in members})
        assert not [e for m in members for e in m.of("lost")], [m.events for m in members]
        admin.close()
    finally:
        stopping.set()
        for member in members:
            member.stop()
        for sidecar in sidecars.values():
            sidecar.stop()
        if broker is not None:
            broker.stop()
        network.close()


def _holding_pod(admin: Any, group_id: str, pod_list: list[pods.Pod]) -> pods.Pod | None:
    """The pod whose sidecar's member holds the broker's group (its client host)."""
    described = admin.describe_groups([group_id]).get(group_id) or {}
    for member in described.get("members") or []:
        host = str(member.get("client_host", "")).lstrip("/")
        for pod in pod_list:
            if pod.ip == host:
                return pod
    return None
