"""The test bed's older Kafka lines for the compatibility run: 3.3 and 3.6 run like 3.9
(KRaft, combined nodes), 2.8 in ZooKeeper mode with a ZooKeeper server from its own bundle.
Checked on the written configuration and commands (no JVM starts here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testbed import artifacts
from tests.testbed.broker import KafkaCluster
from tests.testbed.distributions import KAFKA28, KAFKA39, get_line


def properties(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line)


@pytest.mark.parametrize("name", ["3.3", "3.6"])
def test_older_kraft_lines_run_like_3_9(tmp_path: Path, name: str) -> None:
    line = get_line(name)
    assert line.version.startswith(name + ".") and not line.zookeeper
    assert f"org.apache.kafka:kafka_2.13:{line.version}" in line.broker_coordinates
    assert line.tools_coordinates == KAFKA39.tools_coordinates
    cluster = KafkaCluster(name, tmp_path)
    cluster._build_nodes()
    props = properties(cluster.nodes[1].config_file)
    assert props["process.roles"] == "broker,controller" and "zookeeper.connect" not in props
    assert cluster.zookeeper is None


def test_2_8_runs_in_zookeeper_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the command is built without resolving the bundle or looking for Java
    monkeypatch.setattr(artifacts, "classpath", lambda *_a, **_k: [Path("kafka.jar")])
    monkeypatch.setattr(artifacts, "require_java", lambda *_a: "java")
    assert get_line("2.8") is KAFKA28 and KAFKA28.zookeeper
    cluster = KafkaCluster("2.8", tmp_path)
    cluster._build_nodes()
    zookeeper = cluster.zookeeper
    assert zookeeper is not None
    props = properties(cluster.nodes[1].config_file)
    assert props["zookeeper.connect"] == f"127.0.0.1:{zookeeper.port}"
    assert props["broker.id"] == "1" and props["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT")
    assert not {"process.roles", "node.id", "controller.quorum.voters",
                "broker.session.timeout.ms"} & set(props)
    command = zookeeper.command()
    main = command.index("org.apache.zookeeper.server.ZooKeeperServerMain")
    assert command[main + 1:] == [str(zookeeper.port), str(zookeeper.data_dir)]
    assert "-Dzookeeper.admin.enableServer=false" in command


def test_the_major_version_still_names_the_current_lines() -> None:
    assert get_line("3") is KAFKA39 and get_line("3.9.2") is KAFKA39
    assert get_line("4").name == "4.4"
