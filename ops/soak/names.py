"""The soak plant's machine names, as plants write them: a path of site, hall and machine, with spaces and
non-ASCII letters (`Werk Süd 3f9a.Halle 2.Fräse 17`).

Each run's names carry a tag of their own (the run's id): the soak publishes a week of its machines' past, which
must not land behind readings an earlier run left of machines of the same name. A path is joined with dots where
the pipeline takes a dot in a thing's name (`pipeline_core.validation`), else with " - ".
"""
from __future__ import annotations

import random

from pipeline_core import validation

SITE = "Werk Süd"
# Machine kinds of a metalworking plant, some of them with letters beyond ASCII.
KINDS = ("Presse", "Fräse", "Drehmaschine", "Schweißroboter", "Stanze", "Säge", "Biegemaschine", "Schleifmaschine")
MACHINES_PER_HALL = 60


def dots_flow() -> bool:
    """Whether the pipeline takes a dot inside a thing's name (it once ended the thing in the record key)."""
    problem = getattr(validation, "thing_problem", validation.name_problem)
    return problem("Halle 1.Presse 1") is None


def plant_names(machines: int, run_tag: str, seed: int, separator: str | None = None) -> list[str]:
    """`machines` distinct names of one plant: hall by hall, each machine a kind and a number in its hall."""
    separator = separator if separator is not None else ("." if dots_flow() else " - ")
    rng = random.Random(seed)
    names, numbers = [], {}
    for index in range(machines):
        hall = index // MACHINES_PER_HALL + 1
        kind = rng.choice(KINDS)
        numbers[(hall, kind)] = numbers.get((hall, kind), 0) + 1
        names.append(separator.join((f"{SITE} {run_tag}", f"Halle {hall}", f"{kind} {numbers[(hall, kind)]}")))
    return names
