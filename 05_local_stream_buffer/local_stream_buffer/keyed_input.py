"""What the keyed joiner reads of a record: thing, quantity, time in epoch ms and result, from a record dict
(the pipeline's wire record) or a :class:`Record` with a 'thing' metadata attribute, checked."""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

from .output import canonical_time
from .record import Record


def record_fields(record: Mapping[str, Any] | Record) -> tuple[str, str, float, float]:
    """(thing, quantity, time in epoch ms, result) of a record dict or Record; KeyError, TypeError or ValueError
    when a field is missing or not what it must be."""
    if isinstance(record, Record):
        thing = record.get("thing")
        quantity = record.quantity
        t = canonical_time(round(record.phenomenonTime * 1000, 3))  # Record keeps seconds
        value = record.result
    else:
        thing = record["thing"]
        quantity = record["quantity"]
        t = record["phenomenonTime"]
        # Epoch ms as they are: units are normalised once, where records enter machine.data.
        if type(t) is not int and not (type(t) is float and math.isfinite(t)):
            t = _epoch_ms(t)
        value = record["result"]
    if type(thing) is not str or type(quantity) is not str:
        if not isinstance(thing, str) or not isinstance(quantity, str):
            raise TypeError("thing and quantity must be strings")
    return thing, quantity, t, value if type(value) is float else float(value)


def _epoch_ms(t: object) -> float:
    """A time that is not a plain int or finite float: a finite number (not a bool), or an error saying why."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise TypeError(f"phenomenonTime must be a number of epoch milliseconds, not {t!r}")
    if not math.isfinite(t):
        raise ValueError(f"phenomenonTime must be finite, not {t!r}")  # NaN would defeat every order check
    return t
