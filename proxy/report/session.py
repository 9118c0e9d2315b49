"""Spark for the report: a clear error without pyspark, the session, the journal's schema.

pyspark is the optional ``report`` extra (``pip install 'groupgate[report]'``); everything
else in ``groupgate`` works without it. :func:`require_pyspark` turns its absence into one
line telling how to install it. :func:`event_schema` is the journal schema
(:mod:`proxy.journal.schema`) as one wide Spark struct: every field of every event type, null
where an event type does not have it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from proxy.journal.schema import FIELD_KINDS, MEMBER_FIELDS, Kind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

MISSING_PYSPARK = ("groupgate report needs pyspark, the optional 'report' extra: "
                   "pip install 'groupgate[report]' (and a Java 17+ runtime on PATH)")

SESSION_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    # Input splits of 32 MB rather than 128 MB: a 600 MB journal in 19 tasks instead of 5, so
    # that the last wave of the JSON parse does not leave cores idle.
    "spark.sql.files.maxPartitionBytes": "32m",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
}


class ReportError(Exception):
    """The report cannot run (missing pyspark, bad input); the message says why."""


def require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise ReportError(MISSING_PYSPARK) from exc


def start_session(master: str, *, driver_memory: str = "4g", jars: Sequence[str] = (),
                  packages: Sequence[str] = (), conf: Mapping[str, str] | None = None,
                  shuffle_partitions: int | None = None) -> SparkSession:
    """A SparkSession for the report. ``master``: ``local[*]`` (default of the command),
    ``local[N]``, or a cluster's (``spark://host:7077``, ``yarn``, ``k8s://...``)."""
    require_pyspark()
    from pyspark.sql import SparkSession

    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName("groupgate-report")
    settings = dict(SESSION_DEFAULTS)
    settings["spark.driver.memory"] = driver_memory
    if shuffle_partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    if jars:
        settings["spark.jars"] = ",".join(jars)
    if packages:
        settings["spark.jars.packages"] = ",".join(packages)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def stop_session(session: Any) -> None:
    """Stop the session and let its JVM exit with this process's gateway."""
    session.stop()


def _spark_type(kind: Kind) -> DataType:
    from pyspark.sql import types as T

    if kind is Kind.STRING:
        return T.StringType()
    if kind is Kind.INT:
        return T.LongType()
    if kind is Kind.BOOL:
        return T.BooleanType()
    if kind is Kind.STRINGS:
        return T.ArrayType(T.StringType())
    if kind is Kind.PARTITIONS:
        return T.MapType(T.StringType(), T.ArrayType(T.IntegerType()))
    return T.ArrayType(T.StructType([T.StructField(name, _spark_type(k))
                                     for name, k in MEMBER_FIELDS.items()]))


def event_schema() -> StructType:
    """Every journal field as one nullable column."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(name, _spark_type(kind))
                         for name, kind in FIELD_KINDS.items()])
