"""Named formulas a join spec may reference for its output result: no expression strings are evaluated.

Each formula has a scalar form (the per-record path) and a column form (numpy arrays, the batch path's
output records); the two compute the same float64 operations in the same order, so they give the same
results bit for bit.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

Formula = Callable[[float, float], float]
ColumnFormula = Callable[[np.ndarray, np.ndarray], np.ndarray]

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


def ratio_columns(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """:func:`ratio` of arrays: NaN where right is 0."""
    results = np.full(np.shape(left), math.nan)
    np.divide(left, right, out=results, where=right != 0)
    return results


# power, product and difference are plain arithmetic, so numpy evaluates them as written.
COLUMN_FORMULAS: Mapping[str, ColumnFormula] = {
    "power": power,
    "product": product,
    "difference": difference,
    "ratio": ratio_columns,
}
