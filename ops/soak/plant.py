"""The soak's plant: machines x axes whose every reading is a pure function of (machine, axis, quantity, time).

A row of machine `m` at round `k` (one row per machine per round, all at the round's time) carries a quantity only
when its presence draw says so, at the shares the shipped real rows carry them (`REAL_MIX`, counted from
01_simulator/data/test_events.json): most rows hold a torque,
about half a speed, so the join pairs readings of one row (same time) and of neighbouring rows alike. Because
nothing depends on what came before, the soak's check can compute what any record must hold long after it was
published, for millions of records at once (numpy), without replaying a generator.

The drive physics, per axis: a motion program of set points held for a segment each (some at standstill); the actual
speed approaches the new set point exponentially; torque is inertia x acceleration + friction + a slowly varying
process load + a little noise; current and load follow torque, power is 2π/60 · speed · torque (W). Noise and the
program's draws come from a counter-based hash (splitmix64) of the seed and the reading's coordinates.

Values are floats as computed (JSON carries them exactly); the check compares them within `VALUE_TOLERANCE`,
as numpy's vectorised exp and sin may differ from their scalar paths in the last bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import orjson

from simulator.settings import DEFAULT_EVENTS_FILE


def real_mix(events_file: Path = DEFAULT_EVENTS_FILE) -> dict[str, float]:
    """The share of rows carrying each quantity kind ("<kind>_C1<axis>") in the shipped real rows, most common
    first."""
    rows = [orjson.loads(line) for line in events_file.read_bytes().splitlines() if line.strip()]
    counts: dict[str, int] = {}
    for row in rows:
        for kind in {name.rsplit("_", 1)[0] for name in row if "_" in name}:
            counts[kind] = counts.get(kind, 0) + 1
    return {kind: count / len(rows) for kind, count in sorted(counts.items(), key=lambda item: -item[1])}


# The kinds `Plant.readings` computes; each row carries each at the real mix's share.
MODELLED = ("vaTorque", "vaCurr", "vaLoad", "actSpeed", "vaPower", "cmdSpeed", "turnState", "aaAcc")
REAL_MIX = {kind: share for kind, share in real_mix().items() if kind in MODELLED}
KINDS = tuple(REAL_MIX)
JOIN_LEFT, JOIN_RIGHT = "actSpeed", "vaTorque"  # the shipped join spec pairs these per axis
RPM_TO_RAD_S = 2 * math.pi / 60
VALUE_TOLERANCE = 1e-9  # relative, and absolute near zero

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_U53 = 1.0 / (1 << 53)
# Which draw a hash is for: each its own stream.
_PRESENCE, _SET_POINT, _STANDSTILL, _NOISE_TORQUE, _NOISE_CURRENT = 1, 2, 3, 4, 5


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def uniform(seed: int, purpose: int, *keys: np.ndarray | int) -> np.ndarray:
    """A uniform draw in [0, 1) per element of the broadcast `keys`: the same keys, the same draw, in any shape."""
    with np.errstate(over="ignore"):
        state = np.asarray(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ np.uint64(purpose), dtype=np.uint64)
        for key in keys:
            state = _splitmix(state + _GOLDEN + np.asarray(key, dtype=np.int64).astype(np.uint64))
        return (state >> np.uint64(11)).astype(np.float64) * _U53


@dataclass(frozen=True)
class AxisParameters:
    """Each axis's fixed character, arrays of shape (machines, axes)."""

    max_speed_rpm: np.ndarray
    lag_s: np.ndarray
    segment_s: np.ndarray
    inertia_kg_m2: np.ndarray
    friction_nm: np.ndarray
    rated_torque_nm: np.ndarray
    torque_constant_nm_a: np.ndarray
    process_nm: np.ndarray
    process_period_s: np.ndarray
    phase: np.ndarray


