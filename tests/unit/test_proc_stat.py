"""What the stack reads of a process from /proc/<pid>/stat: its state, its parent and its start, for a process whose
command name has the spaces and parentheses that make the line hard to split."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from stack.processes import parent_pid, process_start_ticks, process_state
from support import wait_for


def test_state_parent_and_start_of_a_process_named_with_spaces_and_parentheses(tmp_path: Path) -> None:
    odd = tmp_path / "a) b (c"
    shutil.copy("/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "60"])
    try:
        wait_for(lambda: process_state(child.pid) in ("S", "R"), 10, "the child running")
        assert parent_pid(child.pid) == os.getpid()
        started = process_start_ticks(child.pid)
        assert started is not None and started >= process_start_ticks(os.getpid())
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(child.pid) == "T", 10, "the child stopped")
        os.kill(child.pid, signal.SIGCONT)
        wait_for(lambda: process_state(child.pid) != "T", 10, "the child running again")
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None
    assert parent_pid(child.pid) is None and process_start_ticks(child.pid) is None
