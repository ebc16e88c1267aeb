"""The stages' health metrics in InfluxDB (measurement `pipeline_health` in retention policy `health`),
written off the stage's loop.

A stage hands each progress report's line to `HealthMetrics.record`, which only appends it to a bounded
queue. A daemon thread writes whatever is queued in one request. An unreachable or failing InfluxDB
defers the points, retried with a growing pause, beyond `max_pending` the oldest are dropped, and one
warning per outage says so: nothing raises into the stage, and `close` waits at most its timeout.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from .influx import InfluxDBClientError, InfluxDBServerError, escape_measurement, escape_tag, influx_client
from .influx_retention import (HEALTH_POLICY, MACHINE_HEALTH_MEASUREMENT, ensure_retention, policy_missing,
                               retention_settings)
from .retry import Backoff, Retries
from .settings import InfluxSettings

log = logging.getLogger(__name__)

HEALTH_MEASUREMENT = "pipeline_health"
# Per machine, what a stage counted of it (a joiner's clock rule); tags stage, instance and thing.
MACHINE_MEASUREMENT = MACHINE_HEALTH_MEASUREMENT
# Health points waiting for InfluxDB: about a day of one stage's points at a 10 s interval.
MAX_PENDING_POINTS = 10_000
RETRY_MAX_S = 60.0
WRITE_TIMEOUT_S = 5.0
# HTTP statuses that say the points themselves are wrong: sending them again cannot help.
_POINT_ERRORS = {400, 413, 422}


def health_line(tags: Mapping[str, str], fields: Mapping[str, int | float | None], time_ns: int,
                measurement: str = HEALTH_MEASUREMENT) -> str | None:
    """One point in line protocol: ints as integer fields, finite floats as floats; None and non-finite
    values are left out (a field that is not there is a gap in the dashboard, not a false zero).
    None when no field is left."""
    parts = []
    for name, value in sorted(fields.items()):
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            parts.append(f"{escape_tag(name)}={value}i")
        elif isinstance(value, float) and math.isfinite(value):
            parts.append(f"{escape_tag(name)}={value!r}")
    if not parts:
        return None
    series = ",".join([escape_measurement(measurement),
                       *(f"{escape_tag(key)}={escape_tag(value)}" for key, value in sorted(tags.items()))])
    return f"{series} {','.join(parts)} {time_ns}"


class PointsRefused(Exception):
    """InfluxDB refused the points themselves (not an outage): they are dropped, not retried."""


class HealthMetrics:
    """Writes health lines to InfluxDB from a daemon thread; see the module docstring."""

    def __init__(self, send: Callable[[Sequence[str]], None], *, max_pending: int = MAX_PENDING_POINTS,
                 retry_max_s: float = RETRY_MAX_S, where: str = "InfluxDB") -> None:
        self._send = send
        self._max_pending = max_pending
        self._retry_max_s = retry_max_s
        self._where = where
        self._pending: deque[str] = deque()
        self._wake = threading.Condition()
        self._closing = False
        self._failing_since: float | None = None
        self.written = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="health-metrics", daemon=True)
        self._thread.start()

    @classmethod
    def to_influxdb(cls, settings: InfluxSettings) -> HealthMetrics:
        """Writing into the pipeline's database (`settings.influxdb_database`), retention policy `health`;
        creating the database and its policies if missing."""
        client = influx_client(settings, timeout_s=WRITE_TIMEOUT_S)
        database = settings.influxdb_database

        def write(lines: Sequence[str]) -> None:
            client.request("write", "POST", params={"db": database, "rp": HEALTH_POLICY, "precision": "n"},
                           data="\n".join(lines).encode(), expected_response_code=204,
                           headers={"Content-Type": "application/octet-stream"})

        def send(lines: Sequence[str]) -> None:
            try:
                write(lines)
            except (InfluxDBClientError, InfluxDBServerError) as error:
                if policy_missing(error):  # no such database or policy (yet): make them, and write again
                    ensure_retention(client, database, retention_settings(settings))
                    write(lines)
                elif isinstance(error, InfluxDBClientError) and error.code in _POINT_ERRORS:
                    raise PointsRefused(str(error.content)[:300]) from None
                else:
                    raise

        return cls(send, where=f"InfluxDB {settings.influxdb_host}:{settings.influxdb_port}/{database}")

    @property
    def pending(self) -> int:
        return len(self._pending)

    def record(self, line: str) -> None:
        """Queue one line for the writer thread; never blocks on InfluxDB."""
        with self._wake:
            self._pending.append(line)
            self._drop_beyond_limit()
            self._wake.notify()

    def close(self, timeout_s: float = 3.0) -> None:
        """Write what is queued if InfluxDB answers within `timeout_s`, then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout_s)
        if self._pending:
            log.warning("%d health points not written to %s at exit", len(self._pending), self._where)

    def _drop_beyond_limit(self) -> None:
        excess = len(self._pending) - self._max_pending
        for _ in range(max(excess, 0)):
            self._pending.popleft()
        self.dropped += max(excess, 0)

    def _run(self) -> None:
        # Bound: no deadline (points beyond `max_pending` are dropped meanwhile), pauses up to `retry_max_s`.
        retries = Retries(Backoff(min(0.5, self._retry_max_s), self._retry_max_s))
        while True:
            with self._wake:
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, deque()
            if self._write(batch):
                retries.reset()
                continue
            with self._wake:
                # Put the batch back in front of what arrived meanwhile, unless we are leaving.
                self._pending.extendleft(reversed(batch))
                self._drop_beyond_limit()
                if self._closing:
                    return
                self._wake.wait(retries.next_pause_s())

    def _write(self, batch: deque[str]) -> bool:
        """Send one batch; True when it is done with (stored, or refused for good)."""
        try:
            self._send(list(batch))
        except PointsRefused as refused:
            log.warning("%s refused %d health points, dropped: %s", self._where, len(batch), refused)
            self.dropped += len(batch)
            return True
        except Exception as error:  # noqa: BLE001 - whatever the client raises, the stage must go on
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning("health metrics: %s unreachable (%s: %s); deferring the points, at most %d, "
                            "the oldest dropped beyond", self._where, type(error).__name__, str(error)[:200],
                            self._max_pending)
            return False
        self.written += len(batch)
        if self._failing_since is not None:
            log.info("health metrics: %s answers again after %.0f s; %d deferred points written, %d dropped",
                     self._where, time.monotonic() - self._failing_since, len(batch), self.dropped)
            self._failing_since = None
        return True
