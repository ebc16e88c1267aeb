"""`python -m grafana_report --out reports/`: every provisioned dashboard as a PNG, from InfluxDB."""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline_core import credentials
from pipeline_core.influx import influx_client
from pipeline_core.influx_retention import DATA_MEASUREMENT, JOINED_MEASUREMENT, JOINED_POLICY, RAW_POLICY
from pipeline_core.logs import configure_logging
from pipeline_core.settings import InfluxSettings, load_settings, setting

from .dashboards import DASHBOARDS_DIR, load_dashboards
from .macros import TimeRange, all_values
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


def _epoch_ms(text: str) -> int:
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def data_range(client, measurements: Sequence[str] = (f'"{RAW_POLICY}"."{DATA_MEASUREMENT}"',
                                                      f'"{JOINED_POLICY}"."{JOINED_MEASUREMENT}"')) -> TimeRange | None:
    """From the first to the last stored point of the measurements (InfluxQL, "policy"."measurement")."""
    times: list[int] = []
    for measurement in measurements:
        for function in ("first", "last"):
            points = list(client.query(f'SELECT {function}("result") FROM {measurement} '
                                       "WHERE time > 0 AND time < '2200-01-01T00:00:00Z'", epoch="ms").get_points())
            times.extend(point["time"] for point in points)
    return TimeRange(min(times), max(times)) if times else None


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    settings = load_settings(ReportSettings, argv, prog="python -m grafana_report",
                             environ=credentials.environ_for("reader"))
    client = influx_client(settings)
    stored = data_range(client)
    if stored is None and not (settings.start and settings.end):
        raise SystemExit(f"no data in InfluxDB database {settings.influxdb_database!r}: "
                         "replay some (`make up`), or pass --start and --end")
    time_range = TimeRange(_epoch_ms(settings.start) if settings.start else stored.start_ms,  # type: ignore[union-attr]
                           _epoch_ms(settings.end) if settings.end else stored.end_ms)  # type: ignore[union-attr]
    dashboards = load_dashboards(settings.dashboards)
    if not dashboards:
        raise SystemExit(f"no dashboard JSON files in {settings.dashboards}")
    for dashboard in dashboards:
        path = render_dashboard(client, dashboard, time_range, all_values(client, dashboard), settings.out)
        print(f"{dashboard.title}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
