"""The session's servers (Mosquitto, Kafka, InfluxDB) shared by every process of one test run: `make test` runs its
tests in several worker processes (pytest-xdist), each with its own session fixtures.

The first process that needs the servers starts those that do not run; each process registers while it uses them;
the last one to leave stops what a test process started. Servers that ran before (a user's `make up`) are used and
left running. The register is a small JSON file in the state dir, changed under a file lock."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline_core import paths
from stack import manager
from stack.processes import process_start_ticks
from stack.services import Service


def _this_process() -> list[int | None]:
    """This process as the register names a user: its PID and start time, which a later process reusing the PID
    does not share."""
    return [os.getpid(), process_start_ticks(os.getpid())]


@contextmanager
def _register(path: Path) -> Iterator[dict]:
    """The register at `path` ({"users": [[pid, start ticks], ...], "started": [server name, ...]}), read and written
    back under an exclusive lock; users that are gone (a killed test run) dropped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        register = json.loads(path.read_text()) if path.exists() else {"users": [], "started": []}
        register["users"] = [[pid, ticks] for pid, ticks in register["users"] if process_start_ticks(pid) == ticks]
        yield register
        path.write_text(json.dumps(register))


@contextmanager
def shared_servers(servers: list[Service]) -> Iterator[None]:
    """`servers` running while this process uses them, and stopped after the last process of the run that used
    them, when a test process started them."""
    path = paths.STATE_DIR / "test-servers.json"
    with _register(path) as register:
        if not all(server.is_ready() for server in servers):
            not_running = {server.name for server in servers} - set(manager.running(servers))
            try:
                started = set(manager.up(servers))
            except BaseException:
                # A failed start leaves nothing behind that did not run before it, unless another process uses it.
                if not register["users"]:
                    manager.down([server for server in servers if server.name in not_running])
                raise
            register["started"] = sorted(set(register["started"]) | started)
        register["users"].append(_this_process())
    try:
        yield
    finally:
        with _register(path) as register:
            register["users"] = [user for user in register["users"] if user != _this_process()]
            if not register["users"] and register["started"]:
                manager.down([server for server in servers if server.name in register["started"]])
                register["started"] = []
