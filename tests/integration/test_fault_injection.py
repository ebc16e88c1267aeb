"""The chaos runs' faults (chaos_support.PrivateStack) count only once confirmed, and an injection that does not
happen fails: a real supervisord with two programs, a server listening on a port and a stage."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos_support import Fault, PrivateStack, port_open
from fault_support import group_gone
from stack.processes import free_loopback_ports
from support import wait_for

pytestmark = pytest.mark.integration

CONFIG = """[unix_http_server]
file=%(here)s/supervisor.sock

[supervisord]
logfile=%(here)s/supervisord.log
pidfile=%(here)s/supervisord.pid
; the programs' own logs (supervisord's AUTO files) beside it, not in /tmp
childlogdir=%(here)s

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://%(here)s/supervisor.sock

[program:influxdb]
command={python} -m http.server {port} --bind 127.0.0.1
startsecs=1
stopasgroup=true
killasgroup=true

[program:stage]
command={python} -c "import time; time.sleep(3600)"
startsecs=1
stopasgroup=true
killasgroup=true
"""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[PrivateStack]:
    """supervisord running a listening "influxdb" (a plain HTTP server) and a "stage", as PrivateStack sees them."""
    (port,) = free_loopback_ports(1)
    config = tmp_path / "supervisor" / "supervisord.conf"
    config.parent.mkdir()
    config.write_text(CONFIG.format(python=sys.executable, port=port))
    daemon = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack = PrivateStack(tmp_path, "lsb")
    stack.assigned_ports = {"INFLUXDB_PORT": port}
    try:
        wait_for(lambda: config.with_name("supervisor.sock").exists() and stack.running_pid("stage")
                 and port_open(port), 60, "supervisord's programs running")
        yield stack
    finally:
        daemon.terminate()  # supervisord stops its programs on SIGTERM
        daemon.wait(60)


def test_a_stop_counts_once_supervisorctl_said_so_the_group_is_gone_and_the_port_closed(stack: PrivateStack) -> None:
    pid, (port,) = stack.running_pid("influxdb"), stack.ports("influxdb")
    stack.inject(Fault(0, "stop", "influxdb"))
    assert group_gone(pid) and not port_open(port) and stack.running_pid("influxdb") == 0
    assert stack.confirmed == [f"stop influxdb: process group {pid} gone, ports [{port}] closed"]
    with pytest.raises(AssertionError, match="a stop of what does not run is no fault"):
        stack.inject(Fault(0, "stop", "influxdb"))
    stack.inject(Fault(0, "start", "influxdb"))
    assert stack.running_pid("influxdb") not in (0, pid)


def test_a_restart_and_a_kill_count_once_the_old_process_is_gone(stack: PrivateStack) -> None:
    old = stack.running_pid("influxdb")
    stack.inject(Fault(0, "restart", "influxdb"))
    assert group_gone(old) and stack.running_pid("influxdb") not in (0, old)
    stage = stack.running_pid("stage")
    stack.inject(Fault(0, "kill", "stage"))
    assert group_gone(stage)
    assert stack.confirmed[-1] == f"kill stage: process group {stage} gone"


def test_an_injection_that_does_not_happen_fails(stack: PrivateStack) -> None:
    with pytest.raises(AssertionError, match="supervisorctl"):
        stack.start("stage")  # already running: supervisorctl answers ERROR (already started), exit status 1
    with pytest.raises(AssertionError):
        stack.inject(Fault(0, "restart", "no-such-program"))
    with pytest.raises(AssertionError, match="no such fault"):
        stack.inject(Fault(0, "pause", "stage"))
    assert stack.confirmed == []
