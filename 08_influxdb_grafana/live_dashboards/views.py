"""Bokeh models for Grafana's panels, one view per panel type, each filled anew from a `PanelResult`.

A view keeps its models and changes only their data, so a refresh sends the browser new columns, never a new
page: zoom and the scroll position stay as the reader left them. A time series draws its lines from a pool of
renderers that only grows to the most series it has shown (bounded by the dashboards' Top), and its legend is a
table of a fixed size beside or below the plot, which scrolls: nothing a panel holds reaches beyond its box. Every
data source and value text carries its panel's title as a tag, so a browser (the tests) can find what a panel
holds."""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Protocol

from bokeh.layouts import column, row
from bokeh.models import (ColumnDataSource, CustomJSTickFormatter, DataTable, DatetimeTickFormatter, Div,
                          FactorRange, HoverTool, Label, LayoutDOM, NumeralTickFormatter, Range1d, Span,
                          TableColumn)
from bokeh.palettes import Category10_10, Category20_20
from bokeh.plotting import figure

from grafana_report.dashboards import Panel
from grafana_report.panels import (GAP_MS, cell_text, legend_value_text, no_value_text, threshold_color,
                                   threshold_values, unit_label, with_gaps)

from .queries import PanelResult

TITLE_HEIGHT_PX = 22
ERROR_HEIGHT_PX = 16  # kept free below each panel for a failing query's reason, so the page never jumps
LEGEND_ROW_PX = 16
FEW_POINTS = 20  # a series of fewer points shows them besides its line
# A legend: a plain HTML table in a box of the panel's, scrolling where its rows are more than the box holds, in a
# smaller type than the page's so a machine's name and its axis fit beside the numbers.
LEGEND_STYLES = {"overflow-y": "auto", "overflow-x": "hidden", "font-size": "8pt", "line-height": "1.3"}
FONT = "10pt"
CALC_NAMES = {"mean": "Mean", "max": "Max", "min": "Min", "sum": "Total", "lastNotNull": "Last"}
# Time labels by the ticks' spacing (BokehJS picks the level): each names what changes from tick to tick down to the
# second, and a tick on a higher level's boundary (midnight) is labelled at that level (boundary_scaling), so no two
# labels of an axis are alike, from a minute to weeks. The date of the axis' start is written beneath it.
TIME_FORMATS = {"seconds": "%H:%M:%S", "minsec": "%H:%M:%S", "minutes": "%H:%M", "hourmin": "%H:%M",
                "hours": "%H:%M", "days": "%b %d", "months": "%b %Y", "years": "%Y"}
# Over more than a day, hours carry their day: "12:00" would stand for each of them.
DAYS_HOURS_FORMAT = "%b %d %H:%M"
DAY_MS = 86_400_000
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


def set_data(source: ColumnDataSource, data: dict[str, list]) -> None:
    """`source.data = data`, unless it holds that already: Bokeh sends a column's data to the browser whenever it is
    assigned, equal or not, and the browser draws it again; over a week most refreshes change nothing."""
    if set(source.data) != set(data) or any(not _same_column(source.data[name], column)
                                             for name, column in data.items()):
        source.data = data


def _same_column(old: Sequence, new: Sequence) -> bool:
    return len(old) == len(new) and all(a == b or (a != a and b != b) for a, b in zip(old, new))  # NaN is NaN


class PanelView(Protocol):
    layout: LayoutDOM

    def show(self, result: PanelResult) -> None: ...


def _figure(panel: Panel, width_px: int, height_px: int, **options: object) -> figure:
    plot = figure(width=width_px, height=height_px, toolbar_location=None, tools="", min_border_left=50,
                  min_border_right=10, min_border_top=5, min_border_bottom=25, **options)
    plot.outline_line_color = None
    plot.tags = [panel.title]
    return plot


def time_formatter() -> DatetimeTickFormatter:
    return DatetimeTickFormatter(**TIME_FORMATS, boundary_scaling=True, context_which="start",
                                 context=DatetimeTickFormatter(**{level: "%Y-%m-%d" for level in TIME_FORMATS}))


