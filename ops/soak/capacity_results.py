"""The latest capacity figures `make bench` measured (`benchmarks.capacity`, reports/capacity-*.json): the rate
the whole pipeline sustains per joiner, which the soak's backfill starts from and its report compares with."""
from __future__ import annotations

from pathlib import Path

import orjson

CAPACITY_GLOB = "capacity-*/results.json"


def latest_capacity_results(report_dir: Path) -> dict | None:
    """The newest capacity run's results, or None."""
    found = sorted(report_dir.glob(CAPACITY_GLOB), key=lambda path: path.stat().st_mtime)
    for path in reversed(found):
        try:
            return orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
    return None


def latest_capacity(report_dir: Path, joiner: str) -> float | None:
    """Rows/s the whole single stack sustained with `joiner` in the newest capacity run, or None."""
    results = latest_capacity_results(report_dir)
    if not results:
        return None
    for pipeline in results.get("pipelines", []):
        if pipeline.get("name") == joiner and pipeline.get("sustained_rows_s"):
            return float(pipeline["sustained_rows_s"])
    return None
