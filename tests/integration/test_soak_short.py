"""`make soak` in brief, as part of `make test` (`make reliability` runs 15 minutes of it with every fault, each
joiner): two minutes of a small plant through a stack of its own, a day of backfill then live, the joiner killed
once; every verdict holds, the fault was confirmed, and the report is written."""
from __future__ import annotations

import shutil

import pytest

from chaos_support import PrivateStack, chaos_workdir
from soak_support import run_soak

pytestmark = pytest.mark.integration


def test_two_minutes_of_a_plant_with_the_joiner_killed_keep_every_verdict(tmp_path):
    workdir = chaos_workdir("soak")
    stack = PrivateStack(workdir / "stack", "lsb")
    stack.stack("up", timeout_s=900)
    try:
        run = run_soak(stack, tmp_path, "--minutes", "2", "--machines", "40", "--axes", "2", "--days", "1",
                       "--fault-list", "kill:lsb-joiner", timeout_s=600)
    finally:
        stack.stack("down", timeout_s=300)
    assert run.exit_status == 0, "\n".join(run.failed()) or run.output[-3000:]
    results = run.results
    assert results["holds"] and not run.failed()
    assert results["joiner"] == "lsb" and results["rows"] > 0
    # The backfill reached the present: about a day of event time, then live rows.
    assert results["event_days"] >= 0.95 and results["live_from"]
    [fault] = results["faults"]
    assert (fault["kind"], fault["target"], fault["error"]) == ("kill", "lsb-joiner", None)
    assert any("gone" in line for line in fault["confirmed"]) and any("running again" in line
                                                                      for line in fault["confirmed"])
    joins = run.verdict("machine.out = the reference join of machine.data")["figures"]
    assert joins["found"] == joins["expected"] > 0
    for measurement in ("raw", "joined"):
        sample = run.verdict(f"InfluxDB holds every {measurement} point")["figures"]
        assert sample["sample_points"] >= 10_000 or sample["sample_points"] == sample["found"]
    assert results["latencies"], "no probe row was timed to its joined point"
    for picture in ("soak.png", "memory.png", "disk.png", "report.md"):
        assert (run.run_dir / picture).stat().st_size > 0
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when the run failed: its stack's logs say what happened
