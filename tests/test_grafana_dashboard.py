"""The Grafana dashboard in docs/grafana: its panels, queries, variables and data sources.

Reads the JSON model only (no database, no Grafana): every query names a metric the package
exposes, uses only variables the dashboard defines, and reads from the ``${datasource}`` variable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "workhorse-dashboard.json"

OBSERVABILITY_DOC = DASHBOARD.parent.parent / "observability.md"


def documented() -> dict[str, str]:
    """The metrics docs/observability.md's tables document, with their types, by the names
    Prometheus exposes them under (a counter's ends in _total). test_metrics holds that list to
    what the endpoint serves, so the dashboard is held to the code through it."""
    text = OBSERVABILITY_DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"^\| `(workhorse_[a-z_]+)` \| (counter|histogram|gauge) \|", text, re.M))


DOCUMENTED = documented()
COUNTERS = frozenset(name for name, kind in DOCUMENTED.items() if kind == "counter")
# Histogram families: exposed only as <family>_bucket, <family>_sum and <family>_count.
HISTOGRAMS = frozenset(name for name, kind in DOCUMENTED.items() if kind == "histogram")
GAUGES = frozenset(name for name, kind in DOCUMENTED.items() if kind == "gauge")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

METRIC_NAME = re.compile(r"workhorse_[a-z_]+")
# Grafana's variable syntaxes: $name, ${name}, ${name:format} and the older [[name]].
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def load() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as f:
        dashboard: dict[str, Any] = json.load(f)
    return dashboard


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels nested in collapsed rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in all_panels(dashboard["panels"]) if panel["type"] != "row"]


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target.get("expr", "") for panel in query_panels(dashboard) for target in panel.get("targets", [])]


def variable_queries(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL of the query variables (their definition and their query, string or object)."""
    out = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        out.append(variable.get("definition", ""))
        query = variable.get("query", "")
        out.append(query.get("query", "") if isinstance(query, dict) else query)
    return out


def unknown_metrics(expr: str) -> list[str]:
    """The workhorse_* names in ``expr`` that are no exposed series of a documented metric."""
    unknown = []
    for name in METRIC_NAME.findall(expr):
        if name in COUNTERS or name in GAUGES:
            continue
        family = next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if family not in HISTOGRAMS:
            unknown.append(name)
    return unknown


def variables_used(text: str) -> set[str]:
    return {next(group for group in match.groups() if group) for match in VARIABLE.finditer(text)}


def datasource_references(node: Any) -> Iterator[Any]:
    """Every value under a "datasource" key, anywhere in the model."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasource_references(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasource_references(item)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load()


def test_identity(dashboard):
    assert dashboard["uid"] == "django-workhorse"
    assert dashboard["title"] == "django-workhorse"
    assert dashboard["schemaVersion"] == 39


def test_rows(dashboard):
    rows = [panel["title"] for panel in all_panels(dashboard["panels"]) if panel["type"] == "row"]
    assert rows == ["Queues", "Workers", "Enqueue & dedup", "Schedules"]


def test_panel_ids_are_unique_integers(dashboard):
    ids = [panel.get("id") for panel in all_panels(dashboard["panels"])]
    assert all(isinstance(i, int) and not isinstance(i, bool) for i in ids), ids
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"duplicate panel ids: {duplicates}"


def test_grid_positions(dashboard):
    for panel in all_panels(dashboard["panels"]):
        pos = panel.get("gridPos")
        assert pos is not None, f"panel {panel['id']} has no gridPos"
        assert all(isinstance(pos.get(k), int) for k in "hwxy"), (panel["id"], pos)
        assert pos["h"] > 0 and pos["w"] > 0 and pos["x"] >= 0 and pos["y"] >= 0, (panel["id"], pos)
        assert pos["x"] + pos["w"] <= 24, f"panel {panel['id']} is wider than the grid: {pos}"
    # The top-level panels are laid out as Grafana opens the dashboard: none may cover another.
    cells: dict[tuple[int, int], int] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {panel['id']} overlap"
                cells[(x, y)] = panel["id"]


def test_every_panel_has_a_query(dashboard):
    panels = query_panels(dashboard)
    assert panels
    for panel in panels:
        queries = [target.get("expr", "").strip() for target in panel.get("targets", [])]
        assert any(queries), f"panel {panel['id']} ({panel.get('title')!r}) has no target with an expr"
        assert all(queries), f"panel {panel['id']} ({panel.get('title')!r}) has a target with an empty expr"


def test_metric_names_are_documented(dashboard):
    queries = exprs(dashboard) + variable_queries(dashboard)
    unknown = {name: expr for expr in queries for name in unknown_metrics(expr)}
    assert not unknown, f"metrics no documented series is named: {unknown}"
    used = {name for expr in queries for name in METRIC_NAME.findall(expr)}
    assert used, "no query names a workhorse_ metric"


@pytest.mark.parametrize(
    ("expr", "unknown"),
    [
        ('sum(rate(workhorse_attempts_finished_total{queue=~"$queue"}[5m]))', []),
        ("histogram_quantile(0.95, sum by (le) (rate(workhorse_claim_duration_seconds_bucket[5m])))", []),
        ("sum(rate(workhorse_atempts_finished_total[5m]))", ["workhorse_atempts_finished_total"]),
        # A counter without _total, a histogram without a series suffix, a gauge with one: none is exposed.
        ("sum(rate(workhorse_reclaims[5m]))", ["workhorse_reclaims"]),
        ("rate(workhorse_handler_duration_seconds[5m])", ["workhorse_handler_duration_seconds"]),
        ("workhorse_jobs_count", ["workhorse_jobs_count"]),
    ],
)
def test_unknown_metrics_are_caught(expr, unknown):
    assert unknown_metrics(expr) == unknown


def test_variables_are_defined(dashboard):
    defined = {variable["name"] for variable in dashboard["templating"]["list"]}
    queries = exprs(dashboard) + variable_queries(dashboard)
    # Names starting with __ are Grafana's own ($__rate_interval, $__range, ...).
    used = {name for expr in queries for name in variables_used(expr) if not name.startswith("__")}
    assert used <= defined, f"undefined variables: {sorted(used - defined)}"
    assert {"queue", "scope"} <= used, "the queue and scope variables select nothing"


def test_variable_definitions(dashboard):
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, query in [
        ("queue", "label_values(workhorse_jobs, queue)"),
        ("scope", "label_values(workhorse_keyed_requests_total, scope)"),
    ]:
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["multi"] is True
        assert variable["includeAll"] is True
        assert variable["definition"] == query
        assert query in variable_queries({"templating": {"list": [variable]}})


def test_datasources_are_the_variable(dashboard):
    references = list(datasource_references(dashboard))
    assert references, "no panel or target names its data source"
    wrong = [ref for ref in references if ref not in (DATASOURCE, "${datasource}")]
    assert not wrong, f"data sources other than ${{datasource}}: {wrong}"
    for panel in query_panels(dashboard):
        assert panel.get("datasource") in (DATASOURCE, "${datasource}"), f"panel {panel['id']} has no data source"
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) in (DATASOURCE, "${datasource}")
