"""The faults the soak injects into the running stack, each confirmed before it counts.

Kinds (`FAULT_KINDS`), each against one program of the stack that runs:

* `kill`: SIGKILL to the program's process group; confirmed by the group gone, then by supervision running it
  again (a new PID). A kill of Mosquitto also notes its last save (its database file's time): the rows it
  acknowledged since then may be lost, and the soak's check counts them;
* `stop`: the program stopped gracefully for `hold_s`, then started again; confirmed by its process gone and its
  ports closed, then by its health check passing again;
* `freeze`: SIGSTOP to the process group for `hold_s`, then SIGCONT; confirmed by the state T while frozen, and
  running after, or, where `hold_s` is longer than the stage's stale time, by the watchdog's restart of it.

`plan_faults` chooses them for the topology: every stage and every server killed once, Kafka and InfluxDB stopped
for two minutes each, the joiner frozen for a minute, and on a cluster also a Kafka node and a Spark worker killed.
Faults of other kinds join the list by name (`FAULT_KINDS`) as the stack gains operator actions (partitions grown
mid-run) and the plant machines whose clocks jump.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stack import manager, supervision, watchdog
from stack.processes import process_state
from stack.services import Service

log = logging.getLogger("soak.faults")

FAULT_KINDS = ("kill", "stop", "freeze")
STOP_HOLD_S = 120.0
FREEZE_HOLD_S = 60.0
# How long a fault's confirmation waits: a process group to die, supervision to start a program again, a stopped
# server to pass its health check.
CONFIRM_DEADLINE_S = 300.0
ENDED_STATES = (None, "Z", "X")


class FaultNotConfirmed(RuntimeError):
    """A fault did not happen as planned (the process was not running, did not die, did not come back)."""


@dataclass(frozen=True)
class Fault:
    kind: str  # one of FAULT_KINDS
    target: str  # a program of the stack
    hold_s: float = 0.0  # how long a stop or freeze lasts

    def describe(self) -> str:
        return f"{self.kind} {self.target}" + (f" for {self.hold_s:.0f} s" if self.hold_s else "")


@dataclass
class FaultRecord:
    """One fault as it happened: when (Unix seconds), and what confirmed it."""

    fault: Fault
    began_at: float = 0.0
    ended_at: float = 0.0  # the program back (running again, thawed, or healthy after its start)
    confirmed: list[str] = field(default_factory=list)
    error: str | None = None
    mosquitto_saved_at: float | None = None  # a kill of Mosquitto: its last save before it

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.fault.kind, "target": self.fault.target, "hold_s": self.fault.hold_s,
                "began_at": self.began_at, "ended_at": self.ended_at, "confirmed": self.confirmed,
                "error": self.error, "mosquitto_saved_at": self.mosquitto_saved_at}


def plan_faults(services: Sequence[Service], joiner: str, cluster: bool) -> list[Fault]:
    """The run's faults, in the order they happen: the stops and the freeze between the kills, so that each
    kind meets the pipeline at work."""
    names = [service.name for service in services]
    # Spark's master and workers are servers; the Spark joiner (`spark-joiner`) is a stage.
    servers = [name for name in names
               if name in ("mosquitto", "influxdb") or name.startswith(("kafka", "spark-master", "spark-worker"))]
    stages = [name for name in names if name not in servers]
    joiners = [name for name in stages if "joiner" in name]
    kafka = [name for name in names if name.startswith("kafka")]
    faults = [Fault("kill", stage) for stage in stages]
    faults.insert(1, Fault("stop", "+".join(kafka), STOP_HOLD_S))
    faults.insert(3, Fault("freeze", joiners[0], FREEZE_HOLD_S))
    faults.insert(5, Fault("stop", "influxdb", STOP_HOLD_S))
    # Servers killed last: each brings the stages to a halt for a while, kills included.
    faults += [Fault("kill", server) for server in servers if not server.startswith("spark-master")]
    if cluster:
        workers = [name for name in names if name.startswith("spark-worker")]
        faults = [fault for fault in faults if fault.target not in workers] + [Fault("kill", w) for w in workers[:1]]
    return faults


def faults_done(planned: Sequence[Fault], records: Sequence[FaultRecord]) -> tuple[bool, str]:
    """Whether every planned fault happened and was confirmed, and in words which did not (a run too short for
    its faults ends with some not done: they are named, never left out in silence)."""
    not_confirmed = [f"{record.fault.describe()} ({record.error})" for record in records if record.error is not None]
    not_done = [fault.describe() for fault in planned[len(records):]]
    detail = f"{len(records) - len(not_confirmed)} of {len(planned)} confirmed"
    if not_confirmed:
        detail += "; not confirmed: " + ", ".join(not_confirmed)
    if not_done:
        detail += "; not done (the run ended first): " + ", ".join(not_done)
    return not not_confirmed and not not_done, detail


class FaultInjector:
    """Injects faults into the stack of this state dir through its supervisord, confirming each."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services = {service.name: service for service in services}

    def inject(self, fault: Fault, on_phase: Callable[[str], None] = lambda _text: None) -> FaultRecord:
        record = FaultRecord(fault)
        try:
            if fault.kind == "kill":
                self._kill(fault.target, record)
            elif fault.kind == "stop":
                self._stop(fault.target.split("+"), fault.hold_s, record, on_phase)
            elif fault.kind == "freeze":
                self._freeze(fault.target, fault.hold_s, record, on_phase)
            else:
                raise FaultNotConfirmed(f"no such fault kind: {fault.kind}")
        except (FaultNotConfirmed, TimeoutError) as error:
            record.error = str(error)
            log.warning("%s: %s", fault.describe(), error)
        record.ended_at = record.ended_at or time.time()
        return record

    def running_pid(self, name: str) -> int:
        info = supervision.process_info(name)
        return info.pid if info.state == "RUNNING" and info.pid else 0

    def _kill(self, name: str, record: FaultRecord) -> None:
        pid = _wait(lambda: self.running_pid(name), f"{name} running under supervision")
        record.began_at = time.time()
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            raise FaultNotConfirmed(f"{name} (group {pid}) ended before its SIGKILL") from None
        _wait(lambda: group_gone(pid), f"every process of {name} (group {pid}) gone", interval_s=0.02)
        record.confirmed.append(f"SIGKILL: process group {pid} gone")
        if name == "mosquitto":
            database = self.services[name].state_dir / "data" / "mosquitto.db"
            if not database.exists():
                raise FaultNotConfirmed(f"Mosquitto killed without a save to restart from: no {database}")
            record.mosquitto_saved_at = database.stat().st_mtime_ns / 1e9
        new_pid = _wait(lambda: (lambda now: now if now not in (0, pid) else 0)(self.running_pid(name)),
                        f"{name} started again by supervision")
        record.confirmed.append(f"running again as {new_pid}")
        record.ended_at = time.time()

    def _stop(self, names: list[str], hold_s: float, record: FaultRecord, on_phase: Callable[[str], None]) -> None:
        pids = {name: self.running_pid(name) for name in names}
        if not all(pids.values()):
            raise FaultNotConfirmed(f"a stop of what does not run is no fault: {pids}")
        listening = {name: [port for port in self.services[name].ports().values() if port_open(port)]
                     for name in names}
        record.began_at = time.time()
        stopped = supervision.stop_together(names)
        if sorted(stopped) != sorted(names):
            raise FaultNotConfirmed(f"supervisord stopped {stopped}, not {names}")
        for name in names:
            _wait(lambda: group_gone(pids[name]), f"every process of {name} gone")
            _wait(lambda: not any(port_open(port) for port in listening[name]), f"{name}'s ports closed")
        record.confirmed.append("stopped: " + ", ".join(f"{name} (group {pids[name]} gone, ports "
                                                        f"{listening[name]} closed)" for name in names))
        on_phase("held")
        time.sleep(max(0.0, record.began_at + hold_s - time.time()))
        if any(self.running_pid(name) for name in names):
            raise FaultNotConfirmed(f"{names} ran again before the end of the stop")
        manager.start_together([self.services[name] for name in names])
        record.confirmed.append("started again, healthy: " + ", ".join(
            f"{name} as {supervision.process_info(name).pid}" for name in names))
        record.ended_at = time.time()

    def _freeze(self, name: str, hold_s: float, record: FaultRecord, on_phase: Callable[[str], None]) -> None:
        pid = _wait(lambda: self.running_pid(name), f"{name} running under supervision")
        record.began_at = time.time()
        os.killpg(pid, signal.SIGSTOP)
        try:
            _wait(lambda: process_state(pid) == "T", f"{name} (group {pid}) frozen", deadline_s=30)
            record.confirmed.append(f"SIGSTOP: group {pid} in state T")
            on_phase("held")
            time.sleep(max(0.0, record.began_at + hold_s - time.time()))
            if process_state(pid) != "T":
                self._ended_by_the_watchdog(name, pid, record)
                return
        finally:
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        _wait(lambda: process_state(pid) not in (*ENDED_STATES, "T"), f"{name} (group {pid}) running again",
              deadline_s=30)
        record.confirmed.append(f"SIGCONT: group {pid} running again")
        record.ended_at = time.time()

    def _ended_by_the_watchdog(self, name: str, pid: int, record: FaultRecord) -> None:
        """A freeze longer than the stage's stale time is a wedge to the watchdog, which ends the frozen process and
        starts it again: confirmed by its record of that restart and the new process under supervision."""
        def restart_recorded() -> watchdog.WatchdogRestart | None:  # written once the restart is done
            return next((restart for restart in reversed(watchdog.read_history(watchdog.history_file()))
                         if restart.process == name and restart.pid == pid and restart.time >= record.began_at), None)

        restart = _wait(restart_recorded, f"{name} (group {pid}) no longer frozen at the end of its freeze "
                                          f"({process_state(pid) or 'gone'}): the watchdog's record of ending it")
        if restart.new_pid is None:
            raise FaultNotConfirmed(f"the watchdog ended {name} (group {pid}) while frozen: {restart.error}")
        new_pid = _wait(lambda: (found := self.running_pid(name)) != pid and found, f"{name} running again")
        record.confirmed.append(f"ended by the watchdog {restart.time - record.began_at:.0f} s into the freeze "
                                f"({restart.detail}); running again as {new_pid}")
        record.ended_at = time.time()


def group_gone(pgid: int) -> bool:
    """Whether no live process (zombies are dead) is left in process group `pgid`."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                state, _parent, group = stat.read().rsplit(")", 1)[1].split()[:3]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            return False
    return process_state(pgid) in ENDED_STATES


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


def _wait(check: Callable[[], object], what: str, deadline_s: float = CONFIRM_DEADLINE_S,
          interval_s: float = 0.2) -> object:
    end = time.monotonic() + deadline_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > end:
            raise FaultNotConfirmed(f"not within {deadline_s:.0f} s: {what}")
        time.sleep(interval_s)
