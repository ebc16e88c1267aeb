"""What `make status` says about machines whose clocks lie: the clock rule's counters the joiners report per
machine in `machine_health` (see local_stream_buffer.clock), added up over the last day."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline_core.health_metrics import MACHINE_MEASUREMENT
from pipeline_core.influx import InfluxDBClient
from pipeline_core.influx_retention import HEALTH_POLICY

# The counters, as `make status` names them.
CLOCK_COUNTERS = {"clock_outliers": "outliers", "clock_steps_back": "steps back", "clock_jumps_ahead": "jumps ahead"}
WINDOW = "24h"
# Machines named on the status line; the rest are counted.
SHOWN = 5


def machine_clock_faults(client: InfluxDBClient, window: str = WINDOW) -> dict[str, dict[str, int]]:
    """Per machine, each clock counter added up over the joiner processes that reported it in the last `window`
    (each process counts from its start: its highest value is its total)."""
    fields = ", ".join(f'max("{name}") AS "{name}"' for name in CLOCK_COUNTERS)
    result = client.query(f'SELECT {fields} FROM "{HEALTH_POLICY}"."{MACHINE_MEASUREMENT}" WHERE time > now() - '
                          f'{window} GROUP BY "stage", "instance", "thing"')
    return add_up((tags or {}, point) for (_, tags), points in result.items() for point in points)


def add_up(rows: Iterable[tuple[Mapping[str, str], Mapping[str, object]]]) -> dict[str, dict[str, int]]:
    """Per machine, the counters of its rows (tags, fields) added up; machines without any left out."""
    totals: dict[str, dict[str, int]] = {}
    for tags, fields in rows:
        machine = totals.setdefault(tags.get("thing", "?"), dict.fromkeys(CLOCK_COUNTERS, 0))
        for name in CLOCK_COUNTERS:
            value = fields.get(name)
            machine[name] += int(value) if isinstance(value, (int, float)) else 0
    return {machine: counts for machine, counts in totals.items() if any(counts.values())}


def describe(faults: Mapping[str, Mapping[str, int]], window: str = WINDOW) -> str:
    """One line of `make status`: the machines with the most clock faults, and how many more."""
    head = f"clock faults (last {window}): "
    if not faults:
        return head + "none"
    ranked = sorted(faults.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    shown = "; ".join(f"{machine} " + ", ".join(f"{counts[name]:,} {label}" for name, label in CLOCK_COUNTERS.items()
                                                 if counts[name]) for machine, counts in ranked[:SHOWN])
    more = f"; and {len(ranked) - SHOWN} more machines" if len(ranked) > SHOWN else ""
    return head + shown + more + " (the joiner's log names each, as a WARNING or INFO; outliers are in machine.dlq)"
