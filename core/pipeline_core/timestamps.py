"""Normalisation of event times to epoch seconds (seed-compatible) or epoch milliseconds."""

from __future__ import annotations

import math
import numbers
from datetime import datetime, timedelta, timezone

# Numbers at or above this are taken as finer than seconds (ms, µs, ns): 1e11 s lies in the year 5138.
SECONDS_LIMIT = 1e11
# Likewise for milliseconds: at or above this a number is taken as µs or ns.
MILLISECONDS_LIMIT = 1e14

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _parse_iso8601(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    # A naive time is read as UTC, not as the host's local time (which the seed did by accident).
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


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


def to_epoch_ms(value: float | int | str) -> float | int:
    """Epoch milliseconds from a number in s, ms, µs or ns or an ISO-8601 string.

    Numbers below 1e11 are seconds, numbers in [1e11, 1e14) are already milliseconds (kept as they are, so
    integer milliseconds stay exact integers), larger ones are divided by 1000 until they are milliseconds.
    """
    if isinstance(value, str):
        micros = (_parse_iso8601(value) - _EPOCH) // _MICROSECOND
        return micros // 1000 if micros % 1000 == 0 else micros / 1000
    value = _require_number(value)
    if value < SECONDS_LIMIT:
        return value * 1000
    while value >= MILLISECONDS_LIMIT:
        value /= 1000
    return value
