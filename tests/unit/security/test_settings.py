"""Security settings: combinations refused at start, what each listener then requires, and
which links authenticate how."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio
import trustme

from proxy.codec.api_keys import ApiKey
from proxy.config import ConfigError, describe, load
from proxy.coordination.peers import ConnectionLinks
from proxy.kafka_client.links import BROKER, LinkPool
from proxy.security.policy import Security
from proxy.upstream import UpstreamError

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
    assert not policy.fleet_peer  # the gate decides, from the user the broker authenticated
    mtls = Security(load(None, dict(SASL, GROUPGATE_FLEET_TLS_CERT_FILE=certs["cert"],
                                    GROUPGATE_FLEET_TLS_KEY_FILE=certs["key"],
                                    GROUPGATE_FLEET_TLS_CA_FILE=certs["ca"], **fleet)))
    assert mtls.fleet_auth == "mtls" and not mtls.peer_sasl
    assert mtls.listener(fleet=True).fleet_peer  # proved by the fleet CA's certificate
    assert mtls.listener(fleet=False).sasl  # applications still authenticate
    # without SASL on the cluster and fleet-auth none, whoever reaches the port is a sidecar
    plain = Security(load(None, dict(BASE, **fleet)))
    assert plain.fleet_auth == "none" and plain.listener(fleet=True).fleet_peer
    assert not plain.listener(fleet=False).fleet_peer


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


async def test_relays_open_links_to_sidecars_with_the_fleet_s_tls_and_commits_to_brokers_without(
        certs: dict[str, str]) -> None:
    """A plaintext cluster with fleet TLS: what reaches a listener shows which kind of link
    connected to it (a TLS ClientHello, or a Kafka request frame)."""
    security = Security(load(None, dict(BASE, GROUPGATE_FLEET_LISTEN="127.0.0.1:9191",
                                        GROUPGATE_FLEET_TLS_CERT_FILE=certs["cert"],
                                        GROUPGATE_FLEET_TLS_KEY_FILE=certs["key"])))
    first_bytes: list[int] = []

    async def record(stream: trio.SocketStream) -> None:
        data = await stream.receive_some(1)
        first_bytes.append(data[0])
        await stream.aclose()  # no answer: the request fails

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, record, 0, host="127.0.0.1"))
        address = ("127.0.0.1", listener.socket.getsockname()[1])
        pool = LinkPool(connect_timeout=5, request_timeout=5, max_frame_bytes=1 << 20,
                        security=security)
        assert pool.link(address).leads_to == BROKER
        assert pool.dedicated(address, 5).leads_to == BROKER
        links = ConnectionLinks(pool)
        for to_peer in (True, False):
            with pytest.raises(UpstreamError):
                await links.request(address, ApiKey.JOIN_GROUP, 5, {}, "app", to_peer=to_peer)
        await links.aclose()
        nursery.cancel_scope.cancel()
    assert first_bytes[0] == 0x16  # the peer link started TLS
    assert first_bytes[1] == 0  # the broker link sent a frame (its length's first byte)
