"""What a peer's subprocess and the bench share: the run's settings in a JSON file, and the peer's progress in a
status file. Standard library only: it runs in each peer's own virtualenv, which holds none of this project.

A peer's script is started as ``<venv>/bin/python -m benchmarks.peers.<script> <settings.json>``; it reads the
input topic, writes output records of the engine's shape (thing, quantity, phenomenonTime, result, left,
right) to the output topic, and rewrites its status file (atomically) as it goes.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The engine's named formulas (local_stream_buffer.formulas), the same float operations in the same order.
POWER_FACTOR = 2 * math.pi / 60
FORMULAS: dict[str, Callable[[float, float], float]] = {
    "power": lambda speed, torque: POWER_FACTOR * speed * torque,
    "product": lambda left, right: left * right,
    "difference": lambda left, right: left - right,
    "ratio": lambda left, right: left / right if right else math.nan,
}


def load_settings(argv: list[str] | None = None) -> dict[str, Any]:
    """The settings file named on the command line."""
    return json.loads(Path((argv or sys.argv)[1]).read_text())


class PeerSpec:
    """One join spec as the bench passes it: a regular expression per side (the axis its group 1, valid in
    Python and Java alike), the output quantity around the axis, the formula, delta_time in ms or None."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.name: str = entry["name"]
        self.left_regex: str = entry["left_regex"]
        self.right_regex: str = entry["right_regex"]
        self.output_prefix: str = entry["output_prefix"]
        self.output_suffix: str = entry["output_suffix"]
        self.formula: str = entry["formula"]
        self.delta_ms: float | None = entry["delta_ms"]
        self.combine = FORMULAS[self.formula]
        self._compiled = (re.compile(self.left_regex), re.compile(self.right_regex))

    def axis(self, side: int, quantity: str) -> str | None:
        """The axis of a quantity of the spec's left (0) or right (1) side; None if it is no such quantity."""
        match = self._compiled[side].fullmatch(quantity)
        return None if match is None else match.group(1)

    def output_quantity(self, axis: str) -> str:
        return f"{self.output_prefix}{axis}{self.output_suffix}"

    def within_delta(self, left_ms: float, right_ms: float) -> bool:
        return self.delta_ms is None or abs(left_ms - right_ms) <= self.delta_ms

    def output_record(self, thing: str, axis: str, left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
        """An output record of the engine's shape (no ``case``, no ``id``: a peer's join has neither)."""
        return {"thing": thing, "quantity": self.output_quantity(axis),
                "phenomenonTime": (left["phenomenonTime"] + right["phenomenonTime"]) / 2,
                "result": self.combine(left["result"], right["result"]),
                "left": {key: left[key] for key in ("quantity", "phenomenonTime", "result")},
                "right": {key: right[key] for key in ("quantity", "phenomenonTime", "result")}}


def specs(settings: dict[str, Any]) -> list[PeerSpec]:
    return [PeerSpec(entry) for entry in settings["specs"]]


class Status:
    """The peer's progress, rewritten to ``path`` by a thread every ``interval_s`` and on ``set``: counting
    costs a peer's per-record callback no file write."""

    def __init__(self, path: str | Path, interval_s: float = 0.1) -> None:
        self.path = Path(path)
        self.values: dict[str, Any] = {"inputs": 0, "joinable": 0, "first_input_at": None, "finished": False}
        self._lock = threading.Lock()
        self.flush()
        threading.Thread(target=self._flush_every, args=(interval_s,), name="status", daemon=True).start()

    def count(self, key: str, increment: int = 1) -> None:
        if key == "inputs" and self.values["first_input_at"] is None:
            self.values["first_input_at"] = time.time()
        self.values[key] += increment

    def set(self, **values: Any) -> None:
        self.values.update(values)
        self.flush()

    def flush(self) -> None:
        with self._lock:
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(self.values))
            os.replace(temporary, self.path)

    def _flush_every(self, interval_s: float) -> None:
        while True:
            time.sleep(interval_s)
            self.flush()


def read_status(path: str | Path) -> dict[str, Any]:
    """The last status a peer wrote; empty before its first."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
