"""Shared pytest fixtures: real Kafka brokers from the test bed (``tests.testbed``).

Fixtures: ``kafka39`` (single-node 3.9.2), ``kafka4`` (single-node 4.4.0), ``broker``
(parametrized over both lines), ``kafka39_cluster`` (3 nodes), ``secured_kafka39`` and
``secured_kafka4`` (single nodes with a SASL_SSL listener, SCRAM users and ACLs,
:func:`tests.testbed.security.secured`), ``kafka_factory`` (dedicated clusters with custom
settings), ``topic`` (a factory of uniquely named topics).

Brokers are cached across tests by a small pool that keeps at most ``GROUPGATE_MAX_BROKER_SETS``
(default 1) broker sets running, so a 2-core machine never runs more JVMs than needed; tests are
grouped by the set they use, and a set that a test broke (a node stopped or killed) is rebuilt
for the next test. Tests using these fixtures get the ``broker`` marker automatically;
``--no-brokers`` or ``GROUPGATE_NO_BROKERS=1`` skips them. When such a test fails, the logs of
the brokers it used are copied to ``test-logs/<test id>/`` in the repository root.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testbed.broker import KafkaBroker, KafkaCluster, kill_all
from tests.testbed.security import secured

BROKER_FIXTURES = frozenset({"kafka39", "kafka4", "broker", "kafka39_cluster", "kafka_factory",
                             "secured_kafka39", "secured_kafka4"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        default=False,
        help="also run the long scenarios marked slow (also: GROUPGATE_RUN_SLOW=1)",
    )
    parser.addoption(
        "--no-brokers",
        action="store_true",
        default=False,
        help="skip tests that need real Kafka brokers (also: GROUPGATE_NO_BROKERS=1)",
    )


def _switch(config: pytest.Config, option: str, variable: str) -> bool:
    """A command-line switch, or its environment variable set to anything but 0/false/no."""
    env = os.environ.get(variable, "").lower() not in ("", "0", "false", "no")
    return bool(config.getoption(option)) or env


def _no_brokers(config: pytest.Config) -> bool:
    return _switch(config, "--no-brokers", "GROUPGATE_NO_BROKERS")


def _run_slow(config: pytest.Config) -> bool:
    return _switch(config, "--run-slow", "GROUPGATE_RUN_SLOW")


def _broker_key(item: pytest.Item) -> str:
    """Which pooled broker set a test uses ("" for none), to run tests grouped by it."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if "broker" in names and callspec is not None and "broker" in callspec.params:
        return str(callspec.params["broker"])
    for fixture, key in (
        ("kafka39", "3.9"),
        ("kafka4", "4.4"),
        ("kafka39_cluster", "3.9x3"),
        ("secured_kafka39", "3.9-sasl-ssl"),
        ("secured_kafka4", "4.4-sasl-ssl"),
        ("kafka_factory", "factory"),
    ):
        if fixture in names:
            return key
    return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="real brokers disabled (--no-brokers / GROUPGATE_NO_BROKERS)")
    slow = pytest.mark.skip(reason="a long scenario: ./dev/test --run-slow (GROUPGATE_RUN_SLOW=1)")
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
        if _no_brokers(config) and item.get_closest_marker("broker") is not None:
            item.add_marker(skip)
        if item.get_closest_marker("slow") is not None and not _run_slow(config):
            item.add_marker(slow)
    # Group tests by broker set (stable: the order within a group is kept), so that the pool
    # starts each set once instead of switching back and forth. A module's tests that need no
    # broker run with its first broker set's tests, so that its module-scoped fixtures (a Spark
    # session) start once.
    order = {"": 0, "3.9": 1, "4.4": 2, "3.9x3": 3, "3.9-sasl-ssl": 4, "4.4-sasl-ssl": 5,
             "factory": 6}
    module_rank: dict[str, int] = {}
    for item in items:
        key = _broker_key(item)
        if key:
            module = item.nodeid.split("::", 1)[0]
            rank = order.get(key, 6)
            module_rank[module] = min(module_rank.get(module, rank), rank)

    def rank_of(item: pytest.Item) -> int:
        key = _broker_key(item)
        if key:
            return order.get(key, 6)
        return module_rank.get(item.nodeid.split("::", 1)[0], 0)

    items.sort(key=rank_of)


