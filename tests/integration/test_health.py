"""Health endpoints and metrics of a running proxy, seen over HTTP like a kubelet would."""

from __future__ import annotations

import re
import socket
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_probes_and_metrics(kafka39: KafkaBroker, start_proxy: StartProxy) -> None:
    proxy = start_proxy(kafka39, "--metrics-listen", "127.0.0.1:0")
    match = re.search(r"metrics and health on (http://\S+)/metrics", proxy.log())
    assert match, proxy.log()
    base = match.group(1)
    assert _get(f"{base}/livez") == (200, "ok\n")
    assert _get(f"{base}/readyz") == (200, "ok\n")
    assert _get(f"{base}/nope")[0] == 404
    # A probe that sends half a request and resets the connection harms nothing.
    host, port = base.removeprefix("http://").rsplit(":", 1)
    probe = socket.create_connection((host, int(port)))
    probe.sendall(b"GET /liv")
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    probe.close()  # RST
    time.sleep(0.2)
    assert proxy.alive
    assert _get(f"{base}/livez") == (200, "ok\n")

    bad = socket.create_connection((proxy.host, proxy.port))
    bad.sendall(struct.pack(">i", -1))
    bad.settimeout(5)
    assert bad.recv(10) == b""
    good = socket.create_connection((proxy.host, proxy.port))
    payload = struct.pack(">hhih", 18, 0, 1, -1)
    good.sendall(struct.pack(">i", len(payload)) + payload)
    good.settimeout(5)
    assert good.recv(4)
    time.sleep(0.2)
    status, text = _get(f"{base}/metrics")
    assert status == 200
    assert 'groupgate_connections_closed_bad_input_total{node="bootstrap"} 1.0' in text
    assert 'groupgate_requests_total{api_key="18",node="bootstrap"}' in text


def test_not_ready_without_upstream(tmp_path: Path) -> None:
    from proxy.process import ProxyProcess
    from tests.testbed.broker import free_ports

    dead = free_ports(1)[0]
    log_file = tmp_path / "gg.log"
    with ProxyProcess.start(f"127.0.0.1:{dead}", log_file,
                            args=["--metrics-listen", "127.0.0.1:0",
                                  "--connect-timeout", "1"]) as proxy:
        match = re.search(r"metrics and health on (http://\S+)/metrics", proxy.log())
        assert match
        status, text = _get(f"{match.group(1)}/readyz")
        assert status == 503, text
        assert f"127.0.0.1:{dead}" in text
        # A client is closed at once rather than left hanging.
        sock = socket.create_connection((proxy.host, proxy.port))
        sock.settimeout(5)
        assert sock.recv(10) == b""
        assert "no upstream connection for bootstrap" in proxy.log()
