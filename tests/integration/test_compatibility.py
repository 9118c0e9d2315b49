"""groupgate in front of each Kafka 3.x line it supports (the README's compatibility table).

For each broker version, one group through one proxy: a KIP-848 member and a classic member
(confluent-kafka, ``group.protocol=consumer`` and ``classic``) sharing the group under
continuous production, the proxy restarted (SIGTERM, started again on its port) half-way,
every record consumed and committed, checked by the soak harness's invariants (no partition
owned twice, no committed offset moving backwards, nothing missing once caught up). Kafka 3.3
and 3.6 are assembled from Maven Central like 3.9 (:data:`tests.testbed.distributions.
COMPAT_LINES`), 2.8 in ZooKeeper mode: an expected failure, since the proxy's own requests
use Metadata v12, which 2.8 lacks (its newest is v11) and answers by closing the connection.

Slow (about a minute per version, the broker started for it): ``./dev/test --run-slow
tests/integration/test_compatibility.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.soak import run as soak

pytestmark = pytest.mark.broker

TOO_OLD = pytest.mark.xfail(
    strict=True, reason="the proxy's own requests use Metadata v12 (the state log, the topic "
    "watcher), which a 2.8 broker lacks: it closes the connection, no group is served")
VERSIONS = (pytest.param("2.8", marks=TOO_OLD, id="kafka2.8"),
            pytest.param("3.3", id="kafka3.3"), pytest.param("3.6", id="kafka3.6"),
            pytest.param("3.9", id="kafka3.9"))


@pytest.mark.slow
@pytest.mark.parametrize("kafka", VERSIONS)
def test_both_protocols_consume_commit_and_survive_a_proxy_restart(
        tmp_path: Path, kafka: str) -> None:
    settings = soak.Settings(
        kafka=kafka, duration_s=40.0, seed=31, partitions=4, groups=("eager",), events=(),
        initial=("eager:confluent/consumer/async", "eager:confluent/classic/async"),
        script=("18:proxy-restart",), catch_up_s=90.0)
    run = soak.Soak(settings, tmp_path)
    result = run.run()
    (tmp_path / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"Kafka {result.get('kafka_version', kafka)}\n{soak.summary(result)}")
    applied = [e["event"] for e in result["events"] if not e.get("skipped")]
    assert applied == ["proxy-restart"], result["events"]
    assert result["caught_up"], f"logs in {tmp_path}"
    assert result["violations"] == [], f"{result['violations']}; logs in {tmp_path}"
    group = result["groups"]["eager"]
    assert group["produced"] > 300 and group["commits_ok"] > 0, group
    assert len(group["members"]) == 2, group["members"]
    assert group["exited_on_their_own"] == [], group["exited_on_their_own"]