# ---------------------------------------------------------------------------------------------
# A pool of running broker sets


class BrokerPool:
    """Keeps broker sets between tests, at most ``max_live`` running at once (LRU eviction)."""

    def __init__(self, base: Path, max_live: int) -> None:
        self.base = base
        self.max_live = max(1, max_live)
        self.live: OrderedDict[str, KafkaCluster] = OrderedDict()
        self.pinned: dict[str, int] = {}
        """Sets in use, by how many users (a test and a module fixture may share one)."""
        self.factories: dict[str, Callable[[Path], KafkaCluster]] = {
            "3.9": lambda d: KafkaBroker.start("3.9", d),
            "4.4": lambda d: KafkaBroker.start("4.4", d),
            "3.9x3": lambda d: KafkaCluster.start("3.9", d, size=3, heap="384m"),
            "3.9-sasl-ssl": lambda d: secured("3.9", d),
            "4.4-sasl-ssl": lambda d: secured("4.4", d),
        }
        self.starts: dict[str, list[float]] = {}

    def acquire(self, key: str) -> KafkaCluster:
        cluster = self.live.get(key)
        if cluster is not None and not cluster.alive:
            self._drop(key)
            cluster = None
        if cluster is None:
            while len(self.live) >= self.max_live:
                victim = next((k for k in self.live if k not in self.pinned), None)
                if victim is None:
                    break
                self._drop(victim)
            workdir = self.base / f"kafka-{key}-{uuid.uuid4().hex[:6]}"
            workdir.mkdir(parents=True)
            try:
                cluster = self.factories[key](workdir)
            except Exception:
                shutil.copytree(
                    workdir,
                    _log_root() / f"startup-{workdir.name}",
                    ignore=shutil.ignore_patterns("data"),
                    dirs_exist_ok=True,
                )
                raise
            self.starts.setdefault(key, []).append(cluster.startup_seconds or 0.0)
            self.live[key] = cluster
        self.live.move_to_end(key)
        self.pinned[key] = self.pinned.get(key, 0) + 1
        return cluster

    def release(self, key: str) -> None:
        count = self.pinned.pop(key, 0) - 1
        if count > 0:
            self.pinned[key] = count

    def _drop(self, key: str) -> None:
        cluster = self.live.pop(key)
        cluster.stop(timeout=10)
        shutil.rmtree(cluster.workdir, ignore_errors=True)

    def close(self) -> None:
        for key in list(self.live):
            self._drop(key)
        kill_all()


_LOG_ROOT: list[Path] = []


def _log_root() -> Path:
    return _LOG_ROOT[0] if _LOG_ROOT else Path("test-logs")


@pytest.fixture(scope="session")
def broker_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerPool]:
    _LOG_ROOT[:] = [request.config.rootpath / "test-logs"]
    pool = BrokerPool(
        tmp_path_factory.mktemp("brokers"), int(os.environ.get("GROUPGATE_MAX_BROKER_SETS", "1"))
    )
    try:
        yield pool
    finally:
        pool.close()
        if pool.starts:
            summary = ", ".join(
                f"{k}: {len(v)}x, {sum(v) / len(v):.1f}s" for k, v in sorted(pool.starts.items())
            )
            request.config.stash[_STARTS_KEY] = summary


_STARTS_KEY = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    summary = config.stash.get(_STARTS_KEY, None)
    if summary:
        terminalreporter.write_line(f"Kafka test bed broker starts: {summary}")


def _pooled(pool: BrokerPool, key: str) -> Iterator[KafkaCluster]:
    cluster = pool.acquire(key)
    try:
        yield cluster
    finally:
        pool.release(key)


