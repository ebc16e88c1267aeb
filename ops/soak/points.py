"""The InfluxDB point each record must become, as 07_db_connector/README.md defines it, written out here again (no
code shared with the DB connector, whose work it checks):

* a machine.data record: measurement `machinedata` (policy `raw`), tags thing and quantity, field result, at its
  phenomenonTime (ms) in ns;
* a machine.out record: measurement `joined` (policy `joined`), tags thing, quantity, case and level (its |result|
  against the DB connector's level thresholds: idle, low, medium, high), fields result and active (0.0 when
  idle, else 1.0), at the mean time's whole millisecond plus (left time - right time) mod 1,000,000 in ns.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

NS_PER_MS = 1_000_000
LEVELS = ("idle", "low", "medium", "high")
DEFAULT_LEVEL_BOUNDS = (100.0, 1000.0, 5000.0)
LEVEL_THRESHOLDS_ENV = "DB_CONNECTOR_LEVEL_THRESHOLDS"


def level_bounds(environ: Mapping[str, str] = os.environ) -> tuple[float, float, float]:
    """The DB connector's level thresholds, as its setting gives them (the stack's environment)."""
    text = environ.get(LEVEL_THRESHOLDS_ENV)
    if not text:
        return DEFAULT_LEVEL_BOUNDS
    first, second, third = (float(part) for part in text.split(","))
    return first, second, third


def level_of(result: float, bounds: tuple[float, float, float]) -> str:
    return next((name for name, bound in zip(LEVELS, bounds) if abs(result) < bound), LEVELS[-1])


def joined_point_of(record: Mapping[str, Any], bounds: tuple[float, float, float]
                    ) -> tuple[int, tuple[float, float, str, str]]:
    """A join result's point: its time in ns, and (result, active, case, level)."""
    result = float(record["result"])
    level = level_of(result, bounds)
    distance_ms = round(record["left"]["phenomenonTime"] - record["right"]["phenomenonTime"])
    time_ns = math.floor(record["phenomenonTime"]) * NS_PER_MS + distance_ms % NS_PER_MS
    return time_ns, (result, 0.0 if level == LEVELS[0] else 1.0, record["case"], level)
