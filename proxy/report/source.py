"""Reading the journal into one DataFrame of events, from Kafka or from files.

* **Kafka**: Spark's own Kafka source (``spark-sql-kafka-0-10``, which the Spark session must
  have: ``--packages`` / ``spark.jars.packages`` with its coordinates, or ``--jars`` with local
  jar files), batch mode, from the earliest offset at or after the start of the read range
  (``startingTimestamp``) to the end of the window (``endingTimestamp``) or the latest offset.
  Each record's value is one event (JSON).
* **Files**: JSON lines (one record value per line, as ``kafka-console-consumer`` prints them,
  ``.json``/``.jsonl``, optionally gzip-compressed) or Parquet with the events table's columns
  (the ``events`` table an earlier report wrote).

Every row read is kept here, whatever its schema version (``v``): :func:`known` keeps the
versions this report reads (:data:`~proxy.journal.schema.SCHEMA_VERSIONS`: 1 and 2, side by
side; an event type keeps the version it was added at), :func:`skipped` counts the others per
version, so that the report can say how many events it left out. A line that is not JSON, or
whose fields do not have the kinds of :data:`~proxy.journal.schema.FIELD_KINDS`, is dropped
by the JSON parse and not counted. Duplicates (the writer may write an event twice
when an acknowledgement is lost; ``(source, seq)`` identifies it) are kept here and dropped
where they would count twice (:func:`proxy.report.compute.annotate`), which spares a shuffle
of every event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.journal.schema import SCHEMA_VERSIONS

from .session import ReportError, event_schema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass(frozen=True, slots=True)
class ReadRange:
    """Events with ``start_ms <= ts < end_ms`` (None: unbounded)."""

    start_ms: int | None
    end_ms: int | None


def read_kafka(spark: SparkSession, bootstrap: str, topic: str, span: ReadRange,
               options: Mapping[str, str] | None = None) -> DataFrame:
    """The journal topic's events in ``span``; ``options``: extra ``kafka.*`` client settings
    (security protocol, SASL, ...)."""
    from pyspark.sql import functions as F

    reader = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsetsByTimestampStrategy", "latest"))
    if span.start_ms is not None:
        reader = reader.option("startingTimestamp", str(span.start_ms))
    else:
        reader = reader.option("startingOffsets", "earliest")
    if span.end_ms is not None:
        reader = reader.option("endingTimestamp", str(span.end_ms))
    for key, value in (options or {}).items():
        reader = reader.option(key if key.startswith("kafka.") else f"kafka.{key}", value)
    try:
        raw = reader.load()
    except Exception as exc:  # AnalysisException: the connector is not on the classpath
        if "kafka" in str(exc).lower() and "data source" in str(exc).lower():
            raise ReportError(
                "Spark's Kafka connector is missing: give it with --packages "
                "org.apache.spark:spark-sql-kafka-0-10_2.13:<your Spark version> or with "
                "--jars (docs/pipeline.md)") from exc
        raise
    parsed = raw.select(F.from_json(F.col("value").cast("string"), event_schema()).alias("e"))
    return _clean(parsed.select("e.*"), span)


def read_files(spark: SparkSession, paths: Sequence[str], fmt: str, span: ReadRange
               ) -> DataFrame:
    """Events from JSON-lines or Parquet files (``fmt``: ``json`` or ``parquet``)."""
    if fmt == "json":
        frame = spark.read.schema(event_schema()).option("mode", "DROPMALFORMED").json(
            list(paths))
    elif fmt == "parquet":
        frame = spark.read.parquet(*paths)
        missing = [f.name for f in event_schema().fields if f.name not in frame.columns]
        if missing:
            raise ReportError(f"the Parquet input lacks the journal columns {missing}")
        frame = frame.select(*[f.name for f in event_schema().fields])
    else:
        raise ReportError(f"unknown input format {fmt!r}: json or parquet")
    return _clean(frame, span)


def _known_version() -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.col("v").isin(*sorted(SCHEMA_VERSIONS)), F.lit(False))


def known(frame: DataFrame) -> DataFrame:
    """The events of the schema versions this report reads."""
    return frame.where(_known_version())


def skipped(frame: DataFrame) -> dict[str, int]:
    """How many events of each schema version this report does not read (``none``: no
    version), which :func:`known` leaves out."""
    from pyspark.sql import functions as F

    rows = frame.where(~_known_version()).groupBy("v").agg(
        F.count(F.lit(1)).alias("n")).collect()
    return {("none" if r["v"] is None else str(r["v"])): int(r["n"])
            for r in sorted(rows, key=lambda r: (r["v"] is None, r["v"] or 0))}


def _clean(frame: DataFrame, span: ReadRange) -> DataFrame:
    from pyspark.sql import functions as F

    out = frame.where(F.col("ts").isNotNull()
                      & F.col("group").isNotNull() & F.col("type").isNotNull())
    if span.start_ms is not None:
        out = out.where(F.col("ts") >= span.start_ms)
    if span.end_ms is not None:
        out = out.where(F.col("ts") < span.end_ms)
    return out
