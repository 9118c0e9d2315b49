"""The fleet defects found in real runs and fixed, put back one at a time, and the seed the
fleet simulator fails with each (``tests/sim/fleet_sim.py``): the same seed passes with the
fix in place. Where the defect's logic is in the core, its switch is read by
:class:`~proxy.fleet_core.core.GroupCore`; where it is still trio-side, by the simulator's
model of the service (:mod:`proxy.fleet_core.defects`). The catalogue, with what is not
expressed yet and why, is in ``docs/architecture.md`` ("Fleet defects the simulator finds").

Then the gaps of today's product the simulator found (:data:`tests.sim.fleet_checks.
KNOWN_GAPS`): the seed that shows each, which fails when gaps are not tolerated.

Replay one: ``run_fleet_seed(seed, with_defects(seed, name=True))``, with ``sim.verbose``
for a trace of every answer.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.fleet_core import core as core_module
from proxy.fleet_core import events as ev
from proxy.fleet_core.core import Role
from proxy.fleet_core.defects import Defects
from tests.sim import fleet_sim
from tests.sim.fleet_checks import KNOWN_GAPS
from tests.sim.fleet_sim import Knobs, knobs_for_seed, run_fleet_seed


@dataclass(frozen=True)
class Case:
    defect: str
    """The :class:`Defects` switch (or, for the cases without one, what is changed)."""
    fixed_in: str
    seed: int
    caught_by: str
    """A part of the violation's message: the invariant that catches it."""
    knobs: dict[str, Any] = field(default_factory=dict)
    """Changes to the seed's knobs the defect needs to show (the run that found it)."""

    def fixed(self) -> Knobs:
        return dataclasses.replace(knobs_for_seed(self.seed), **self.knobs)

    def broken(self) -> Knobs:
        knobs = self.fixed()
        return dataclasses.replace(knobs, defects=dataclasses.replace(
            knobs.defects, **{self.defect: True}))


CATALOGUE = [
    Case("keep_failed_takeover", "191fce7", 910112, "owned by"),
    Case("join_without_checking", "92f580e", 910001, "contested election"),
    Case("cut_off_holder_keeps_claiming", "49192ea", 910332, "owned by"),
    Case("lookup_waits_unbounded", "88d465e", 905326, "owned by"),
    Case("timers_ignore_lease", "49192ea", 910086, "outside its lease"),
    Case("sessions_run_while_inside", "7bfe2f6", 910032, "while a request of it was inside",
         {"member_session_ms": 6_000}),
    Case("no_stale_retry_guard", "12b575a", 910026, "committed offset moved back"),
    Case("closed_connection_commits_land", "902abd8", 910035, "committed offset moved back"),
    Case("relayed_commits_unbounded", "4d447fe, 73432a6", 910341,
         "while a request of it was inside", {"java_share": 1.0}),
    Case("stepping_down_passes_to_broker", "f2e0584", 910001, "told UNKNOWN_MEMBER_ID by broker"),
    Case("takeover_advertises_no_topics", "2fc434b", 910000, "expired at the broker"),
]


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda c: c.defect)
def test_the_simulator_finds_the_defect_put_back(case: Case) -> None:
    fixed = run_fleet_seed(case.seed, case.fixed())
    assert fixed.ok, fixed.violation
    broken = run_fleet_seed(case.seed, case.broken())
    assert not broken.ok and case.caught_by in broken.violation, broken.violation
    assert not any(broken.violation.startswith(f"[{gap}]") for gap in KNOWN_GAPS)


def test_every_switch_is_off_by_default_and_named_in_the_catalogue() -> None:
    assert Defects().on() == [] and Knobs().defects == Defects()
    not_expressed = {"heartbeats_held_whole_hold", "no_heartbeat_catch_up"}
    names = {f.name for f in dataclasses.fields(Defects)}
    assert names == {c.defect for c in CATALOGUE} | not_expressed


