"""Spark in the test bed: pyspark 4.2.0 with its Kafka connector jars from Maven Central.

pyspark (the optional ``report`` extra) ships Spark's jars but not the Kafka source and sink.
Those come as a bundle resolved by :mod:`tests.testbed.artifacts`, like the Kafka jars: the
connector, its token provider, ``kafka-clients`` and ``commons-pool2`` and nothing else, since
their other dependencies (Hadoop client, Scala, lz4, snappy, slf4j) are already in pyspark's
jars. :func:`local_session` starts a small local Spark that loads them through ``spark.jars``
(local paths, no Ivy resolution at start-up). See ``docs/decisions/0009-spark-in-the-test-bed.md``.

    from tests.testbed.spark import local_session
    spark = local_session("my-test")

:func:`standalone_cluster` starts a Spark standalone cluster from the installed pyspark's own
scripts: a master and workers (one core each by default) on 127.0.0.1 at free ports, each in
its own process group, stopped and their work directories removed on exit. Executors run on
the workers, so a job's tasks run in JVMs the driver did not start:

    with standalone_cluster(workers=2) as cluster:
        spark = local_session("my-test", master=cluster.master_url)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.testbed import artifacts
from tests.testbed.broker import free_ports

__all__ = [
    "CONNECTOR_COORDINATES",
    "SPARK_VERSION",
    "StandaloneCluster",
    "connector_jars",
    "fetch_main",
    "jvm_pid",
    "local_session",
    "standalone_cluster",
    "stop_session",
]

SPARK_VERSION = "4.2.0"
CONNECTOR_COORDINATES: tuple[str, ...] = (
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-token-provider-kafka-0-10_2.13:{SPARK_VERSION}",
    "org.apache.kafka:kafka-clients:3.9.2",
    "org.apache.commons:commons-pool2:2.13.1",
)
# Every transitive dependency is left out: the four jars above are all pyspark lacks.
_EXCLUSIONS = ("*:*",)

SESSION_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "768m",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
}


def connector_jars(*, offline: bool = False) -> list[Path]:
    """The Kafka connector jars for Spark (resolved with Maven on first use, then cached)."""
    return artifacts.classpath(
        f"spark-sql-kafka-{SPARK_VERSION}", CONNECTOR_COORDINATES, _EXCLUSIONS, offline=offline
    )


def local_session(app_name: str, *, master: str = "local[2]",
                  conf: Mapping[str, str] | None = None) -> Any:
    """Start (or return the running) local ``SparkSession`` with the Kafka connector loaded.

    Binds every Spark endpoint to 127.0.0.1 (``SPARK_LOCAL_IP`` as well, for the launcher),
    turns the UI off and keeps shuffles small. Returns a ``pyspark.sql.SparkSession``.
    """
    from pyspark.sql import SparkSession

    artifacts.require_java()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    jars = ",".join(str(jar) for jar in connector_jars())
    builder = SparkSession.builder.master(master).appName(app_name).config("spark.jars", jars)
    for key, value in {**SESSION_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def stop_session(session: Any, timeout: float = 30.0) -> None:
    """Stop the session and end its JVM.

    ``SparkSession.stop()`` alone leaves the JVM running (idle, about 0.5 GB) until the Python
    process exits, which in a test run is the end of the whole suite. The JVM's gateway exits
    when its standard input closes; it is killed if it has not within ``timeout`` seconds.
    """
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = gateway.proc
    SparkContext._gateway = None
    SparkContext._jvm = None
    gateway.shutdown()
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def jvm_pid(session: Any) -> int:
    """The process id of the session's JVM (the launcher script execs ``java`` in place)."""
    gateway = session.sparkContext._gateway
    pid = int(gateway.proc.pid)
    exe = os.readlink(f"/proc/{pid}/exe")
    if not os.path.basename(exe).startswith("java"):
        raise RuntimeError(f"Spark's launcher process {pid} is {exe}, not a JVM")
    return pid


def spark_home() -> Path:
    """The installed pyspark's directory, which holds Spark's ``bin/`` scripts and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class StandaloneCluster:
    """A running standalone cluster (see :func:`standalone_cluster`)."""

    master_url: str
    """``spark://127.0.0.1:PORT``, the ``--master`` of a job."""
    ui_url: str
    """The master's web UI, ``http://127.0.0.1:PORT``; ``/json/`` is its state as JSON."""
    base: Path
    """Where the logs and the workers' work directories are."""
    work_dirs: list[Path] = field(default_factory=list)
    """One per worker: ``APP_ID/EXECUTOR_ID/stderr`` holds an executor's log."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` document: ``aliveworkers``, ``activeapps``,
        ``completedapps`` (each with ``id``, ``cores``, ``state``, ...)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=10) as reply:
            data: dict[str, Any] = json.load(reply)
        return data

    def executor_logs(self, app_id: str) -> dict[Path, str]:
        """Each worker's executor logs (``stderr``) for ``app_id``, by path."""
        return {log: log.read_text(errors="replace")
                for work in self.work_dirs for log in sorted(work.glob(f"{app_id}/*/stderr"))}


def _spark_class(cls: str, args: list[str], log: Path, env: dict[str, str]
                 ) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), cls, *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM the process group started for ``proc`` (the daemon and, for a worker, its
    executors), SIGKILL it if it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def standalone_cluster(workers: int = 2, *, cores: int = 1, memory: str = "1g",
                       daemon_memory: str = "256m", base: Path | None = None,
                       start_timeout: float = 90.0) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and ``workers`` workers of ``cores`` cores and ``memory``
    each (what executors may use; give jobs ``spark.executor.memory`` at most that), started
    with the installed pyspark's ``spark-class`` on 127.0.0.1 at free ports. Yields once every
    worker has registered; on exit stops the workers (and their executors) and the master and
    removes ``base`` (a temporary directory unless given, then kept)."""
    artifacts.require_java()
    own_base = base is None
    root = Path(tempfile.mkdtemp(prefix="spark-standalone-")) if base is None else base
    root.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_ports(2)
    env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_DAEMON_MEMORY=daemon_memory, PYSPARK_PYTHON=sys.executable,
               SPARK_LOG_DIR=str(root / "logs"), SPARK_NO_DAEMONIZE="1")
    env.pop("SPARK_CONF_DIR", None)
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}",
                                root)
    try:
        cluster.processes.append(_spark_class(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
            root / "master.log", env))
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            cluster.work_dirs.append(work)
            cluster.processes.append(_spark_class(
                "org.apache.spark.deploy.worker.Worker",
                ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores",
                 str(cores), "--memory", memory, "--work-dir", str(work), cluster.master_url],
                root / f"worker-{i}.log", env))
        deadline = time.monotonic() + start_timeout
        while True:
            for proc in cluster.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with {proc.returncode}; see "
                                       f"{root}/*.log")
            with contextlib.suppress(OSError, ValueError):
                if cluster.state().get("aliveworkers") == workers:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{workers} Spark workers did not register within "
                                   f"{start_timeout:.0f} s; see {root}/*.log")
            time.sleep(0.5)
        yield cluster
    finally:
        for proc in reversed(cluster.processes):
            _stop(proc)
        if own_base:
            shutil.rmtree(root, ignore_errors=True)


def fetch_main() -> int:
    """Resolve the connector bundle into the cache (what ``dev/fetch-spark`` runs)."""
    artifacts.require_java()
    jars = connector_jars()
    size = sum(jar.stat().st_size for jar in jars)
    print(f"Spark {SPARK_VERSION} Kafka connector: {len(jars)} jars, "
          f"{size / 1e6:.1f} MB  {jars[0].parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(fetch_main())
