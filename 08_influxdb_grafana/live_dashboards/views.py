"""Bokeh models for Grafana's panels, one view per panel type, each filled anew from a `PanelResult`.

A view keeps its models and changes only their data, so a refresh sends the browser new columns, never a new
page: zoom, hidden legend entries and the scroll position stay as the reader left them. Every data source and
value text carries its panel's title as a tag, so a browser (the tests) can find what a panel holds."""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Protocol

from bokeh.layouts import column
from bokeh.models import (ColumnDataSource, CustomJSTickFormatter, DataTable, Div, FactorRange, HoverTool, Label,
                          LayoutDOM, Legend, NumeralTickFormatter, Range1d, Span, TableColumn)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from grafana_report.dashboards import Panel
from grafana_report.panels import (GAP_MS, cell_text, panel_interval_ms, threshold_color, threshold_values, unit_label,
                                   with_gaps)

from .queries import PanelResult

TITLE_HEIGHT_PX = 24
ERROR_HEIGHT_PX = 16  # kept free below each panel for a failing query's reason, so the page never jumps
FONT = "10pt"
# Grafana's `short` and `bytes` units on an axis, as grafana_report.panels writes them (SI prefixes).
_SHORT_TICKS = """
const units = [[1e9, "G"], [1e6, "M"], [1e3, "k"]];
for (const [size, suffix] of units)
  if (Math.abs(tick) >= size) return Number((tick / size).toPrecision(4)) + suffix;
return String(Number(tick.toFixed(2)));
"""
_BYTE_TICKS = """
if (Math.abs(tick) < 1000) return tick.toFixed(0) + " B";
let value = tick;
for (const unit of ["kB", "MB", "GB"]) {
  value /= 1000;
  if (Math.abs(value) < 1000 || unit == "GB") return value.toFixed(1) + " " + unit;
}
"""


class PanelView(Protocol):
    layout: LayoutDOM

    def show(self, result: PanelResult) -> None: ...


def _figure(panel: Panel, width_px: int, height_px: int, **options: object) -> figure:
    plot = figure(width=width_px, height=height_px, toolbar_location=None, tools="", min_border_left=50,
                  min_border_right=10, min_border_top=5, min_border_bottom=25, **options)
    plot.outline_line_color = None
    plot.tags = [panel.title]
    return plot


