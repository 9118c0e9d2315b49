"""groupgate on a SASL_SSL cluster: real clients with their own SCRAM credentials, the proxy with
its own, the standard authorizer and ACLs on a test-bed Kafka 3.9 (and 4.4 as the reference).

What is shown: confluent-kafka (both group protocols), kafka-python and a Java consumer consume
through the proxy, in groups the proxy coordinates, over TLS to the proxy (terminated there)
and from it to the broker, while the broker makes every connection authenticate again every
10 s (KIP-368); readiness passes; a wrong password gets the broker's authentication error
through the proxy; a client that does not authenticate is refused every API, those the proxy
answers itself included; sidecars relay to each other only as the proxies' own user; the
state log and the journal are written, and a group's state loaded by the next proxy, as the
proxy's own user over TLS with only the ACLs docs/security.md lists.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker, free_ports
from tests.testbed.security import PROXY_USER, REAUTH_MS, BrokerSecurity
from tests.testbed.tools import VerifiableConsumer

RECORDS = 2000
PARTITIONS = 4


def security_of(broker: KafkaBroker) -> BrokerSecurity:
    assert broker.security is not None
    return broker.security


def start_secured_proxy(start_proxy: StartProxy, broker: KafkaBroker, *flags: str
                        ) -> ProxyProcess:
    """A proxy in front of the broker's SASL_SSL listener with the proxies' own identity."""
    security = security_of(broker)
    return start_proxy(_Secure(broker), *security.proxy_flags(PROXY_USER), *flags)


class _Secure:
    """The broker as ``start_proxy`` sees it: its SASL_SSL listener is the bootstrap."""

    def __init__(self, broker: KafkaBroker) -> None:
        self.bootstrap = broker.secure_bootstrap


def produce(broker: KafkaBroker, topic: str, count: int = RECORDS) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.secure_bootstrap, "linger.ms": 5,
                         **security_of(broker).librdkafka("alice")})
    for i in range(count):
        producer.produce(topic, b"%d" % i)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def consume_confluent(config: dict[str, Any], topic: str, until: float
                      ) -> tuple[set[int], list[str]]:
    """Values consumed and errors seen, polling until all are in and ``until`` has passed
    (so that the client's session outlives the broker's re-authentication interval)."""
    from confluent_kafka import Consumer

    errors: list[str] = []
    consumer = Consumer(dict(config, **{"auto.offset.reset": "earliest",
                                        "enable.auto.commit": False,
                                        "error_cb": lambda e: errors.append(str(e))}))
    consumer.subscribe([topic])
    seen: set[int] = set()
    deadline = time.monotonic() + 90
    while (len(seen) < RECORDS or time.monotonic() < until) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen.add(int(msg.value()))
            if len(seen) == RECORDS:
                consumer.commit(asynchronous=False)  # through the proxy, validated by it
    consumer.close()
    return seen, errors


def consume_kafka_python(bootstrap: str, security: BrokerSecurity, topic: str, group: str,
                         until: float) -> set[int]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
        enable_auto_commit=False, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice", sasl_plain_password=security.users["alice"],
        ssl_cafile=str(security.ca_file), ssl_check_hostname=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 90
    while (len(seen) < RECORDS or time.monotonic() < until) and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            seen.update(int(r.value) for r in records)
    consumer.commit()
    consumer.close()
    return seen


def broker_group_protocol(broker: KafkaBroker, group: str) -> str:
    """The protocol of the broker's own group ``group`` (``groupgate-coordinated`` while the
    proxy coordinates it), read on the test bed's administration listener."""
    admin = broker.admin()
    description = admin.describe_consumer_groups([group])[group].result(timeout=15)
    members = description.members
    return ",".join(sorted({m.client_id for m in members})) + ":" + description.partition_assignor


def readyz(proxy_metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy_metrics_port}/readyz",
                                timeout=5) as response:
        return int(response.status)


