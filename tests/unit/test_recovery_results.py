"""benchmarks.recovery: what a reliability run's recovery times become in its results file."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import recovery
from benchmarks.results import problems, read_results


def test_a_rolling_restart_is_recorded_step_by_step_with_the_joins_delay(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path))
    results = recovery.begun("rolling_restart", "hosts", "spark", "make reliability")
    document = {"took_s": 300.5, "steps": [
        {"name": "kafka-1", "stopped_s": 10.0, "started_s": 20.0, "in_sync_s": 5.0},
        {"name": "spark-worker-1", "stopped_s": 2.0, "started_s": 8.0, "in_sync_s": 30.0}]}
    recovery.record_rolling_restart(results, document, [float(delay) for delay in range(1, 201)])
    written = json.loads((tmp_path / "rolling_restart_hosts_spark.json").read_text())
    assert written["command"] == "make reliability"
    assert {figure["name"]: figure["value"] for figure in written["figures"]} == {
        "rolling restart, whole": 300.5, "kafka-1: stop to in sync": 35.0, "spark-worker-1: stop to in sync": 40.0,
        "join delay while it ran, p99": 199.0, "join delay while it ran, longest": 200.0}
    assert problems(read_results(tmp_path)["rolling_restart_hosts_spark"]) == []


def test_each_wedge_is_recorded_and_no_joins_no_delay_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path))
    recovery.record_watchdog(recovery.begun("watchdog", "single", "lsb", "make reliability"),
                             [SimpleNamespace(target="lsb-joiner", decided_s=35.2, healthy_s=48.0,
                                              since_last_report_s=52.0)])
    figures = json.loads((tmp_path / "watchdog_single_lsb.json").read_text())["figures"]
    assert [(figure["name"], figure["value"]) for figure in figures] == [
        ("lsb-joiner: wedge to restart decided", 35.2), ("lsb-joiner: wedge to healthy again", 48.0),
        ("lsb-joiner: last report to healthy again", 52.0)]
    results = recovery.begun("rolling_restart", "cluster", "lsb", "make reliability")
    recovery.record_rolling_restart(results, {"took_s": 90.0, "steps": []})
    assert not any("delay" in figure.name for figure in results.figures)


def test_a_topology_or_joiner_no_run_records_is_refused() -> None:
    with pytest.raises(KeyError):
        recovery.begun("rolling_restart", "single", "lsb", "make reliability")


def test_live_changes_are_recorded_as_the_spec_change_and_the_growth(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path))
    recovery.record_live_changes(recovery.begun("live_changes", "cluster", "spark", "make reliability"),
                                 41.5, 12.0, 37.25)
    figures = json.loads((tmp_path / "live_changes_cluster_spark.json").read_text())["figures"]
    assert [(figure["name"], figure["value"]) for figure in figures] == [
        ("spec change: joiners stopped to healthy again", 41.5),
        ("machine.data grown 5 -> 8: to placed by 8 partitions", 12.0),
        ("machine.data grown 5 -> 8: to every stage caught up", 37.25)]
    assert problems(read_results(tmp_path)["live_changes_cluster_spark"]) == []
