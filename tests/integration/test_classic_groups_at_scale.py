"""Classic groups of real clients on the proxy's engine, judged on their own callback timelines.

The rebalance benchmark's ``groupgate`` target (Kafka 3.9 with the proxy in front, classic
members served by the engine; session 6 s, heartbeat 1 s) and its member pools play a scale-out
N -> N+1 with real clients; every member reports its rebalance callbacks and records. Checked on
that timeline (:mod:`tests.benchmarks.rebalance.timeline`):

* 20 confluent-kafka classic members (eager ``range`` and ``cooperative-sticky``) and 10 Java
  VerifiableConsumers from Kafka 3.9 (same two assignors): at no instant is a partition owned by
  two members, ownership taken as widely as the callbacks allow (from entering the assignment
  callback until the revocation callback returns); the group converges with every partition
  owned once;
* only members that lose partitions are called back at all: the others keep consuming through
  the scale-out (no revocation, no callback);
* a member stuck 12 s in its revocation callback (:data:`STUCK_S`, two of its 6 s sessions)
  does not hold the others back: every partition it does not hold is owned again, and nobody
  else is inside a callback, within two heartbeat intervals (plus the joining client's
  start-up) of the new member's arrival.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.rebalance import scenarios, targets, timeline

HEARTBEAT_S = targets.HEARTBEAT_INTERVAL_MS / 1000
STUCK_S = 12.0
"""How long the stuck member stays in its revocation callback (the benchmark's ``slow``
scenario: 30 s)."""
CLIENT_START_SLACK_S = 0.5
"""Time the joining client needs before it can send its first JoinGroup (process already
running: client creation, metadata, FindCoordinator)."""


@pytest.fixture(scope="module")
def groupgate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[targets.Target]:
    target = targets.make_target("groupgate")
    target.start(tmp_path_factory.mktemp("groupgate-target"))
    try:
        yield target
    finally:
        target.stop()


def play(target: targets.Target, workdir: Path, *, members: int, protocol: str,
         client: str = "confluent", scenario: str = "scale-out") -> dict[str, Any]:
    settings = scenarios.Settings(members=members, scenario=scenario, protocol=protocol,
                                  client=client, settle_s=2.0, max_wait_s=90.0,
                                  slow_s=STUCK_S)
    run = scenarios.run_scenario(target, settings, workdir, log=lambda _m: None)
    assert not run["timed_out"], run["client_errors"]
    assert run["convergence_s"] is not None
    return run


def check_scale_out(run: dict[str, Any]) -> None:
    events = scenarios.events_of(run)
    assert timeline.overlaps(events) == []
    joiner = run["roles"]["joiner"]
    state = timeline.State(run["partitions"])
    for ev in events:
        state.apply(ev)
    assert state.converged()
    final = {p: next(iter(owners)) for p, owners in state.owners.items()}
    after = [ev for ev in events if ev.t >= 0 and ev.member != joiner]
    called_back = {ev.member for ev in after if ev.kind in ("stall", "assign", "revoke")}
    lost = {ev.member for ev in after if ev.kind == "revoke"
            and any(final.get(p) != ev.member for p in ev.partitions)}
    # Only members that lose partitions were disturbed at all.
    assert called_back == lost, sorted(called_back - lost)
    assert lost and len(lost) < run["members"]
    assert sorted(state.owned[joiner]), "the new member got nothing"


@pytest.mark.broker
@pytest.mark.parametrize("protocol", ["range", "cooperative-sticky"])
def test_twenty_confluent_classic_members(groupgate: targets.Target, tmp_path: Path,
                                          protocol: str) -> None:
    run = play(groupgate, tmp_path, members=20, protocol=protocol)
    check_scale_out(run)


@pytest.mark.broker
@pytest.mark.parametrize("protocol", ["range", pytest.param("cooperative-sticky",
                                                           marks=pytest.mark.slow)])
def test_ten_java_classic_members(groupgate: targets.Target, tmp_path: Path,
                                  protocol: str) -> None:
    run = play(groupgate, tmp_path, members=10, protocol=protocol, client="java")
    check_scale_out(run)


def others_converged_at(run: dict[str, Any]) -> float | None:
    """When (seconds after the new member's arrival) every partition the stuck member does not
    hold had one live owner and no other member was inside a callback, staying so until the
    stuck member came back from its callback."""
    slow = run["roles"]["slow"]
    events = scenarios.events_of(run)
    back = next((ev.t for ev in events if ev.t > 0 and ev.member == slow
                 and ev.kind == "resume"), None)
    assert back is not None and back > STUCK_S - 1, "the member was not stuck"
    state = timeline.State(run["partitions"])
    since: float | None = None
    held: set[int] | None = None
    for ev in events:
        if ev.t >= 0 and held is None:
            # what the stuck member held when the new member arrived (its revocation callback
            # is entered, and stays, with some of these)
            held = set(state.owned.get(slow, set()))
        state.apply(ev)
        if ev.t < 0:
            continue
        if ev.t >= back:
            break
        assert held is not None
        ok = not (state.stalled - {slow}) and all(
            len(state.owners.get(p, ())) == 1 for p in range(state.partitions) if p not in held)
        if ok and since is None:
            since = ev.t
        elif not ok:
            since = None
    return since


@pytest.mark.broker
def test_a_member_stuck_in_its_callback_does_not_hold_back_the_others(
        groupgate: targets.Target, tmp_path: Path) -> None:
    run = play(groupgate, tmp_path, members=6, protocol="cooperative-sticky", scenario="slow")
    (tmp_path / "run.json").write_text(json.dumps(run))  # the timeline, if this fails
    assert timeline.overlaps(scenarios.events_of(run)) == []
    converged = others_converged_at(run)
    assert converged is not None, tmp_path / "run.json"
    assert converged <= 2 * HEARTBEAT_S + CLIENT_START_SLACK_S, converged
