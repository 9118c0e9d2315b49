"""Spark in the test bed: pyspark 4.2.0 with its Kafka connector jars from Maven Central.

pyspark (the optional ``report`` extra) ships Spark's jars but not the Kafka source and sink.
Those come as a bundle resolved by :mod:`tests.testbed.artifacts`, like the Kafka jars: the
connector, its token provider, ``kafka-clients`` and ``commons-pool2`` and nothing else, since
their other dependencies (Hadoop client, Scala, lz4, snappy, slf4j) are already in pyspark's
jars. :func:`local_session` starts a small local Spark that loads them through ``spark.jars``
(local paths, no Ivy resolution at start-up). See ``docs/decisions/0009-spark-in-the-test-bed.md``.

    from tests.testbed.spark import local_session
    spark = local_session("my-test")
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.testbed import artifacts

__all__ = [
    "CONNECTOR_COORDINATES",
    "SPARK_VERSION",
    "connector_jars",
    "fetch_main",
    "jvm_pid",
    "local_session",
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
