"""The soak's check of InfluxDB: every record of the run one point, counted per measurement and hour of event
time against what machine.data and the reference join give, and a random sample of whole windows of single series
compared point by point (times, values, tags)."""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline_core.influx_retention import DATA_MEASUREMENT, JOINED_MEASUREMENT, JOINED_POLICY, RAW_POLICY

from .check import HOUR_MS, SampleWindow

log = logging.getLogger("soak.influx")

EXAMPLES = 5
TABLES = {"raw": (RAW_POLICY, DATA_MEASUREMENT), "joined": (JOINED_POLICY, JOINED_MEASUREMENT)}


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hourly_counts(query: Callable[[str], list[dict]], measurement: str, thing_prefix: str, first_ms: int,
                  last_ms: int) -> Counter:
    """Points of the things named `thing_prefix`... per hour of event time."""
    policy, name = TABLES[measurement]
    if not thing_prefix.replace(" ", "").isalnum():
        raise ValueError(f"a thing prefix for a regular expression must be letters, digits and spaces: {thing_prefix!r}")
    points = query(f'SELECT count("result") FROM "{policy}"."{name}" WHERE "thing" =~ /^{thing_prefix}/ '
                   f"AND time >= {first_ms // HOUR_MS * HOUR_MS}ms AND time < {(last_ms // HOUR_MS + 1) * HOUR_MS}ms "
                   "GROUP BY time(1h) fill(none)")
    return Counter({int(point["time"]) // 1_000_000: int(point["count"]) for point in points if point.get("count")})


@dataclass
class CountVerdict:
    measurement: str
    expected: int
    found: int
    hours: int
    hours_differing: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.hours_differing


def compare_counts(measurement: str, expected: Counter, found: Counter) -> CountVerdict:
    hours = sorted(set(expected) | set(found))
    differing = [f"{time.strftime('%Y-%m-%d %H:00', time.gmtime(hour / 1000))}: expected {expected[hour]}, "
                 f"found {found[hour]}" for hour in hours if expected[hour] != found[hour]]
    return CountVerdict(measurement, sum(expected.values()), sum(found.values()), len(hours), differing)


def await_counts(query: Callable[[str], list[dict]], measurement: str, thing_prefix: str, expected: Counter,
                 deadline_s: float) -> CountVerdict:
    """InfluxDB's counts once they equal the expected ones, or as they are at the deadline (the DB connector may
    still be writing the last batches when the check starts)."""
    first, last = min(expected, default=0), max(expected, default=0)
    end = time.monotonic() + deadline_s
    while True:
        verdict = compare_counts(measurement, expected, hourly_counts(query, measurement, thing_prefix, first, last))
        if verdict.holds or time.monotonic() > end:
            return verdict
        time.sleep(5.0)


@dataclass
class SampleVerdict:
    measurement: str
    windows: int
    points: int  # compared
    differing: list[str] = field(default_factory=list)
    problems: int = 0

    @property
    def holds(self) -> bool:
        return self.problems == 0


def compare_windows(query: Callable[[str], list[dict]], windows: Sequence[SampleWindow],
                    measurement: str) -> SampleVerdict:
    """Each window's points read back whole: none missing, none extra, each of its value (and tags)."""
    verdict = SampleVerdict(measurement, 0, 0)
    policy, name = TABLES[measurement]
    fields = '"result"' if measurement == "raw" else '"result", "active", "case", "level"'
    for window in windows:
        if window.measurement != measurement:
            continue
        points = query(f'SELECT {fields} FROM "{policy}"."{name}" WHERE "thing" = {_literal(window.thing)} '
                       f'AND "quantity" = {_literal(window.quantity)} AND time >= {window.start_ms}ms '
                       f"AND time < {window.end_ms}ms")
        found = {int(point["time"]): (point["result"] if measurement == "raw" else
                                      (point["result"], point["active"], point["case"], point["level"]))
                 for point in points}
        verdict.windows += 1
        verdict.points += len(window.points)
        for time_ns, value in window.points.items():
            if time_ns not in found:
                _differ(verdict, f"{window.thing} {window.quantity} at {time_ns} ns: missing")
            elif found[time_ns] != value:
                _differ(verdict, f"{window.thing} {window.quantity} at {time_ns} ns: {found[time_ns]}, expected {value}")
        for time_ns in set(found) - set(window.points):
            _differ(verdict, f"{window.thing} {window.quantity} at {time_ns} ns: a point of no record ({found[time_ns]})")
    return verdict


def _differ(verdict: SampleVerdict, text: str) -> None:
    verdict.problems += 1
    if len(verdict.differing) < EXAMPLES:
        verdict.differing.append(text)
