"""The report's HTML for the online upgrade, without Spark: the conversions and aborted
attempts as the ``conversions`` table gives them, and the heading's words on skipped schema
versions."""

from __future__ import annotations

from typing import Any

from proxy.report import render

T0 = 1_700_000_000_000


def conversion(**fields: Any) -> dict[str, Any]:
    row = {"group": "orders", "ts": T0, "outcome": "converted",
           "from_protocol": "cooperative-sticky", "to": "engine", "generation": 5,
           "members": 3, "duration_ms": 420, "source": "sidecar-1:9092", "reason": None}
    return {**row, **fields}


def test_conversions_and_aborted_attempts() -> None:
    aborted = conversion(outcome="aborted", from_protocol=None, to=None, members=None,
                         duration_ms=None, generation=4,
                         reason="the broker's group <changed> meanwhile")
    page = "".join(render.migration_tables([conversion()], [aborted]))
    assert ("<tr><td>orders</td><td>2023-11-14 22:13:20 UTC</td>"
            "<td>classic (cooperative-sticky)</td><td>engine</td>"
            '<td class="n" data-sort="5">5</td><td class="n" data-sort="3">3</td>'
            '<td class="n" data-sort="420.0">420 ms</td><td>sidecar-1:9092</td></tr>') in page
    assert "<h3>Conversions aborted</h3>" in page
    assert ('<td class="n" data-sort="4">4</td>'
            "<td>the broker&#x27;s group &lt;changed&gt; meanwhile</td>") in page


def test_a_conversion_whose_adoption_is_not_in_the_data() -> None:
    page = "".join(render.migration_tables([conversion(duration_ms=None, from_protocol=None)],
                                           []))
    assert "<td>classic (?)</td>" in page and '<td class="n" data-sort="-1.0">-</td>' in page
    assert "Conversions aborted" not in page


def test_no_conversion() -> None:
    page = "".join(render.migration_tables([], []))
    assert "No broker group was converted online in the window." in page


def test_skipped_versions_are_said() -> None:
    assert render.skipped_note({"events_skipped": {}, "schema_versions": [1, 2]}) == ""
    assert render.skipped_note({"events_skipped": {"3": 1200, "none": 1},
                                "schema_versions": [1, 2]}) == (
        " 1,201 events of a schema version this report does not read were skipped "
        "(version 3: 1,200, without a version: 1; it reads 1, 2).")
