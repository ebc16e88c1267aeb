"""Synthetic machine states: repeatable for a seed, in the events-file format, physically plausible."""
from __future__ import annotations

import itertools
import math
import subprocess
import sys

from pipeline_core.settings import load_settings
from simulator.replay import selected_rows
from simulator.settings import SimulatorSettings
from simulator.synthetic import RPM_TO_RAD_S, synthetic_rows


def take(n: int, **kwargs) -> list[dict]:
    return list(itertools.islice(synthetic_rows(**kwargs), n))


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    first = take(300, machines=3, axes=2, seed=7)
    assert first == take(300, machines=3, axes=2, seed=7)
    assert first != take(300, machines=3, axes=2, seed=8)


def test_rows_have_the_events_file_format_and_every_machine_is_in_time_order():
    rows = take(500, machines=4, axes=3, seed=1, start_ms=1_000_000, interval_ms=250)
    things = {row["Thing"] for row in rows}
    assert len(things) == 4
    assert len({row["id"] for row in rows}) == len(rows)
    for row in rows:
        quantities = {key for key in row if key not in ("Thing", "Timestamp", "id")}
        assert len(quantities) == 6 * 3 and all(math.isfinite(row[key]) for key in quantities)
    for thing in things:
        times = [row["Timestamp"] for row in rows if row["Thing"] == thing]
        assert times == list(range(1_000_000, 1_000_000 + 250 * len(times), 250))


def test_power_is_speed_times_torque():
    for row in take(200, machines=2, axes=2, seed=3):
        for axis in ("C11", "C12"):
            power = RPM_TO_RAD_S * row[f"actSpeed_{axis}"] * row[f"vaTorque_{axis}"]
            assert math.isclose(row[f"vaPower_{axis}"], power, rel_tol=1e-3, abs_tol=0.05)


def test_the_command_line_writes_the_same_file_twice(tmp_path):
    outputs = []
    for name in ("a.json", "b.json"):
        path = tmp_path / name
        subprocess.run([sys.executable, "-m", "simulator", "--synthetic", "--machines", "2", "--seed", "11",
                        "--limit", "50", "--output", str(path)], check=True, capture_output=True)
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1] and outputs[0].count(b"\n") == 50


def test_ending_now_puts_the_newest_synthetic_row_at_now(monkeypatch):
    """`make data DATA_ARGS=--synthetic` passes --ending-now: rows in the present, inside InfluxDB's retention."""
    monkeypatch.setattr("time.time", lambda: 2_000_000_000.0)
    now_ms = 2_000_000_000_000

    def times(*argv: str) -> list[int]:
        rows, _ = selected_rows(load_settings(SimulatorSettings, ["--synthetic", "--ending-now", "--machines", "3",
                                                                  *argv], environ={}))
        return [row["Timestamp"] for row in itertools.islice(rows, 10)]

    assert max(times("--limit", "10")) == now_ms  # 10 rows of 3 machines: 4 steps of 1 s, the last at now
    assert min(times("--limit", "10")) == now_ms - 3_000
    assert times()[0] == now_ms  # without end: from now on