def test_clients_consume_through_the_proxy_on_sasl_ssl(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    broker = secured_kafka39
    security = security_of(broker)
    name = topic(broker, partitions=PARTITIONS)
    produce(broker, name)
    listener_cert, listener_key = security.certificates.issue("proxy-listener", "127.0.0.1")
    metrics_port = free_ports(1)[0]
    proxy = start_secured_proxy(start_proxy, broker,
                                "--listener-tls-cert-file", str(listener_cert),
                                "--listener-tls-key-file", str(listener_key),
                                "--metrics-listen", f"127.0.0.1:{metrics_port}")
    assert readyz(metrics_port) == 200

    until = time.monotonic() + REAUTH_MS / 1000 * 1.5  # every session authenticates again
    groups = {kind: f"sec-{kind}-{uuid.uuid4().hex[:6]}"
              for kind in ("classic", "consumer", "kafka-python", "java")}
    results: dict[str, set[int]] = {}
    errors: dict[str, list[str]] = {}

    def confluent(kind: str) -> None:
        config = {"bootstrap.servers": proxy.bootstrap, "group.id": groups[kind],
                  "group.protocol": kind, **security.librdkafka("alice")}
        results[kind], errors[kind] = consume_confluent(config, name, until)

    def kafka_python() -> None:
        results["kafka-python"] = consume_kafka_python(
            proxy.bootstrap, security, name, groups["kafka-python"], until)

    java = VerifiableConsumer("3.9", proxy.bootstrap, name, groups["java"],
                              group_protocol="classic", config=security.java("alice"))
    threads = [threading.Thread(target=confluent, args=("classic",)),
               threading.Thread(target=confluent, args=("consumer",)),
               threading.Thread(target=kafka_python)]
    with java:
        for thread in threads:
            thread.start()
        java.wait_records(RECORDS, timeout=90)
        java_offsets = java.consumed_offsets()
        for thread in threads:
            thread.join(120)
        # the proxy coordinates every group: the broker sees only its member
        for kind, group in groups.items():
            assert broker_group_protocol(broker, group).startswith("groupgate:"), kind
    assert {o for _, _, o in java_offsets} >= set(range(RECORDS // PARTITIONS))
    for kind in ("classic", "consumer", "kafka-python"):
        assert results.get(kind) == set(range(RECORDS)), kind
    for kind in ("classic", "consumer"):
        assert not [e for e in errors[kind] if "AUTHENTICATION" in e], errors[kind]
    assert readyz(metrics_port) == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as page:
        lines = page.read().decode().splitlines()
    reauthenticated = [line for line in lines if line.startswith(
        "groupgate_client_authentications_total") and 'outcome="reauthenticated"' in line]
    assert reauthenticated and any(not line.endswith(" 0.0") for line in reauthenticated), lines
    log = proxy.log()
    assert "TLS from the client" not in log and "Traceback" not in log


def test_a_wrong_password_gets_the_broker_s_error_through_the_proxy(
        secured_kafka39: KafkaBroker, start_proxy: StartProxy) -> None:
    from confluent_kafka import Producer

    broker = secured_kafka39
    proxy = start_secured_proxy(start_proxy, broker)
    errors: list[Any] = []
    config = security_of(broker).librdkafka("alice", password="not-alice-s-password")
    config["security.protocol"] = "SASL_PLAINTEXT"  # the pod's loopback: no TLS to the proxy
    del config["ssl.ca.location"]
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": errors.append,
                         **config})
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported"
    text = str(errors[0])
    assert "_AUTHENTICATION" in text and "invalid credentials" in text, text
    assert "the broker refused the client's authentication" in proxy.log()


def raw_request(key: int, version: int, value: dict[str, Any]) -> bytes:
    payload = encode_request_header(key, version, 1, "no-auth") + messages.encode_request(
        key, version, value)
    return struct.pack(">i", len(payload)) + payload


SKIPPING = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, {"group_id": "g", "member_id": "m", "member_epoch": 0,
                                          "rebalance_timeout_ms": 30000,
                                          "subscribed_topic_names": ["t"],
                                          "topic_partitions": []}),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, {"group_ids": ["g"],
                                         "include_authorized_operations": False}),
    ApiKey.METADATA: (4, {"topics": [], "allow_auto_topic_creation": False}),
    ApiKey.FIND_COORDINATOR: (2, {"key": "g", "key_type": 0}),
    ApiKey.JOIN_GROUP: (5, {"group_id": "g", "session_timeout_ms": 10000,
                            "rebalance_timeout_ms": 10000, "member_id": "",
                            "group_instance_id": None, "protocol_type": "consumer",
                            "protocols": []}),
    ApiKey.LIST_GROUPS: (3, {}),
}


def test_skipping_authentication_is_refused_for_every_api(
        secured_kafka39: KafkaBroker, start_proxy: StartProxy) -> None:
    proxy = start_secured_proxy(start_proxy, secured_kafka39)
    for key, (version, value) in SKIPPING.items():
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
            sock.sendall(raw_request(key, version, value))
            assert sock.recv(65536) == b"", f"{key.name} was answered"
    log = proxy.log()
    for key in SKIPPING:
        assert f"{key.name} before the client authenticated" in log, key.name
    # ApiVersions is answered, as by the broker's SASL listener
    with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
        sock.sendall(raw_request(ApiKey.API_VERSIONS, 0, {}))
        assert len(sock.recv(65536)) > 8


