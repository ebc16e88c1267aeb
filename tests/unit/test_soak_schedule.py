"""The soak's pace, timetable, faults plan and flatness rules (ops/soak), without a stack."""
from __future__ import annotations

import pytest

from soak.faults import Fault, FaultRecord, faults_done, plan_faults
from soak.flatness import latency_verdict, per_record_verdicts, rss_verdicts
from soak.pace import DAY_MS, PaceController, backfill_step_ms, backlog_rows, event_coverage_days
from soak.points import joined_point_of, level_of
from soak.schedule import FAULT_GAP_S, fault_starts, fault_time_s, flat_windows, timetable
from stack.services import PipelineProcess

HOUR_MS = 3_600_000


def test_the_backfill_spreads_what_is_left_over_the_rounds_left() -> None:
    # 7 days left, 10 minutes at 4,000 rows/s of 500 machines: 4,800 rounds of 126 s each.
    assert backfill_step_ms(0, 7 * 24 * HOUR_MS, 600, 4000, 500, 1000, 900_000) == 126_000
    # Never denser than live, never sparser than the bound; past its time, in big steps.
    assert backfill_step_ms(0, 10_000, 600, 4000, 500, 1000, 900_000) == 1000
    assert backfill_step_ms(0, 7 * 24 * HOUR_MS, 1, 50, 500, 1000, 900_000) == 900_000
    assert backfill_step_ms(0, 5_000_000, -5, 4000, 500, 1000, 900_000) == 900_000
    assert backfill_step_ms(10, 5, 100, 4000, 500, 1000, 900_000) == 1000


