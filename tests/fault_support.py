"""The faults a test injects, each confirmed before it counts, defined once:

- `kill_process`: a process the test started (a `subprocess.Popen`), running, ended by the signal sent (exit status
  -9 for SIGKILL), and with `group` every process of its group gone too;
- `terminate_process`: a graceful stop the test asks for (SIGTERM) of a running process; its exit status;
- `kill_pid`: a process the test did not start (a program under supervisord), running, then gone;
- `stop_server`: a server of a private stack, listening, stopped by the stack's manager, its ports closed;
- `freeze` and `thaw` (or `frozen`): a process group stopped with SIGSTOP (state T), running again after SIGCONT.

Whatever did not happen fails the test, saying what was found: a kill of a process that had exited already is no
fault injected. Clean-up after a test is no fault: `end_process` kills whatever still runs and checks nothing."""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stack import manager
from stack.processes import process_state
from stack.services import Service
from support import confirm_down, port_open, wait_for

# Process states of a process that is no more: a zombie (exited, not yet reaped), dead.
ENDED_STATES = ("Z", "X")


def exit_description(code: int | None) -> str:
    """A Popen return code in words."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def group_gone(pgid: int) -> bool:
    """Whether no live process (zombies are dead) is left in process group `pgid`, its leader included (which may have
    left the group)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _parent, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(group) == pgid and state not in ENDED_STATES:
            return False
    return process_state(pgid) in (None, *ENDED_STATES)


def _signal(pid: int, sig: int, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        pass  # ended meanwhile: its exit status says how, and the caller checks it


def kill_process(process: subprocess.Popen, what: str, sig: signal.Signals = signal.SIGKILL, *, group: bool = False,
                 deadline_s: float = 60) -> None:
    """Sends `sig` to a running process the test started (with `group`, to its process group) and confirms that the
    process was running and that this signal ended it."""
    before = process.poll()
    assert before is None, f"{what} had already ended ({exit_description(before)}) when the test sent it " \
                           f"{sig.name}: no fault was injected"
    _signal(process.pid, sig, group)
    try:
        code = process.wait(deadline_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} still runs {deadline_s:.0f} s after the test sent it {sig.name}") from None
    assert code == -sig, f"{what} ended with {exit_description(code)}, not by the {sig.name} the test sent"
    if group:
        wait_for(lambda: group_gone(process.pid), deadline_s, f"every process of {what} (group {process.pid}) gone")


def terminate_process(process: subprocess.Popen, what: str, deadline_s: float = 60) -> int:
    """SIGTERM to a running process the test started, a graceful stop; its exit status once it ended."""
    before = process.poll()
    assert before is None, f"{what} had already ended ({exit_description(before)}) before its SIGTERM"
    _signal(process.pid, signal.SIGTERM, group=False)
    try:
        return process.wait(deadline_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} still runs {deadline_s:.0f} s after SIGTERM") from None


def end_process(process: subprocess.Popen | None, *, group: bool = False, deadline_s: float = 30) -> None:
    """Clean-up, no fault: SIGKILL to whatever still runs of a process the test started (with `group`, of its process
    group, which may outlive its leader), and wait for it."""
    if process is None:
        return
    if group:
        _signal(process.pid, signal.SIGKILL, group=True)
    elif process.poll() is None:
        _signal(process.pid, signal.SIGKILL, group=False)
    process.wait(deadline_s)
    if group:
        wait_for(lambda: group_gone(process.pid), deadline_s, f"every process of group {process.pid} gone")


def kill_pid(pid: int, what: str, *, group: bool = False, deadline_s: float = 60) -> None:
    """SIGKILL to a running process the test did not start (a program under supervisord: its exit status is its
    parent's to read), confirmed by the process running before and gone (or a zombie) after."""
    state = process_state(pid)
    assert state is not None and state not in ENDED_STATES, \
        f"{what} (PID {pid}) was not running ({state or 'no such process'}) when the test killed it: no fault"
    _signal(pid, signal.SIGKILL, group)
    if group:
        wait_for(lambda: group_gone(pid), deadline_s, f"every process of {what} (group {pid}) gone after SIGKILL")
    else:
        wait_for(lambda: process_state(pid) in (None, *ENDED_STATES), deadline_s, f"{what} (PID {pid}) gone after "
                 "SIGKILL")


def stop_server(service: Service, addresses: str, what: str) -> None:
    """Stops a server of the private stack the environment points at (`stack.manager`), confirmed: it listened on
    every one of `addresses` ("host:port,..."), the manager stopped it, and each address refuses connections."""
    endpoints = [(host, int(port)) for host, port in (address.rsplit(":", 1) for address in addresses.split(","))]
    silent = [f"{host}:{port}" for host, port in endpoints if not port_open(host, port)]
    assert not silent, f"{what} did not listen on {', '.join(silent)} before its stop: no fault"
    stopped = manager.down([service])
    assert service.name in stopped, f"{what}: the stack's manager stopped {stopped}, not {service.name}"
    confirm_down(addresses, what)


def freeze(pid: int, what: str, deadline_s: float = 30) -> None:
    """SIGSTOP to the running process group `pid`, confirmed by its leader's state T."""
    state = process_state(pid)
    assert state is not None and state not in (*ENDED_STATES, "T"), \
        f"{what} (group {pid}) was not running ({state or 'no such process'}) when the test froze it"
    os.killpg(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: process_state(pid) == "T", deadline_s, f"{what} (group {pid}) frozen")
    except AssertionError:
        _signal(pid, signal.SIGCONT, group=True)
        raise


def thaw(pid: int, what: str, deadline_s: float = 30) -> None:
    """SIGCONT to a frozen process group, confirmed: frozen until then, running after."""
    state = process_state(pid)
    assert state == "T", f"{what} (group {pid}) was no longer frozen when the test thawed it ({state or 'gone'}): " \
                         "the freeze did not last as long as the test needed"
    os.killpg(pid, signal.SIGCONT)
    wait_for(lambda: process_state(pid) not in (None, "T"), deadline_s, f"{what} (group {pid}) running again")


@contextmanager
def frozen(pid: int, what: str) -> Iterator[None]:
    """`freeze` for the block, then `thaw`; a block that fails thaws the group unchecked, keeping its own error."""
    freeze(pid, what)
    try:
        yield
    except BaseException:
        _signal(pid, signal.SIGCONT, group=True)
        raise
    thaw(pid, what)
