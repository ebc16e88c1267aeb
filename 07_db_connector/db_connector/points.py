"""Kafka records to InfluxDB line protocol: one point per record, the same point on every replay.

Series and timestamps (all written with nanosecond precision):

* raw quantities (machine.data): ``<data measurement>,quantity=<q>,thing=<t> result=<float> <time>``
  with the time the record's ``phenomenonTime`` (epoch ms) exactly.
* join results (machine.out): ``<joined measurement>,case=<join case>,level=<power level>,quantity=<q>,
  thing=<t> result=<float>,active=<0.0|1.0> <time>``. The time is the result's ``phenomenonTime`` (the
  mean of both input times) floored to the millisecond; the sub-millisecond nanoseconds carry the
  distance of the two input times, ``(left time - right time) mod 1,000,000`` ms. Two different
  results of one thing and quantity share the mean time only if their input times differ (pairs
  (1, 3) and (2, 2) both have mean 2), and then the distance differs, so they land on different
  nanoseconds and never overwrite each other (joins pair neighbours seconds apart, far inside the
  ~16 minutes the nanoseconds can tell apart). The same result replayed lands on the same point.
* dead letters (machine.dlq): ``<deadletter measurement>,partition=<p>,stage=<stage> reason="<reason>"
  <time>``, time the Kafka timestamp in ms plus the Kafka offset modulo 1,000,000 in nanoseconds, so
  each dead letter is its own point (two in one partition and millisecond are fewer than a million
  offsets apart) and a re-read one overwrites itself.

`result` is always written as a float: InfluxDB rejects an integer written into a float field.

Every line is valid UTF-8 on one line: names are checked by `pipeline_core.records.decode_record`
(and the join case here) against `pipeline_core.validation` and written as tag values by
`pipeline_core.influx.stored_name` (each name as it is, but for the few InfluxDB cannot carry so: those
escaped, reversibly, as readers undo with `shown_name`), and a dead letter's stage and reason, which come from
whoever wrote the envelope, are made safe before they are written.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pipeline_core.influx import escape_measurement, escape_tag, stored_name
from pipeline_core.records import InvalidRecord, MachineRecord, decode_record
from pipeline_core.timestamps import EARLIEST_MS, LATEST_MS, VALID_RANGE
from pipeline_core.validation import describe, is_finite_number, name_problem

NS_PER_MS = 1_000_000
LEVEL_NAMES = ("idle", "low", "medium", "high")


def float_field(value: Any, name: str = "result") -> str:
    """A finite number as a line-protocol float (never an integer: `1` becomes `1.0`)."""
    if not is_finite_number(value):
        raise InvalidRecord(f"{name} must be a finite number, got {value!r}")
    return repr(float(value))


def string_field(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# InfluxDB stores int64 nanoseconds: roughly the years 1677 to 2262.
_MIN_NS, _MAX_NS = -(2**63) + 2, 2**63 - 2


def epoch_ms_to_ns(time_ms: float | int) -> int:
    """Epoch ms (int or float) to integer ns, exact for integers and half milliseconds."""
    if isinstance(time_ms, int):
        time_ns = time_ms * NS_PER_MS
    else:
        whole = math.floor(time_ms)
        time_ns = int(whole) * NS_PER_MS + round((time_ms - whole) * NS_PER_MS)
    return _in_range(time_ns)


def _in_range(time_ns: int) -> int:
    if not _MIN_NS <= time_ns <= _MAX_NS:
        raise InvalidRecord(f"phenomenonTime {time_ns / NS_PER_MS:.0f} ms is outside InfluxDB's time range "
                            "(epoch milliseconds expected)")
    return time_ns


@dataclass(frozen=True)
class PowerLevels:
    """Buckets of |result| for the join results' `level` tag; above the first bound is `active`."""

    bounds: tuple[float, float, float]

    @classmethod
    def parse(cls, text: str) -> PowerLevels:
        try:
            bounds = tuple(float(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"level thresholds must be numbers, got {text!r}") from None
        if len(bounds) != len(LEVEL_NAMES) - 1 or list(bounds) != sorted(bounds):
            raise ValueError(f"level thresholds must be {len(LEVEL_NAMES) - 1} ascending numbers, got {text!r}")
        return cls(bounds)  # type: ignore[arg-type]

    def level(self, value: float) -> str:
        magnitude = abs(value)
        for name, bound in zip(LEVEL_NAMES, self.bounds):
            if magnitude < bound:
                return name
        return LEVEL_NAMES[-1]


# Few distinct series carry many points: their escaped keys are built once (the hot path of the connector).
_SERIES_CACHE_SIZE = 100_000


@lru_cache(maxsize=_SERIES_CACHE_SIZE)
def _data_series(measurement: str, quantity: str, thing: str) -> str:
    return f"{escape_measurement(measurement)},quantity={name_tag(quantity)},thing={name_tag(thing)}"


@lru_cache(maxsize=_SERIES_CACHE_SIZE)
def _joined_series(measurement: str, case: str, level: str, quantity: str, thing: str) -> str:
    return (f"{escape_measurement(measurement)},case={name_tag(case)},level={level},"
            f"quantity={name_tag(quantity)},thing={name_tag(thing)}")


def name_tag(name: str) -> str:
    """A name as a tag value in line protocol."""
    return escape_tag(stored_name(name))


def data_point(measurement: str, record: MachineRecord) -> str:
    """The line of one machine.data record `decode_record` accepted: its result is a finite number and its time
    inside the valid range, so neither is checked again (this runs once per record)."""
    time_ms = record["phenomenonTime"]
    time_ns = time_ms * NS_PER_MS if type(time_ms) is int else epoch_ms_to_ns(time_ms)
    return (f"{_data_series(measurement, record['quantity'], record['thing'])} "
            f"result={float(record['result'])!r} {time_ns}")


def _input_time(record: dict[str, Any], side: str) -> float | int:
    part = record.get(side)
    if not isinstance(part, dict) or not is_finite_number(part.get("phenomenonTime")):
        raise InvalidRecord(f"join result needs {side}.phenomenonTime as a finite number")
    time_ms = part["phenomenonTime"]
    if not EARLIEST_MS <= time_ms < LATEST_MS:
        raise InvalidRecord(f"{side}.phenomenonTime {describe(time_ms)} is outside the valid time range "
                            f"(epoch milliseconds of {VALID_RANGE})")
    return time_ms


def joined_time_ns(record: dict[str, Any]) -> int:
    """The point time of a join result: its mean time's millisecond, the input distance below it."""
    distance_ms = round(_input_time(record, "left") - _input_time(record, "right"))
    return _in_range(math.floor(record["phenomenonTime"]) * NS_PER_MS + distance_ms % NS_PER_MS)


def joined_point(measurement: str, record: MachineRecord, levels: PowerLevels) -> str:
    """The line of one validated machine.out record."""
    result = float_field(record["result"])
    case = record.get("case")  # type: ignore[misc]
    if not isinstance(case, str) or not case:
        raise InvalidRecord(f"join result needs a non-empty string 'case', got {describe(case)}")
    problem = name_problem(case)
    if problem is not None:
        raise InvalidRecord(f"join result's case {describe(case)} {problem}")
    level = levels.level(float(record["result"]))
    active = "0.0" if level == LEVEL_NAMES[0] else "1.0"
    series = _joined_series(measurement, case, level, record["quantity"], record["thing"])
    return f"{series} result={result},active={active} {joined_time_ns(record)}"  # type: ignore[arg-type]


def deadletter_point(measurement: str, payload: bytes | None, timestamp_ms: int, partition: int,
                     offset: int) -> str:
    """The line counting one machine.dlq record; an unreadable envelope still counts."""
    stage, reason = "unknown", "unreadable dead letter"
    try:
        envelope = json.loads(payload or b"")
        if isinstance(envelope, dict):
            stage = envelope.get("stage") or stage
            reason = envelope.get("reason") or reason
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a number of too many digits, too deep
        pass
    stage_tag = name_tag(stage) if isinstance(stage, str) and name_problem(stage) is None else "unknown"
    if not isinstance(reason, str):
        reason = describe(reason, limit=1000)
    # A lone surrogate (JSON allows its escape) becomes its escape again: the line stays UTF-8.
    reason = reason[:1000].encode("utf-8", "backslashreplace").decode("utf-8")
    return (f"{escape_measurement(measurement)},partition={partition},stage={stage_tag} reason={string_field(reason)} "
            f"{timestamp_ms * NS_PER_MS + offset % NS_PER_MS}")


def record_line(payload: bytes | None, measurement: str, levels: PowerLevels | None = None) -> str:
    """The line of one machine.data record (`levels` None) or machine.out record (with the power
    levels), or `InvalidRecord` with the reason it has none."""
    if payload is None:
        raise InvalidRecord("record without a value (a tombstone)")
    # The bytes as they came: orjson checks UTF-8 itself, faster than a decode to text first.
    record = decode_record(payload)
    return data_point(measurement, record) if levels is None else joined_point(measurement, record, levels)


def body(lines: Sequence[str]) -> bytes:
    """A write request's body."""
    return "\n".join(lines).encode()
