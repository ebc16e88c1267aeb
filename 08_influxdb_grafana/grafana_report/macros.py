"""Grafana's InfluxQL macros and template variables, substituted the way Grafana does.

`$timeFilter` becomes ``time >= <from>ms and time <= <to>ms``, `$__interval` a rounded GROUP BY
interval for about `MAX_DATA_POINTS` points (never below the panel's min interval), and a template variable (`$name`, `${name}`, `[[name]]`)
its value, or ``(a|b|c)`` for several values (regex-escaped, as the dashboards use them in regexes).
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline_core.influx import InfluxDBClient, shown_name

from .dashboards import Dashboard, Variable

MAX_DATA_POINTS = 800
# Grafana's rounding steps for $__interval, in ms; the datasource's timeInterval (1s) is the floor.
_INTERVAL_STEPS_MS = (1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000,
                      1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000,
                      604_800_000)
_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


@dataclass(frozen=True)
class TimeRange:
    start_ms: int
    end_ms: int

    @classmethod
    def last(cls, relative: str, now_ms: int | None = None) -> TimeRange:
        """A range like Grafana's panel `timeFrom` ("7d", "12h"): that long up to now."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return cls(now_ms - duration_ms(relative), now_ms)


def duration_ms(text: str) -> int:
    """A Grafana duration ("10s", "7d") in milliseconds."""
    match = re.fullmatch(r"(\d+)([smhdw])", text.strip())
    if not match:
        raise ValueError(f"unsupported duration {text!r}")
    return int(match[1]) * _UNITS_MS[match[2]]


def interval_ms(time_range: TimeRange, max_points: int = MAX_DATA_POINTS, min_interval_ms: int = 0) -> int:
    wanted = (time_range.end_ms - time_range.start_ms) / max_points
    step = next((step for step in _INTERVAL_STEPS_MS if step >= wanted), _INTERVAL_STEPS_MS[-1])
    return max(step, min_interval_ms)


def interval_text(milliseconds: int) -> str:
    for unit, size in sorted(_UNITS_MS.items(), key=lambda item: -item[1]):
        if milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"


def regex_value(values: Sequence[str]) -> str:
    escaped = [re.sub(r"([\\/^$.|?*+()\[\]{}])", r"\\\1", value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(query: str, time_range: TimeRange, variables: Mapping[str, Sequence[str]] | None = None,
               max_points: int = MAX_DATA_POINTS, min_interval: str | None = None) -> str:
    """The InfluxQL Grafana would send for `query` over `time_range` with these variable values."""
    step = interval_ms(time_range, max_points, duration_ms(min_interval) if min_interval else 0)
    text = query.replace("$timeFilter", f"time >= {time_range.start_ms}ms and time <= {time_range.end_ms}ms")
    text = text.replace("$__interval_ms", str(step)).replace("$__interval", interval_text(step))
    for name in sorted(variables or {}, key=len, reverse=True):
        value = regex_value(variables[name])  # type: ignore[index]
        text = text.replace(f"${{{name}}}", value).replace(f"[[{name}]]", value)
        text = re.sub(rf"\${re.escape(name)}\b", lambda _match: value, text)
    return text


def variable_values(client: InfluxDBClient, variable: Variable) -> list[str]:
    """The values Grafana offers for a query variable: its query's values through its regex."""
    values = [point["value"] for point in client.query(variable.query).get_points()]
    if variable.regex:
        pattern = re.compile(variable.regex.strip("/"))
        matches = [pattern.search(value) for value in values]
        values = [(match.group(1) if match.groups() else match.group(0)) for match in matches if match]
    return sorted(set(values))


def all_values(client: InfluxDBClient, dashboard: Dashboard) -> dict[str, list[str]]:
    """Every variable of the dashboard set to "All", as the dashboards open."""
    return {variable.name: variable_values(client, variable) for variable in dashboard.variables}


def alias(template: str, name: str, tags: Mapping[str, str]) -> str:
    """A series label from a target's alias (`$tag_<key>`, `$m` for the measurement), each tag value shown as the
    name it stands for (`pipeline_core.influx.shown_name`), exactly: substituted in one pass, so a name holding
    ``$m`` stays as it is, and only the template's own outer spaces are trimmed."""
    tags = {key: shown_name(value) for key, value in tags.items()}
    if not template:
        return " ".join([name, *(f"{key}={value}" for key, value in sorted(tags.items()))])
    return re.sub(r"\$(?:tag_(\w+)|measurement|m)",
                  lambda match: tags.get(match[1], "") if match[1] is not None else name, template.strip())
