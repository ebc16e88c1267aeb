"""supervisord for the native stack: its configuration, the daemon and its XML-RPC interface.

Everything supervisord needs lives in the state dir (config, socket, PID file, logs), so checkouts with
different state dirs and ports each run their own. Every service is a program that supervisord
restarts whenever it exits; `manager.py` decides what starts, in which order, and when it is healthy.

On TOPOLOGY=hosts each host runs a supervisord of its own, inside its namespace, for the programs the inventory
places there (`placement`); each function here acts on the daemon that runs the program it names, or on all.
"""
from __future__ import annotations

import fcntl
import http.client
import os
import shlex
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from supervisor.xmlrpc import Faults, SupervisorTransport

from pipeline_core import paths
from . import placement
from .choice import is_hosts
from .processes import StackError, tail
from .services import Service

# A process that exits within its `startsecs` is retried after 1 s, 2 s, ... START_RETRIES s, about
# half an hour of retries, before supervisord gives up on it (FATAL). One that ran longer is
# restarted at once, however often: `status` names it when it does so repeatedly.
START_RETRIES = 60
EVENT_LISTENER = "process-events"
# States in which supervisord runs the process or will start it again by itself.
ACTIVE_STATES = frozenset({"STARTING", "RUNNING", "BACKOFF"})
# Every log supervisord writes (its own, and each program's output) rotates at LOG_MAX_BYTES and keeps
# LOG_BACKUPS older files: at most 60 MiB per process by default (STACK_LOG_MAX_BYTES, STACK_LOG_BACKUPS).
LOG_MAX_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 5
# A unix socket's path must fit in 108 bytes.
MAX_SOCKET_PATH = 100
DAEMON_START_DEADLINE_S = 15.0
# How long a stop may take: supervisord SIGKILLs a process after its grace (the longest is 35 s) and reaps it.
STOP_DEADLINE_S = 90.0
# No supervisord answers on the socket (none runs, or it is exiting).
UNREACHABLE = (OSError, http.client.HTTPException, xmlrpc.client.ProtocolError)


def supervisor_dir() -> Path:
    return paths.STATE_DIR / "supervisor"


@dataclass(frozen=True)
class Daemon:
    """One supervisord and its files: the stack's, or on the hosts one host's (`host`)."""
    directory: Path
    host: str | None = None

    @property
    def config_file(self) -> Path:
        return self.directory / "supervisord.conf"

    @property
    def socket_file(self) -> Path:
        return self.directory / "supervisor.sock"

    @property
    def pid_file(self) -> Path:
        return self.directory / "supervisord.pid"

    @property
    def log(self) -> Path:
        return self.directory / "supervisord.log"


def daemons() -> list[Daemon]:
    """Every supervisord of the stack: one, or on the hosts one per host that runs programs."""
    if is_hosts():
        return [Daemon(supervisor_dir() / host.name, host.name) for host in placement.inventory().hosts
                if host.programs]
    return [Daemon(supervisor_dir())]


def daemon_of(name: str) -> Daemon:
    """The supervisord that runs program `name`."""
    if is_hosts():
        host = placement.inventory().host_of(name).name
        return Daemon(supervisor_dir() / host, host)
    return Daemon(supervisor_dir())


def config_file() -> Path:
    return daemons()[0].config_file


def daemon_log() -> Path:
    return daemons()[0].log


def start_history() -> Path:
    """Where the event listener appends every start of a process (see `restarts.py`); on the hosts every host's
    listener appends to it."""
    return supervisor_dir() / "starts.jsonl"


@dataclass(frozen=True)
class ProcessInfo:
    """What supervisord knows of one program."""
    state: str
    pid: int | None
    uptime_s: float | None


NOT_RUNNING = ProcessInfo("STOPPED", None, None)


def log_limits() -> tuple[int, int]:
    """(bytes at which a log rotates, backups kept), from STACK_LOG_MAX_BYTES and STACK_LOG_BACKUPS."""
    limits = []
    for name, default in (("STACK_LOG_MAX_BYTES", LOG_MAX_BYTES), ("STACK_LOG_BACKUPS", LOG_BACKUPS)):
        value = os.environ.get(name, str(default))
        if not value.isdigit() or (name == "STACK_LOG_MAX_BYTES" and int(value) == 0):
            raise StackError(f"{name}={value!r}: give a whole number" + (" above 0" if name.endswith("BYTES") else ""))
        limits.append(int(value))
    return limits[0], limits[1]


def _value(text: object) -> str:
    """A value in supervisord's config, where `%` starts an expansion."""
    return str(text).replace("%", "%%")


