"""Synthetic machine states: N machines x axes, seeded and repeatable, in the events-file row format.

Each axis follows a motion program: the commanded speed ramps towards set points that change now
and then, the actual speed lags it, and the drive delivers the torque for friction, process load
and acceleration. Current and load follow torque; power is 2*pi/60 * speed [rpm] * torque [Nm] (W).
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from faker import Faker

from .events import Row

RPM_TO_RAD_S = 2 * math.pi / 60
# Start of the synthetic clock by default: 2019-04-01T00:00:00Z, the day the real sample starts.
DEFAULT_START_MS = 1_554_076_800_000


@dataclass
class Axis:
    """One drive axis: its fixed parameters and its state of motion."""

    name: str
    max_speed_rpm: float
    max_accel_rpm_s: float
    inertia_kg_m2: float
    friction_nm: float
    rated_torque_nm: float
    torque_constant_nm_a: float
    lag_s: float
    set_point_rpm: float = 0.0
    command_rpm: float = 0.0
    speed_rpm: float = 0.0
    process_torque_nm: float = 0.0

    def step(self, rng: random.Random, dt_s: float) -> dict[str, float]:
        if rng.random() < 0.08:  # the program moves on to its next set point
            self.set_point_rpm = 0.0 if rng.random() < 0.25 else rng.uniform(-1, 1) * self.max_speed_rpm
        ramp = self.max_accel_rpm_s * dt_s
        self.command_rpm += max(-ramp, min(ramp, self.set_point_rpm - self.command_rpm))
        previous_rpm = self.speed_rpm
        self.speed_rpm += (self.command_rpm - self.speed_rpm) * (1 - math.exp(-dt_s / self.lag_s))
        self.speed_rpm += rng.gauss(0, 0.002 * self.max_speed_rpm)
        acceleration = (self.speed_rpm - previous_rpm) * RPM_TO_RAD_S / dt_s
        self.process_torque_nm += rng.gauss(0, 0.03 * self.rated_torque_nm) - 0.1 * self.process_torque_nm
        torque = (self.inertia_kg_m2 * acceleration + math.copysign(self.friction_nm, self.speed_rpm)
                  + self.process_torque_nm + rng.gauss(0, 0.005 * self.rated_torque_nm))
        return {
            f"cmdSpeed_{self.name}": round(self.command_rpm, 4),
            f"actSpeed_{self.name}": round(self.speed_rpm, 4),
            f"vaTorque_{self.name}": round(torque, 4),
            f"vaCurr_{self.name}": round(torque / self.torque_constant_nm_a + rng.gauss(0, 0.01), 4),
            f"vaLoad_{self.name}": round(100 * abs(torque) / self.rated_torque_nm, 4),
            f"vaPower_{self.name}": round(RPM_TO_RAD_S * self.speed_rpm * torque, 4),
        }


@dataclass
class Machine:
    thing: str
    axes: list[Axis]


def _machines(fake: Faker, rng: random.Random, machines: int, axes: int) -> list[Machine]:
    result = []
    for _ in range(machines):
        thing = fake.unique.bothify("?####", letters="HRM")
        result.append(Machine(thing, [
            Axis(name=f"C1{index + 1}", max_speed_rpm=rng.uniform(300, 3000), max_accel_rpm_s=rng.uniform(200, 1500),
                 inertia_kg_m2=rng.uniform(0.01, 0.2), friction_nm=rng.uniform(0.2, 1.5),
                 rated_torque_nm=rng.uniform(5, 50), torque_constant_nm_a=rng.uniform(0.8, 3.0),
                 lag_s=rng.uniform(0.1, 0.6))
            for index in range(axes)]))
    return result


def fleet_things(machines: int, axes: int, seed: int) -> list[str]:
    """The names of the machines `synthetic_rows` gives for these arguments, in their order."""
    fake = Faker()
    fake.seed_instance(seed)
    return [machine.thing for machine in _machines(fake, random.Random(seed), machines, axes)]


def synthetic_rows(machines: int, axes: int, seed: int, start_ms: int = DEFAULT_START_MS,
                   interval_ms: int = 1000) -> Iterator[Row]:
    """Rows without end: every `interval_ms` one row per machine, all machines in time order."""
    if machines < 1 or axes < 1 or interval_ms < 1:
        raise ValueError("machines, axes and interval must be positive")
    fake = Faker()
    fake.seed_instance(seed)
    rng = random.Random(seed)
    fleet = _machines(fake, rng, machines, axes)
    dt_s = interval_ms / 1000
    step = 0
    while True:
        timestamp = start_ms + step * interval_ms
        for machine in fleet:
            row: Row = {"Thing": machine.thing, "Timestamp": timestamp}
            for axis in machine.axes:
                row.update(axis.step(rng, dt_s))
            row["id"] = fake.uuid4()
            yield row
        step += 1
