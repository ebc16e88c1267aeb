"""Event times: the one reading of a row's time the pipeline trusts.

`event_time_ms` is where the pipeline interprets a time, once: the stream connector reads every
row's ``Timestamp`` with it and writes epoch milliseconds to machine.data, which every later stage
takes as they are. A time is

* a number of seconds, milliseconds, microseconds or nanoseconds since 1970-01-01 UTC, or
* an ISO-8601 string (a time without an offset is UTC),

and must lie in [2000-01-01, 2100-01-01) UTC (`EARLIEST_MS`, `LATEST_MS`). Within that range the
four units occupy four disjoint bands of magnitude, so a number's unit is the band it lies in:

    s   946,684,800 ... 4,102,444,800
    ms  946,684,800,000 ... 4,102,444,800,000
    µs  946,684,800,000,000 ... 4,102,444,800,000,000
    ns  946,684,800,000,000,000 ... 4,102,444,800,000,000,000

A number in none of the bands, a non-finite one or a string that is not ISO-8601 is no time:
`InvalidTime` says why, and the row is dead-lettered. Nothing is rescaled until it fits.

`to_epoch_seconds` serves the join engine's seed-compatible API (`Record`), which takes a time of
any magnitude and divides by 1000 until it looks like seconds; the pipeline's records never pass
through it.
"""

from __future__ import annotations

import json
import math
import numbers
from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)

EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2100, 1, 1, tzinfo=timezone.utc)
EARLIEST_MS = (EARLIEST - _EPOCH) // timedelta(milliseconds=1)  # 946,684,800,000
LATEST_MS = (LATEST - _EPOCH) // timedelta(milliseconds=1)  # 4,102,444,800,000 (excluded)
VALID_RANGE = "2000-01-01 to 2100-01-01 UTC"

# The units a number may be in: one unit is `multiplier / divisor` milliseconds.
_UNITS = {"s": (1000, 1), "ms": (1, 1), "µs": (1, 1000), "ns": (1, 1_000_000)}
# Per unit, the numbers [low, high) that are times of the valid range (exact integers).
_BANDS = tuple((unit, EARLIEST_MS * divisor // multiplier, LATEST_MS * divisor // multiplier)
               for unit, (multiplier, divisor) in _UNITS.items())
# Longer strings are no ISO-8601 time; they are refused before parsing.
_MAX_ISO_LENGTH = 64


class InvalidTime(ValueError):
    """A value that is no event time; the message says why (and quotes the value, ASCII only)."""


def event_time_ms(value: object) -> int | float:
    """Epoch milliseconds of an event time (see the module docstring), or raise `InvalidTime`.

    Whole milliseconds come back as an int; finer times as a float rounded to the microsecond."""
    if type(value) is int and EARLIEST_MS <= value < LATEST_MS:
        return value  # the common case: integer epoch ms, exact as it is
    if isinstance(value, str):
        return _iso_ms(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTime(f"{_quote(value)} is not a time: expected a number (s, ms, µs or ns since "
                          "1970-01-01 UTC) or an ISO-8601 string")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidTime(f"{_quote(value)} is not a finite time")
    unit = _unit_of(value)
    if unit is None:
        raise InvalidTime(f"{_quote(value)} is outside the valid time range {VALID_RANGE} in s, ms, µs or ns")
    if isinstance(value, int):
        if unit == "s":
            return value * 1000
        micros = value if unit == "µs" else (value + 500) // 1000  # ns: to the nearest µs
        return micros // 1000 if micros % 1000 == 0 else micros / 1000
    multiplier, divisor = _UNITS[unit]
    # One correctly rounded operation, then µs precision: 1554096460.415 s is 1554096460415.0002 ms.
    millis = value * multiplier if multiplier > 1 else value / divisor
    return _whole_if_integer(round(millis, 3))


def shifted_time(value: object, delta_ms: int | float) -> object:
    """`value`, a valid event time, moved by `delta_ms` and written as it was written: a number in
    its own unit (an int stays an int when the shift is whole in that unit), an ISO-8601 string
    as ISO-8601 with its own offset (+00:00 for one that had none). Raises `InvalidTime` for what `event_time_ms` refuses."""
    event_time_ms(value)
    if isinstance(value, str):
        return (_parse_iso8601(value) + timedelta(milliseconds=delta_ms)).isoformat()
    multiplier, divisor = _UNITS[_unit_of(value)]  # type: ignore[index, arg-type]
    delta = delta_ms * divisor / multiplier
    if isinstance(value, int) and float(delta).is_integer():
        return value + int(delta)
    return value + delta  # type: ignore[operator]


def _unit_of(value: int | float) -> str | None:
    for unit, low, high in _BANDS:
        if low <= value < high:
            return unit
    return None


def _iso_ms(text: str) -> int | float:
    if len(text) > _MAX_ISO_LENGTH:
        raise InvalidTime(f"{_quote(text)} is not a time: a string of {len(text)} characters is no ISO-8601 time")
    try:
        moment = _parse_iso8601(text)
    except (ValueError, OverflowError):  # (its message would repeat the text unescaped)
        raise InvalidTime(f"{_quote(text)} is not a time: not ISO-8601") from None
    if not EARLIEST <= moment < LATEST:
        raise InvalidTime(f"{_quote(text)} is outside the valid time range {VALID_RANGE}")
    micros = (moment - _EPOCH) // _MICROSECOND
    return micros // 1000 if micros % 1000 == 0 else micros / 1000


def _parse_iso8601(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    # A naive time is read as UTC, not as the host's local time (which the seed did by accident).
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _whole_if_integer(millis: float) -> int | float:
    return int(millis) if millis.is_integer() else millis


def _quote(value: object) -> str:
    """The value for a message: JSON, ASCII only (a lone surrogate stays an escape), at most 80 characters."""
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):  # an integer too long for str(), a structure too deep
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


# --- The join engine's seed-compatible API -------------------------------------------------------

# Numbers at or above this are taken as finer than seconds (ms, µs, ns): 1e11 s lies in the year 5138.
SECONDS_LIMIT = 1e11


def _require_number(value: object) -> numbers.Real:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"a time must be a number or an ISO-8601 string, not {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"a time must be finite, not {value!r}")  # NaN would defeat every order check
    return value


def to_epoch_seconds(value: float | int | str) -> float | int:
    """Epoch seconds from a number in s, ms, µs or ns (divided by 1000 until below 1e11) or an ISO-8601 string.

    Integers already in seconds stay integers, as in the seed.
    """
    if isinstance(value, str):
        return (_parse_iso8601(value) - _EPOCH) / _MICROSECOND / 1e6
    value = _require_number(value)
    while value >= SECONDS_LIMIT:
        value /= 1000
    return value