def render_config(services: Iterable[Service], daemon: Daemon | None = None) -> Path:
    """Write the config of `daemon` (the stack's by default): the daemon, the event listener and one program per
    service, each rendered with its host's settings."""
    daemon = daemon or daemons()[0]
    directory = daemon.directory
    directory.mkdir(parents=True, exist_ok=True)
    if len(str(daemon.socket_file)) > MAX_SOCKET_PATH:
        raise StackError(f"the state dir {paths.STATE_DIR} is too long a path for supervisord's socket "
                         f"({daemon.socket_file}): choose a shorter STACK_STATE_DIR")
    # The event listener records every start and runs the watchdog of the stages listed in `directory`.
    listener = [sys.executable, "-m", "stack.restarts", str(start_history()), str(directory)]
    max_bytes, backups = log_limits()
    sections = [
        f"[unix_http_server]\nfile={_value(daemon.socket_file)}\nchmod=0700",
        f"[supervisord]\nlogfile={_value(daemon.log)}\nlogfile_maxbytes={max_bytes}\nlogfile_backups={backups}\n"
        f"pidfile={_value(daemon.pid_file)}\nchildlogdir={_value(directory)}\ndirectory={_value(paths.REPO_ROOT)}",
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        f"[supervisorctl]\nserverurl=unix://{_value(daemon.socket_file)}",
        f"[eventlistener:{EVENT_LISTENER}]\ncommand={_value(shlex.join(listener))}\n"
        f"events=PROCESS_STATE_STARTING\nbuffer_size=1024\nautorestart=true\nstdout_logfile=NONE\n"
        f"stderr_logfile={_value(directory / 'process-events.log')}\n"
        f"stderr_logfile_maxbytes={max_bytes}\nstderr_logfile_backups={backups}",
    ]
    for service in services:
        service.log_file.parent.mkdir(parents=True, exist_ok=True)
        service.temp_dir.mkdir(parents=True, exist_ok=True)
        with placement.on_host(service.name):
            command, environment = service.command(), service.environment()
        sections.append(
            f"[program:{service.name}]\n"
            f"command={_value(shlex.join(command))}\n"
            f"directory={_value(paths.REPO_ROOT)}\n"
            # `up` starts the services in order, each healthy before the next.
            "autostart=false\n"
            "autorestart=true\n"
            f"startsecs={service.startsecs:g}\n"
            f"startretries={START_RETRIES}\n"
            f"stopwaitsecs={service.stop_grace_s:g}\n"
            # The whole process group: the Spark joiner's JVM is a child of its Python process.
            "stopasgroup=true\nkillasgroup=true\n"
            "redirect_stderr=true\n"
            f"stdout_logfile={_value(service.log_file)}\n"
            f"stdout_logfile_maxbytes={max_bytes}\nstdout_logfile_backups={backups}"
            + _environment_line({**environment, "TMPDIR": str(service.temp_dir)}))
    text = "\n\n".join(sections) + "\n"
    if not daemon.config_file.exists() or daemon.config_file.read_text() != text:
        daemon.config_file.write_text(text)
    return daemon.config_file


def _environment_line(environment: dict[str, str]) -> str:
    """supervisord's `environment=` setting for a program: KEY="value" pairs, added to its own environment."""
    if not environment:
        return ""
    pairs = []
    for key, value in sorted(environment.items()):
        if '"' in value or "\n" in value:
            raise StackError(f"{key}: a value for supervisord's environment may hold no quote or newline")
        pairs.append(f'{key}="{_value(value)}"')
    return "\nenvironment=" + ",".join(pairs)


def _rpc(daemon: Daemon) -> xmlrpc.client.ServerProxy:
    transport = SupervisorTransport(None, None, f"unix://{daemon.socket_file}")
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def _pid_of(daemon: Daemon) -> int | None:
    try:
        if _rpc(daemon).supervisor.getState()["statename"] != "RUNNING":
            return None
        return int(_rpc(daemon).supervisor.getPID())
    except (*UNREACHABLE, xmlrpc.client.Fault):
        return None


def daemon_pid() -> int | None:
    """supervisord's PID when it answers on this state dir's socket (on the hosts: the first host's that answers)."""
    return next((pid for daemon in daemons() if (pid := _pid_of(daemon)) is not None), None)


@contextmanager
def exclusive(blocking: bool = True) -> Iterator[bool]:
    """One `up`, `down`, `restart`, test fixture or restart by the watchdog at a time changes this state dir's stack.
    Not `blocking`: True when this one holds it now, False at once when another does."""
    supervisor_dir().mkdir(parents=True, exist_ok=True)
    with open(supervisor_dir() / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


def ensure_daemon(services: Iterable[Service]) -> None:
    """Run supervisord (on the hosts, each host's) with a config holding every service it runs (a no-op when it
    runs with that config)."""
    services = list(services)
    for daemon in daemons():
        render_config([service for service in services if daemon_of(service.name) == daemon], daemon)
        if _pid_of(daemon) is None:
            _start_daemon(daemon)
        else:
            _apply_config(daemon)


def _start_daemon(daemon: Daemon) -> None:
    command = [sys.executable, "-m", "supervisor.supervisord", "-c", str(daemon.config_file)]
    environment = None
    if daemon.host is not None:
        command, environment = placement.supervisor_command(daemon.host, daemon.config_file)
    with open(daemon.log, "a") as output:
        started = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                 timeout=DAEMON_START_DEADLINE_S, env=environment)
    end = time.monotonic() + DAEMON_START_DEADLINE_S
    while started.returncode == 0 and time.monotonic() < end:
        if _pid_of(daemon) is not None:
            return
        time.sleep(0.05)
    raise StackError(f"supervisord did not start (exit code {started.returncode}); last lines of "
                     f"{daemon.log}:\n{tail(daemon.log)}")


