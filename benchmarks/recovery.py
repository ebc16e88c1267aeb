"""Recovery times that `make reliability` measures, recorded as results (benchmarks.results) for the docs to render:
the watchdog's restarts of wedged stages (tests/reliability/test_watchdog.py), the rolling restart of a cluster
(tests/reliability/test_rolling_restart.py) and the join specs changed and machine.data grown on a running stack
(tests/reliability/test_live_changes.py). Not a benchmark of its own: the reliability runs call it once they
passed, each under a results name of its topology and joiner, and each run replaces its file.

Figures, in seconds:
- the watchdog, per wedged stage: from the wedge until the watchdog decided to restart it, and until `make status`
  called its new process healthy; and from the wedged loop's last report until healthy again.
- the rolling restart: the whole command, and each node from its stop until it was in sync again; the joins'
  longest delay (from the later input written to the join readable) while it ran, and their p99.
- the live changes: from the joiners' stop for the new spec file until they were healthy again; from machine.data's
  growth until the stream connector placed records by its new partition count, and until every stage caught up.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from benchmarks.results import Results


class Wedge(Protocol):
    """What a reliability run saw of one wedge (tests' chaos_support.WedgeOutcome), seconds after the wedge."""

    target: str
    decided_s: float
    healthy_s: float
    since_last_report_s: float


# Each run's results name, by its topology and joiner (`Results("name"` spelt out: tests/unit/test_benchmark_results.py
# finds the names a page may ask for in these lines).
RESULTS_OF: dict[tuple[str, str, str], Callable[[], Results]] = {
    ("watchdog", "single", "spark"): lambda: Results("watchdog_single_spark", argv=[]),
    ("watchdog", "single", "lsb"): lambda: Results("watchdog_single_lsb", argv=[]),
    ("watchdog", "cluster", "spark"): lambda: Results("watchdog_cluster_spark", argv=[]),
    ("watchdog", "cluster", "lsb"): lambda: Results("watchdog_cluster_lsb", argv=[]),
    ("watchdog", "hosts", "spark"): lambda: Results("watchdog_hosts_spark", argv=[]),
    ("watchdog", "hosts", "lsb"): lambda: Results("watchdog_hosts_lsb", argv=[]),
    ("rolling_restart", "cluster", "spark"): lambda: Results("rolling_restart_cluster_spark", argv=[]),
    ("rolling_restart", "cluster", "lsb"): lambda: Results("rolling_restart_cluster_lsb", argv=[]),
    ("rolling_restart", "hosts", "spark"): lambda: Results("rolling_restart_hosts_spark", argv=[]),
    ("rolling_restart", "hosts", "lsb"): lambda: Results("rolling_restart_hosts_lsb", argv=[]),
    ("live_changes", "single", "spark"): lambda: Results("live_changes_single_spark", argv=[]),
    ("live_changes", "single", "lsb"): lambda: Results("live_changes_single_lsb", argv=[]),
    ("live_changes", "cluster", "spark"): lambda: Results("live_changes_cluster_spark", argv=[]),
    ("live_changes", "cluster", "lsb"): lambda: Results("live_changes_cluster_lsb", argv=[]),
    ("live_changes", "hosts", "spark"): lambda: Results("live_changes_hosts_spark", argv=[]),
    ("live_changes", "hosts", "lsb"): lambda: Results("live_changes_hosts_lsb", argv=[]),
}


def begun(kind: str, topology: str, joiner: str, command: str) -> Results:
    """The results of a run of `kind` ("watchdog", "rolling_restart", "live_changes") starting now (its start time
    and load), `command` saying what ran."""
    results = RESULTS_OF[kind, topology, joiner]()
    results.command = command
    return results


def record_watchdog(results: Results, wedges: Iterable[Wedge]) -> None:
    """The recovery of each wedged stage of the run, written."""
    for wedge in wedges:
        results.add(f"{wedge.target}: wedge to restart decided", wedge.decided_s, "s")
        results.add(f"{wedge.target}: wedge to healthy again", wedge.healthy_s, "s")
        results.add(f"{wedge.target}: last report to healthy again", wedge.since_last_report_s, "s")
    results.write()


def record_rolling_restart(results: Results, document: Mapping[str, Any], join_delays_s: Iterable[float] = ()) -> None:
    """One rolling restart (`python -m stack rolling-restart --json`'s document), written; `join_delays_s`: the
    delays of the joins readable while it ran."""
    results.add("rolling restart, whole", document["took_s"], "s")
    for step in document["steps"]:
        results.add(f"{step['name']}: stop to in sync", step["stopped_s"] + step["started_s"] + step["in_sync_s"], "s")
    delays = sorted(join_delays_s)
    if delays:
        results.add("join delay while it ran, p99", delays[min(len(delays) - 1, int(0.99 * len(delays)))], "s")
        results.add("join delay while it ran, longest", delays[-1], "s")
    results.write()


def record_live_changes(results: Results, specs_s: float, placed_s: float, caught_up_s: float) -> None:
    """One run of live changes, written: `specs_s` from the joiners' stop for the new specs until healthy again,
    `placed_s` and `caught_up_s` from machine.data's growth until placed by its new count and every stage caught up."""
    results.add("spec change: joiners stopped to healthy again", specs_s, "s")
    results.add("machine.data grown 5 -> 8: to placed by 8 partitions", placed_s, "s")
    results.add("machine.data grown 5 -> 8: to every stage caught up", caught_up_s, "s")
    results.write()
