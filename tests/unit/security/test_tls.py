"""ReloadingContext and the TLS transport: certificates made with trustme, a listener that
terminates TLS, a client verifying it, and a certificate rotated under a running context."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from proxy.security.tls import (
    ReloadingContext,
    TlsError,
    client_context,
    handshake_client,
    handshake_server,
    peer_subject,
    server_context,
)
from proxy.security.tlsstream import TlsStream


def write(ca: trustme.CA, directory: Path, name: str, *hosts: str,
          common_name: str | None = None) -> tuple[Path, Path]:
    leaf = ca.issue_cert(*hosts, common_name=common_name)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_changed_file_is_loaded_at_the_next_check_and_a_broken_one_is_not(
        tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = write(ca, tmp_path, "server", "127.0.0.1")
    clock = Clock()
    builds: list[ssl.SSLContext] = []

    def build() -> ssl.SSLContext:
        builds.append(server_context(cert_file=cert, key_file=key))
        return builds[-1]

    reloading = ReloadingContext("test", build, [cert, key], check_seconds=5, clock=clock)
    first = reloading.current()
    other = ca.issue_cert("127.0.0.1")
    other.cert_chain_pems[0].write_to_path(str(cert))
    other.private_key_pem.write_to_path(str(key))
    os.utime(cert, ns=(1, 1))  # a different modification time, whatever the clock's grain
    assert reloading.current() is first  # not looked at before check_seconds
    clock.now = 5
    second = reloading.current()
    assert second is not first and reloading.reloads == 1
    key.write_text("not a key")  # caught half-written: the previous context stays
    clock.now = 10
    assert reloading.current() is second and reloading.reloads == 1


async def tls_pair(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext,
                   hostname: str | None) -> tuple[TlsStream, str | None]:
    """Handshake both ends of a socket pair; (client stream, subject the server saw)."""
    left, right = trio.testing.memory_stream_pair()
    seen: list[str | None] = []

    async def serve() -> None:
        try:
            stream = await handshake_server(right, server_ctx)
        except TlsError:
            return  # the client gave up: its error is what the test looks at
        seen.append(peer_subject(stream))

    failure: list[TlsError] = []
    clients: list[TlsStream] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            clients.append(await handshake_client(left, client_ctx, hostname))
        except TlsError as exc:
            failure.append(exc)
            nursery.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return clients[0], seen[0]


async def test_mutual_tls_records_the_client_subject(tmp_path: Path) -> None:
    ca = trustme.CA()
    scert, skey = write(ca, tmp_path, "server", "broker.example")
    ccert, ckey = write(ca, tmp_path, "client", "app.example", common_name="app")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = server_context(cert_file=scert, key_file=skey, ca_file=ca_file)
    client = client_context(ca_file=ca_file, cert_file=ccert, key_file=ckey)
    _, subject = await tls_pair(server, client, "broker.example")
    assert subject is not None and "CN=app" in subject


async def test_a_wrong_host_name_or_an_unknown_ca_fails_with_a_reason(tmp_path: Path) -> None:
    ca = trustme.CA()
    scert, skey = write(ca, tmp_path, "server", "broker.example")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = server_context(cert_file=scert, key_file=skey)
    with pytest.raises(TlsError, match="certificate verification failed"):
        await tls_pair(server, client_context(ca_file=ca_file), "other.example")
    stranger = tmp_path / "stranger.pem"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    with pytest.raises(TlsError, match="certificate verification failed"):
        await tls_pair(server, client_context(ca_file=stranger), "broker.example")
    # host names unchecked: the chain alone decides
    await tls_pair(server, client_context(ca_file=ca_file, verify_hostname=False),
                   "other.example")


async def test_a_frame_of_known_length_arrives_in_few_steps_and_its_end_never_waits() -> None:
    """The receiver says how much of a frame is still coming: the socket then wakes it only
    once much of it is there (SO_RCVLOWAT), never for more than surely comes (the sender
    stays connected after the frame), and a later read of unknown length wakes at once."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    size = 3 * 1024 * 1024 + 12345
    payload = os.urandom(size)
    more = trio.Event()
    done = trio.Event()

    async def serve(tcp: trio.SocketStream) -> None:
        stream = TlsStream(tcp, server_ctx, server_side=True)
        await stream.do_handshake()
        for offset in range(0, size, 4096):  # many small writes: many segments
            await stream.send_all(payload[offset:offset + 4096])
        await more.wait()
        await stream.send_all(b"after")
        await done.wait()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        tcp = await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1])
        client = TlsStream(tcp, client_ctx, server_hostname="127.0.0.1")
        await client.do_handshake()
        received = bytearray(size)
        view = memoryview(received)
        have = steps = 0
        with trio.fail_after(20):
            while have < size:
                n = await client.receive_into(view[have:have + 256 * 1024], size - have)
                assert n
                have += n
                steps += 1
        assert received == payload
        assert steps <= 40, steps  # 4 KiB writes, received about 80 KiB or more at a time
        more.set()
        with trio.fail_after(5):
            assert await client.receive_some(100) == b"after"
        done.set()
        await client.aclose()
        nursery.cancel_scope.cancel()
