"""The watchdog: a pipeline stage whose loop stopped turning is ended and started again by supervision.

Each stage's loop replaces its heartbeat at every progress report (`pipeline_core.progress`), and `make status`
calls a stage `stale` once its heartbeat is older than 3 intervals and 5 s (`pipeline_core.stage_health`): its loop
no longer turns. supervisord restarts only a process that exits; one wedged in a call that never returns lives on
and does nothing. So the event listener of every supervisord (`stack.restarts`; on TOPOLOGY=hosts one per host)
runs this watchdog on a thread of its own. Every CHECK_INTERVAL_S it judges each stage its supervisord runs as
`make status` does: a process in state RUNNING that logged READY, by a heartbeat written by that very process (the
Spark joiner on a cluster: by the Python driver that supervisord's spark-submit started). A stale one is
restarted:

1. its process is asked for every thread's stack (SIGUSR1, `pipeline_core.lifecycle`), which goes into its log:
   where it hangs;
2. a line saying why goes into its log (`--- watchdog: ...`), and the log's last lines are kept;
3. supervisord stops it (SIGTERM, then SIGKILL to its process group after its grace period; what is left of the
   group once its leader exited, a wedged Spark driver under spark-submit's JVM, is ended too) and starts it again;
   it resumes from its last commit, as after any restart;
4. the restart is recorded in `.stack/supervisor/watchdog.jsonl` (what was seen, the PIDs, the log's last lines)
   and in supervisord's start history marked as the watchdog's (`stack.restarts`: not counted among supervisord's
   restarts, nor taken for a start by `up`), and every REPORT_INTERVAL_S each watched stage's count goes to
   InfluxDB as field `watchdog_restarts` of `pipeline_health` (tags `stage`, `instance` = the program).

Left alone: a stage that waits for a server (a Kafka outage of minutes), as it keeps reporting (`stuck`, not stale)
and goes on once the server is back; a stage that has not logged READY yet (its start: a JVM's, Spark's first
batches, which took minutes on a machine at a load of 60; the heartbeat of a predecessor says nothing of it either);
a process supervisord starts or stops; the servers, which have no heartbeat.
While `up`, `down` or `restart` changes the stack (`supervision.exclusive`) the watchdog waits its turn.

The bound, from the last turn of a wedged loop to its stage started again: its stale time
(`stage_health.stale_after_s`, 35 s at the default 10 s interval) + CHECK_INTERVAL_S + its stop grace (10 s; the
stream connector 35 s) + the time a stop takes once killed; then the stage's own start (docs/operations.md).
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
import xmlrpc.client
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline_core import credentials
from pipeline_core.health_metrics import HealthMetrics, health_line
from pipeline_core.settings import ProgressSettings, load_settings
from pipeline_core.stage_health import Heartbeat, StageHealth, assess, format_age
from . import supervision
from .processes import group_members, tail
from .services import PipelineProcess, heartbeat_of

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 2.0
# How often the restart counts go to InfluxDB: the stages' own reporting interval.
REPORT_INTERVAL_S = 10.0
# What the watchdog keeps of a stage's log at a restart (its threads' stacks among them), and what `status` shows of
# it: the lines the stage logged last, and the stack of its main thread, which runs its loop (a deep one cut).
LOG_TAIL_LINES = 80
SHOWN_LOG_LINES = 5
SHOWN_STACK_LINES = 30
# How faulthandler begins each thread's stack; the main thread, the oldest, comes last.
STACK_HEADERS = ("Thread 0x", "Current thread 0x")
# How long the stack dump may take to reach the log (supervisord copies the process's output).
DUMP_DEADLINE_S = 3.0
# How long what is left of a stopped stage's process group gets after its leader exited, before SIGKILL.
GROUP_GRACE_S = 10.0
# How long a restarted stage's new process may take to run.
START_DEADLINE_S = 60.0
MARKER = "--- watchdog:"
# The watch list in each supervisord's directory: the stages that supervisord runs.
WATCH_LIST = "watchdog.json"
# `make status` shows the latest restart of a stage this long after it.
SHOWN_FOR_S = 24 * 3600.0
HISTORY_MAX_BYTES = 1024 * 1024
# The principal whose InfluxDB user writes the restart counts (the stages' writer).
PRINCIPAL = "watchdog"


@dataclass(frozen=True)
class WatchedStage:
    """A stage of the pipeline as the watchdog knows it from its supervisord's watch list."""

    name: str  # the program
    stage: str  # the stage's name in its health points (its package: kafka_joiner, spark_joiner, ...)
    # Its READY line and heartbeat are written by a child of the program's process (spark-submit's Python driver).
    heartbeat_of_child: bool = False

    @classmethod
    def of(cls, service: PipelineProcess) -> WatchedStage:
        return cls(service.name, service.module, service.heartbeat_of_child)

    @property
    def service(self) -> PipelineProcess:
        """The stage as `status` judges it: its log, readiness and heartbeat in the state dir."""
        service = PipelineProcess(self.name, self.stage)
        service.heartbeat_of_child = self.heartbeat_of_child
        return service

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, values: Mapping[str, object]) -> WatchedStage:
        return cls(str(values["name"]), str(values["stage"]), bool(values.get("heartbeat_of_child", False)))


