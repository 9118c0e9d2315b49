"""SaslGate: what a connection on a SASL listener may send before, during and after its
authentication, and what the gate learns from the exchange (synthetic frames, no broker)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.connection import EXAMINE, FORWARD, RejectRequest, RequestInfo
from proxy.security.gate import SaslGate, user_of
from proxy.security.session import Session


class Inner:
    """Forwards everything, examines ConsumerGroupHeartbeat (as the coordinating router)."""

    def classify(self, request: RequestInfo) -> int:
        return EXAMINE if request.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT else FORWARD

    def decide(self, request: RequestInfo) -> int:
        return FORWARD

    def decide_oversized(self, request: RequestInfo) -> int:
        return FORWARD

    def response_rewriter(self, api_key: int, api_version: int) -> None:
        return None


def request(key: int, version: int, value: dict[str, Any] | None = None) -> RequestInfo:
    frame = encode_request_header(key, version, 7, "app")
    if value is not None:
        frame += messages.encode_request(key, version, value)
    return RequestInfo(key, version, 7, memoryview(frame))


def response(key: int, version: int, value: dict[str, Any]) -> memoryview:
    header = b"\0\0\0\x07" + (b"\0" if messages.response_header_version(key, version) else b"")
    return memoryview(header + messages.encode_response(key, version, value))


def gate(**kwargs: Any) -> SaslGate:
    return SaslGate(Inner(), Session("bootstrap"), name="test", **kwargs)


def authenticate(g: SaslGate, mechanism: str, tokens: list[bytes], answers: list[bytes],
                 lifetime_ms: int = 0, version: int = 1) -> None:
    assert g.classify(request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})) == FORWARD
    rewrite = g.response_rewriter(ApiKey.SASL_HANDSHAKE, 1)
    assert rewrite is not None
    rewrite(response(ApiKey.SASL_HANDSHAKE, 1, {"error_code": 0, "mechanisms": [mechanism]}))
    for i, (token, answer) in enumerate(zip(tokens, answers, strict=True)):
        assert g.classify(request(ApiKey.SASL_AUTHENTICATE, version,
                                  {"auth_bytes": token})) == FORWARD
        rewrite = g.response_rewriter(ApiKey.SASL_AUTHENTICATE, version)
        assert rewrite is not None
        last = i == len(tokens) - 1
        rewrite(response(ApiKey.SASL_AUTHENTICATE, version, {
            "error_code": 0, "error_message": None, "auth_bytes": answer,
            "session_lifetime_ms": lifetime_ms if last else 0}))


UNAUTHENTICATED = [ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE,
                   ApiKey.METADATA, ApiKey.JOIN_GROUP, ApiKey.OFFSET_COMMIT, ApiKey.PRODUCE]


@pytest.mark.parametrize("key", UNAUTHENTICATED)
async def test_before_authentication_only_api_versions_and_sasl_pass(key: ApiKey) -> None:
    g = gate()
    assert g.classify(request(ApiKey.API_VERSIONS, 3)) == FORWARD
    with pytest.raises(RejectRequest, match="before the client authenticated"):
        g.classify(request(key, 0))


async def test_during_the_exchange_nothing_else_passes() -> None:
    g = gate()
    g.classify(request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))
    with pytest.raises(RejectRequest):
        g.classify(request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0))


async def test_authenticate_before_the_broker_accepted_the_mechanism_is_refused() -> None:
    g = gate()
    with pytest.raises(RejectRequest, match="without a SaslHandshake"):
        g.classify(request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0u\0p"}))
    g.classify(request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))
    with pytest.raises(RejectRequest, match="without a SaslHandshake"):
        g.classify(request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0u\0p"}))


async def test_plain_user_is_learnt_and_the_password_is_not_kept() -> None:
    g = gate()
    authenticate(g, "PLAIN", [b"\0alice\0s3cret"], [b""])
    assert g.session.authenticated and g.session.principal == "User:alice"
    assert "s3cret" not in repr(g.session)
    assert g.classify(request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0)) == EXAMINE


async def test_scram_completes_after_the_second_answer() -> None:
    g = gate()
    g.classify(request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"}))
    handshake = g.response_rewriter(ApiKey.SASL_HANDSHAKE, 1)
    assert handshake is not None
    handshake(response(ApiKey.SASL_HANDSHAKE, 1, {"error_code": 0, "mechanisms": []}))
    g.classify(request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"n,,n=b=2Cob,r=abc"}))
    answer = g.response_rewriter(ApiKey.SASL_AUTHENTICATE, 2)
    assert answer is not None
    answer(response(ApiKey.SASL_AUTHENTICATE, 2, {"error_code": 0, "error_message": None,
                                                  "auth_bytes": b"r=abcdef,s=c2FsdA==,i=4096",
                                                  "session_lifetime_ms": 0}))
    assert not g.session.authenticated
    with pytest.raises(RejectRequest):
        g.classify(request(ApiKey.METADATA, 1, {"topics": []}))
    g.classify(request(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"c=biws,r=abcdef,p=xx"}))
    answer(response(ApiKey.SASL_AUTHENTICATE, 2, {"error_code": 0, "error_message": None,
                                                  "auth_bytes": b"v=proof",
                                                  "session_lifetime_ms": 0}))
    assert g.session.authenticated and g.session.user == "b,ob"


async def test_a_refused_authentication_closes_everything_after_it() -> None:
    g = gate()
    g.classify(request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))
    handshake = g.response_rewriter(ApiKey.SASL_HANDSHAKE, 1)
    assert handshake is not None
    handshake(response(ApiKey.SASL_HANDSHAKE, 1, {"error_code": 0, "mechanisms": []}))
    g.classify(request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0wrong"}))
    answer = g.response_rewriter(ApiKey.SASL_AUTHENTICATE, 1)
    assert answer is not None
    answer(response(ApiKey.SASL_AUTHENTICATE, 1, {
        "error_code": 58, "error_message": "Authentication failed: Invalid username or password",
        "auth_bytes": b"", "session_lifetime_ms": 0}))
    assert g.session.failed is not None and "Invalid username" in g.session.failed
    with pytest.raises(RejectRequest, match="refused"):
        g.classify(request(ApiKey.API_VERSIONS, 3))


@pytest.mark.parametrize("mechanism", ["OAUTHBEARER", "GSSAPI"])
async def test_opaque_mechanisms_authenticate_without_a_user(mechanism: str) -> None:
    g = gate()
    authenticate(g, mechanism, [b"n,,\x01auth=Bearer xyz\x01\x01", b""], [b"challenge", b""])
    assert g.session.authenticated and g.session.mechanism == mechanism
    assert g.session.user is None and g.session.principal is None


async def test_an_ended_session_closes_all_but_a_new_handshake() -> None:
    g = gate()
    authenticate(g, "PLAIN", [b"\0alice\0pw"], [b""], lifetime_ms=10_000)
    assert g.classify(request(ApiKey.METADATA, 1, {"topics": []})) == FORWARD
    assert g.session.expires_at is not None
    g.session.expires_at = trio.current_time() - 0.001
    with pytest.raises(RejectRequest, match="session ended"):
        g.classify(request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0))
    authenticate(g, "PLAIN", [b"\0alice\0pw"], [b""], lifetime_ms=10_000)
    assert g.session.reauthentications == 1
    assert g.classify(request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0)) == EXAMINE


async def test_reauthentication_as_another_user_fails() -> None:
    g = gate()
    authenticate(g, "PLAIN", [b"\0alice\0pw"], [b""])
    authenticate(g, "PLAIN", [b"\0mallory\0pw"], [b""])
    assert g.session.failed is not None
    with pytest.raises(RejectRequest):
        g.classify(request(ApiKey.METADATA, 1, {"topics": []}))


async def test_fleet_listener_refuses_users_that_are_not_sidecars() -> None:
    g = gate(is_fleet_user=lambda user: user == "groupgate", fleet_only=True)
    authenticate(g, "PLAIN", [b"\0alice\0pw"], [b""])
    with pytest.raises(RejectRequest, match="fleet-users"):
        g.classify(request(ApiKey.JOIN_GROUP, 0))
    sidecar = gate(is_fleet_user=lambda user: user == "groupgate", fleet_only=True)
    authenticate(sidecar, "PLAIN", [b"\0groupgate\0pw"], [b""])
    assert sidecar.session.fleet_peer
    assert sidecar.classify(request(ApiKey.JOIN_GROUP, 0)) == FORWARD


@pytest.mark.parametrize(("mechanism", "token", "expected"), [
    ("PLAIN", b"\0alice\0pw", ("alice", False)),
    ("PLAIN", b"admin\0alice\0pw", ("alice", False)),
    ("PLAIN", b"garbage", (None, False)),
    ("SCRAM-SHA-256", b"n,,n=al=3Dice,r=nonce", ("al=ice", False)),
    ("SCRAM-SHA-256", b"n,,n=token-id,r=nonce,tokenauth=true", (None, True)),
    ("SCRAM-SHA-256", b"\xff\xfe", (None, False)),
    ("OAUTHBEARER", b"n,a=alice,\x01auth=Bearer x\x01\x01", (None, False)),
])
def test_user_of(mechanism: str, token: bytes, expected: tuple[str | None, bool]) -> None:
    assert user_of(mechanism, token) == expected


async def test_no_mechanism_name_a_client_sends_becomes_a_label_value() -> None:
    """Before authenticating, a client may name any mechanism; the broker refuses it, and the
    refusal is counted under ``other``, never under the client's string (every distinct label
    value is a new time series kept for the life of the process)."""
    from proxy.metrics import REGISTRY

    def series() -> set[tuple[str, ...]]:
        return {tuple(sorted(s.labels.items())) for m in REGISTRY.collect()
                if m.name == "groupgate_client_authentications" for s in m.samples}

    before = series()
    for i in range(50):
        g = gate()
        g.classify(request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": f"MADE-UP-{i}"}))
        handshake = g.response_rewriter(ApiKey.SASL_HANDSHAKE, 1)
        assert handshake is not None
        handshake(response(ApiKey.SASL_HANDSHAKE, 1, {"error_code": 33,
                                                      "mechanisms": ["SCRAM-SHA-512"]}))
    added = series() - before
    assert all(dict(labels)["mechanism"] == "other" for labels in added)
    assert len({dict(labels)["mechanism"] for labels in series()}) <= 7
