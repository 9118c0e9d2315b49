"""Pod-local liveness on real sidecars and clients (docs/decisions/0020-pod-local-liveness.md):
pods (network namespaces) with a sidecar each, members of both protocols behind both.

Member sessions are 60 s, longer than the whole run after the first kill, so no member can be
fenced by its session timeout during the test: a SIGKILLed member's partitions reach the others
only if its sidecar saw its process go and the group's holder fenced it with reason
``pod-local``, here or over the fleet listener (librdkafka members of both protocols, Kafka's
Java classic consumer). Live members whose connections the proxy closes (a broker restart
passed on), or whose group connection the client itself closes and opens again (librdkafka's
``connections.max.idle.ms``), are never fenced that way. The soak's checks run as well (no
partition owned twice, every record consumed, no committed offset moving backwards).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.rebalance.timeline import Event, State
from tests.benchmarks.soak import run as soak
from tests.testbed import pods

pytestmark = pytest.mark.broker

SESSION_MS = 60_000
MEMBERS = ("eager:confluent/consumer/async@1", "eager:confluent/classic/async@1",
           "eager:confluent/consumer/async@2", "eager:confluent/classic/async@2")
FENCED = re.compile(r"MemberFenced\(group_id='[^']*', member_id='[^']*', reason='([a-z-]+)'\)")
WHY = re.compile(
    r"groupgate\.liveness: .*(closed \(.*(tied to them|by the proxy|closed alone)|suspected|gone|"
    r"fenced)|groupgate\.coordination: (MemberFenced|group \S+: (holding|not holding|lost|"
    r"forgotten|taken over|no heartbeat answered|broker heartbeat))")


def why(result: dict[str, Any], tmp_path: Path) -> str:
    """What a failure needs to be understood from its output alone (a CI run keeps only
    that): who held the group when, and each sidecar's lines on liveness and on holding."""
    lines = [f"logs in {tmp_path}; holders (soak clock, group, pod): {result['holders']}"]
    for path in sorted(tmp_path.glob("groupgate-*.log")):
        found = [line[:300] for line in path.read_text(errors="replace").splitlines()
                 if WHY.search(line)]
        lines += [f"{path.name}:", *found[-40:]]
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _pods_available() -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)


def run_soak(tmp_path: Path, members: tuple[str, ...] = MEMBERS,
             proxy_args: tuple[str, ...] = (), **settings: Any
             ) -> tuple[dict[str, Any], str]:
    """The soak's result, checked, and every sidecar's log (pod-local liveness as by default;
    at DEBUG each sidecar logs every client connection's close and what it made of it)."""
    result = soak.Soak(soak.Settings(
        pods=2, groups=("eager",), events=(), initial=members, session_timeout_ms=SESSION_MS,
        max_poll_interval_ms=2 * SESSION_MS, proxy_args=("--log-level", "DEBUG", *proxy_args),
        **settings), tmp_path).run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(soak.summary(result))
    assert result["caught_up"], f"logs in {tmp_path}"
    assert result["violations"] == [], f"{result['violations']}; logs in {tmp_path}"
    logs = "\n".join(path.read_text(errors="replace")
                     for path in sorted(tmp_path.glob("groupgate-*.log")))
    return result, logs


def replay(result: dict[str, Any], until: float) -> State:
    """The group as its members' callbacks had made it just before ``until``."""
    state = State(result["settings"]["partitions"])
    events = [Event(t, member, kind, tuple(parts))
              for t, member, kind, parts in result["groups"]["eager"]["timeline"]]
    for event in sorted(events, key=lambda e: e.t):  # stable: a member's own order is kept
        if event.t < until:
            state.apply(event)
    return state


