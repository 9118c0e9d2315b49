"""A tiny trio HTTP endpoint: ``/metrics`` (Prometheus), ``/livez`` and ``/readyz``.

Liveness is cheap (the event loop answered). Readiness means the proxy can reach its upstream
cluster: the server's last upstream Metadata refresh succeeded recently. One request per
connection, GET only, bounded request size; anything else gets 400/404/405.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.logs import LIFECYCLE
from proxy.metrics import REGISTRY

log = logging.getLogger("groupgate.health")
lifecycle = logging.getLogger(LIFECYCLE)

MAX_REQUEST_BYTES = 8192


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


async def _handle(stream: trio.SocketStream, ready: Callable[[], tuple[bool, str]]) -> None:
    async with stream:
        data = b""
        with trio.move_on_after(5):
            while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST_BYTES:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
        line = data.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(line) != 3:
            reply = _response("400 Bad Request", b"bad request\n")
        elif line[0] != "GET":
            reply = _response("405 Method Not Allowed", b"GET only\n")
        elif line[1] == "/metrics":
            reply = _response("200 OK", generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif line[1] == "/livez":
            reply = _response("200 OK", b"ok\n")
        elif line[1] == "/readyz":
            ok, why = ready()
            reply = _response("200 OK" if ok else "503 Service Unavailable",
                              (why + "\n").encode())
        else:
            reply = _response("404 Not Found", b"not found\n")
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(reply)


async def serve_health(host: str, port: int, ready: Callable[[], tuple[bool, str]],
                       *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    lifecycle.info("metrics and health on http://%s:%d/metrics", host, bound)
    task_status.started(bound)

    async def handler(stream: trio.SocketStream) -> None:
        # A probe that resets or garbles its request must never reach the proxy's nursery.
        try:
            await _handle(stream, ready)
        except Exception as exc:
            log.debug("health request failed: %r", exc)

    await trio.serve_listeners(handler, listeners)