def write_watch_list(directory: Path, stages: Iterable[WatchedStage]) -> Path:
    """The stages a supervisord runs, for its watchdog (read at every check, so a changed list counts at once)."""
    path = directory / WATCH_LIST
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps([stage.to_json() for stage in stages], indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def read_watch_list(path: Path) -> list[WatchedStage]:
    try:
        return [WatchedStage.from_json(values) for values in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def history_file() -> Path:
    return supervision.supervisor_dir() / "watchdog.jsonl"


@dataclass(frozen=True)
class Wedged:
    """A stage found stale: its process and heartbeat, and the verdict."""

    stage: WatchedStage
    pid: int
    heartbeat: Heartbeat
    health: StageHealth
    heartbeat_age_s: float


def find_wedged(stages: Iterable[WatchedStage], processes: Mapping[str, tuple[str, int | None]],
                now: float) -> list[Wedged]:
    """Of `stages`, those whose process supervisord runs (`processes`: name -> (state, pid)), has logged READY (its
    loop turns: what comes before, a JVM's start, the first batches, is no loop that stopped) and whose own heartbeat
    is stale at Unix time `now`: the stages `make status` calls stale."""
    wedged = []
    for stage in stages:
        state, pid = processes.get(stage.name, ("STOPPED", None))
        service = stage.service
        if state != "RUNNING" or pid is None or not service.is_ready(pid):
            continue
        beat = heartbeat_of(service.progress_file, pid, stage.heartbeat_of_child)
        health = assess(beat, now)
        if beat is not None and health.state == "stale":
            wedged.append(Wedged(stage, pid, beat, health, now - beat.reported_at))
    return wedged


@dataclass(frozen=True)
class WatchdogRestart:
    """One restart by the watchdog, as `watchdog.jsonl` keeps it."""

    time: float  # when it was decided (Unix seconds)
    process: str
    stage: str
    pid: int  # the process ended
    heartbeat_age_s: float  # how old its heartbeat was then
    detail: str  # the stale verdict's
    log_file: str
    log_tail: list[str] = field(default_factory=list)  # the log's last lines before the restart (stacks included)
    new_pid: int | None = None
    stopped_s: float | None = None  # from the decision until the old process was gone
    started_s: float | None = None  # from the decision until the new process ran
    error: str | None = None  # why the restart did not complete

    def describe(self, now: float) -> str:
        outcome = (f"pid {self.pid} -> {self.new_pid}, ended in {self.stopped_s:.1f} s, running again "
                   f"{self.started_s:.1f} s after the decision" if self.new_pid is not None
                   else f"pid {self.pid}: {self.error}")
        return (f"{self.process} restarted by the watchdog {format_age(now - self.time)} ago: {self.detail}; "
                f"{outcome}")


def read_history(path: Path) -> list[WatchdogRestart]:
    """Every restart recorded in `path`, oldest first (a line being written is left out)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    restarts = []
    for line in lines:
        try:
            values = json.loads(line)
            restarts.append(WatchdogRestart(**{name: values.get(name) for name in WatchdogRestart.__dataclass_fields__
                                               if name in values}))
        except (ValueError, TypeError):
            continue
    return restarts


def latest_restarts(path: Path) -> dict[str, WatchdogRestart]:
    """The latest restart of each process."""
    return {restart.process: restart for restart in read_history(path)}


def append_history(path: Path, restart: WatchdogRestart) -> None:
    """Append one line; past HISTORY_MAX_BYTES the newest half is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(asdict(restart)) + "\n")
    if path.stat().st_size > HISTORY_MAX_BYTES:
        keep_newest_half(path, HISTORY_MAX_BYTES)


def keep_newest_half(history: Path, max_bytes: int) -> None:
    """Keep the newest `max_bytes // 2` of a file of lines, from a line's start, replaced in one step."""
    data = history.read_bytes()
    newest = data[len(data) - max_bytes // 2:]
    kept = history.with_name(history.name + ".new")
    kept.write_bytes(newest[newest.find(b"\n") + 1:])
    kept.replace(history)


def _dump_stacks(pid: int, log_file: Path) -> None:
    """Ask `pid` for its threads' stacks and wait until its log stops growing (bounded): they are in it then."""
    try:
        size = log_file.stat().st_size
    except OSError:
        size = 0
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + DUMP_DEADLINE_S
    grown_at = None
    while time.monotonic() < deadline:
        try:
            now_size = log_file.stat().st_size
        except OSError:
            return
        if now_size != size:
            size, grown_at = now_size, time.monotonic()
        elif grown_at is not None and time.monotonic() - grown_at > 0.3:
            return
        time.sleep(0.05)


def _end_group(pgid: int) -> None:
    """End what supervisord's stop left of the stage's process group: supervisord waits for its own process only, so
    a wedged child of a leader that exited on SIGTERM (the Spark driver under spark-submit's JVM) would live on,
    orphaned. It had SIGTERM with the rest: after GROUP_GRACE_S more, SIGKILL."""
    deadline = time.monotonic() + GROUP_GRACE_S
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_members(pgid):
        log.warning("process group %d outlived its leader's stop: SIGKILL to %s", pgid, group_members(pgid))
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + GROUP_GRACE_S
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _note_in_log(log_file: Path, text: str) -> None:
    try:
        with log_file.open("a") as out:
            out.write(f"{MARKER} {time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
    except OSError as error:
        log.warning("could not write to %s: %s", log_file, error)


class Watchdog:
    """Checks the stages of one supervisord every CHECK_INTERVAL_S and restarts a stale one (module docstring).

    `rpc` is supervisord's XML-RPC namespace (`supervisor`); `expect_start(name)` is called right before the
    watchdog starts a program again, so the event listener tells that start from `up`'s."""

    def __init__(self, rpc: object, watch_list: Path, expect_start: Callable[[str], None],
                 history: Path | None = None, health: HealthMetrics | None = None,
                 restart_counts: Callable[[], Mapping[str, int]] | None = None) -> None:
        self.rpc = rpc
        self.watch_list = watch_list
        self.expect_start = expect_start
        self.history = history or history_file()
        self.health = health
        self.restart_counts = restart_counts
        self.stop = threading.Event()
        self._reported_at = 0.0

    def run(self) -> None:
        while not self.stop.wait(CHECK_INTERVAL_S):
            try:
                self.check()
            except Exception as error:  # noqa: BLE001 - the watchdog goes on whatever one check met
                log.warning("watchdog: the check failed (%s: %s)", type(error).__name__, error)

    def processes(self) -> dict[str, tuple[str, int | None]]:
        return {info["name"]: (info["statename"], info["pid"] or None)
                for info in self.rpc.getAllProcessInfo()}  # type: ignore[attr-defined]

    def check(self, now: float | None = None) -> list[WatchdogRestart]:
        stages = read_watch_list(self.watch_list)
        processes = self.processes()
        restarted = []
        for wedged in find_wedged(stages, processes, time.time() if now is None else now):
            with supervision.exclusive(blocking=False) as mine:
                if not mine:  # `up`, `down` or `restart` changes the stack: judged again at the next check
                    break
                # Judged again under the lock: what changed the stack meanwhile may have restarted it.
                again = find_wedged([wedged.stage], self.processes(), time.time())
                if again:
                    restarted.append(self.restart(again[0]))
        self._report(stages, processes)
        return restarted

    def restart(self, wedged: Wedged) -> WatchdogRestart:
        began = time.monotonic()
        stage, log_file = wedged.stage, wedged.stage.service.log_file
        log.warning("%s: %s; ending pid %d and starting it again", stage.name, wedged.health.detail, wedged.pid)
        _dump_stacks(wedged.heartbeat.pid, log_file)
        lines = tail(log_file, LOG_TAIL_LINES).splitlines()
        _note_in_log(log_file, f"{wedged.health.detail}: ending pid {wedged.pid} (its threads' stacks above) and "
                               "starting it again")
        # Rounded up: a heartbeat judged stale just past its stale time (35.04 s) must not read as just at it (35.0).
        age_s = math.ceil(wedged.heartbeat_age_s * 10) / 10
        restart = WatchdogRestart(time.time(), stage.name, stage.stage, wedged.pid, age_s, wedged.health.detail,
                                  str(log_file), lines)
        try:
            self.rpc.stopProcess(stage.name, True)  # type: ignore[attr-defined]
            _end_group(wedged.pid)
            stopped_s = time.monotonic() - began
            self.expect_start(stage.name)
            self.rpc.startProcess(stage.name, False)  # type: ignore[attr-defined]
            new_pid = self._new_pid(stage.name, wedged.pid)
            restart = WatchdogRestart(**{**asdict(restart), "new_pid": new_pid, "stopped_s": round(stopped_s, 1),
                                         "started_s": round(time.monotonic() - began, 1)})
        except (xmlrpc.client.Fault, TimeoutError, *supervision.UNREACHABLE) as error:
            restart = WatchdogRestart(**{**asdict(restart), "error": f"{type(error).__name__}: {error}"})
            log.warning("%s: the restart did not complete: %s", stage.name, restart.error)
        append_history(self.history, restart)
        log.warning("%s", restart.describe(time.time()))
        return restart

    def _new_pid(self, name: str, old_pid: int) -> int:
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            info = self.rpc.getProcessInfo(name)  # type: ignore[attr-defined]
            if info["pid"] and info["pid"] != old_pid and info["statename"] in ("STARTING", "RUNNING"):
                return int(info["pid"])
            time.sleep(0.1)
        raise TimeoutError(f"{name} did not run again within {START_DEADLINE_S:.0f} s (see supervisord's log)")

    def _report(self, stages: list[WatchedStage], processes: Mapping[str, tuple[str, int | None]]) -> None:
        """Every REPORT_INTERVAL_S, each running stage's restart count as a health point."""
        if self.health is None or self.restart_counts is None:
            return
        if time.monotonic() - self._reported_at < REPORT_INTERVAL_S:
            return
        self._reported_at = time.monotonic()
        counts = self.restart_counts()
        for stage in stages:
            if processes.get(stage.name, ("STOPPED", None))[0] in supervision.ACTIVE_STATES:
                line = health_line({"stage": stage.stage, "instance": stage.name},
                                   {"watchdog_restarts": counts.get(stage.name, 0)}, time.time_ns())
                if line is not None:
                    self.health.record(line)


def health_metrics() -> HealthMetrics | None:
    """The writer of the restart counts, as the stages write theirs (none with HEALTH_METRICS=false)."""
    settings = load_settings(ProgressSettings, [], environ=credentials.environ_for(PRINCIPAL))
    return HealthMetrics.to_influxdb(settings) if settings.health_metrics else None


def status_lines(entries: Iterable[object], now: float | None = None,
                 history: Path | None = None) -> list[str]:
    """`make status` below its table: for each process the watchdog restarted since `up` started it (its
    `restarts.watchdog`), within the last SHOWN_FOR_S, what it saw and the log's last lines before the restart."""
    now = time.time() if now is None else now
    latest = latest_restarts(history or history_file())
    lines = []
    for entry in entries:
        name = getattr(entry, "name")
        restart = latest.get(name)
        if not getattr(entry, "restarts").watchdog or restart is None or now - restart.time > SHOWN_FOR_S:
            continue
        logged, stack = split_stacks(restart.log_tail)
        lines += [f"watchdog: {restart.describe(now)}",
                  f"  log: {restart.log_file} (`make logs SERVICE={name}` shows more); its last lines before the "
                  f"restart:"]
        lines += [f"    {line}" for line in logged[-SHOWN_LOG_LINES:]]
        if stack:
            lines.append("  where its main thread, which turns its loop, was (most recent call first):")
            lines += [f"    {line}" for line in stack[:SHOWN_STACK_LINES]]
    return lines


def split_stacks(log_tail: list[str]) -> tuple[list[str], list[str]]:
    """The lines a stage logged before its threads' stacks, and the last stack, its main thread's (its header line
    and its frames)."""
    starts = [n for n, line in enumerate(log_tail) if line.startswith(STACK_HEADERS)]
    if not starts:
        return log_tail, []
    stack = [line for line in log_tail[starts[-1]:] if line.strip()]
    return log_tail[:starts[0]], stack
