"""The report job: read, normalize to Parquet, compute the tables, collect what the HTML needs.

:func:`run_report` writes, under the output directory::

    events/              the window's events (plus the look-back), normalized (Parquet); those
                         of schema versions the report does not read too (the other tables
                         leave them out; ``summary.json`` counts them)
    members/             member lives (Parquet)
    migration/           members per protocol and per client software at each sample (Parquet)
    conversions/         online conversions of broker groups to the engine, and aborted
                         ones (Parquet; from the schema-version-2 events)
    rebalances/          one row per rebalance (Parquet)
    partition_downtime/  one row per revoked partition (Parquet)
    groups/              one row per group (Parquet)
    report.html          the self-contained report
    summary.json         the fleet-wide figures

The look-back (``lookback_ms`` before the window) lets the job see the snapshots and events
that tell who was in each group and what was rebalancing when the window starts; only what
starts in the window is counted.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import compute, render
from .session import ReportError
from .source import ReadRange, known, read_files, read_kafka, skipped

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SAMPLES = 120
"""Points of the migration series over the window."""
WORST = 15
GROUP_SECTIONS = 6
"""Groups with a section of their own (the worst)."""
QUANTILES = (0.5, 0.95, 0.99)
"""The fleet-wide percentiles in the summary (exact: :data:`compute.PERCENTILES`)."""
MAX_POINTS = 20_000
"""At most this many rebalances or downtimes are collected for one plot (a sample beyond)."""
MAX_CONVERSION_ROWS = 500
"""At most this many conversions and as many aborted ones are listed in the HTML (the
latest; the ``conversions`` table has them all)."""


@dataclass(frozen=True, slots=True)
class Source:
    kafka_bootstrap: str | None = None
    topic: str | None = None
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    paths: Sequence[str] = ()
    fmt: str = "json"


@dataclass(frozen=True, slots=True)
class Options:
    source: Source
    out: Path
    start_ms: int | None = None
    end_ms: int | None = None
    lookback_ms: int = 600_000
    groups: Sequence[str] = ()
    title: str = "groupgate: consumer groups"


def read_events(spark: SparkSession, options: Options) -> DataFrame:
    start = None if options.start_ms is None else options.start_ms - options.lookback_ms
    span = ReadRange(start, options.end_ms)
    src = options.source
    if src.kafka_bootstrap is not None:
        if not src.topic:
            raise ReportError("reading from Kafka needs the journal topic (--topic)")
        frame = read_kafka(spark, src.kafka_bootstrap, src.topic, span, src.kafka_options)
    elif src.paths:
        frame = read_files(spark, src.paths, src.fmt, span)
    else:
        raise ReportError("no input: give --kafka-bootstrap and --topic, or --input FILES")
    if options.groups:
        from pyspark.sql import functions as F

        frame = frame.where(F.col("group").isin(*options.groups))
    return frame


def run_report(spark: SparkSession, options: Options) -> dict[str, Any]:
    """Run the whole job; returns the summary (also written as ``summary.json``)."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    stages: dict[str, float] = {}
    mark = [started]

    def stage(name: str) -> None:
        now = time.monotonic()
        stages[name] = round(now - mark[0], 1)
        mark[0] = now

    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    read_events(spark, options).write.mode("overwrite").parquet(str(out / "events"))
    stage("read")
    every = spark.read.parquet(str(out / "events"))
    events = known(every)
    bounds = events.agg(F.min("ts").alias("lo"), F.max("ts").alias("hi"),
                        F.count(F.lit(1)).alias("n")).first()
    if bounds is None or not bounds["n"]:
        left_out = skipped(every)
        raise ReportError("the journal has no events in the window" + (
            f" of a schema version this report reads (skipped: {_versions(left_out)})"
            if left_out else ""))
    span = compute.Span(options.start_ms if options.start_ms is not None else bounds["lo"],
                        options.end_ms if options.end_ms is not None else bounds["hi"] + 1)
    left_out = skipped(every.where((F.col("ts") >= span.start_ms) & (F.col("ts") < span.end_ms)))
    step = max(1, -(-(span.end_ms - span.start_ms) // SAMPLES))

    compute.annotate(events).write.mode("overwrite").parquet(str(out / "_annotated"))
    annotated = spark.read.parquet(str(out / "_annotated"))
    stage("annotate")
    tables: dict[str, DataFrame] = {
        "rebalances": compute.rebalances(annotated, span),
        "partition_downtime": compute.partition_downtime(annotated, span),
        "members": compute.member_lives(events, span),
        "conversions": compute.conversions(events, span),
    }
    for name, frame in tables.items():
        frame.write.mode("overwrite").parquet(str(out / name))
        tables[name] = spark.read.parquet(str(out / name))
        stage(name)
    rebalances, downtime, lives, converted = (tables["rebalances"], tables["partition_downtime"],
                                              tables["members"], tables["conversions"])
    groups = compute.groups_table(events, rebalances, downtime, lives, span, converted)
    groups.write.mode("overwrite").parquet(str(out / "groups"))
    groups = spark.read.parquet(str(out / "groups"))
    stage("groups")

    samples = max(1, min(SAMPLES, -(-(span.end_ms - span.start_ms) // step)))
    series = compute.dense_series(
        [r.asDict() for r in compute.migration_deltas(lives, span, step).collect()], samples)
    times = [span.start_ms + i * step for i in range(samples)]
    migration_rows = [(t, dim, category, values[i])
                      for dim, categories in series.items()
                      for category, values in categories.items()
                      for i, t in enumerate(times)]
    spark.createDataFrame(migration_rows, "sample_ms long, dimension string, category string, "
                                          "members long").write.mode("overwrite").parquet(
        str(out / "migration"))

    data = collect_for_html(spark, events, rebalances, downtime, lives, groups, span, step,
                            samples, series)
    data["summary"].update(conversion_summary(converted, left_out))
    data["conversions"] = conversion_rows(converted, "converted")
    data["aborted"] = conversion_rows(converted, "aborted")
    stage("migration and collect")
    (out / "report.html").write_text(render.html({**data, "summary": {
        **data["summary"], "seconds": round(time.monotonic() - started, 1)}}, options.title))
    stage("html")
    shutil.rmtree(out / "_annotated", ignore_errors=True)
    data["summary"]["seconds"] = round(time.monotonic() - started, 1)
    data["summary"]["stages_s"] = stages
    (out / "summary.json").write_text(json.dumps(data["summary"], indent=2, sort_keys=True))
    return dict(data["summary"])


def _versions(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{'no version' if version == 'none' else 'v' + version}: {n:,}"
                     for version, n in counts.items())


def conversion_summary(converted: DataFrame, left_out: Mapping[str, int]) -> dict[str, Any]:
    """The fleet-wide figures of the online upgrade, and the events of schema versions this
    report does not read (per version, in the window: ``events_skipped``)."""
    from pyspark.sql import functions as F

    from proxy.journal.schema import SCHEMA_VERSIONS

    c = converted.agg(
        F.sum((F.col("outcome") == "converted").cast("int")).alias("converted"),
        F.sum((F.col("outcome") == "aborted").cast("int")).alias("aborted"),
        F.count_distinct(F.when(F.col("outcome") == "converted", F.col("group")))
        .alias("groups")).first()
    assert c is not None
    return {"conversions": int(c["converted"] or 0),
            "conversions_aborted": int(c["aborted"] or 0),
            "groups_converted": int(c["groups"] or 0),
            "schema_versions": sorted(SCHEMA_VERSIONS),
            "events_skipped": dict(left_out)}


def conversion_rows(converted: DataFrame, outcome: str) -> list[dict[str, Any]]:
    """The latest :data:`MAX_CONVERSION_ROWS` rows of one outcome, by group and time."""
    from pyspark.sql import functions as F

    latest = (converted.where(F.col("outcome") == outcome)
              .orderBy(F.desc("ts"), "group").limit(MAX_CONVERSION_ROWS).collect())
    return sorted((row.asDict() for row in latest), key=lambda r: (r["group"], r["ts"]))


def _sample(frame: DataFrame, column: str, total: int) -> list[float]:
    from pyspark.sql import functions as F

    if total > MAX_POINTS:
        frame = frame.sample(fraction=MAX_POINTS / total, seed=7)
    return [float(r[0]) for r in frame.where(F.col(column).isNotNull()).select(column).collect()]


def collect_for_html(spark: SparkSession, events: DataFrame, rebalances: DataFrame,
                     downtime: DataFrame, lives: DataFrame, groups: DataFrame,
                     span: compute.Span, step: int, samples: int,
                     series: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    """The small results the HTML is drawn from."""
    from pyspark.sql import functions as F

    counted = rebalances.where(F.col("outcome") != "emptied")
    r = counted.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when(F.col("outcome") == "open", 1).otherwise(0)).alias("open"),
        *[compute.percentile("duration_ms", q).alias(f"q{i}") for i, q in enumerate(QUANTILES)],
        F.max("duration_ms").alias("max"),
        F.avg("members_disturbed").alias("disturbed_avg"),
        F.sum("partitions_revoked").alias("partitions_revoked")).first()
    assigned = downtime.where(F.col("outcome") == "assigned")
    d = downtime.agg(
        F.sum(F.when(F.col("outcome") == "assigned", 1).otherwise(0)).alias("n"),
        F.sum(F.when(F.col("outcome") == "open", 1).otherwise(0)).alias("open"),
        F.sum(F.when(F.col("outcome") == "group ended", 1).otherwise(0)).alias("ended"),
        *[compute.percentile("downtime_ms", q).alias(f"q{i}") for i, q in enumerate(QUANTILES)],
        F.max("downtime_ms").alias("max"), F.sum("downtime_ms").alias("total")).first()
    g = groups.agg(F.count(F.lit(1)).alias("n"),
                   F.sum(F.col("coordinated").cast("int")).alias("coordinated"),
                   F.sum(F.col("passed_through").isNotNull().cast("int")).alias("passed"),
                   F.sum("classic_members_now").alias("classic"),
                   F.sum("consumer_members_now").alias("consumer")).first()
    assert r is not None and d is not None and g is not None
    n_events = events.where((F.col("ts") >= span.start_ms) & (F.col("ts") < span.end_ms)) \
        .select("source", "seq").distinct().count()
    members_now = int(g["classic"] or 0) + int(g["consumer"] or 0)
    rq = [r[f"q{i}"] for i in range(len(QUANTILES))]
    dq = [d[f"q{i}"] for i in range(len(QUANTILES))]
    summary: dict[str, Any] = {
        "window_start_ms": span.start_ms, "window_end_ms": span.end_ms,
        "events": n_events,
        "groups": int(g["n"]), "groups_coordinated": int(g["coordinated"] or 0),
        "groups_passed_through": int(g["passed"] or 0),
        "members_now": members_now,
        "classic_members_now": int(g["classic"] or 0),
        "consumer_members_now": int(g["consumer"] or 0),
        "classic_share_now": (round(int(g["classic"] or 0) / members_now, 4)
                              if members_now else None),
        "rebalances": int(r["n"]), "rebalances_open": int(r["open"] or 0),
        "rebalance_ms_p50": rq[0], "rebalance_ms_p95": rq[1], "rebalance_ms_p99": rq[2],
        "rebalance_ms_max": r["max"],
        "members_disturbed_avg": (round(float(r["disturbed_avg"]), 2)
                                  if r["disturbed_avg"] is not None else None),
        "partitions_revoked": int(r["partitions_revoked"] or 0),
        "downtimes": int(d["n"] or 0), "partitions_open": int(d["open"] or 0),
        "partitions_group_ended": int(d["ended"] or 0),
        "downtime_ms_p50": dq[0], "downtime_ms_p95": dq[1], "downtime_ms_p99": dq[2],
        "downtime_ms_max": d["max"], "downtime_ms_total": d["total"],
        "percentiles": compute.PERCENTILES,
    }
    bucket = F.floor((F.col("start_ms") - F.lit(span.start_ms)) / F.lit(step)).cast("long")
    per_sample = {int(row["b"]): int(row["n"]) for row in counted.groupBy(bucket.alias("b"))
                  .agg(F.count(F.lit(1)).alias("n")).collect()}
    disturbed = {int(row["members_disturbed"]): int(row["n"]) for row in counted.groupBy(
        "members_disturbed").agg(F.count(F.lit(1)).alias("n")).collect()}
    worst_rows = (groups.orderBy(F.desc("downtime_ms_total"), F.desc("rebalances"),
                                 F.desc("rebalance_ms_total"), "group")
                  .limit(WORST).collect())
    worst = [row.asDict() for row in worst_rows]
    passed = [row.asDict() for row in groups.where(F.col("passed_through").isNotNull())
              .select("group", "passed_through", "last_seen_ms").orderBy("group")
              .limit(200).collect()]
    top = [w["group"] for w in worst if w["rebalances"] or w["downtimes"]][:GROUP_SECTIONS]
    sections = []
    if top:
        deltas = compute.migration_deltas(lives.where(F.col("group").isin(*top)), span, step,
                                          ("protocol",), by_group=True).collect()
        timeline = (counted.where(F.col("group").isin(*top))
                    .select("group", "start_ms", "duration_ms", "members_disturbed")
                    .orderBy("start_ms").limit(MAX_POINTS).collect())
        for name in top:
            rows = [x.asDict() for x in deltas if x["group"] == name]
            sections.append({
                "group": name,
                "row": next(w for w in worst if w["group"] == name),
                "series": compute.dense_series(rows, samples).get("protocol", {}),
                "rebalances": [(x["start_ms"], x["duration_ms"], x["members_disturbed"])
                               for x in timeline if x["group"] == name],
            })
    return {
        "summary": summary,
        "times": [span.start_ms + i * step for i in range(samples)],
        "series": series,
        "rebalances_per_sample": [per_sample.get(i, 0) for i in range(samples)],
        "step_ms": step,
        "durations": _sample(counted, "duration_ms", int(r["n"])),
        "downtimes": _sample(assigned, "downtime_ms", int(d["n"] or 0)),
        "disturbed": disturbed,
        "worst": worst,
        "passed": passed,
        "sections": sections,
    }