class TimeSeriesView:
    """Grafana's time series: a line per series (points too while it has few), over the panel's range."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.figure = _figure(panel, width_px, height_px, x_axis_type="datetime", x_range=Range1d(0, 1))
        self.figure.add_tools(HoverTool(tooltips=[("", "@label"), ("time", "@time{%F %T}"), ("value", "@value")],
                                        formatters={"@time": "datetime"}))
        unit = panel.config.get("unit")
        if unit == "bytes":
            self.figure.yaxis.formatter = CustomJSTickFormatter(code=_BYTE_TICKS)
        elif unit == "short":
            self.figure.yaxis.formatter = CustomJSTickFormatter(code=_SHORT_TICKS)
        elif unit == "percentunit":  # a share of 1, shown as Grafana does: 17%
            self.figure.yaxis.formatter = NumeralTickFormatter(format="0%")
        self.figure.yaxis.axis_label = unit_label(panel) if unit != "bytes" else ""
        if panel.config.get("min") is not None:
            self.figure.y_range.start = panel.config["min"]
        self.figure.add_layout(Legend(label_text_font_size="8pt", glyph_height=10, spacing=0, padding=4,
                                      click_policy="hide", border_line_alpha=0), "right")
        self.no_data = Label(x=width_px / 2 - 80, y=height_px / 2 - 40, x_units="screen", y_units="screen",
                             text="No data", text_color="grey", text_font_size="12pt")
        self.figure.add_layout(self.no_data)
        self.sources: dict[str, ColumnDataSource] = {}
        self.points: dict[str, object] = {}  # label -> its scatter renderer, shown while the series has few points
        self.layout = self.figure

    def _source(self, label: str) -> ColumnDataSource:
        if label not in self.sources:
            color = Category10_10[len(self.sources) % len(Category10_10)]
            source = ColumnDataSource({"time": [], "value": [], "label": []}, tags=[self.panel.title])
            self.figure.line("time", "value", source=source, color=color, line_width=1.5, legend_label=label)
            # Not in the legend: a legend entry greys out while any of its renderers is hidden.
            self.points[label] = self.figure.scatter("time", "value", source=source, color=color, size=4)
            self.sources[label] = source
        return self.sources[label]

    def show(self, result: PanelResult) -> None:
        gap_ms = max(GAP_MS, 3 * panel_interval_ms(self.panel, result.time_range))
        shown = set()
        for entry in result.series:
            if not entry.values:
                continue
            times_ms, values = with_gaps(entry, gap_ms)
            self._source(entry.label).data = {"time": times_ms, "value": values, "label": [entry.label] * len(values)}
            self.points[entry.label].visible = len(entry.values) < 20  # type: ignore[attr-defined]
            shown.add(entry.label)
        for label, source in self.sources.items():
            if label not in shown:  # a series gone from the range (a stage stopped an hour ago)
                source.data = {"time": [], "value": [], "label": []}
        self.no_data.visible = not shown
        self.figure.x_range.update(start=result.time_range.start_ms, end=result.time_range.end_ms)


class BarView:
    """Grafana's gauge and bar gauge: a horizontal bar per series at its last value, coloured by the thresholds,
    in front of a grey bar to the panel's maximum."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.figure = _figure(panel, width_px, height_px, y_range=FactorRange(), x_range=Range1d(0, 1))
        self.figure.min_border_left = 110
        self.source = ColumnDataSource({"label": [], "value": [], "top": [], "color": [], "text": []},
                                       tags=[panel.title])
        self.figure.hbar(y="label", right="top", height=0.6, color="#eeeeee", source=self.source)
        self.figure.hbar(y="label", right="value", height=0.6, color="color", source=self.source)
        self.figure.text(x="top", y="label", text="text", source=self.source, text_align="right",
                         text_baseline="middle", x_offset=-4, text_font_size=FONT)
        for value in threshold_values(panel):  # the 40 % mark of the duty cycle
            self.figure.add_layout(Span(location=value, dimension="height", line_dash="dashed", line_color="grey"))
        self.figure.xgrid.visible = self.figure.ygrid.visible = False
        self.layout = self.figure

    def show(self, result: PanelResult) -> None:
        series = [entry for entry in result.series if entry.values]
        values = [entry.values[-1] for entry in series]
        top = self.panel.config.get("max") or (max(values, default=0) * 1.25 or 1)
        decimals = self.panel.config.get("decimals", 1)
        unit = unit_label(self.panel)
        self.source.data = {"label": [entry.label for entry in series], "value": [min(value, top) for value in values],
                            "top": [top] * len(values), "color": [threshold_color(self.panel, v) for v in values],
                            "text": [f"{value:,.{decimals}f} {unit}".strip() for value in values]}
        self.figure.y_range.factors = [entry.label for entry in reversed(series)]  # the first series on top
        self.figure.x_range.update(start=self.panel.config.get("min", 0), end=top)


