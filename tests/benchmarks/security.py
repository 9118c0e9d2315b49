"""``dev/bench security``: in-process costs behind decisions 0015 and 0017.

* SCRAM's client side with ``scramp`` against the PBKDF2 every implementation must compute;
* a CA and a leaf certificate made with ``trustme`` against the ``openssl`` command line;
* TLS throughput of one receiving stream on loopback: ``trio.SSLStream.receive_some`` against
  :class:`proxy.security.tlsstream.TlsStream` decrypting into a reused buffer, and the same
  for the sending side, with the process CPU time per MB (both ends run in this process).

Prints a table and writes JSON with the machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import scramp
import trio
import trio.testing
import trustme

from proxy.commands.machine import describe_machine, machine_info
from proxy.security.tlsstream import TlsStream


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--megabytes", type=int, default=300, help="per TLS stream run")


def _scram_client_ms(mechanism: str) -> float:
    server_side = scramp.ScramMechanism(mechanism)
    info = server_side.make_auth_info("pw", iteration_count=4096)
    server = server_side.make_server(lambda _user: info)
    client = scramp.ScramClient([mechanism], "groupgate", "pw")
    started = time.perf_counter()
    first = client.get_client_first()
    spent = time.perf_counter() - started
    server.set_client_first(first)
    server_first = server.get_server_first()
    started = time.perf_counter()
    client.set_server_first(server_first)
    final = client.get_client_final()
    spent += time.perf_counter() - started
    server.set_client_final(final)
    server_final = server.get_server_final()
    started = time.perf_counter()
    client.set_server_final(server_final)
    return (spent + time.perf_counter() - started) * 1000


def _pbkdf2_ms(digest: str) -> float:
    started = time.perf_counter()
    hashlib.pbkdf2_hmac(digest, b"pw", b"0123456789abcdef", 4096)
    return (time.perf_counter() - started) * 1000


def _trustme_ms() -> float:
    started = time.perf_counter()
    leaf = trustme.CA().issue_cert("127.0.0.1", "localhost")
    leaf.private_key_pem.bytes()
    return (time.perf_counter() - started) * 1000


def _openssl_ms(directory: Path) -> float:
    run = lambda *args: subprocess.run(["openssl", *args], check=True, capture_output=True)  # noqa: E731
    started = time.perf_counter()
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{directory}/ca.key", "-out", f"{directory}/ca.pem", "-subj", "/CN=ca",
        "-days", "1")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
        f"{directory}/leaf.key", "-out", f"{directory}/leaf.csr", "-subj", "/CN=leaf")
    (directory / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", f"{directory}/leaf.csr", "-CA", f"{directory}/ca.pem", "-CAkey",
        f"{directory}/ca.key", "-CAcreateserial", "-out", f"{directory}/leaf.pem", "-days", "1",
        "-extfile", f"{directory}/ext")
    return (time.perf_counter() - started) * 1000


async def _stream_run(receiver: str, sender: str, total: int) -> dict[str, float]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    chunk = b"x" * (1 << 20)

    async def serve(tcp: trio.SocketStream) -> None:
        stream: trio.abc.Stream
        if sender == "TlsStream":
            stream = TlsStream(tcp, server_context, server_side=True)
        else:
            stream = trio.SSLStream(tcp, server_context, server_side=True)
        await stream.do_handshake()  # type: ignore[attr-defined]
        for _ in range(total // len(chunk)):
            await stream.send_all(chunk)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        tcp = await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1])
        buffer = memoryview(bytearray(256 * 1024))
        got = 0
        if receiver == "TlsStream":
            tls = TlsStream(tcp, client_context, server_hostname="127.0.0.1")
            await tls.do_handshake()
            started, cpu = time.perf_counter(), time.process_time()
            while got < total and (n := await tls.receive_into(buffer)):
                got += n
        else:
            ssl_stream = trio.SSLStream(tcp, client_context, server_hostname="127.0.0.1")
            await ssl_stream.do_handshake()
            started, cpu = time.perf_counter(), time.process_time()
            while got < total and (data := await ssl_stream.receive_some(len(buffer))):
                got += len(data)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        nursery.cancel_scope.cancel()
    return {"mb_per_s": got / elapsed / 1e6, "cpu_ms_per_mb_both_ends": cpu * 1000 / (got / 1e6)}


async def _handshake_ms() -> float:
    """One TLS 1.3 handshake with an ECDSA P-256 certificate, both ends in this process."""
    ca = trustme.CA()
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    left, right = trio.testing.memory_stream_pair()
    client = TlsStream(left, client_context, server_hostname="127.0.0.1")
    server = TlsStream(right, server_context, server_side=True)
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        await client.do_handshake()
    return (time.perf_counter() - started) * 1000


def _echo_broker(port: list[int], context: ssl.SSLContext | None) -> None:
    """A blocking stand-in broker on its own thread: answers each frame with 100 bytes."""
    import socket
    import struct
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port.append(listener.getsockname()[1])

    def serve(conn: socket.socket) -> None:
        buffered = b""
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                buffered += data
                while len(buffered) >= 4 and len(buffered) >= 4 + int.from_bytes(
                        buffered[:4], "big"):
                    size = int.from_bytes(buffered[:4], "big")
                    correlation, buffered = buffered[8:12], buffered[4 + size:]
                    conn.sendall(struct.pack(">i", 104) + correlation + b"m" * 100)

    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            conn = context.wrap_socket(conn, server_side=True)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _proxy_rtt(tls: bool, requests: int) -> dict[str, float]:
    """Sequential small requests through an in-process ProxyServer to the stand-in broker,
    with plaintext or TLS upstream: p50/p99 ms (the client runs on a thread)."""
    import socket
    import struct
    import threading

    from proxy.config import ProxyConfig
    from proxy.connection import FORWARD, RequestInfo
    from proxy.server import ProxyServer

    ca = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    directory = Path(tempfile.mkdtemp())
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    port: list[int] = []
    threading.Thread(target=_echo_broker, args=(port, context if tls else None),
                     daemon=True).start()
    while not port:
        time.sleep(0.01)

    class Forward:
        def classify(self, request: RequestInfo) -> int:
            return FORWARD

        def decide(self, request: RequestInfo) -> int:
            return FORWARD

        def decide_oversized(self, request: RequestInfo) -> int:
            return FORWARD

        def response_rewriter(self, api_key: int, api_version: int) -> None:
            return None

    def client(bootstrap_port: int) -> list[float]:
        sock = socket.create_connection(("127.0.0.1", bootstrap_port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        samples = []
        for correlation in range(requests + 200):
            payload = struct.pack(">hhih", 3, 1, correlation, -1) + b"\0\0\0\0"
            started = time.perf_counter()
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            got = b""
            while len(got) < 4 or len(got) < 4 + int.from_bytes(got[:4], "big"):
                got += sock.recv(65536)
            if correlation >= 200:
                samples.append((time.perf_counter() - started) * 1000)
        sock.close()
        return sorted(samples)

    async def main() -> list[float]:
        config = ProxyConfig(upstream=(("127.0.0.1", port[0]),), listen=("127.0.0.1", 0),
                             security_protocol="SSL" if tls else "PLAINTEXT",
                             tls_ca_file=str(directory / "ca.pem") if tls else "")
        server = ProxyServer(config, lambda *_: Forward())
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            samples = await trio.to_thread.run_sync(client, server.bootstrap_port)
            nursery.cancel_scope.cancel()
        return samples

    samples = trio.run(main)
    return {"p50_ms": samples[len(samples) // 2], "p99_ms": samples[int(len(samples) * 0.99)]}


def run(args: argparse.Namespace) -> int:
    info = machine_info()
    print(f"machine: {describe_machine(info)}")
    results: dict[str, Any] = {"benchmark": "security", "machine": info,
                               "versions": {"scramp": scramp.__version__ if hasattr(
                                   scramp, "__version__") else "?",
                                            "trustme": trustme.__version__,
                                            "openssl": ssl.OPENSSL_VERSION}}
    timings: dict[str, float] = {}
    for mechanism, digest in (("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-512", "sha512")):
        timings[f"scramp {mechanism} client ms"] = statistics.median(
            _scram_client_ms(mechanism) for _ in range(30))
        timings[f"pbkdf2 {digest} 4096 ms"] = statistics.median(
            _pbkdf2_ms(digest) for _ in range(30))
    timings["trustme CA + leaf ms"] = statistics.median(_trustme_ms() for _ in range(20))
    if shutil.which("openssl"):
        with tempfile.TemporaryDirectory() as directory:
            timings["openssl CLI CA + leaf ms"] = statistics.median(
                _openssl_ms(Path(directory)) for _ in range(5))
    timings["TLS 1.3 handshake ms (both ends)"] = statistics.median(
        trio.run(_handshake_ms) for _ in range(20))
    for name, value in timings.items():
        print(f"{name:<36} {value:8.2f}")
    results["timings"] = timings
    total = args.megabytes * (1 << 20)
    streams: dict[str, dict[str, float]] = {}
    for sender in ("trio.SSLStream", "TlsStream"):
        for receiver in ("trio.SSLStream", "TlsStream"):
            figures = trio.run(_stream_run, receiver, sender, total)
            streams[f"{receiver} <- {sender}"] = figures
            print(f"receive {receiver:<15} send {sender:<15} {figures['mb_per_s']:7.0f} MB/s "
                  f"{figures['cpu_ms_per_mb_both_ends']:6.2f} ms CPU/MB (both ends)")
    results["tls_streams"] = streams
    rtt = {kind: _proxy_rtt(kind == "TLS", 3000) for kind in ("plaintext", "TLS")}
    for kind, figures in rtt.items():
        print(f"in-process proxy round trip, {kind} upstream: p50 {figures['p50_ms']:.3f} ms, "
              f"p99 {figures['p99_ms']:.3f} ms")
    results["proxy_rtt_in_process"] = rtt
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