def _no_value_label(width_px: int, height_px: int) -> Label:
    return Label(x=width_px / 2, y=height_px / 2, x_units="screen", y_units="screen", text="", text_align="center",
                 text_baseline="middle", text_color="grey", text_font_size="12pt", visible=False)


class TimeSeriesView:
    """Grafana's time series: a line per series (points too while it has few), over the panel's range, and its
    legend as a table (Grafana's displayMode table) to the right or below, in the panel's order. All lines are one
    glyph and all points another, whatever the number of series: a page's models stay few, and so its refreshes
    cheap for the server and the browser alike."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        legend = panel.legend
        self.calcs = list(legend.get("calcs", [])) if legend.get("showLegend", True) else []
        shows_legend = legend.get("showLegend", True) and legend.get("displayMode") != "hidden"
        beside = legend.get("placement") == "right"
        legend_width_px = min(int(legend.get("width", 280)), width_px // 2) if beside else width_px
        legend_height_px = height_px if beside else min(5 * LEGEND_ROW_PX + 8, height_px // 3)
        plot_width_px = width_px - legend_width_px - 6 if shows_legend and beside else width_px
        plot_height_px = height_px - legend_height_px if shows_legend and not beside else height_px
        self.figure = _figure(panel, plot_width_px, plot_height_px, x_axis_type="datetime", x_range=Range1d(0, 1))
        self.figure.xaxis.formatter = time_formatter()
        self.lines = ColumnDataSource({"xs": [], "ys": [], "color": [], "label": []}, tags=[panel.title])
        self.points = ColumnDataSource({"x": [], "y": [], "color": [], "label": []}, tags=[panel.title])
        lines = self.figure.multi_line("xs", "ys", line_color="color", line_width=1.5, source=self.lines)
        self.figure.scatter("x", "y", color="color", size=4, source=self.points)  # the series of few points
        self.figure.add_tools(HoverTool(tooltips=[("", "@label"), ("time", "$x{%F %T}"), ("value", "$y")],
                                        formatters={"$x": "datetime"}, renderers=[lines]))
        unit = panel.config.get("unit")
        if unit == "bytes":
            self.figure.yaxis.formatter = CustomJSTickFormatter(code=_BYTE_TICKS)
        elif unit in ("short", "cps"):
            self.figure.yaxis.formatter = CustomJSTickFormatter(code=_SHORT_TICKS)
        elif unit == "percentunit":  # a share of 1, shown as Grafana does: 17%
            self.figure.yaxis.formatter = NumeralTickFormatter(format="0%")
        self.figure.yaxis.axis_label = unit_label(panel) if unit != "bytes" else ""
        if panel.config.get("min") is not None:
            self.figure.y_range.start = panel.config["min"]
        self.no_data = _no_value_label(plot_width_px, plot_height_px)
        self.figure.add_layout(self.no_data)
        # Tagged apart from the panel's own models: its text is HTML, not a value of the panel.
        self.legend = Div(text="", width=legend_width_px, height=legend_height_px, styles=LEGEND_STYLES,
                          tags=[f"{panel.title} (legend)"], visible=shows_legend)
        parts = [self.figure, self.legend] if shows_legend else [self.figure]
        self.layout = (row(*parts, width=width_px, height=height_px) if beside
                       else column(*parts, width=width_px, height=height_px))

    def _legend_html(self, drawn: list, colors: list[str]) -> str:
        """Grafana's table legend: a row per series in the panel's order, its calcs beside; a name too long for the
        box is cut (all of it in its tooltip). Nothing without series."""
        if not drawn:
            return ""
        right = 'style="text-align: right; white-space: nowrap"'
        header = "".join(f"<th {right}>{CALC_NAMES.get(calc, calc)}</th>" for calc in self.calcs)
        rows = "".join(
            f'<tr><td style="color: {color}">&#9644;</td>'
            f'<td style="white-space: nowrap; overflow: hidden; text-overflow: ellipsis" '
            f'title="{html.escape(entry.label)}">{html.escape(entry.label)}</td>'
            + "".join(f"<td {right}>{html.escape(legend_value_text(self.panel, entry.measure(calc)))}</td>"
                      for calc in self.calcs) + "</tr>"
            for entry, color in zip(drawn, colors))
        columns = '<col style="width: 14px"><col>' + '<col style="width: 64px">' * len(self.calcs)
        return (f'<table style="table-layout: fixed; width: 100%; border-collapse: collapse">'
                f"<colgroup>{columns}</colgroup><tr><th></th><th></th>{header}</tr>{rows}</table>")

    def show(self, result: PanelResult) -> None:
        drawn = [entry for entry in result.series if entry.values]
        palette = Category10_10 if len(drawn) <= 10 else Category20_20
        colors = [palette[index % len(palette)] for index in range(len(drawn))]
        lines = [with_gaps(entry, max(GAP_MS, 3 * result.step_ms)) for entry in drawn]
        set_data(self.lines, {"xs": [times_ms for times_ms, _ in lines], "ys": [values for _, values in lines],
                              "color": colors, "label": [entry.label for entry in drawn]})
        few = [(entry, color) for entry, color in zip(drawn, colors) if len(entry.values) < FEW_POINTS]
        set_data(self.points, {"x": [time_ms for entry, _ in few for time_ms in entry.times_ms],
                               "y": [value for entry, _ in few for value in entry.values],
                               "color": [color for entry, color in few for _ in entry.values],
                               "label": [entry.label for entry, _ in few for _ in entry.values]})
        self.legend.text = self._legend_html(drawn, colors)
        self.no_data.update(text=no_value_text(self.panel), visible=not drawn and not result.error)
        self.figure.x_range.update(start=result.time_range.start_ms, end=result.time_range.end_ms)
        hours = DAYS_HOURS_FORMAT if result.time_range.length_ms > DAY_MS else TIME_FORMATS["hours"]
        if self.figure.xaxis.formatter.hours != hours:
            self.figure.xaxis.formatter.update(hours=hours, hourmin=hours)


class BarView:
    """Grafana's gauge and bar gauge: a horizontal bar per series at its last value, coloured by the thresholds,
    in front of a grey bar to the panel's maximum, the first series on top."""

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
        self.no_data = _no_value_label(width_px, height_px)
        self.figure.add_layout(self.no_data)
        self.layout = self.figure

    def show(self, result: PanelResult) -> None:
        series = [entry for entry in result.series if entry.values]
        values = [entry.values[-1] for entry in series]
        top = self.panel.config.get("max") or (max(values, default=0) * 1.25 or 1)
        decimals = self.panel.config.get("decimals", 1)
        unit = unit_label(self.panel)
        set_data(self.source, {"label": [entry.label for entry in series],
                               "value": [min(value, top) for value in values], "top": [top] * len(values),
                               "color": [threshold_color(self.panel, v) for v in values],
                               "text": [f"{value:,.{decimals}f} {unit}".strip() for value in values]})
        self.figure.y_range.factors = [entry.label for entry in reversed(series)]  # the first series on top
        self.figure.x_range.update(start=self.panel.config.get("min", 0), end=top)
        self.no_data.update(text=no_value_text(self.panel), visible=not series and not result.error)


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
        self.no_data = _no_value_label(width_px, height_px)
        self.figure.add_layout(self.no_data)
        self.layout = self.figure

    def show(self, result: PanelResult) -> None:
        series = [entry for entry in result.series if entry.values]
        values = [sum(entry.values) for entry in series]
        total = sum(values) or 1.0
        ends = [2 * math.pi * sum(values[:index + 1]) / total for index in range(len(values))]
        set_data(self.source, {
            "legend": [f"{entry.label} ({value:,.0f}, {value / total:.0%})" for entry, value in zip(series, values)],
            "value": values, "start": [0.0, *ends[:-1]], "end": ends,
            "color": [Category10_10[index % len(Category10_10)] for index in range(len(values))]})
        self.no_data.update(text=no_value_text(self.panel), visible=not series and not result.error)