class PieView:
    """Grafana's donut: a wedge per series, its size the sum of the series' values."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.figure = _figure(panel, width_px, height_px, x_range=Range1d(-1, 1), y_range=Range1d(-1, 1))
        self.figure.axis.visible = False
        self.figure.grid.visible = False
        self.source = ColumnDataSource({"legend": [], "value": [], "start": [], "end": [], "color": []},
                                       tags=[panel.title])
        # Radii in pixels: a circle whatever the panel's proportions.
        radius_px = min(width_px, height_px) * 0.4
        self.figure.annular_wedge(x=0, y=0, inner_radius=radius_px * 0.55, outer_radius=radius_px,
                                  inner_radius_units="screen", outer_radius_units="screen", start_angle="start",
                                  end_angle="end", color="color", legend_field="legend", source=self.source)
        self.figure.legend.location = "top_left"
        self.figure.legend.label_text_font_size = "8pt"
        self.layout = self.figure

    def show(self, result: PanelResult) -> None:
        series = [entry for entry in result.series if entry.values]
        values = [sum(entry.values) for entry in series]
        total = sum(values) or 1.0
        ends = [2 * math.pi * sum(values[:index + 1]) / total for index in range(len(values))]
        self.source.data = {
            "legend": [f"{entry.label} ({value:,.0f}, {value / total:.0%})" for entry, value in zip(series, values)],
            "value": values, "start": [0.0, *ends[:-1]], "end": ends,
            "color": [Category10_10[index % len(Category10_10)] for index in range(len(values))]}


class StatView:
    """Grafana's stat: one big number, the sum of the series' last values, coloured by the thresholds."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.div = Div(width=width_px, height=height_px, tags=[panel.title],
                       styles={"display": "flex", "align-items": "center", "justify-content": "center"})
        self.layout = self.div

    def show(self, result: PanelResult) -> None:
        values = [entry.values[-1] for entry in result.series if entry.values]
        if not values:
            self.div.text = '<span style="color: grey; font-size: 14pt">No data</span>'
            return
        value = sum(values)
        color = threshold_color(self.panel, value)
        self.div.text = f'<span style="font-size: 30pt; font-weight: 600; color: {color}">{value:,.0f}</span>'


class TableView:
    """Grafana's table: the first series' rows, newest first as the query orders them."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.source = ColumnDataSource({}, tags=[panel.title])
        self.table = DataTable(source=self.source, columns=[], width=width_px, height=height_px, index_position=None)
        self.layout = self.table

    def show(self, result: PanelResult) -> None:
        if not result.series:
            self.source.data = {name: [] for name in self.source.data}
            return
        entry = result.series[0]
        if [column.field for column in self.table.columns] != entry.columns:
            self.table.columns = [TableColumn(field=name, title=name, width=150 if name in ("time", "stage") else 600)
                                  for name in entry.columns]
        self.source.data = {name: [cell_text(row[index]) for row in entry.rows]
                            for index, name in enumerate(entry.columns)}


class UnknownView:
    """A panel type these pages do not draw: said, rather than left out."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.layout = Div(text=f"panel type {html.escape(panel.type)!r} is not shown here", width=width_px,
                          height=height_px)

    def show(self, result: PanelResult) -> None:
        pass


_VIEWS: dict[str, type] = {"timeseries": TimeSeriesView, "gauge": BarView, "bargauge": BarView, "piechart": PieView,
                           "stat": StatView, "table": TableView}


class PanelFrame:
    """A panel as Grafana frames it: its title (and own range) above, a failing query's reason below."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        title = html.escape(panel.title) + (f' <span style="color: grey">(last {html.escape(panel.time_from)})</span>'
                                            if panel.time_from else "")
        self.title = Div(text=title, width=width_px, height=TITLE_HEIGHT_PX, tags=[panel.title],
                         styles={"font-weight": "600", "font-size": FONT})
        body_height_px = height_px - TITLE_HEIGHT_PX - ERROR_HEIGHT_PX
        self.view: PanelView = _VIEWS.get(panel.type, UnknownView)(panel, width_px, body_height_px)
        self.error = Div(text="", width=width_px, height=ERROR_HEIGHT_PX, styles={"color": "#d62728",
                                                                                 "font-size": "8pt"})
        self.layout = column(self.title, self.view.layout, self.error, width=width_px, height=height_px)

    def show(self, result: PanelResult) -> None:
        self.view.show(result)
        self.error.text = f"query failed: {html.escape(result.error)}" if result.error else ""


def panel_frames(panels: Sequence[Panel], page_width_px: int, columns: int, row_height_px: int) -> list[PanelFrame]:
    """A frame per panel, sized by Grafana's grid (`columns` wide, `row_height_px` per row)."""
    return [PanelFrame(panel, int(panel.grid["w"] * page_width_px / columns) - 10, panel.grid["h"] * row_height_px)
            for panel in panels]

