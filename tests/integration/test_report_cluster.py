"""``groupgate report`` on a Spark standalone cluster: a master and two 1-core workers of the
installed pyspark (``tests.testbed.spark.standalone_cluster``), the journal read from a Kafka
3.9 topic through Spark's Kafka source by executors on the workers.

The cluster's output must be the local run's: every table and ``summary.json`` but for its
timings (``dev/bench report-diff``; percentiles are exact, so they do not depend on how the
work was split). That the workers did the work is read from the master's own record of the
application (its ``/json/`` document: the completed application with the cores it was given)
and from each worker's executor log (tasks run there).

The journal's records carry timestamps from 2023, so its topic keeps them with
``retention.ms=-1`` (:data:`tests.integration.test_report.UNLIMITED_RETENTION`): with the
broker's default 7-day retention they are deleted at its next retention check, which on the
shared broker fell between the local run's read and the cluster's: the cluster read no event. The
test's broker checks retention every second from its start, and a control topic of default
retention written with the same journal shows that the checks ran during the test.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from proxy.report.job import Options, Source, run_report
from tests.benchmarks.report_diff import differences
from tests.integration.conftest import SparkSessions
from tests.integration.test_report import journal, write_journal_topic
from tests.testbed.spark import local_session, standalone_cluster, stop_session

pytestmark = pytest.mark.slow  # about 2 minutes: a broker, three Spark sessions, a cluster


FAST_RETENTION_CHECKS = {"log.initial.task.delay.ms": "0",
                         "log.retention.check.interval.ms": "1000"}
"""Retention checked every second from the broker's start (not 30 s after it, then every 5
minutes), so that a journal topic without unlimited retention loses its records before the
first Spark job reads them, every time rather than by the phase of a timer."""


def watermarks(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """Each partition's earliest and next offset."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"marks-{topic}",
                         "log_level": 3})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                for p in range(2)]
    finally:
        consumer.close()


def completed(cluster: Any, app_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The master's record of ``app_id`` once it lists it as completed."""
    deadline = time.monotonic() + timeout
    while True:
        state = cluster.state()
        for app in state.get("completedapps", []):
            if app.get("id") == app_id:
                found: dict[str, Any] = app
                return found
        assert time.monotonic() < deadline, f"{app_id} not completed: {state}"
        time.sleep(0.5)


def test_report_on_a_standalone_cluster_equals_the_local_one(kafka_factory: Any,
                                                              spark_sessions: SparkSessions,
                                                              tmp_path: Path) -> None:
    spark_sessions.close()  # its sessions are its own (pyspark runs one per process)
    kafka = kafka_factory("3.9", properties=FAST_RETENTION_CHECKS)
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    write_journal_topic(kafka, topic)
    control = f"control-{uuid.uuid4().hex[:8]}"
    write_journal_topic(kafka, control, config={})
    source = Source(kafka_bootstrap=kafka.bootstrap, topic=topic)

    local = local_session("groupgate-report-local", master="local[2]")
    try:
        run_report(local, Options(source, tmp_path / "local"))
    finally:
        stop_session(local)

    with standalone_cluster(workers=2, cores=1, memory="1g") as cluster:
        session = local_session("groupgate-report-cluster", master=cluster.master_url, conf={
            "spark.executor.memory": "512m", "spark.cores.max": "2",
            "spark.pyspark.python": sys.executable})
        app_id = session.sparkContext.applicationId
        try:
            summary = run_report(session, Options(source, tmp_path / "cluster"))
        finally:
            stop_session(session)
        record = completed(cluster, app_id)
        logs = cluster.executor_logs(app_id)
        work_dirs = list(cluster.work_dirs)

    assert summary["rebalances"] == 5
    assert record["state"] == "FINISHED" and record["cores"] == 2, record
    # Each worker started an executor for the application, and each ran tasks.
    for work in work_dirs:
        ran = [text for path, text in logs.items() if work in path.parents
               and "Running task" in text]
        assert ran, f"no executor of {app_id} ran a task under {work}: {sorted(logs)}"

    check = local_session("groupgate-report-diff", master="local[2]")
    try:
        assert differences(check, tmp_path / "local", tmp_path / "cluster") == []
    finally:
        stop_session(check)

    # Retention ran while the test did: the control topic lost every record, the journal none.
    events = len(journal())
    kept = watermarks(kafka.bootstrap, control)
    assert all(low == high for low, high in kept) and sum(h for _, h in kept) == events, kept
    kept = watermarks(kafka.bootstrap, topic)
    assert all(low == 0 for low, _ in kept) and sum(h for _, h in kept) == events, kept
