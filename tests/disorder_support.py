"""Helpers for the bounded-disorder tests: the shipped events replayed with each machine's rows displaced by up
to 2 s of event time (the simulator's displacement, seeded), and a few rows held back by exactly the 2 s bound;
a join spec with max_out_of_orderness 2 s; the outputs the join's definition gives for the records as they lie in
machine.data (join_reference, no code of the joiners); and the Spark job joining the replay (killed midway or not).

The bound is the latency: a stream's last 2 s wait for the stream to move on. So after the replay one more
row per machine, 3 s after its last, lets every pair out (its own pairs wait in turn)."""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

from conftest import EVENTS_FILE
from connector_support import expected_records, read_rows, run_simulator, start_simulator, topic_size
from join_reference import POWER, reference_join
from kafka_joiner_support import as_multiset
from simulator.events import displaced
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess
from support import read_topic, wait_for

DISORDER_MS = 2000
SEED = 7
PAIRS = 2748  # the power join of the shipped events in time order
AT_BOUND_PER_MACHINE = 3  # rows held back by exactly DISORDER_MS behind a row of their machine
DISORDERED = dataclasses.replace(POWER, bound_ms=DISORDER_MS)


def join_specs(tmp_path: Path, more: str = "") -> Path:
    """The power join with max_out_of_orderness_s of DISORDER_MS, and `more` spec lines (e.g. an idle release)."""
    path = tmp_path / "join_specs.toml"
    path.write_text('[[join]]\nname = "power"\nleft = "actSpeed_C{axis}"\nright = "vaTorque_C{axis}"\n'
                    'output = "vaPower_C{axis}"\nformula = "power"\ndelta_time_s = 1.0\n'
                    f"max_out_of_orderness_s = {DISORDER_MS / 1000}\n{more}")
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


def at_the_bound(arrivals: list[dict], per_machine: int, seed: int) -> list[dict]:
    """`arrivals` with, for a few rows per machine, a row of that machine exactly DISORDER_MS later (same
    quantities and values) arriving just before it: the row arrives exactly the bound behind its streams' newest.

    A row qualifies when no row of its machine arriving after it is older (else that one would fall beyond the
    bound behind the new row) and its machine has no row at the new time yet. Every row before it arrived no later
    than its time plus the displacement's bound, so the new row is its streams' newest."""
    rng = random.Random(seed)
    times = {(row["Thing"], row["Timestamp"]) for row in arrivals}
    oldest_after: dict[int, int] = {}  # index -> the oldest time of its machine arriving after it
    oldest: dict[str, float] = {}
    for index in range(len(arrivals) - 1, -1, -1):
        row = arrivals[index]
        oldest_after[index] = oldest.get(row["Thing"], float("inf"))
        oldest[row["Thing"]] = min(oldest.get(row["Thing"], float("inf")), row["Timestamp"])
    chosen: set[int] = set()
    for thing in sorted({row["Thing"] for row in arrivals}):
        candidates = [index for index, row in enumerate(arrivals) if row["Thing"] == thing
                      and oldest_after[index] >= row["Timestamp"] and (thing, row["Timestamp"] + DISORDER_MS) not in times
                      and 0.1 * len(arrivals) < index < 0.9 * len(arrivals)]
        chosen.update(rng.sample(candidates, per_machine))
    result = []
    for index, row in enumerate(arrivals):
        if index in chosen:
            result.append({**row, "Timestamp": row["Timestamp"] + DISORDER_MS, "id": f"bound-{row['id']}"})
        result.append(row)
    return result


def displaced_rows() -> list[dict]:
    """The shipped events in the replay's arrival order: displaced as the simulator's --disorder-ms displaces
    them, and rows exactly at the bound."""
    in_time_order = sorted(read_rows(EVENTS_FILE), key=lambda row: row["Timestamp"])
    return at_the_bound(displaced(in_time_order, DISORDER_MS, SEED), AT_BOUND_PER_MACHINE, SEED)


