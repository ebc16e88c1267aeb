"""The provisioned dashboards as data: their panels, InfluxQL targets and template variables."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_core import paths

DASHBOARDS_DIR = paths.INFLUXDB_GRAFANA_DIR / "grafana" / "dashboards"
ALL = "$__all"  # Grafana's value of a variable set to "All"


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
    max_data_points: int | None  # at most this many points per series (Grafana: else the panel's width in pixels)
    config: dict[str, Any]  # fieldConfig.defaults: unit, min, max, thresholds, noValue
    options: dict[str, Any]  # the panel's options: its legend (displayMode, placement, calcs, sortBy, sortDesc)
    description: str = ""

    @property
    def legend(self) -> dict[str, Any]:
        return self.options.get("legend", {})


@dataclass(frozen=True)
class Variable:
    """A template variable: `query` (values from InfluxDB), `custom` (values listed in the query, comma-separated)
    or `constant`; `current` is what the dashboard opens with, ALL or values."""

    name: str
    type: str
    query: str
    regex: str = ""
    label: str = ""
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None  # what "All" stands for in a query; None: every value, as a regex alternation
    hidden: bool = False
    current: tuple[str, ...] = ()

    @property
    def opens_on_all(self) -> bool:
        return self.current == (ALL,)


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    panels: tuple[Panel, ...]
    variables: tuple[Variable, ...]
    time: dict[str, str]
    path: Path
    description: str = ""


def _current(variable: dict[str, Any]) -> tuple[str, ...]:
    value = variable.get("current", {}).get("value", [])
    values = value if isinstance(value, list) else [value]
    return tuple(str(item) for item in values if item is not None and item != "")


def load_dashboard(path: Path) -> Dashboard:
    data = json.loads(path.read_text())
    panels = tuple(
        Panel(title=panel["title"], type=panel["type"], grid=panel["gridPos"],
              targets=tuple(Target(t["query"], t.get("alias", ""), t.get("resultFormat", "time_series"))
                            for t in panel.get("targets", []) if t.get("rawQuery")),
              time_from=panel.get("timeFrom"), min_interval=panel.get("interval"),
              max_data_points=panel.get("maxDataPoints"),
              config=panel.get("fieldConfig", {}).get("defaults", {}), options=panel.get("options", {}),
              description=panel.get("description", ""))
        for panel in data["panels"])
    variables = tuple(
        Variable(name=v["name"], type=v["type"], query=v.get("query", ""), regex=v.get("regex", ""),
                 label=v.get("label") or v["name"], multi=bool(v.get("multi")), include_all=bool(v.get("includeAll")),
                 all_value=v.get("allValue") or None, hidden=v.get("hide", 0) == 2, current=_current(v))
        for v in data.get("templating", {}).get("list", []) if v.get("type") in ("query", "custom", "constant"))
    return Dashboard(data["uid"], data["title"], panels, variables, data.get("time", {}), path,
                     data.get("description", ""))


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> list[Dashboard]:
    return [load_dashboard(path) for path in sorted(directory.glob("*.json"))]


def panel_queries(dashboard: Dashboard) -> Iterator[tuple[Panel, Target]]:
    for panel in dashboard.panels:
        for target in panel.targets:
            yield panel, target
