"""`python -m live_dashboards`'s settings: where InfluxDB is (as the reader on a secure stack), where the page is
served, how often it refreshes and how far back it looks."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grafana_report.dashboards import DASHBOARDS_DIR
from pipeline_core.settings import InfluxSettings, setting


@dataclass(frozen=True)
class LiveDashboardsSettings(InfluxSettings):
    """Serve the Grafana dashboards' panels, with the same InfluxQL queries, as a web page that refreshes itself."""

    port: int = setting(5006, "LIVE_DASHBOARDS_PORT", "HTTP port of the page", minimum=1)
    address: str = setting("127.0.0.1", "LIVE_DASHBOARDS_ADDRESS",
                           "address to listen on (0.0.0.0: every interface; then allow the host name the browser "
                           "uses with BOKEH_ALLOW_WS_ORIGIN=host:port)")
    # Half a second at least: every refresh runs each panel's queries, and InfluxDB is shared with the pipeline.
    refresh_s: float = setting(5.0, "LIVE_DASHBOARDS_REFRESH_S", "seconds between the panels' refreshes",
                               minimum=0.5)
    window_s: float | None = setting(None, "LIVE_DASHBOARDS_WINDOW_S",
                                     "seconds up to now a page opens on (default: each dashboard's own range, the "
                                     "last 24 hours; a page's Range picks another, as its address's ?range=7d does); "
                                     "panels with a range of their own (last 1h) keep it", minimum=1)
    dashboards: Path = setting(DASHBOARDS_DIR, "LIVE_DASHBOARDS_DIR", "folder of the dashboard JSON files")
