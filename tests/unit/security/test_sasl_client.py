"""The proxy's own SASL: PLAIN and SCRAM against a scripted broker whose SCRAM side is
``scramp``'s server, the broker's refusal, and KIP-368 re-authentication between requests."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import scramp
import trio
import trio.testing

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import parse_request_header
from proxy.coordination.fleet_control import FLEET_CONTROL
from proxy.frames import FrameSplitter
from proxy.security.identity import Identity
from proxy.upstream import UpstreamAuthenticationError, UpstreamClient


class Broker:
    """Answers SaslHandshake, SaslAuthenticate (PLAIN, SCRAM) and Metadata on one stream."""

    def __init__(self, users: dict[str, str], lifetime_ms: int = 0) -> None:
        self.users = users
        self.lifetime_ms = lifetime_ms
        self.authentications = 0
        self.requests: list[int] = []
        self._mechanism = ""
        self._scram: Any = None

    async def serve(self, stream: trio.abc.Stream) -> None:
        splitter = FrameSplitter(1 << 20)
        while data := await stream.receive_some(65536):
            blob, spans = splitter.feed(data)
            for start, end in spans:
                frame = bytes(blob[start:end])
                if struct.unpack_from(">h", frame, 0)[0] == FLEET_CONTROL:  # raw: an error
                    self.requests.append(FLEET_CONTROL)
                    payload = frame[4:8] + struct.pack(">h", 0)
                    await stream.send_all(struct.pack(">i", len(payload)) + payload)
                    continue
                header = parse_request_header(frame)
                value, _ = messages.decode_request(header.api_key, header.api_version, frame,
                                                   header.header_length)
                self.requests.append(header.api_key)
                answer = self.answer(header.api_key, value)
                body = messages.encode_response(header.api_key, header.api_version, answer)
                extra = b"\0" if messages.response_header_version(
                    header.api_key, header.api_version) else b""
                payload = struct.pack(">i", header.correlation_id) + extra + body
                await stream.send_all(struct.pack(">i", len(payload)) + payload)

    def answer(self, key: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.SASL_HANDSHAKE:
            self._mechanism = value["mechanism"]
            self._scram = None
            return {"error_code": 0, "mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]}
        if key == ApiKey.SASL_AUTHENTICATE:
            return self.authenticate(bytes(value["auth_bytes"]))
        return {"throttle_time_ms": 0, "brokers": [], "cluster_id": None, "controller_id": 1,
                "topics": []}

    def authenticate(self, token: bytes) -> dict[str, Any]:
        ok = {"error_code": 0, "error_message": None, "session_lifetime_ms": 0}
        failed = {"error_code": 58, "error_message": "Authentication failed: Invalid username "
                  "or password", "auth_bytes": b"", "session_lifetime_ms": 0}
        if self._mechanism == "PLAIN":
            _, user, password = token.split(b"\0")
            if self.users.get(user.decode()) != password.decode():
                return failed
            self.authentications += 1
            return dict(ok, auth_bytes=b"", session_lifetime_ms=self.lifetime_ms)
        if self._scram is None:
            mechanism = scramp.ScramMechanism(self._mechanism)

            def lookup(user: str) -> tuple[bytes, bytes, bytes, int]:
                return mechanism.make_auth_info(self.users[user], iteration_count=4096)

            self._scram = mechanism.make_server(lookup)
            self._scram.set_client_first(token.decode())
            return dict(ok, auth_bytes=self._scram.get_server_first().encode())
        try:
            self._scram.set_client_final(token.decode())
        except scramp.ScramException:
            return failed
        self.authentications += 1
        return dict(ok, auth_bytes=self._scram.get_server_final().encode(),
                    session_lifetime_ms=self.lifetime_ms)


async def connected(broker: Broker, identity: Identity, nursery: trio.Nursery
                    ) -> UpstreamClient:
    left, right = trio.testing.memory_stream_pair()
    nursery.start_soon(broker.serve, right)
    client = UpstreamClient(left, max_frame_bytes=1 << 20, identity=identity)
    await client.authenticate()
    return client


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_the_proxy_authenticates(mechanism: str) -> None:
    broker = Broker({"groupgate": "s3cret=,pw"})
    async with trio.open_nursery() as nursery:
        client = await connected(broker, Identity(mechanism, "groupgate", "s3cret=,pw"),
                                 nursery)
        await client.request(ApiKey.METADATA, 4, {"topics": [],
                                                   "allow_auto_topic_creation": False})
        nursery.cancel_scope.cancel()
    assert broker.authentications == 1


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_a_refusal_carries_the_broker_s_message_and_no_password(mechanism: str) -> None:
    broker = Broker({"groupgate": "right"})
    async with trio.open_nursery() as nursery:
        with pytest.raises(UpstreamAuthenticationError, match="Invalid username") as caught:
            await connected(broker, Identity(mechanism, "groupgate", "wrong-password"),
                            nursery)
        nursery.cancel_scope.cancel()
    assert "wrong-password" not in str(caught.value)


async def test_credentials_are_read_from_files_for_each_authentication(tmp_path: Any) -> None:
    user, password = tmp_path / "username", tmp_path / "password"
    user.write_text("groupgate\n")
    password.write_text("first\n")
    identity = Identity("SCRAM-SHA-256", username_file=user, password_file=password)
    assert identity.credentials() == ("groupgate", "first")
    password.write_text("second")
    assert identity.credentials() == ("groupgate", "second")


async def test_reauthenticates_before_the_session_ends(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker({"groupgate": "pw"}, lifetime_ms=10_000)

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            client = await connected(broker, Identity("SCRAM-SHA-512", "groupgate", "pw"),
                                     nursery)
            metadata = {"topics": [], "allow_auto_topic_creation": False}
            await client.request(ApiKey.METADATA, 4, metadata)
            assert broker.authentications == 1
            await trio.sleep(8)  # before 85% of the session: nothing to do
            await client.request(ApiKey.METADATA, 4, metadata)
            assert broker.authentications == 1
            await trio.sleep(1)  # past 85%: again, before the request
            await client.request(ApiKey.METADATA, 4, metadata)
            assert broker.authentications == 2
            assert broker.requests[-4:] == [ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                                            ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA]
            nursery.cancel_scope.cancel()

    await scenario()


async def test_a_fleet_control_request_reauthenticates_too(
        autojump_clock: trio.testing.MockClock) -> None:
    """A sidecar's link to another's fleet listener sends ``FleetControl`` (raw bodies) too:
    past 85% of the session it authenticates again first, as before a request, else the
    fleet listener closes the connection (KIP-368)."""
    broker = Broker({"groupgate": "pw"}, lifetime_ms=10_000)
    async with trio.open_nursery() as nursery:
        client = await connected(broker, Identity("SCRAM-SHA-512", "groupgate", "pw"),
                                 nursery)
        assert await client.exchange_raw(FLEET_CONTROL, 0, b"{}") == b"\x00\x00"
        await trio.sleep(9)
        assert await client.exchange_raw(FLEET_CONTROL, 0, b"{}") == b"\x00\x00"
        assert broker.authentications == 2
        assert broker.requests[-4:] == [ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                                        ApiKey.SASL_AUTHENTICATE, FLEET_CONTROL]
        nursery.cancel_scope.cancel()
