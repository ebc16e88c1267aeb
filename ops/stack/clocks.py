"""What `make status` says about machines whose clocks lie: the clock rule's counters the joiners report per
machine in `machine_health` (see local_stream_buffer.clock), added up over the last day."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from pipeline_core.health_metrics import MACHINE_MEASUREMENT
from pipeline_core.influx import InfluxDBClient, shown_name
from pipeline_core.influx_retention import HEALTH_POLICY

# The counters, and how `make status` names those it shows. A jump ahead is no fault as such (a machine off for an
# hour jumps ahead too): counted, on the dashboard, not named here.
CLOCK_COUNTERS = ("clock_outliers", "clock_steps_back", "clock_jumps_ahead")
SHOWN_COUNTERS = {"clock_outliers": "outliers", "clock_steps_back": "series stepped back"}
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
        machine = totals.setdefault(shown_name(tags.get("thing", "?")), dict.fromkeys(CLOCK_COUNTERS, 0))
        for name in CLOCK_COUNTERS:
            value = fields.get(name)
            machine[name] += int(value) if isinstance(value, (int, float)) else 0
    return {machine: counts for machine, counts in totals.items() if any(counts.values())}


def faulty(faults: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The machines with an outlier or a series stepped back, and those counts."""
    return {machine: {name: counts[name] for name in SHOWN_COUNTERS} for machine, counts in faults.items()
            if any(counts[name] for name in SHOWN_COUNTERS)}


def printable(name: str) -> str:
    """A machine's name on a line of its own: as it is, or quoted as JSON where it holds what a terminal does not
    print (a line break, a control character)."""
    return name if name.isprintable() else json.dumps(name)


def describe(faults: Mapping[str, Mapping[str, int]], window: str = WINDOW) -> str:
    """One line of `make status`: the machines with the most clock faults (outliers, series whose clock stepped
    back), and how many more."""
    head = f"clock faults (last {window}): "
    faults = faulty(faults)
    if not faults:
        return head + "none"
    ranked = sorted(faults.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    shown = "; ".join(f"{printable(machine)} " + ", ".join(f"{counts[name]:,} {label}" for name, label in SHOWN_COUNTERS.items()
                                                 if counts[name]) for machine, counts in ranked[:SHOWN])
    more = f"; and {len(ranked) - SHOWN} more machines" if len(ranked) > SHOWN else ""
    return head + shown + more + " (the joiner's log names each step back, as a WARNING; outliers are in machine.dlq)"
