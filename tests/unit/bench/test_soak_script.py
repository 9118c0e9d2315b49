"""The soak's scripted events: ``SECONDS:KIND[:GROUP[:LIBRARY/PROTOCOL]]``, and when a
scripted member event is applied (once its group has formed)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.rebalance.timeline import Event
from tests.benchmarks.soak.run import Kind, Member, Settings, Soak, parse_scripted


def test_a_scripted_event_names_its_group_and_optionally_the_kind_of_member() -> None:
    assert parse_scripted("8:kill") == (8.0, "kill", None, None)
    assert parse_scripted("8.5:kill:eager") == (8.5, "kill", "eager", None)
    assert parse_scripted("22:kill:eager:java/classic") == (22.0, "kill", "eager",
                                                            "java/classic")


def _soak(tmp_path: Path, *names: str) -> Soak:
    soak = Soak(Settings(groups=("eager",), partitions=2), tmp_path, out=lambda _line: None)
    for name in names:  # members as the soak keeps them, no process started
        member = Member(name, "eager", Kind("confluent", "classic", "range", "async"), soak)
        member.alive = True
        soak.members[name] = member
    return soak


def _report(soak: Soak, name: str, kind: str, *partitions: int) -> None:
    soak.record(soak.members[name], {"e": kind, "t": len(soak.groups["eager"].events),
                                     "p": list(partitions)})


def test_a_scripted_member_event_waits_for_every_live_member_to_be_given_its_share(
        tmp_path: Path) -> None:
    """A process still starting (no join reported), or joined and not yet given its
    assignment, is not a member to kill yet; a member gone since is not waited for; a
    partition without an owner (a rebalance under way) is not a formed group."""
    soak = _soak(tmp_path, "a", "b", "c", "d")
    _report(soak, "a", "join")
    _report(soak, "b", "join")
    _report(soak, "a", "assign", 0, 1)
    assert not soak.formed("eager")  # c and d not joined, b not given anything
    _report(soak, "c", "join")
    _report(soak, "a", "revoke", 1)
    _report(soak, "b", "assign", 1)
    _report(soak, "d", "join")
    assert not soak.formed("eager")  # c, d: joined, not given their (empty) shares
    _report(soak, "c", "assign")
    assert not soak.formed("eager")
    soak.members["d"].alive = False  # SIGKILLed, as the soak records it
    soak.groups["eager"].events.append(Event(99.0, "d", "crash"))
    assert soak.formed("eager")
    _report(soak, "b", "revoke", 1)
    assert not soak.formed("eager")
    assert not soak.wait_formed("eager", 0.0)
    _report(soak, "c", "assign", 1)
    assert soak.wait_formed("eager", 0.0)