def test_sigkilled_members_are_fenced_pod_local_behind_either_sidecar(tmp_path: Path) -> None:
    """Three of the four members SIGKILLed one after the other (librdkafka KIP-848 and classic:
    at least one of each, and at least one behind the sidecar that does not hold the group),
    each while it owned partitions of the formed group: each is fenced pod-local, and the last
    member ends up with every partition."""
    result, logs = run_soak(tmp_path, duration_s=27.0, seed=5,
                            script=("8:kill:eager", "13:kill:eager", "18:kill:eager"))
    killed = [e["member"] for e in result["events"] if e["event"] == "kill"]
    assert len(killed) == 3, result["events"]
    timeline = result["groups"]["eager"]["timeline"]
    crashed = {member: t for t, member, kind, _p in timeline if kind == "crash"}
    for member in killed:  # a member of the group, not a process still starting
        assert replay(result, crashed[member]).owned.get(member), \
            f"{member} owned nothing when it was killed\n{why(result, tmp_path)}"
    reasons = FENCED.findall(logs)
    assert reasons.count("session-timeout") == 0, reasons
    assert reasons.count("pod-local") == 3, f"{reasons}\n{why(result, tmp_path)}"
    # one of them was reported by the follower sidecar, over the fleet listener
    assert re.search(r"fenced \(pod-local\): the sidecar next to it \(the sidecar at ", logs), \
        why(result, tmp_path)
    assert "told" in logs and "which answered NONE" in logs, why(result, tmp_path)
    # the killed members' partitions reached the last one within the 60 s sessions
    end = min(t for t, _m, kind, _p in timeline if kind == "leave")
    last = replay(result, end)
    everything = set(range(result["settings"]["partitions"]))
    assert [last.owned[m] for m in last.live] == [everything] and last.converged(), \
        f"{last.owned}\n{why(result, tmp_path)}"


LEASE_CUT_OFF = "lost the broker's group: no answer from the broker within a session"


def longest_unread_s(result: dict[str, Any]) -> float:
    """The longest time any partition went without a read between its first and last."""
    reads: dict[int, list[float]] = {}
    for t, _member, partition, _first, _last in result["groups"]["eager"]["reads"]:
        reads.setdefault(partition, []).append(t)
    gaps = [b - a for ts in map(sorted, reads.values()) for a, b in itertools.pairwise(ts)]
    return max(gaps, default=0.0)


def test_live_members_whose_connections_the_proxy_closed_are_not_fenced(tmp_path: Path
                                                                        ) -> None:
    """A broker restart: every sidecar passes the closes of the broker's connections on to
    its clients; they reconnect. Nobody is declared gone, nobody fenced. The sidecars' broker
    session is 20 s here: a restart (stop, then start) takes 5 to 10 s on a loaded machine,
    and one longer than the broker session cuts the holder's lease off, which tells every
    member to let go (the case below), not what this test is about."""
    result, logs = run_soak(tmp_path, duration_s=30.0, seed=7, script=("10:broker-restart",),
                            proxy_args=("--broker-session-timeout-ms", "20000"))
    assert [e["event"] for e in result["events"]] == ["broker-restart"], result["events"]
    assert LEASE_CUT_OFF not in logs, f"logs in {tmp_path}"
    assert FENCED.findall(logs) == [], f"logs in {tmp_path}"
    assert "is gone (" not in logs and "fenced (pod-local)" not in logs, f"logs in {tmp_path}"


@pytest.mark.slow  # a minute
def test_members_told_to_let_go_in_a_long_broker_outage_are_not_waited_for(tmp_path: Path
                                                                            ) -> None:
    """The broker down for 8 s, more than a broker session: the holder's lease is cut off and
    it tells its members to let go; they rejoin (the classic ones under new member ids), and
    when the holder takes the group back and loads it from the state log, the members it told
    are fenced ``let-go`` rather than kept until their 60 s sessions end: no partition goes
    unread for anything near a session, nobody is fenced pod-local or by a session timeout."""
    result, logs = run_soak(tmp_path, duration_s=30.0, seed=7, script=("10:broker-restart",),
                            broker_down_s=8.0)
    assert LEASE_CUT_OFF in logs, f"the lease was not cut off; logs in {tmp_path}"
    reasons = FENCED.findall(logs)
    assert "let-go" in reasons, f"{reasons}; logs in {tmp_path}"
    assert [r for r in reasons if r != "let-go"] == [], f"{reasons}; logs in {tmp_path}"
    unread = longest_unread_s(result)
    print(f"longest time a partition went unread: {unread:.1f} s")
    assert unread < SESSION_MS / 2000, f"{unread:.1f} s; logs in {tmp_path}"


