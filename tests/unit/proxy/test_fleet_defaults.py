"""A sidecar started with default settings can be followed: its fleet listener is on (every
address, port 9191) and its card carries the pod's own address. Before, two sidecars with
default settings in front of one broker served one group's members behind only one of them
(the other's got COORDINATOR_NOT_AVAILABLE forever: the holder's card had no address)."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from proxy import config
from proxy.config import FLEET_PORT, ConfigError, host_address, load, resolve_fleet

BASE = {"GROUPGATE_UPSTREAM": "10.9.8.7:9092"}


def test_the_fleet_listener_is_on_by_default_and_advertises_the_host_s_address() -> None:
    loaded = load(None, BASE)
    assert loaded.fleet_listen == ("0.0.0.0", FLEET_PORT) and loaded.fleet_listen_defaulted
    advertised = loaded.advertised_fleet_address
    assert advertised == (host_address("10.9.8.7"), FLEET_PORT)
    assert advertised[0] not in ("0.0.0.0", "")  # never the wildcard


def test_the_pod_ip_alone_is_a_fleet_address_with_fleet_listen_s_port() -> None:
    loaded = load(None, dict(BASE, GROUPGATE_FLEET_ADDRESS="10.1.2.3"))
    assert loaded.advertised_fleet_address == ("10.1.2.3", FLEET_PORT)
    v6 = load(None, dict(BASE, GROUPGATE_FLEET_ADDRESS="fd00::5",
                         GROUPGATE_FLEET_LISTEN="[::]:9300"))
    assert v6.advertised_fleet_address == ("fd00::5", 9300)
    explicit = load(None, dict(BASE, GROUPGATE_FLEET_ADDRESS="10.1.2.3:9999"))
    assert explicit.advertised_fleet_address == ("10.1.2.3", 9999)
    specific = load(None, dict(BASE, GROUPGATE_FLEET_LISTEN="10.1.2.4:9191"))
    assert specific.advertised_fleet_address == ("10.1.2.4", 9191)
    assert not specific.fleet_listen_defaulted


def test_off_still_means_no_fleet_listener() -> None:
    loaded = load(None, dict(BASE, GROUPGATE_FLEET_LISTEN="off"))
    assert loaded.fleet_listen is None and loaded.advertised_fleet_address is None
    with pytest.raises(ConfigError, match="ephemeral port"):
        load(None, dict(BASE, GROUPGATE_FLEET_LISTEN="127.0.0.1:0"))


def test_the_host_s_address_is_its_route_toward_the_brokers() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.9.8.7", 9))
        expected = probe.getsockname()[0]
    assert host_address("10.9.8.7") == expected
    # brokers on the loopback (./dev/up): not the loopback, if the host has any other route
    assert host_address("127.0.0.1") == host_address(config.NO_ROUTE_TARGET) or (
        host_address("127.0.0.1") == "127.0.0.1")


def test_a_default_fleet_port_already_taken_on_this_host_gives_way_to_a_free_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        defaulted = dataclasses.replace(load(None, BASE), fleet_listen=("127.0.0.1", port))
        moved = resolve_fleet(defaulted)
        assert moved.fleet_listen is not None and moved.fleet_listen[1] not in (0, port)
        assert moved.advertised_fleet_address == ("127.0.0.1", moved.fleet_listen[1])
        assert "taken" in moved.fleet_note
        explicit = load(None, dict(BASE, GROUPGATE_FLEET_LISTEN=f"127.0.0.1:{port}"))
        assert resolve_fleet(explicit) is explicit  # fails at the bind, as it always did


def test_the_default_listener_stays_off_where_the_fleet_s_security_is_incomplete() -> None:
    sasl_plain = dict(BASE, GROUPGATE_SECURITY_PROTOCOL="SASL_PLAINTEXT",
                      GROUPGATE_SASL_MECHANISM="PLAIN", GROUPGATE_SASL_USERNAME="u",
                      GROUPGATE_SASL_PASSWORD="p")
    loaded = load(None, sasl_plain)  # a single sidecar on a SASL/PLAIN cluster still starts
    assert loaded.fleet_listen is None
    assert "PLAIN" in loaded.fleet_note and "fleet-listen" in loaded.fleet_note
    with pytest.raises(ConfigError, match="PLAIN"):
        load(None, dict(sasl_plain, GROUPGATE_FLEET_LISTEN="0.0.0.0:9191"))
    scram = dict(sasl_plain, GROUPGATE_SASL_MECHANISM="SCRAM-SHA-512")
    assert load(None, scram).fleet_listen == ("0.0.0.0", FLEET_PORT)  # fleet-auth sasl


def test_the_default_listener_stays_off_where_member_sessions_are_too_short_for_a_fleet() -> None:
    short = dict(BASE, GROUPGATE_GROUP_SESSION_TIMEOUT_MS="6000",
                 GROUPGATE_GROUP_HEARTBEAT_INTERVAL_MS="1000")
    loaded = load(None, short)  # a single sidecar with short sessions still starts
    assert loaded.fleet_listen is None and "group-session-timeout-ms" in loaded.fleet_note
    with pytest.raises(ConfigError, match="group-session-timeout-ms"):
        load(None, dict(short, GROUPGATE_FLEET_LISTEN="0.0.0.0:9191"))
