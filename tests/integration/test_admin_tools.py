"""Admin tools through groupgate see coordinated groups as they are.

Kafka's own consumer-groups command (3.9, which describes groups with DescribeGroups, and
4.4, which uses ConsumerGroupDescribe) and the confluent-kafka admin client, pointed at the
proxy, against a group the proxy coordinates on a Kafka 3.9 broker:

* describing it shows its real members and their partitions;
* deleting it is refused while it has members and succeeds once they are gone, and the
  broker's offsets of the group are then gone too (what the tools expect of DeleteGroups).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from proxy.testbed.broker import KafkaBroker
from proxy.testbed.tools import consumer_groups, describe_group
from tests.integration.conftest import StartProxy
from tests.integration.test_offsets import (
    PROXY_FLAGS,
    committed_at_broker,
    consume_and_commit,
    produce,
)


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
        for line in ("3.9", "4.4"):
            rows = describe_group(line, proxy.bootstrap, group, "--members", "--verbose")
            assert len(rows) == 1, (line, rows)
            assert rows[0]["#PARTITIONS"] == "4", (line, rows)
            assert name in rows[0]["ASSIGNMENT"], (line, rows)
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
