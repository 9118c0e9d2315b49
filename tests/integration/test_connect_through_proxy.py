"""Kafka Connect workers form their group through groupgate and fail over, in front of Kafka 3.9.

Two real Connect 3.9 workers in distributed mode (``ConnectDistributed``) use the proxy as their
only bootstrap server, with ``classic-translation`` on as in ``test_classic_translation.py``.
Their JoinGroup carries protocol type ``connect``, which the proxy passes to the broker
untouched. The test shows, end to end:

* the workers' Kafka connections all go to proxy listeners, never to the broker (seen from
  the kernel's socket tables, see ``observe.py``);
* both workers join one group that is the broker's (DescribeGroups straight to the broker's
  coordinator: protocol type ``connect``, both workers' REST URLs in the member metadata) and
  not the proxy engine's (ConsumerGroupDescribe through the proxy: GROUP_ID_NOT_FOUND);
* a FileStreamSource connector created over REST delivers every line of its file to a topic,
  read back through the proxy;
* when the worker running the task stops, the group rebalances at the broker, the other worker
  runs the connector and its task, resumes from the source offsets the stopped worker committed
  (no line twice) and delivers the lines appended meanwhile.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy, keep_if_failed
from tests.integration.observe import PortWatcher
from tests.integration.test_new_protocol import PROXY_FLAGS, coordinator_of, wait_until
from tests.testbed.broker import KafkaBroker
from tests.testbed.tools import ConnectWorker

FLAGS = (*PROXY_FLAGS, "--classic-translation", "on")
FIRST_LINES = 300
MORE_LINES = 100
WORKER_CONFIG = {
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "1000",
    "scheduled.rebalance.max.delay.ms": "0",  # reassign a departed worker's work at once
}
FILE_SOURCE = "org.apache.kafka.connect.file.FileStreamSourceConnector"
GROUP_ID_NOT_FOUND = 69


@pytest.fixture
def proxy(kafka39: KafkaBroker, start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(kafka39, *FLAGS)


@pytest.fixture
def workers(request: pytest.FixtureRequest) -> Iterator[list[ConnectWorker]]:
    """Connect workers the test starts; stopped afterwards, their logs kept if it failed."""
    started: list[ConnectWorker] = []
    yield started
    for worker in started:
        worker.stop(timeout=30)
    keep_if_failed(request, [path for worker in started for path in
                             (worker.log_file, worker.stderr_file, worker.properties_file)])


class TopicReader:
    """Reads every value of partition 0 of a topic from the beginning, through the proxy."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        # assign(), not subscribe(): no group of its own, only Fetch through the proxy
        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "log_level": 3})
        self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.values: list[str] = []

    def read_until(self, expected: set[str], what: str, timeout: float = 60.0) -> None:
        def arrived() -> bool:
            for message in self.consumer.consume(500, timeout=0.5):
                if message.error():
                    raise AssertionError(f"consuming: {message.error()}")
                value = message.value()
                assert value is not None
                self.values.append(value.decode())
            return expected <= set(self.values)

        wait_until(arrived, what, timeout)

    def close(self) -> None:
        self.consumer.close()


def broker_group(bootstrap: str, group: str) -> dict[str, Any]:
    """DescribeGroups (v5) sent straight to the broker's coordinator of ``group``."""
    conn = coordinator_of(bootstrap, group)
    try:
        described = conn.request(15, 5, {"groups": [group],
                                         "include_authorized_operations": False})
    finally:
        conn.close()
    entry: dict[str, Any] = described["groups"][0]
    return entry


def worker_url(metadata: bytes) -> str:
    """The worker URL in Connect's member metadata (int16 version, then the URL string, in
    every version of the eager and the incremental cooperative protocol)."""
    (length,) = struct.unpack_from(">h", metadata, 2)
    return metadata[4:4 + length].decode().rstrip("/")


def member_urls(group: dict[str, Any]) -> set[str]:
    return {worker_url(m["member_metadata"]) for m in group["members"]}


def stable_members(bootstrap: str, group: str) -> set[str] | None:
    """The URLs of the workers in the broker's group once it is Stable, else None."""
    described = broker_group(bootstrap, group)
    if described["error_code"] != 0 or described["group_state"] != "Stable":
        return None
    return member_urls(described)


def running_on(worker: ConnectWorker, name: str) -> tuple[str, list[str]] | None:
    """(connector's worker, [each task's worker]) once the connector and all its tasks run."""
    status = worker.connector_status(name)
    if status is None or status["connector"]["state"] != "RUNNING" or not status["tasks"]:
        return None
    if any(task["state"] != "RUNNING" for task in status["tasks"]):
        return None
    return status["connector"]["worker_id"], [task["worker_id"] for task in status["tasks"]]


