"""The report's tables, derived from the events with Spark (DataFrame operations only).

Definitions (``docs/pipeline.md`` has them with examples):

**Rebalance** (incremental protocol). Within a group, in event order, a rebalance starts at a
group epoch bump (``epoch_bumped``) while no rebalance is running, takes in every further
bump, and ends at the first of: the group is Stable again (every member reconciled to the
target of the latest epoch: a ``group_state`` Stable), the group is Empty (outcome
``emptied``: the last member left, nobody is reconciled and it is not counted as a
rebalance), or the group ends (expired, deleted, handed back: ``ended``). One still running
at the end of the data is ``open``. Duration: from the first bump to that end. Members
disturbed: members whose partitions were assigned or revoked during it (by an assignment, or
because they left or were fenced); members revoked: those that had to give some up.

**Partition downtime**: for each partition of a group, from the moment a member is told to
stop consuming it (``revoked`` in an assignment, a leave or a fencing) to the next moment any
member of the group gets it (``assigned``). Several revocations before an assignment count
from the first. Outcomes: ``assigned``, ``group ended`` (the group left the proxy first, e.g.
handed back to the broker) and ``open`` (nobody had it again by the end of the data).

**Conversions** (schema version 2): each ``group_converted`` (the broker's classic group moved
to the engine online) and ``conversion_aborted`` (an attempt refused or failed) in the window;
a conversion's duration is from the adoption the same sidecar journalled just before it
(``group_created`` with ``converted``) to the ``group_converted``, written once the converted
group is in the state log.

**Member lives**: a member id from its join (or replacement, or first snapshot listing it) to
its leave, fencing, replacement, its group's end, or the first snapshot of its group after it
was last seen that no longer lists it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ENDINGS = ("group_expired", "group_deleted", "group_handed_back", "group_dropped")
STARTS = ("member_joined", "member_replaced")
CONVERSIONS = ("group_converted", "conversion_aborted")
"""The version-2 event types of an online upgrade."""
CONVERTED_TO = "engine"
"""Where a converted group went (the target of every conversion)."""


@dataclass(frozen=True, slots=True)
class Span:
    """The report window, ``start_ms <= t < end_ms``."""

    start_ms: int
    end_ms: int


PERCENTILES = "exact, nearest rank"
"""How the report's percentiles are computed: the p-th percentile of n values is the
ceil(p * n)-th smallest, an actual value (Spark's ``percentile_disc``), the same on a cluster
as locally."""


def percentile(column: str, p: float) -> Column:
    """The exact ``p``-th percentile of ``column`` (nearest rank, :data:`PERCENTILES`) as an
    aggregate; nulls are left out."""
    from pyspark.sql import functions as F

    return F.expr(f"percentile_disc({p!r}) WITHIN GROUP (ORDER BY `{column}`)").cast("long")


def _partition_count(column: str) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.size(F.flatten(F.map_values(F.col(column)))), F.lit(0))


def _decode(code: Column, names: tuple[str, ...], first: int) -> Column:
    """``names[code - first]`` (null for null)."""
    from pyspark.sql import functions as F

    out = F.when(code == first, F.lit(names[0]))
    for i, name in enumerate(names[1:], first + 1):
        out = out.when(code == i, F.lit(name))
    return out


def annotate(events: DataFrame) -> DataFrame:
    """The events rebalances and downtime need, each with its group's ``life`` (how many
    times the group was created up to it) and ``segment`` (how many rebalance-closing events
    came before it)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    typ = F.col("type")
    closing = typ.isin(*ENDINGS) | ((typ == "group_state")
                                    & F.col("state").isin("Stable", "Empty"))
    wanted = events.where(typ.isin("group_created", "epoch_bumped", "group_state",
                                   "assignment", "member_joined", "member_replaced",
                                   "member_left", "member_fenced", *ENDINGS))
    base = wanted.select("group", "ts", "seq", "source", "type", "state", "group_epoch",
                         "reason", "member", "assigned", "revoked",
                         closing.cast("int").alias("closing"),
                         (typ == "epoch_bumped").cast("int").alias("bump"),
                         (typ == "group_created").cast("int").alias("created"))
    ordered = Window.partitionBy("group").orderBy("ts", "seq", "source")
    # A duplicate (the same source and seq) sorts next to its original: drop it.
    duplicate = F.coalesce((F.lag("source").over(ordered) == F.col("source"))
                           & (F.lag("seq").over(ordered) == F.col("seq")), F.lit(False))
    unique = base.withColumn("duplicate", duplicate).where(~F.col("duplicate")).drop(
        "duplicate")
    before = ordered.rowsBetween(Window.unboundedPreceding, -1)
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (unique.withColumn("segment", F.coalesce(F.sum("closing").over(before), F.lit(0)))
            .withColumn("life", F.sum("created").over(upto)))


