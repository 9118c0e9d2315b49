"""Admin tools through groupgate see coordinated groups as they are.

Kafka's own consumer-groups command (3.9 and 4.4; both describe with ConsumerGroupDescribe,
which the proxy advertises) and kafka-python's admin client (DescribeGroups, as older tools
and lag exporters do), pointed at the proxy, against a group the proxy coordinates on a Kafka
3.9 broker:

* describing it shows its real members and their partitions;
* deleting it is refused while it has members and succeeds once they are gone, and the
  broker's offsets of the group are then gone too (what the tools expect of DeleteGroups).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import StartProxy
from tests.integration.test_offsets import (
    PROXY_FLAGS,
    committed_at_broker,
    consume_and_commit,
    produce,
)
from tests.testbed.broker import KafkaBroker
from tests.testbed.tools import consumer_groups, describe_group, parse_table


def describe_with_kafka_python(bootstrap: str, group: str) -> dict[str, Any]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result: dict[str, Any] = admin.describe_groups([group])[group]
        return result
    finally:
        admin.close()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_describe_and_delete_a_coordinated_group(
        kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy,
        protocol: str) -> None:
    name = topic(kafka39, partitions=4)
    proxy = start_proxy(kafka39, *PROXY_FLAGS)
    produce(kafka39.bootstrap, name, 40, 4)
    group = f"admin-{protocol}-{uuid.uuid4().hex[:8]}"
    consumer = consume_and_commit(proxy.bootstrap, group, name, 40, protocol)
    try:
        for line, assignment in (("3.9", "(0,1,2,3)"), ("4.4", f"{name}:0,1,2,3")):
            out = consumer_groups(line, proxy.bootstrap, "--describe", "--group", group,
                                  "--members", "--verbose").stdout
            rows = parse_table(out)
            assert len(rows) == 1, (line, out)
            assert rows[0]["#PARTITIONS"] == "4", (line, out)
            assert assignment in out, (line, out)
        described = describe_with_kafka_python(proxy.bootstrap, group)
        assert described["error"] is None and described["protocol_type"] == "consumer"
        assert described["group_state"] in ("Stable", "CompletingRebalance"), described
        (member,) = described["members"]
        assert member["member_metadata"]["topics"] == [name]
        assert [(t["topic"], sorted(t["partitions"]))
                for t in member["member_assignment"]["assigned_partitions"]] == [
            (name, [0, 1, 2, 3])]
        offsets = describe_group("3.9", proxy.bootstrap, group)
        assert sorted((r["PARTITION"], r["CURRENT-OFFSET"]) for r in offsets) == [
            (str(p), "10") for p in range(4)]
        refused = consumer_groups("3.9", proxy.bootstrap, "--delete", "--group", group,
                                  check=False)
        assert "not empty" in (refused.stdout + refused.stderr).lower(), refused
        assert committed_at_broker(kafka39.bootstrap, group)
    finally:
        consumer.close()
    deadline = time.monotonic() + 30
    while True:
        done = consumer_groups("3.9", proxy.bootstrap, "--delete", "--group", group,
                               check=False)
        if "successful" in done.stdout.lower() or time.monotonic() > deadline:
            break
        time.sleep(1)  # the leaving member's heartbeat may still be on its way
    assert "successful" in done.stdout.lower(), done
    assert not committed_at_broker(kafka39.bootstrap, group)