class Plant:
    """`machines` machines of `axes` axes each; `probes` of them (spread over the fleet) carry every quantity in
    every row, so the soak can time each of their rows to its joined point."""

    def __init__(self, machines: int, axes: int, seed: int, probes: int = 0) -> None:
        if machines < 1 or axes < 1 or not 0 <= probes <= machines:
            raise ValueError("need machines >= 1, axes >= 1 and 0 <= probes <= machines")
        self.machines, self.axes, self.seed = machines, axes, seed
        rng = np.random.default_rng(seed)
        shape = (machines, axes)
        self.parameters = AxisParameters(
            max_speed_rpm=rng.uniform(300, 3000, shape), lag_s=rng.uniform(0.5, 4.0, shape),
            segment_s=rng.uniform(20, 600, shape), inertia_kg_m2=rng.uniform(0.01, 0.2, shape),
            friction_nm=rng.uniform(0.2, 1.5, shape), rated_torque_nm=rng.uniform(5, 50, shape),
            torque_constant_nm_a=rng.uniform(0.8, 3.0, shape), process_nm=rng.uniform(0.5, 8.0, shape),
            process_period_s=rng.uniform(60, 3600, shape), phase=rng.uniform(0, 2 * math.pi, shape))
        self.probe_machines = tuple(int(i) for i in np.linspace(0, machines - 1, probes).round()) if probes else ()

    @cached_property
    def quantities(self) -> tuple[str, ...]:
        """Every quantity a row may carry, axis by axis: index q = axis * len(KINDS) + kind."""
        return tuple(f"{kind}_C1{axis + 1}" for axis in range(self.axes) for kind in KINDS)

    def quantity_index(self, quantity: str) -> int | None:
        return self._quantity_indexes.get(quantity)

    @cached_property
    def _quantity_indexes(self) -> dict[str, int]:
        return {quantity: index for index, quantity in enumerate(self.quantities)}

    @cached_property
    def _probe_mask(self) -> np.ndarray:
        mask = np.zeros(self.machines, dtype=bool)
        mask[list(self.probe_machines)] = True
        return mask

    def presence(self, machine: np.ndarray | int, round_: np.ndarray | int) -> np.ndarray:
        """Which quantities the rows of `machine` at `round_` carry: shape (*broadcast, quantities). A probe
        machine carries all; every row carries at least its first axis's torque."""
        machine, round_ = np.broadcast_arrays(np.asarray(machine), np.asarray(round_))
        shares = np.tile(np.array(list(REAL_MIX.values())), self.axes)
        quantity = np.arange(len(self.quantities))
        drawn = uniform(self.seed, _PRESENCE, machine[..., None], round_[..., None], quantity) < shares
        drawn |= self._probe_mask[machine][..., None]
        drawn[..., KINDS.index("vaTorque")] |= ~drawn.any(axis=-1)
        return drawn

    def readings(self, machine: np.ndarray | int, axis: np.ndarray | int, time_ms: np.ndarray | int
                 ) -> dict[str, np.ndarray]:
        """Every kind's value of `axis` of `machine` at `time_ms` (broadcast arrays; time is the true time of the
        round, whatever a machine's clock stamps on it)."""
        machine, axis, time_ms = np.broadcast_arrays(np.asarray(machine), np.asarray(axis), np.asarray(time_ms))
        p = self.parameters
        t_s = time_ms.astype(np.float64) / 1000.0
        segment_s = p.segment_s[machine, axis]
        # Each axis's program is shifted by its phase, so the machines do not change set points together.
        shifted_s = t_s + p.phase[machine, axis] * segment_s
        segment = np.floor(shifted_s / segment_s).astype(np.int64)
        into_s = shifted_s - segment * segment_s
        set_point = self._set_point(machine, axis, segment)
        before = self._set_point(machine, axis, segment - 1)
        decay = np.exp(-into_s / p.lag_s[machine, axis])
        speed = set_point + (before - set_point) * decay
        acceleration = (set_point - before) / p.lag_s[machine, axis] * decay  # rpm/s
        process = p.process_nm[machine, axis] * np.sin(2 * math.pi * t_s / p.process_period_s[machine, axis]
                                                        + p.phase[machine, axis])
        rated = p.rated_torque_nm[machine, axis]
        millis = time_ms.astype(np.int64)
        noise = uniform(self.seed, _NOISE_TORQUE, machine, axis, millis) - 0.5
        torque = (p.inertia_kg_m2[machine, axis] * acceleration * RPM_TO_RAD_S
                  + np.sign(speed) * p.friction_nm[machine, axis] + process + 0.01 * rated * noise)
        current = (torque / p.torque_constant_nm_a[machine, axis]
                   + 0.02 * (uniform(self.seed, _NOISE_CURRENT, machine, axis, millis) - 0.5))
        return {"vaTorque": torque, "vaCurr": current, "vaLoad": 100 * np.abs(torque) / rated, "actSpeed": speed,
                "vaPower": RPM_TO_RAD_S * speed * torque, "cmdSpeed": set_point,
                "turnState": np.sign(np.round(speed)), "aaAcc": acceleration}

    def _set_point(self, machine: np.ndarray, axis: np.ndarray, segment: np.ndarray) -> np.ndarray:
        standstill = uniform(self.seed, _STANDSTILL, machine, axis, segment) < 0.25
        drawn = (2 * uniform(self.seed, _SET_POINT, machine, axis, segment) - 1) * self.parameters.max_speed_rpm[
            machine, axis]
        return np.where(standstill, 0.0, drawn)

    def value(self, machine: np.ndarray | int, quantity: int, time_ms: np.ndarray | int) -> np.ndarray:
        """The value of quantity index `quantity` (see `quantities`) of `machine` at `time_ms`."""
        axis, kind = divmod(quantity, len(KINDS))
        return self.readings(machine, axis, time_ms)[KINDS[kind]]

    def round_values(self, time_ms: int) -> np.ndarray:
        """Every machine's every quantity at one round's time: shape (machines, quantities)."""
        machine = np.arange(self.machines)[:, None]
        axis = np.arange(self.axes)[None, :]
        readings = self.readings(machine, axis, np.full((self.machines, self.axes), time_ms, dtype=np.int64))
        return np.stack([readings[kind] for kind in KINDS], axis=-1).reshape(self.machines, -1)


def values_agree(found: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Element-wise: `found` is `expected` within `VALUE_TOLERANCE` (relative, absolute near zero)."""
    return np.abs(found - expected) <= VALUE_TOLERANCE * np.maximum(1.0, np.abs(expected))
