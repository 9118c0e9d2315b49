"""The soak, short: every kind of event once or twice in about two minutes, and every
invariant checked (``dev/bench soak`` runs the long version; docs/benchmarks/soak.md).

Real clients (confluent-kafka both protocols, kafka-python, Java; asynchronous, synchronous and
auto commits) in three groups behind the proxy on a Kafka 3.9 broker, under continuous
production, with joins, graceful leaves, SIGKILLs, stalls past ``max.poll.interval.ms``, proxy
restarts (SIGTERM and SIGKILL) and a broker restart.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.soak import run as soak

pytestmark = pytest.mark.broker


def test_short_soak_keeps_every_invariant(tmp_path: Path) -> None:
    settings = soak.Settings(duration_s=70.0, seed=7, min_event_gap_s=6.0,
                             max_event_gap_s=8.0, catch_up_s=150.0)
    result = soak.Soak(settings, tmp_path).run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(soak.summary(result))
    applied = {e["event"] for e in result["events"] if not e.get("skipped")}
    assert {"kill", "proxy-restart", "proxy-kill", "broker-restart"} <= applied
    assert result["offset_polls"] > 30  # the broker was watched throughout
    for name, group in result["groups"].items():
        # each group consumed and committed, so the checks had something to judge
        assert group["produced"] > 1000 and group["commits_ok"] > 0, name
    assert result["caught_up"]
    assert result["violations"] == [], f"{result['violations']}; logs in {tmp_path}"