def simulate(capacity_rows_s: float, seconds: int, controller: PaceController) -> list[tuple[float, float]]:
    """A pipeline passing `capacity_rows_s` at most, the controller setting the publisher's rate every 5 s."""
    published = backlog = 0.0
    trace = []
    for step in range(seconds // 5):
        rate = controller.rate_rows_s
        published += rate * 5
        backlog = max(0.0, backlog + (rate - capacity_rows_s) * 5)
        controller.update(step * 5.0, published, backlog)
        trace.append((rate, backlog))
    return trace


def test_the_pace_finds_the_pipeline_s_capacity_and_keeps_its_queue_short() -> None:
    trace = simulate(4000, 600, PaceController(500.0, 50.0, 100_000.0))
    late = trace[len(trace) // 2:]
    assert all(3600 <= rate <= 4800 for rate, _backlog in late)  # at the pipeline's pace
    assert all(backlog <= 40 * 4000 for _rate, backlog in late)  # a queue of tens of seconds, not more
    assert sum(backlog > 0 for _rate, backlog in late) > len(late) / 2  # mostly with work waiting


def test_a_stalled_pipeline_slows_the_pace_to_its_floor() -> None:
    controller = PaceController(4000.0, 50.0, 100_000.0)
    simulate(4000, 300, controller)
    trace = simulate(0, 120, controller)
    assert trace[-1][0] == 50.0


def test_the_backlog_is_unknown_while_a_stage_is_stale() -> None:
    def sample(joiner_state: str) -> dict:
        return {"offsets": {"machine.data": 1_000}, "publisher": {"rows_sent": 100, "records_sent": 1_200},
                "services": {"stream-connector": {"lag": 0, "stage_state": "progressing"},
                             "lsb-joiner": {"lag": 240, "stage_state": joiner_state},
                             "db-connector": {"lag": 0, "stage_state": "idle"}}}

    assert backlog_rows(sample("progressing"), 0) == pytest.approx(200 / 12 + 240 / 12)
    # Frozen or wedged: its last lag (240) says nothing of now, and the pace must not take it for a short queue.
    assert backlog_rows(sample("stale"), 0) is None


@pytest.mark.parametrize("joiner", ["lsb", "spark"])
def test_faults_of_a_single_stack_kill_every_stage_and_server_and_stop_the_servers(joiner: str) -> None:
    services = [PipelineProcess(name, "x") for name in
                ("mosquitto", "kafka", "influxdb", "stream-connector", f"{joiner}-joiner", "db-connector")]
    planned = plan_faults(services, joiner, cluster=False)
    kills = {fault.target for fault in planned if fault.kind == "kill"}
    assert kills == {"mosquitto", "kafka", "influxdb", "stream-connector", f"{joiner}-joiner", "db-connector"}
    assert Fault("stop", "kafka", 120.0) in planned and Fault("stop", "influxdb", 120.0) in planned
    assert Fault("freeze", f"{joiner}-joiner", 60.0) in planned
    assert planned[-1].target in ("mosquitto", "kafka", "influxdb")  # servers last


def test_the_timetable_holds_the_faults_in_the_backfill_when_it_can() -> None:
    faults = [Fault("kill", "a"), Fault("stop", "kafka", 120.0), Fault("freeze", "j", 60.0), Fault("kill", "b")]
    table = timetable(45 * 60, 60, faults)
    assert table.publish_s + table.check_reserve_s + 60 == pytest.approx(45 * 60)
    assert table.backfill_s >= 45 + fault_time_s(faults)
    starts = fault_starts(faults, table)
    assert starts == sorted(starts) and starts[-1] + 30 + FAULT_GAP_S <= table.backfill_s
    short = timetable(3 * 60, 30, faults)
    assert short.backfill_s <= 0.6 * short.publish_s  # the faults run on into the live phase


def test_flatness_windows_are_the_undisturbed_live_phase_s_first_and_last() -> None:
    windows = flat_windows(1000.0, 4000.0, 1500.0)
    assert windows.first == (1500.0, 2400.0) and windows.last == (3100.0, 4000.0)
    assert flat_windows(1000.0, 1200.0, 0.0).first is None  # two windows of 100 s: too short


def test_flatness_rules() -> None:
    windows = flat_windows(0.0, 1000.0, 0.0)

    def sample(at: float, rss: int, disk: int | None = None, records: int = 0) -> dict:
        return {"at": at, "usage": {"p": {"rss_bytes": rss}}, "offsets": {"machine.data": records},
                "disk": {"topics": {"machine.data": disk}, "data": {}} if disk is not None else None}

    grown = [sample(t, 100 if t < 500 else 115) for t in range(0, 1001, 10)]
    assert [v.holds for v in rss_verdicts(grown, windows)] == [False]
    assert [v.holds for v in rss_verdicts([sample(t, 100) for t in range(0, 1001, 10)], windows)] == [True]
    latencies = [(float(t), 0.2) for t in range(0, 500)] + [(float(t), 0.25) for t in range(500, 1000)]
    assert latency_verdict(latencies, windows).holds is True
    assert latency_verdict([(float(t), 0.2 if t < 500 else 0.4) for t in range(1000)], windows).holds is False
    assert latency_verdict(latencies[:10], windows).holds is None
    # 100 bytes per record throughout, then 300 in the last window.
    steady = [sample(t, 1, disk=100 * t, records=t) for t in range(0, 1001, 50)]
    assert next(v for v in per_record_verdicts(steady, windows) if "machine.data" in v.what).holds is True
    heavier = [sample(t, 1, disk=100 * t if t < 600 else 300 * t - 120_000, records=t) for t in range(0, 1001, 50)]
    assert next(v for v in per_record_verdicts(heavier, windows) if "machine.data" in v.what).holds is False
    # A topic written to early and then not at all (machine.dlq of a healthy plant): flat while no byte is added...
    quiet = [sample(t, 1, disk=1_000 if t < 300 else 2_000, records=5 if t < 300 else 10) for t in range(0, 1001, 50)]
    assert next(v for v in per_record_verdicts(quiet, windows) if "machine.data" in v.what).holds is True
    # ...and unjudged once bytes are added without records (which fails a run long enough to judge every figure).
    creeping = [sample(t, 1, disk=2_000 + t, records=10) for t in range(0, 1001, 50)]
    assert next(v for v in per_record_verdicts(creeping, windows) if "machine.data" in v.what).holds is None


def test_a_join_result_s_point_as_the_db_connector_defines_it() -> None:
    record = {"thing": "m", "quantity": "vaPower_C11", "phenomenonTime": 1500.5, "result": -150.0,
              "case": "left_successor", "left": {"phenomenonTime": 1000}, "right": {"phenomenonTime": 2001}}
    time_ns, fields = joined_point_of(record, (100.0, 1000.0, 5000.0))
    assert time_ns == 1500 * 1_000_000 + (-1001) % 1_000_000
    assert fields == (-150.0, 1.0, "left_successor", "low")
    assert level_of(99.0, (100.0, 1000.0, 5000.0)) == "idle" and level_of(5000.0, (100.0, 1000.0, 5000.0)) == "high"


def test_a_backfill_that_ran_out_of_time_jumps_and_the_jump_is_not_counted_as_covered():
    hour_ms, max_step_ms = 3_600_000, 900_000
    backfill = list(range(0, 2 * DAY_MS + 1, max_step_ms))  # two days at the longest step
    live_from = 7 * DAY_MS
    rounds = backfill + [live_from, live_from + 1000, live_from + 2000]
    covered, jumped = event_coverage_days(rounds[::-1], max_step_ms)  # in any order
    assert covered == pytest.approx(2 + 2000 / DAY_MS)
    assert jumped == pytest.approx(5)
    # One step an hour long where the longest is 15 minutes is a jump too.
    assert event_coverage_days([0, hour_ms], max_step_ms) == (0.0, pytest.approx(1 / 24))
    # A backfill that reached the present covers every day.
    assert event_coverage_days(list(range(0, live_from + 1, max_step_ms)), max_step_ms) == (pytest.approx(7), 0.0)
    assert event_coverage_days([], max_step_ms) == (0.0, 0.0)


def test_a_fault_not_done_or_not_confirmed_fails_the_faults_verdict_by_name():
    planned = [Fault("kill", "lsb-joiner"), Fault("stop", "kafka", 120.0), Fault("kill", "influxdb")]
    done = [FaultRecord(planned[0]), FaultRecord(planned[1])]
    assert faults_done(planned[:2], done) == (True, "2 of 2 confirmed")
    holds, detail = faults_done(planned, done)
    assert not holds and detail == "2 of 3 confirmed; not done (the run ended first): kill influxdb"
    done[1].error = "kafka did not stop"
    holds, detail = faults_done(planned[:2], done)
    assert not holds and "not confirmed: stop kafka for 120 s (kafka did not stop)" in detail
    assert faults_done([], []) == (True, "0 of 0 confirmed")
