"""The join contract computed literally from its definition, by brute force: the oracle for the tests.

O(n·m); meant for small inputs. Records are identified by their times (unique within a stream).
"""

from __future__ import annotations

from typing import Sequence

from .cases import JoinCase

Pair = tuple[float, float, JoinCase]  # (left time, right time, case)


def _successor(t: float, others: Sequence[float]) -> float | None:
    later = [other for other in others if other >= t]
    return min(later) if later else None


def _predecessor(t: float, others: Sequence[float]) -> float | None:
    earlier = [other for other in others if other <= t]
    return max(earlier) if earlier else None


def _case(left: float, right: float, left_times: Sequence[float], right_times: Sequence[float]) -> JoinCase:
    if left == right:
        return JoinCase.SAME_TIME
    if left < right:
        return JoinCase.LEFT_SUCCESSOR if _successor(left, right_times) == right else JoinCase.RIGHT_PREDECESSOR
    return JoinCase.RIGHT_SUCCESSOR if _successor(right, left_times) == left else JoinCase.LEFT_PREDECESSOR


def reference_pairs(
    left_times: Sequence[float], right_times: Sequence[float], delta_time: float | None = None
) -> set[Pair]:
    """Every certain pair of the complete input: each record with its successor, and with its predecessor
    once the other stream has a record at or after it; pairs farther apart than ``delta_time`` dropped."""
    found: set[tuple[float, float]] = set()
    for times, others, is_left in ((left_times, right_times, True), (right_times, left_times, False)):
        for t in times:
            successor = _successor(t, others)
            if successor is None:
                continue  # no successor, and the predecessor is not certain either
            neighbours = (successor, _predecessor(t, others))
            for neighbour in neighbours:
                if neighbour is not None:
                    found.add((t, neighbour) if is_left else (neighbour, t))
    return {
        (left, right, _case(left, right, left_times, right_times))
        for left, right in found
        if delta_time is None or abs(left - right) <= delta_time
    }
