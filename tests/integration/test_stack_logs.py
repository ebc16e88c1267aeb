"""Bounded logs under the real supervisord: a stage's log driven past its limit rotates into a bounded number
of backups, and the stack still reports the stage ready although its READY line has rotated away."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from pipeline_core.logs import ready_marker
from stack import manager
from stack.processes import tail
from stack.services import PipelineProcess
from support import wait_for

pytestmark = pytest.mark.integration

MAX_BYTES = 20_000
BACKUPS = 2
# supervisord rotates after a write that passes the limit, and reads a process's output 128 KiB at a time.
READ_CHUNK_BYTES = 128 * 1024
FLOOD_LINES = 20_000  # about 2.6 MB: far past what the log and its backups may hold
# Logs READY, then on SIGUSR1 the flood's lines, then "flood done".
FLOODER = """
import logging, signal
from pipeline_core.logs import announce_ready, configure_logging
configure_logging()
log = logging.getLogger("flooder")
def flood(*_):
    for number in range(FLOOD_LINES):
        log.info("filler line %d %s", number, "x" * 100)
    log.info("flood done")
signal.signal(signal.SIGUSR1, flood)
announce_ready(log, "flooder")
while True:
    signal.pause()
""".replace("FLOOD_LINES", str(FLOOD_LINES))


class Flooder(PipelineProcess):
    def __init__(self, script: Path) -> None:
        super().__init__("log-flooder", "unused")
        script.write_text(FLOODER)
        self.script = script

    def command(self) -> list[str]:
        return [sys.executable, str(self.script)]


def test_a_log_driven_past_its_limit_rotates_and_the_stage_stays_ready(state_dir: Path, tmp_path: Path,
                                                                         monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", state_dir)
    monkeypatch.setenv("STACK_LOG_MAX_BYTES", str(MAX_BYTES))
    monkeypatch.setenv("STACK_LOG_BACKUPS", str(BACKUPS))
    service = Flooder(tmp_path / "flooder.py")
    log = service.log_file
    try:
        assert manager.up([service]) == ["log-flooder"]
        (status,) = manager.status([service])
        # Ready, as `make up` and `make status` judge it (this stand-in stage writes no heartbeat).
        assert service.is_ready(status.pid)
        os.kill(status.pid, signal.SIGUSR1)
        newest = log.with_name(f"{log.name}.1")
        wait_for(lambda: "flood done" in tail(log, 1) + tail(newest, 1), 120, "the flood's last line in the log")

        files = sorted(path.name for path in log.parent.glob(f"{log.name}*"))
        assert files == [log.name, f"{log.name}.1", f"{log.name}.2"]
        sizes = [(log.parent / name).stat().st_size for name in files]
        assert all(size <= MAX_BYTES + READ_CHUNK_BYTES for size in sizes), sizes
        assert sum(sizes) < FLOOD_LINES * 100  # most of the flood was rotated away
        assert not any(ready_marker(status.pid) in (log.parent / name).read_text() for name in files)
        (after,) = manager.status([service])
        assert after.pid == status.pid and service.is_ready(after.pid)
    finally:
        manager.down([service])
