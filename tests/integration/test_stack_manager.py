"""`python -m stack` as a user runs it, on a private state folder and private ports, so the shared
stack other tests use is never touched."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stack.processes import StackError, command_line
from stack.services import Service
from stack import manager
from support import free_ports

pytestmark = pytest.mark.integration


@pytest.fixture
def private_stack(tmp_path: Path):
    mqtt, kafka, controller, influx, rpc = free_ports(5)
    env = {**os.environ, "STACK_STATE_DIR": str(tmp_path / "state"), "MQTT_PORT": str(mqtt),
           "KAFKA_PORT": str(kafka), "KAFKA_CONTROLLER_PORT": str(controller),
           "INFLUXDB_PORT": str(influx), "INFLUXDB_RPC_PORT": str(rpc)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack", *args], env=env, capture_output=True,
                              text=True, timeout=180)

    run.state_dir = tmp_path / "state"  # type: ignore[attr-defined]
    run.ports = {"mqtt": mqtt, "kafka": kafka, "influx": influx}  # type: ignore[attr-defined]
    yield run
    run("down")


def processes_under(state_dir: Path) -> list[int]:
    """PIDs whose command line names the state folder: what the stack started there."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and str(state_dir) in (command_line(int(entry.name)) or ""):
            pids.append(int(entry.name))
    return pids


def test_up_status_idempotent_up_and_down_without_orphans(private_stack) -> None:
    first = private_stack("up", "--servers-only")
    assert first.returncode == 0, first.stderr
    assert "stack up in" in first.stdout and "started: mosquitto, kafka, influxdb" in first.stdout
    started = processes_under(private_stack.state_dir)
    assert len(started) == 3

    again = private_stack("up", "--servers-only")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    assert processes_under(private_stack.state_dir) == started

    status = private_stack("status")
    for name, port in (("mosquitto", private_stack.ports["mqtt"]), ("kafka", private_stack.ports["kafka"]),
                       ("influxdb", private_stack.ports["influx"])):
        line = next(line for line in status.stdout.splitlines() if line.startswith(name))
        assert "healthy" in line and str(port) in line

    down = private_stack("down")
    assert down.returncode == 0 and "stopped: influxdb, kafka, mosquitto" in down.stdout
    assert processes_under(private_stack.state_dir) == []
    assert "stopped" in private_stack("status").stdout


def test_stale_pid_file_is_recognised_and_never_kills_a_stranger(private_stack) -> None:
    run_dir = private_stack.state_dir / "run"
    run_dir.mkdir(parents=True)
    # PID 1 exists but is not our Mosquitto: its command line lacks the marker.
    (run_dir / "mosquitto.pid").write_text(json.dumps({"pid": 1, "marker": str(private_stack.state_dir),
                                                       "started_at": 0}))
    status = private_stack("status")
    assert "mosquitto" in status.stdout and "stopped" in status.stdout.splitlines()[1]
    assert not (run_dir / "mosquitto.pid").exists()
    assert private_stack("down").stdout.strip() == "stopped: nothing was running"


def test_port_in_use_names_the_port_and_its_holder(private_stack) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", private_stack.ports["mqtt"]))
        squatter.listen()
        result = private_stack("up", "--servers-only")
    assert result.returncode == 1
    assert f"port {private_stack.ports['mqtt']} (mosquitto mqtt) is already in use" in result.stderr
    assert f"pid {os.getpid()}" in result.stderr
    assert processes_under(private_stack.state_dir) == []


class ExitsAtStart(Service):
    name = "exits-at-start"

    def ports(self) -> dict[str, int]:
        return {}

    def command(self) -> list[str]:
        return ["sh", "-c", f"echo 'fatal: broken config in {self.state_dir}'; exit 3"]

    def is_ready(self) -> bool:
        return False


def test_a_server_that_exits_at_start_reports_its_log_tail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    with pytest.raises(StackError) as error:
        manager.start(ExitsAtStart())
    assert "exits-at-start exited during start (exit code 3)" in str(error.value)
    assert "fatal: broken config" in str(error.value)