def test_a_sigkilled_java_classic_member_is_fenced_pod_local(tmp_path: Path) -> None:
    """Kafka's Java consumer (classic protocol, one JVM each, behind either sidecar) keeps
    several connections to its sidecar, like librdkafka: one of the two Java members is
    SIGKILLed and fenced pod-local; the others end up with every partition."""
    result, logs = run_soak(
        tmp_path, members=("eager:java/classic/async@1", "eager:java/classic/async@2",
                           "eager:confluent/consumer/async@1"),
        duration_s=30.0, seed=3, script=("22:kill:eager:java/classic",))
    killed = [e.get("member") for e in result["events"] if e["event"] == "kill"]
    kinds = result["groups"]["eager"]["members"]
    assert len(killed) == 1 and kinds[killed[0]].startswith("java/classic/"), \
        (result["events"], kinds)
    reasons = FENCED.findall(logs)
    assert reasons == ["pod-local"], f"{reasons}\n{why(result, tmp_path)}"
    owned = [e for e in result["groups"]["eager"]["timeline"]
             if e[1] == killed[0] and e[2] == "assign" and e[3]]
    assert owned, "the killed member never owned a partition: killed too early"


IDLE_MS = 1500
"""The members' ``connections.max.idle.ms``: shorter than the time between two of their
requests on the group connection (a heartbeat every 3 s, an auto-commit every 5 s), longer
than between two requests on their broker connection (fetches return within
``fetch.wait.max.ms``, 500 ms; a metadata refresh every second keeps it busy while a member
owns nothing to fetch, e.g. before its first assignment): the client closes its group
connection (librdkafka checks once a second, so about 2 s after each heartbeat) and opens a
new one for the next request, its broker connection staying open."""
CLOSED_ALONE = re.compile(r": closed \([^)]*; by the client\): [1-9]\d* other connection\(s\) "
                          r"of its client open, [1-9]\d* member\(s\) tied to this one")


def test_members_whose_group_connection_the_client_reaps_are_not_fenced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka members of both protocols with a short ``connections.max.idle.ms``: each
    reaps its idle group connection itself, again and again, and reconnects for its next
    heartbeat. The sidecars see those closes (logged at DEBUG as closes by the client with
    members tied to them and other connections open) and declare nobody gone: no member is
    fenced, none revokes or loses a partition once the group has formed, and both keep
    consuming to the end."""
    monkeypatch.setenv("GROUPGATE_SOAK_CLIENT_DEBUG", "broker")  # the clients log their reaps
    result, logs = run_soak(
        tmp_path, members=("eager:confluent/consumer/auto@1", "eager:confluent/classic/auto@2"),
        duration_s=28.0, seed=11, heartbeat_interval_ms=3000,
        client_config=(f"connections.max.idle.ms={IDLE_MS}",
                       "topic.metadata.refresh.interval.ms=1000"))
    # the mechanism happened: each client says it closed its idle coordinator connection, and
    # the sidecars saw group connections closed by their clients, others open, several times
    for member in result["groups"]["eager"]["members"]:
        said = (tmp_path / "members" / f"{member}.stderr").read_text(errors="replace")
        assert re.search(r"GroupCoordinator.*Connection max idle time exceeded", said), member
    reaped = CLOSED_ALONE.findall(logs)
    assert len(reaped) >= 4, f"{len(reaped)} group connections reaped\n{why(result, tmp_path)}"
    assert FENCED.findall(logs) == [], why(result, tmp_path)
    assert "is gone (" not in logs and "suspected gone" not in logs, why(result, tmp_path)
    group = result["groups"]["eager"]
    timeline = group["timeline"]
    members = set(group["members"])
    assert len(members) == 2
    # from the moment each member had been assigned partitions to the first graceful close at
    # the end of the run, nobody revoked or lost anything
    formed = max(min(t for t, m, kind, parts in timeline if m == member and kind == "assign"
                     and parts) for member in members)
    end = min(t for t, _m, kind, _p in timeline if kind == "leave")
    taken = [e for e in timeline if formed < e[0] < end and e[2] in ("revoke", "lost")]
    assert taken == [], f"{taken}\n{why(result, tmp_path)}"
    # progress: each consumed the partitions it owned up to the last record produced (every
    # record was consumed, the soak's checks say, so the last one read of each partition is
    # its last), reaping all along
    newest: dict[int, int] = {}
    for _t, _m, partition, _first, last in group["reads"]:
        newest[partition] = max(newest.get(partition, -1), last)
    owned = replay(result, end).owned
    assert set(owned) == members and all(owned.values()), owned
    for member in members:
        read: dict[int, int] = {}
        for _t, m, partition, _first, last in group["reads"]:
            if m == member:
                read[partition] = max(read.get(partition, -1), last)
        assert {p: read.get(p) for p in owned[member]} == {p: newest[p] for p in owned[member]}, \
            (member, read, newest)