def _apply_config(daemon: Daemon) -> None:
    """Take up a changed config for what is not running; a running process keeps its own until it
    is stopped (`up` is a no-op for what runs)."""
    rpc = _rpc(daemon).supervisor
    added, changed, removed = rpc.reloadConfig()[0]
    for name in [*changed, *removed]:
        if process_info(name).state not in ACTIVE_STATES:
            rpc.removeProcessGroup(name)
    for name in [*added, *changed]:
        try:
            rpc.addProcessGroup(name)
        except xmlrpc.client.Fault as fault:
            if fault.faultCode != Faults.ALREADY_ADDED:  # still running with its former config
                raise


def process_info(name: str) -> ProcessInfo:
    try:
        info = _rpc(daemon_of(name)).supervisor.getProcessInfo(name)
    except UNREACHABLE:
        return NOT_RUNNING
    except xmlrpc.client.Fault as fault:
        if fault.faultCode == Faults.BAD_NAME:
            return NOT_RUNNING
        raise
    running = info["statename"] in ("STARTING", "RUNNING", "STOPPING")
    return ProcessInfo(info["statename"], info["pid"] or None,
                       info["now"] - info["start"] if running else None)


def start_process(name: str) -> None:
    try:
        _rpc(daemon_of(name)).supervisor.startProcess(name, False)
    except xmlrpc.client.Fault as fault:
        # SPAWN_ERROR: the process exited before supervisord answered (it retries it); the caller's wait for
        # health sees that state and reports it with the log's tail, as for an exit a moment later.
        if fault.faultCode not in (Faults.ALREADY_STARTED, Faults.SPAWN_ERROR):
            raise StackError(f"supervisord could not start {name}: {fault.faultString}") from None


def stop_process(name: str) -> bool:
    """Stop `name` and wait until it has exited (SIGKILL to its group after its grace period);
    True when it ran or was being restarted."""
    return bool(stop_together([name]))


def stop_together(names: list[str]) -> list[str]:
    """Stop every one of `names` that runs or is being restarted, all at once, and wait until each has exited
    (supervisord SIGKILLs a process's group after its grace period); the names of those stopped."""
    stopping = [name for name in names if process_info(name).state in ACTIVE_STATES]
    for name in stopping:
        try:
            _rpc(daemon_of(name)).supervisor.stopProcess(name, False)
        except xmlrpc.client.Fault as fault:
            if fault.faultCode != Faults.NOT_RUNNING:
                raise
    end = time.monotonic() + STOP_DEADLINE_S
    for name in stopping:
        while process_info(name).state in (*ACTIVE_STATES, "STOPPING"):
            if time.monotonic() > end:
                raise StackError(f"{name} did not stop within {STOP_DEADLINE_S:g} s; see {daemon_of(name).log}")
            time.sleep(0.1)
    return stopping


def active_programs() -> list[str]:
    """The programs supervisord (each host's) runs or restarts now (its event listener aside)."""
    names = []
    for daemon in daemons():
        try:
            infos = _rpc(daemon).supervisor.getAllProcessInfo()
        except UNREACHABLE:
            continue
        names += [info["name"] for info in infos
                  if info["statename"] in ACTIVE_STATES and info["name"] != EVENT_LISTENER]
    return names


def shut_down_daemon() -> bool:
    """Stop supervisord (each host's, with its event listener) and wait until it has exited; True when one ran.
    Every daemon is told first and then waited for: each takes a second or two to exit, ten hosts' in a row
    took 20 s of every `down`."""
    stopping = [(daemon, pid) for daemon in daemons() if (pid := _ask_to_shut_down(daemon)) is not None]
    end = time.monotonic() + 30
    for daemon, pid in stopping:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
            time.sleep(0.05)
        if Path(f"/proc/{pid}").exists():
            raise StackError(f"supervisord (pid {pid}) did not exit within 30 s; see {daemon.log}")
    return bool(stopping)


def _ask_to_shut_down(daemon: Daemon) -> int | None:
    """Tell `daemon` to shut down; its PID, or None when it did not run."""
    pid = _pid_of(daemon)
    if pid is None:
        return None
    try:
        rpc = _rpc(daemon).supervisor
        # supervisord shuts down one process group per pass of its loop, a second each, stopped or not: the
        # groups of the stopped programs go first, so that only the event listener is left to it.
        for info in rpc.getAllProcessInfo():
            if info["statename"] not in ACTIVE_STATES and info["name"] != EVENT_LISTENER:
                try:
                    rpc.removeProcessGroup(info["group"])
                except xmlrpc.client.Fault:  # started again meanwhile: supervisord's shutdown stops it
                    pass
        rpc.shutdown()
    except UNREACHABLE:
        pass  # it may close the connection as it goes
    return pid
