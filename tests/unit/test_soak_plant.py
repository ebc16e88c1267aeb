"""The soak's plant (ops/soak): readings that are pure functions of machine, axis, quantity and time, so that the
soak's check computes what any record must hold; rows in the shipped real rows' mix; names as plants write them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_core.validation import name_problem
from soak.names import plant_names
from soak.plant import KINDS, REAL_MIX, RPM_TO_RAD_S, Plant, real_mix, uniform, values_agree

DAY_MS = 86_400_000
START_MS = 1_796_000_000_000


def test_the_mix_is_the_real_rows_share_of_each_kind() -> None:
    counted = real_mix()
    assert list(REAL_MIX) == [kind for kind in counted if kind in REAL_MIX]
    assert REAL_MIX["vaTorque"] == counted["vaTorque"] > REAL_MIX["actSpeed"] > 0.4  # most rows a torque, half a speed
    assert set(KINDS) == set(REAL_MIX)


def test_draws_are_the_same_in_any_shape_and_differ_by_purpose_and_key() -> None:
    grid = uniform(7, 1, np.arange(4)[:, None], np.arange(3)[None, :])
    assert grid.shape == (4, 3)
    assert all(uniform(7, 1, i, j) == grid[i, j] for i in range(4) for j in range(3))
    assert uniform(7, 2, 1, 1) != grid[1, 1] and uniform(8, 1, 1, 1) != grid[1, 1]
    values = uniform(1, 1, np.arange(100_000))
    assert 0 <= values.min() and values.max() < 1 and abs(values.mean() - 0.5) < 0.01


@given(machine=st.integers(0, 19), quantity=st.integers(0, 3 * len(KINDS) - 1),
       offsets_ms=st.lists(st.integers(0, 7 * DAY_MS), min_size=1, max_size=30))
def test_a_reading_is_the_same_computed_alone_or_with_others(machine: int, quantity: int,
                                                               offsets_ms: list[int]) -> None:
    plant = Plant(20, 3, seed=11)
    times = START_MS + np.array(offsets_ms)
    together = plant.value(machine, quantity, times)
    alone = np.array([float(plant.value(machine, quantity, int(t))) for t in times])
    assert values_agree(together, alone).all()
    rounds = np.stack([plant.round_values(int(t))[machine, quantity] for t in times])
    assert values_agree(rounds, together).all()


def test_the_physics_holds_together() -> None:
    plant = Plant(30, 2, seed=3)
    times = START_MS + np.arange(0, DAY_MS, 37_000)
    readings = plant.readings(np.arange(30)[:, None], 1, times[None, :])
    assert np.allclose(readings["vaPower"], RPM_TO_RAD_S * readings["actSpeed"] * readings["vaTorque"])
    assert np.allclose(readings["vaLoad"], 100 * np.abs(readings["vaTorque"]) / plant.parameters.rated_torque_nm[:, 1:2])
    assert (np.abs(readings["actSpeed"]) <= plant.parameters.max_speed_rpm[:, 1:2] + 1e-9).all()
    assert readings["actSpeed"].std() > 100  # the program moves the axes
    assert (readings["cmdSpeed"] == 0).mean() > 0.1  # and stops them now and then


def test_rows_carry_quantities_at_the_real_share_and_probes_carry_all() -> None:
    plant = Plant(200, 3, seed=5, probes=4)
    present = plant.presence(np.arange(200)[:, None], np.arange(300)[None, :])  # (machines, rounds, quantities)
    others = np.ones(200, dtype=bool)
    others[list(plant.probe_machines)] = False
    shares = present[others].mean(axis=(0, 1)).reshape(3, len(KINDS))
    assert np.allclose(shares, np.array(list(REAL_MIX.values())), atol=0.02)
    assert present[list(plant.probe_machines)].all()
    assert present.any(axis=-1).all()  # no row without a quantity
    assert (plant.presence(7, 12) == present[7, 12]).all()


def test_plant_names_are_distinct_names_of_one_plant() -> None:
    names = plant_names(500, "ab12", seed=1, separator=".")
    assert len(set(names)) == 500
    assert all(name.startswith("Werk Süd ab12.Halle ") and name.count(".") == 2 for name in names)
    assert any(not name.isascii() for name in names)
    assert plant_names(500, "ab12", seed=1, separator=".") == names
    assert all(name_problem(name) is None for name in plant_names(50, "ab12", seed=1, separator=" - "))


def test_a_plant_needs_machines_and_axes() -> None:
    with pytest.raises(ValueError):
        Plant(0, 1, seed=1)
    with pytest.raises(ValueError):
        Plant(3, 1, seed=1, probes=4)
