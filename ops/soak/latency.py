"""End-to-end latency as a plant sees it: from a row's publish to its joined point queryable in InfluxDB.

The probe machines carry speed and torque on every axis in every row, so each of their rows joins at once with
itself (a pair of one time): the point `vaPower_C11` at the row's own time. The publisher notes when it sent each
probe row (`probes.jsonl`); this thread reads those notes as they come and asks InfluxDB every `interval_s` for
the probe machines' joined points in the span still awaited. A point's latency is the start of the first query
that found it, less the row's send time: the figure is at most `interval_s` (plus the query's own time) above the
truth. A row not found within `give_up_s` is counted as unseen (a SIGKILL of Mosquitto may have lost it).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from pipeline_core.influx_retention import JOINED_MEASUREMENT, JOINED_POLICY

from .publisher import PROBES_FILE

log = logging.getLogger("soak.latency")

PROBE_QUANTITY = "vaPower_C11"
GIVE_UP_S = 900.0


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class LatencyProbe(threading.Thread):
    def __init__(self, run_dir: Path, names: Sequence[str], query: Callable[[str], list[dict]],
                 interval_s: float = 0.25, give_up_s: float = GIVE_UP_S, sent_from: float = 0.0) -> None:
        super().__init__(name="soak-latency", daemon=True)
        self.path = run_dir / PROBES_FILE
        self.names = list(names)
        self.query = query
        self.interval_s = interval_s
        self.give_up_s = give_up_s
        self.sent_from = sent_from  # rows sent before this are not timed
        self.pending: dict[tuple[str, int], float] = {}  # (thing, time in ms) -> sent at
        self.measured: list[tuple[float, float]] = []  # (sent at, latency in s)
        self.unseen: list[tuple[str, int, float]] = []
        self.failed_queries = 0
        self.stop_event = threading.Event()
        self._offset = 0
        self._lock = threading.Lock()

    def samples(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self.measured)

    def run(self) -> None:
        while not self.stop_event.is_set():
            began = time.monotonic()
            self._read_notes()
            if self.pending:
                self._poll()
            self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def _read_notes(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as notes:
            notes.seek(self._offset)
            data = notes.read()
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        for line in data[:complete].splitlines():
            note = orjson.loads(line)
            if note["sent_at"] < self.sent_from:
                continue
            self.pending[(self.names[note["machine"]], note["time_ms"])] = note["sent_at"]

    def _poll(self) -> None:
        asked_at = time.time()
        oldest = min(time_ms for _thing, time_ms in self.pending)
        newest = max(time_ms for _thing, time_ms in self.pending)
        things = sorted({thing for thing, _time_ms in self.pending})
        condition = " OR ".join(f'"thing" = {_literal(thing)}' for thing in things)
        try:
            points = self.query(f'SELECT "result", "thing" FROM "{JOINED_POLICY}"."{JOINED_MEASUREMENT}" WHERE ({condition}) '
                                f'AND "quantity" = \'{PROBE_QUANTITY}\' AND time >= {oldest}ms AND time <= {newest}ms')
        except Exception as error:  # noqa: BLE001 - InfluxDB away (a fault): the next poll asks again
            self.failed_queries += 1
            log.debug("latency probe: query failed (%s)", error)
            points = []
        found = []
        for point in points:
            key = (point["thing"], int(point["time"]) // 1_000_000)
            if key in self.pending:
                found.append((self.pending.pop(key), asked_at))
        with self._lock:
            self.measured += [(sent_at, seen_at - sent_at) for sent_at, seen_at in found]
        for key, sent_at in list(self.pending.items()):
            if asked_at - sent_at > self.give_up_s:
                self.unseen.append((*key, sent_at))
                del self.pending[key]

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)
