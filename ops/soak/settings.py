"""Settings of the soak (flags > environment > defaults)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline_core.settings import ConnectionSettings, setting


@dataclass(frozen=True)
class SoakSettings(ConnectionSettings):
    """A synthetic plant through the whole running pipeline for MINUTES: a backfill of its past days at the
    pipeline's pace, then live, with faults; verdicts and a report at the end (exit status 0 only if all hold)."""

    minutes: float = setting(45.0, "SOAK_MINUTES", "wall-clock length of the whole run, bring-up and check included",
                             minimum=1.0)
    machines: int = setting(500, "SOAK_MACHINES", "machines of the plant", minimum=1)
    axes: int = setting(3, "SOAK_AXES", "drive axes per machine", minimum=1)
    days: float = setting(7.0, "SOAK_DAYS", "days of event time before now the backfill covers", minimum=0.01)
    live_interval_ms: int = setting(1000, "SOAK_LIVE_INTERVAL_MS", "ms between a machine's rows once live",
                                    minimum=10)
    max_step_ms: int = setting(900_000, "SOAK_MAX_STEP_MS",
                               "ms of event time between a machine's rows in the backfill at most (a slow pipeline "
                               "gets a sparser past, never sparser than this)", minimum=10)
    probes: int = setting(10, "SOAK_PROBES", "machines whose every row is timed to its joined point in InfluxDB",
                          minimum=1)
    seed: int = setting(20261206, "SOAK_SEED", "seed of the plant and of the checks' samples", minimum=None)
    faults: bool = setting(True, "SOAK_FAULTS", "inject faults (--no-faults: none)")
    fault_list: str | None = setting(None, "SOAK_FAULT_LIST",
                                     "only these faults, comma-separated kind:program[:hold_s] and `clock` (machines "
                                     "whose clocks lie), e.g. kill:lsb-joiner,stop:kafka:60,clock (default: every "
                                     "fault of the topology, and the lying clocks)")
    start_rate: float = setting(0.0, "SOAK_START_RATE",
                                "rows/s the backfill starts at (0: 0.7 of the latest capacity figure of this joiner "
                                "in reports/, else 1000)")
    sample_interval_s: float = setting(5.0, "SOAK_SAMPLE_INTERVAL_S", "seconds between samples of the stack",
                                       minimum=1.0)
    report_dir: Path = setting(Path("reports"), "SOAK_REPORT_DIR", "where the run's folder (results and report) goes")
    check_processes: int = setting(2, "SOAK_CHECK_PROCESSES", "processes reading the topics back for the check",
                                   minimum=1)
    up: bool = setting(True, "SOAK_UP", "bring the stack up as `make up` would when it does not run (JOINER=, "
                                        "TOPOLOGY= as for make up)")
    progress: bool = setting(True, "SOAK_PROGRESS", "print a progress line every few seconds")
