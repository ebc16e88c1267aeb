"""Batched line-protocol writes to InfluxDB that lose nothing.

One HTTP request per batch. A batch InfluxDB rejects in part (HTTP 400: a type conflict, a value it
cannot parse, points beyond the retention policy) is split in halves and each half written again, down to
the single points that fail: those are returned with InfluxDB's reason, everything else is stored. A
request whose every point InfluxDB says it dropped (`partial write: ... dropped=N`, N the request's size)
is not split: its points are all refused, so a backlog older than the retention policy costs one request
per batch instead of two per point. Re-writing points that a partial write already stored is harmless
because a point with the same series and time overwrites itself.
An unreachable or failing server (connection error, timeout, 5xx, missing database, auth) raises
`SinkUnavailable`: the DB connector's loop waits (its one retry policy) and writes the batch again.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

import requests

from pipeline_core.influx import InfluxDBClient, InfluxDBClientError, InfluxDBServerError
from pipeline_core.influx_retention import RetentionSettings, ensure_retention, policy_missing

from .points import body
from .sink import Refused, SinkUnavailable

log = logging.getLogger(__name__)

# HTTP statuses that say something about the points sent, not about the server.
_POINT_ERRORS = {400, 413, 422}
# How many points of a partial write InfluxDB dropped ("partial write: points beyond retention policy dropped=3").
_DROPPED = re.compile(r"partial write:.*\bdropped=(\d+)")


class InfluxWriter:
    """Writes batches of lines into one database; see the module docstring for the guarantees."""

    def __init__(self, client: InfluxDBClient, database: str, retention: RetentionSettings) -> None:
        self._client = client
        self._database = database
        self._retention = retention
        self.requests = 0
        self.retries = 0  # requests that failed, to be asked again (growing: InfluxDB is in trouble)

    def ensure_database(self) -> None:
        """The database with its retention policies (idempotent, `pipeline_core.influx_retention`), retried
        until InfluxDB answers. A user without the admin privilege (the `writer` of a secure stack) may not
        create them: the stack's admin made them, and it writes into them as they are. `SinkUnavailable` while
        InfluxDB does not answer."""
        def create() -> None:
            try:
                ensure_retention(self._client, self._database, self._retention)
            except InfluxDBClientError as error:
                if error.code != 403:
                    raise
                log.info("not allowed to create database %s or its retention policies; writing into them as "
                         "they are", self._database)

        self._answered(create, "create the database and its retention policies")

    def write(self, lines: Sequence[str], policy: str) -> list[Refused]:
        """Store `lines` in retention policy `policy`; returns the points InfluxDB refused, each with its reason.
        `SinkUnavailable` when a request found InfluxDB away: the caller writes all of `lines` again."""
        rejected: list[Refused] = []
        pending = [(0, len(lines))]
        while pending:
            start, stop = pending.pop()
            reason = self._write_once(lines[start:stop], policy)
            if reason is None:
                continue
            if stop - start == 1 or _dropped(reason) == stop - start:
                rejected.extend(Refused(index, reason) for index in range(start, stop))
            else:
                middle = (start + stop) // 2
                pending.extend([(middle, stop), (start, middle)])
        rejected.sort(key=lambda point: point.index)
        return rejected

    def _write_once(self, lines: Sequence[str], policy: str) -> str | None:
        """Write one request; None when stored, InfluxDB's reason when it refused the points."""
        refusal: list[str] = []

        def attempt() -> None:
            try:
                self._post(lines, policy)
            except InfluxDBClientError as error:
                if error.code not in _POINT_ERRORS:
                    raise
                refusal.append(_reason(error))

        self._answered(attempt, f"write {len(lines)} points")
        return refusal[0] if refusal else None

    def _post(self, lines: Sequence[str], policy: str) -> None:
        self.requests += 1
        self._client.request("write", "POST", params={"db": self._database, "rp": policy, "precision": "n"},
                             data=body(lines), expected_response_code=204,
                             headers={"Content-Type": "application/octet-stream"})

    def _answered(self, action: Callable[[], object], what: str) -> None:
        try:
            action()
        except (requests.exceptions.RequestException, InfluxDBServerError, InfluxDBClientError) as error:
            self.retries += 1
            if policy_missing(error):
                # The database or a policy was dropped or never made: make them, so that the retry writes.
                self._try_create_database()
            raise SinkUnavailable(f"InfluxDB could not {what} ({_reason(error)})") from error

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
