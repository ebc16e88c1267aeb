"""The provisioned dashboards as data: their panels, InfluxQL targets and template variables."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_core import paths

DASHBOARDS_DIR = paths.INFLUXDB_GRAFANA_DIR / "grafana" / "dashboards"


@dataclass(frozen=True)
class Target:
    query: str
    alias: str
    result_format: str


@dataclass(frozen=True)
class Panel:
    title: str
    type: str
    grid: dict[str, int]  # Grafana's gridPos: x, y, w, h on a 24-column grid
    targets: tuple[Target, ...]
    time_from: str | None  # a relative range overriding the dashboard's, e.g. "7d"
    min_interval: str | None  # the lower bound of $__interval, e.g. "10s" for points written every 10 s
    config: dict[str, Any]  # fieldConfig.defaults: unit, min, max, thresholds


@dataclass(frozen=True)
class Variable:
    name: str
    query: str
    regex: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    variables: tuple[Variable, ...]
    time: dict[str, str]
    path: Path


def load_dashboard(path: Path) -> Dashboard:
    data = json.loads(path.read_text())
    panels = tuple(
        Panel(title=panel["title"], type=panel["type"], grid=panel["gridPos"],
              targets=tuple(Target(t["query"], t.get("alias", ""), t.get("resultFormat", "time_series"))
                            for t in panel.get("targets", []) if t.get("rawQuery")),
              time_from=panel.get("timeFrom"), min_interval=panel.get("interval"),
              config=panel.get("fieldConfig", {}).get("defaults", {}))
        for panel in data["panels"])
    variables = tuple(Variable(v["name"], v["query"], v.get("regex", ""))
                      for v in data.get("templating", {}).get("list", []) if v.get("type") == "query")
    return Dashboard(data["uid"], data["title"], panels, variables, data.get("time", {}), path)


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> list[Dashboard]:
    return [load_dashboard(path) for path in sorted(directory.glob("*.json"))]


def panel_queries(dashboard: Dashboard) -> Iterator[tuple[Panel, Target]]:
    for panel in dashboard.panels:
        for target in panel.targets:
            yield panel, target
