"""Upgrade without a stop: a live classic group rolled onto sidecars moves to the engine.

Four librdkafka classic consumers (confluent-kafka, ``group.protocol=classic``) consume a
12-partition topic straight from Kafka 3.9 while a producer writes to it continuously. They are
restarted one at a time behind one groupgate (the rolling deployment of the sidecar). While
any member is direct, the broker's classic coordinator keeps the group and the members behind
the proxy are forwarded to it, marked (``gg3|...`` client ids). After the last restart no
member is direct, and the group moves to the engine online (decision record 0018, section 1):

* the engine coordinates it: ConsumerGroupDescribe through the proxy lists the four members
  as classic members, each under the member id its client has, at the generation the group
  was converted at, owning what it owned; DescribeGroups at the broker shows only the
  proxy's lock member;
* nobody was called back by the conversion: no member saw an assignment, revocation or loss
  after the group settled from the last restart, through the conversion and while every
  member went on consuming. The last step has settled when every partition is owned once,
  the broker's group is Stable with the live members, and every member's librdkafka reports
  its join state ``steady`` after that (statistics): it has served every rebalance callback
  of the last generation, including the empty ``partitions_assigned`` that librdkafka's
  cooperative protocol calls on each round that gives a member nothing new
  (``rd_kafka_cgrp_handle_assignment_cooperative``), which may come a moment after the
  partitions were all owned;
* throughout: no partition owned by two members at once (each member's callbacks, wall-clock
  stamped on one machine), every record the producer saw acknowledged consumed, the group's
  committed offsets (read at the broker) never moving back.

Run for the cooperative-sticky assignor and for the eager range one behind one sidecar, and
for cooperative-sticky with the members alternating between two sidecars with fleet listeners
(the sidecar forwarding the leader announces the conversion to the other, which holds its
members' requests meanwhile and relays them to the new holder after). The longest time any
partition went unconsumed in each step is printed. Waits are bounded only to stop a hang;
nothing asserts a duration.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from proxy.coordination.fleet import PROTOCOL_NAME as LOCK_PROTOCOL
from proxy.coordination.upgrade import read_mark
from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.members import (
    ConfluentMember,
    Member,
    Production,
    consumed,
    owned_exactly_once,
    ownership_overlaps,
    wait_until,
)
from tests.integration.test_classic_translation import CLASSIC, FLAGS, described
from tests.integration.test_new_protocol import ask_coordinator
from tests.testbed.broker import KafkaBroker, free_ports

PARTITIONS = 12
MEMBERS = 4
WAIT = 90.0
"""Bound for one step to settle (a hang fails; nothing is timed)."""
RATE = 100
"""Records per second the producer writes."""
STATS_MS = 100
"""How often each member reports librdkafka's join state (the last step's settling)."""
FLEET_SESSION = ("--group-session-timeout-ms", "18000")
"""The proxy's own members' session, as a fleet requires it with these heartbeats and the
broker's session of the proxy's member (6 s): heartbeat + broker session + 11 s."""


def classic(name: str, bootstrap: str, topic: str, group: str, assignor: str) -> ConfluentMember:
    """One librdkafka classic consumer, its client id ``name``; it goes on after a failed
    commit."""
    return ConfluentMember(bootstrap, [topic], group, protocol="classic", name=name, poll=0.1,
                           tolerate_commit_failures=True, stats_ms=STATS_MS,
                           extra={"client.id": name, "partition.assignment.strategy": assignor})


class Commits:
    """The group's committed offsets, read at the broker (OffsetFetch on a plain connection to
    its coordinator) every half second: any that moved back is kept."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.last: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                answer = ask_coordinator(self.bootstrap, self.group, 9, 5, {
                    "group_id": self.group, "topics": [
                        {"name": self.topic, "partition_indexes": list(range(PARTITIONS))}]})
            except (OSError, AssertionError):  # the coordinator is busy: read again
                self._stop.wait(0.5)
                continue
            if answer["error_code"] == 0:
                self._note(answer)
            self._stop.wait(0.5)

    def _note(self, answer: dict[str, Any]) -> None:
        self.reads += 1
        for topic in answer["topics"]:
            for p in topic["partitions"]:
                offset, partition = p["committed_offset"], p["partition_index"]
                if p["error_code"] or offset < 0:
                    continue
                before = self.last.get(partition, -1)
                if offset < before:
                    self.backwards.append((partition, before, offset))
                self.last[partition] = max(before, offset)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


