"""Two sidecars with default settings (only the upstream and the listener given), each in a pod
of its own in front of one broker, and one KIP-848 member of one group behind each: both members
are served (each gets half the partitions and reads from them), through one coordinating
sidecar. Before the fleet listener was on by default, the second sidecar's member got
COORDINATOR_NOT_AVAILABLE forever: the holder's card had no fleet address to relay to."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from proxy.process import ProxyProcess
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

pytestmark = pytest.mark.broker

PARTITIONS = 4
# No commits: whoever owns a partition reads it from the start.
MEMBER = r"""
import json, sys, threading
from confluent_kafka import Consumer
topic, group, name, share = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
consumer = Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": group,
                     "group.protocol": "consumer", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "client.id": name})
consumer.subscribe([topic])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
read, reported = set(), False
while not stop.is_set():
    msg = consumer.poll(0.2)
    if msg is not None and msg.error() is None:
        read.add(msg.partition())
    owned = {tp.partition for tp in consumer.assignment()}
    if not reported and len(owned) == share and owned <= read:
        print(json.dumps({"member": name, "owned": sorted(owned)}), flush=True)
        reported = True
consumer.close()
"""


def test_two_sidecars_on_default_settings_serve_one_group_s_members_behind_both(
        tmp_path: Path) -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network:
        a, b = network.pod("a"), network.pod("b")
        with KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker:
            topic = group = f"defaults-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, PARTITIONS)
            from confluent_kafka import Producer

            producer = Producer({"bootstrap.servers": broker.bootstrap})
            for i in range(200):
                producer.produce(topic, value=str(i).encode(), partition=i % PARTITIONS)
            assert producer.flush(30) == 0
            sidecars = [ProxyProcess.start(broker.bootstrap, tmp_path / f"{pod.name}.log",
                                           listen="127.0.0.1:9092", wrapper=pod.command([]))
                        for pod in (a, b)]
            members: list[subprocess.Popen[str]] = []
            try:
                for pod in (a, b):
                    members.append(pod.popen(
                        [sys.executable, "-c", MEMBER, topic, group, pod.name,
                         str(PARTITIONS // 2)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True, bufsize=1))
                reports = {}
                deadline = time.monotonic() + 90
                while len(reports) < 2 and time.monotonic() < deadline:
                    ready, _, _ = select.select([m.stdout for m in members], [], [], 1.0)
                    for stream in ready:
                        line = stream.readline()
                        if line:
                            report = json.loads(line)
                            reports[report["member"]] = report["owned"]
            finally:
                for member in members:
                    if member.poll() is None and member.stdin is not None:
                        member.stdin.write("stop\n")
                        member.stdin.flush()
                for member in members:
                    try:
                        member.wait(30)
                    except subprocess.TimeoutExpired:
                        member.kill()
                        member.wait()
                for sidecar in sidecars:
                    sidecar.stop()
    logs = {s.log_file.stem: s.log_file.read_text() for s in sidecars}
    assert set(reports) == {"a", "b"}, (reports, {k: v[-3000:] for k, v in logs.items()})
    assert sorted(reports["a"] + reports["b"]) == list(range(PARTITIONS))
    holders = [name for name, text in logs.items()
               if f"group {group}: holding the broker's group" in text]
    assert len(holders) == 1, holders  # one coordinated, the other relayed to it
    for text in logs.values():  # each sidecar's fleet listener on its pod's own address
        assert "fleet listener on 0.0.0.0:9191 (other sidecars reach it at 10.233." in text
