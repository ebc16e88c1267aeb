"""Named formulas a join spec may reference for its output result: no expression strings are evaluated."""

from __future__ import annotations

import math
from typing import Callable, Mapping

Formula = Callable[[float, float], float]

# Mechanical power from speed (rpm) and torque (Nm): P[W] = 2π/60 · n · M, the seed's power formula.
POWER_FACTOR = 2 * math.pi / 60


def power(speed: float, torque: float) -> float:
    return POWER_FACTOR * speed * torque


def product(left: float, right: float) -> float:
    return left * right


def difference(left: float, right: float) -> float:
    return left - right


def ratio(left: float, right: float) -> float:
    """left / right; NaN where right is 0 (a join must not crash on one bad sample)."""
    return left / right if right else math.nan


FORMULAS: Mapping[str, Formula] = {
    "power": power,
    "product": product,
    "difference": difference,
    "ratio": ratio,
}
