"""A second `make data` joins: each replay moved in time (--ending-now) notes where it left each machine, and the
next one starts every machine past that, so the joiners take all of it instead of dead-lettering it as out of
order; days later a replay lands at now again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from join_reference import reference_join
from kafka_joiner_support import offline_join
from pipeline_core.settings import load_settings
from simulator.events import event_time_ms
from simulator.placement import (REPLAY_GAP_MS, ReplayLog, ReplayNotes, newest_per_machine, oldest_per_machine,
                                 shift_past)
from simulator.replay import selected_rows
from simulator.settings import SimulatorSettings
from simulator.synthetic import fleet_things

EVENTS_FILE_JOINS = 2_748
ROW_FIELDS = ("Thing", "Timestamp", "id")
HOUR_MS = 3_600_000


def replay_at(monkeypatch, now_s: float, previous: dict[str, float] | None, *argv: str) -> list[dict]:
    """The rows `make data` (--ending-now) publishes at `now_s`, after replays that left `previous`."""
    monkeypatch.setattr("time.time", lambda: now_s)
    rows, _ = selected_rows(load_settings(SimulatorSettings, ["--ending-now", *argv], environ={}), previous)
    return list(rows)


def as_records(rows: list[dict]) -> list[dict]:
    """One machine.data record per quantity of each row, in publishing order, as the stream connector writes them."""
    return [{"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"], "result": value,
             "id": row["id"]} for row in rows for quantity, value in row.items() if quantity not in ROW_FIELDS]


def test_a_second_replay_right_away_starts_each_machine_past_the_first_and_joins_in_full(monkeypatch) -> None:
    now_s = 2_000_000_000.0
    first = replay_at(monkeypatch, now_s, None)
    assert max(map(event_time_ms, first)) == now_s * 1000  # the newest at now, as ever
    second = replay_at(monkeypatch, now_s + 10, newest_per_machine(first))

    left = newest_per_machine(first)
    for thing, start_ms in oldest_per_machine(second).items():
        assert start_ms >= left[thing] + REPLAY_GAP_MS, thing
    # One shift for all rows: the spacing, and so every pair, is the first replay's.
    shifts = {event_time_ms(b) - event_time_ms(a) for a, b in zip(first, second)}
    assert len(shifts) == 1 and shifts.pop() > 200 * HOUR_MS  # the shipped rows span about 239 hours

    outputs, rejected = offline_join(as_records(first) + as_records(second))
    assert rejected == []
    assert len(outputs) == 2 * EVENTS_FILE_JOINS
    assert len({output["id"] for output in outputs}) == 2 * EVENTS_FILE_JOINS


def test_without_the_notes_a_second_replay_steps_every_clock_back_and_joins_in_full_all_the_same(monkeypatch) -> None:
    """What `make data` did before: the newest row at now again, so every series goes back some 239 hours. The
    join's clock rule takes that for a clock set back and joins the second replay on a timeline of its own."""
    now_s = 2_000_000_000.0
    first = replay_at(monkeypatch, now_s, None)
    second = replay_at(monkeypatch, now_s + 10, None)
    records = as_records(first) + as_records(second)
    outputs, rejected = offline_join(records)
    assert rejected == []
    assert len(outputs) >= 2 * EVENTS_FILE_JOINS  # each ended timeline gives its last records' pairs too
    assert sorted(o["id"] for o in outputs) == sorted(o["id"] for o in reference_join(records))


def test_a_replay_days_later_lands_at_now(monkeypatch) -> None:
    now_s = 2_000_000_000.0
    first = replay_at(monkeypatch, now_s, None)
    later_s = now_s + 20 * 24 * 3600  # past what the first one spans
    later = replay_at(monkeypatch, later_s, newest_per_machine(first))
    assert max(map(event_time_ms, later)) == later_s * 1000


def test_only_the_machines_replayed_before_count() -> None:
    oldest = {"A": 1_000.0, "B": 5_000.0}
    assert shift_past(10, oldest, {}) == 10
    assert shift_past(10, oldest, {"C": 10**9}) == 10  # another machine's rows do not move these
    assert shift_past(10, oldest, {"A": 1_010.0 - REPLAY_GAP_MS}) == 10  # lands just the gap after it
    # A's oldest lands the gap after its earlier newest row; B moves along by the same shift.
    assert shift_past(10, oldest, {"A": 2_000.5}) == 2_000.5 + REPLAY_GAP_MS - 1_000 + 0.5


def test_synthetic_machines_start_past_their_earlier_rows(monkeypatch) -> None:
    now_s = 2_000_000_000.0
    things = fleet_things(3, 2, 42)
    args = ("--synthetic", "--machines", "3", "--limit", "30")
    first = replay_at(monkeypatch, now_s, None, *args)
    assert sorted({row["Thing"] for row in first}) == sorted(things)
    second = replay_at(monkeypatch, now_s + 1, newest_per_machine(first), *args)
    assert min(map(event_time_ms, second)) == max(map(event_time_ms, first)) + REPLAY_GAP_MS
    other_fleet = replay_at(monkeypatch, now_s + 1, newest_per_machine(first), *args[:-2], "--seed", "7",
                            "--limit", "30")
    assert max(map(event_time_ms, other_fleet)) == (now_s + 1) * 1000  # machines of their own: at now


def test_the_log_keeps_each_machines_newest_time(tmp_path: Path) -> None:
    log = ReplayLog(tmp_path / "simulator" / "replayed.json")
    assert log.newest() == {}
    log.note({"A": 10.0, "B": 20.0})
    log.note({"A": 5.0, "C": 1.0})
    assert log.newest() == {"A": 10.0, "B": 20.0, "C": 1.0}
    notes = ReplayNotes(log)
    rows = [{"Thing": "A", "Timestamp": 1_554_076_800_000, "id": "a"}, {"Thing": "B", "Timestamp": "no time"},
            {"Timestamp": 1_554_076_900_000}]
    assert list(notes.track(rows)) == rows
    notes.flush()
    assert log.newest() == {"A": 1_554_076_800_000.0, "B": 20.0, "C": 1.0}


def test_an_unreadable_log_places_the_replay_at_now(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "replayed.json"
    path.write_text("{not json")
    assert ReplayLog(path).newest() == {}
    assert "cannot be read" in caplog.text
    ReplayLog(path).note({"A": 1.0})
    assert json.loads(path.read_text()) == {"newest_ms": {"A": 1.0}}


def test_a_replay_that_cannot_connect_notes_nothing(tmp_path: Path) -> None:
    """`python -m simulator --ending-now` against no broker: the next replay is not moved on for rows never sent."""
    from simulator.__main__ import main
    log_path = tmp_path / "replayed.json"
    code = main(["--ending-now", "--replay-log", str(log_path), "--mqtt-port", "1", "--no-progress",
                 "--limit", "10"])
    assert code == 2
    assert not log_path.exists()