def test_no_switch_is_reachable_outside_the_simulator_s_tests() -> None:
    """Only the core (its default, :data:`NO_DEFECTS`) and the simulator's tests name the
    switches: no module of the proxy, and no other test or tool, can turn one on."""
    root = pathlib.Path(core_module.__file__).parents[2]
    allowed = {pathlib.Path("proxy/fleet_core/defects.py"),
               pathlib.Path("proxy/fleet_core/core.py")}
    naming = set()
    for folder in ("proxy", "translation", "tests", "dev"):
        for path in (root / folder).rglob("*.py"):
            relative = path.relative_to(root)
            if relative.parts[:2] != ("tests", "sim") and relative not in allowed \
                    and re.search(r"\bdefects\b|\bDefects\b", path.read_text()):
                naming.add(str(relative))
    assert naming == set()
    core_source = (root / "proxy/fleet_core/core.py").read_text()
    assert re.findall(r"defects: Defects = (\w+)", core_source) == ["NO_DEFECTS"]


# -- what the fleet rests on, changed in the simulation itself --------------------------------


def _failing(seeds: list[int], **changes: Any) -> list[fleet_sim.FleetResult]:
    results = [run_fleet_seed(seed, dataclasses.replace(knobs_for_seed(seed), **changes))
               for seed in seeds]
    return [r for r in results if not r.ok]


def test_a_lease_as_long_as_the_session_is_caught() -> None:
    failed = _failing([910_001], lease_fraction=1.0)
    assert any("runs the engine" in r.violation or "both act" in r.violation for r in failed)


def test_clocks_outside_the_leases_assumption_are_caught() -> None:
    assert _failing([910_024], skew=0.45)


def test_answers_that_skip_the_write_barrier_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    done = core_module.GroupCore._engine_done

    def no_barrier(self: core_module.GroupCore, event: ev.EngineDone, now: float,
                   out: list[ev.Action]) -> None:
        done(self, event, now, out)
        if any(self.barrier.withdraw((event.rid, inbound)) for inbound in (False, True)):
            out.append(ev.Respond(event.rid))

    monkeypatch.setattr(core_module.GroupCore, "_engine_done", no_barrier)
    failed = _failing([910_013])
    assert any("owned by" in r.violation or "knows epoch" in r.violation for r in failed)


def test_a_holder_that_ignores_its_lease_is_caught_by_ownership_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the holder check, the clients' partitions show it: two engines assign."""
    monkeypatch.setattr(core_module.GroupCore, "acting",
                        lambda self, now: self.role is Role.COORDINATING)
    time_ = core_module.GroupCore._time

    def no_lease(self: core_module.GroupCore, now: float, out: list[ev.Action]) -> None:
        lease = self.lease
        if self.role is Role.COORDINATING:
            saved = (lease.lease_deadline, lease.session_deadline)
            lease.lease_deadline = lease.session_deadline = core_module.INF
            time_(self, now, out)
            if lease.lease_deadline == core_module.INF:
                lease.lease_deadline, lease.session_deadline = saved
        else:
            time_(self, now, out)

    monkeypatch.setattr(core_module.GroupCore, "_time", no_lease)
    monkeypatch.setattr(fleet_sim.FleetSimulation, "check_sole_holder",
                        lambda self, sc, what: None)
    failed = _failing([910_233])  # (the first of 910000-910599)
    assert any("owned by" in r.violation for r in failed)


# -- gaps of today's product -----------------------------------------------------------------

GAP_SEEDS = {
    "unseen-stale-retry": 900_004,
    "stuck-ticketed-commit": 900_440,
    "stranded-after-lost-answer": 900_110,
    "let-go-told-once": 900_647,
    "commit-relay-outlasts-session": 903_727,
}


def test_every_known_gap_has_a_seed() -> None:
    assert set(GAP_SEEDS) == set(KNOWN_GAPS)


@pytest.mark.parametrize("gap", sorted(GAP_SEEDS))
def test_a_known_gap_still_shows(gap: str) -> None:
    """The seed passes with the gap counted, and fails on it when gaps are not tolerated:
    once the product closes the gap, this fails, and the gap leaves the list."""
    seed = GAP_SEEDS[gap]
    tolerated = run_fleet_seed(seed)
    assert tolerated.ok and any(g.startswith(f"[{gap}]") for g in tolerated.gaps), \
        (tolerated.violation, tolerated.gaps)
    strict = run_fleet_seed(seed, dataclasses.replace(knobs_for_seed(seed), strict_gaps=True))
    assert not strict.ok and strict.violation.startswith(f"[{gap}]"), strict.violation


