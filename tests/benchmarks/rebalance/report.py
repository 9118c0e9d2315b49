"""Rebalance benchmark output: the summary table (medians and spread) and the pictures.

:func:`summarize` groups run records by (target, protocol, client, scenario, members) and gives
the median and the min-max of every metric; :func:`markdown_table` renders it. :func:`plot_run`
draws one run: a row per member over time around the event — green while it consumes (darker
with more partitions), red while it sits in a rebalance callback, light grey while it is live
but owns nothing, white when it is not a member — and below it the number of partitions nobody
consumes. The footer records the machine and the versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from proxy.commands.machine import describe_machine, median
from tests.benchmarks.rebalance import timeline

METRICS = (
    ("convergence_s", "convergence s", "{:.2f}"),
    ("downtime_partition_s", "downtime partition-s", "{:.1f}"),
    ("members_disturbed", "members disturbed", "{:.0f}"),
    ("partitions_revoked", "partitions revoked", "{:.0f}"),
    ("duplicates", "duplicates", "{:.0f}"),
    ("peak_lag_records", "peak lag (records)", "{:.0f}"),
    ("max_record_age_s", "max record age s", "{:.1f}"),
)

KEY = ("target", "protocol", "client", "scenario", "members")


def summarize(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(tuple(run[k] for k in KEY), []).append(run)
    rows = []
    for key, members in groups.items():
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        row["runs"] = len(members)
        row["not_converged"] = sum(1 for r in members if r.get("convergence_s") is None
                                   or r.get("timed_out"))
        for metric, _, _ in METRICS:
            values = [float(r[metric]) for r in members if r.get(metric) is not None]
            row[metric] = {
                "median": median(values) if values else None,
                "min": min(values) if values else None,
                "max": max(values) if values else None,
                "values": values,
            }
        rows.append(row)
    order = {"scale-out": 0, "leave": 1, "crash": 2, "rolling": 3, "slow": 4}
    rows.sort(key=lambda r: (r["members"], order.get(r["scenario"], 9), r["target"],
                             r["protocol"], r["client"]))
    return rows


def _cell(stat: dict[str, Any], fmt: str) -> str:
    if stat["median"] is None:
        return "-"
    text = fmt.format(stat["median"])
    if len(stat["values"]) > 1 and stat["min"] != stat["max"]:
        text += f" ({fmt.format(stat['min'])}-{fmt.format(stat['max'])})"
    return text


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["members", "scenario", "target", "protocol", "client", "runs",
            *[label for _, label, _ in METRICS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        runs = str(row["runs"])
        if row["not_converged"]:
            runs += f" ({row['not_converged']} not converged)"
        cells = [str(row["members"]), row["scenario"], row["target"], row["protocol"],
                 row["client"], runs, *[_cell(row[m], f) for m, _, f in METRICS]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparison_table(rows: Sequence[dict[str, Any]], baseline: str, candidate: str) -> str:
    """Medians of ``candidate`` against ``baseline`` for every (members, scenario, protocol,
    client) both were run with: downtime and convergence, and how many times less downtime
    the candidate had (baseline / candidate; "-" when the candidate had none to divide by)."""
    index = {(r["target"], r["members"], r["scenario"], r["protocol"], r["client"]): r
             for r in rows}
    head = ["members", "scenario", "protocol", "client", f"{baseline} downtime",
            f"{candidate} downtime", "times less downtime", f"{baseline} convergence s",
            f"{candidate} convergence s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row["target"] != candidate:
            continue
        key = (row["members"], row["scenario"], row["protocol"], row["client"])
        base = index.get((baseline, *key))
        if base is None:
            continue
        b = base["downtime_partition_s"]["median"]
        c = row["downtime_partition_s"]["median"]
        times = "-" if not c or b is None else f"{b / c:.1f}"
        cells = [str(key[0]), key[1], key[2], key[3],
                 _cell(base["downtime_partition_s"], "{:.1f}"),
                 _cell(row["downtime_partition_s"], "{:.1f}"), times,
                 _cell(base["convergence_s"], "{:.2f}"), _cell(row["convergence_s"], "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_run(run: dict[str, Any], machine: dict[str, Any], versions: dict[str, Any],
             path: Path, before_s: float = 3.0) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [timeline.Event(t, m, k, tuple(p)) for t, m, k, p in run["timeline"]]
    start, end = -before_s, float(run["window_s"])
    segs = timeline.segments(events, run["partitions"], start, end)
    members = sorted({s.member for s in segs})
    row_of = {m: i for i, m in enumerate(members)}
    full = max(1, run["partitions"] // max(1, run["members"]))
    height = 2.5 + 0.12 * len(members) + 1.6
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(11, height), sharex=True,
        gridspec_kw={"height_ratios": [max(2.0, 0.12 * len(members)), 1.2]},
    )
    for seg in segs:
        if not seg.live:
            continue
        if seg.stalled:
            color: Any = "#d62728"
        elif seg.owned == 0:
            color = "#d9d9d9"
        else:
            shade = min(1.0, seg.owned / (1.5 * full))
            color = (0.15, 0.45 + 0.35 * (1 - shade), 0.15)
        ax.broken_barh([(seg.start, seg.end - seg.start)], (row_of[seg.member] - 0.4, 0.8),
                       facecolors=color, linewidth=0)
    ax.axvline(0, color="black", linestyle="--", linewidth=1)
    conv = run.get("convergence_s")
    if conv is not None:
        ax.axvline(conv, color="#1f77b4", linestyle=":", linewidth=1.2)
        ax2.axvline(conv, color="#1f77b4", linestyle=":", linewidth=1.2)
    ax.set_yticks(range(len(members)))
    ax.set_yticklabels(members, fontsize=max(3, min(8, 400 // max(1, len(members)))))
    ax.set_ylim(-0.6, len(members) - 0.4)
    ax.invert_yaxis()
    ax.set_ylabel("member")
    conv_text = "not converged" if conv is None else f"converged after {conv:.2f} s"
    ax.set_title(
        f"{run['scenario']}: {run['members']} members, {run['partitions']} partitions, "
        f"{run['target']} / {run['protocol']} ({run['client']}) - {conv_text}, downtime "
        f"{run['downtime_partition_s']:.1f} partition-s, {run['members_disturbed']} disturbed",
        fontsize=9,
    )
    fig.legend(
        handles=[Patch(color=(0.15, 0.45, 0.15), label="consuming (darker: more partitions)"),
                 Patch(color="#d62728", label="in a rebalance callback"),
                 Patch(color="#d9d9d9", label="member, owns nothing")],
        loc="lower right", ncol=3, fontsize=7, frameon=False,
    )
    series = timeline.unserved_series(events, run["partitions"], start, end)
    xs = [t for t, _ in series]
    ys = [n for _, n in series]
    ax2.step(xs, ys, where="post", color="#d62728")
    ax2.fill_between(xs, ys, step="post", color="#d62728", alpha=0.25)
    ax2.axvline(0, color="black", linestyle="--", linewidth=1)
    ax2.set_ylabel("partitions\nnot consumed", fontsize=8)
    ax2.set_xlabel("seconds since the event (dashed); dotted: converged")
    ax2.set_xlim(start, end)
    footer = (f"{describe_machine(machine)}; "
              + ", ".join(f"{k} {v}" for k, v in versions.items()))
    fig.text(0.01, 0.005, footer, fontsize=6, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def representative(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run whose downtime is the median of its group (for the picture)."""
    ordered = sorted(runs, key=lambda r: r["downtime_partition_s"])
    return ordered[(len(ordered) - 1) // 2]
