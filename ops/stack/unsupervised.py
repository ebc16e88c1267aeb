"""Servers a stack started before it ran them under supervisord: each left a PID file in
`STATE_DIR/run` holding its PID and a string of its command line (its state dir). `down` stops them
and `up` asks for that first, so a checkout updated while its stack ran leaves no process behind."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from pipeline_core import paths
from .processes import command_line

STOP_GRACE_S = 35.0  # the longest a former service was given


def _run_dir() -> Path:
    return paths.STATE_DIR / "run"


def running() -> dict[str, int]:
    """Name -> PID of each such process still alive; a stale PID file is removed."""
    found = {}
    for pid_file in sorted(_run_dir().glob("*.pid")):
        try:
            record = json.loads(pid_file.read_text())
            pid, marker = int(record["pid"]), str(record["marker"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if marker in (command_line(pid) or ""):
            found[pid_file.stem] = pid
        else:
            pid_file.unlink(missing_ok=True)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(order: list[str]) -> list[str]:
    """Stop them in `order` (names; the pipeline first): SIGTERM to each one's process group,
    SIGKILL to what is left after the grace period."""
    found = running()
    stopped = sorted(found, key=lambda name: order.index(name) if name in order else len(order))
    for name in stopped:
        pid = found[name]
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait_s
            while _alive(pid) and time.monotonic() < end:
                time.sleep(0.05)
            if not _alive(pid):
                break
        (_run_dir() / f"{name}.pid").unlink(missing_ok=True)
    return stopped
