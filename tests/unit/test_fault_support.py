"""The faults the tests inject are confirmed (tests/fault_support.py): on real processes, a kill, a graceful stop, a
freeze and a server's stop each fail the test when they did not happen as the test meant them."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from fault_support import (end_process, freeze, frozen, group_gone, kill_pid, kill_process, stop_server,
                           terminate_process, thaw)
from stack.processes import free_loopback_ports, process_state
from stack.services import Kafka

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


def sleeper(**options) -> subprocess.Popen:
    return subprocess.Popen(SLEEPER, **options)


def test_a_kill_of_a_running_process_is_confirmed_by_its_signal() -> None:
    process = sleeper()
    kill_process(process, "a sleeper")
    assert process.returncode == -signal.SIGKILL


def test_a_kill_of_a_process_that_had_exited_is_no_fault() -> None:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(30)
    with pytest.raises(AssertionError, match=r"had already ended \(exit status 3\).*no fault was injected"):
        kill_process(process, "an exited process")


def test_a_process_that_a_signal_does_not_end_fails_its_kill() -> None:
    # SIGTERM handled: the process exits with 0 instead of being ended by the signal.
    process = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nprint('ready', flush=True)\n"
                                "time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    with pytest.raises(AssertionError, match="ended with exit status 0, not by the SIGTERM"):
        kill_process(process, "a process handling SIGTERM", signal.SIGTERM)


def test_a_group_kill_takes_every_process_of_the_group() -> None:
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"subprocess.Popen({SLEEPER!r})\nprint('ready', flush=True)\ntime.sleep(300)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout.readline() == "ready\n"
    assert not group_gone(leader.pid)
    kill_process(leader, "a group", group=True)
    assert group_gone(leader.pid)


def test_a_graceful_stop_needs_a_running_process() -> None:
    process = sleeper()
    assert terminate_process(process, "a sleeper") == -signal.SIGTERM
    with pytest.raises(AssertionError, match="had already ended"):
        terminate_process(process, "a sleeper")
    end_process(process)  # clean-up of what ended already: nothing to check, nothing raised


def test_a_kill_of_a_process_the_test_did_not_start_is_confirmed_by_it_gone() -> None:
    process = sleeper()
    kill_pid(process.pid, "a sleeper")
    assert process.wait(30) == -signal.SIGKILL
    with pytest.raises(AssertionError, match="was not running"):
        kill_pid(process.pid, "a reaped sleeper")


def test_a_freeze_holds_until_the_thaw() -> None:
    process = sleeper(start_new_session=True)
    try:
        with frozen(process.pid, "a sleeper"):
            assert process_state(process.pid) == "T"
        assert process_state(process.pid) not in (None, "T")
        freeze(process.pid, "a sleeper")
        subprocess.run(["kill", "-CONT", str(process.pid)], check=True)  # thawed behind the test's back
        with pytest.raises(AssertionError, match="no longer frozen"):
            thaw(process.pid, "a sleeper")
    finally:
        end_process(process)


def test_a_stop_of_a_server_that_does_not_listen_is_no_fault() -> None:
    (port,) = free_loopback_ports(1)
    with pytest.raises(AssertionError, match=f"did not listen on 127.0.0.1:{port} before its stop"):
        stop_server(Kafka(), f"127.0.0.1:{port}", "Kafka")
