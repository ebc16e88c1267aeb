"""Join specs: which two quantities of a thing join into which output, read from a TOML file.

One spec covers all axes through the ``{axis}`` placeholder: ``actSpeed_C{axis}`` x ``vaTorque_C{axis}``
gives ``vaPower_C11`` from ``actSpeed_C11`` and ``vaTorque_C11``, and so on. A spec applied to one axis
is a :class:`SpecBinding`; :class:`SpecResolver` maps a record's quantity to the bindings and sides it
feeds. Both the standalone keyed joiner and the Spark job resolve through it, so they route alike.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Iterable, NamedTuple

from pipeline_core.record_keys import split_key

from .formulas import COLUMN_FORMULAS, FORMULAS, ColumnFormula, Formula
from .two_stream_join import LEFT, RIGHT

log = logging.getLogger(__name__)

AXIS_PLACEHOLDER = "{axis}"
# Spec keys renamed to name their unit, by their former names: still read, with a warning.
FORMER_KEYS = {"delta_time": "delta_time_s", "max_out_of_orderness": "max_out_of_orderness_s"}
DEFAULT_AXIS_PATTERN = r"\d+"
# Read as a package resource: the package may be imported from a zip (spark-submit's --py-files), with no file.
DEFAULT_SPEC_RESOURCE = files(__package__).joinpath("join_specs.toml")
# Quantity names (and axes) resolved and kept for the next record: far more than a plant's quantities, a
# bound on what a flood of distinct names costs. A name pushed out is resolved again (a few regex matches).
ROUTE_CACHE_SIZE = 4096
# The clock rule's defaults (local_stream_buffer.clock): a reading more than an hour ahead of its timeline, or a
# minute behind it beyond the disorder bound, is set aside until two readings tell what it was. An hour ahead
# keeps a machine's pauses and sparse readings off the rule; a minute behind follows an NTP step or a clock
# set back within two readings.
DEFAULT_CLOCK_STEP_AHEAD_S = 3600.0
DEFAULT_CLOCK_STEP_BACK_S = 60.0
DEFAULT_CLOCK_CONFIRM_READINGS = 2


class ClockRule(NamedTuple):
    """A join spec's clock rule in milliseconds: how far a record may lie from its timeline's newest record
    (ahead; and behind, the disorder bound included), and how many records decide what a record set aside was."""

    ahead_ms: float
    behind_ms: float
    confirm: int

    def fits(self, t: float, newest: float) -> bool:
        """Whether a record at ``t`` fits a timeline whose newest record is at ``newest``."""
        return newest - self.behind_ms <= t <= newest + self.ahead_ms


@dataclass(frozen=True)
class JoinSpec:
    """One entry of the spec file; quantities are patterns that may contain ``{axis}``."""

    name: str
    left: str
    right: str
    output: str
    formula: str
    delta_time_s: float | None = None
    axis_pattern: str = DEFAULT_AXIS_PATTERN
    max_out_of_orderness_s: float = 0.0  # how far a record may arrive behind its stream's newest (see reorder.py)
    # Processing time without records of a stream after which what its reorder buffer holds is released
    # (None: never; see local_stream_buffer.idle_release). Only with a max_out_of_orderness_s above 0.
    idle_release_s: float | None = None
    # The clock rule (local_stream_buffer.clock): how far a record may lie ahead of its stream's timeline, and
    # behind it beyond max_out_of_orderness_s, before it is set aside; how many records then decide whether it
    # was an outlier or the clock moved. clock_confirm_readings 0 turns the rule off.
    clock_step_ahead_s: float = DEFAULT_CLOCK_STEP_AHEAD_S
    clock_step_back_s: float = DEFAULT_CLOCK_STEP_BACK_S
    clock_confirm_readings: int = DEFAULT_CLOCK_CONFIRM_READINGS

    def __post_init__(self) -> None:
        if self.formula not in FORMULAS:
            raise ValueError(f"join '{self.name}': unknown formula '{self.formula}', known: {sorted(FORMULAS)}")
        with_axis = {AXIS_PLACEHOLDER in pattern for pattern in (self.left, self.right, self.output)}
        if len(with_axis) != 1:
            raise ValueError(f"join '{self.name}': use {AXIS_PLACEHOLDER} in all of left, right, output or in none")
        if self.left == self.right:
            raise ValueError(f"join '{self.name}': left and right must be different quantities")
        if self.delta_time_s is not None and self.delta_time_s < 0:
            raise ValueError(f"join '{self.name}': delta_time_s must not be negative")
        if not 0 <= self.max_out_of_orderness_s < float("inf"):
            raise ValueError(f"join '{self.name}': max_out_of_orderness_s must be a finite number of seconds, at least 0")
        if self.idle_release_s is not None:
            if not 0 < self.idle_release_s < float("inf"):
                raise ValueError(f"join '{self.name}': idle_release_s must be a finite number of seconds above 0")
            if not self.max_out_of_orderness_s:
                raise ValueError(f"join '{self.name}': idle_release_s releases what max_out_of_orderness_s holds; "
                                 "without a max_out_of_orderness_s above 0 nothing is held")
        for setting in ("clock_step_ahead_s", "clock_step_back_s"):
            if not 0 < getattr(self, setting) < float("inf"):
                raise ValueError(f"join '{self.name}': {setting} must be a finite number of seconds above 0")
        if type(self.clock_confirm_readings) is not int or self.clock_confirm_readings == 1 \
                or self.clock_confirm_readings < 0:
            raise ValueError(f"join '{self.name}': clock_confirm_readings must be 0 (no clock rule) or a whole "
                             "number of readings from 2 up")

    def bind(self, axis: str) -> SpecBinding:
        """This spec applied to one axis ('' for a spec without ``{axis}``)."""
        return SpecBinding(
            spec=self,
            axis=axis,
            left_quantity=self.left.replace(AXIS_PLACEHOLDER, axis),
            right_quantity=self.right.replace(AXIS_PLACEHOLDER, axis),
            output_quantity=self.output.replace(AXIS_PLACEHOLDER, axis),
            combine=FORMULAS[self.formula],
            combine_columns=COLUMN_FORMULAS[self.formula],
        )

    def compile(self, pattern: str) -> re.Pattern[str]:
        """A regular expression matching the quantities of ``pattern`` (one of left, right, output)."""
        literal_parts = (re.escape(part) for part in pattern.split(AXIS_PLACEHOLDER))
        return re.compile(f"(?P<axis>{self.axis_pattern})".join(literal_parts))


@dataclass(frozen=True)
class SpecBinding:
    """A join spec applied to one axis: the concrete left, right and output quantities."""

    spec: JoinSpec
    axis: str
    left_quantity: str
    right_quantity: str
    output_quantity: str
    combine: Formula = field(compare=False, repr=False)
    combine_columns: ColumnFormula = field(compare=False, repr=False)  # the same formula on numpy arrays

    @property
    def delta_time_ms(self) -> float | None:
        """The spec's delta_time_s in milliseconds, the time unit of the keyed joiner and the Spark job."""
        return None if self.spec.delta_time_s is None else self.spec.delta_time_s * 1000

    @property
    def max_out_of_orderness_ms(self) -> float:
        """The spec's max_out_of_orderness_s in milliseconds (0: records must arrive in their stream's order)."""
        return round(self.spec.max_out_of_orderness_s * 1000, 6)  # 0.003 s is 3 ms, not 3.0000000000000004

    @property
    def idle_release_ms(self) -> float | None:
        """The spec's idle_release_s in milliseconds (None: a quiet stream's held records wait for its next)."""
        return None if self.spec.idle_release_s is None else round(self.spec.idle_release_s * 1000, 6)

    @property
    def clock_rule(self) -> ClockRule | None:
        """The spec's clock rule in milliseconds, None when it is off (``clock_confirm_readings`` 0)."""
        spec = self.spec
        if not spec.clock_confirm_readings:
            return None
        return ClockRule(round(spec.clock_step_ahead_s * 1000, 6),
                         self.max_out_of_orderness_ms + round(spec.clock_step_back_s * 1000, 6),
                         spec.clock_confirm_readings)

    def quantity(self, side: int) -> str:
        return self.right_quantity if side else self.left_quantity


