"""The native stack's supervision without processes: supervisord's config, restart counts read from
the event listener's history, and when `status` calls a process failing."""
from __future__ import annotations

import configparser
import json
import shlex
import time
from pathlib import Path

import pytest

from stack import supervision
from stack.__main__ import format_duration
from stack.manager import RESTART_LOOP_COUNT, ServiceStatus
from stack.restarts import Restarts, read_restarts
from stack.services import Service


class Echo(Service):
    name = "echo"
    stop_grace_s = 12.0
    startsecs = 7.0

    def ports(self) -> dict[str, int]:
        return {}

    def command(self) -> list[str]:
        return ["sh", "-c", "printf '100%% sure, it is %(ENV_HOME)s'"]

    def is_ready(self, pid: int | None = None) -> bool:
        return True


def test_config_runs_each_service_restarted_with_backoff_and_stopped_as_a_group(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    config = configparser.ConfigParser()  # `%%` reads as `%`, as in supervisord's own parser
    config.read(supervision.render_config([Echo()]))
    program = config["program:echo"]
    assert shlex.split(program["command"]) == Echo().command()
    assert program["autostart"] == "false" and program["autorestart"] == "true"
    assert program["startsecs"] == "7" and int(program["startretries"]) == supervision.START_RETRIES
    assert program["stopwaitsecs"] == "12"
    assert program["stopasgroup"] == program["killasgroup"] == "true"
    assert Path(program["stdout_logfile"]) == tmp_path / "echo" / "echo.log"
    assert Path(config["unix_http_server"]["file"]).parent == tmp_path / "supervisor"
    assert Path(config["supervisord"]["pidfile"]).parent == tmp_path / "supervisor"
    assert config["eventlistener:process-events"]["events"] == "PROCESS_STATE_STARTING"


def test_a_state_dir_too_long_for_the_socket_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path / ("x" * 100))
    with pytest.raises(Exception, match="choose a shorter STACK_STATE_DIR"):
        supervision.render_config([])


def write_history(path: Path, *starts: tuple[float, str, str]) -> Path:
    lines = [json.dumps({"time": at, "process": name, "from": state}) for at, name, state in starts]
    path.write_text("\n".join(lines) + '\n{"time": 9, "proc')  # a line being written
    return path


def test_restarts_count_from_the_latest_start_by_up(tmp_path: Path) -> None:
    history = write_history(
        tmp_path / "starts.jsonl",
        (1, "joiner", "STOPPED"), (2, "joiner", "EXITED"), (3, "kafka", "STOPPED"),
        (4, "joiner", "FATAL"),  # `up` started it again after supervisord gave up: a new count
        (5, "joiner", "EXITED"), (6, "joiner", "BACKOFF"), (7, "kafka", "EXITED"))
    restarts = read_restarts(history)
    assert restarts["joiner"] == Restarts((5.0, 6.0), failed_starts=1)
    assert restarts["kafka"] == Restarts((7.0,), failed_starts=0)
    assert restarts["joiner"].within(1.5, now=7.0) == 1
    assert read_restarts(tmp_path / "missing.jsonl") == {}


def status(state: str, restarts_ago_s: tuple[float, ...] = (), failed_starts: int = 0) -> ServiceStatus:
    """A status whose restarts happened that many seconds before now (now: when the test runs, not
    when it was collected, which in a long suite is many minutes earlier)."""
    now = time.time()
    return ServiceStatus("joiner", state, None, None, Restarts(tuple(now - ago for ago in restarts_ago_s), failed_starts),
                         {}, False, Path("joiner.log"))


LONG_AGO_S = time.time() - 1.0  # the epoch's first second


@pytest.mark.parametrize("state, restarts_ago_s, failed_starts, trouble", [
    ("RUNNING", (), 0, None),
    ("STOPPED", (), 0, None),
    ("RUNNING", (1.0,), 0, None),  # one restart, after a crash: supervised as it should be
    ("FATAL", (), 0, "FATAL"),
    ("BACKOFF", (), 0, None),  # exited once during start, say killed before startsecs passed
    ("STARTING", (1.0,), 1, None),  # ... and being started again
    ("BACKOFF", (1.0,), 1, "BACKOFF"),  # exited during start twice in a row
    ("STARTING", (1.0, 2.0), 2, "restarted 2 times in the last"),
    ("RUNNING", (1.0,) * RESTART_LOOP_COUNT, 0, f"restarted {RESTART_LOOP_COUNT} times"),
    ("RUNNING", (LONG_AGO_S,) * RESTART_LOOP_COUNT, 0, None),
    ("STOPPED", (1.0,) * RESTART_LOOP_COUNT, 0, None),
])
def test_status_names_what_keeps_failing(state: str, restarts_ago_s: tuple[float, ...], failed_starts: int,
                                         trouble: str | None) -> None:
    entry = status(state, restarts_ago_s, failed_starts)
    if trouble is None:
        assert entry.trouble is None
    else:
        assert entry.trouble and trouble in entry.trouble


def test_uptime_is_printed_as_a_clock() -> None:
    assert format_duration(0) == "0:00:00"
    assert format_duration(3723.9) == "1:02:03"
    assert format_duration(2 * 86400 + 61) == "2d 0:01:01"
