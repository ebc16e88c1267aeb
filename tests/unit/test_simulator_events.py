"""Reading events files, replay order, --skip/--limit/--loop and pacing."""
from __future__ import annotations

import gzip
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import EVENTS_FILE
from simulator.events import EventsFileError, ending_at, in_order, read_events, repeat, write_events
from simulator.replay import due_times, selected_rows
from simulator.settings import SimulatorSettings

T0 = 1_554_096_460_000  # epoch ms
ROWS = [{"Thing": "A", "Timestamp": T0 + 3000, "q": 1.0, "id": "a3"},
        {"Thing": "B", "Timestamp": T0 + 1000, "q": 2.0, "id": "b1"},
        {"Thing": "A", "Timestamp": T0 + 2000, "q": 3.0, "id": "a2"}]


@pytest.fixture
def settings() -> SimulatorSettings:
    return SimulatorSettings()


def test_plain_gzip_and_zip_files_read_the_same(tmp_path: Path):
    text = "".join(json.dumps(row) + "\n" for row in ROWS) + "\n"
    plain = tmp_path / "events.json"
    plain.write_text(text)
    with gzip.open(tmp_path / "events.json.gz", "wt") as out:
        out.write(text)
    with zipfile.ZipFile(tmp_path / "events.zip", "w") as archive:
        archive.writestr("events.json", text)
    assert read_events(plain) == read_events(tmp_path / "events.json.gz") == read_events(tmp_path / "events.zip") == ROWS


def test_write_then_read_round_trips(tmp_path: Path):
    assert write_events(tmp_path / "out.json.gz", ROWS) == 3
    assert read_events(tmp_path / "out.json.gz") == ROWS


def test_a_line_that_is_not_json_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    with pytest.raises(EventsFileError, match=r"broken.json:2: not JSON"):
        read_events(path)


def test_time_order_puts_every_machine_in_time_order_and_file_order_keeps_the_file():
    assert [row["id"] for row in in_order(ROWS, "time")] == ["b1", "a2", "a3"]
    assert in_order(ROWS, "file") == ROWS
    real = in_order(read_events(EVENTS_FILE), "time")
    for thing in {row["Thing"] for row in real}:
        times = [row["Timestamp"] for row in real if row["Thing"] == thing]
        assert times == sorted(times)


def test_each_loop_pass_is_later_in_time_with_fresh_ids():
    rows = list(zip(range(7), repeat(in_order(ROWS, "time"))))
    passes = [row for _, row in rows]
    assert [row["Timestamp"] - T0 for row in passes] == [1000, 2000, 3000, 3001, 4001, 5001, 5002]
    assert [row["id"] for row in passes][:6] == ["b1", "a2", "a3", "b1/1", "a2/1", "a3/1"]
    assert passes[0] is ROWS[1]  # the first pass is the file itself


def test_skip_and_limit_select_a_slice(settings, tmp_path: Path):
    path = tmp_path / "events.json"
    write_events(path, ROWS)
    rows, total = selected_rows(replace(settings, events_file=path, skip=1, limit=5))
    assert total == 2 and [row["id"] for row in rows] == ["a2", "a3"]
    rows, total = selected_rows(replace(settings, events_file=path, loop=True, limit=5))
    assert total == 5 and len(list(rows)) == 5
    rows, total = selected_rows(replace(settings, synthetic=True, skip=2, limit=4))
    assert total == 4 and len(list(rows)) == 4


def test_pacing_by_rate_or_by_the_rows_own_time(settings):
    assert due_times(settings) is None
    by_rate = due_times(replace(settings, rate=200))
    assert by_rate(0, ROWS[0]) == 0 and by_rate(100, ROWS[0]) == 0.5
    by_time = due_times(replace(settings, speedup=10))
    assert [by_time(i, row) for i, row in enumerate(in_order(ROWS, "time"))] == [0.0, 0.1, 0.2]
    with pytest.raises(ValueError, match="not both"):
        due_times(replace(settings, rate=1, speedup=1))


@pytest.mark.parametrize("disorder_ms, seed", [(2000, 7), (1500, 1), (5000, 42)])
def test_disorder_displaces_each_machines_rows_by_at_most_the_bound(settings, disorder_ms, seed):
    rows, total = selected_rows(replace(settings, disorder_ms=disorder_ms, seed=seed))
    rows = list(rows)
    in_time_order = in_order(read_events(EVENTS_FILE), "time")
    assert total == len(rows) == len(in_time_order)
    assert sorted(map(json.dumps, rows)) == sorted(map(json.dumps, in_time_order))  # the same rows, reordered
    newest: dict[str, int] = {}
    behind_newest = []
    for row in rows:
        machine = row["Thing"]
        behind_newest.append(newest.get(machine, row["Timestamp"]) - row["Timestamp"])
        newest[machine] = max(newest.get(machine, row["Timestamp"]), row["Timestamp"])
    assert max(behind_newest) <= disorder_ms
    assert max(behind_newest) > disorder_ms / 2  # displaced indeed, close to the bound
    assert sum(behind > 0 for behind in behind_newest) > 100
    again, _ = selected_rows(replace(settings, disorder_ms=disorder_ms, seed=seed))
    other, _ = selected_rows(replace(settings, disorder_ms=disorder_ms, seed=seed + 1))
    assert list(again) == rows != list(other)  # deterministic per seed


def test_disorder_needs_the_events_file_in_time_order(settings):
    for other in (replace(settings, disorder_ms=100, order="file"), replace(settings, disorder_ms=100, synthetic=True)):
        with pytest.raises(ValueError, match="disorder"):
            selected_rows(other)
    with pytest.raises(ValueError, match="negative"):
        selected_rows(replace(settings, disorder_ms=-1))


def test_ending_now_moves_the_rows_so_the_newest_is_now_keeping_their_spacing():
    moved = ending_at(ROWS + [{"Thing": "C", "Timestamp": "not a time", "id": "c"}], 2_000_000_000_000)
    assert [row["Timestamp"] for row in moved] == [2_000_000_000_000, 1_999_999_998_000, 1_999_999_999_000,
                                                   "not a time"]
    assert [row["id"] for row in moved] == ["a3", "b1", "a2", "c"] and ROWS[0]["Timestamp"] == T0 + 3000
