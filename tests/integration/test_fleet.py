"""Several sidecars, one group: pods (network namespaces) with a sidecar each, real clients of
both protocols behind every sidecar, one group, continuous production.

Each test is a short scripted soak (:mod:`tests.benchmarks.soak.run`, ``dev/bench soak --pods``
runs the long versions; ``docs/benchmarks/fleet.md`` records them) and checks what the soak
checks: no partition owned by two members at once on the members' own callback timelines, every
acknowledged record consumed, no committed offset moving backwards, no member starting a
partition below an offset whose commit had landed (so duplicates are only records whose commit
had not landed), the proxies' memory flat.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.soak import run as soak
from tests.testbed import pods

pytestmark = pytest.mark.broker


@pytest.fixture(autouse=True)
def _pods_available() -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)


def run_soak(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    result = soak.Soak(soak.Settings(**settings), tmp_path).run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(soak.summary(result))
    assert result["caught_up"], f"logs in {tmp_path}"
    assert result["violations"] == [], f"{result['violations']}; logs in {tmp_path}"
    for name, group in result["groups"].items():
        assert group["produced"] > 300 and group["commits_ok"] > 0, name
    return result


@pytest.mark.slow  # the three-pod test below covers it in the default run
def test_two_sidecars_one_group_every_partition_owned_once(tmp_path: Path) -> None:
    """The deployment that failed before the fleet: two sidecars, each with a new-protocol and a
    classic member of one group (every partition was owned twice, 1.5-1.9x the records read)."""
    result = run_soak(
        tmp_path, duration_s=40.0, seed=21, pods=2, groups=("eager",), events=(),
        initial=("eager:confluent/consumer/async@1", "eager:confluent/classic/async@1",
                 "eager:confluent/consumer/async@2", "eager:confluent/classic/async@2"))
    group = result["groups"]["eager"]
    assert len(group["members"]) == 4
    holders = {h for _t, _g, h in result["holders"]}
    assert len(holders) == 1, result["holders"]  # one sidecar coordinated, the other relayed


def test_three_pods_both_protocols_eager_and_cooperative(tmp_path: Path) -> None:
    """Three pods, two members in each (one per group), both protocols, eager and cooperative
    classic members; a member joins and one leaves on the way."""
    run_soak(
        tmp_path, duration_s=36.0, seed=22, pods=3, groups=("eager", "cooperative"),
        initial=("eager:confluent/classic/async@1", "cooperative:confluent/consumer/async@1",
                 "eager:confluent/consumer/auto@2", "cooperative:kafka-python/classic/async@2",
                 "eager:kafka-python/classic/sync@3", "cooperative:confluent/classic/sync@3"),
        script=("14:join:eager", "24:leave:cooperative"))


STEADY_KILL = "18:coordinator-kill:cooperative"
JOIN_KILL = "50:join-coordinator-kill:cooperative"


@pytest.mark.parametrize(("script", "duration_s"), [
    pytest.param((STEADY_KILL,), 40.0, id="at-steady-state"),
    pytest.param((STEADY_KILL, JOIN_KILL), 80.0, id="and-while-a-member-joins",
                 marks=pytest.mark.slow)])
def test_the_coordinating_sidecar_sigkilled_at_steady_state_and_while_a_member_joins(
        tmp_path: Path, script: tuple[str, ...], duration_s: float) -> None:
    """With the group's state in the state log, the sidecar taking over loads it: at steady
    state no member rejoins, loses or hands back a partition; with ``--run-slow``, also a
    member joining while the coordinating sidecar dies gets its partitions (the usual checks:
    none owned twice, no offset moved backwards). The members' sessions (20 s) outlast the
    takeover (the broker notices the dead sidecar after ``broker-session-timeout-ms``, 6 s,
    then the log is read); a classic client whose own session ends first gives its partitions
    up on its own."""
    result = run_soak(
        tmp_path, duration_s=duration_s, seed=23, pods=2, groups=("cooperative",),
        session_timeout_ms=20000, max_poll_interval_ms=30000,
        initial=("cooperative:confluent/consumer/async@1", "cooperative:confluent/classic/async@1",
                 "cooperative:confluent/consumer/async@2", "cooperative:confluent/classic/sync@2"),
        script=script)
    kills = [f for f in result["served_again"] if f["event"].endswith("coordinator-kill")]
    assert [f["event"] for f in kills] == [entry.split(":")[1] for entry in script]
    steady = kills[0]
    timeline = result["groups"]["cooperative"]["timeline"]
    window = [e for e in timeline if steady["t"] <= e[0] <= steady["t"] + steady["window_s"]]
    assert steady["window_s"] >= 20, steady  # the kill's takeover and a while after it
    assert not [e for e in window if e[2] in ("join", "revoke", "lost", "assign")], window
    assert steady["members_disturbed"] == 0 and steady["served_again_s"] == 0.0, steady
    if JOIN_KILL not in script:
        return
    joining = kills[1]
    (joiner,) = [e["member"] for e in result["events"] if e["event"] == "join-coordinator-kill"]
    assigned = [e for e in timeline if e[1] == joiner and e[2] == "assign" and e[3]]
    assert assigned and assigned[0][0] < joining["t"] + joining["window_s"], timeline
    assert joining["served_again_s"] is not None, joining


def test_a_rollout_restarts_every_sidecar_one_at_a_time(tmp_path: Path) -> None:
    result = run_soak(
        tmp_path, duration_s=48.0, seed=24, pods=3, groups=("eager",), roll_gap_s=5.0,
        initial=("eager:confluent/consumer/async@1", "eager:confluent/classic/async@2",
                 "eager:kafka-python/classic/auto@3", "eager:confluent/consumer/sync@3"),
        script=("12:sidecar-roll:eager",))
    (roll,) = [e for e in result["events"] if e["event"] == "sidecar-roll"]
    assert roll["proxies"] == ["pod1", "pod2", "pod3"]


@pytest.mark.slow  # a multi-node failover: dev/bench soak --brokers 3 is the long version
def test_three_brokers_the_group_s_broker_and_then_its_sidecar_fail(tmp_path: Path) -> None:
    """Kafka 3.9 on three nodes: the broker coordinating the group is SIGKILLed (its
    ``__consumer_offsets`` partition moves; the sidecar's member rejoins at the new broker
    coordinator, or its lease ends first), then the coordinating sidecar is."""
    result = run_soak(
        tmp_path, duration_s=80.0, seed=25, pods=2, brokers=3, groups=("eager",),
        initial=("eager:confluent/consumer/async@1", "eager:confluent/classic/async@2",
                 "eager:confluent/classic/sync@1", "eager:confluent/consumer/sync@2"),
        script=("20:broker-kill:eager", "55:coordinator-kill:eager"))
    applied = {e["event"] for e in result["events"] if not e.get("skipped")}
    assert applied == {"broker-kill", "coordinator-kill"}, result["events"]
