"""The sidecar topology of the test bed: pods as network namespaces, each with its own
loopback where its sidecar listens on 127.0.0.1:9092, joined to the broker by a bridge.

Clients in a pod know only ``127.0.0.1:9092``; everything they learn of the cluster (broker
addresses in Metadata, the group coordinator) must point back at their own sidecar, and each
pod's sidecar must reach the broker over the bridge.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from proxy.process import ProxyProcess
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

pytestmark = pytest.mark.broker

CLIENT = r"""
import json, sys
from confluent_kafka import Consumer, Producer
topic, tag = sys.argv[1], sys.argv[2]
producer = Producer({"bootstrap.servers": "127.0.0.1:9092"})
for i in range(10):
    producer.produce(topic, key=tag.encode(), value=f"{tag}-{i}".encode())
assert producer.flush(20) == 0
consumer = Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": f"pods-{tag}",
                     "auto.offset.reset": "earliest"})
consumer.subscribe([topic])
seen, brokers = set(), set()
for _ in range(60):
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        seen.add(msg.value().decode())
    if len(seen) >= 20:
        break
for broker in consumer.list_topics(timeout=10).brokers.values():
    brokers.add(f"{broker.host}:{broker.port}")
consumer.close()
print(json.dumps({"seen": sorted(seen), "brokers": sorted(brokers)}))
"""


def test_each_pod_reaches_the_broker_through_its_own_sidecar(tmp_path: Path) -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network:
        a, b = network.pod("a"), network.pod("b")
        with KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker:
            topic = f"pods-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, 2)
            sidecars = [ProxyProcess.start(broker.bootstrap, tmp_path / f"{pod.name}.log",
                                           listen="127.0.0.1:9092", wrapper=pod.command([]))
                        for pod in (a, b)]
            try:
                results = {}
                for pod in (a, b):
                    done = pod.run([sys.executable, "-c", CLIENT, topic, pod.name],
                                   capture_output=True, text=True, timeout=90)
                    assert done.returncode == 0, done.stderr[-2000:]
                    results[pod.name] = json.loads(done.stdout.strip().splitlines()[-1])
            finally:
                for sidecar in sidecars:
                    sidecar.stop()
    # Both pods' records are in the topic; every pod saw all twenty (its own group reads
    # from the beginning), and the only broker it was told of is its own sidecar's listener.
    assert len(results["b"]["seen"]) == 20, results
    assert {f"a-{i}" for i in range(10)} <= set(results["a"]["seen"]), results
    for name, result in results.items():
        assert result["brokers"], result
        assert all(host.startswith("127.0.0.1:") for host in result["brokers"]), (name, result)
    assert network.host_ip not in json.dumps(results)
