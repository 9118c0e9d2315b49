"""``groupgate bench passthrough``: what the proxy costs on the forwarding path.

One run starts groupgate in front of the cluster at ``--bootstrap`` (a separate process, as in
production) and creates a topic there, then measures, alternating direct and proxied rounds so
drift hits both alike:

* produce throughput (MB/s of 1 KiB record values, confluent-kafka, acks=1, linger 5 ms);
* consume throughput (MB/s, a consumer assigned every partition from the beginning);
* produce latency at a moderate, fixed rate (linger 0, acks=1; time from ``produce()`` to the
  delivery report), p50 and p99;
* request round-trip latency: sequential Metadata requests on one connection, p50 and p99;
* the proxy process's CPU time (user + system) per MB forwarded, which depends much less on
  what else the machine is doing than the throughput figures do.

On a secured cluster (``--security-protocol SSL`` or ``SASL_SSL``, ``--tls-ca-file``, and for
SASL ``--sasl-mechanism``/``--sasl-username``/``--sasl-password``) the direct clients use TLS
(and SASL) to the brokers, the proxied clients the same credentials in plaintext to the proxy
(the pod's loopback), and the proxy TLS (and the same identity) to the brokers, as a sidecar
would be deployed; large frames cannot be spliced then, since the broker's bytes are encrypted.

It prints a table and writes JSON with every round, the medians, the proxied/direct ratios,
the machine and the versions. It is a command, not a test: nothing here asserts a timing. It
needs confluent-kafka (``pip install 'groupgate[bench]'``). ``dev/bench passthrough`` runs it
against a broker of the test bed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import struct
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.commands.machine import describe_machine, machine_info, median, percentile

VALUE = b"v" * 1024


def configure(parser: argparse.ArgumentParser, *, bootstrap_required: bool = True) -> None:
    parser.add_argument("--json", metavar="FILE", type=Path, help="write the results here")
    parser.add_argument("--bootstrap", metavar="HOST:PORT", required=bootstrap_required,
                        help="the Kafka cluster to measure (a topic is created and deleted)")
    parser.add_argument("--replication-factor", type=int, default=-1,
                        help="of the benchmark's topic (default: the cluster's)")
    parser.add_argument("--records", type=int, default=200_000,
                        help="records per throughput round (1 KiB each)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per target")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--latency-rate", type=int, default=1000,
                        help="records per second in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--rtt-requests", type=int, default=2000)
    parser.add_argument("--proxy-arg", action="append", default=[], metavar="FLAG",
                        help="extra `groupgate run` flag for the proxied side (repeatable), "
                             "e.g. --proxy-arg=--fetch-node-endpoints=on")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check it works")
    parser.add_argument("--kafka-version", default=None, help="recorded in the JSON as is")
    parser.add_argument("--security-protocol", default="PLAINTEXT",
                        choices=["PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT"],
                        help="how the cluster is reached (the proxy is reached in plaintext)")
    parser.add_argument("--tls-ca-file", default="", help="CA bundle of the brokers")
    parser.add_argument("--sasl-mechanism", default="SCRAM-SHA-256")
    parser.add_argument("--sasl-username", default="")
    parser.add_argument("--sasl-password", default="", help="also GROUPGATE_SASL_PASSWORD")


@dataclass(frozen=True)
class ClientSecurity:
    """The benchmark clients' (and the proxy's) security settings."""

    protocol: str = "PLAINTEXT"
    ca_file: str = ""
    mechanism: str = ""
    username: str = ""
    password: str = ""

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def librdkafka(self, direct: bool) -> dict[str, Any]:
        """Client settings for the brokers (``direct``) or for the proxy (plaintext)."""
        out: dict[str, Any] = {}
        protocol = self.protocol if direct else ("SASL_PLAINTEXT" if self.sasl else "PLAINTEXT")
        out["security.protocol"] = protocol
        if direct and self.tls and self.ca_file:
            out["ssl.ca.location"] = self.ca_file
        if self.sasl:
            out.update({"sasl.mechanism": self.mechanism, "sasl.username": self.username,
                        "sasl.password": self.password})
        return out

    def proxy_flags(self) -> list[str]:
        flags = ["--security-protocol", self.protocol]
        if self.tls and self.ca_file:
            flags += ["--tls-ca-file", self.ca_file]
        if self.sasl:
            flags += ["--sasl-mechanism", self.mechanism, "--sasl-username", self.username]
        return flags

    def proxy_env(self) -> dict[str, str]:
        return {"GROUPGATE_SASL_PASSWORD": self.password} if self.sasl else {}


SECURITY = ClientSecurity()
"""Set by :func:`run` from the command line."""


def _client_config(bootstrap: str, direct: bool = True) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "log_level": 3, **SECURITY.librdkafka(direct)}


def produce_throughput(bootstrap: str, topic: str, records: int, direct: bool = True
                       ) -> dict[str, float]:
    from confluent_kafka import Producer

    producer = Producer(dict(_client_config(bootstrap, direct), **{
        "acks": 1, "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
        "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000}))
    failed = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal failed
        if err is not None:
            failed += 1

    started = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, VALUE, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    if remaining or failed:
        raise RuntimeError(f"produce round lost records: {remaining} unflushed, {failed} failed")
    return {"seconds": elapsed, "mb_per_s": records * len(VALUE) / elapsed / 1e6}


def consume_throughput(bootstrap: str, topic: str, partitions: int, records: int,
                       direct: bool = True) -> dict[str, float]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(dict(_client_config(bootstrap, direct), **{
        "group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    count = 0
    size = 0
    opened = time.perf_counter()
    first = 0.0
    deadline = opened + 300
    while count < records and time.perf_counter() < deadline:
        for msg in consumer.consume(num_messages=10_000, timeout=1.0):
            if msg.error() is None:
                if not count:
                    first = time.perf_counter()
                count += 1
                size += len(msg.value() or b"")
    elapsed = time.perf_counter() - first
    consumer.close()
    if count < records:
        raise RuntimeError(f"consume round got {count} of {records} records")
    # Throughput from the first record on; the time to the first record (connections,
    # metadata, first fetch) is reported on its own.
    return {"seconds": elapsed, "mb_per_s": size / elapsed / 1e6,
            "first_record_s": first - opened}


def produce_latency(bootstrap: str, topic: str, rate: int, seconds: float, direct: bool = True
                    ) -> dict[str, float]:
    from confluent_kafka import Producer

    producer = Producer(dict(_client_config(bootstrap, direct), **{"acks": 1, "linger.ms": 0}))
    samples: list[float] = []

    def report(sent: float) -> Any:
        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                samples.append(time.perf_counter() - sent)
        return on_delivery

    # Warm up connections and metadata before measuring.
    producer.produce(topic, VALUE)
    producer.flush(30)
    interval = 1.0 / rate
    total = int(rate * seconds)
    next_send = time.perf_counter()
    for _ in range(total):
        now = time.perf_counter()
        if next_send > now:
            producer.poll(next_send - now)
        producer.produce(topic, VALUE, on_delivery=report(time.perf_counter()))
        producer.poll(0)
        next_send += interval
    producer.flush(30)
    ms = [s * 1000 for s in samples]
    return {"samples": len(ms), "p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99)}


def request_rtt(bootstrap: str, requests: int, direct: bool = True) -> dict[str, float]:
    """Sequential Metadata v1 (no topics) round trips on one connection (over TLS and after
    SASL when the target wants them)."""
    host, port = bootstrap.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock: socket.socket = raw
    if direct and SECURITY.tls:
        context = ssl.create_default_context(cafile=SECURITY.ca_file or None)
        sock = context.wrap_socket(raw, server_hostname=host)
    if SECURITY.sasl:
        _authenticate(sock)
    client_id = b"bench"
    samples: list[float] = []
    for correlation_id in range(requests + 50):
        payload = (struct.pack(">hhih", 3, 1, correlation_id, len(client_id)) + client_id
                   + struct.pack(">i", 0))
        started = time.perf_counter()
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        _recv_exact(sock, size)
        if correlation_id >= 50:  # the first ones warm up
            samples.append((time.perf_counter() - started) * 1000)
    sock.close()
    return {"samples": len(samples), "p50_ms": percentile(samples, 0.5),
            "p99_ms": percentile(samples, 0.99)}


def _authenticate(sock: socket.socket) -> None:
    """SaslHandshake v1 and SaslAuthenticate v1 on a blocking socket (the round-trip phase)."""
    from proxy.codec import messages
    from proxy.codec.header import encode_request_header
    from proxy.security.identity import Identity
    from proxy.security.sasl_client import authenticate

    correlation = [10_000_000]

    async def exchange(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        correlation[0] += 1
        payload = (encode_request_header(key, version, correlation[0], "bench")
                   + messages.encode_request(key, version, value))
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        answer, _ = messages.decode_response(key, version, _recv_exact(sock, size), 4)
        return answer

    import trio

    identity = Identity(SECURITY.mechanism, SECURITY.username, SECURITY.password)
    trio.run(authenticate, exchange, identity)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _summary(rounds: dict[str, list[dict[str, float]]], key: str) -> dict[str, Any]:
    direct = median([r[key] for r in rounds["direct"]])
    proxied = median([r[key] for r in rounds["proxied"]])
    return {"direct_median": direct, "proxied_median": proxied,
            "ratio": proxied / direct if direct else float("nan"),
            "direct_all": [r[key] for r in rounds["direct"]],
            "proxied_all": [r[key] for r in rounds["proxied"]]}


def run(args: argparse.Namespace) -> int:
    from proxy.process import ProxyProcess

    try:
        from confluent_kafka import admin as kafka_admin
        from confluent_kafka.cimpl import NewTopic
    except ImportError:
        print("groupgate bench passthrough needs confluent-kafka: "
              "pip install 'groupgate[bench]'")
        return 2
    if args.quick:
        args.records, args.rounds, args.latency_seconds, args.rtt_requests = 5000, 1, 1.0, 200
    global SECURITY
    SECURITY = ClientSecurity(args.security_protocol, args.tls_ca_file, args.sasl_mechanism,
                              args.sasl_username,
                              args.sasl_password or os.environ.get("GROUPGATE_SASL_PASSWORD", ""))
    workdir = Path(tempfile.mkdtemp(prefix="groupgate-bench-"))
    info = machine_info()
    print(f"machine: {describe_machine(info)}")
    admin = kafka_admin.AdminClient(_client_config(args.bootstrap))
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    new_topic = NewTopic(topic, args.partitions, args.replication_factor)
    admin.create_topics([new_topic])[topic].result(30)
    try:
        with ProxyProcess.start(args.bootstrap, workdir / "groupgate.log",
                                args=["--log-level", "WARNING", *SECURITY.proxy_flags(),
                                      *args.proxy_arg],
                                env=SECURITY.proxy_env()) as proxy:
            targets = {"direct": args.bootstrap, "proxied": proxy.bootstrap}
            phases: dict[str, dict[str, list[dict[str, float]]]] = {
                name: {"direct": [], "proxied": []}
                for name in ("produce", "consume", "latency", "rtt")}
            # One unrecorded round per target warms up the broker's JIT and page cache.
            for target, bootstrap in targets.items():
                direct = target == "direct"
                produce_throughput(bootstrap, topic, min(args.records, 20_000), direct)
                consume_throughput(bootstrap, topic, args.partitions, min(args.records, 20_000),
                                   direct)
            for round_no in range(args.rounds):
                order = ["direct", "proxied"] if round_no % 2 == 0 else ["proxied", "direct"]
                for target in order:
                    bootstrap = targets[target]
                    direct = target == "direct"
                    pid = proxy.process.pid if proxy.process else 0
                    cpu0 = process_cpu_seconds(pid)
                    produced = produce_throughput(bootstrap, topic, args.records, direct)
                    cpu1 = process_cpu_seconds(pid)
                    consumed = consume_throughput(bootstrap, topic, args.partitions, args.records,
                                                  direct)
                    cpu2 = process_cpu_seconds(pid)
                    megabytes = args.records * len(VALUE) / 1e6
                    if target == "proxied":
                        produced["proxy_cpu_ms_per_mb"] = (cpu1 - cpu0) * 1000 / megabytes
                        consumed["proxy_cpu_ms_per_mb"] = (cpu2 - cpu1) * 1000 / megabytes
                    phases["produce"][target].append(produced)
                    phases["consume"][target].append(consumed)
                    phases["latency"][target].append(
                        produce_latency(bootstrap, topic, args.latency_rate,
                                        args.latency_seconds, direct))
                    phases["rtt"][target].append(request_rtt(bootstrap, args.rtt_requests,
                                                             direct))
                    print(f"round {round_no + 1}/{args.rounds} {target}: "
                          f"produce {phases['produce'][target][-1]['mb_per_s']:.1f} MB/s, "
                          f"consume {phases['consume'][target][-1]['mb_per_s']:.1f} MB/s, "
                          f"latency p99 {phases['latency'][target][-1]['p99_ms']:.2f} ms",
                          flush=True)
    finally:
        with contextlib.suppress(Exception):
            admin.delete_topics([topic])[topic].result(30)
    kafka = args.kafka_version or "unknown"
    results: dict[str, Any] = {
        "benchmark": "passthrough",
        "machine": info,
        "kafka": kafka,
        "settings": {k: v for k, v in vars(args).items()
                     if k in ("records", "rounds", "partitions", "latency_rate",
                              "latency_seconds", "rtt_requests", "proxy_arg",
                              "security_protocol", "sasl_mechanism")},
        "record_bytes": len(VALUE),
        "produce_mb_per_s": _summary(phases["produce"], "mb_per_s"),
        "consume_mb_per_s": _summary(phases["consume"], "mb_per_s"),
        "proxy_cpu_ms_per_mb": {
            "produce": median([r["proxy_cpu_ms_per_mb"] for r in phases["produce"]["proxied"]]),
            "consume": median([r["proxy_cpu_ms_per_mb"] for r in phases["consume"]["proxied"]]),
        },
        "produce_latency_p50_ms": _summary(phases["latency"], "p50_ms"),
        "produce_latency_p99_ms": _summary(phases["latency"], "p99_ms"),
        "request_rtt_p50_ms": _summary(phases["rtt"], "p50_ms"),
        "request_rtt_p99_ms": _summary(phases["rtt"], "p99_ms"),
    }
    rows = [("produce throughput (MB/s)", "produce_mb_per_s"),
            ("consume throughput (MB/s)", "consume_mb_per_s"),
            (f"produce latency p50 (ms) @{args.latency_rate}/s", "produce_latency_p50_ms"),
            (f"produce latency p99 (ms) @{args.latency_rate}/s", "produce_latency_p99_ms"),
            ("request RTT p50 (ms)", "request_rtt_p50_ms"),
            ("request RTT p99 (ms)", "request_rtt_p99_ms")]
    print(f"\nKafka {kafka}, {args.rounds} rounds per target, medians:")
    print(f"{'metric':<38} {'direct':>10} {'proxied':>10} {'ratio':>7} {'added':>9}")
    for label, key in rows:
        s = results[key]
        added = s["proxied_median"] - s["direct_median"]
        print(f"{label:<38} {s['direct_median']:>10.3f} {s['proxied_median']:>10.3f} "
              f"{s['ratio']:>7.3f} {added:>+9.3f}")
    cpu = results["proxy_cpu_ms_per_mb"]
    print(f"proxy CPU per MB forwarded: produce {cpu['produce']:.2f} ms, "
          f"consume {cpu['consume']:.2f} ms (user + system time of the proxy process)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0
