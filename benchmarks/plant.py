"""`python -m benchmarks.plant`: a plant's week in InfluxDB, for the dashboards' benchmark (`benchmarks.dashboards`)
and for looking at the dashboards at plant size.

What it writes into a database with the pipeline's retention policies, as the pipeline would have:

* the history of the last `--days` (7) as InfluxDB's continuous queries keep it: hourly and 10-minute points of every
  machine, axis and quantity, and 1-minute points of the last `--minute-history-h` (24) hours; each point's mean,
  min, max, sum and count those of `--rows-per-s` rows a second per machine;
* the raw records and join results of the last `--raw-minutes` (10), `--rows-per-s` rows a second per machine, in
  the DB connector's own point format (`db_connector.points`) and through its writer (`db_connector.writer`);
* the clock counters of `--clock-faulty-machines` (25) machines over the last `--clock-hours` (24), as a joiner
  reports them (`machine_health`, one point per machine every 10 s, each counter since the joiner's start), and
  their 10-minute history.

The machines are the simulator's synthetic fleet (`simulator.synthetic.fleet_things`, same seed), so a simulator run
with the same `--machines`, `--axes` and `--seed` streams the same plant on. Every machine has a power level of its
own (the ranking of the dashboards' Top machines is stable) and a daily cycle; the axes' speed and torque make that
power. A plant of 500 machines with 2 axes and the defaults is about 30 million points: a few minutes of writing.
"""
from __future__ import annotations

import logging
import math
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from db_connector.points import PowerLevels, data_point, joined_point
from db_connector.writer import InfluxWriter
from pipeline_core.health_metrics import MACHINE_MEASUREMENT, health_line
from pipeline_core.influx import escape_tag, influx_client, stored_name
from pipeline_core.influx_retention import (DATA_MEASUREMENT, HEALTH_POLICY, HISTORY_POLICY, JOINED_MEASUREMENT,
                                            JOINED_POLICY, MACHINE_HEALTH_TIER, RAW_POLICY, THING_ROLLUP_SUFFIX,
                                            ensure_retention, machine_health_query, retention_settings)
from pipeline_core.logs import configure_logging
from pipeline_core.settings import InfluxSettings, load_settings, setting
from simulator.synthetic import fleet_things

log = logging.getLogger("benchmarks.plant")

QUANTITIES = ("cmdSpeed", "actSpeed", "vaTorque", "vaCurr", "vaLoad", "vaPower")  # per axis, as the simulator's
LEVELS = PowerLevels.parse("100,1000,5000")  # the DB connector's default --level-thresholds
CASES = ("left_successor", "right_successor", "left_predecessor", "right_predecessor")
DAY_S = 86_400
DUTY_CYCLE_S = 600  # the 10 minutes an S3 duty rating refers to
IDLE_W = 20.0
TIERS_S = {"1m": 60, "10m": 600, "1h": 3600}
BATCH_LINES = 10_000
WRITERS = 3  # requests in flight: InfluxDB parses one while the next is built
HEALTH_INTERVAL_S = 10  # how often a joiner reports its machines' clock counters
CLOCK_FIELDS = ("clock_outliers", "clock_steps_back", "clock_jumps_ahead")  # as the joiners write them
# The first faulty machine's clock faults per hour, on average (the n-th's n times as many), by CLOCK_FIELDS.
CLOCK_FAULTS_PER_H = (2.0, 0.2, 0.5)


@dataclass(frozen=True)
class PlantSettings(InfluxSettings):
    """A plant's week in InfluxDB: its history as the continuous queries keep it, and its last minutes raw."""

    machines: int = setting(500, "PLANT_MACHINES", "machines", minimum=1)
    axes: int = setting(2, "PLANT_AXES", "drive axes per machine", minimum=1)
    days: float = setting(7.0, "PLANT_DAYS", "days of history (10-minute and hourly points)", minimum=0)
    minute_history_h: float = setting(24.0, "PLANT_MINUTE_HISTORY_H", "hours of 1-minute history", minimum=0)
    raw_minutes: float = setting(10.0, "PLANT_RAW_MINUTES", "minutes of raw records and join results", minimum=0)
    rows_per_s: float = setting(2.0, "PLANT_ROWS_PER_S", "rows a second per machine", minimum=0.001)
    seed: int = setting(42, "PLANT_SEED", "the fleet's seed (the simulator's --seed)")
    clock_faulty_machines: int = setting(25, "PLANT_CLOCK_FAULTY_MACHINES", "machines whose clocks the joiner catches",
                                         minimum=0)
    clock_hours: float = setting(24.0, "PLANT_CLOCK_HOURS", "hours of the joiner's clock counters", minimum=0)
    progress: bool = setting(True, "PLANT_PROGRESS", "show a progress bar")


