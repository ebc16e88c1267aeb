"""Batched line-protocol writes to InfluxDB that lose nothing.

One HTTP request per batch. A batch InfluxDB rejects in part (HTTP 400: a type conflict, a value it
cannot parse, points beyond the retention policy) is split in halves and each half written again, down to
the single points that fail: those are returned with InfluxDB's reason, everything else is stored. A
request whose every point InfluxDB says it dropped (`partial write: ... dropped=N`, N the request's size)
is not split: its points are all refused, so a backlog older than the retention policy costs one request
per batch instead of two per point. Re-writing points that a partial write already stored is harmless
because a point with the same series and time overwrites itself.
An unreachable or failing server (connection error, timeout, 5xx, missing database, auth) is retried
with exponential backoff until it answers: nothing is dropped and the caller commits nothing meanwhile.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests
from influxdb import InfluxDBClient
from influxdb.exceptions import InfluxDBClientError, InfluxDBServerError

from pipeline_core.influx_retention import RetentionSettings, ensure_retention, policy_missing

from .points import body

log = logging.getLogger(__name__)

# HTTP statuses that say something about the points sent, not about the server.
_POINT_ERRORS = {400, 413, 422}
# How many points of a partial write InfluxDB dropped ("partial write: points beyond retention policy dropped=3").
_DROPPED = re.compile(r"partial write:.*\bdropped=(\d+)")


class WriteAborted(Exception):
    """Stop was requested while InfluxDB was unreachable; the batch was not (fully) written."""


@dataclass(frozen=True)
class RejectedPoint:
    index: int  # position in the batch
    reason: str


class InfluxWriter:
    """Writes batches of lines into one database; see the module docstring for the guarantees."""

    def __init__(self, client: InfluxDBClient, database: str, retention: RetentionSettings, *,
                 retry_max_s: float = 30.0, should_stop: Callable[[], bool] = lambda: False,
                 while_waiting: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._database = database
        self._retention = retention
        self._retry_max_s = retry_max_s
        self._should_stop = should_stop
        # Called instead of a plain sleep between retries, so the caller can keep its consumer alive.
        self._while_waiting = while_waiting
        self.requests = 0
        self.retries = 0
        self.failing = False  # the last attempt failed and is being retried: work waits on InfluxDB

    def ensure_database(self) -> None:
        """The database with its retention policies (idempotent, `pipeline_core.influx_retention`), retried
        until InfluxDB answers. A user without the admin privilege (the `writer` of a secure stack) may not
        create them: the stack's admin made them, and it writes into them as they are."""
        def create() -> None:
            try:
                ensure_retention(self._client, self._database, self._retention)
            except InfluxDBClientError as error:
                if error.code != 403:
                    raise
                log.info("not allowed to create database %s or its retention policies; writing into them as "
                         "they are", self._database)

        self._retrying(create, "create the database and its retention policies")

    def write(self, lines: Sequence[str], policy: str) -> list[RejectedPoint]:
        """Store `lines` in retention policy `policy`; returns the points InfluxDB refused, each with its reason."""
        rejected: list[RejectedPoint] = []
        pending = [(0, len(lines))]
        while pending:
            start, stop = pending.pop()
            reason = self._write_until_answered(lines[start:stop], policy)
            if reason is None:
                continue
            if stop - start == 1 or _dropped(reason) == stop - start:
                rejected.extend(RejectedPoint(index, reason) for index in range(start, stop))
            else:
                middle = (start + stop) // 2
                pending.extend([(middle, stop), (start, middle)])
        rejected.sort(key=lambda point: point.index)
        return rejected

    def _write_until_answered(self, lines: Sequence[str], policy: str) -> str | None:
        """Write one request; None when stored, InfluxDB's reason when it refused the points."""
        refusal: list[str] = []

        def attempt() -> None:
            try:
                self._post(lines, policy)
            except InfluxDBClientError as error:
                if error.code not in _POINT_ERRORS:
                    raise
                refusal.append(_reason(error))

        self._retrying(attempt, f"write {len(lines)} points")
        return refusal[0] if refusal else None

    def _post(self, lines: Sequence[str], policy: str) -> None:
        self.requests += 1
        self._client.request("write", "POST", params={"db": self._database, "rp": policy, "precision": "n"},
                             data=body(lines), expected_response_code=204,
                             headers={"Content-Type": "application/octet-stream"})

    def _retrying(self, action: Callable[[], object], what: str) -> None:
        delay = 0.1
        while True:
            try:
                action()
                self.failing = False
                return
            except (requests.exceptions.RequestException, InfluxDBServerError, InfluxDBClientError) as error:
                self.failing = True
                if policy_missing(error):
                    # The database or a policy was dropped or never made: make them, then retry the write.
                    self._try_create_database()
                self.retries += 1
                log.warning("InfluxDB could not %s (%s); retrying in %.1f s", what, _reason(error), delay)
            if self._should_stop():
                raise WriteAborted(f"stopped while trying to {what}")
            self._while_waiting(delay)
            if self._should_stop():
                raise WriteAborted(f"stopped while trying to {what}")
            delay = min(delay * 2, self._retry_max_s)

    def _try_create_database(self) -> None:
        try:
            ensure_retention(self._client, self._database, self._retention)
        except (requests.exceptions.RequestException, InfluxDBServerError, InfluxDBClientError) as error:
            log.warning("could not create database %s: %s", self._database, _reason(error))


def _dropped(reason: str) -> int | None:
    """The points a partial write dropped, by InfluxDB's answer; None if it does not say."""
    match = _DROPPED.search(reason)
    return int(match.group(1)) if match else None


def _reason(error: Exception) -> str:
    if isinstance(error, InfluxDBClientError):
        return f"HTTP {error.code}: {str(error.content).strip()[:500]}"
    return f"{type(error).__name__}: {error}"[:500]
