"""The soak, short: every kind of event once, at scripted times, in under a minute, and every
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

SCRIPT = ("10:join", "15:kill", "20:proxy-restart", "25:stall", "30:proxy-kill", "35:leave",
          "40:broker-restart")
"""Each kind of event once (:data:`tests.benchmarks.soak.run.EVENT_KINDS`), five seconds
apart, each in a group the seed picks; the random schedule of the long soak (``dev/bench
soak``) spaces them 6-8 s and took 70 s for the same kinds."""


def test_short_soak_keeps_every_invariant(tmp_path: Path) -> None:
    settings = soak.Settings(duration_s=50.0, seed=7, script=SCRIPT, catch_up_s=150.0)
    result = soak.Soak(settings, tmp_path).run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(soak.summary(result))
    applied = {e["event"] for e in result["events"] if not e.get("skipped")}
    assert applied == {kind for kind in (e.split(":")[1] for e in SCRIPT)}, result["events"]
    assert result["offset_polls"] > 30  # the broker was watched throughout
    for name, group in result["groups"].items():
        # each group consumed and committed, so the checks had something to judge
        assert group["produced"] > 1000 and group["commits_ok"] > 0, name
    assert result["caught_up"]
    assert result["violations"] == [], f"{result['violations']}; logs in {tmp_path}"
