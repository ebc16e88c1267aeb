"""`python -m stack` as a user runs it, on a private state folder and private ports, so the shared
stack other tests use is never touched: supervisord runs every process, restarts a killed one and
`status` names one that keeps failing, or one that is stuck."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EVENTS_FILE
from db_connector_support import raw_records
from fault_support import kill_pid
from stack import manager
from stack.processes import StackError
from stack.services import Service
from stack.processes import free_loopback_ports
from support import confirm_down, port_open, processes_under, produce_records, wait_for

pytestmark = pytest.mark.integration

PIPELINE = ["stream-connector", "lsb-joiner", "db-connector"]
SERVERS = ["mosquitto", "kafka", "influxdb"]
# Only the Spark joiner reads it, and it is no number: `JOINER=spark up` starts a stage that exits at once.
BAD_SPARK_SETTING = {"SPARK_JOINER_MAX_OFFSETS_PER_TRIGGER": "lots"}


class PrivateStack:
    """`python -m stack` on its own state dir and ports."""

    def __init__(self, state_dir: Path) -> None:
        mqtt, kafka, controller, influx, rpc = free_loopback_ports(5)
        self.state_dir = state_dir
        self.ports = {"mqtt": mqtt, "kafka": kafka, "influx": influx}
        self.env = {**os.environ, "STACK_STATE_DIR": str(state_dir), "MQTT_PORT": str(mqtt),
                    "KAFKA_PORT": str(kafka), "KAFKA_CONTROLLER_PORT": str(controller),
                    "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka}", "INFLUXDB_PORT": str(influx),
                    "INFLUXDB_RPC_PORT": str(rpc), "JOINER": "lsb", **BAD_SPARK_SETTING,
                    # Every stage reports (and is judged) each second; a write retry waits a second at most.
                    "PROGRESS_INTERVAL_S": "1", "DB_CONNECTOR_RETRY_MAX_S": "1"}

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack", *args], env={**self.env, **env},
                              capture_output=True, text=True, timeout=300)

    def python(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], env=self.env, capture_output=True, text=True, timeout=120)

    def status(self, **env: str) -> dict[str, dict[str, str]]:
        """`status`'s table: service -> its columns."""
        lines = self.run("status", **env).stdout.splitlines()
        header = lines[0].split()
        rows = {}
        for line in lines[1:]:
            if not line.strip():
                break
            rows[line.split()[0]] = dict(zip(header, line.split()))
        return rows


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def private_stack(tmp_path_factory: pytest.TempPathFactory):
    stack = PrivateStack(tmp_path_factory.mktemp("stack") / "state")
    yield stack
    stack.run("down")


def test_up_runs_everything_under_supervisord_and_a_second_up_is_a_no_op(private_stack) -> None:
    first = private_stack.run("up")
    assert first.returncode == 0, first.stderr
    assert f"started: {', '.join(SERVERS + PIPELINE)}" in first.stdout
    supervisord = int((private_stack.state_dir / "supervisor" / "supervisord.pid").read_text())
    status = private_stack.status()
    for name in SERVERS + PIPELINE:
        assert status[name]["health"] == "healthy", status[name]
        assert status[name]["restarts"] == "0"
        assert parent_of(int(status[name]["pid"])) == supervisord, name
    assert str(private_stack.ports["kafka"]) in private_stack.run("status").stdout
    started = processes_under(private_stack.state_dir)

    again = private_stack.run("up")
    assert again.returncode == 0, again.stderr
    assert "everything was already running" in again.stdout
    assert processes_under(private_stack.state_dir) == started


def test_a_killed_stage_is_restarted_with_a_new_pid_and_counted(private_stack) -> None:
    killed = int(private_stack.status()["lsb-joiner"]["pid"])
    kill_pid(killed, "the stack's lsb-joiner")

    def restarted() -> bool:
        joiner = private_stack.status()["lsb-joiner"]
        return (joiner["pid"] not in ("-", str(killed)) and joiner["health"] == "healthy"
                and joiner["restarts"] == "1")

    wait_for(restarted, 60, "supervisord to restart the killed joiner", interval_s=0.5)
    status = private_stack.run("status").stdout
    assert "keeps failing" not in status, status


def test_a_db_connector_whose_influxdb_refuses_writes_is_named_stuck_then_healthy_again(private_stack) -> None:
    """A live process is not a healthy one: with InfluxDB gone, records wait for the DB connector and none
    is written. `status` names it stuck, and the Compose healthcheck fails, within a few intervals; both say
    healthy again once InfluxDB is back and the records are written."""
    probe = ("-m", "stack.health_probe", "db-connector")
    assert private_stack.python(*probe).returncode == 0
    # A stop, confirmed: InfluxDB ran (stop_process says so) and its port refuses connections after it.
    assert port_open("127.0.0.1", private_stack.ports["influx"]), "InfluxDB did not listen before its stop"
    stopped = private_stack.python("-c", "from stack import supervision; "
                                         "raise SystemExit(0 if supervision.stop_process('influxdb') else 3)")
    assert stopped.returncode == 0, f"InfluxDB was not running when stopped ({stopped.returncode}): {stopped.stderr}"
    confirm_down(f"127.0.0.1:{private_stack.ports['influx']}", "the private stack's InfluxDB")
    records = raw_records(EVENTS_FILE)[:200]
    produce_records(f"127.0.0.1:{private_stack.ports['kafka']}", "machine.data", records)

    def named_stuck() -> str | None:
        out = private_stack.run("status").stdout
        return out if "stuck: db-connector:" in out else None

    status = wait_for(named_stuck, 60, "status to name the DB connector stuck", interval_s=0.5)
    line = next(line for line in status.splitlines() if line.startswith("stuck: db-connector:"))
    assert "waiting for InfluxDB" in line and "in hand" in line and "no progress" in line, line
    assert line.endswith(f"log: {private_stack.state_dir / 'db-connector' / 'db-connector.log'}"), line
    assert private_stack.status()["db-connector"]["health"] == "stuck"
    unhealthy = private_stack.python(*probe)
    assert unhealthy.returncode == 1 and "db-connector: stuck:" in unhealthy.stdout, unhealthy.stdout
    assert all(private_stack.status()[name]["health"] == "healthy" for name in ("stream-connector", "lsb-joiner"))

    restarted = private_stack.run("up")
    assert restarted.returncode == 0, restarted.stderr
    # Idle at last: everything written, no lag left over (the joins' transaction markers count as none).
    wait_for(lambda: "db-connector: idle:" in private_stack.python(*probe).stdout, 60,
             "the DB connector to have written everything", interval_s=0.5)
    assert private_stack.status()["db-connector"]["health"] == "healthy"
    assert "stuck:" not in private_stack.run("status").stdout


