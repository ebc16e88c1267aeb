"""`python -m grafana_report --out reports/`: every provisioned dashboard as a PNG, from InfluxDB."""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline_core import credentials
from pipeline_core.influx import InfluxDBClient, influx_client
from pipeline_core.influx_retention import DATA_MEASUREMENT, JOINED_MEASUREMENT, JOINED_POLICY, RAW_POLICY
from pipeline_core.logs import configure_logging
from pipeline_core.settings import InfluxSettings, load_settings, setting

from .dashboards import DASHBOARDS_DIR, load_dashboards
from .macros import TimeRange, parse_values, resolve_variables
from .render import render_dashboard

log = logging.getLogger("grafana_report")


@dataclass(frozen=True)
class ReportSettings(InfluxSettings):
    """Render the Grafana dashboards' panels to PNG files with the same InfluxQL queries."""

    out: Path = setting(Path("reports"), "REPORT_DIR", "folder for the PNG files")
    dashboards: Path = setting(DASHBOARDS_DIR, "REPORT_DASHBOARDS_DIR", "folder of the dashboard JSON files",
                               formerly=(None, "DASHBOARDS_DIR"))
    start: str | None = setting(None, "REPORT_START",
                                "start of the time range, ISO 8601 (default: the first stored point)")
    end: str | None = setting(None, "REPORT_END", "end of the time range, ISO 8601 (default: the last stored point)")
    last: str | None = setting(None, "REPORT_LAST", "the time range as the last this long up to now (30m, 24h, 7d), "
                               "instead of --start and --end")
    machines: str | None = setting(None, "REPORT_MACHINES", "machines to show (the dashboards' Machine variable), "
                                   "comma-separated or a JSON list (for names holding commas); default: all")
    axes: str | None = setting(None, "REPORT_AXES", "axes to show (the Axis variable), as --machines; default: all")
    top: int | None = setting(None, "REPORT_TOP", "how many machines the per-machine panels draw (the Top "
                              "variable; default: the dashboards' 10)", minimum=1)


def _epoch_ms(text: str) -> int:
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def data_range(client: InfluxDBClient, measurements: Sequence[str] = (f'"{RAW_POLICY}"."{DATA_MEASUREMENT}"',
                                                      f'"{JOINED_POLICY}"."{JOINED_MEASUREMENT}"')) -> TimeRange | None:
    """From the first to the last stored point of the measurements (InfluxQL, "policy"."measurement")."""
    times: list[int] = []
    for measurement in measurements:
        for function in ("first", "last"):
            points = list(client.query(f'SELECT {function}("result") FROM {measurement} '
                                       "WHERE time > 0 AND time < '2200-01-01T00:00:00Z'", epoch="ms").get_points())
            times.extend(point["time"] for point in points)
    return TimeRange(min(times), max(times)) if times else None


def chosen_values(settings: ReportSettings) -> dict[str, list[str]]:
    """The variables the settings pick (name -> values): Machine, Axis and Top."""
    try:
        picked = {"thing": parse_values(settings.machines) if settings.machines else None,
                  "axis": parse_values(settings.axes) if settings.axes else None,
                  "top_n": [str(settings.top)] if settings.top else None}
    except ValueError as error:
        raise SystemExit(f"--machines / --axes: {error}") from None
    return {name: values for name, values in picked.items() if values}


def report_range(settings: ReportSettings, client: InfluxDBClient) -> TimeRange:
    if settings.last:
        try:
            return TimeRange.last(settings.last)
        except ValueError as error:
            raise SystemExit(f"--last: {error}") from None
    if settings.start and settings.end:
        return TimeRange(_epoch_ms(settings.start), _epoch_ms(settings.end))
    stored = data_range(client)
    if stored is None:
        raise SystemExit(f"no data in InfluxDB database {settings.influxdb_database!r}: "
                         "replay some (`make up`), or pass --start and --end")
    return TimeRange(_epoch_ms(settings.start) if settings.start else stored.start_ms,
                     _epoch_ms(settings.end) if settings.end else stored.end_ms)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    settings = load_settings(ReportSettings, argv, prog="python -m grafana_report",
                             environ=credentials.environ_for("reader"))
    client = influx_client(settings)
    time_range = report_range(settings, client)
    dashboards = load_dashboards(settings.dashboards)
    if not dashboards:
        raise SystemExit(f"no dashboard JSON files in {settings.dashboards}")
    chosen = chosen_values(settings)
    for dashboard in dashboards:
        variables = resolve_variables(client, dashboard, time_range, chosen, connect=lambda: influx_client(settings))
        path = render_dashboard(lambda: influx_client(settings), dashboard, time_range, variables, settings.out)
        print(f"{dashboard.title}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
