"""Grafana's InfluxQL macros, global variables and template variables, substituted the way Grafana does.

`$timeFilter` becomes ``time >= <from>ms and time <= <to>ms``; `${__from}`, `${__to}` the range's ends in epoch ms
and `$__range_ms` its length (the dashboards compare it to pick a history tier); `$__interval` (`$__interval_ms`)
the GROUP BY interval Grafana computes for a panel: its range divided by its `maxDataPoints` (else its width in
pixels), rounded to Grafana's steps, never below the panel's min interval or the datasource's 1 s. A template
variable (`$name`, `${name}`, `[[name]]`) becomes its selected value, or ``(a|b|c)`` for several (regex-escaped:
the dashboards use their variables inside regexes), or the variable's "all" value when it is set to All.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from pipeline_core.influx import InfluxDBClient, shown_name

from .dashboards import ALL, Dashboard, Variable

DATASOURCE_MIN_INTERVAL_MS = 1_000  # the provisioned datasource's timeInterval: the machines report once a second
# Grafana's rounding of range / points to a readable interval (rangeutil.roundInterval): (below this, use this), ms.
_ROUNDING_MS = ((15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1_500, 1_000), (3_500, 2_000),
                (7_500, 5_000), (12_500, 10_000), (17_500, 15_000), (25_000, 20_000), (45_000, 30_000),
                (90_000, 60_000), (210_000, 120_000), (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000),
                (1_500_000, 1_200_000), (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
                (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
                (604_800_000, 86_400_000), (1_814_400_000, 604_800_000), (3_628_800_000, 2_592_000_000))
_YEAR_MS = 31_536_000_000
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
# What Grafana's escapeRegex escapes, and control characters besides (as RE2's \x{..}, so a name holding one stays
# one token of the query whatever InfluxQL's scanner makes of raw control characters).
_REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}/]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class TimeRange:
    start_ms: int
    end_ms: int

    @classmethod
    def last(cls, relative: str, now_ms: int | None = None) -> TimeRange:
        """A range like Grafana's panel `timeFrom` ("7d", "12h"): that long up to now."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return cls(now_ms - duration_ms(relative), now_ms)

    @property
    def length_ms(self) -> int:
        return self.end_ms - self.start_ms


def duration_ms(text: str) -> int:
    """A Grafana duration ("10s", "7d", ">10s" for a min interval) in milliseconds."""
    match = re.fullmatch(r">?(\d+)(ms|[smhdw])", text.strip())
    if not match:
        raise ValueError(f"unsupported duration {text!r}")
    return int(match[1]) * _UNITS_MS[match[2]]


def round_interval_ms(raw_ms: float) -> int:
    """Grafana's readable interval near `raw_ms`."""
    return next((step for below, step in _ROUNDING_MS if raw_ms < below), _YEAR_MS)


def interval_ms(time_range: TimeRange, max_points: int, min_interval_ms: int = 0) -> int:
    """The GROUP BY interval Grafana gives a panel over `time_range` with `max_points` per series."""
    step = round_interval_ms(time_range.length_ms / max(max_points, 1))
    return max(step, min_interval_ms, DATASOURCE_MIN_INTERVAL_MS)


def interval_text(milliseconds: int) -> str:
    for unit, size in sorted(_UNITS_MS.items(), key=lambda item: -item[1]):
        if milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"


def parse_values(text: str) -> list[str]:
    """Values as a person gives them: comma-separated, or a JSON list of strings (a name may hold a comma)."""
    if text.lstrip().startswith("["):
        values = json.loads(text)
        if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
            raise ValueError(f"{text!r} is no JSON list of strings")
        return values
    return [value.strip() for value in text.split(",") if value.strip()]


def regex_escape(value: str) -> str:
    """A value as a regex matching exactly it, inside InfluxQL's /.../ (Grafana's escapeRegex, `/` included)."""
    escaped = _REGEX_SPECIAL.sub(lambda match: "\\" + match[0], value)
    return _CONTROL.sub(lambda match: f"\\x{{{ord(match[0]):02x}}}", escaped)