@dataclass(frozen=True)
class Axis:
    thing: str
    name: str
    power_w: float  # its power while it works, on a day's average
    speed_rpm: float  # its typical speed
    duty: float  # the share of each duty cycle it works (its ED)
    phase: float  # where its daily cycle starts


def plant_axes(settings: PlantSettings) -> list[Axis]:
    """Every axis of the fleet with its fixed character: a power level per machine spread over two decades (a few
    heavy machines, many light ones) and a duty of its own."""
    rng = random.Random(settings.seed)
    axes = []
    for thing in fleet_things(settings.machines, settings.axes, settings.seed):
        machine_power_w = 10 ** rng.uniform(2.3, 3.9)  # 200 W to 8 kW
        duty = rng.uniform(0.15, 0.8)
        phase = rng.uniform(0, 2 * math.pi)
        for index in range(settings.axes):
            axes.append(Axis(thing, f"C1{index + 1}", machine_power_w * rng.uniform(0.6, 1.4),
                             rng.uniform(300, 3000), min(0.95, duty * rng.uniform(0.8, 1.2)), phase))
    return axes


def _worked(duty: np.ndarray, offset_s: np.ndarray, times_s: np.ndarray) -> np.ndarray:
    """Seconds worked from 0 to each time: every DUTY_CYCLE_S the axis works its duty's share, then idles."""
    shifted = times_s[None, :] + offset_s
    return (np.floor(shifted / DUTY_CYCLE_S) * duty * DUTY_CYCLE_S
            + np.minimum(np.mod(shifted, DUTY_CYCLE_S), duty * DUTY_CYCLE_S))


def _levels(axes: list[Axis], times_s: np.ndarray, step_s: float) -> dict[str, np.ndarray]:
    """Quantity -> (axis, time) array of its mean over [time, time + step_s), and "active": the share of that
    interval the axis worked. Working, power follows the axis's daily cycle; idle, it draws IDLE_W. Speed follows a
    slower cycle, torque and the rest what they make together with power (P = 2π/60 · n · M)."""
    power = np.array([axis.power_w for axis in axes])[:, None]
    speed = np.array([axis.speed_rpm for axis in axes])[:, None]
    phase = np.array([axis.phase for axis in axes])[:, None]
    duty = np.array([axis.duty for axis in axes])[:, None]
    offset_s = phase / (2 * math.pi) * DUTY_CYCLE_S
    active = (_worked(duty, offset_s, times_s + step_s) - _worked(duty, offset_s, times_s)) / step_s
    day = 2 * math.pi * (times_s[None, :] + step_s / 2) / DAY_S
    power_w = active * power * (1 + 0.6 * np.sin(day + phase)) + (1 - active) * IDLE_W
    speed_rpm = speed * (1 + 0.2 * np.sin(3 * day + phase))
    torque_nm = power_w / (2 * math.pi / 60 * speed_rpm)
    return {"cmdSpeed": speed_rpm * 1.01, "actSpeed": speed_rpm, "vaTorque": torque_nm, "vaCurr": torque_nm / 1.5,
            "vaLoad": 100 * torque_nm / (power * 1.6 / (2 * math.pi / 60 * speed)), "vaPower": power_w,
            "active": active}


