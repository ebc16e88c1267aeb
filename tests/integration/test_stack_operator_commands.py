"""The operator's commands on a private stack (own state folder and ports), as a user runs them:
`status --json` says what the table says, `restart SERVICE` gives a service a new, healthy process (and refuses
what the running stack does not hold), `logs SERVICE --follow` shows lines as they are written until Ctrl-C."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support import wait_for
from test_stack_manager import PrivateStack

pytestmark = pytest.mark.integration

SERVICES = ["mosquitto", "kafka", "influxdb", "stream-connector", "lsb-joiner", "db-connector"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    private = PrivateStack(tmp_path_factory.mktemp("operator") / "state")
    up = private.run("up")
    assert up.returncode == 0, up.stdout + up.stderr
    yield private
    private.run("down")


def status_json(stack: PrivateStack) -> dict:
    done = stack.run("status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_status_json_holds_the_facts_of_the_table(stack: PrivateStack) -> None:
    def settled() -> tuple[dict, dict] | None:
        # Both read while nothing changes: the same process of each service in the same supervisord state
        # (a service passes STARTING -> RUNNING once its startsecs are over), each healthy.
        table, document = stack.status(), status_json(stack)
        if any(row["health"] != "healthy" for row in table.values()):
            return None
        return (table, document) if {s["name"]: (str(s["pid"]), s["state"]) for s in document["services"]} == \
            {name: (row["pid"], row["state"]) for name, row in table.items()} else None

    table, document = wait_for(settled, 60, "every service healthy", interval_s=0.5)
    assert [service["name"] for service in document["services"]] == list(table) == SERVICES
    for service in document["services"]:
        row = table[service["name"]]
        assert (service["state"], service["health"], str(service["pid"]), str(service["restarts"])) == \
            (row["state"], row["health"], row["pid"], row["restarts"]), service
        assert service["uptime_s"] > 0
        assert isinstance(service["ports"], dict)
        if service["name"] in ("stream-connector", "lsb-joiner", "db-connector"):
            assert service["stage_state"] in ("progressing", "idle"), service
            assert service["last_progress_age_s"] is None or service["last_progress_age_s"] >= 0
        assert service["trouble"] is None and service["log_tail"] is None
    assert document["services"][1]["ports"]["kafka"] == stack.ports["kafka"]
    assert document["joiner"] == "lsb" and document["topology"] == "single"
    assert document["supervisord"]["pid"] == int((stack.state_dir / "supervisor" / "supervisord.pid").read_text())
    assert document["loss"] == {"window": "24h", "by_stage": {}, "unknown": None}
    assert document["disk"]["path"] == str(stack.state_dir) and document["disk"]["free_bytes"] > 0
    assert set(document["disk"]["data_bytes"]) == {"Kafka", "InfluxDB", "Mosquitto"}
    text = stack.run("status").stdout
    assert f"supervisord: pid {document['supervisord']['pid']}" in text
    assert "loss outside the pipeline's control (last 24h): none" in text


def test_restart_gives_a_service_a_new_healthy_process_and_logs_follow_shows_it(stack: PrivateStack) -> None:
    """`logs supervisord --follow` runs while `restart lsb-joiner` stops the joiner and starts it again: the
    follower prints supervisord's lines on it as they are written, and ends quietly on Ctrl-C (SIGINT)."""
    old_pid = int(stack.status()["lsb-joiner"]["pid"])
    follower = subprocess.Popen([sys.executable, "-m", "stack", "logs", "supervisord", "--lines", "2", "--follow"],
                                env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(follower.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(seen) >= 2, 30, "the last two lines of supervisord's log")
        restarted = stack.run("restart", "lsb-joiner")
        assert restarted.returncode == 0, restarted.stderr
        match = re.fullmatch(r"restarted lsb-joiner in [0-9.]+ s, healthy: pid (\d+) -> (\d+)\n", restarted.stdout)
        assert match and int(match.group(1)) == old_pid, restarted.stdout
        new_pid = int(match.group(2))
        assert new_pid != old_pid and not os.path.exists(f"/proc/{old_pid}")
        row = stack.status()["lsb-joiner"]
        # Healthy before supervisord's startsecs passed, it may still be STARTING.
        assert row["state"] in ("RUNNING", "STARTING") and (row["health"], row["pid"]) == ("healthy", str(new_pid))
        wait_for(lambda: any(f"spawned: 'lsb-joiner' with pid {new_pid}" in line for line in seen), 30,
                 "the follower to print the joiner's new start")
        assert any("stopped: lsb-joiner" in line for line in seen), seen
        follower.send_signal(signal.SIGINT)
        assert follower.wait(30) == 0
        assert "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_restart_refuses_what_the_running_stack_does_not_hold(stack: PrivateStack) -> None:
    other_joiner = stack.run("restart", "spark-joiner")
    assert other_joiner.returncode == 1
    assert "spark-joiner is not part of the stack that runs (its joiner is the lsb joiner): " \
           "`make up JOINER=spark` switches the joiner" in other_joiner.stderr
    unknown = stack.run("restart", "kafak")
    assert unknown.returncode == 1 and "no service named 'kafak'; known: mosquitto, kafka" in unknown.stderr
    nameless = stack.run("restart")
    assert nameless.returncode == 1 and "name a service: `make restart SERVICE=<name>`" in nameless.stderr


def test_restart_on_a_stopped_stack_says_how_to_start_it(state_dir: Path) -> None:
    stopped = PrivateStack(state_dir).run("restart", "kafka")
    assert stopped.returncode == 1 and "the stack is not running: `make up` starts it" in stopped.stderr


def test_status_from_a_shell_without_the_stacks_settings_probes_what_runs(stack: PrivateStack) -> None:
    """The stack runs on ports of its own; a shell that names only its state dir still finds every service
    healthy (status takes the settings the stack was started with), and one it sets otherwise is named: a port,
    or a host (InfluxDB, which the loss line asks, is where the stack runs it, not where the shell says)."""
    shell = {name: value for name, value in stack.env.items() if name not in stack.env.keys() - os.environ.keys()
             and not name.endswith("_PORT") and not name.endswith("_HOST")} | {
        "STACK_STATE_DIR": stack.env["STACK_STATE_DIR"]}
    assert "MQTT_PORT" not in shell and "KAFKA_PORT" not in shell

    def healthy() -> subprocess.CompletedProcess[str] | None:
        done = subprocess.run([sys.executable, "-m", "stack", "status"],
                              env={**shell, "INFLUXDB_PORT": "1", "INFLUXDB_HOST": "127.0.0.9"},
                              capture_output=True, text=True, timeout=120)
        rows = [line.split() for line in done.stdout.splitlines()[1:len(SERVICES) + 1]]
        return done if [row[0] for row in rows] == SERVICES and all("healthy" in row for row in rows) else None

    done = wait_for(healthy, 60, "status from a bare shell to find every service healthy", interval_s=1)
    assert f"INFLUXDB_PORT='{stack.env['INFLUXDB_PORT']}' (this shell: '1')" in done.stderr
    assert "INFLUXDB_HOST=unset (this shell: '127.0.0.9')" in done.stderr
    assert "does not answer" not in done.stdout  # the loss line asked InfluxDB where it runs
    assert "MQTT_PORT" not in done.stderr  # left unset by the shell: taken without a word
