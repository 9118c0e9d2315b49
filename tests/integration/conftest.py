"""Fixtures for tests that run groupgate itself in front of test-bed brokers.

``start_proxy(cluster, *flags)`` starts ``groupgate run`` as a child process in front of a
cluster and stops it after the test; a failing test gets the proxy's log copied next to the
broker logs in ``test-logs/``. ``members``: a list the test appends the group members it
starts to (``tests/integration/members.py``), each stopped after the test.
``kubernetes_cluster``: the test bed's real Kubernetes (slow tests only). ``spark_sessions``:
the one local Spark session a process may run (:class:`SparkSessions`): the report modules
share one, a module that must have a JVM of its own asks for its own.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.members import Member
from tests.testbed.broker import KafkaCluster

StartProxy = Callable[..., ProxyProcess]


@pytest.fixture
def start_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StartProxy]:
    started: list[ProxyProcess] = []

    def start(cluster: KafkaCluster, *flags: str) -> ProxyProcess:
        log = tmp_path / f"groupgate-{len(started)}.log"
        proxy = ProxyProcess.start(cluster.bootstrap, log, args=flags)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
    keep_if_failed(request, [proxy.log_file for proxy in started])


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m.stop()


def keep_if_failed(request: pytest.FixtureRequest, paths: list[Path]) -> None:
    """Copy ``paths`` (logs of what the test started) to test-logs/<test id>/ if it failed."""
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.failed:
        return
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", request.node.nodeid)[-150:]
    dest = request.config.rootpath / "test-logs" / safe
    dest.mkdir(parents=True, exist_ok=True)
    for path in paths:
        if path.exists():
            shutil.copy(path, dest / path.name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@pytest.fixture(scope="session")
def kubernetes_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real single-node Kubernetes (:mod:`tests.testbed.kubernetes`) with the groupgate
    images imported, for the session; built on first use (about 8 minutes, then cached).
    Only for tests marked ``slow``. Skips where the machine cannot build or run it (no Go
    toolchain, not root, no apt-get), saying why."""
    from tests.testbed import kubernetes

    ok, why = kubernetes.available()
    if not ok:
        pytest.skip(f"no Kubernetes test bed: {why}")
    with kubernetes.running(tmp_path_factory.mktemp("kubernetes")) as cluster:
        yield cluster


class SparkSessions:
    """The local Spark session of this test process (pyspark runs one per process).

    :meth:`shared` is one session (``local[2]``, UTC) that the modules running ``groupgate
    report`` share, so that its JVM starts and warms up once; :meth:`own` stops it and
    starts a fresh one (a module that watches the JVM's own sockets, or wants a clean one);
    :meth:`close` stops whichever runs (the next :meth:`shared` starts one again)."""

    SHARED = "shared"

    def __init__(self) -> None:
        self.key: str | None = None
        self.session: Any = None

    def shared(self) -> Any:
        return self._get(self.SHARED, "groupgate-tests", {"spark.sql.session.timeZone": "UTC"})

    def own(self, app_name: str, conf: dict[str, str] | None = None) -> Any:
        self.close()
        return self._get(app_name, app_name, conf or {})

    def _get(self, key: str, app_name: str, conf: dict[str, str]) -> Any:
        from tests.testbed.spark import local_session

        if self.key != key:
            self.close()
            self.session = local_session(app_name, master="local[2]", conf=conf)
            self.key = key
        return self.session

    def close(self) -> None:
        from tests.testbed.spark import stop_session

        if self.session is not None:
            session, self.session, self.key = self.session, None, None
            stop_session(session)


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    sessions = SparkSessions()
    try:
        yield sessions
    finally:
        sessions.close()