# ---- what the members' events say -------------------------------------------------------------


def all_consumed_nothing_twice_nothing_back(producer: Production, commits: Commits,
                                            members: list[Member]) -> None:
    """After production stopped: every acknowledged record is consumed (waited for), no
    partition was owned twice, and no committed offset moved back (the sampler is stopped)."""
    try:
        wait_until(lambda: producer.acked <= consumed(members), "every acknowledged record "
                   "to be consumed", WAIT)
    finally:
        commits.stop()
    assert producer.acked and producer.failed == 0
    assert ownership_overlaps(members) == []
    assert commits.reads > 0 and commits.backwards == [], commits.backwards


def longest_unconsumed(members: list[Member], start: float, end: float) -> float:
    """The longest time within [start, end] that some partition had records waiting and none
    was consumed (approximated by the gaps between consumed records of each partition)."""
    times: dict[int, list[float]] = {p: [start] for p in range(PARTITIONS)}
    for m in members:
        for e in m.snapshot():
            if e["name"] == "record" and start <= e["t"] <= end:
                times[e["partition"]].append(e["t"])
    longest = 0.0
    for p in times:
        ts = [*sorted(times[p]), end]
        longest = max(longest, max(b - a for a, b in itertools.pairwise(ts)))
    return longest


# ---- the group as the proxy and the broker see it -----------------------------------------------


def engine_members(proxy_bootstrap: str, group: str) -> list[int] | None:
    """The engine's members by type (ConsumerGroupDescribe through the proxy); None while the
    engine does not have the group."""
    entry = described(proxy_bootstrap, group)
    if entry["error_code"] != 0:
        return None
    return sorted(m["member_type"] for m in entry["members"])


def broker_group(broker_bootstrap: str, group: str) -> dict[str, Any]:
    """The broker's group (its DescribeGroups entry, asked at the broker)."""
    entry: dict[str, Any] = ask_coordinator(broker_bootstrap, group, 15, 5, {
        "groups": [group], "include_authorized_operations": False})["groups"][0]
    return entry


def broker_members(broker_bootstrap: str, group: str) -> tuple[str, list[str]]:
    """(protocol, client ids) of the broker's group."""
    entry = broker_group(broker_bootstrap, group)
    return entry["protocol_data"], [m["client_id"] for m in entry["members"]]


def stable_with(broker_bootstrap: str, group: str, live: list[Member]) -> bool:
    """Whether the broker's group is Stable with exactly the live members (client ids, a
    mark's application client id), or is held by a proxy's lock member (converted)."""
    try:
        entry = broker_group(broker_bootstrap, group)
    except (OSError, AssertionError):  # the coordinator is busy: look again
        return False
    names = {mark.client_id if (mark := read_mark(m["client_id"])) else m["client_id"]
             for m in entry["members"]}
    return entry["group_state"] == "Stable" and (
        names == {m.name for m in live} or entry["protocol_data"] == LOCK_PROTOCOL)


def settle(live: list[Member], everything: set[tuple[str, int]], broker_bootstrap: str,
           group: str, what: str) -> None:
    """Wait for the group to settle: every partition owned once; the broker's group Stable
    with the live members (or converted, which needs that); then every member's librdkafka
    in join state ``steady``: it has served every rebalance callback of that generation."""
    wait_until(lambda: owned_exactly_once(live, everything), f"{what}: all owned once", WAIT)
    wait_until(lambda: stable_with(broker_bootstrap, group, live),
               f"{what}: the broker's group Stable with the live members", WAIT)
    seen = time.time()
    wait_until(lambda: all(m.join_state_after(seen) == "steady" for m in live),
               f"{what}: every member steady", WAIT)


