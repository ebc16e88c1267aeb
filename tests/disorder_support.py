"""Helpers for the bounded-disorder tests: the shipped events replayed with each machine's rows displaced by up
to 2 s of event time, a join spec with max_out_of_orderness 2 s, the in-order join's records, and the Spark
job joining the replay (killed midway or not).

The bound is the latency: a stream's last 2 s wait for the stream to move on. So after the replay one more
row per machine, 3 s after its last, lets every pair out (its own pairs wait in turn)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from conftest import EVENTS_FILE
from connector_support import expected_records, read_rows, run_simulator, start_simulator, topic_size
from kafka_joiner_support import as_multiset, offline_join
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, wait_for

DISORDER_MS = 2000
SEED = 7
PAIRS = 2748  # the power join of the shipped events in time order


def join_specs(tmp_path: Path) -> Path:
    path = tmp_path / "join_specs.toml"
    path.write_text('[[join]]\nname = "power"\nleft = "actSpeed_C{axis}"\nright = "vaTorque_C{axis}"\n'
                    'output = "vaPower_C{axis}"\nformula = "power"\ndelta_time_s = 1.0\n'
                    f"max_out_of_orderness_s = {DISORDER_MS / 1000}\n")
    return path


def tail_rows(rows: list[dict], after_ms: int) -> list[dict]:
    """One row per machine `after_ms` after its last, with its speeds and torques: its streams move on."""
    last: dict[str, int] = {}
    quantities: dict[str, set[str]] = {}
    for row in rows:
        last[row["Thing"]] = max(last.get(row["Thing"], 0), row["Timestamp"])
        quantities.setdefault(row["Thing"], set()).update(q for q in row if q.startswith(("actSpeed_", "vaTorque_")))
    return [{"Thing": thing, "Timestamp": last[thing] + after_ms, **{q: 0.0 for q in sorted(quantities[thing])},
             "id": f"tail-{thing}"} for thing in sorted(last)]


def replay(bridge, tmp_path: Path, while_it_flows=lambda simulator: None, rate: int = 0) -> None:
    """The displaced replay (calling `while_it_flows` with the simulator's process while it runs), then the
    tail rows."""
    rows = read_rows(EVENTS_FILE)
    simulator = start_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--disorder-ms",
                                str(DISORDER_MS), "--seed", str(SEED), "--rate", str(rate))
    try:
        while_it_flows(simulator)
        output, _ = simulator.communicate(timeout=120)
    finally:
        simulator.kill()
    assert simulator.returncode == 0 and "published 5000 rows" in output, output
    tail = tmp_path / "tail.json"
    tail.write_text("".join(json.dumps(row) + "\n" for row in tail_rows(rows, DISORDER_MS + 1000)))
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(tail), "--order", "file")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr


def in_order_outputs() -> list[dict]:
    rows = read_rows(EVENTS_FILE)
    expected, _ = offline_join(sorted(expected_records(rows), key=lambda record: record["phenomenonTime"]))
    assert len(expected) == PAIRS
    return expected


def check_displaced(bootstrap: str, bridge) -> None:
    """The whole replay in machine.data, displaced indeed: the disorder is in Kafka as the joiners read it."""
    rows = read_rows(EVENTS_FILE)
    total = len(expected_records(rows)) + sum(len(row) - 3 for row in tail_rows(rows, 0))
    wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= total, 90, f"{total} records in machine.data")
    records = [json.loads(m.value) for m in read_topic(bootstrap, bridge.data_topic, expected=total, deadline_s=60)]
    newest: dict[tuple[str, str], int] = {}
    behind = 0
    for record in records:
        key = (record["thing"], record["quantity"])
        behind += record["phenomenonTime"] < newest.get(key, 0)
        newest[key] = max(newest.get(key, 0), record["phenomenonTime"])
    assert behind > 100
    assert topic_size(bootstrap, bridge.dlq_topic) == 0


def spark_joins_the_disordered_replay(bridge, bootstrap: str, topics, tmp_path: Path, kill_midway: bool) -> None:
    """The Spark job on the replay in `bridge`'s machine.data gives the in-order records, no dead letter."""
    # Small micro-batches (about 20 over the input), so a kill lands midway with state held.
    joiner = SparkJoinerProcess(bootstrap, SimpleNamespace(data=bridge.data_topic, out=topics.out, dlq=topics.dlq),
                                tmp_path / "checkpoint", tmp_path, "--join-specs", str(join_specs(tmp_path)),
                                *(("--max-offsets-per-trigger", "1000") if kill_midway else ()))
    try:
        joiner.start()
        if kill_midway:
            wait_for(lambda: joiner.check_alive() or topic_size(bootstrap, topics.out) >= 300, OUTPUT_DEADLINE_S,
                     "the first joins", interval_s=0.5)
            joiner.kill()  # the reorder buffers are in the checkpoint's state store only
            assert topic_size(bootstrap, topics.out) < 2 * PAIRS // 3, "the kill came too late to prove anything"
            joiner.start()
        wait_for(lambda: joiner.check_alive() or len(read_topic(bootstrap, topics.out, idle_s=0.3)) >= PAIRS,
                 OUTPUT_DEADLINE_S, f"{PAIRS} committed records", interval_s=2)
        outputs = read_topic(bootstrap, topics.out, idle_s=1.5)
        assert as_multiset([m.value for m in outputs]) == as_multiset(in_order_outputs())  # once each
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.kill()