class Route(NamedTuple):
    """A binding a quantity feeds, and on which side."""

    binding: SpecBinding
    side: int


def load_join_specs(path: str | Path | None = None) -> tuple[JoinSpec, ...]:
    """The join specs of a TOML file (default: the package's ``join_specs.toml``)."""
    with (open(path, "rb") if path else DEFAULT_SPEC_RESOURCE.open("rb")) as spec_file:
        document = tomllib.load(spec_file)
    specs = []
    for entry in document.get("join", []):
        name = entry.get("name", "?")
        unknown = set(entry) - {"name", "left", "right", "output", "formula", "delta_time_s", "axis",
                                "max_out_of_orderness_s", "idle_release_s", "clock_step_ahead_s", "clock_step_back_s",
                                "clock_confirm_readings", *FORMER_KEYS}
        if unknown:
            raise ValueError(f"join spec {name}: unknown keys {sorted(unknown)}")
        entry = _renamed_keys(entry, path or DEFAULT_SPEC_RESOURCE)
        delta_time_s = entry.get("delta_time_s")
        specs.append(JoinSpec(
            name=entry["name"],
            left=entry["left"],
            right=entry["right"],
            output=entry["output"],
            formula=entry["formula"],
            delta_time_s=None if delta_time_s is None else float(delta_time_s),
            axis_pattern=entry.get("axis", DEFAULT_AXIS_PATTERN),
            max_out_of_orderness_s=float(entry.get("max_out_of_orderness_s", 0.0)),
            idle_release_s=None if entry.get("idle_release_s") is None else float(entry["idle_release_s"]),
            clock_step_ahead_s=float(entry.get("clock_step_ahead_s", DEFAULT_CLOCK_STEP_AHEAD_S)),
            clock_step_back_s=float(entry.get("clock_step_back_s", DEFAULT_CLOCK_STEP_BACK_S)),
            clock_confirm_readings=entry.get("clock_confirm_readings", DEFAULT_CLOCK_CONFIRM_READINGS),
        ))
    return tuple(specs)