def rebalances_after(member: Member, t: float) -> list[tuple[int, str]]:
    """Each change of librdkafka's rebalance count the member reported after ``t``, with
    the reason it gave for it."""
    seen: list[tuple[int, str]] = []
    for e in member.snapshot():
        if e["name"] == "stats" and e["t"] > t and (not seen or seen[-1][0] != e["rebalance_cnt"]):
            seen.append((e["rebalance_cnt"], e["rebalance_reason"]))
    return seen


def engine_view(proxy_bootstrap: str, group: str) -> dict[str, tuple[str, int, set[int]]]:
    """The engine's members by client id: (member id, member epoch, partitions owned)."""
    entry = described(proxy_bootstrap, group)
    assert entry["error_code"] == 0, entry
    return {m["client_id"]: (m["member_id"], m["member_epoch"],
                             {p for t in m["assignment"]["topic_partitions"]
                              for p in t["partitions"]})
            for m in entry["members"]}


@pytest.mark.parametrize(("assignor", "sidecars"), [
    ("cooperative-sticky", 1), ("range", 1), ("cooperative-sticky", 2)])
def test_rolled_onto_sidecars_the_group_moves_to_the_engine_without_a_callback(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member], assignor: str, sidecars: int) -> None:
    """With two sidecars (each with a fleet listener), members alternate between them: the one
    forwarding the leader announces the conversion to the other, which holds its members'
    requests and relays them to the new holder afterwards."""
    fleet = ([] if sidecars == 1 else  # sessions a fleet accepts (docs/operations.md)
             [("--fleet-listen", f"127.0.0.1:{port}", *FLEET_SESSION)
              for port in free_ports(sidecars)])
    proxies: list[ProxyProcess] = [start_proxy(kafka39, *FLAGS, *extra)
                                   for extra in fleet or [()]]
    name = topic(kafka39, partitions=PARTITIONS)
    everything = {(name, p) for p in range(PARTITIONS)}
    group = f"upgrade-{assignor}-{uuid.uuid4().hex[:8]}"
    producer = Production(kafka39.bootstrap, name, PARTITIONS, RATE)
    commits = Commits(kafka39.bootstrap, group, name)
    live: list[Member] = []  # by slot; ``members`` keeps every one started
    steps: list[tuple[str, float, float]] = []
    try:
        for i in range(MEMBERS):
            live.append(classic(f"member-{i}", kafka39.bootstrap, name, group, assignor))
            members.append(live[-1])
        wait_until(lambda: owned_exactly_once(live, everything), "4 direct members owning all",
                   WAIT)
        assert broker_members(kafka39.bootstrap, group)[0] == assignor

        for i in range(MEMBERS):  # the sidecar's rolling deployment, pod by pod
            start = time.time()
            live[i].stop()
            proxy = proxies[i % len(proxies)]
            live[i] = classic(f"member-{i}-proxied", proxy.bootstrap, name, group, assignor)
            members.append(live[i])
            what = f"the group to settle after member {i} moved behind the proxy"
            if i < MEMBERS - 1:
                wait_until(lambda: owned_exactly_once(live, everything), what, WAIT)
            else:  # the conversion's callbacks are counted from here: every one served
                settle(live, everything, kafka39.bootstrap, group, what)
            steps.append((f"member {i} behind the proxy", start, time.time()))
            if i < MEMBERS - 1:  # a direct member remains: the broker's group, now marked
                protocol, clients = broker_members(kafka39.bootstrap, group)
                assert protocol == assignor
                assert sum(c.startswith("gg3|") for c in clients) == i + 1, clients
        settled = time.time()

        wait_until(lambda: any(engine_members(p.bootstrap, group) is not None
                               for p in proxies), "the group to move to the engine", WAIT)
        converted = time.time()
        holder = next(p for p in proxies
                      if "moved from the broker's classic coordinator to the engine" in p.log())
        assert engine_members(holder.bootstrap, group) == [CLASSIC] * MEMBERS
        # every member as it was at the broker: its member id, the generation, its partitions
        found = re.search(rf"group {group}: moved from the broker's classic coordinator to the "
                          r"engine at generation (\d+)", holder.log())
        assert found is not None
        generation = int(found[1])
        assert engine_view(holder.bootstrap, group) == {
            m.name: (m.member_id(), generation, {p for _t, p in m.owned()}) for m in live}
        protocol, clients = broker_members(kafka39.bootstrap, group)
        assert protocol == "groupgate-coordinated" and len(clients) == 1, (protocol, clients)

        # every member goes on consuming after the conversion, and none was called back
        marks = {m.name: len(m.records) for m in live}
        wait_until(lambda: all(len(m.records) > marks[m.name] + 10 for m in live),
                   "every member to consume after the conversion", WAIT)
        steps.append(("conversion", settled, time.time()))
        for m in live:  # (librdkafka's count of rebalance callbacks and its last reason)
            assert m.callbacks_after(settled) == [], (
                m.name, m.callbacks_after(settled), rebalances_after(m, settled))
            assert not m.errors, (m.name, m.errors)
        assert engine_members(holder.bootstrap, group) == [CLASSIC] * MEMBERS
        if sidecars > 1:  # the other sidecar was told, and relays to the holder since
            follower = next(p for p in proxies if p is not holder)
            assert "converts it at generation" in follower.log()
            assert "says it converted the group" in follower.log()
    finally:
        producer.stop()
    all_consumed_nothing_twice_nothing_back(producer, commits, members)
    assert min(commits.last.values(), default=-1) > 0
    print(f"\n{assignor}, {sidecars} sidecar(s): converted {converted - settled:.1f} s after "
          "the last step settled")
    for what, start, end in steps:
        print(f"{assignor}, {sidecars} sidecar(s): {what}: longest unconsumed "
              f"{longest_unconsumed(members, start, end):.2f} s")


