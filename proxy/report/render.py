"""The HTML report: one self-contained file, plots embedded as PNG (base64 data URIs), no
network resources. A small inline script sorts tables when a header is clicked and marks the
page once every plot has loaded (``data-plots-loaded`` on ``<body>``), which the browser test
reads."""

from __future__ import annotations

import base64
import datetime as dt
import html as html_mod
import io
from collections.abc import Sequence
from typing import Any

PROTOCOL_COLORS = {"classic": "#d62728", "consumer": "#2ca02c", "unknown": "#7f7f7f"}
TOP_SOFTWARE = 8


def _figure(width: float = 9.0, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _png(fig: Any, alt: str) -> str:
    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img class="plot" alt="{html_mod.escape(alt)}" src="data:image/png;base64,{data}">'


def _dates(times: Sequence[int]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(t / 1000, tz=dt.UTC) for t in times]


def _stack(times: Sequence[int], series: dict[str, list[int]], title: str, alt: str,
           colors: dict[str, str] | None = None, top: int | None = None) -> str:
    fig, ax = _figure()
    items = sorted(series.items(), key=lambda kv: -max(kv[1], default=0))
    if top is not None and len(items) > top:
        rest = [sum(vals) for vals in zip(*(v for _, v in items[top:]), strict=True)]
        items = [*items[:top], ("other", rest)]
    if items:
        ax.stackplot(_dates(times), *[v for _, v in items], labels=[k for k, _ in items],
                     colors=[(colors or {}).get(k) for k, _ in items] if colors else None,
                     alpha=0.85)
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("members")
    fig.autofmt_xdate()
    return _png(fig, alt)


def _histogram(values: Sequence[float], title: str, xlabel: str, alt: str,
               marks: Sequence[tuple[str, float | None]] = ()) -> str:
    """A log-scale histogram; ``marks``: labelled vertical lines (the report's percentiles,
    computed over every value, where ``values`` may be a sample)."""
    import numpy as np

    fig, ax = _figure()
    positive = [max(v, 1.0) for v in values]
    if positive:
        lo, hi = min(positive), max(positive)
        bins = np.logspace(np.log10(lo), np.log10(hi * 1.01 + 1), 40)
        ax.hist(positive, bins=bins, color="#1f77b4")
        ax.set_xscale("log")
        for (label, x), style in zip(marks, ("--", ":", "-."), strict=False):
            if x is not None:
                ax.axvline(max(x, 1.0), color="black", linestyle=style, linewidth=1,
                           label=f"{label} {_ms(x)}")
        if marks:
            ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "none in the window", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    return _png(fig, alt)


def _bars(times: Sequence[int], counts: Sequence[int], title: str, alt: str,
          step_ms: int) -> str:
    fig, ax = _figure()
    width = dt.timedelta(milliseconds=step_ms * 0.9)
    ax.bar(_dates(times), counts, width=width, align="edge", color="#ff7f0e")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("rebalances started")
    fig.autofmt_xdate()
    return _png(fig, alt)


def _disturbed(counts: dict[int, int]) -> str:
    fig, ax = _figure(6.0, 3.2)
    keys = sorted(counts)
    ax.bar([str(k) for k in keys], [counts[k] for k in keys], color="#9467bd")
    ax.set_title("Members disturbed per rebalance", fontsize=10)
    ax.set_xlabel("members whose partitions were assigned or revoked")
    ax.set_ylabel("rebalances")
    return _png(fig, "members disturbed per rebalance")


def _worst(worst: Sequence[dict[str, Any]]) -> str:
    fig, ax = _figure(9.0, max(2.5, 0.35 * len(worst) + 1))
    names = [w["group"] for w in worst][::-1]
    values = [(w["downtime_ms_total"] or 0) / 1000 for w in worst][::-1]
    ax.barh(names, values, color="#8c564b")
    ax.set_title("Worst groups: partition downtime in the window", fontsize=10)
    ax.set_xlabel("seconds of partition downtime (sum over partitions)")
    return _png(fig, "worst groups by partition downtime")


def _timeline(rebalances: Sequence[tuple[int, int | None, int]], title: str) -> str:
    fig, ax = _figure(9.0, 2.8)
    done = [(t, d) for t, d, _ in rebalances if d is not None]
    if done:
        ax.scatter(_dates([t for t, _ in done]), [max(d, 1) / 1000 for _, d in done], s=12,
                   color="#1f77b4")
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("rebalance duration (s)")
    fig.autofmt_xdate()
    return _png(fig, title)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1000:
        return f"{value:.0f} ms"
    if value < 120_000:
        return f"{value / 1000:.1f} s"
    return f"{value / 60_000:.1f} min"


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _e(value: object) -> str:
    return html_mod.escape(str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: set[int],
           cls: str = "sortable") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            if i in numeric and isinstance(value, tuple):
                shown, key = value
                cells.append(f'<td class="n" data-sort="{_e(key)}">{_e(shown)}</td>')
            elif i in numeric:
                cells.append(f'<td class="n" data-sort="{_e(value)}">{_e(value)}</td>')
            else:
                cells.append(f"<td>{_e(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _timed(ms: float | None) -> tuple[str, float]:
    return _ms(ms), -1.0 if ms is None else float(ms)


def skipped_note(summary: dict[str, Any]) -> str:
    """The heading's words on events of schema versions the report does not read (empty
    when there were none)."""
    left_out = summary.get("events_skipped") or {}
    if not left_out:
        return ""
    total = sum(left_out.values())
    versions = ", ".join(f"{'without a version' if v == 'none' else 'version ' + v}: {n:,}"
                         for v, n in left_out.items())
    known = ", ".join(str(v) for v in summary.get("schema_versions", []))
    return (f" {total:,} events of a schema version this report does not read were skipped "
            f"({versions}; it reads {known or '-'}).")


def migration_tables(conversions: Sequence[dict[str, Any]],
                     aborted: Sequence[dict[str, Any]]) -> list[str]:
    """The online upgrade of the broker's classic groups: each conversion to the engine and
    each refused or failed attempt, by group and time (the ``conversions`` table's rows)."""
    parts = ["<h3>Conversions to the engine</h3>"]
    if conversions:
        parts.append(_table(
            ["group", "time", "from", "to", "generation", "members converted", "duration",
             "sidecar"],
            [[c["group"], _when(c["ts"]), f'classic ({c["from_protocol"] or "?"})', c["to"],
              "-" if c["generation"] is None else c["generation"],
              "-" if c["members"] is None else c["members"], _timed(c["duration_ms"]),
              c["source"]] for c in conversions],
            numeric={4, 5, 6}))
    else:
        parts.append('<p class="note">No broker group was converted online in the '
                     "window.</p>")
    if aborted:
        parts.append("<h3>Conversions aborted</h3>")
        parts.append('<p class="note">Attempts refused or failed; the group stayed the '
                     "broker's and was tried again later.</p>")
        parts.append(_table(
            ["group", "time", "generation", "reason", "sidecar"],
            [[a["group"], _when(a["ts"]), "-" if a["generation"] is None else a["generation"],
              a["reason"] or "-", a["source"]] for a in aborted],
            numeric={2}))
    return parts


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; } th { background: #f3f3f3; cursor: pointer; }
td.n { text-align: right; } .plot { display: block; max-width: 100%; margin: 0.5em 0; }
.kpi { display: inline-block; margin: 0 1.5em 0.5em 0; } .kpi b { font-size: 1.3em; }
.note { color: #666; font-size: 0.85em; }
"""

SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function (th, index) {
  th.addEventListener('click', function () {
    var table = th.closest('table');
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var ascending = th.dataset.order !== 'asc';
    th.dataset.order = ascending ? 'asc' : 'desc';
    rows.sort(function (a, b) {
      var x = a.cells[index], y = b.cells[index];
      var p = x.dataset.sort !== undefined ? parseFloat(x.dataset.sort) : x.textContent;
      var q = y.dataset.sort !== undefined ? parseFloat(y.dataset.sort) : y.textContent;
      var c = typeof p === 'number' ? p - q : String(p).localeCompare(String(q));
      return ascending ? c : -c;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
window.addEventListener('load', function () {
  var plots = Array.prototype.slice.call(document.querySelectorAll('img.plot'));
  var loaded = plots.filter(function (img) { return img.complete && img.naturalWidth > 0; });
  document.body.dataset.plotsLoaded = loaded.length + '/' + plots.length;
});
"""


def html(data: dict[str, Any], title: str) -> str:
    s = data["summary"]
    times = data["times"]
    series = data["series"]
    parts = [f"<h1>{_e(title)}</h1>",
             f'<p class="note">Window {_e(_when(s["window_start_ms"]))} to '
             f'{_e(_when(s["window_end_ms"]))}; {s["events"]:,} events; computed in '
             f'{s.get("seconds", "?")} s. Percentiles: {_e(s.get("percentiles", "-"))}. '
             f'Definitions: docs/pipeline.md.{_e(skipped_note(s))}</p>']
    share = s["classic_share_now"]
    kpis = [("groups", f'{s["groups"]:,}'), ("coordinated", f'{s["groups_coordinated"]:,}'),
            ("passed through", f'{s["groups_passed_through"]:,}'),
            ("members now", f'{s["members_now"]:,}'),
            ("classic share now", "-" if share is None else f"{share:.1%}"),
            ("rebalances", f'{s["rebalances"]:,}'),
            ("rebalance p50 / p95", f'{_ms(s["rebalance_ms_p50"])} / '
                                    f'{_ms(s["rebalance_ms_p95"])}'),
            ("partition downtime p50 / p95", f'{_ms(s["downtime_ms_p50"])} / '
                                             f'{_ms(s["downtime_ms_p95"])}'),
            ("partitions still unassigned", f'{s["partitions_open"]:,}'),
            ("conversions (aborted)", f'{s.get("conversions", 0):,} '
                                      f'({s.get("conversions_aborted", 0):,})')]
    parts.append("<div>" + "".join(f'<span class="kpi">{_e(k)}<br><b>{_e(v)}</b></span>'
                                   for k, v in kpis) + "</div>")

    parts.append("<h2>Migration</h2>")
    parts.append(_stack(times, series.get("protocol", {}), "Members by protocol",
                        "members by protocol over time", PROTOCOL_COLORS))
    parts.append(_stack(times, series.get("software", {}),
                        "Members by client software and version (KIP-511)",
                        "members by client software over time", top=TOP_SOFTWARE))
    parts.extend(migration_tables(data.get("conversions", []), data.get("aborted", [])))

    parts.append("<h2>Rebalances</h2>")
    parts.append(_bars(times, data["rebalances_per_sample"], "Rebalances started",
                       "rebalances over time", data["step_ms"]))
    parts.append(_histogram(data["durations"], "Rebalance durations (first epoch bump to "
                            "every member reconciled)", "duration (ms, log scale)",
                            "rebalance durations", (("p50", s["rebalance_ms_p50"]),
                                                    ("p95", s["rebalance_ms_p95"]))))
    parts.append(_disturbed(data["disturbed"]))

    parts.append("<h2>Partition downtime</h2>")
    parts.append(_histogram(data["downtimes"], "Partition downtime (revoked to assigned "
                            "again)", "downtime (ms, log scale)", "partition downtime",
                            (("p50", s["downtime_ms_p50"]), ("p95", s["downtime_ms_p95"]))))

    parts.append("<h2>Worst groups</h2>")
    worst = data["worst"]
    if worst:
        parts.append(_worst(worst))
    parts.append(_table(
        ["group", "rebalances", "p95 rebalance", "longest", "downtime total", "max downtime",
         "partitions unassigned", "classic now", "consumer now", "software"],
        [[w["group"], w["rebalances"], _timed(w["rebalance_ms_p95"]),
          _timed(w["rebalance_ms_max"]), _timed(w["downtime_ms_total"]),
          _timed(w["downtime_ms_max"]), w["partitions_open"], w["classic_members_now"],
          w["consumer_members_now"], ", ".join(w["software"] or [])] for w in worst],
        numeric={1, 2, 3, 4, 5, 6, 7, 8}))

    if data["passed"]:
        parts.append("<h2>Groups left to the broker</h2>")
        parts.append('<p class="note">Groups whose requests the proxy passed through to the '
                     "broker's classic coordinator, with the latest reason.</p>")
        parts.append(_table(["group", "reason", "last seen"],
                            [[p["group"], p["passed_through"], _when(p["last_seen_ms"])]
                             for p in data["passed"]], numeric=set()))

    for section in data["sections"]:
        row = section["row"]
        parts.append(f'<h2>Group {_e(section["group"])}</h2>')
        parts.append(f'<p>{row["rebalances"]} rebalances (p95 {_ms(row["rebalance_ms_p95"])}),'
                     f' partition downtime {_ms(row["downtime_ms_total"])} in all, '
                     f'{row["members_seen"]} members seen.</p>')
        parts.append(_stack(times, section["series"],
                            f'{section["group"]}: members by protocol',
                            f'{section["group"]} members by protocol', PROTOCOL_COLORS))
        parts.append(_timeline(section["rebalances"], f'{section["group"]}: rebalances'))

    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + f"<script>{SCRIPT}</script></body></html>")