def test_a_retry_the_guard_found_partly_stale_carries_its_other_partitions_unseen() -> None:
    """907872 (a finding of the long run): after the holder thawed, a member's retry of an
    old commit reached the follower's guard once a newer commit of one of its partitions had
    been answered, but before the answer of a newer one of its other partition, already
    written at the broker: the guard took out the partition it knew stale and wrote the
    other, which moved back. That is the ``unseen-stale-retry`` gap for the partition the
    guard could not know of, counted as such (a retry found partly stale is no longer taken
    for one the guard saw whole)."""
    tolerated = run_fleet_seed(907_872)
    assert tolerated.ok and tolerated.stats["gap-unseen-stale-retry"] > 0, tolerated.violation
    strict = run_fleet_seed(907_872, dataclasses.replace(knobs_for_seed(907_872),
                                                         strict_gaps=True))
    assert not strict.ok and strict.violation.startswith("[unseen-stale-retry]")


# -- open findings of the long run -----------------------------------------------------------

OPEN_SEEDS: dict[int, str] = {}
"""Seeds of ``--run-slow`` (900150-910149) that fail today, not explained by a known gap and
not yet understood; each replays here and fails on its invariant. Once one passes, this
test fails: find out what fixed it and take it off."""


@pytest.mark.parametrize("seed", sorted(OPEN_SEEDS))
def test_an_open_finding_of_the_long_run_still_fails(seed: int) -> None:
    result = run_fleet_seed(seed)
    assert not result.ok and OPEN_SEEDS[seed] in result.violation, result.violation
    assert not any(result.violation.startswith(f"[{gap}]") for gap in KNOWN_GAPS)


# -- version skew ----------------------------------------------------------------------------

ZERO_TWO = Defects(
    keep_failed_takeover=True, join_without_checking=True, cut_off_holder_keeps_claiming=True,
    timers_ignore_lease=True, sessions_run_while_inside=True, relayed_commits_unbounded=True,
    stepping_down_passes_to_broker=True, heartbeats_held_whole_hold=True,
    no_heartbeat_catch_up=True, takeover_advertises_no_topics=True, lookup_waits_unbounded=True)
"""What a 0.2.0 sidecar (fleet protocol 2, ``tests/testbed/releases.py``) still does: every
fix of the catalogue made after it (the stale-retry guard, 12b575a, and the reset of a closed
connection's broker connection, 902abd8, are in 0.2.0)."""

SKEW_SEEDS = range(920_000, 920_017)


def test_a_protocol_2_sidecar_in_the_fleet_keeps_the_invariants() -> None:
    """Version skew, the protocol: one sidecar speaks fleet protocol 2 (it takes no commit
    tickets; its followers relay it their members' commits, which it commits itself, and it
    relays its own members' commits to a protocol-3 holder), with today's fleet logic."""
    results = [run_fleet_seed(s, dataclasses.replace(knobs_for_seed(s), skewed_sidecar=True))
               for s in SKEW_SEEDS]
    assert [r.violation for r in results if not r.ok] == []
    assert sum(r.stats["relays"] for r in results) > 0


def test_a_0_2_0_sidecar_in_the_fleet_is_found_out() -> None:
    """Version skew, the build: the same sidecar with 0.2.0's fleet logic. The simulator finds
    what 0.2.0 still does in a mixed fleet (during a roll from it): a takeover by it
    advertises no topics, so the broker expires the idle topic's offsets (KIP-211); its timer
    task fences members past its lease."""
    failed = [run_fleet_seed(s, dataclasses.replace(
        knobs_for_seed(s), skewed_sidecar=True, skewed_defects=ZERO_TWO)) for s in SKEW_SEEDS]
    violations = [r.violation for r in failed if not r.ok]
    assert any("expired at the broker" in v for v in violations), violations
    assert any("outside its lease" in v for v in violations), violations
