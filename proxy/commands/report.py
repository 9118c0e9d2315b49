"""``groupgate report``: the fleet report from the group-event journal (PySpark).

    groupgate report --kafka-bootstrap kafka-1:9092 --topic groupgate-journal \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        --from 2026-05-01T00:00 --to 2026-05-08T00:00 --out report/
    groupgate report --input journal.jsonl --out report/          # files: JSON lines, Parquet

Runs on ``local[*]`` unless ``--master`` names a cluster. Needs pyspark (the ``report``
extra) and Java; the Kafka source needs Spark's Kafka connector on Spark's classpath
(``--packages`` coordinates, resolved by Spark, or ``--jars`` local files).
``docs/pipeline.md`` describes the tables and figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from proxy.report.session import ReportError, require_pyspark


def _time(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 date/time (UTC unless it says otherwise)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: not epoch ms nor ISO 8601") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def _guess_format(paths: list[str]) -> str:
    """Parquet for ``*.parquet`` or a directory of them (an ``events`` table), else JSON."""
    for text in paths[:1]:
        path = Path(text)
        if path.suffix == ".parquet" or (path.is_dir() and any(path.glob("*.parquet"))):
            return "parquet"
    return "json"


def configure(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("input (Kafka or files)")
    src.add_argument("--kafka-bootstrap", metavar="HOST:PORT[,...]",
                     help="read the journal topic from this cluster")
    src.add_argument("--topic", help="the journal topic (journal-topic of the proxies)")
    src.add_argument("--kafka-option", type=_pair, action="append", default=[],
                     metavar="KEY=VALUE",
                     help="a Kafka client setting for Spark's source, e.g. "
                          "security.protocol=SASL_SSL (repeatable)")
    src.add_argument("--input", nargs="+", default=[], metavar="PATH",
                     help="journal files or directories instead of Kafka")
    src.add_argument("--input-format", choices=("json", "parquet"),
                     help="format of --input (default: from the first path's name; json)")
    win = parser.add_argument_group("window")
    win.add_argument("--from", dest="start", type=_time, metavar="TIME",
                     help="start of the window (epoch ms or ISO 8601; default: first event)")
    win.add_argument("--to", dest="end", type=_time, metavar="TIME",
                     help="end of the window, exclusive (default: after the last event)")
    win.add_argument("--lookback-ms", type=int, default=600_000,
                     help="events read before the window to know each group's state at its "
                          "start; at least the proxies' journal-snapshot-interval-ms "
                          "(default 600000)")
    win.add_argument("--group", action="append", default=[], metavar="GROUP",
                     help="only these groups (repeatable)")
    parser.add_argument("--out", type=Path, required=True,
                        help="output directory (Parquet tables, report.html, summary.json)")
    parser.add_argument("--title", default="groupgate: consumer groups",
                        help="title of the HTML report")
    spark = parser.add_argument_group("Spark")
    spark.add_argument("--master", default="local[*]",
                       help="Spark master (default local[*]; spark://HOST:7077, yarn, "
                            "k8s://...)")
    spark.add_argument("--driver-memory", default="4g", help="spark.driver.memory (4g)")
    spark.add_argument("--packages", action="append", default=[], metavar="COORDINATES",
                       help="spark.jars.packages, e.g. the Kafka connector's coordinates "
                            "(repeatable)")
    spark.add_argument("--jars", action="append", default=[], metavar="PATH",
                       help="spark.jars: local jar files (repeatable)")
    spark.add_argument("--conf", type=_pair, action="append", default=[], metavar="KEY=VALUE",
                       help="any other Spark setting (repeatable)")
    spark.add_argument("--shuffle-partitions", type=int,
                       help="spark.sql.shuffle.partitions (default: Spark's)")


def run(args: argparse.Namespace) -> int:
    try:
        require_pyspark()
        from proxy.report.job import Options, Source, run_report
        from proxy.report.session import start_session, stop_session

        if bool(args.kafka_bootstrap) == bool(args.input):
            raise ReportError("give either --kafka-bootstrap and --topic, or --input")
        fmt = args.input_format or _guess_format(args.input)
        options = Options(
            source=Source(args.kafka_bootstrap, args.topic, dict(args.kafka_option),
                          tuple(args.input), fmt),
            out=args.out, start_ms=args.start, end_ms=args.end, lookback_ms=args.lookback_ms,
            groups=tuple(args.group), title=args.title)
        if options.start_ms is not None and options.end_ms is not None \
                and options.start_ms >= options.end_ms:
            raise ReportError("--from must be before --to")
        session = start_session(args.master, driver_memory=args.driver_memory,
                                jars=args.jars, packages=args.packages, conf=dict(args.conf),
                                shuffle_partitions=args.shuffle_partitions)
        try:
            summary = run_report(session, options)
        finally:
            stop_session(session)
    except ReportError as exc:
        print(f"groupgate report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {args.out / 'report.html'}")
    print(f"  {summary['events']:,} events, {summary['groups']:,} groups, "
          f"{summary['rebalances']:,} rebalances, {summary['downtimes']:,} partition "
          f"downtimes, {summary['seconds']} s")
    return 0
