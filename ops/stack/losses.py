"""What `make status` says about loss outside the pipeline's control: the counters the stages report in
`pipeline_health` (see pipeline_core.data_loss), added up over the last day."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline_core.health_metrics import HEALTH_MEASUREMENT
from pipeline_core.influx import InfluxDBClient
from pipeline_core.influx_retention import HEALTH_POLICY

# The counters, as `make status` names them.
LOSS_COUNTERS = {"records_skipped": "records skipped", "topics_deleted": "topics deleted",
                 "offset_resets": "offset resets"}
WINDOW = "24h"


def stage_losses(client: InfluxDBClient, window: str = WINDOW) -> dict[str, dict[str, int]]:
    """Per stage, each loss counter added up over its processes in the last `window` (each process counts
    from its start: its highest value is its total)."""
    fields = ", ".join(f'max("{name}") AS "{name}"' for name in LOSS_COUNTERS)
    result = client.query(f'SELECT {fields} FROM "{HEALTH_POLICY}"."{HEALTH_MEASUREMENT}" WHERE time > now() - {window} '
                          'GROUP BY "stage", "instance"')
    return add_up((tags or {}, point) for (_, tags), points in result.items() for point in points)


def add_up(rows: Iterable[tuple[Mapping[str, str], Mapping[str, object]]]) -> dict[str, dict[str, int]]:
    """Per stage, the counters of its processes' rows (tags, fields) added up; stages without any left out."""
    totals: dict[str, dict[str, int]] = {}
    for tags, fields in rows:
        stage = totals.setdefault(tags.get("stage", "?"), dict.fromkeys(LOSS_COUNTERS, 0))
        for name in LOSS_COUNTERS:
            value = fields.get(name)
            stage[name] += int(value) if isinstance(value, (int, float)) else 0
    return {stage: counts for stage, counts in totals.items() if any(counts.values())}


def describe(losses: Mapping[str, Mapping[str, int]], window: str = WINDOW) -> str:
    """One line of `make status`."""
    head = f"loss outside the pipeline's control (last {window}): "
    if not losses:
        return head + "none"
    return head + "; ".join(
        f"{stage} " + ", ".join(f"{counts[name]:,} {label}" for name, label in LOSS_COUNTERS.items() if counts[name])
        for stage, counts in sorted(losses.items())) + " (the stages' logs say which partitions, as WARNINGs)"