def regex_value(values: Sequence[str]) -> str:
    escaped = [regex_escape(value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


@dataclass(frozen=True)
class Selection:
    """A variable's state: the values it offers and those selected (`everything`: "All")."""

    options: tuple[str, ...]
    selected: tuple[str, ...]
    everything: bool = False

    def query_text(self, variable: Variable) -> str:
        """What the variable becomes in a query."""
        if self.everything and variable.all_value is not None:
            return variable.all_value
        values = self.options if self.everything else self.selected
        if not variable.multi and not variable.include_all:  # Grafana escapes only what may stand for several
            return values[0] if values else ""
        # Nothing to select: `^()$` matches the empty string only, which no tag value is.
        return regex_value(values) if values else "()"

    @property
    def shown(self) -> tuple[str, ...]:
        return self.options if self.everything else self.selected


def _global_values(time_range: TimeRange, step_ms: int) -> dict[str, str]:
    return {"__from": str(time_range.start_ms), "__to": str(time_range.end_ms),
            "__range_ms": str(time_range.length_ms), "__range_s": str(time_range.length_ms // 1000),
            "__interval_ms": str(step_ms), "__interval": interval_text(step_ms)}


def substitute(query: str, time_range: TimeRange, variables: Mapping[str, str] | None = None,
               step_ms: int | None = None) -> str:
    """The InfluxQL Grafana would send for `query` over `time_range`: `variables` maps a template variable's name
    to its text in queries (`Selection.query_text`); `step_ms` is the panel's $__interval (default: Grafana's for
    1,000 points). One pass over the query, as Grafana's: a value holding a `$` (a machine's name) stays as it is."""
    step_ms = interval_ms(time_range, 1000) if step_ms is None else step_ms
    values = {**_global_values(time_range, step_ms), **(variables or {}),
              "timeFilter": f"time >= {time_range.start_ms}ms and time <= {time_range.end_ms}ms"}
    names = "|".join(re.escape(name) for name in sorted(values, key=len, reverse=True))
    pattern = re.compile(rf"\$\{{({names})\}}|\[\[({names})\]\]|\$({names})(?!\w)")
    return pattern.sub(lambda match: values[match[1] or match[2] or match[3]], query)


def variable_values(client: InfluxDBClient, variable: Variable, query: str) -> list[str]:
    """The values Grafana offers for a variable: a custom one's list; a query one's values (InfluxDB's second column:
    the tag value of SHOW TAG VALUES, the first selected column of a SELECT) through its regex, in query order."""
    if variable.type in ("custom", "constant"):
        return [value.strip() for value in query.split(",") if value.strip()] if variable.type == "custom" \
            else [query]
    values: list[str] = []
    first_column = query.lstrip().lower().startswith(("show field keys", "show retention policies"))
    for series in client.query(query).raw.get("series", []):
        for row in series.get("values", []):
            value = row[0] if first_column or len(row) < 2 else row[1]
            if value is not None and str(value) not in values:
                values.append(str(value))
    if variable.regex:
        pattern = re.compile(variable.regex.strip("/"))
        matches = [pattern.search(value) for value in values]
        values = list(dict.fromkeys(match.group(1) if match.groups() else match.group(0)
                                    for match in matches if match))
    return values


def variable_waves(dashboard: Dashboard) -> list[list[Variable]]:
    """The dashboard's variables in waves, in order: a variable's query uses only variables of the waves before its
    own, so the variables of one wave can be asked side by side (Grafana resolves independent variables at once)."""
    wave_of: dict[str, int] = {}
    waves: list[list[Variable]] = []
    for variable in dashboard.variables:
        used = [wave_of[name] for name in wave_of if re.search(
            rf"\$\{{{re.escape(name)}\}}|\[\[{re.escape(name)}\]\]|\${re.escape(name)}(?!\w)", variable.query)]
        wave = max(used, default=-1) + 1
        wave_of[variable.name] = wave
        if wave == len(waves):
            waves.append([])
        waves[wave].append(variable)
    return waves


def resolve_variables(client: InfluxDBClient, dashboard: Dashboard, time_range: TimeRange,
                      chosen: Mapping[str, Sequence[str]] | None = None,
                      connect: Callable[[], InfluxDBClient] | None = None) -> dict[str, Selection]:
    """Every variable of the dashboard (a variable's query may use those before it and the time range): its values
    and its selection, `chosen[name]` where given ([ALL] for All, values no longer offered dropped) and else what the
    dashboard opens with. With `connect` (a new client), the queries of variables that do not use each other run side
    by side, one of them on `client`, each other on a client of its own."""
    chosen = chosen or {}
    resolved: dict[str, Selection] = {}
    for wave in variable_waves(dashboard):
        texts = query_texts(dashboard, resolved)
        asked = [(variable, substitute(variable.query, time_range, texts)) for variable in wave]
        queried = [index for index, (variable, _query) in enumerate(asked) if variable.type == "query"]
        options: list[list[str] | None] = [None] * len(asked)
        if connect is not None and len(queried) > 1:
            clients = [client, *(connect() for _ in queried[1:])]
            answers = _side_by_side([partial(variable_values, each, *asked[index])
                                     for each, index in zip(clients, queried)])
            for index, answer in zip(queried, answers):
                options[index] = answer
        for index, (variable, query) in enumerate(asked):
            values = options[index]
            resolved[variable.name] = _selection(variable, tuple(variable_values(client, variable, query)
                                                                 if values is None else values), chosen)
    return {variable.name: resolved[variable.name] for variable in dashboard.variables}


def _side_by_side(calls: Sequence[Callable[[], list[str]]]) -> list[list[str]]:
    """The first call here and each other on a thread of its own, at once: their answers in order (a call's error
    raised here). Daemon threads: a query that InfluxDB never answers does not hold the process's exit up."""
    answers: list[list[str] | BaseException | None] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            answers[index] = calls[index]()
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread below
            answers[index] = error

    threads = [threading.Thread(target=run, args=(index,), name="variables", daemon=True)
               for index in range(1, len(calls))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers  # type: ignore[return-value]


def _selection(variable: Variable, options: tuple[str, ...], chosen: Mapping[str, Sequence[str]]) -> Selection:
    wanted = tuple(chosen.get(variable.name, variable.current))
    if variable.include_all and (wanted == (ALL,) or not wanted):
        return Selection(options, options, everything=True)
    selected = tuple(value for value in wanted if value in options) or options[:1]
    return Selection(options, selected if variable.multi else selected[:1])


def query_texts(dashboard: Dashboard, resolved: Mapping[str, Selection]) -> dict[str, str]:
    """Variable name -> its text in queries, for the variables resolved so far."""
    return {variable.name: resolved[variable.name].query_text(variable) for variable in dashboard.variables
            if variable.name in resolved}


def alias(template: str, name: str, tags: Mapping[str, str]) -> str:
    """A series label from a target's alias (`$tag_<key>`, `$m` for the measurement), each tag value shown as the
    name it stands for (`pipeline_core.influx.shown_name`), exactly: substituted in one pass, so a name holding
    ``$m`` stays as it is, and only the template's own outer spaces are trimmed."""
    tags = {key: shown_name(value) for key, value in tags.items()}
    if not template:
        return " ".join([name, *(f"{key}={value}" for key, value in sorted(tags.items()))])
    return re.sub(r"\$(?:tag_(\w+)|measurement|m)",
                  lambda match: tags.get(match[1], "") if match[1] is not None else name, template.strip())