def test_a_stage_that_keeps_failing_is_named_by_status_with_its_log(private_stack) -> None:
    up = private_stack.run("up", JOINER="spark")
    assert up.returncode == 1
    # One joiner at a time: the standalone one stopped before the Spark joiner's start.
    assert "stopped the lsb joiner (lsb-joiner): the spark joiner takes over" in up.stdout, up.stdout
    assert "spark-joiner exited during start" in up.stderr
    assert "SPARK_JOINER_MAX_OFFSETS_PER_TRIGGER='lots'" in up.stderr
    log = private_stack.state_dir / "spark-joiner" / "spark-joiner.log"

    def named() -> str | None:
        out = private_stack.run("status", JOINER="spark").stdout
        return out if "spark-joiner keeps failing" in out and "restarted" in out else None

    status = wait_for(named, 60, "status to name the failing Spark joiner", interval_s=0.5)
    assert f"log: {log}" in status
    assert "SPARK_JOINER_MAX_OFFSETS_PER_TRIGGER='lots'" in status.split("spark-joiner keeps failing")[1]
    # The rest of the pipeline runs on.
    assert all(private_stack.status()[name]["health"] == "healthy" for name in ("stream-connector", "db-connector"))
    assert private_stack.status()["lsb-joiner"]["state"] == "STOPPED"  # JOINER=lsb in this stack's environment


def test_down_stops_the_pipeline_then_the_servers_then_supervisord_leaving_no_process(
        private_stack) -> None:
    before = processes_under(private_stack.state_dir)
    assert before
    down = private_stack.run("down")
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == ("stopped: db-connector, spark-joiner, stream-connector, "
                                   "influxdb, kafka, mosquitto, supervisord")
    # Neither orphans nor zombies: every PID is gone from /proc.
    assert [pid for pid in before if Path(f"/proc/{pid}").exists()] == []
    assert processes_under(private_stack.state_dir) == set()
    assert "supervisord: not running" in private_stack.run("status").stdout
    assert private_stack.run("down").stdout.strip() == "stopped: nothing was running"


def test_port_in_use_names_the_port_and_its_holder(state_dir: Path) -> None:
    stack = PrivateStack(state_dir)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", stack.ports["mqtt"]))
        squatter.listen()
        result = stack.run("up", "--servers-only")
    assert result.returncode == 1
    assert f"port {stack.ports['mqtt']} (mosquitto mqtt) is already in use" in result.stderr
    assert f"pid {os.getpid()}" in result.stderr
    assert processes_under(stack.state_dir) == set()


def test_a_process_started_before_supervision_is_stopped_by_down_and_a_stranger_never(
        state_dir: Path) -> None:
    stack = PrivateStack(state_dir)
    run_dir = stack.state_dir / "run"
    run_dir.mkdir(parents=True)
    # The PID-file records that servers run without supervisord left: PID and a marker of its
    # command line. PID 1 exists but lacks the marker: a stale record, never signalled.
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                               str(stack.state_dir / "mosquitto")], start_new_session=True)
    try:
        (run_dir / "mosquitto.pid").write_text(json.dumps(
            {"pid": server.pid, "marker": str(stack.state_dir), "started_at": 0}))
        (run_dir / "kafka.pid").write_text(json.dumps(
            {"pid": 1, "marker": str(stack.state_dir), "started_at": 0}))

        assert f"running without supervisord: mosquitto (pid {server.pid})" in stack.run("status").stdout
        refused = stack.run("up", "--servers-only")
        assert refused.returncode == 1 and "run without supervisord (mosquitto" in refused.stderr
        assert stack.run("down").stdout.strip() == "stopped: mosquitto"
        assert server.wait(timeout=30) == -signal.SIGTERM
        assert list(run_dir.iterdir()) == []
    finally:
        server.kill()
        server.wait()


class ExitsAtStart(Service):
    name = "exits-at-start"

    def ports(self) -> dict[str, int]:
        return {}

    def command(self) -> list[str]:
        return ["sh", "-c", f"echo 'fatal: broken config in {self.state_dir}'; exit 3"]

    def is_ready(self, pid: int | None = None) -> bool:
        return False


def test_a_server_that_exits_at_start_reports_its_log_tail(state_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", state_dir)
    service = ExitsAtStart()
    try:
        with pytest.raises(StackError) as error:
            manager.up([service])
        assert "exits-at-start exited during start" in str(error.value)
        assert "fatal: broken config" in str(error.value)
        assert manager.running([service]) == ["exits-at-start"]  # supervisord retries it
    finally:
        assert manager.down([service]) == ["exits-at-start", "supervisord"]