def test_sidecars_relay_to_each_other_only_as_the_proxies_own_user(
        secured_kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy
) -> None:
    from confluent_kafka import Consumer

    broker = secured_kafka39
    security = security_of(broker)
    name = topic(broker, partitions=PARTITIONS)
    produce(broker, name, 200)
    fleet_a, fleet_b, metrics_b = free_ports(3)
    coordinator = start_secured_proxy(start_proxy, broker,
                                      "--fleet-listen", f"127.0.0.1:{fleet_a}")
    follower = start_secured_proxy(start_proxy, broker, "--fleet-listen",
                                   f"127.0.0.1:{fleet_b}", "--metrics-listen",
                                   f"127.0.0.1:{metrics_b}")
    group = f"sec-fleet-{uuid.uuid4().hex[:6]}"
    plain = dict(security.librdkafka("alice"), **{"security.protocol": "SASL_PLAINTEXT"})
    del plain["ssl.ca.location"]
    consumers = []
    for proxy in (coordinator, follower):
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                             "group.protocol": "consumer", "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, **plain})
        consumer.subscribe([name])
        consumers.append(consumer)
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            for polled in consumers:  # the ones before it give partitions up as they poll
                polled.poll(0.1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(c.assignment() for c in consumers):
        for consumer in consumers:
            consumer.poll(0.1)
    assignments = [len(c.assignment()) for c in consumers]
    for consumer in consumers:
        consumer.close()
    assert sum(assignments) == PARTITIONS and all(assignments), assignments
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_b}/metrics", timeout=5) as page:
        relayed = [line for line in page.read().decode().splitlines()
                   if line.startswith("groupgate_fleet_relayed_requests_total")]
    assert any(not line.endswith(" 0.0") for line in relayed), relayed

    # an application, or anyone, on the fleet listener: refused unless it is a sidecar
    with socket.create_connection(("127.0.0.1", fleet_a), timeout=10) as sock:
        sock.sendall(raw_request(*_join(group)))
        assert sock.recv(65536) == b""
    assert "before the client authenticated" in coordinator.log()


def test_the_state_log_and_the_journal_work_as_the_proxy_s_own_user(
        secured_kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy
) -> None:
    """One proxy writes a group's state and its journal events over TLS as the proxies' user;
    after it stops, the next proxy to coordinate the group loads that state the same way."""
    from confluent_kafka import Consumer, TopicPartition

    broker = secured_kafka39
    security = security_of(broker)
    name = topic(broker, partitions=PARTITIONS)
    produce(broker, name, 200)
    journal = f"_groupgate-journal-{uuid.uuid4().hex[:6]}"
    group = f"sec-state-{uuid.uuid4().hex[:6]}"
    plain = dict(security.librdkafka("alice"), **{"security.protocol": "SASL_PLAINTEXT"})
    del plain["ssl.ca.location"]

    def member(proxy: ProxyProcess) -> Any:
        # no commits: closed once its proxy has stopped, the first one may retry its last
        # auto-commit against nobody for 45 s (the state log, not offsets, is under test)
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                             "group.protocol": "consumer", "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, **plain})
        consumer.subscribe([name])
        return consumer

    first = start_secured_proxy(start_proxy, broker, "--journal-topic", journal,
                                "--journal-partitions", "1")
    consumer = member(first)
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < PARTITIONS and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert len(consumer.assignment()) == PARTITIONS
    first.stop()  # writes what is pending and leaves the broker's group for the next one
    consumer.close()

    second = start_secured_proxy(start_proxy, broker)
    consumer = member(second)
    deadline = time.monotonic() + 30
    while "loaded" not in second.log() and time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.close()
    assert f"group {group}: loaded" in second.log(), second.log()
    for proxy in (first, second):
        log = proxy.log()
        assert "state log cannot be used" not in log and "Traceback" not in log, log
    watermarks = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:  # the test bed's administration listener
        _, written = watermarks.get_watermark_offsets(TopicPartition(journal, 0), timeout=15)
    finally:
        watermarks.close()
    assert written > 0


def _join(group: str) -> tuple[int, int, dict[str, Any]]:
    version, value = SKIPPING[ApiKey.JOIN_GROUP]
    return ApiKey.JOIN_GROUP, version, dict(value, group_id=group)


@pytest.mark.parametrize("protocol", ["consumer"])
def test_reference_kafka_4_4_serves_the_same_clients_on_sasl_ssl(
        secured_kafka4: KafkaBroker, topic: Callable[..., str], protocol: str) -> None:
    """The reference: the same client settings straight at Kafka 4.4's own KIP-848 coordinator
    on its SASL_SSL listener."""
    broker = secured_kafka4
    name = topic(broker, partitions=PARTITIONS)
    produce(broker, name)
    config = {"bootstrap.servers": broker.secure_bootstrap, "group.protocol": protocol,
              "group.id": f"sec-ref-{uuid.uuid4().hex[:6]}",
              **security_of(broker).librdkafka("alice")}
    seen, _ = consume_confluent(config, name, time.monotonic())
    assert seen == set(range(RECORDS))
