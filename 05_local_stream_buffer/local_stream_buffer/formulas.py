"""Named formulas a join spec may reference for its output result: no expression strings are evaluated.

Each takes two floats, or two float64 arrays (the Spark job's columns) and then computes every element
exactly as it would the floats: the same operations in the same order.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, TypeVar

import numpy as np

Value = TypeVar("Value", float, np.ndarray)
Formula = Callable[[Value, Value], Value]

# Mechanical power from speed (rpm) and torque (Nm): P[W] = 2π/60 · n · M, the seed's power formula.
POWER_FACTOR = 2 * math.pi / 60


def power(speed: Value, torque: Value) -> Value:
    return POWER_FACTOR * speed * torque


def product(left: Value, right: Value) -> Value:
    return left * right


def difference(left: Value, right: Value) -> Value:
    return left - right


def ratio(left: Value, right: Value) -> Value:
    """left / right; NaN where right is 0 (a join must not crash on one bad sample)."""
    if isinstance(right, np.ndarray):
        return np.divide(left, right, out=np.full(right.shape, np.nan), where=right != 0)
    return left / right if right else math.nan


FORMULAS: Mapping[str, Formula] = {
    "power": power,
    "product": product,
    "difference": difference,
    "ratio": ratio,
}