def replay(bridge, tmp_path: Path, while_it_flows=lambda simulator: None, rate: int = 0) -> None:
    """The displaced replay (calling `while_it_flows` with the simulator's process while it runs), then the
    tail rows."""
    rows = displaced_rows()
    arrivals = tmp_path / "displaced.json"
    arrivals.write_text("".join(json.dumps(row) + "\n" for row in rows))
    simulator = start_simulator(bridge.mqtt_topic, "--events-file", str(arrivals), "--order", "file",
                                "--rate", str(rate))
    try:
        while_it_flows(simulator)
        output, _ = simulator.communicate(timeout=120)
    finally:
        simulator.kill()
    assert simulator.returncode == 0 and f"published {len(rows)} rows" in output, output
    tail = tmp_path / "tail.json"
    tail.write_text("".join(json.dumps(row) + "\n" for row in tail_rows(rows, DISORDER_MS + 1000)))
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(tail), "--order", "file")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr


def expected_outputs(bootstrap: str, bridge) -> list[dict]:
    """The join's outputs by its definition (join_reference) over machine.data as the joiners read it, each
    stream in partition order; they are the in-order join's: the displacement stays within the bound and the
    tail rows let every pair of the replay out."""
    records = [json.loads(m.value) for m in sorted(read_topic(bootstrap, bridge.data_topic),
                                                     key=lambda m: (m.partition, m.offset))]
    expected = reference_join(records, DISORDERED)
    replayed = [record for record in records if not str(record.get("id", "")).startswith("tail-")]
    assert as_multiset(expected) == as_multiset(reference_join(sorted(replayed, key=lambda r: r["phenomenonTime"])))
    assert len(expected) > PAIRS  # the shipped events' joins and those of the rows at the bound
    return expected


def check_displaced(bootstrap: str, bridge) -> None:
    """The whole replay in machine.data, displaced indeed: the disorder is in Kafka as the joiners read it, up to
    the bound itself and never beyond."""
    rows = displaced_rows()
    total = len(expected_records(rows)) + sum(len(row) - 3 for row in tail_rows(rows, 0))
    wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= total, 90, f"{total} records in machine.data")
    messages = read_topic(bootstrap, bridge.data_topic, expected=total, deadline_s=60)
    newest: dict[tuple[str, str], int] = {}
    behind_ms = []
    for message in sorted(messages, key=lambda m: (m.partition, m.offset)):
        record = json.loads(message.value)
        key = (record["thing"], record["quantity"])
        if record["phenomenonTime"] < newest.get(key, 0):
            behind_ms.append(newest[key] - record["phenomenonTime"])
        newest[key] = max(newest.get(key, 0), record["phenomenonTime"])
    assert len(behind_ms) > 100
    assert max(behind_ms) == DISORDER_MS, f"the most a record came behind its stream: {max(behind_ms)} ms"
    machines = len({row["Thing"] for row in rows})
    at_bound_records = sum(len(row) - 3 for row in rows if str(row["id"]).startswith("bound-"))
    assert behind_ms.count(DISORDER_MS) >= at_bound_records >= AT_BOUND_PER_MACHINE * machines
    assert topic_size(bootstrap, bridge.dlq_topic) == 0


def spark_joins_the_disordered_replay(bridge, bootstrap: str, topics, tmp_path: Path, kill_midway: bool) -> None:
    """The Spark job on the replay in `bridge`'s machine.data gives the join's records, once each, no dead
    letter."""
    expected = expected_outputs(bootstrap, bridge)
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
            assert topic_size(bootstrap, topics.out) < 2 * len(expected) // 3, "the kill came too late to prove anything"
            joiner.start()
        wait_for(lambda: joiner.check_alive() or len(read_topic(bootstrap, topics.out, idle_s=0.3)) >= len(expected),
                 OUTPUT_DEADLINE_S, f"{len(expected)} committed records", interval_s=2)
        outputs = read_topic(bootstrap, topics.out, idle_s=1.5)
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)  # once each
        assert topic_size(bootstrap, topics.dlq) == 0
    finally:
        joiner.close()
