"""One Bokeh document per open page of a dashboard: its header, its selectors (the dashboard's template variables:
Machine, Axis, Top; and the range) and its panels on Grafana's grid, refreshed by a periodic callback from the
dashboard's shared queries (`queries.DashboardQueries`).

A page closed or navigated away from at any moment leaves nothing behind: every callback that would touch its
document after a wait first asks whether the session still lives (Bokeh destroys a closed page's document a few
seconds after its last connection), and a refresh due while nobody looks is skipped."""
from __future__ import annotations

import html
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime, timezone
from functools import partial
from itertools import groupby

from bokeh.document import Document, without_document_lock
from bokeh.layouts import column, row
from bokeh.models import Div, MultiChoice, Select

from grafana_report.dashboards import ALL, Dashboard
from grafana_report.macros import Selection, duration_ms

from .queries import Choice, DashboardQueries, Snapshot
from .views import PanelFrame, panel_frames

log = logging.getLogger(__name__)

PAGE_WIDTH_PX = 1400
GRID_COLUMNS = 24  # Grafana's grid
ROW_HEIGHT_PX = 30  # one Grafana grid row
# The ranges the page offers, as Grafana's time picker names them.
RANGES = ("5m", "15m", "1h", "6h", "24h", "3d", "7d", "14d", "30d")
_RANGE_NAMES = {"m": "minutes", "h": "hours", "d": "days"}


def range_text(name: str) -> str:
    """ "24h" -> "last 24 hours"."""
    return f"last {name[:-1]} {_RANGE_NAMES.get(name[-1], name[-1])}"


