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

import datetime
import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.soak import run as soak
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


def run_soak(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    result = soak.Soak(soak.Settings(**settings), tmp_path).run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(soak.summary(result))
    assert result["caught_up"], f"logs in {tmp_path}"
    assert result["violations"] == [], f"{result['violations']}; logs in {tmp_path}"
    for name, group in result["groups"].items():
        assert group["produced"] > 300 and group["commits_ok"] > 0, name
    return result


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
    return sorted(found)


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
    partition or rejoins; the joiner gets its share."""
    result = run_soak(
        tmp_path, duration_s=45.0, seed=31, pods=3, groups=("cooperative",), fault_s=3.0,
        initial=FOUR_MEMBERS, join_kind="confluent/consumer/async",
        script=("20:join-coordinator-freeze:cooperative",))
    freeze = _event(result, "join-coordinator-freeze")
    holder, joiner = freeze["proxy"], freeze["member"]
    assert freeze["member_pod"] == "pod3" and holder in ("pod1", "pod2"), freeze
    woke = freeze["t"] + 3.0
    timeline = result["groups"]["cooperative"]["timeline"]
    # the group's state after the fault: the same holder, the joiner owns its share
    assert {h for _t, _g, h in result["holders"]} == {holder}, result["holders"]
    served = _served(result, "join-coordinator-freeze")
    assert served["served_again_s"] is not None, served
    owned = owners_over(e for e in timeline if e[0] <= freeze["t"] + served["window_s"])
    assert owned.get(joiner) and sorted(p for ps in owned.values() for p in ps) == list(
        range(6)), owned
    # nobody disturbed but by the joiner's arrival: no loss, no rejoin, and every partition
    # another member revoked went to the joiner
    window = [e for e in timeline if freeze["t"] <= e[0] <= freeze["t"] + served["window_s"]]
    assert not [e for e in window if e[2] == "lost" or (e[2] == "join" and e[1] != joiner)], \
        window
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


def test_coordinator_frozen_for_two_broker_sessions_while_a_member_joins(
        tmp_path: Path) -> None:
    """The coordinating sidecar frozen for 12 s (two broker sessions) while a member joins
    behind an empty pod's sidecar: the broker drops the frozen holder's member after a
    session, another sidecar takes the group over and loads its state; the frozen one, on
    waking, finds its lease long gone (a whole session without an answer): it loses the group
    without acting (no assignment, no commit) and tells its own members to let go."""
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
    # another sidecar took the group over while the holder was frozen
    held = sidecar_lines(tmp_path, "holding the broker's group as member")
    takeovers = [(t, pod) for t, pod, _i, _line in held if freeze["t"] < t < woke]
    assert takeovers and all(pod != holder for _t, pod in takeovers), held
    # the frozen one, on waking, did not act: its first word about the group is the loss
    after = [(t, line) for t, pod, _i, line in sidecar_lines(tmp_path, r"group soak-")
             if pod == holder and t >= woke - 0.5]
    assert after and "lost the broker's group: no answer from the broker within a session" \
        in after[0][1], after[:5]
    assert not [line for _t, line in after if "holding the broker's group" in line
                and _t < woke + BROKER_SESSION_S], after
    # the group's state after it: served by members that all own their share
    served = _served(result, "join-coordinator-freeze")
    assert served["served_again_s"] is not None, served
    owned = owners_over(e for e in timeline if e[0] <= freeze["t"] + served["window_s"])
    assert owned.get(joiner) and sorted(p for ps in owned.values() for p in ps) == list(
        range(6)), owned
    assert not handed_over_after_let_go(timeline, freeze["t"]), timeline
    disturbed = sorted({e[1] for e in timeline if e[0] >= freeze["t"] and e[2] == "lost"})
    print(f"holder {holder} frozen {fault_s} s; taken over by {takeovers[0][1]} "
          f"{takeovers[0][0] - freeze['t']:.1f} s in; members that lost partitions: "
          f"{disturbed}; served again {served['served_again_s']} s after the freeze began")
