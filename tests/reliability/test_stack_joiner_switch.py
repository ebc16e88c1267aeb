"""One joiner at a time, one configuration at a time, on a private stack as a user runs it (`make up`, own ports
and state folder).

`make up JOINER=lsb`, a third of the shipped rows, `make up JOINER=spark`, the next third, `make up JOINER=lsb`
again, the rest: each switch stops the running joiner before the new one starts and hands its input position
over, so machine.out holds every join of the whole replay exactly once, the same records the engine gives offline
over machine.data (before, the second joiner joined the input again from its beginning beside the first: every
join twice). A `make up` with a changed setting on the running stack is refused, naming the setting and what to
run, and changes nothing."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos_support import canonical, offline_join
from conftest import EVENTS_FILE
from pipeline_core.records import decode_record
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from startup_support import PrivateStack, healthy_states
from support import processes_under, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVENTS_FILE_JOINS = 2_748
ROW_FIELDS = ("Thing", "Timestamp", "id")
# The shipped rows in time order, in three parts: the first and last for the standalone joiner, the middle for
# the Spark joiner.
PARTS = ((0, 1_700), (1_700, 1_700), (3_400, 0))
JOINER_STAGES = ("kafka_joiner", "spark_joiner")


def records_of_rows(skip: int, limit: int) -> int:
    """How many machine.data records the rows of `--skip skip --limit limit` (in time order) become."""
    rows = sorted((json.loads(line) for line in EVENTS_FILE.read_text().splitlines() if line.strip()),
                  key=lambda row: row["Timestamp"])
    chosen = rows[skip:skip + limit] if limit else rows[skip:]
    return sum(1 for row in chosen for field in row if field not in ROW_FIELDS)


def replay(stack: PrivateStack, skip: int, limit: int) -> None:
    """The simulator as `make data` runs it, the rows as they are (2019): each part lies where a single replay
    of the whole file would put it."""
    done = subprocess.run([sys.executable, "-m", "simulator", "--skip", str(skip), "--limit", str(limit),
                           "--no-progress"], env=stack.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def joins_so_far(stack: PrivateStack, records: int) -> Counter[str]:
    """Once machine.data holds `records`: the engine's outputs over it, offline."""
    data = read_topic(stack.bootstrap, MACHINE_DATA.name, expected=records, deadline_s=120)
    assert len(data) == records
    return offline_join(data)


def machine_out(stack: PrivateStack, expected: int) -> list:
    """machine.out once it holds `expected` records, read on to its end (so more than that would show)."""
    read_topic(stack.bootstrap, MACHINE_OUT.name, expected=expected, deadline_s=600)
    return read_topic(stack.bootstrap, MACHINE_OUT.name, idle_s=3.0)


def joiner_lines(stack: PrivateStack) -> dict[str, str]:
    """`make status` (no JOINER given): the state of each joiner it lists."""
    status = stack.make("status", timeout_s=120)
    assert status.returncode == 0, status.stdout + status.stderr
    return {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()
            if line.split() and line.split()[0] in ("lsb-joiner", "spark-joiner")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    private = PrivateStack(tmp_path_factory.mktemp("switch") / "state")
    yield private
    private.down()


def test_switching_the_joiner_hands_over_and_writes_every_join_once(stack: PrivateStack) -> None:
    started = stack.start_from_nothing("lsb")
    assert {name: started.states.get(name) for name in healthy_states("lsb")} == healthy_states("lsb")
    records = 0
    for (skip, limit), joiner in zip(PARTS, ("lsb", "spark", "lsb")):
        if joiner != "lsb" or skip:
            switched = stack.make("up", joiner=joiner)
            assert switched.returncode == 0, switched.stdout + switched.stderr
            previous = "spark" if joiner == "lsb" else "lsb"
            assert f"stopped the {previous} joiner" in switched.stdout, switched.stdout
            assert f"{previous} joiner -> {joiner} joiner: machine.data handed over" in switched.stdout, switched.stdout
            # Without JOINER, status shows the joiner the stack runs now, and only that one.
            # Ready before supervisord's startsecs (30 s for the Spark joiner) passed, it may still be STARTING.
            assert joiner_lines(stack) in ({f"{joiner}-joiner": "RUNNING"}, {f"{joiner}-joiner": "STARTING"})
        replay(stack, skip, limit)
        records += records_of_rows(skip, limit)
        expected = joins_so_far(stack, records)
        out = machine_out(stack, sum(expected.values()))
        assert Counter(canonical(message.value) for message in out) == expected, f"after the {joiner} joiner's part"

    ids = Counter(decode_record(message.value)["id"] for message in out)
    assert len(out) == EVENTS_FILE_JOINS and len(ids) == EVENTS_FILE_JOINS, ids.most_common(3)
    letters = [json.loads(message.value) for message in read_topic(stack.bootstrap, MACHINE_DLQ.name)]
    assert [letter for letter in letters if letter.get("stage") in JOINER_STAGES] == []
    # A `make up` without JOINER goes on with the joiner that runs.
    again = stack.make("up")
    assert again.returncode == 0 and "everything was already running" in again.stdout, again.stdout + again.stderr
    assert joiner_lines(stack) == {"lsb-joiner": "RUNNING"}


def test_a_changed_setting_on_a_running_stack_is_refused_with_what_to_run(stack: PrivateStack) -> None:
    before = processes_under(stack.state_dir)
    assert before
    refused = subprocess.run(["make", "--no-print-directory", "up"], cwd=Path(__file__).resolve().parents[2],
                             env={**stack.env, "JOINER": "lsb", "KAFKA_JOINER_COMMIT_INTERVAL_MS": "250"},
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "KAFKA_JOINER_COMMIT_INTERVAL_MS unset (now '250')" in refused.stderr, refused.stderr
    assert "`make down`, then `make up` with the new settings" in refused.stderr, refused.stderr
    assert processes_under(stack.state_dir) == before  # nothing stopped, nothing started
