"""How every long-running stage counts and reports its progress.

A stage counts into a `StageCounters` (plain int attributes: the hot path pays one addition) and calls
`ProgressReporter.maybe_report` from its loop. Every `interval_s` the reporter asks the stage for what it
measures at that moment (an `Observation`: its lag and its own gauges), logs one line and hands one
`pipeline_health` point to `HealthMetrics`, which writes it to InfluxDB from its own thread.

The fields of the point (see 08_influxdb_grafana/README.md for what each stage puts in them):

* ``records_in``, ``records_out``, ``dead_letters``: totals since the process started;
* ``records_in_per_s``, ``records_out_per_s``, ``dead_letters_per_s``: rates over the last interval;
* ``lag``: records waiting for the stage (consumer lag, or rows in flight), when it knows it;
* ``disk_free_bytes``, ``disk_used_ratio``: the filesystem of the stage's state (the stack's state dir, else
  its working dir): bytes still free to it, and the share used as `df` shows it;
* every further counter of the stage's `StageCounters` subclass, and the observation's values.

A stage that counts per machine (a joiner's clock rule: outliers, steps back) also hands its totals per machine in
its observation: each report writes them as `machine_health` points, one per machine, tagged with its name.

With a heartbeat file (setting PROGRESS_FILE), each report also replaces that file with a `Heartbeat`: when
the stage reported, when its work last moved (its `progress_counters` changed), whether work waits for it
(lag or records in hand) and how much. `pipeline_core.stage_health` judges it: `make status`, the Compose
healthcheck and the stack's watchdog read it. The heartbeat comes from the stage's loop itself (each turn calls
`maybe_report`), never from a thread of its own, so a loop that stops turning stops it too.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import paths
from .health_metrics import MACHINE_MEASUREMENT, HealthMetrics, health_line
from .influx import stored_name
from .settings import ProgressSettings
from .stage_health import Heartbeat, write_heartbeat
from .wedge import Wedge

log = logging.getLogger(__name__)

# The counters every stage has, reported with their rates.
RATED_COUNTERS = ("records_in", "records_out", "dead_letters")


@dataclass
class StageCounters:
    """Totals since the stage started. A stage subclasses it for counters of its own: every int field is a
    counter, reported with the rest; fields of other types (times, samples) are not."""

    records_in: int = 0
    records_out: int = 0
    dead_letters: int = 0


@dataclass
class ConsumerCounters(StageCounters):
    """The counters of a stage that consumes Kafka topics, with what it lost outside its control (see
    `pipeline_core.data_loss`)."""

    records_skipped: int = 0  # records the broker deleted (retention, delete_records) before they were read
    topics_deleted: int = 0  # subscribed topics deleted under the running stage
    offset_resets: int = 0  # partitions the consumer moved to the earliest offset without being asked


def counter_totals(counters: StageCounters) -> dict[str, int]:
    """The current total of every counter (int field) of `counters`."""
    totals = {}
    for field_ in dataclasses.fields(counters):
        value = getattr(counters, field_.name)
        if type(value) is int:
            totals[field_.name] = value
    return totals


@dataclass(frozen=True)
class Observation:
    """What a stage measures when a report is due, beyond its counters."""

    lag: int | None = None  # records waiting for the stage
    values: Mapping[str, int | float | None] = field(default_factory=dict)  # gauges, logged and written
    # Records taken in but not done (a batch not yet written, rows not yet acknowledged): work waiting
    # that the lag does not show. Only in the heartbeat; the stage's gauges carry what it logs.
    pending: int | None = None
    # A server the stage keeps trying and failing to use ("InfluxDB"): work waits on it, records known or not.
    waiting_for: str | None = None
    # Per machine (its name), counters since the stage started: written as machine_health points, not logged.
    machines: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # What an operator should know of the stage beyond its figures (`make status` shows it below the table).
    note: str | None = None

    @property
    def work_waiting(self) -> bool:
        return bool(self.lag) or bool(self.pending) or self.waiting_for is not None


@dataclass(frozen=True)
class ProgressReport:
    """One interval's progress: what the log line says and the health point carries."""

    totals: Mapping[str, int]
    rates: Mapping[str, float]  # per second over the interval, of RATED_COUNTERS
    lag: int | None
    values: Mapping[str, int | float | None]

    def fields(self) -> dict[str, int | float | None]:
        fields: dict[str, int | float | None] = dict(self.totals)
        fields.update((f"{name}_per_s", rate) for name, rate in self.rates.items())
        fields["lag"] = self.lag
        fields.update(self.values)
        return fields

    def describe(self, labels: Mapping[str, str] | None = None) -> str:
        """The log line: the rated counters with their rates and the lag, then the rest."""
        labels = labels or {}

        def label(name: str) -> str:
            return labels.get(name, name.replace("_", " "))

        head = [f"{label(name)} {self.totals[name]:,} ({self.rates[name]:,.0f}/s)" if name != "dead_letters"
                else f"{label(name)} {self.totals[name]:,}" for name in RATED_COUNTERS]
        head.append(f"lag {'?' if self.lag is None else f'{self.lag:,}'}")
        rest = [f"{label(name)} {_number(value)}" for name, value in self.totals.items()
                if name not in RATED_COUNTERS]
        rest += [f"{label(name)} {_number(value)}" for name, value in self.values.items() if value is not None]
        return ", ".join(head) + ("; " + ", ".join(rest) if rest else "")