def history_lines(settings: PlantSettings, axes: list[Axis], tier: str, start_s: int, end_s: int
                  ) -> Iterator[tuple[list[str], str]]:
    """The tier's points of [start_s, end_s) as the continuous queries write them, in batches (lines, policy)."""
    step_s = TIERS_S[tier]
    samples = max(1, round(settings.rows_per_s * step_s))
    axes_per_thing: dict[str, int] = {}
    for axis in axes:
        axes_per_thing[axis.thing] = axes_per_thing.get(axis.thing, 0) + 1
    for chunk_start in range(start_s // step_s * step_s, end_s, step_s * 64):
        times_s = np.arange(chunk_start, min(end_s, chunk_start + step_s * 64), step_s)
        means = _levels(axes, times_s, step_s)
        working = means["active"] > 0
        lines: list[str] = []
        for measurement, quantities in ((f"{DATA_MEASUREMENT}_{tier}", QUANTITIES),
                                        (f"{JOINED_MEASUREMENT}_{tier}", ("vaPower",))):
            for quantity in quantities:
                values = means[quantity]
                # Within an interval that mixes work and idling the samples reach from idle to beyond the mean.
                lowest = np.where(means["active"] < 1, np.minimum(values, IDLE_W), values * 0.85)
                highest = np.where(working, np.maximum(values, values / np.maximum(means["active"], 1e-9)) * 1.15,
                                   values * 1.05) if quantity == "vaPower" else values * 1.15
                for row, axis in enumerate(axes):
                    series = (f"{measurement},quantity={escape_tag(f'{quantity}_{axis.name}')},"
                              f"thing={escape_tag(axis.thing)}")
                    for time_s, mean, low, high in zip(times_s.tolist(), values[row].tolist(), lowest[row].tolist(),
                                                       highest[row].tolist()):
                        lines.append(f"{series} mean={mean!r},min={low!r},max={high!r},"
                                     f"sum={mean * samples!r},count={samples}i {time_s * 10**9}")
                    if len(lines) >= BATCH_LINES:
                        yield lines, HISTORY_POLICY
                        lines = []
        # The records per machine: every quantity of every axis of it.
        for thing, axes_of_thing in axes_per_thing.items():
            series = f"{DATA_MEASUREMENT}{THING_ROLLUP_SUFFIX}_{tier},thing={escape_tag(thing)}"
            count = samples * len(QUANTITIES) * axes_of_thing
            lines.extend(f"{series} count={count}i {time_s * 10**9}" for time_s in times_s.tolist())
        if lines:
            yield lines, HISTORY_POLICY


def raw_lines(settings: PlantSettings, axes: list[Axis], start_ms: int, end_ms: int
              ) -> Iterator[tuple[list[str], str]]:
    """The raw records and join results of [start_ms, end_ms), as the DB connector writes them."""
    step_ms = max(1, round(1000 / settings.rows_per_s))
    rng = np.random.default_rng(settings.seed)
    for chunk_start in range(start_ms, end_ms, step_ms * 20):
        times_ms = np.arange(chunk_start, min(end_ms, chunk_start + step_ms * 20), step_ms)
        means = _levels(axes, times_ms / 1000, step_ms / 1000)
        data: list[str] = []
        joined: list[str] = []
        for quantity in QUANTITIES:
            values = means[quantity] * (1 + 0.05 * rng.standard_normal(means[quantity].shape))
            for row, axis in enumerate(axes):
                name = f"{quantity}_{axis.name}"
                for time_ms, value in zip(times_ms.tolist(), values[row].tolist()):
                    record = {"thing": axis.thing, "quantity": name, "phenomenonTime": time_ms, "result": value}
                    data.append(data_point(DATA_MEASUREMENT, record))  # type: ignore[arg-type]
                    if quantity == "vaPower":  # the join of speed and torque, as the joiner emits it
                        joined.append(joined_point(JOINED_MEASUREMENT, {  # type: ignore[arg-type]
                            **record, "left": {"phenomenonTime": time_ms}, "right": {"phenomenonTime": time_ms - 1},
                            "phenomenonTime": time_ms - 0.5, "case": CASES[time_ms // step_ms % len(CASES)]},
                            LEVELS))
        for start in range(0, len(data), BATCH_LINES):
            yield data[start:start + BATCH_LINES], RAW_POLICY
        for start in range(0, len(joined), BATCH_LINES):
            yield joined[start:start + BATCH_LINES], JOINED_POLICY


def clock_lines(settings: PlantSettings, axes: list[Axis], start_s: int, end_s: int
                ) -> Iterator[tuple[list[str], str]]:
    """The clock counters of the faulty machines (spread over the plant) as one joiner process reports them since
    `start_s`: each counter grows by chance at its `CLOCK_FAULTS_PER_H`, a machine's own multiple of it."""
    things = list(dict.fromkeys(axis.thing for axis in axes))
    faulty = things[::max(1, len(things) // max(settings.clock_faulty_machines, 1))][:settings.clock_faulty_machines]
    randoms = random.Random(settings.seed)
    chances = [[rate * (index + 1) * HEALTH_INTERVAL_S / 3600 for rate in CLOCK_FAULTS_PER_H]
               for index in range(len(faulty))]
    counts = [[0] * len(CLOCK_FAULTS_PER_H) for _ in faulty]
    lines: list[str] = []
    for at_s in range(start_s - start_s % HEALTH_INTERVAL_S + HEALTH_INTERVAL_S, end_s + 1, HEALTH_INTERVAL_S):
        for index, thing in enumerate(faulty):
            counts[index] = [count + (randoms.random() < chance) for count, chance in zip(counts[index], chances[index])]
            line = health_line({"stage": "kafka_joiner", "instance": "plant", "thing": stored_name(thing)},
                               dict(zip(CLOCK_FIELDS, counts[index])), at_s * 10**9, MACHINE_MEASUREMENT)
            assert line is not None  # every field an int
            lines.append(line)
            if len(lines) >= BATCH_LINES:
                yield lines, HEALTH_POLICY
                lines = []
    if lines:
        yield lines, HEALTH_POLICY


def expected_points(settings: PlantSettings, axes_count: int) -> int:
    per_axis = len(QUANTITIES) + 1
    history = sum(int(settings.days * DAY_S) // TIERS_S[tier] for tier in ("10m", "1h"))
    history += int(settings.minute_history_h * 3600) // TIERS_S["1m"]
    raw = int(settings.raw_minutes * 60 * settings.rows_per_s)
    faulty = min(settings.clock_faulty_machines, settings.machines)
    clock = faulty * int(settings.clock_hours * 3600) // HEALTH_INTERVAL_S
    things = math.ceil(axes_count / max(settings.axes, 1))
    clock_history = faulty * int(settings.clock_hours * 3600) // TIERS_S["10m"]
    return axes_count * per_axis * (history + raw) + things * history + clock + clock_history


def fill(settings: PlantSettings, now_ms: int | None = None,
         progress: Callable[[int], None] | None = None) -> int:
    """Write the plant into `settings`' database (created with the pipeline's retention policies where missing),
    ending at `now_ms`; returns the points written. InfluxDB refusing a point (beyond its policy) stops the fill."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    client = influx_client(settings, timeout_s=120)
    retention = retention_settings(settings)
    ensure_retention(client, settings.influxdb_database, retention)
    axes = plant_axes(settings)
    now_s = now_ms // 1000
    raw_start_ms = now_ms - int(settings.raw_minutes * 60_000)
    batches: queue.Queue[tuple[list[str], str] | None] = queue.Queue(maxsize=2 * WRITERS)
    failures: list[BaseException] = []
    written = [0]
    lock = threading.Lock()

    def writer() -> None:
        sink = InfluxWriter(influx_client(settings, timeout_s=120), settings.influxdb_database, retention)
        while (batch := batches.get()) is not None:
            if failures:
                continue  # drain: the producer stops at the next batch
            lines, policy = batch
            try:
                refused = sink.write(lines, policy)
                if refused:
                    raise RuntimeError(f"InfluxDB refused {len(refused)} points: {refused[0].reason}")
            except BaseException as error:  # noqa: BLE001 - handed to the producer, which raises it
                failures.append(error)
                continue
            with lock:
                written[0] += len(lines)
            if progress:
                progress(len(lines))

    threads = [threading.Thread(target=writer, name=f"plant-writer-{index}", daemon=True) for index in range(WRITERS)]
    for thread in threads:
        thread.start()
    try:
        sources = [history_lines(settings, axes, "1h", now_s - int(settings.days * DAY_S), now_s),
                   history_lines(settings, axes, "10m", now_s - int(settings.days * DAY_S), now_s),
                   history_lines(settings, axes, "1m", now_s - int(settings.minute_history_h * 3600), now_s),
                   raw_lines(settings, axes, raw_start_ms, now_ms),
                   clock_lines(settings, axes, now_s - int(settings.clock_hours * 3600), now_s)]
        for source in sources:
            for batch in source:
                if failures:
                    raise failures[0]
                batches.put(batch)
    finally:
        for _ in threads:
            batches.put(None)
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    # The clock counters' 10-minute history, as its continuous query would have kept it.
    tier_ns = TIERS_S[MACHINE_HEALTH_TIER] * 10**9
    clock_start_ns = (now_s - int(settings.clock_hours * 3600)) * 10**9 // tier_ns * tier_ns
    query = machine_health_query(settings.influxdb_database, f"time >= {clock_start_ns} AND time <= {now_ms}ms")
    written[0] += sum(int(point["written"]) for point in client.query(query, method="POST").get_points())
    return written[0]


def main(argv: list[str] | None = None) -> int:
    configure_logging("WARNING")
    settings = load_settings(PlantSettings, argv, prog="python -m benchmarks.plant")
    total = expected_points(settings, settings.machines * settings.axes)
    began = time.monotonic()
    with tqdm(total=total, unit=" points", unit_scale=True, disable=not settings.progress, file=sys.stderr) as bar:
        written = fill(settings, progress=bar.update)
    took = time.monotonic() - began
    print(f"plant: {settings.machines} machines x {settings.axes} axes, {written:,} points into "
          f"{settings.influxdb_database} in {took:.0f} s ({written / max(took, 1e-9):,.0f} points/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