def rebalances(annotated: DataFrame, span: Span) -> DataFrame:
    """One row per rebalance starting in the window (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    seg = Window.partitionBy("group", "segment").orderBy("ts", "seq").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    x = annotated.withColumn("started", F.max("bump").over(seg))
    bump = F.col("bump") == 1
    moved = F.col("type").isin("assignment", "member_left", "member_fenced") \
        & (F.col("started") == 1)
    revoked_n = _partition_count("revoked")
    assigned_n = _partition_count("assigned")
    # The closing event's outcome as a number (a string would make Spark aggregate by
    # sorting): 1 emptied, 2 ended, 3 stable (the order of their names).
    outcomes = ("emptied", "ended", "stable")
    outcome = (F.when(F.col("type").isin(*ENDINGS), F.lit(2))
               .when(F.col("state") == "Stable", F.lit(3))
               .when(F.col("state") == "Empty", F.lit(1)))
    agg = x.groupBy("group", "segment").agg(
        F.min(F.when(bump, F.col("ts"))).alias("start_ms"),
        F.sum("bump").alias("bumps"),
        F.min_by(F.when(bump, F.col("reason")), F.when(bump, F.struct("ts", "seq")))
        .alias("first_reason"),
        F.max(F.when(bump, F.col("group_epoch"))).alias("group_epoch"),
        F.max(F.when(F.col("closing") == 1, F.col("ts"))).alias("end_ms"),
        F.max(F.when(F.col("closing") == 1, outcome)).alias("closed_by"),
        F.sum(F.when(moved, revoked_n).otherwise(0)).alias("partitions_revoked"),
        F.sum(F.when(moved, assigned_n).otherwise(0)).alias("partitions_assigned"),
    )
    # Members disturbed and revoked: one row per member that moved, then a count (instead of
    # count_distinct, which makes Spark copy every row per distinct column and sort twice).
    touched = x.where(moved & F.col("member").isNotNull()).groupBy(
        "group", "segment", "member").agg(
        F.max(((revoked_n > 0) | (assigned_n > 0)).cast("int")).alias("disturbed"),
        F.max((revoked_n > 0).cast("int")).alias("revoked"))
    members = touched.groupBy("group", "segment").agg(
        F.sum("disturbed").alias("members_disturbed"),
        F.sum("revoked").alias("members_revoked"))
    agg = agg.join(members, ["group", "segment"], "left").select(
        *[c for c in agg.columns if c != "closed_by"],
        _decode(F.col("closed_by"), outcomes, 1).alias("closed_by"),
        F.coalesce(F.col("members_disturbed"), F.lit(0)).alias("members_disturbed"),
        F.coalesce(F.col("members_revoked"), F.lit(0)).alias("members_revoked"))
    return (agg.where(F.col("bumps") > 0)
            .where((F.col("start_ms") >= span.start_ms) & (F.col("start_ms") < span.end_ms))
            .select("group", "start_ms", "end_ms",
                    (F.col("end_ms") - F.col("start_ms")).alias("duration_ms"),
                    F.coalesce(F.col("closed_by"), F.lit("open")).alias("outcome"),
                    F.col("bumps").cast("long").alias("bumps"), "group_epoch", "first_reason",
                    "members_disturbed", "members_revoked",
                    F.col("partitions_revoked").cast("long").alias("partitions_revoked"),
                    F.col("partitions_assigned").cast("long").alias("partitions_assigned")))


def partition_downtime(annotated: DataFrame, span: Span) -> DataFrame:
    """One row per partition revoked in the window: when, until when, by whom, to whom."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def exploded(column: str, kind: int) -> DataFrame:
        rows = annotated.where(F.col(column).isNotNull()).select(
            "group", "life", "ts", "seq", "member",
            F.explode(F.col(column)).alias("topic", "partitions"))
        return rows.select("group", "life", "ts", "seq", "member", "topic",
                           F.explode("partitions").alias("partition"),
                           F.lit(kind).alias("assign"))

    rows = exploded("revoked", 0).unionByName(exploded("assigned", 1))
    key = ("group", "life", "topic", "partition")
    # In each partition's order, a downtime starts at a revocation right after an assignment
    # (or first) and ends at the next assignment. One pass of window functions over the
    # sorted rows finds both ends: the row that ends a downtime (an assignment right after a
    # revocation, or a revocation last of all) carries the latest start before it.
    ordered = Window.partitionBy(*key).orderBy("ts", "seq", "assign")
    upto = ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    revoke = F.col("assign") == 0
    give = F.col("assign") == 1
    previous = F.lag("assign").over(ordered)
    marked = rows.select(*rows.columns, (revoke & F.coalesce(previous == 1, F.lit(True)))
                         .alias("starts"), previous.alias("previous"),
                         F.lead("assign").over(ordered).alias("next"))
    start = F.when(F.col("starts"), F.struct("ts", "member"))
    intervals = marked.select(
        *key, "assign", "ts", "member", "previous", "next",
        F.last(start, ignorenulls=True).over(upto).alias("first")).where(
        (give & (F.col("previous") == 0)) | (revoke & F.col("next").isNull())).select(
        *key, F.col("first.ts").alias("revoked_ms"),
        F.when(give, F.col("ts")).alias("assigned_ms"),
        F.col("first.member").alias("from_member"),
        F.when(give, F.col("member")).alias("to_member"))
    ends = annotated.where(F.col("type").isin(*ENDINGS)).groupBy("group", "life").agg(
        F.min("ts").alias("life_end_ms"))
    joined = intervals.join(ends, ["group", "life"], "left")
    outcome = (F.when(F.col("assigned_ms").isNotNull(), F.lit("assigned"))
               .when(F.col("life_end_ms") >= F.col("revoked_ms"), F.lit("group ended"))
               .otherwise(F.lit("open")))
    return (joined
            .where((F.col("revoked_ms") >= span.start_ms) & (F.col("revoked_ms") < span.end_ms))
            .select("group", "topic", F.col("partition").cast("int").alias("partition"),
                    "revoked_ms", "assigned_ms",
                    (F.col("assigned_ms") - F.col("revoked_ms")).alias("downtime_ms"),
                    outcome.alias("outcome"), "from_member", "to_member"))