def recorded(name: str, events: list[dict[str, Any]]) -> Member:
    """A member that reported made-up events, for checking the accounting without a broker."""
    member = Member(name)
    for event in events:
        member.on_event(event)
    return member


def test_the_accounting_catches_what_it_looks_for() -> None:
    """Broker-free: overlapping ownership, callbacks after a time, and unconsumed gaps are
    found in made-up event streams (so the checks above can fail)."""
    a = recorded("a", [{"name": "partitions_assigned", "partitions": [["t", 0], ["t", 1]],
                        "t": 1.0},
                       {"name": "partitions_revoked", "partitions": [["t", 1]], "t": 5.0},
                       {"name": "record", "topic": "t", "partition": 0, "offset": 0, "t": 6.0},
                       {"name": "closed", "t": 9.0}])
    b = recorded("b", [{"name": "partitions_assigned", "partitions": [["t", 1]], "t": 4.0}])
    assert ownership_overlaps([a, b]) == ["partition t-1: a until 5.000, b from 4.000"]
    c = recorded("c", [{"name": "partitions_assigned", "partitions": [["t", 1]], "t": 5.5}])
    assert ownership_overlaps([a, c]) == []
    d = recorded("d", [{"name": "partitions_assigned", "partitions": [["t", 0]], "t": 8.0}])
    assert ownership_overlaps([a, d]) == ["partition t-0: a until 9.000, d from 8.000"]
    assert [e["t"] for e in a.callbacks_after(2.0)] == [5.0] and a.callbacks_after(5.0) == []
    assert longest_unconsumed([a], 5.0, 8.0) == 3.0  # partitions 1-11: nothing consumed
    assert consumed([a, b]) == {(0, 0)}