def progress_report(totals: Mapping[str, int], previous: Mapping[str, int], elapsed_s: float,
                    observation: Observation) -> ProgressReport:
    """The report of an interval of `elapsed_s` seconds from the counters' totals at its start and end."""
    elapsed_s = max(elapsed_s, 1e-9)
    rates = {name: (totals[name] - previous.get(name, 0)) / elapsed_s for name in RATED_COUNTERS}
    return ProgressReport(dict(totals), rates, observation.lag, dict(observation.values))


def _number(value: int | float | None) -> str:
    if value is None:
        return "?"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"


def disk_fields(path: Path) -> dict[str, int | float]:
    """Free bytes and used share (as `df` shows it) of the filesystem holding `path`; none if unreadable."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return {}
    usable = usage.used + usage.free
    return {"disk_free_bytes": usage.free, "disk_used_ratio": usage.used / usable if usable else 0.0}


def state_dir() -> Path:
    """Where a stage keeps its state: the stack's state dir when there is one, else the working dir."""
    return paths.STATE_DIR if paths.STATE_DIR.is_dir() else Path.cwd()


def instance_name() -> str:
    """This process among the stage's instances: host and PID."""
    return f"{socket.gethostname()}-{os.getpid()}"


class ProgressReporter:
    """Every `interval_s`: one log line and one health point of the stage's counters and observation, and
    the heartbeat in `heartbeat_file`. The stage's work moved when any of its `progress_counters` did: the
    counters of work done, not of work taken in (a connector re-reading rows Kafka never confirms moves its
    records in, not its work)."""

    def __init__(self, stage: str, counters: StageCounters, *, interval_s: float,
                 observe: Callable[[], Observation] = Observation, health: HealthMetrics | None = None,
                 logger: logging.Logger | None = None, labels: Mapping[str, str] | None = None,
                 instance: str | None = None, clock: Callable[[], float] = time.monotonic,
                 progress_counters: Sequence[str] = RATED_COUNTERS, heartbeat_file: Path | None = None,
                 wall_clock: Callable[[], float] = time.time, disk_path: Path | None = None,
                 wedge: Wedge | None = None) -> None:
        self.stage = stage
        self.counters = counters
        self.interval_s = interval_s
        self.health = health
        self._observe = observe
        self._logger = logger or log
        self._labels = labels
        self._tags = {"stage": stage, "instance": instance or instance_name()}
        self._disk_path = disk_path or state_dir()
        self._clock = clock
        self._last_at = clock()
        self._next_at = self._last_at + interval_s
        self._last_totals = counter_totals(counters)
        self._progress_counters = tuple(progress_counters)
        self._heartbeat_file = heartbeat_file
        self._wall_clock = wall_clock
        self._started_at = wall_clock()
        self._last_progress_at: float | None = None
        self._waiting_since: float | None = None
        self._heartbeat_failed = False
        self._wedge = wedge
        # At once: the stage is judged by this run's heartbeat from its start, not by a predecessor's.
        self._write_heartbeat(self._started_at, Observation())

    @classmethod
    def for_stage(cls, stage: str, counters: StageCounters, settings: ProgressSettings,
                  **options: object) -> ProgressReporter:
        """A reporter at the settings' interval, writing to InfluxDB unless health metrics are off."""
        health = HealthMetrics.to_influxdb(settings) if settings.health_metrics else None
        wedge = None
        if settings.wedge_on_sigusr2:
            wedge = Wedge()
            wedge.install()
        return cls(stage, counters, interval_s=settings.progress_interval_s, health=health,
                   heartbeat_file=settings.progress_file, wedge=wedge, **options)  # type: ignore[arg-type]

    def maybe_report(self, now: float | None = None) -> ProgressReport | None:
        """Report if the interval is over; cheap enough for every turn of a stage's loop."""
        if self._wedge is not None:
            self._wedge.block_if_armed()
        now = self._clock() if now is None else now
        if now < self._next_at:
            return None
        return self.report(now)

    def report(self, now: float | None = None) -> ProgressReport:
        now = self._clock() if now is None else now
        observation = self._observation()  # first: observing may update the counters
        totals = counter_totals(self.counters)
        report = progress_report(totals, self._last_totals, now - self._last_at, observation)
        moved = any(totals.get(name) != self._last_totals.get(name) for name in self._progress_counters)
        self._last_at, self._next_at, self._last_totals = now, now + self.interval_s, totals
        wall_now = self._wall_clock()
        if moved:
            self._last_progress_at = wall_now
        self._write_heartbeat(wall_now, observation)
        self._logger.info("%s", report.describe(self._labels))
        if self.health is not None:
            time_ns = time.time_ns()
            line = health_line(self._tags, {**report.fields(), **disk_fields(self._disk_path)}, time_ns)
            if line is not None:
                self.health.record(line)
            for machine, counts in observation.machines.items():
                line = health_line({**self._tags, "thing": stored_name(machine)}, counts, time_ns, MACHINE_MEASUREMENT)
                if line is not None:
                    self.health.record(line)
        return report

    def close(self) -> None:
        """The last report (unless nothing was counted since the one before), then the health metrics' last
        write (bounded: a down InfluxDB delays no exit)."""
        if counter_totals(self.counters) != self._last_totals:
            self.report()
        if self.health is not None:
            self.health.close()

    def _write_heartbeat(self, wall_now: float, observation: Observation) -> None:
        if self._heartbeat_file is None:
            return
        if not observation.work_waiting:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = wall_now
        heartbeat = Heartbeat(self.stage, os.getpid(), self.interval_s, self._started_at, wall_now,
                              self._last_progress_at, observation.work_waiting, observation.lag, observation.pending,
                              self._waiting_since, observation.waiting_for, observation.note)
        try:
            write_heartbeat(self._heartbeat_file, heartbeat)
        except OSError as error:  # the stage's work goes on; its healthcheck says it is not healthy
            if not self._heartbeat_failed:
                self._logger.warning("progress: could not write the heartbeat %s (%s)", self._heartbeat_file, error)
            self._heartbeat_failed = True
            return
        self._heartbeat_failed = False

    def _observation(self) -> Observation:
        try:
            return self._observe()
        except Exception as error:  # noqa: BLE001 - a failed measurement must not stop the stage
            self._logger.warning("progress: could not measure the lag and gauges (%s: %s)",
                                 type(error).__name__, error)
            return Observation()