POD_LOCAL_END = "fenced (pod-local: its process was gone)"
END_REASONS = ("left", "fenced", "replaced", *(e.replace("group_", "group ") for e in ENDINGS),
               POD_LOCAL_END)
"""Why a member's life ended, in the order a tie (two endings at the same ms) is broken (at
most 8: the code rides in ``end * 8 + code``)."""


def member_lives(events: DataFrame, span: Span) -> DataFrame:
    """One row per member id that was in a group during the window, with who it was.

    Two aggregations by ``(group, member)``: the times (every sighting: its events, the
    snapshots listing it, a replacement or a group's end naming it) on narrow rows of numbers,
    which Spark sums up in a hash table as it reads (a snapshot lists the same members again
    and again, so little is left to shuffle); and the identity (who it is) from the few events
    that carry it and the group's first snapshot. The end reason rides with the end time as
    one number (``end * 8 + reason``) so that the earliest end picks its reason."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    typ = F.col("type")
    identity = ("protocol", "assignor", "client_id", "client_host", "software_name",
                "software_version", "instance")

    def ending(code: Column) -> Column:
        """``ts * 8 + code`` (``code``: index in END_REASONS): the minimum is the earliest
        end, with its reason."""
        return F.col("ts") * F.lit(8) + code

    gone = (typ == "member_fenced") | ((typ == "member_left")
                                       & ~F.coalesce(F.col("static"), F.lit(False)))
    members = events.where(F.col("member").isNotNull())
    direct = members.select(
        "group", "member", "ts", F.when(typ.isin(*STARTS), F.col("ts")).alias("start"),
        F.when(gone, ending(
            F.when((typ == "member_fenced") & (F.col("reason") == "pod-local"),
                   F.lit(END_REASONS.index(POD_LOCAL_END)))
            .when(typ == "member_fenced", F.lit(1)).otherwise(F.lit(0))))
        .alias("end"))
    replaced = events.where((typ == "member_replaced") & F.col("replaced").isNotNull()).select(
        "group", F.col("replaced").alias("member"), "ts", F.lit(None).cast("long").alias("start"),
        ending(F.lit(2)).alias("end"))
    handed = events.where(typ.isin(*ENDINGS) & F.col("member_ids").isNotNull()).select(
        "group", F.explode("member_ids").alias("member"), "ts",
        F.lit(None).cast("long").alias("start"),
        ending(F.array_position(F.array(*[F.lit(e) for e in ENDINGS]), typ) + 2).alias("end"))
    # Snapshots: every appearance says "still there" (member ids only); who a member is comes
    # from its group's first snapshot (members that joined before the data starts), else from
    # its own events.
    snapshots = events.where(typ == "group_snapshot")
    listed = snapshots.select("group", "ts", F.explode("members.member").alias("member")).select(
        "group", "member", "ts", F.col("ts").alias("start"), F.lit(None).cast("long").alias("end"))
    times = (direct.unionByName(replaced).unionByName(handed).unionByName(listed)
             .groupBy("group", "member").agg(
                 F.min("start").alias("start_ms"), F.min("ts").alias("first_seen_ms"),
                 F.max("ts").alias("last_seen_ms"), F.min("end").alias("ending")))
    first = snapshots.groupBy("group").agg(F.min("ts").alias("ts"))
    # Only the identity fields of the first snapshot's members (not their assignments).
    fields = [F.col(f"members.{c}").alias(c) for c in ("member", *identity)]
    described = snapshots.join(F.broadcast(first), ["group", "ts"]).select(
        "group", F.explode(F.arrays_zip(*fields)).alias("m")).select(
        "group", F.col("m.member").alias("member"), *[F.col(f"m.{c}").alias(c) for c in identity])
    told = members.where(F.coalesce(*[F.col(c) for c in identity]).isNotNull()).select(
        "group", "member", *identity)
    who = told.unionByName(described).groupBy("group", "member").agg(
        *[F.max(c).alias(c) for c in identity])
    lives = times.select(
        "group", "member", "start_ms", "first_seen_ms", "last_seen_ms",
        F.expr("ending div 8").alias("explicit_end_ms"),
        _decode(F.col("ending") % 8, END_REASONS, 0).alias("end_reason"))
    # A member nobody said goodbye to ends at its group's first snapshot or end after it was
    # last seen (its proxy went away, or events were dropped): the group's closings and its
    # members in one order, each member with the nearest closing after it. The order is
    # reversed so that a running frame finds it (a frame to the end of the partition would
    # be computed again for every row).
    closings = events.where((typ == "group_snapshot") | typ.isin(*ENDINGS)).select(
        "group", "ts").distinct().select(
        "group", F.col("ts").alias("t"), F.lit(0).alias("k"),
        *[F.lit(None).cast(lives.schema[c].dataType).alias(c) for c in lives.columns
          if c != "group"])
    ranked = lives.select("group", F.col("last_seen_ms").alias("t"), F.lit(1).alias("k"),
                          *[c for c in lives.columns if c != "group"])
    later = Window.partitionBy("group").orderBy(F.desc("t"), F.desc("k")).rowsBetween(
        Window.unboundedPreceding, -1)
    out = (closings.unionByName(ranked)
           .withColumn("next_close", F.last(F.when(F.col("k") == 0, F.col("t")),
                                            ignorenulls=True).over(later))
           .where(F.col("k") == 1).drop("t", "k")
           .join(who, ["group", "member"], "left"))
    start = F.coalesce(F.col("start_ms"), F.col("first_seen_ms"))
    end = F.coalesce(F.col("explicit_end_ms"), F.col("next_close"))
    reason = F.when(F.col("explicit_end_ms").isNotNull(), F.col("end_reason")).when(
        F.col("next_close").isNotNull(), F.lit("gone"))
    software = F.when(F.col("software_name").isNotNull(), F.concat_ws(
        " ", F.col("software_name"), F.col("software_version"))).otherwise(F.lit("unknown"))
    return (out.select("group", "member", start.alias("start_ms"), end.alias("end_ms"),
                       reason.alias("end_reason"),
                       F.coalesce(F.col("protocol"), F.lit("unknown")).alias("protocol"),
                       software.alias("software"), *identity[1:])
            .where((F.col("start_ms") < span.end_ms)
                   & (F.col("end_ms").isNull() | (F.col("end_ms") > span.start_ms))))


def conversions(events: DataFrame, span: Span) -> DataFrame:
    """One row per online conversion of a broker's classic group to the engine, or attempt
    refused or failed, in the window (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    typ = F.col("type")
    adoption = (typ == "group_created") & F.coalesce(F.col("converted"), F.lit(False))
    rows = events.where(typ.isin(*CONVERSIONS) | adoption).select(
        "group", "ts", "seq", "source", "type", "group_epoch", "assignor", "member_count",
        "reason").dropDuplicates(["source", "seq"])
    # The adoption is the same sidecar's event right before its group_converted (among these
    # rows): an adoption that failed after its group_created is followed by an abort instead.
    ordered = Window.partitionBy("group", "source").orderBy("ts", "seq")
    previous = F.lag(F.struct("type", "ts")).over(ordered)
    converted = typ == "group_converted"
    duration = F.when(converted & (previous["type"] == "group_created"),
                      F.col("ts") - previous["ts"])
    return (rows.select(*rows.columns, duration.alias("duration_ms"))
            .where(typ.isin(*CONVERSIONS) & (F.col("ts") >= span.start_ms)
                   & (F.col("ts") < span.end_ms))
            .select("group", "ts",
                    F.when(converted, F.lit("converted")).otherwise(F.lit("aborted"))
                    .alias("outcome"),
                    F.when(converted, F.col("assignor")).alias("from_protocol"),
                    F.when(converted, F.lit(CONVERTED_TO)).alias("to"),
                    F.col("group_epoch").alias("generation"),
                    F.when(converted, F.col("member_count")).alias("members"),
                    "duration_ms", "source",
                    F.when(~converted, F.col("reason")).alias("reason")))


def migration_deltas(lives: DataFrame, span: Span, step_ms: int,
                     dimensions: tuple[str, ...] = ("protocol", "software"),
                     by_group: bool = False) -> DataFrame:
    """How many members each sample point gains or loses per category: sample ``i`` is at
    ``span.start_ms + i * step_ms``; a member counts at a sample when ``start <= t < end``."""
    from pyspark.sql import functions as F

    s = F.greatest(F.col("start_ms"), F.lit(span.start_ms))
    e = F.least(F.coalesce(F.col("end_ms"), F.lit(span.end_ms)), F.lit(span.end_ms))
    clipped = lives.select("group", *dimensions, s.alias("s"), e.alias("e")).where(
        F.col("s") < F.col("e"))

    def sample(column: str) -> Column:
        return F.ceil((F.col(column) - F.lit(span.start_ms)) / F.lit(step_ms)).cast("long")

    keys = ["group"] if by_group else []
    parts = []
    for dim in dimensions:
        for edge, sign in (("s", 1), ("e", -1)):
            parts.append(clipped.select(*keys, F.lit(dim).alias("dimension"),
                                        F.col(dim).alias("category"),
                                        sample(edge).alias("sample"),
                                        F.lit(sign).alias("delta")))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union.groupBy(*keys, "dimension", "category", "sample").agg(
        F.sum("delta").alias("delta"))


def dense_series(deltas: list[Any], samples: int) -> dict[str, dict[str, list[int]]]:
    """Cumulative members per dimension and category at each of ``samples`` points, from the
    collected rows of :func:`migration_deltas` (``dimension, category, sample, delta``)."""
    steps: dict[str, dict[str, list[int]]] = {}
    for row in deltas:
        series = steps.setdefault(row["dimension"], {}).setdefault(
            row["category"], [0] * (samples + 1))
        index = min(max(int(row["sample"]), 0), samples)
        series[index] += int(row["delta"])
    out: dict[str, dict[str, list[int]]] = {}
    for dim, categories in steps.items():
        for category, series in categories.items():
            total = 0
            values = []
            for d in series[:samples]:
                total += d
                values.append(total)
            if any(values):
                out.setdefault(dim, {})[category] = values
    return out


def groups_table(events: DataFrame, rebalances: DataFrame, downtime: DataFrame,
                 lives: DataFrame, span: Span, converted: DataFrame) -> DataFrame:
    """One row per group seen in the window: its rebalances, downtime, members now, online
    conversions (``converted``: the :func:`conversions` table)."""
    from pyspark.sql import functions as F

    in_window = (F.col("ts") >= span.start_ms) & (F.col("ts") < span.end_ms)
    seen = events.where(in_window).groupBy("group").agg(
        F.min("ts").alias("first_seen_ms"), F.max("ts").alias("last_seen_ms"),
        F.count(F.lit(1)).alias("events"),
        F.max_by(F.when(F.col("type") == "group_passed_through", F.col("reason")),
                 F.when(F.col("type") == "group_passed_through", F.col("ts")))
        .alias("passed_through"),
        F.max(F.col("type").isin("group_created", "member_joined", "group_snapshot")
              .cast("int")).alias("coordinated"))
    counted = rebalances.where(F.col("outcome") != "emptied")
    reb = counted.groupBy("group").agg(
        F.count(F.lit(1)).alias("rebalances"),
        F.sum("duration_ms").alias("rebalance_ms_total"),
        percentile("duration_ms", 0.5).alias("rebalance_ms_p50"),
        percentile("duration_ms", 0.95).alias("rebalance_ms_p95"),
        F.max("duration_ms").alias("rebalance_ms_max"),
        F.sum(F.when(F.col("outcome") == "open", 1).otherwise(0)).alias("rebalances_open"),
        F.avg("members_disturbed").alias("members_disturbed_avg"),
        F.sum("partitions_revoked").alias("partitions_revoked"))
    down = downtime.groupBy("group").agg(
        F.sum(F.when(F.col("outcome") == "assigned", 1).otherwise(0)).alias("downtimes"),
        F.sum("downtime_ms").alias("downtime_ms_total"),
        percentile("downtime_ms", 0.95).alias("downtime_ms_p95"),
        F.max("downtime_ms").alias("downtime_ms_max"),
        F.sum(F.when(F.col("outcome") == "open", 1).otherwise(0)).alias("partitions_open"))
    alive_at_end = (F.col("start_ms") < span.end_ms) & (
        F.col("end_ms").isNull() | (F.col("end_ms") >= span.end_ms))
    members = lives.groupBy("group").agg(
        F.count_distinct("member").alias("members_seen"),
        F.sum(F.when(alive_at_end & (F.col("protocol") == "classic"), 1).otherwise(0))
        .alias("classic_members_now"),
        F.sum(F.when(alive_at_end & (F.col("protocol") == "consumer"), 1).otherwise(0))
        .alias("consumer_members_now"),
        F.array_sort(F.collect_set("software")).alias("software"))
    moved = converted.groupBy("group").agg(
        F.sum((F.col("outcome") == "converted").cast("int")).alias("conversions"),
        F.sum((F.col("outcome") == "aborted").cast("int")).alias("conversions_aborted"))
    table = (seen.join(reb, "group", "left").join(down, "group", "left")
             .join(members, "group", "left").join(moved, "group", "left"))
    zero = ("rebalances", "rebalance_ms_total", "rebalances_open", "partitions_revoked",
            "downtimes", "downtime_ms_total", "partitions_open", "members_seen",
            "classic_members_now", "consumer_members_now", "conversions",
            "conversions_aborted")
    return table.fillna(0, subset=list(zero)).withColumn(
        "coordinated", F.col("coordinated") == 1)
