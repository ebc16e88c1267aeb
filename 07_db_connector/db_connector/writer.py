"""Batched line-protocol writes to InfluxDB that lose nothing.

One HTTP request per batch. A batch InfluxDB rejects in part (HTTP 400: a type conflict, a value it
cannot parse) is split in halves and each half written again, down to the single points that fail:
those are returned with InfluxDB's reason, everything else is stored. Re-writing points that a partial
write already stored is harmless because a point with the same series and time overwrites itself.
An unreachable or failing server (connection error, timeout, 5xx, missing database, auth) is retried
with exponential backoff until it answers: nothing is dropped and the caller commits nothing meanwhile.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests
from influxdb import InfluxDBClient
from influxdb.exceptions import InfluxDBClientError, InfluxDBServerError

from .points import body

log = logging.getLogger(__name__)

# HTTP statuses that say something about the points sent, not about the server.
_POINT_ERRORS = {400, 413, 422}


class WriteAborted(Exception):
    """Stop was requested while InfluxDB was unreachable; the batch was not (fully) written."""


@dataclass(frozen=True)
class RejectedPoint:
    index: int  # position in the batch
    reason: str


class InfluxWriter:
    """Writes batches of lines into one database; see the module docstring for the guarantees."""

    def __init__(self, client: InfluxDBClient, database: str, *, retry_max_s: float = 30.0,
                 should_stop: Callable[[], bool] = lambda: False,
                 while_waiting: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._database = database
        self._retry_max_s = retry_max_s
        self._should_stop = should_stop
        # Called instead of a plain sleep between retries, so the caller can keep its consumer alive.
        self._while_waiting = while_waiting
        self.requests = 0
        self.retries = 0
        self.failing = False  # the last attempt failed and is being retried: work waits on InfluxDB

    def ensure_database(self) -> None:
        """CREATE DATABASE (idempotent), retried until InfluxDB answers. A user without the admin
        privilege (the `writer` of a secure stack) may not: the stack's admin made the database."""
        def create() -> None:
            try:
                self._client.create_database(self._database)
            except InfluxDBClientError as error:
                if error.code != 403:
                    raise
                log.info("not allowed to create database %s; writing into it as it is", self._database)

        self._retrying(create, "create the database")

    def write(self, lines: Sequence[str]) -> list[RejectedPoint]:
        """Store `lines`; returns the points InfluxDB refused, each with its reason."""
        rejected: list[RejectedPoint] = []
        pending = [(0, len(lines))]
        while pending:
            start, stop = pending.pop()
            reason = self._write_until_answered(lines[start:stop])
            if reason is None:
                continue
            if stop - start == 1:
                rejected.append(RejectedPoint(start, reason))
            else:
                middle = (start + stop) // 2
                pending.extend([(middle, stop), (start, middle)])
        rejected.sort(key=lambda point: point.index)
        return rejected

    def _write_until_answered(self, lines: Sequence[str]) -> str | None:
        """Write one request; None when stored, InfluxDB's reason when it refused the points."""
        refusal: list[str] = []

        def attempt() -> None:
            try:
                self._post(lines)
            except InfluxDBClientError as error:
                if error.code not in _POINT_ERRORS:
                    raise
                refusal.append(_reason(error))

        self._retrying(attempt, f"write {len(lines)} points")
        return refusal[0] if refusal else None

    def _post(self, lines: Sequence[str]) -> None:
        self.requests += 1
        self._client.request("write", "POST", params={"db": self._database, "precision": "n"},
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
                if isinstance(error, InfluxDBClientError) and error.code == 404:
                    # The database was dropped or never made: make it, then retry the write.
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
            self._client.create_database(self._database)
        except (requests.exceptions.RequestException, InfluxDBServerError, InfluxDBClientError) as error:
            log.warning("could not create database %s: %s", self._database, _reason(error))


def _reason(error: Exception) -> str:
    if isinstance(error, InfluxDBClientError):
        return f"HTTP {error.code}: {str(error.content).strip()[:500]}"
    return f"{type(error).__name__}: {error}"[:500]