def window_name(window_ms: int) -> str:
    """The shortest Grafana duration for a window: 86,400,000 -> "24h" (the page's range selector names)."""
    for unit, size_ms in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if window_ms % size_ms == 0 and (unit != "d" or window_ms // size_ms > 1):
            return f"{window_ms // size_ms}{unit}"
    return f"{window_ms}ms"


def plot_widths(dashboard: Dashboard) -> list[int]:
    """Each panel's plot width on the page: the points Grafana asks for where a panel sets no maxDataPoints."""
    return [frame.plot_width_px for frame in panel_frames(dashboard.panels, PAGE_WIDTH_PX, GRID_COLUMNS,
                                                          ROW_HEIGHT_PX)]


class Selectors:
    """The page's range and variables as widgets: a multi-value variable as a searchable multiple choice (empty:
    All), a single-value one and the range as a drop-down. Hidden variables (the Top machines) stay hidden."""

    def __init__(self, dashboard: Dashboard, window_ms: int, picked: Mapping[str, list[str]],
                 on_change: Callable[[], None]) -> None:
        self.range_name = window_name(window_ms)
        names = list(RANGES) if self.range_name in RANGES else [self.range_name, *RANGES]
        self.range = Select(title="Range", value=self.range_name, width=130,
                            options=[(name, range_text(name)) for name in names])
        self.widgets: dict[str, MultiChoice | Select] = {}
        for variable in dashboard.variables:
            if variable.hidden:
                continue
            wanted = picked.get(variable.name)
            if variable.multi:
                value = [] if not wanted or wanted == [ALL] else wanted
                widget: MultiChoice | Select = MultiChoice(
                    title=variable.label, value=value, options=value, width=420 if variable.name == "thing" else 220,
                    placeholder="All", search_option_limit=50, tags=[f"variable:{variable.name}"])
            else:
                current = (wanted or list(variable.current) or [""])[0]
                widget = Select(title=variable.label, value=current, options=[current], width=90,
                                tags=[f"variable:{variable.name}"])
            widget.on_change("value", lambda _attr, _old, _new: on_change())
            self.widgets[variable.name] = widget
        self.range.on_change("value", lambda _attr, _old, _new: on_change())
        self.layout = row(self.range, *self.widgets.values())

    def choice(self) -> Choice:
        picked = []
        for name, widget in self.widgets.items():
            value = widget.value
            picked.append((name, tuple(value) if isinstance(value, list) and value else
                           (ALL,) if isinstance(value, list) else (value,)))
        return Choice(duration_ms(self.range.value), tuple(picked))

    def offer(self, variables: Mapping[str, Selection]) -> None:
        """The values InfluxDB has now, as each widget's options (its selection kept)."""
        for name, widget in self.widgets.items():
            selection = variables.get(name)
            if selection is None:
                continue
            options = list(selection.options)
            kept = widget.value if isinstance(widget.value, list) else [widget.value]
            options += [value for value in kept if value and value not in options]
            if widget.options != options:
                widget.options = options


def _picked_from_request(dashboard: Dashboard, arguments: Mapping[str, Sequence[bytes]]) -> dict[str, list[str]]:
    """The variables a page's address picks (`?thing=a&thing=b&axis=C11&top_n=5`), as Grafana's `var-` ones do."""
    picked = {}
    for variable in dashboard.variables:
        values = arguments.get(variable.name) or arguments.get(f"var-{variable.name}") or []
        if values:
            picked[variable.name] = [value.decode("utf-8", "replace") for value in values]
    return picked


class DashboardPage:
    """The models of one page of a dashboard, and how a snapshot changes them."""

    def __init__(self, dashboard: Dashboard, others: Sequence[Dashboard], refresh_s: float, window_ms: int,
                 picked: Mapping[str, list[str]], on_change: Callable[[], None]) -> None:
        self.dashboard = dashboard
        self.shown_ms = 0  # when the snapshot on the page was taken
        self.shown_choice: Choice | None = None
        links = " · ".join(f'<a href="{html.escape(other.uid)}">{html.escape(other.title)}</a>' for other in others)
        self.title = Div(text=f'<h2 style="margin: 0">{html.escape(dashboard.title)}</h2>'
                              f'<div style="font-size: 9pt"><a href="/">all dashboards</a>'
                              f'{" · " + links if links else ""}</div>',
                         width=PAGE_WIDTH_PX // 2)
        self.refresh_text = f"refreshed every {refresh_s:g} s"
        self.status = Div(text=self.refresh_text, width=PAGE_WIDTH_PX // 2,
                          styles={"text-align": "right", "font-size": "9pt"})
        # What the last refresh cost, for whoever measures the page (the benchmark): when the server began it, how
        # long its queries took and how much of that InfluxDB.
        self.timing = Div(text="{}", visible=False, tags=["refresh-timing"])
        self.selectors = Selectors(dashboard, window_ms, picked, on_change)
        self.frames: list[PanelFrame] = panel_frames(dashboard.panels, PAGE_WIDTH_PX, GRID_COLUMNS, ROW_HEIGHT_PX)
        # Grafana's grid as rows of panels: the dashboards place panels side by side on one y, never stacked
        # beside a taller one.
        rows = [row([frame.layout for frame in sorted(frames, key=lambda frame: frame.panel.grid["x"])])
                for _y, frames in groupby(sorted(self.frames, key=lambda frame: frame.panel.grid["y"]),
                                          key=lambda frame: frame.panel.grid["y"])]
        self.layout = column(row(self.title, self.status), self.selectors.layout, *rows, self.timing)

    def show(self, snapshot: Snapshot, choice: Choice) -> None:
        if snapshot.taken_ms <= self.shown_ms and choice == self.shown_choice:
            return  # a page's timer fired twice within the queries' interval: nothing new
        if choice != self.selectors.choice():
            return  # the reader picked something else meanwhile: its own snapshot is on its way
        self.shown_ms = snapshot.taken_ms
        self.shown_choice = choice
        taken = datetime.fromtimestamp(snapshot.taken_ms / 1000, tz=timezone.utc)
        problem = (f'<br><span style="color: #d62728">{html.escape(snapshot.error)}</span>'
                   if snapshot.error else "")
        picked = [f"{variable.label}: {_selection_text(snapshot.variables[variable.name])}"
                  for variable in self.dashboard.variables
                  if not variable.hidden and variable.name in snapshot.variables]
        self.status.text = (f"{html.escape(range_text(window_name(choice.window_ms)))} · {self.refresh_text}<br>"
                            f"{html.escape(' · '.join(picked))}{' · ' if picked else ''}"
                            f"updated {taken:%Y-%m-%d %H:%M:%S} UTC{problem}")
        self.timing.text = json.dumps({"taken_ms": snapshot.taken_ms, "took_ms": round(snapshot.took_ms, 1),
                                       "influx_ms": round(snapshot.influx_ms, 1),
                                       "window_ms": choice.window_ms})
        self.selectors.offer(snapshot.variables)
        # New series add renderers to an attached document: without the freeze Bokeh recomputes the document's
        # model graph at every property they set (seconds per series), with it once at the end.
        with self.layout.document.models.freeze() if self.layout.document else nullcontext():
            for frame, result in zip(self.frames, snapshot.panels):
                frame.show(result)


def _selection_text(selection: Selection) -> str:
    if selection.everything:
        return f"All ({len(selection.options)})"
    shown = ", ".join(selection.selected[:3])
    return shown + (f" and {len(selection.selected) - 3} more" if len(selection.selected) > 3 else "")


def _alive(doc: Document) -> bool:
    """Whether the page's session still lives: Bokeh destroys a closed page's document (its callbacks' registry
    among it) a little after the last connection went, and nothing may touch it then."""
    context = doc.session_context
    return context is not None and not context.destroyed


def _watched(doc: Document) -> bool:
    """Whether the page is open in a browser now: a change to a page nobody holds would only be refused (Bokeh
    warns of every message it cannot send)."""
    context = doc.session_context
    session = context.session if context is not None and not context.destroyed else None
    return session is not None and session.connection_count > 0


def build_document(doc: Document, dashboard: Dashboard, queries: DashboardQueries, others: Sequence[Dashboard],
                   refresh_s: float, window_ms: int) -> None:
    """A new page: filled at once from the latest snapshot of its choice (or as soon as the first one is there),
    then anew every `refresh_s` by the document's periodic callback, and at once when the reader picks another
    range or machine. Bokeh removes the callbacks when the page closes."""
    request = doc.session_context.request if doc.session_context else None
    arguments = request.arguments if request is not None else {}
    picked = _picked_from_request(dashboard, arguments)
    asked_range = (arguments.get("range") or [b""])[0].decode("ascii", "replace")
    if asked_range:
        try:
            window_ms = duration_ms(asked_range)
        except ValueError:
            log.info("%s: ignoring range %r in the address", dashboard.title, asked_range)

    @without_document_lock
    async def refresh() -> None:
        if not _alive(doc):
            return
        session = doc.session_context.session if doc.session_context else None
        if session is not None and session.connection_count == 0 and page.shown_ms:
            # Nobody looks: Bokeh discards the session after a while, and until then nobody would see the update
            # (Bokeh warns of each message it cannot send).
            return
        choice = page.selectors.choice()
        try:
            snapshot = await queries.refreshed(choice)
        except Exception:  # noqa: BLE001 - a bug in one refresh must not end the page's timer
            log.exception("%s: refresh failed", dashboard.title)
            return
        if not _alive(doc):  # the page closed while InfluxDB answered: its document is gone
            log.info("%s: a refresh ended after its page closed", dashboard.title)
            return
        doc.add_next_tick_callback(partial(show, snapshot, choice))

    def show(snapshot: Snapshot, choice: Choice) -> None:
        # The first snapshot goes in even before the browser's connection is there: the page pulls it with the rest
        # of the document.
        if _alive(doc) and (_watched(doc) or not page.shown_ms):
            page.show(snapshot, choice)

    def changed() -> None:
        if _alive(doc):
            doc.add_next_tick_callback(refresh)

    page = DashboardPage(dashboard, others, refresh_s, window_ms, picked, changed)
    latest = queries.latest(page.selectors.choice())
    if latest is not None:
        page.show(latest, page.selectors.choice())  # before the page joins the document: built once, not patched
    doc.title = dashboard.title
    doc.add_root(page.layout)
    doc.add_next_tick_callback(refresh)
    doc.add_periodic_callback(refresh, int(refresh_s * 1000))
    doc.on_session_destroyed(lambda _context: log.info("%s: a page closed", dashboard.title))