class StatView:
    """Grafana's stat: one big number, the sum of the series' last values, coloured by the thresholds; the panel's
    noValue (0 for counts) where its queries found nothing, else "No data"."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.div = Div(width=width_px, height=height_px, tags=[panel.title],
                       styles={"display": "flex", "align-items": "center", "justify-content": "center"})
        self.layout = self.div

    def show(self, result: PanelResult) -> None:
        values = [entry.values[-1] for entry in result.series if entry.values]
        if not values:
            text = no_value_text(self.panel)
            style = "font-size: 30pt; font-weight: 600" if text != "No data" else "color: grey; font-size: 14pt"
            self.div.text = f'<span style="{style}">{html.escape(text)}</span>'
            return
        value = sum(values)
        color = threshold_color(self.panel, value)
        self.div.text = f'<span style="font-size: 30pt; font-weight: 600; color: {color}">{value:,.0f}</span>'


class TableView:
    """Grafana's table: the first series' rows, newest first as the query orders them."""

    def __init__(self, panel: Panel, width_px: int, height_px: int) -> None:
        self.panel = panel
        self.source = ColumnDataSource({}, tags=[panel.title])
        self.table = DataTable(source=self.source, columns=[], width=width_px, height=height_px - 18,
                               index_position=None)
        self.empty = Div(text="", width=width_px, height=18, tags=[panel.title], styles={"color": "grey"})
        self.layout = column(self.empty, self.table, width=width_px, height=height_px)

    def show(self, result: PanelResult) -> None:
        rows = [entry for entry in result.series if entry.rows]
        self.empty.text = "" if rows or result.error else html.escape(no_value_text(self.panel))
        if not rows:
            set_data(self.source, {name: [] for name in self.source.data})
            return
        entry = rows[0]
        if [column.field for column in self.table.columns] != entry.columns:
            self.table.columns = [TableColumn(field=name, title=name, width=150 if name in ("time", "stage") else 600)
                                  for name in entry.columns]
        set_data(self.source, {name: [cell_text(row[index]) for row in entry.rows]
                               for index, name in enumerate(entry.columns)})


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
                         styles={"font-weight": "600", "font-size": FONT, "overflow": "hidden",
                                 "white-space": "nowrap"})
        if panel.description:
            self.title.styles = {**self.title.styles, "cursor": "help"}
            self.title.text = f'<span title="{html.escape(panel.description)}">{title}</span>'
        self.body_width_px = width_px
        body_height_px = height_px - TITLE_HEIGHT_PX - ERROR_HEIGHT_PX
        self.view: PanelView = _VIEWS.get(panel.type, UnknownView)(panel, width_px, body_height_px)
        self.error = Div(text="", width=width_px, height=ERROR_HEIGHT_PX, styles={"color": "#d62728",
                                                                                 "font-size": "8pt",
                                                                                 "overflow": "hidden"})
        self.layout = column(self.title, self.view.layout, self.error, width=width_px, height=height_px)

    @property
    def plot_width_px(self) -> int:
        """The width the panel's points spread over: its plot's, without a legend beside it."""
        view = self.view
        return view.figure.width if isinstance(view, TimeSeriesView) else self.body_width_px  # type: ignore[return-value]

    def show(self, result: PanelResult) -> None:
        self.view.show(result)
        self.error.text = f"query failed: {html.escape(result.error[:300])}" if result.error else ""


def panel_frames(panels: Sequence[Panel], page_width_px: int, columns: int, row_height_px: int) -> list[PanelFrame]:
    """A frame per panel, sized by Grafana's grid (`columns` wide, `row_height_px` per row)."""
    return [PanelFrame(panel, int(panel.grid["w"] * page_width_px / columns) - 10, panel.grid["h"] * row_height_px)
            for panel in panels]
