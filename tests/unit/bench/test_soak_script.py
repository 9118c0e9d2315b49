"""The soak's scripted events: ``SECONDS:KIND[:GROUP[:LIBRARY/PROTOCOL]]``."""

from __future__ import annotations

from tests.benchmarks.soak.run import parse_scripted


def test_a_scripted_event_names_its_group_and_optionally_the_kind_of_member() -> None:
    assert parse_scripted("8:kill") == (8.0, "kill", None, None)
    assert parse_scripted("8.5:kill:eager") == (8.5, "kill", "eager", None)
    assert parse_scripted("22:kill:eager:java/classic") == (22.0, "kill", "eager",
                                                            "java/classic")
