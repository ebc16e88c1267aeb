"""`make soak` for 15 minutes with each joiner, in `make reliability`: the soak brings a stack of its own up as
`make up` would (JOINER=), runs the default plant (500 machines, a week of backfill, then live) with every fault of
the single stack, and every verdict holds."""
from __future__ import annotations

import shutil

import pytest

from chaos_support import PrivateStack, chaos_workdir
from soak_support import run_soak

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["lsb", "spark"])
def test_fifteen_minutes_of_a_plant_with_every_fault_keep_every_verdict(joiner, tmp_path):
    workdir = chaos_workdir(f"soak-{joiner}")
    stack = PrivateStack(workdir / "stack", joiner)
    try:
        run = run_soak(stack, tmp_path, "--minutes", "15", timeout_s=3000)
    finally:
        stack.stack("down", timeout_s=300)
    print(run.output[-6000:])
    assert run.exit_status == 0, "\n".join(run.failed()) or run.output[-3000:]
    results = run.results
    assert results["up_s"] > 0, "the soak was to bring its stack up itself"
    assert results["event_days"] >= 6.9 and results["live_from"]
    faults = results["faults"]
    assert len(faults) == len(results["faults_planned"]) and all(fault["error"] is None for fault in faults)
    killed = {fault["target"] for fault in faults if fault["kind"] == "kill"}
    assert killed == {"mosquitto", "kafka", "influxdb", "stream-connector", f"{joiner}-joiner", "db-connector"}
    assert {(fault["kind"], fault["target"]) for fault in faults} >= {
        ("stop", "kafka"), ("stop", "influxdb"), ("freeze", f"{joiner}-joiner")}
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when the run failed: its stack's logs say what happened
