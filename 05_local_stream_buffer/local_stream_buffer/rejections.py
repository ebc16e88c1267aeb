"""Why the join turns a record (or a join result) away: one set of reasons for every adapter.

Each member's value is the wording of the reason a dead letter carries; :meth:`Rejection.reason` fills in
the details. The standalone joiner and the Spark job dead-letter with these texts, so the same input gets
the same reason from either.
"""

from __future__ import annotations

from enum import Enum

from .output import canonical_time


class Rejection(Enum):
    INVALID = "invalid: {error}"  # not a record the join can read (missing or mistyped field)
    OUT_OF_ORDER = "out_of_order: t={t} older than last t={last} of {stream}"  # older than its stream's latest
    CONFLICT = "conflict: t={t} equals last t of {stream} with a different result"  # same time, another result
    LATE = "late: inside a gap of its stream that forcing already closed"  # pairs went out without it
    # More than the join spec's max_out_of_orderness behind its stream's newest record (see reorder.py).
    BEYOND_BOUND = ("late: t={t} arrived {behind_ms} ms behind the newest t={newest} of {stream}, {late_ms} ms beyond "
                    "max_out_of_orderness {bound_ms} ms")
    # At or before the last record its stream's reorder buffer released after idle_release_s without records.
    RELEASED = ("late: t={t} arrived after {stream} was released up to t={released}, idle for its idle_release_s "
                "{idle_s} s")
    # Set aside by the clock rule for lying far off its stream's timeline, which the records after it kept to
    # (local_stream_buffer.clock).
    CLOCK_OUTLIER = ("clock_outlier: t={t} of {stream} lay {off_ms} ms {direction} its timeline at t={newest}, and "
                     "the records after it did not follow (clock_confirm_readings {confirm})")
    NOT_FINITE = "join result is not a finite number"  # a join result (a formula overflowing, say)
    # a record its join key held when the key was evicted (local_stream_buffer.eviction)
    EVICTED = ("evicted: join key {key} was among the least recently used when its partition or bucket passed "
               "{max_join_keys} keys; this record can no longer pair with later records")

    def reason(self, **details: object) -> str:
        """The reason text with its details, e.g. ``Rejection.INVALID.reason(error="...")``."""
        return self.value.format(**details)


def order_rejection(thing: str, quantity: str, t: float, last: float) -> str:
    """The reason for a record the order verdict rejects: older than the latest time ``last`` of its stream,
    or at that time with another result."""
    stream = f"{thing}.{quantity}"
    if t < last:
        return Rejection.OUT_OF_ORDER.reason(t=canonical_time(t), last=canonical_time(last), stream=stream)
    return Rejection.CONFLICT.reason(t=canonical_time(t), stream=stream)
