"""Settings have one name across flags, environment and file, with that precedence."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from proxy import config


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    path = tmp_path / "groupgate.toml"
    path.write_text('upstream = ["b1:9093", "b2"]\nmax-in-flight = 7\nshutdown-grace = 3\n')
    env = {"GROUPGATE_CONFIG": str(path), "GROUPGATE_MAX_IN_FLIGHT": "9"}
    cfg = config.load(parse(["--shutdown-grace", "1.5"]), env)
    assert cfg.upstream == (("b1", 9093), ("b2", 9092))
    assert cfg.max_in_flight == 9
    assert cfg.shutdown_grace == 1.5
    assert cfg.sources["max_in_flight"] == "GROUPGATE_MAX_IN_FLIGHT"
    assert cfg.sources["upstream"].endswith(":upstream")


def test_missing_upstream_is_a_clear_error() -> None:
    with pytest.raises(config.ConfigError, match="upstream is required"):
        config.load(parse([]), {})


def test_bad_value_names_setting_and_source() -> None:
    with pytest.raises(config.ConfigError, match=r"max-frame-bytes='-5' from GROUPGATE_MAX_FRAME"):
        config.load(parse(["--upstream", "k:1"]), {"GROUPGATE_MAX_FRAME_BYTES": "-5"})


def test_unknown_file_key_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('upstream = "k:1"\nmax_frame_bytes = 5\n')
    with pytest.raises(config.ConfigError, match="unknown settings"):
        config.load(parse(["--config", str(path)]), {})


def test_broker_port_rule() -> None:
    cfg = config.load(parse(["--upstream", "k:1", "--listen", "127.0.0.1:9092"]), {})
    assert [cfg.broker_port(n) for n in (0, 1, 3)] == [9093, 9094, 9096]
    cfg = config.load(parse(["--upstream", "k:1", "--broker-port-base", "19000"]), {})
    assert cfg.broker_port(2) == 19002
    cfg = config.load(parse(["--upstream", "k:1", "--listen", "127.0.0.1:0"]), {})
    assert cfg.broker_port(5) == 0


def test_configuration_doc_lists_every_setting() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    for setting in config.SETTINGS:
        assert f"`--{setting.name}`" in doc and f"`{setting.env}`" in doc, setting.name


def test_versions_the_proxy_offers() -> None:
    from proxy.router import parse_table

    table = parse_table()
    assert table[1][1] == 15  # Fetch without KIP-951 node endpoints by default
    assert parse_table(fetch_node_endpoints=True)[1][1] >= 16
    assert not {76, 77, 78, 79} & set(table)  # share-group responses would leak addresses
    assert table[17][0] == 1  # SaslHandshake v0 is followed by unframed tokens
    assert table[3] == (0, 13) and table[0][0] == 0


def test_a_fleet_refuses_member_sessions_a_failover_could_outlast() -> None:
    """docs/operations.md, "How long a request can wait": with a fleet listener, a member may
    go unanswered for a heartbeat interval + broker-session-timeout-ms (until the broker drops
    a dead holder's member) + the takeover + the wait at its own sidecar; a session that does
    not cover that and a margin is refused, naming the settings. 9 s sessions with 1 s
    heartbeats were accepted before although a holder's SIGKILL leaves members unanswered for
    longer (docs/benchmarks/fleet.md)."""
    fleet = ["--upstream", "k:1", "--fleet-listen", "10.0.0.5:9095",
             "--group-heartbeat-interval-ms", "1000"]
    with pytest.raises(config.ConfigError, match=r"group-session-timeout-ms=9000 is too short"
                                                 r".*broker-session-timeout-ms=6000"
                                                 r".*= 18000 ms"):
        config.load(parse([*fleet, "--group-session-timeout-ms", "9000"]), {})
    with pytest.raises(config.ConfigError, match=r"group-session-timeout-ms=17999"):
        config.load(parse([*fleet, "--group-session-timeout-ms", "17999"]), {})
    cfg = config.load(parse([*fleet, "--group-session-timeout-ms", "18000"]), {})
    assert cfg.group_session_timeout_ms == 18000 and cfg.fleet_listen == ("10.0.0.5", 9095)
    # a longer broker session needs a longer member session, by as much
    with pytest.raises(config.ConfigError, match=r"broker-session-timeout-ms=9000.*= 21000 ms"):
        config.load(parse([*fleet, "--group-session-timeout-ms", "18000",
                           "--broker-session-timeout-ms", "9000"]), {})
    cfg = config.load(parse([*fleet, "--group-session-timeout-ms", "21000",
                             "--broker-session-timeout-ms", "9000"]), {})
    assert cfg.broker_session_timeout_ms == 9000
    # without a fleet nothing fails over between sidecars: Kafka's own rule (the default run)
    single = config.load(parse(["--upstream", "k:1", "--group-session-timeout-ms", "6000"]), {})
    assert single.group_session_timeout_ms == 6000


def test_the_default_fleet_listener_stays_off_with_sessions_a_failover_outlasts() -> None:
    cfg = config.load(parse(["--upstream", "k:1", "--group-session-timeout-ms", "10000",
                             "--group-heartbeat-interval-ms", "1000"]), {})
    assert cfg.fleet_listen is None
    assert "group-session-timeout-ms=10000 is too short" in cfg.fleet_note
    assert "broker-session-timeout-ms=6000" in cfg.fleet_note
    defaults = config.load(parse(["--upstream", "k:1"]), {})
    assert defaults.fleet_listen is not None and not defaults.fleet_note
    assert defaults.group_session_timeout_ms >= config.shortest_fleet_session_ms(
        defaults.group_heartbeat_interval_ms, defaults.broker_session_timeout_ms)


def test_the_fleet_wait_is_what_a_follower_may_take() -> None:
    from proxy.coordination.peers import LOOKUP_SECONDS
    from proxy.kafka_client.links import PEER_CONNECT_SECONDS

    assert int(1000 * (LOOKUP_SECONDS + PEER_CONNECT_SECONDS)) == config.FLEET_WAIT_MS


def test_configuration_doc_says_what_each_setting_does() -> None:
    """Each row of docs/configuration.md carries the setting's own help text and default."""
    import re

    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    for setting in config.SETTINGS:
        row = re.search(rf"^\| `--{re.escape(setting.name)}` \| `{re.escape(setting.env)}` \| "
                        r"`([^`]*)` \| (.*) \|$", doc, re.M)
        assert row is not None, setting.name
        if setting.default is not None:
            assert row.group(1) == str(setting.default), setting.name
        assert row.group(2) == setting.help, setting.name


def test_the_departure_wait_reaches_the_engine() -> None:
    """classic-departure-wait-ms is the engine's departure wait (10 s unless set; 0: off)."""
    from proxy.coordination.service import group_config

    cfg = config.load(parse(["--upstream", "k:1"]), {})
    assert group_config(cfg).classic_departure_wait_ms == 10_000
    cfg = config.load(parse(["--upstream", "k:1"]), {"GROUPGATE_CLASSIC_DEPARTURE_WAIT_MS": "0"})
    assert group_config(cfg).classic_departure_wait_ms == 0
