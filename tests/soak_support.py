"""`make soak` on a stack of its own (a state folder and ports of its own, chaos_support's PrivateStack), as a user
runs it: `python -m soak` in a process of its own, its exit status and its results read back."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_support import REPO_ROOT, PrivateStack


@dataclass(frozen=True)
class SoakRun:
    exit_status: int
    output: str
    results: dict[str, Any]
    run_dir: Path

    def verdict(self, name: str) -> dict[str, Any]:
        return next(verdict for verdict in self.results["verdicts"] if verdict["name"] == name)

    def failed(self) -> list[str]:
        return [f"{verdict['name']}: {verdict['detail']}" for verdict in self.results["verdicts"] if not verdict["holds"]]


def run_soak(stack: PrivateStack, report_dir: Path, *args: str, timeout_s: float) -> SoakRun:
    """`python -m soak` against `stack` (brought up by the soak itself when it does not run), results under
    `report_dir`."""
    done = subprocess.run([sys.executable, "-m", "soak", "--report-dir", str(report_dir), "--no-progress", *args],
                          env=stack.env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    runs = sorted(report_dir.glob("soak-*/results.json"))
    assert runs, f"the soak left no results (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return SoakRun(done.returncode, done.stdout + done.stderr, json.loads(runs[-1].read_text()), runs[-1].parent)
