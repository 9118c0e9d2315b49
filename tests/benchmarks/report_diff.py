"""``dev/bench report-diff A B``: do two ``groupgate report`` outputs of the same journal say
the same thing? Used to hold a faster version of the job to the output of the one before it,
and a cluster's run to a local one.

Every Parquet table must have the same columns (names and types) and the same rows as a
multiset (row order is Spark's business; maps are compared as their JSON, doubles to 6
decimals, since an average summed in another order may differ in its last bits), and
``summary.json`` must be equal but for the timings (``seconds``, ``stages_s``). Prints each
difference; exit status 1 if there is one. Starts a small local Spark (run it under the test
bed's lock).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TABLES = ("events", "members", "migration", "rebalances", "partition_downtime", "groups")
TIMINGS = frozenset({"seconds", "stages_s"})


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="one report's output directory")
    parser.add_argument("b", type=Path, help="the other's")
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=TABLES)


def summary_differences(a: Path, b: Path) -> list[str]:
    left = json.loads((a / "summary.json").read_text())
    right = json.loads((b / "summary.json").read_text())
    keys = sorted((set(left) | set(right)) - TIMINGS)
    return [f"summary.json {key}: {left.get(key)!r} != {right.get(key)!r}"
            for key in keys if left.get(key) != right.get(key)]


def _comparable(frame: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    columns = []
    for field in frame.schema.fields:
        column = F.col(f"`{field.name}`")
        if isinstance(field.dataType, T.DoubleType | T.FloatType):
            column = F.round(column, 6)
        elif "map<" in field.dataType.simpleString():
            column = F.to_json(column)  # set operations do not take maps
        columns.append(column.alias(field.name))
    return frame.select(*columns)


def table_differences(spark: Any, a: Path, b: Path, table: str) -> list[str]:
    left = spark.read.parquet(str(a / table))
    right = spark.read.parquet(str(b / table))
    ls = [(f.name, f.dataType.simpleString()) for f in left.schema.fields]
    rs = [(f.name, f.dataType.simpleString()) for f in right.schema.fields]
    if ls != rs:
        return [f"{table}: columns {ls} != {rs}"]
    left, right = _comparable(left), _comparable(right)
    only_left = left.exceptAll(right)
    only_right = right.exceptAll(left)
    n_left, n_right = only_left.count(), only_right.count()
    if not n_left and not n_right:
        return []
    out = [f"{table}: {n_left} rows only in {a}, {n_right} only in {b} "
           f"(of {left.count()} and {right.count()})"]
    for side, frame in ((a, only_left), (b, only_right)):
        out += [f"  {side}: {row.asDict()}" for row in frame.limit(3).collect()]
    return out


def differences(spark: Any, a: Path, b: Path, tables: tuple[str, ...] = TABLES) -> list[str]:
    """Every difference between the outputs in ``a`` and ``b`` (empty: the same report)."""
    out = summary_differences(a, b)
    for table in tables:
        out += table_differences(spark, a, b, table)
    return out


def run(args: argparse.Namespace) -> int:
    from tests.testbed.spark import local_session, stop_session

    spark = local_session("report-diff", master="local[2]",
                          conf={"spark.driver.memory": "2g"})
    try:
        found = differences(spark, args.a, args.b, tuple(args.tables))
    finally:
        stop_session(spark)
    for line in found:
        print(line)
    if not found:
        print(f"the same report: summary.json (timings aside) and {', '.join(args.tables)}")
    return 1 if found else 0
