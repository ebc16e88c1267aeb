"""One Bokeh document per open page of a dashboard: its header and its panels on Grafana's grid, refreshed by a
periodic callback from the dashboard's shared queries (`queries.DashboardQueries`)."""
from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime, timezone
from functools import partial
from itertools import groupby

from bokeh.document import Document, without_document_lock
from bokeh.layouts import column, row
from bokeh.models import Div

from grafana_report.dashboards import Dashboard

from .queries import DashboardQueries, Snapshot
from .views import panel_frames

log = logging.getLogger(__name__)

PAGE_WIDTH_PX = 1400
GRID_COLUMNS = 24  # Grafana's grid
ROW_HEIGHT_PX = 30  # one Grafana grid row


def _duration_text(milliseconds: int) -> str:
    for size_ms, unit in ((86_400_000, "days"), (3_600_000, "hours"), (60_000, "minutes")):
        if milliseconds >= size_ms and milliseconds % size_ms == 0:
            return f"{milliseconds // size_ms} {unit}"
    return f"{milliseconds / 1000:g} s"


class DashboardPage:
    """The models of one page of a dashboard, and how a snapshot changes them."""

    def __init__(self, dashboard: Dashboard, queries: DashboardQueries, others: Sequence[Dashboard],
                 refresh_s: float) -> None:
        self.dashboard = dashboard
        self.shown_ms = 0  # when the snapshot on the page was taken
        links = " · ".join(f'<a href="{html.escape(other.uid)}">{html.escape(other.title)}</a>' for other in others)
        self.title = Div(text=f'<h2 style="margin: 0">{html.escape(dashboard.title)}</h2>'
                              + (f'<div style="font-size: 9pt">other dashboards: {links}</div>' if links else ""),
                         width=PAGE_WIDTH_PX // 2)
        self.range_text = (f"last {_duration_text(queries.window_ms)} · refreshed every {refresh_s:g} s")
        self.status = Div(text=self.range_text, width=PAGE_WIDTH_PX // 2, styles={"text-align": "right",
                                                                                    "font-size": "9pt"})
        self.frames = panel_frames(dashboard.panels, PAGE_WIDTH_PX, GRID_COLUMNS, ROW_HEIGHT_PX)
        # Grafana's grid as rows of panels: the dashboards place panels side by side on one y, never stacked
        # beside a taller one.
        rows = [row([frame.layout for frame in sorted(frames, key=lambda frame: frame.panel.grid["x"])])
                for _y, frames in groupby(sorted(self.frames, key=lambda frame: frame.panel.grid["y"]),
                                          key=lambda frame: frame.panel.grid["y"])]
        self.layout = column(row(self.title, self.status), *rows)

    def show(self, snapshot: Snapshot) -> None:
        if snapshot.taken_ms <= self.shown_ms:
            return  # a page's timer fired twice within the queries' interval: nothing new
        self.shown_ms = snapshot.taken_ms
        taken = datetime.fromtimestamp(snapshot.taken_ms / 1000, tz=timezone.utc)
        variables = ", ".join(f"{name}: All ({len(values)})" for name, values in snapshot.variables.items())
        problem = (f'<br><span style="color: #d62728">{html.escape(snapshot.error)}</span>'
                   if snapshot.error else "")
        self.status.text = (f"{self.range_text}<br>{html.escape(variables)}{' · ' if variables else ''}"
                            f"updated {taken:%Y-%m-%d %H:%M:%S} UTC{problem}")
        # A new series adds renderers to an attached document: without the freeze Bokeh recomputes the document's
        # model graph at every property they set (seconds per series), with it once at the end.
        with self.layout.document.models.freeze() if self.layout.document else nullcontext():
            for frame, result in zip(self.frames, snapshot.panels):
                frame.show(result)


def build_document(doc: Document, dashboard: Dashboard, queries: DashboardQueries, others: Sequence[Dashboard],
                   refresh_s: float) -> None:
    """A new page: filled at once from the latest snapshot (or as soon as the first one is there), then anew
    every `refresh_s` by the document's periodic callback. Bokeh removes the callback when the page closes."""
    page = DashboardPage(dashboard, queries, others, refresh_s)
    if queries.latest is not None:
        page.show(queries.latest)  # before the page joins the document: its models are built once, not patched
    doc.title = dashboard.title
    doc.add_root(page.layout)

    # Without the document's lock while InfluxDB is asked: other pages' updates go on meanwhile; the models
    # change on the next tick, under the lock, as Bokeh requires.
    @without_document_lock
    async def refresh() -> None:
        session = doc.session_context.session if doc.session_context else None
        if session is not None and session.connection_count == 0 and page.shown_ms:
            # A page closed or navigated away from: Bokeh discards its session after a while, and until then
            # nobody would see the update (Bokeh warns of each message it cannot send).
            return
        try:
            snapshot = await queries.refreshed()
        except Exception:  # noqa: BLE001 - a bug in one refresh must not end the page's timer
            log.exception("%s: refresh failed", dashboard.title)
            return
        doc.add_next_tick_callback(partial(page.show, snapshot))

    doc.add_next_tick_callback(refresh)
    doc.add_periodic_callback(refresh, int(refresh_s * 1000))
