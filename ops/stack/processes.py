"""Start, watch and stop long-running processes, remembering them in PID files.

A PID file holds the PID and a marker string that must appear in the process's command line, so a
PID reused by an unrelated process after a crash or reboot is recognised as stale, never killed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class StackError(RuntimeError):
    """A failure a user must act on; the message says what happened and what to do."""


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    marker: str
    started_at: float


def read_pid_file(path: Path) -> ProcessRecord | None:
    try:
        data = json.loads(path.read_text())
        return ProcessRecord(int(data["pid"]), str(data["marker"]), float(data["started_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def command_line(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def is_alive(record: ProcessRecord) -> bool:
    """The recorded process still runs (and is not a zombie or an unrelated process with its PID)."""
    cmdline = command_line(record.pid)
    if not cmdline or record.marker not in cmdline:
        return False
    try:
        state = Path(f"/proc/{record.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def live_record(pid_file: Path) -> ProcessRecord | None:
    """The running process of a PID file; a stale PID file is removed."""
    record = read_pid_file(pid_file)
    if record is None or not is_alive(record):
        pid_file.unlink(missing_ok=True)
        return None
    return record


def spawn(command: Sequence[str], *, log_file: Path, pid_file: Path, marker: str,
          env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Start `command` detached in its own session, output appended to `log_file`.

    The PID file is written at once; the returned handle tells the starter the exit code should the
    process die during start-up."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, **(env or {})}, cwd=cwd)
    pid_file.write_text(json.dumps(ProcessRecord(process.pid, marker, time.time()).__dict__))
    return process


def wait_until(check: Callable[[], bool], deadline_s: float, *, alive: Callable[[], bool],
               interval_s: float = 0.05) -> bool:
    """Poll `check` until it is true (True), the process dies or the deadline passes (False)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():
            return True
        if not alive():
            return False
        time.sleep(interval_s)
    return check()


def terminate(record: ProcessRecord, grace_s: float) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace_s` seconds."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(record.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(record.pid, sig)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if not is_alive(record):
                _reap(record.pid)
                return
            time.sleep(0.05)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    """Who listens on `port`, e.g. 'java (pid 1234)', as far as `ss` can tell."""
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "another process"
    match = re.search(r'users:\(\("([^"]+)",pid=(\d+)', out)
    return f"{match.group(1)} (pid {match.group(2)})" if match else "another process"


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log written)"
