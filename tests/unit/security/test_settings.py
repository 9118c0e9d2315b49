"""Security settings: combinations refused at start, what each listener then requires, and
which links authenticate how."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from proxy.codec.api_keys import ApiKey
from proxy.config import ConfigError, describe, load
from proxy.coordination.fleet import mark_forwarded
from proxy.coordination.links import BROKER, BY_CLIENT_ID, PEER, LinkPool
from proxy.security.policy import Security
from proxy.upstream import UpstreamClient, UpstreamError

BASE = {"GROUPGATE_UPSTREAM": "kafka:9093"}
SASL = dict(BASE, GROUPGATE_SECURITY_PROTOCOL="SASL_SSL", GROUPGATE_SASL_MECHANISM="SCRAM-SHA-512",
            GROUPGATE_SASL_USERNAME="groupgate", GROUPGATE_SASL_PASSWORD="pw")


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "c.pem", "key": tmp_path / "c.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    leaf.private_key_pem.write_to_path(str(paths["key"]))
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.parametrize(("extra", "message"), [
    ({"GROUPGATE_SECURITY_PROTOCOL": "SASL_SSL"}, "needs sasl-mechanism"),
    ({"GROUPGATE_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GROUPGATE_SASL_MECHANISM": "PLAIN",
      "GROUPGATE_SASL_USERNAME": "u"}, "needs sasl-password"),
    ({"GROUPGATE_SASL_MECHANISM": "PLAIN"}, "security-protocol is PLAINTEXT"),
    ({"GROUPGATE_SASL_MECHANISM": "GSSAPI"}, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    ({"GROUPGATE_TLS_CA_FILE": "/nonexistent/ca.pem"}, "no readable file"),
])
def test_contradictions_are_refused_at_start(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(None, dict(BASE, **extra))


def test_the_fleet_listener_is_never_a_way_around_sasl(certs: dict[str, str]) -> None:
    fleet = {"GROUPGATE_FLEET_LISTEN": "127.0.0.1:9191"}
    with pytest.raises(ConfigError, match="fleet-auth none on a SASL cluster"):
        load(None, dict(SASL, GROUPGATE_FLEET_AUTH="none", **fleet))
    with pytest.raises(ConfigError, match="PLAIN sends the password"):
        load(None, dict(SASL, GROUPGATE_SASL_MECHANISM="PLAIN", **fleet))
    with pytest.raises(ConfigError, match="mtls needs"):
        load(None, dict(SASL, GROUPGATE_FLEET_AUTH="mtls", **fleet))
    sasl = Security(load(None, dict(SASL, **fleet)))
    assert sasl.fleet_auth == "sasl" and sasl.peer_sasl
    policy = sasl.listener(fleet=True)
    assert policy.sasl and policy.fleet_users == frozenset({"groupgate"})
    mtls = Security(load(None, dict(SASL, GROUPGATE_FLEET_TLS_CERT_FILE=certs["cert"],
                                    GROUPGATE_FLEET_TLS_KEY_FILE=certs["key"],
                                    GROUPGATE_FLEET_TLS_CA_FILE=certs["ca"], **fleet)))
    assert mtls.fleet_auth == "mtls" and not mtls.peer_sasl
    assert mtls.listener(fleet=True).fleet_certificate
    assert mtls.listener(fleet=False).sasl  # applications still authenticate


def test_the_password_is_not_in_the_startup_line() -> None:
    config = load(None, SASL)
    assert "pw'" not in describe(config) and "sasl-password='(set)'" in describe(config)


def test_forwarded_connections_carry_the_proxy_certificate_only_where_sasl_names_the_client(
        certs: dict[str, str]) -> None:
    files = {"GROUPGATE_TLS_CA_FILE": certs["ca"], "GROUPGATE_TLS_CERT_FILE": certs["cert"],
             "GROUPGATE_TLS_KEY_FILE": certs["key"]}
    sasl_ssl = Security(load(None, dict(SASL, **files)))
    assert sasl_ssl.forwarded_tls is sasl_ssl.link_tls
    ssl_only = Security(load(None, dict(BASE, GROUPGATE_SECURITY_PROTOCOL="SSL", **files)))
    assert ssl_only.forwarded_tls is not ssl_only.link_tls
    shared = Security(load(None, dict(BASE, GROUPGATE_SECURITY_PROTOCOL="SSL",
                                      GROUPGATE_TLS_CERT_FOR_CLIENTS="on", **files)))
    assert shared.forwarded_tls is shared.link_tls


@pytest.mark.parametrize(("client_id", "expected"), [
    (mark_forwarded("app", "/10.0.0.8", 1), PEER),  # a relay: the other sidecar's listener
    ("app", BROKER),  # a relayed commit sent on to the group's broker coordinator
])
async def test_a_dedicated_link_leads_where_its_first_request_shows(
        monkeypatch: pytest.MonkeyPatch, client_id: str, expected: str) -> None:
    opened: list[bool] = []

    async def connect(address: object, **kwargs: object) -> object:
        opened.append(bool(kwargs["peer"]))
        raise UpstreamError("not connecting in a unit test")

    monkeypatch.setattr(UpstreamClient, "connect", connect)
    pool = LinkPool(connect_timeout=1, request_timeout=1, max_frame_bytes=1 << 20)
    assert pool.link(("kafka", 9093)).leads_to == BROKER
    assert pool.peer(("10.0.0.7", 9191), 5).leads_to == PEER
    link = pool.dedicated(("10.0.0.7", 9191), 5)
    assert link.leads_to == BY_CLIENT_ID
    with pytest.raises(UpstreamError):
        await link.request(ApiKey.JOIN_GROUP, 5, {}, client_id=client_id)
    assert link.leads_to == expected and opened == [expected == PEER]
