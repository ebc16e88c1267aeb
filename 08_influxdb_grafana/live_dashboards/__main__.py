"""`python -m live_dashboards` (`make dashboards`): the provisioned Grafana dashboards as live web pages, without
Grafana: one page per dashboard (http://127.0.0.1:5006/<uid>), every panel drawn by Bokeh from its own InfluxQL
and refreshed every --refresh-s, until Ctrl-C or SIGTERM."""
from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from functools import partial

from bokeh.application import Application
from bokeh.application.handlers.function import FunctionHandler
from bokeh.server.server import Server
from bokeh.util.logconfig import basicConfig as bokeh_logs_to_root

from grafana_report.dashboards import load_dashboards
from pipeline_core import credentials
from pipeline_core.influx import influx_client
from pipeline_core.logs import configure_logging
from pipeline_core.settings import load_settings

from .app import build_document
from .queries import DashboardQueries
from .settings import LiveDashboardsSettings

log = logging.getLogger("live_dashboards")


def make_server(settings: LiveDashboardsSettings) -> tuple[Server, list[str]]:
    """The Bokeh server with one application per dashboard at /<uid>, and the pages' URLs (not yet started)."""
    dashboards = load_dashboards(settings.dashboards)
    if not dashboards:
        raise SystemExit(f"no dashboard JSON files in {settings.dashboards}")
    window_ms = int(settings.window_s * 1000) if settings.window_s else None
    applications = {}
    for dashboard in dashboards:
        # A client per dashboard: the two dashboards' queries run in worker threads at the same time.
        queries = DashboardQueries(dashboard, influx_client(settings), settings.refresh_s, window_ms)
        others = [other for other in dashboards if other is not dashboard]
        applications[f"/{dashboard.uid}"] = Application(FunctionHandler(
            partial(build_document, dashboard=dashboard, queries=queries, others=others,
                    refresh_s=settings.refresh_s)))
    # Bokeh lets a page's websocket in only from the host names it expects: both names of loopback, and the
    # listening address (BOKEH_ALLOW_WS_ORIGIN, Bokeh's own setting, replaces the list for other names).
    origins = sorted({f"{host}:{settings.port}" for host in ("localhost", "127.0.0.1", settings.address)})
    server = Server(applications, port=settings.port, address=settings.address, allow_websocket_origin=origins)
    host = "127.0.0.1" if settings.address in ("0.0.0.0", "") else settings.address
    return server, [f"{dashboard.title}: http://{host}:{settings.port}/{dashboard.uid}" for dashboard in dashboards]


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    bokeh_logs_to_root()  # Bokeh's own lines in the pipeline's format, not through the handler Bokeh adds itself
    # Every request and websocket message at INFO would bury the pipeline's own lines.
    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    settings = load_settings(LiveDashboardsSettings, argv, prog="python -m live_dashboards",
                             environ=credentials.environ_for("reader"))
    server, pages = make_server(settings)
    server.start()
    for page in pages:
        print(page, flush=True)
    log.info("serving %d dashboards from InfluxDB %s:%s/%s, refreshed every %g s", len(pages),
             settings.influxdb_host, settings.influxdb_port, settings.influxdb_database, settings.refresh_s)
    loop = server.io_loop.asyncio_loop  # type: ignore[attr-defined]
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop_signal, server.io_loop.stop)
    server.io_loop.start()
    server.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
