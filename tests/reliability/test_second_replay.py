"""A second `make data` joins, end to end, on a private stack as a user runs it (`make up`, `make data` twice, own
ports and state folder): each replay of the shipped rows gives its 2,748 joins, none is dead-lettered as out of
order, and the second lies after the first (before, the second replay's rows were laid over the first's at the
same times, and 7,379 of its 19,825 records were dead-lettered `out_of_order`)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline_core.records import decode_record
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from simulator.placement import REPLAY_GAP_MS as GAP_MS
from startup_support import PrivateStack
from support import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVENTS_FILE_JOINS = 2_748
EVENTS_FILE_RECORDS = 19_825

JOIN_WINDOW_MS = 1_000  # a join's time may lie this far from its records' (the default spec's tolerance)


def make_data(stack: PrivateStack) -> str:
    replayed = stack.make("data", "DATA_ARGS=--no-progress", timeout_s=600)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    return replayed.stdout + replayed.stderr


def test_make_data_twice_joins_both_replays_in_full(tmp_path: Path) -> None:
    stack = PrivateStack(tmp_path / "state")
    try:
        stack.start_from_nothing("lsb")
        make_data(stack)
        first = [decode_record(message.value) for message in
                 read_topic(stack.bootstrap, MACHINE_OUT.name, expected=EVENTS_FILE_JOINS, deadline_s=300)]

        second_run = make_data(stack)  # right away
        assert "this replay is moved" in second_run, second_run
        read_topic(stack.bootstrap, MACHINE_DATA.name, expected=2 * EVENTS_FILE_RECORDS, deadline_s=300)
        read_topic(stack.bootstrap, MACHINE_OUT.name, expected=2 * EVENTS_FILE_JOINS, deadline_s=300)
        out = [decode_record(message.value) for message in read_topic(stack.bootstrap, MACHINE_OUT.name, idle_s=3)]
        letters = [json.loads(message.value) for message in read_topic(stack.bootstrap, MACHINE_DLQ.name, idle_s=3)]

        reasons = Counter(letter["reason"].split(":")[0] for letter in letters)
        assert not any("out_of_order" in reason or "out of order" in reason for reason in reasons), reasons
        assert letters == [], reasons
        ids = Counter(record["id"] for record in out)
        assert len(out) == 2 * EVENTS_FILE_JOINS and len(ids) == len(out), ids.most_common(3)
        first_ids = {record["id"] for record in first}
        second = [record for record in out if record["id"] not in first_ids]
        assert len(second) == EVENTS_FILE_JOINS
        # Each machine's joins of the second replay lie a minute or more after its joins of the first.
        for thing in {record["thing"] for record in out}:
            first_newest = max(record["phenomenonTime"] for record in first if record["thing"] == thing)
            second_oldest = min(record["phenomenonTime"] for record in second if record["thing"] == thing)
            assert second_oldest >= first_newest + GAP_MS - JOIN_WINDOW_MS, thing
    finally:
        stack.down()
