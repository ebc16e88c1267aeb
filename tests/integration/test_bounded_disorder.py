"""Bounded disorder through the running stack: the shipped events replayed with each machine's rows displaced
by up to 2 s of event time (simulator -> Mosquitto -> stream connector -> Kafka), joined under a spec with
max_out_of_orderness 2 s by the standalone joiner and by the Spark job: each gives exactly the 2,748 pairs
of the in-order join, the same records with the same ids, and no dead letter.

The bound is the latency: a stream's last 2 s wait for the stream to move on. So after the replay one more
row per machine, 3 s after its last, lets every pair out (its own pairs wait in turn)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import EVENTS_FILE
from connector_support import connector, expected_records, read_rows, run_simulator, topic_size  # noqa: F401
from kafka_joiner_support import JoinerProcess, as_multiset, new_group, offline_join, read_outputs
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, wait_for

pytestmark = pytest.mark.integration

DISORDER_MS = 2000
SEED = 7
PAIRS = 2748  # the power join of the shipped events in time order


def join_specs(tmp_path: Path) -> Path:
    path = tmp_path / "join_specs.toml"
    path.write_text('[[join]]\nname = "power"\nleft = "actSpeed_C{axis}"\nright = "vaTorque_C{axis}"\n'
                    'output = "vaPower_C{axis}"\nformula = "power"\ndelta_time = 1.0\n'
                    f"max_out_of_orderness = {DISORDER_MS / 1000}\n")
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


@pytest.fixture
def disordered_replay(connector, bootstrap, tmp_path):  # noqa: F811
    """machine.data (fresh topics) after the displaced replay and the tail rows; the in-order join's outputs."""
    bridge = connector()
    rows = read_rows(EVENTS_FILE)
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--disorder-ms", str(DISORDER_MS),
                              "--seed", str(SEED))
    assert simulated.returncode == 0 and "published 5000 rows" in simulated.stdout, simulated.stdout + simulated.stderr
    tail = tmp_path / "tail.json"
    tail.write_text("".join(json.dumps(row) + "\n" for row in tail_rows(rows, DISORDER_MS + 1000)))
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(tail), "--order", "file")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    expected, _ = offline_join(sorted(expected_records(rows), key=lambda record: record["phenomenonTime"]))
    assert len(expected) == PAIRS
    total = len(expected_records(rows)) + sum(len(row) - 3 for row in tail_rows(rows, 0))
    wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= total, 90, f"{total} records in machine.data")
    # Displaced indeed: the disorder is in Kafka as it will be read.
    records = [json.loads(m.value) for m in read_topic(bootstrap, bridge.data_topic, expected=total, deadline_s=60)]
    newest: dict[tuple[str, str], int] = {}
    behind = 0
    for record in records:
        key = (record["thing"], record["quantity"])
        behind += record["phenomenonTime"] < newest.get(key, 0)
        newest[key] = max(newest.get(key, 0), record["phenomenonTime"])
    assert behind > 100
    assert topic_size(bootstrap, bridge.dlq_topic) == 0
    return SimpleNamespace(data=bridge.data_topic, expected=expected)


def test_standalone_joiner_absorbs_bounded_disorder(disordered_replay, bootstrap, new_topics, tmp_path) -> None:
    topics = new_topics()
    joiner = JoinerProcess(bootstrap, SimpleNamespace(data=disordered_replay.data, out=topics.out, dlq=topics.dlq),
                           new_group(), tmp_path, None, "--join-specs", str(join_specs(tmp_path)),
                           "--input-partitioned-by-thing")
    try:
        joiner.start()
        outputs = read_outputs(bootstrap, topics.out, PAIRS)
        assert as_multiset([m.value for m in outputs]) == as_multiset(disordered_replay.expected)
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.kill()


@pytest.mark.spark
def test_spark_joiner_absorbs_bounded_disorder(disordered_replay, bootstrap, new_topics, tmp_path) -> None:
    topics = new_topics()
    joiner = SparkJoinerProcess(bootstrap, SimpleNamespace(data=disordered_replay.data, out=topics.out, dlq=topics.dlq),
                                tmp_path / "checkpoint", tmp_path, "--join-specs", str(join_specs(tmp_path)))
    try:
        joiner.start()
        wait_for(lambda: joiner.check_alive() or len(read_topic(bootstrap, topics.out, idle_s=0.3)) >= PAIRS,
                 OUTPUT_DEADLINE_S, f"{PAIRS} committed records", interval_s=2)
        outputs = read_topic(bootstrap, topics.out, idle_s=1.5)
        assert as_multiset([m.value for m in outputs]) == as_multiset(disordered_replay.expected)
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.kill()
