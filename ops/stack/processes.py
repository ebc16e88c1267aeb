"""What the stack needs to know of processes apart from supervisord: errors a user must act on,
command lines, who holds a port, the end of a log."""
from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path


class StackError(RuntimeError):
    """A failure a user must act on; the message says what happened and what to do."""


def command_line(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


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
