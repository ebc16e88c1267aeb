"""`python -m live_dashboards` (`make dashboards`): the provisioned Grafana dashboards as live web pages, without
Grafana: an index at http://127.0.0.1:5006/, one page per dashboard (/<uid>), every panel drawn by Bokeh from its
own InfluxQL and refreshed every --refresh-s, until Ctrl-C or SIGTERM."""
from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from functools import partial

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.server.server import Server
from bokeh.settings import settings as bokeh_settings
from bokeh.util.logconfig import basicConfig as bokeh_logs_to_root

from grafana_report.dashboards import load_dashboards
from grafana_report.panels import dashboard_window_ms
from pipeline_core import credentials
from pipeline_core.influx import influx_client
from pipeline_core.logs import configure_logging
from pipeline_core.settings import load_settings

from .app import build_document, plot_widths
from .index import IndexHandler, index_html
from .queries import DashboardQueries, QueryThreads
from .settings import LiveDashboardsSettings

log = logging.getLogger("live_dashboards")

# Queries InfluxDB answers side by side: its two cores, and one more in flight while it parses the next.
QUERY_THREADS = 3


def make_server(settings: LiveDashboardsSettings) -> tuple[Server, list[str]]:
    """The Bokeh server with the index at / and one application per dashboard at /<uid>, and the pages' URLs
    (not yet started)."""
    dashboards = load_dashboards(settings.dashboards)
    if not dashboards:
        raise SystemExit(f"no dashboard JSON files in {settings.dashboards}")
    threads = QueryThreads(lambda: influx_client(settings), QUERY_THREADS)
    applications = {}
    for dashboard in dashboards:
        queries = DashboardQueries(dashboard, threads, settings.refresh_s, plot_widths(dashboard))
        window_ms = int(settings.window_s * 1000) if settings.window_s else dashboard_window_ms(dashboard)
        others = [other for other in dashboards if other is not dashboard]
        applications[f"/{dashboard.uid}"] = Application(FunctionHandler(
            partial(build_document, dashboard=dashboard, queries=queries, others=others,
                    refresh_s=settings.refresh_s, window_ms=window_ms)))
    # Bokeh lets a page's websocket in only from the host names it expects: both names of loopback, and the
    # listening address (BOKEH_ALLOW_WS_ORIGIN, Bokeh's own setting, replaces the list for other names).
    origins = sorted({f"{host}:{settings.port}" for host in ("localhost", "127.0.0.1", settings.address)})
    server = Server(applications, port=settings.port, address=settings.address, allow_websocket_origin=origins,
                    use_index=False, redirect_root=False,
                    extra_patterns=[(r"/?", IndexHandler, {"page": index_html(dashboards, settings.refresh_s)})],
                    # A closed page's session goes within seconds, not Bokeh's default quarter of a minute.
                    check_unused_sessions_milliseconds=2000, unused_session_lifetime_milliseconds=5000)
    host = "127.0.0.1" if settings.address in ("0.0.0.0", "") else settings.address
    pages = [f"Dashboards: http://{host}:{settings.port}/"]
    pages += [f"{dashboard.title}: http://{host}:{settings.port}/{dashboard.uid}" for dashboard in dashboards]
    return server, pages


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    bokeh_logs_to_root()  # Bokeh's own lines in the pipeline's format, not through the handler Bokeh adds itself
    # Every request and websocket message at INFO would bury the pipeline's own lines.
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    # BokehJS from this server (/static/), whatever BOKEH_RESOURCES says: the pages fetch nothing from elsewhere.
    bokeh_settings.resources.set_value("server")
    settings = load_settings(LiveDashboardsSettings, argv, prog="python -m live_dashboards",
                             environ=credentials.environ_for("reader"))
    server, pages = make_server(settings)
    server.start()
    for page in pages:
        print(page, flush=True)
    log.info("serving %d dashboards from InfluxDB %s:%s/%s, refreshed every %g s", len(pages) - 1,
             settings.influxdb_host, settings.influxdb_port, settings.influxdb_database, settings.refresh_s)
    loop = server.io_loop.asyncio_loop  # type: ignore[attr-defined]
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop_signal, server.io_loop.stop)
    server.io_loop.start()
    # Stopped by a signal: the listening socket closes; the open pages' connections and any query in flight end with
    # the process (its worker threads are daemons), so the exit takes no longer than this.
    server.stop(wait=False)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