def test_connect_workers_share_a_broker_group_through_the_proxy_and_fail_over(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        workers: list[ConnectWorker], tmp_path: Path) -> None:
    group = f"connect-{uuid.uuid4().hex[:8]}"
    name = topic(kafka39, partitions=1)
    source = tmp_path / "source.txt"
    source.write_text("".join(f"first-{i:05d}\n" for i in range(FIRST_LINES)))

    watching = contextlib.ExitStack()
    watchers: list[PortWatcher] = []
    with watching:
        for label in ("a", "b"):
            worker = ConnectWorker(proxy.bootstrap, group, config=WORKER_CONFIG,
                                   workdir=tmp_path / f"worker-{label}")
            workers.append(worker)
            worker.start()
            assert worker.proc is not None
            watchers.append(watching.enter_context(PortWatcher(worker.proc.pid)))
        connect_and_fail_over(kafka39, proxy, workers, group, name, source)
    broker_ports = {p for n in kafka39.nodes.values() for p in (n.port, n.controller_port)}
    for worker, watcher in zip(workers, watchers, strict=True):
        # (the REST connections in and out have other ports on either side)
        assert not watcher.seen & broker_ports, f"{worker.name} reached the broker directly"
        assert watcher.seen & proxy.listener_ports(), f"{worker.name} never reached the proxy"


def connect_and_fail_over(kafka39: KafkaBroker, proxy: ProxyProcess,
                          workers: list[ConnectWorker], group: str, name: str,
                          source: Path) -> None:
    first = [f"first-{i:05d}" for i in range(FIRST_LINES)]
    for worker in workers:
        worker.wait_ready(timeout=120)
    assert workers[0].connectors() == []

    # Both workers are members of the broker's classic group, of protocol type "connect".
    urls = {w.url for w in workers}
    wait_until(lambda: stable_members(kafka39.bootstrap, group) == urls,
               "both workers in the broker's stable group")
    described = broker_group(kafka39.bootstrap, group)
    assert described["protocol_type"] == "connect", described
    assert described["protocol_data"] == "sessioned", described  # Connect 3.9's default
    # ... and the proxy's engine holds no group of that id.
    conn = coordinator_of(proxy.bootstrap, group)
    try:
        engine = conn.request(69, 0, {"group_ids": [group],
                                      "include_authorized_operations": False})
    finally:
        conn.close()
    assert engine["groups"][0]["error_code"] == GROUP_ID_NOT_FOUND, engine

    # A FileStreamSource connector, created on worker A, delivers the file to the topic.
    connector = f"file-source-{uuid.uuid4().hex[:6]}"
    created = workers[0].create_connector(connector, {
        "connector.class": FILE_SOURCE, "file": str(source), "topic": name,
        "tasks.max": "2"})  # the file source runs one task whatever tasks.max says
    assert created["name"] == connector
    placed: list[tuple[str, list[str]] | None] = [None]

    def running() -> bool:
        placed[0] = running_on(workers[0], connector)
        return placed[0] is not None

    wait_until(running, "the connector and its task to run")
    assert placed[0] is not None
    _, task_workers = placed[0]
    assert len(task_workers) == 1, placed[0]
    assert set(workers[1].connectors()) == {connector}  # both read the shared config topic
    reader = TopicReader(proxy.bootstrap, name)
    try:
        reader.read_until(set(first), f"the {FIRST_LINES} lines of the file")

        # Stop the worker that runs the task; the other takes connector and task over.
        victim = next(w for w in workers if w.worker_id == task_workers[0])
        survivor = next(w for w in workers if w is not victim)
        victim.stop(timeout=30)
        assert not victim.running
        more = [f"more-{i:05d}" for i in range(MORE_LINES)]
        with source.open("a") as fh:
            fh.write("".join(f"{line}\n" for line in more))

        wait_until(lambda: running_on(survivor, connector)
                   == (survivor.worker_id, [survivor.worker_id]),
                   "the surviving worker to run the connector and its task")
        wait_until(lambda: stable_members(kafka39.bootstrap, group) == {survivor.url},
                   "the broker's group to be stable with the surviving worker alone")
        reader.read_until(set(first) | set(more), f"the {MORE_LINES} appended lines")
        assert set(reader.values) == set(first) | set(more)
        duplicates = len(reader.values) - len(set(reader.values))
        assert duplicates == 0, f"{duplicates} lines delivered twice: source offsets not resumed"
    finally:
        reader.close()
    described = broker_group(kafka39.bootstrap, group)
    assert described["protocol_type"] == "connect", described
    assert member_urls(described) == {survivor.url}