def _renamed_keys(entry: dict, path: object) -> dict:
    """`entry` with its former keys under their unit-bearing names, each with a warning: spec files written
    before the rename keep working. A key given under both names is refused: which one was meant is unclear."""
    renamed = dict(entry)
    for former, new in FORMER_KEYS.items():
        if former not in renamed:
            continue
        if new in renamed:
            raise ValueError(f"join spec {entry.get('name', '?')}: {former} and {new} are one setting; keep {new}")
        log.warning("%s: join spec %s: %s is deprecated, write %s (seconds)", path, entry.get("name", "?"), former,
                    new)
        renamed[new] = renamed.pop(former)
    return renamed


class SpecResolver:
    """Resolves quantities to the spec bindings they feed, and output quantities back to their binding.

    :param specs: the join specs; None loads the package's default spec file.
    """

    def __init__(self, specs: Iterable[JoinSpec] | None = None) -> None:
        self.specs: tuple[JoinSpec, ...] = tuple(load_join_specs() if specs is None else specs)
        names = [spec.name for spec in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"join spec names must be unique: {names}")
        self._inputs = [
            (spec.compile(pattern), spec, side)
            for spec in self.specs
            for side, pattern in ((LEFT, spec.left), (RIGHT, spec.right))
        ]
        self._outputs = [(spec.compile(spec.output), spec) for spec in self.specs]
        # A quantity some spec joins: one match per record key, never a route resolved (and cached) for it.
        quantities = "|".join(f"(?:{spec.compile(pattern).pattern.replace('(?P<axis>', '(?:')})"
                              for spec in self.specs for pattern in (spec.left, spec.right))
        self._joinable_quantity = re.compile(f"(?:{quantities})") if quantities else None
        # Bounded, first in first out: a hit costs one dict lookup, as an unbounded cache did.
        self._routes: dict[str, tuple[Route, ...]] = {}
        self._bindings: dict[tuple[JoinSpec, str], SpecBinding] = {}

    def routes(self, quantity: str) -> tuple[Route, ...]:
        """Every (binding, side) a quantity feeds; empty if it matches no spec. Cached per quantity."""
        routes = self._routes.get(quantity)
        if routes is None:
            found = []
            for pattern, spec, side in self._inputs:
                match = pattern.fullmatch(quantity)
                if match is not None:
                    found.append(Route(self._bind(spec, match), side))
            routes = tuple(found)
            _put_bounded(self._routes, quantity, routes)
        return routes

    def joinable_thing(self, key: str) -> str | None:
        """The thing of a record key (`pipeline_core.record_keys`) whose quantity a spec joins; None if no spec
        does, or the text is no record key."""
        parts = split_key(key)
        joinable = self._joinable_quantity
        if parts is None or joinable is None or joinable.fullmatch(parts.quantity) is None:
            return None
        return parts.thing

    def binding_for_output(self, output_quantity: str) -> SpecBinding | None:
        """The binding producing an output quantity (e.g. 'vaPower_C11'), None if no spec does."""
        matches = [
            self._bind(spec, match)
            for pattern, spec in self._outputs
            if (match := pattern.fullmatch(output_quantity)) is not None
        ]
        if len(matches) > 1:
            raise ValueError(f"output quantity '{output_quantity}' is produced by several join specs")
        return matches[0] if matches else None

    def _bind(self, spec: JoinSpec, match: re.Match[str]) -> SpecBinding:
        axis = match.groupdict().get("axis") or ""
        binding = self._bindings.get((spec, axis))
        if binding is None:
            binding = spec.bind(axis)
            _put_bounded(self._bindings, (spec, axis), binding)
        return binding


def _put_bounded(cache: dict, key: object, value: object) -> None:
    """Cache a value, pushing out the oldest entry once the cache holds ROUTE_CACHE_SIZE."""
    if len(cache) >= ROUTE_CACHE_SIZE:
        del cache[next(iter(cache))]
    cache[key] = value
