"""The Grafana dashboard (``deploy/grafana/groupgate.json``) and the metrics reference in
``docs/operations.md`` cannot drift from the metrics the proxy exports: every metric a panel
queries exists in :mod:`proxy.metrics`, with every label the query names, and every metric
the proxy exports is in the reference and on the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from proxy import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "groupgate.json"
OPERATIONS = ROOT / "docs" / "operations.md"

SCRAPE_LABELS = frozenset({"instance", "job", "pod", "namespace", "service", "container",
                           "endpoint"})
"""Labels Prometheus (or the Prometheus Operator) adds to every scraped series."""
_NAME = re.compile(r"\bgroupgate_[a-z_]+")
_SELECTOR = re.compile(r"\b(groupgate_[a-z_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exported() -> dict[str, frozenset[str]]:
    """Every metric family the proxy exports -> its label names (``le`` included for a
    histogram's buckets)."""
    families: dict[str, frozenset[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            names = frozenset(value._labelnames)  # the declared label names
            families[value._name] = names | ({"le"} if value._type == "histogram" else set())
    # the custom collectors publish what was counted: count something of each first
    metrics.RequestCounters("bootstrap").inc(3)
    metrics.traffic("bootstrap")
    metrics.observe_request(3, 0.001)
    for family in metrics.REGISTRY.collect():
        if family.name not in families:
            families[family.name] = frozenset(
                label for sample in family.samples for label in sample.labels)
    return families


def family_of(series: str, families: dict[str, Any]) -> str | None:
    """The family a series name belongs to (``_total``, ``_bucket``, ``_sum``, ``_count``
    suffixes removed), or None."""
    for suffix in ("", "_total", "_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            base = series[:len(series) - len(suffix)] if suffix else series
            if base in families:
                return base
    return None


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and (key in ("expr", "definition") or (
                        key == "query" and "groupgate_" in value)):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return found


def test_every_metric_the_dashboard_queries_exists_with_its_labels() -> None:
    families = exported()
    exprs = queries()
    assert len(exprs) > 20
    for expr in exprs:
        names = _NAME.findall(expr)
        assert names, f"a query of no groupgate metric: {expr}"
        used = {family_of(name, families) for name in names}
        assert None not in used, f"{expr}: not exported by proxy/metrics.py: {names}"
        labels = {m for _n, body in _SELECTOR.findall(expr) for m in _MATCHER.findall(body)}
        labels |= {label.strip() for group in _GROUPING.findall(expr)
                   for label in group.split(",") if label.strip()}
        known = set().union(*(families[f] for f in used if f is not None)) | SCRAPE_LABELS
        assert labels <= known, f"{expr}: labels {sorted(labels - known)} not on {used}"


def test_every_exported_metric_is_on_the_dashboard_and_documented() -> None:
    families = exported()
    on_dashboard = {family_of(n, families) for e in queries() for n in _NAME.findall(e)}
    assert set(families) - on_dashboard == set()
    reference = OPERATIONS.read_text()
    documented = {family_of(n, families) for n in _NAME.findall(reference)}
    assert set(families) - documented == set()


def test_the_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "groupgate" and dashboard["title"] == "groupgate"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
