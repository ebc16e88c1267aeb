"""`python -m grafana_report.history` (the end of `make data`): the dashboards' history brought up to date for rows
stored long after their time, such as a replay of old rows moved to end now.

InfluxDB's continuous queries keep the history (per minute, 10 minutes and hour) of the last minutes only; the
dashboards read it for any range beyond 5 minutes. So once the pipeline has stored what was published (the raw
and joined counts unchanged for `--settle-s`), every hour of the last `--since` whose raw points the hourly history
does not count exactly gets its history computed (`pipeline_core.influx_retention.backfill_history`), as the InfluxDB
admin where the stack is secure: the history is written, the raw points read."""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline_core import credentials
from pipeline_core.influx import InfluxDBClient, influx_client
from pipeline_core.influx_retention import (DATA_MEASUREMENT, HISTORY_POLICY, JOINED_MEASUREMENT, JOINED_POLICY,
                                            RAW_POLICY, backfill_history)
from pipeline_core.logs import configure_logging
from pipeline_core.settings import InfluxSettings, load_settings, setting

from .macros import duration_ms

log = logging.getLogger("grafana_report.history")

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class HistorySettings(InfluxSettings):
    """Bring the dashboards' history up to date for rows stored long after their time (a replay)."""

    since: str = setting("30d", "HISTORY_SINCE", "how far back to look (a Grafana duration: 30d, 12h)")
    settle_s: float = setting(10.0, "HISTORY_SETTLE_S", "seconds the stored counts stay unchanged before: the "
                              "pipeline has stored what was published", minimum=0)
    wait_s: float = setting(300.0, "HISTORY_WAIT_S", "seconds to wait at most for the counts to settle", minimum=0)


def _counts(client: InfluxDBClient, query: str) -> dict[int, int]:
    return {point["time"]: int(point[next(key for key in point if key != "time")] or 0)
            for point in client.query(query, epoch="ms").get_points()}


def stale_hours(client: InfluxDBClient, start_ms: int, end_ms: int) -> list[int]:
    """The hours in [start_ms, end_ms) whose raw points or join results the hourly history counts otherwise."""
    stale: set[int] = set()
    where = f"time >= {start_ms}ms AND time < {end_ms}ms"
    for measurement, policy in ((DATA_MEASUREMENT, RAW_POLICY), (JOINED_MEASUREMENT, JOINED_POLICY)):
        raw = _counts(client, f'SELECT count("result") FROM "{policy}"."{measurement}" WHERE {where} '
                              f'GROUP BY time(1h) fill(none)')
        kept = _counts(client, f'SELECT sum("count") FROM "{HISTORY_POLICY}"."{measurement}_1h" WHERE {where} '
                               f'GROUP BY time(1h) fill(none)')
        stale.update(hour for hour, count in raw.items() if kept.get(hour, 0) != count)
    return sorted(stale)


def spans(hours: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive hours joined: [(start_ms, end_ms)]."""
    joined: list[tuple[int, int]] = []
    for hour in hours:
        if joined and joined[-1][1] == hour:
            joined[-1] = (joined[-1][0], hour + HOUR_MS)
        else:
            joined.append((hour, hour + HOUR_MS))
    return joined


def settled_counts(client: InfluxDBClient, start_ms: int, settle_s: float, wait_s: float) -> None:
    """Returns once the raw and joined counts since `start_ms` stayed the same for `settle_s` (or `wait_s` passed)."""
    query = (f'SELECT count("result") FROM "{RAW_POLICY}"."{DATA_MEASUREMENT}" WHERE time >= {start_ms}ms; '
             f'SELECT count("result") FROM "{JOINED_POLICY}"."{JOINED_MEASUREMENT}" WHERE time >= {start_ms}ms')
    deadline = time.monotonic() + wait_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = str([result.raw for result in client.query(query)])
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            return
        time.sleep(1)
    log.warning("the stored counts still changed after %g s: bringing the history up to date as it is", wait_s)


def _rfc3339(time_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time_ms / 1000))


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    settings = load_settings(HistorySettings, argv, prog="python -m grafana_report.history",
                             environ=credentials.environ_for("admin"))
    client = influx_client(settings)
    now_ms = int(time.time() * 1000)
    start_ms = (now_ms - duration_ms(settings.since)) // HOUR_MS * HOUR_MS
    settled_counts(client, start_ms, settings.settle_s, settings.wait_s)
    hours = stale_hours(client, start_ms, now_ms)
    written = sum(backfill_history(client, settings.influxdb_database, _rfc3339(start), _rfc3339(end))
                  for start, end in spans(hours))
    print(f"history: {len(hours)} hours brought up to date ({written:,} points)" if hours
          else "history: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