@pytest.fixture
def kafka39(broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    """A running single-node Kafka 3.9.2 (classic group coordinator), shared between tests."""
    for cluster in _pooled(broker_pool, "3.9"):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


@pytest.fixture
def kafka4(broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    """A running single-node Kafka 4.4.0 (native KIP-848 consumer groups), shared."""
    for cluster in _pooled(broker_pool, "4.4"):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


@pytest.fixture(params=["3.9", "4.4"], ids=["kafka3.9", "kafka4.4"])
def broker(request: pytest.FixtureRequest) -> KafkaBroker:
    """Each test runs once against a 3.9 and once against a 4.4 single-node broker."""
    name = "kafka39" if request.param == "3.9" else "kafka4"
    result: KafkaBroker = request.getfixturevalue(name)
    return result


@pytest.fixture
def secured_kafka39(broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    """A single-node Kafka 3.9.2 with a SASL_SSL listener (``secure_bootstrap``), SCRAM and
    PLAIN users, the standard authorizer and ACLs (:func:`tests.testbed.security.secured`)."""
    for cluster in _pooled(broker_pool, "3.9-sasl-ssl"):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


@pytest.fixture
def secured_kafka4(broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    """The same with Kafka 4.4.0 (native KIP-848 groups), the reference."""
    for cluster in _pooled(broker_pool, "4.4-sasl-ssl"):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


@pytest.fixture
def kafka39_cluster(broker_pool: BrokerPool) -> Iterator[KafkaCluster]:
    """Three combined KRaft nodes (ids 1-3) of Kafka 3.9.2; rebuilt if a test left one down."""
    yield from _pooled(broker_pool, "3.9x3")


class KafkaFactory:
    """Starts dedicated (not pooled) clusters with custom settings; stops them at teardown."""

    def __init__(self, pool: BrokerPool, base: Path) -> None:
        self.pool = pool
        self.base = base
        self.clusters: list[KafkaCluster] = []

    def __call__(self, version: str, size: int = 1, **kwargs: Any) -> KafkaCluster:
        # keep the machine to one running broker set: park the pooled ones first
        for key in list(self.pool.live):
            if key not in self.pool.pinned:
                self.pool._drop(key)
        workdir = self.base / f"kafka-{version}-x{size}-{len(self.clusters)}"
        if size == 1:
            cluster: KafkaCluster = KafkaBroker.start(version, workdir, **kwargs)
        else:
            kwargs.setdefault("heap", "384m")
            cluster = KafkaCluster.start(version, workdir, size=size, **kwargs)
        self.clusters.append(cluster)
        return cluster

    def stop_all(self) -> None:
        for cluster in self.clusters:
            cluster.stop(timeout=10)


@pytest.fixture
def kafka_factory(broker_pool: BrokerPool, tmp_path: Path) -> Iterator[KafkaFactory]:
    """``kafka_factory("4.4", size=1, consumer_heartbeat_ms=500, ...)``: a cluster of its own
    for tests that need non-default broker settings; stopped after the test."""
    factory = KafkaFactory(broker_pool, tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """``topic(cluster, partitions=1, replication_factor=1, **kw) -> name``: a fresh topic,
    deleted after the test if its cluster is still up."""
    created: list[tuple[KafkaCluster, str]] = []
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:80].strip("-")

    def make(
        cluster: KafkaCluster, partitions: int = 1, replication_factor: int = 1, **kwargs: Any
    ) -> str:
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(name, partitions, replication_factor, **kwargs)
        created.append((cluster, name))
        return name

    yield make
    for cluster, name in created:
        if cluster.alive:
            # clean-up only: the next test uses fresh names anyway
            with contextlib.suppress(Exception):
                cluster.delete_topic(name, timeout=15)


# ---------------------------------------------------------------------------------------------
# Keep broker logs of failing tests


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and report.when in ("setup", "call"):
        funcargs = getattr(item, "funcargs", {})
        clusters = {id(v): v for v in funcargs.values() if isinstance(v, KafkaCluster)}
        for value in funcargs.values():
            if isinstance(value, KafkaFactory):
                clusters.update((id(c), c) for c in value.clusters)
        if clusters:
            safe = re.sub(r"[^A-Za-z0-9._-]+", "_", item.nodeid)[-150:]
            dest = item.config.rootpath / "test-logs" / safe
            for cluster in clusters.values():
                cluster.copy_logs(dest / f"kafka{cluster.line.name}-x{cluster.size}")
            report.sections.append(("broker logs", f"copied to {dest}"))
    return report
