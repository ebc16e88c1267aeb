"""Bounded disorder through the running stack: the shipped events replayed with each machine's rows displaced
by up to 2 s of event time (simulator -> Mosquitto -> stream connector -> Kafka), joined under a spec with
max_out_of_orderness 2 s by the standalone joiner and by the Spark job: each gives exactly the 2,748 pairs
of the in-order join, the same records with the same ids, and no dead letter. The standalone joiner is
killed (kill -9) and restarted while the replay flows, so its reorder buffers come back from the changelog;
the Spark job is killed (kill -9) midway through the replayed input, so its buffers come back from the
checkpoint's state store.

The bound is the latency: a stream's last 2 s wait for the stream to move on. So after the replay one more
row per machine, 3 s after its last, lets every pair out (its own pairs wait in turn)."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import EVENTS_FILE
from connector_support import (connector, expected_records, read_rows, run_simulator,  # noqa: F401
                               start_simulator, topic_size)
from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, new_group, offline_join,
                                  read_outputs, restored)
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


def test_standalone_joiner_absorbs_bounded_disorder_through_kill_9(connector, bootstrap, new_topics,  # noqa: F811
                                                                  tmp_path) -> None:
    bridge = connector()
    topics = new_topics()
    joiner = JoinerProcess(bootstrap, SimpleNamespace(data=bridge.data_topic, out=topics.out, dlq=topics.dlq),
                           new_group(), tmp_path, "disorder", "--join-specs", str(join_specs(tmp_path)),
                           "--input-partitioned-by-thing")
    rng = random.Random(SEED)
    restored_held = []

    def kill_and_restart(simulator) -> None:
        """Kill -9 a few times while the replay flows, each after the joiner committed joins of it."""
        for _ in range(3):
            committed = topic_size(bootstrap, topics.out)
            wait_for(lambda: topic_size(bootstrap, topics.out) > committed or simulator.poll() is not None, 120,
                     "joins committed since the joiner started")
            if simulator.poll() is not None:
                return
            moment = time.monotonic() + rng.uniform(0.0, 1.0)
            wait_for(lambda: time.monotonic() >= moment, 10, "a moment while the replay flows")
            joiner.kill()  # what the reorder buffers held is only in the changelog now
            joiner.start()
            wait_for(lambda: "changelog records" in joiner.log(), 60, "the restarted joiner's restore")
            restored_held.append(restored(joiner.log())[0])

    try:
        joiner.start()
        replay(bridge, tmp_path, kill_and_restart, rate=150)
        assert len(restored_held) >= 2 and max(restored_held) > 0, restored_held
        check_displaced(bootstrap, bridge)
        outputs = read_outputs(bootstrap, topics.out, PAIRS)
        assert as_multiset([m.value for m in outputs]) == as_multiset(in_order_outputs())  # once each
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.kill()
        delete_internal_topics(bootstrap, [joiner.group_id])


@pytest.mark.spark
def test_spark_joiner_absorbs_bounded_disorder(connector, bootstrap, new_topics, tmp_path) -> None:  # noqa: F811
    bridge = connector()
    replay(bridge, tmp_path)
    check_displaced(bootstrap, bridge)
    topics = new_topics()
    # Small micro-batches (about 20 over the input), so the kill lands midway with state held.
    joiner = SparkJoinerProcess(bootstrap, SimpleNamespace(data=bridge.data_topic, out=topics.out, dlq=topics.dlq),
                                tmp_path / "checkpoint", tmp_path, "--join-specs", str(join_specs(tmp_path)),
                                "--max-offsets-per-trigger", "1000")
    try:
        joiner.start()
        wait_for(lambda: joiner.check_alive() or topic_size(bootstrap, topics.out) >= 300, OUTPUT_DEADLINE_S,
                 "the first joins", interval_s=0.5)
        joiner.kill()
        assert topic_size(bootstrap, topics.out) < 2 * PAIRS // 3, "the kill came too late to prove anything"
        joiner.start()
        wait_for(lambda: joiner.check_alive() or len(read_topic(bootstrap, topics.out, idle_s=0.3)) >= PAIRS,
                 OUTPUT_DEADLINE_S, f"{PAIRS} committed records", interval_s=2)
        outputs = read_topic(bootstrap, topics.out, idle_s=1.5)
        assert as_multiset([m.value for m in outputs]) == as_multiset(in_order_outputs())
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.kill()
